#!/usr/bin/env bash
# The generated program under a real Slurm (ctest `slurm`). Starts munged,
# slurmctld and slurmd on 127.0.0.1 (one node, one partition) from a
# configuration in a temporary directory, on free ports, then checks that
#   - `srun -n 2` and `srun -n 4` train tiny-gpt with the losses and the
#     saved parameters of `mpirun -np 2` and `mpirun -np 4`;
#   - the batch script of docs/runtime.md ("Slurm"), stopped by
#     `scancel --signal=TERM`, leaves a complete checkpoint, exits cleanly and
#     requeues its job; the requeued run (same command line) continues from
#     that checkpoint and ends with the losses and the `--save` bytes of an
#     uninterrupted run;
#   - the cuda target's launch code (no MPI) starts 4 ranks under the real
#     srun and mpirun.
# On exit, also after a failed check or an interrupt, it cancels its jobs,
# stops the daemons it started and removes the temporary directory.
#
# Usage: scripts/slurm-test.sh [BIN_DIR [SOURCE_ROOT]]
#   BIN_DIR holds planc and plan-tokenize (default: SOURCE_ROOT/build/bin);
#   SOURCE_ROOT is the checkout (default: this script's).
# Installs Slurm (slurmctld, slurmd, slurm-client: what slurm-wlm brings
# that this test uses) and munge with apt-get when missing; their Debian
# services stay as the packages leave them (this test uses its own daemons).
# Needs root (slurmd runs jobs as their user); re-runs itself under `sudo -n`
# otherwise.
# PLANC_SLURM_KEEP=1 keeps the temporary directory (configuration, daemon
# logs, the job's log) after the daemons stopped.
# Exit code: 0 every check passed, 1 a check failed, 77 it cannot run here
# (ctest reports it as skipped, with the reason on the last line).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$(cd "${2:-$ROOT}" && pwd)"
BIN="$(cd "${1:-$SRC/build/bin}" 2>/dev/null && pwd)" || {
  echo "FAIL: no directory ${1:-$SRC/build/bin} (planc's bin/)"; exit 1; }
START=$SECONDS
FAILED=0
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; FAILED=1; }
cannot() { echo "CANNOT RUN: $*"; exit 77; }
# Stops the script: the checks after this one depend on it.
fatal() { fail "$*"; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n -E bash "$0" "$BIN" "$SRC"
  fi
  cannot "Slurm's daemons: slurmd must run as root to start jobs, and sudo -n is not available to user $(id -un)"
fi

# --- Packages ---------------------------------------------------------------
PACKAGES=(slurmctld slurmd slurm-client munge python3)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  { apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
    cannot "apt-get could not install ${missing[*]}"
fi
for tool in munged mungekey slurmctld slurmd srun sbatch scancel scontrol sinfo squeue; do
  command -v "$tool" >/dev/null || cannot "$tool is not on PATH after installing ${PACKAGES[*]}"
done
for tool in planc plan-tokenize; do
  [ -x "$BIN/$tool" ] || fatal "$BIN/$tool is missing (build planc first)"
done
command -v mpirun >/dev/null || fatal "mpirun is missing (scripts/setup.sh installs openmpi-bin)"

# --- Temporary directory, clean-up ------------------------------------------
T="$(mktemp -d "${TMPDIR:-/tmp}/planc-slurm.XXXXXX")" || cannot "mktemp -d failed"
# munged wants every directory above its socket searchable by everyone.
chmod 755 "$T"
mkdir -p "$T"/{munge,state,spool,log,run,work}
chmod 755 "$T/munge"

# A job launched by this script must not see another allocation's variables.
for v in $(compgen -e | grep '^SLURM_'); do unset "$v"; done
export SLURM_CONF="$T/slurm.conf"
# No PLANRT_NUM_THREADS: each rank's thread count is the node's cores over
# the ranks srun puts on the node, under srun as under mpirun (srun's ranks
# once took every core each and ran 20-250x slower).
unset PLANRT_NUM_THREADS OMP_NUM_THREADS
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

# Prints the pid in pid file $1 when that process is alive and its command
# line names this run's directory (a pid file left over never matches).
live_pid() {
  local pid
  pid="$(cat "$1" 2>/dev/null)" || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] &&
    tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -qF "$T" && echo "$pid"
}
# Processes left in this run's directory (job steps, ranks) or naming it.
ours() {
  local p pid
  for p in /proc/[0-9]*; do
    pid="${p#/proc/}"
    [ "$pid" = $$ ] || [ "$pid" = "$BASHPID" ] && continue
    case "$(readlink "$p/cwd" 2>/dev/null)" in "$T" | "$T"/*) echo "$pid"; continue ;; esac
    tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -qF "$T" && echo "$pid"
  done
}
stop_pid() { # pid name
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.2; done
  kill -KILL "$1" 2>/dev/null
}
cleanup() {
  local rc=$? pid left jobs stopped=()
  trap - EXIT INT TERM HUP
  cd /
  if [ -n "$(live_pid "$T/run/slurmctld.pid")" ]; then
    jobs="$(timeout 10 squeue -h -o %i 2>/dev/null)"
    [ -n "$jobs" ] && timeout 20 scancel $jobs 2>/dev/null
    for _ in $(seq 50); do
      [ -z "$(timeout 10 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2
    done
  fi
  for d in slurmd slurmctld munged; do
    pid="$(live_pid "$T/run/$d.pid")" && { stop_pid "$pid"; stopped+=("$d"); }
  done
  left="$(ours)"
  if [ -n "$left" ]; then
    echo "cleanup: processes left after the daemons stopped: $(echo $left); killing them"
    kill -TERM $left 2>/dev/null; sleep 1
    left="$(ours)"; [ -n "$left" ] && kill -KILL $left 2>/dev/null && sleep 0.5
    left="$(ours)"
  fi
  local dir="removed $T"
  if [ -n "${PLANC_SLURM_KEEP:-}" ]; then dir="kept $T (PLANC_SLURM_KEEP)"; else rm -rf "$T"; fi
  if [ -n "$left" ]; then
    echo "FAIL: processes still running after SIGKILL: $(echo $left)"; rc=1
  else
    echo "cleanup: stopped ${stopped[*]:-nothing}; no process left; $dir"
  fi
  echo "time: $((SECONDS - START)) s"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# --- munged -----------------------------------------------------------------
mungekey -c -b 1024 -k "$T/munge/munge.key" || cannot "mungekey could not create a key"
munged --key-file="$T/munge/munge.key" --socket="$T/munge/munge.sock" \
  --pid-file="$T/run/munged.pid" --log-file="$T/log/munged.log" \
  --seed-file="$T/munge/munged.seed" ||
  { cat "$T/log/munged.log" 2>/dev/null; cannot "munged did not start (log above)"; }
munge -S "$T/munge/munge.sock" -n | unmunge -S "$T/munge/munge.sock" >/dev/null ||
  fatal "munged: a credential does not round-trip"

# --- slurm.conf, slurmctld, slurmd ------------------------------------------
NODE="$(hostname -s)"
# Two free ports (a Slurm already running keeps its own).
read -r CTLD_PORT SLURMD_PORT < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("", 0))
print(*(x.getsockname()[1] for x in s))') || fatal "no free ports"
cat > "$SLURM_CONF" <<EOF
ClusterName=planctest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire + 1 s before it starts again (120 s by default).
AuthInfo=socket=$T/munge/munge.sock,cred_expire=10
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/run/slurmctld.pid
SlurmdPidFile=$T/run/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=pmix
JobRequeue=1
ReturnToService=2
KillWait=5
MailProg=/bin/true
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -f "$SLURM_CONF" || { tail -n 20 "$T/log/slurmctld.log"; fatal "slurmctld did not start (log above)"; }
slurmd -f "$SLURM_CONF" -N "$NODE" || { tail -n 20 "$T/log/slurmd.log"; fatal "slurmd did not start (log above)"; }
state=""
for _ in $(seq 60); do
  state="$(timeout 10 sinfo -h -N -n "$NODE" -o %t 2>/dev/null)"
  [ "$state" = idle ] && break
  sleep 0.5
done
if [ "$state" = idle ]; then
  pass "slurmctld (port $CTLD_PORT) and slurmd (port $SLURMD_PORT) up: node $NODE idle in partition test"
else
  tail -n 10 "$T/log/slurmctld.log" "$T/log/slurmd.log"
  fatal "node $NODE not idle after 30 s (sinfo says '${state:-nothing}'; logs above)"
fi
if srun --mpi=list 2>&1 | grep -qw pmix; then
  pass "srun --mpi=list offers pmix (Open MPI's direct launch)"
else
  fatal "srun has no pmix plugin: Open MPI's ranks cannot start under srun"
fi

# --- Programs ---------------------------------------------------------------
# tiny-gpt, small: batch 4, sequence 32, a cosine schedule over the run,
# checkpoints in ckpt/ (written on a stop signal, or every
# --checkpoint-every steps); 1500 steps when no --steps is given.
W="$T/work"
cd "$W" || fatal "cd $W"
mkdir -p data
"$BIN/plan-tokenize" -o data/tiny "$SRC/examples/data/tiny.txt" >/dev/null ||
  fatal "plan-tokenize could not tokenize examples/data/tiny.txt"
sed -e "s|\"models/gpt.plan\"|\"$SRC/examples/models/gpt.plan\"|" \
  -e 's/batch = 16/batch = 4/' -e 's/^seq = 64/seq = 32/' -e 's/steps = 600/steps = 1500/' \
  -e 's/lr_schedule = .*/lr_schedule = cosine(warmup = 2, min_lr = 2e-4)\n  checkpoint = "ckpt\/"\n  checkpoint_every = 0/' \
  "$SRC/examples/tiny-gpt.plan" > dp2.plan
sed 's/dp = 2/dp = 2  tp = 2  tensor = megatron/' dp2.plan > d2t2.plan
for p in dp2 d2t2; do
  ok=""
  for _ in 1 2 3; do # planc fails while build/ is being rebuilt: try again
    "$BIN/planc" "$p.plan" -o "$p" > "$p.planc.log" 2>&1 && { ok=1; break; }
    sleep 20
  done
  [ -n "$ok" ] || { cat "$p.planc.log"; fatal "planc could not compile $p.plan (above)"; }
done
pass "compiled tiny-gpt as dp2 (2 ranks) and d2t2 (dp 2 x tp 2, 4 ranks)"

steps_of() { grep -a '^step [0-9]' "$1" | cut -d'|' -f1-3; }

# --- srun and mpirun: the same run ------------------------------------------
for n in 2 4; do
  prog=dp2; [ $n = 4 ] && prog=d2t2
  args=(--steps 8 --checkpoint-every 0)
  timeout 60 srun -n $n "./$prog" "${args[@]}" --checkpoint-dir srun$n-ckpt \
    --save srun$n.safetensors > srun$n.log 2>&1
  src=$?
  timeout 60 mpirun --oversubscribe -np $n "./$prog" "${args[@]}" --checkpoint-dir mpirun$n-ckpt \
    --save mpirun$n.safetensors > mpirun$n.log 2>&1
  mrc=$?
  if [ $src -ne 0 ] || [ $mrc -ne 0 ]; then
    tail -n 5 srun$n.log mpirun$n.log
    fail "srun -n $n ($prog): exit codes srun $src, mpirun $mrc (logs above)"
    continue
  fi
  steps_of srun$n.log > srun$n.steps; steps_of mpirun$n.log > mpirun$n.steps
  if [ "$(wc -l < srun$n.steps)" -eq 8 ] && cmp -s srun$n.steps mpirun$n.steps &&
    cmp -s srun$n.safetensors mpirun$n.safetensors; then
    pass "srun -n $n ($prog): 8 steps, the losses and grad norms of mpirun -np $n, the same --save bytes"
  else
    diff srun$n.steps mpirun$n.steps | head -n 10
    cmp srun$n.safetensors mpirun$n.safetensors
    fail "srun -n $n ($prog) differs from mpirun -np $n (above)"
  fi
done

# --- the cuda target's launch, without MPI ----------------------------------
# A cuda program starts with planrt's own TCP control plane (runtime/lib/net),
# which reads the launcher's variables; its test program needs no GPU. Under
# the real srun (SLURM_PROCID, SLURM_STEP_NODELIST, the port from the job and
# step ids) and the real mpirun (OMPI_COMM_WORLD_*), 4 ranks exchange
# messages and run every collective.
if [ -x "$BIN/planrt_net_tests" ]; then
  # --mpi=none: only Slurm's own variables (no PMIx ones) reach the ranks.
  for launch in "srun --mpi=none -n 4" "mpirun --oversubscribe -np 4"; do
    log="net-${launch%% *}.log"
    timeout 60 $launch "$BIN/planrt_net_tests" basic > "$log" 2>&1
    rc=$?
    oks=$(grep -c '^rank [0-3] of 4: ok$' "$log")
    if [ $rc -eq 0 ] && [ "$oks" -eq 4 ]; then
      pass "the cuda target's TCP launch under $launch: 4 ranks, point to point, every collective"
    else
      tail -n 5 "$log"
      fail "the cuda target's TCP launch under $launch: exit code $rc, $oks of 4 ranks ok (log above)"
    fi
  done
else
  fail "$BIN/planrt_net_tests is missing (built with the runtime's tests)"
fi

# --- sbatch: stop, requeue, continue ----------------------------------------
# The batch script of docs/runtime.md, on this one node with 2 tasks.
mkdir -p job ref
awk '/^\*\*Slurm\.\*\*/ { s = 1 } s && /^```sh$/ { b = 1; next } b && /^```$/ { exit } b' \
  "$SRC/docs/runtime.md" > job/job.sh
if ! grep -q '^#SBATCH --nodes=' job/job.sh || ! grep -q '^srun .*\./model' job/job.sh; then
  cat job/job.sh
  fatal "docs/runtime.md: no batch script with '#SBATCH --nodes=' and 'srun ... ./model' after **Slurm.**"
fi
sed -i 's/^#SBATCH --nodes=.*/#SBATCH --nodes=1 --ntasks=2/' job/job.sh
for d in job ref; do cp dp2 $d/model; ln -s ../data $d/data; done
cd job
JOB="$(sbatch --parsable job.sh)" || fatal "sbatch job.sh failed"
LOG="train-$JOB.log"
echo "sbatch: job $JOB"
waitfor() { # seconds, then a command: true when the command succeeded in time
  local end=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.1; done
}
if ! waitfor 60 grep -saq '^step 20/' "$LOG"; then
  cat "$LOG" 2>/dev/null; squeue
  fatal "sbatch: job $JOB did not reach step 20 within 60 s (log above)"
fi
scancel --signal=TERM "$JOB" || fail "scancel --signal=TERM $JOB failed"
if ! waitfor 60 grep -saq -e '^stopped by' -e '^done:' "$LOG"; then
  tail -n 5 "$LOG"
  fatal "sbatch: job $JOB neither stopped nor finished within 60 s of scancel --signal=TERM"
fi
stop_line="$(grep -a '^stopped by' "$LOG" | head -n 1)"
[ -n "$stop_line" ] ||
  fatal "sbatch: job $JOB ran to the end before SIGTERM reached it (make the run longer)"
N="$(sed -n 's|^stopped by SIGTERM after step \([0-9]*\)/.*|\1|p' <<< "$stop_line")"
CKPT="ckpt/step-$(printf %06d "${N:-0}")"
if [ -n "$N" ] && [ -f "$CKPT/manifest.json" ] && [ -z "$(find ckpt -name '.*.tmp-*')" ]; then
  pass "scancel --signal=TERM: '$stop_line'; $CKPT/ holds manifest.json, no temporary files"
else
  echo "$stop_line"; ls -la ckpt "$CKPT" 2>&1
  fail "scancel --signal=TERM: no complete checkpoint of the stop's step (above)"
fi
# The script requeues only when srun exited with code 0.
restarts() { scontrol show job "$JOB" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p'; }
requeued() { [ "$(restarts)" -ge 1 ] 2>/dev/null; }
if waitfor 30 requeued; then
  pass "the job step exited with code 0 and the batch script requeued job $JOB (Restarts=$(restarts))"
else
  tail -n 5 "$LOG"; scontrol show job "$JOB" | head -n 5
  fail "job $JOB was not requeued after the stop (srun failed, or scontrol requeue did)"
fi

# The uninterrupted run, same options, while the job waits to start again.
(cd ../ref && timeout 120 mpirun --oversubscribe -np 2 ./model --checkpoint-dir ckpt \
  --checkpoint-every 1000 --save final.safetensors > ref.log 2>&1) ||
  { tail -n 5 ../ref/ref.log; fail "the uninterrupted run under mpirun failed (above)"; }

job_state() { scontrol show job "$JOB" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
completed() { [ "$(job_state)" = COMPLETED ]; }
if waitfor 150 completed; then
  pass "the requeued job $JOB completed ($(scontrol show job "$JOB" | grep -o 'ExitCode=[0-9:]*'))"
else
  tail -n 5 "$LOG"; scontrol show job "$JOB" | head -n 8
  fail "the requeued job $JOB did not complete within 150 s (state $(job_state))"
fi
# The first run's lines up to its stop line, the requeued run's after it.
sed -n '1,/^stopped by/p' "$LOG" > first.log
sed -n '/^stopped by/,$p' "$LOG" | tail -n +2 > second.log
if grep -aq "^resume: step $N from $CKPT/" second.log && ! grep -aq '^step [0-9]*/' <(
  grep -a '^step [0-9]*/' second.log | awk -v n="$N" '{ split($2, a, "/"); if (a[1] <= n) print }'); then
  pass "the requeued run, same command line, continued: '$(grep -a '^resume:' second.log | head -n 1)'"
else
  grep -a -m 3 -e '^resume' -e '^start' -e '^step' second.log
  fail "the requeued run did not continue from $CKPT (its first lines above; automatic resume needed)"
fi
{ steps_of first.log; steps_of second.log; } > job.steps
steps_of ../ref/ref.log > ref.steps
if [ "$(wc -l < ref.steps)" -eq 1500 ] && cmp -s job.steps ref.steps; then
  pass "stopped + requeued job: the 1500 loss lines of the uninterrupted run"
else
  diff job.steps ref.steps | head -n 6
  fail "stopped + requeued job: loss lines differ from the uninterrupted run's ($(wc -l < job.steps) vs $(wc -l < ref.steps) lines)"
fi
if cmp final.safetensors ../ref/final.safetensors; then
  pass "stopped + requeued job: final.safetensors is byte-identical to the uninterrupted run's"
else
  fail "stopped + requeued job: final.safetensors differs from the uninterrupted run's"
fi

[ $FAILED -eq 0 ] && echo "slurm-test: every check passed" || echo "slurm-test: some checks FAILED"
exit $FAILED
