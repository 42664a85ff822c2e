#!/bin/sh
# Runs net_tests.cpp's scenarios as N processes started with torchrun-style
# variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a free
# MASTER_PORT), waits for all and checks each one's exit code and messages.
# Every process runs under `timeout`, so a hang fails the test.
#   usage: run_net_tests.sh path/to/planrt_net_tests
set -u
BIN=${1:?usage: run_net_tests.sh path/to/planrt_net_tests}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/planrt-net.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
FAILURES=0

# The launcher variables of an enclosing job (ctest under srun or mpirun)
# must not reach the ranks: each would read them.
CLEAN="env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u MASTER_ADDR -u MASTER_PORT
  -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_LOCAL_RANK
  -u OMPI_COMM_WORLD_LOCAL_SIZE -u PMI_RANK -u PMI_SIZE -u MPI_LOCALRANKID
  -u MPI_LOCALNRANKS -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_STEP_NUM_TASKS
  -u SLURM_LOCALID -u SLURM_STEP_NODELIST -u SLURM_JOB_NODELIST -u SLURM_JOB_ID
  -u SLURM_JOBID -u SLURM_STEP_ID -u SLURM_STEPID -u PLANRT_RENDEZVOUS_TIMEOUT
  -u TORCHELASTIC_USE_AGENT_STORE"

fail() {
  echo "FAIL: $*"
  FAILURES=$((FAILURES + 1))
}

# run NAME N SCENARIO LIMIT [RANKS...]: starts RANKS (default all N) of a
# world of N, each under `timeout LIMIT`, with the variables in EXTRA_ENV
# too. Sets ELAPSED (seconds); files $TMP/NAME.R.{out,err,rc}.
EXTRA_ENV=
run() {
  name=$1 n=$2 scenario=$3 limit=$4
  shift 4
  ranks=${*:-$(seq 0 $((n - 1)))}
  port=$("$BIN" free-port) || { fail "$name: no free port"; return; }
  start=$(date +%s)
  pids=""
  for r in $ranks; do
    # shellcheck disable=SC2086
    $CLEAN RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port $EXTRA_ENV timeout -k 2 "$limit" "$BIN" \
      "$scenario" >"$TMP/$name.$r.out" 2>"$TMP/$name.$r.err" &
    pids="$pids $!"
  done
  # shellcheck disable=SC2086
  set -- $pids
  for r in $ranks; do
    wait "$1"
    echo $? >"$TMP/$name.$r.rc"
    shift
  done
  ELAPSED=$(($(date +%s) - start))
}

# expect NAME RANK CODE [REGEX]: rank's exit code, and a line of its
# stderr that matches REGEX (grep -E).
expect() {
  rc=$(cat "$TMP/$1.$2.rc")
  if [ "$rc" != "$3" ]; then
    fail "$1: rank $2 exited with $rc, expected $3"
    sed "s/^/    rank $2: /" "$TMP/$1.$2.err" "$TMP/$1.$2.out"
  elif [ $# -ge 4 ] && ! grep -Eq "$4" "$TMP/$1.$2.err"; then
    fail "$1: rank $2's stderr lacks /$4/"
    sed "s/^/    rank $2: /" "$TMP/$1.$2.err"
  fi
}

expect_within() {
  if [ "$ELAPSED" -gt "$2" ]; then
    fail "$1: took $ELAPSED s, expected at most $2 s"
  fi
}

# launch ENV...: what detect_launch() reads (one process, no MPI_Init).
launch() {
  # shellcheck disable=SC2086
  $CLEAN "$@" "$BIN" launch >"$TMP/launch.out" 2>"$TMP/launch.err"
  LAUNCH_RC=$?
  LAUNCH_OUT=$(cat "$TMP/launch.out")
  LAUNCH_ERR=$(cat "$TMP/launch.err")
}

expect_launch() { # WANT_STDOUT ENV...
  want=$1
  shift
  launch "$@"
  if [ "$LAUNCH_RC" != 0 ] || [ "$LAUNCH_OUT" != "$want" ]; then
    fail "launch $*: got '$LAUNCH_OUT' (exit $LAUNCH_RC) $LAUNCH_ERR, expected '$want'"
  fi
}

expect_launch_error() { # REGEX ENV...
  want=$1
  shift
  launch "$@"
  if [ "$LAUNCH_RC" != 2 ] || ! echo "$LAUNCH_ERR" | grep -Eq "$want"; then
    fail "launch $*: got exit $LAUNCH_RC, '$LAUNCH_ERR'; expected exit 2 and /$want/"
  fi
}

T0=$(date +%s)

# --- launch detection ---------------------------------------------------------
expect_launch "launcher=none rank=0 size=1 local_rank=0 addr= port=0"
expect_launch "launcher=torchrun rank=2 size=4 local_rank=1 addr=h1 port=1234" \
  RANK=2 WORLD_SIZE=4 LOCAL_RANK=1 MASTER_ADDR=h1 MASTER_PORT=1234
expect_launch "launcher=torchrun rank=0 size=1 local_rank=0 addr=127.0.0.1 port=29500" \
  WORLD_SIZE=1
# torchrun's agent holds MASTER_PORT when it says so: rank 0 takes the next.
expect_launch "launcher=torchrun rank=1 size=2 local_rank=1 addr=a port=29501" \
  RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500 \
  TORCHELASTIC_USE_AGENT_STORE=True
expect_launch "launcher=torchrun rank=1 size=2 local_rank=1 addr=a port=29500" \
  RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=a MASTER_PORT=29500 \
  TORCHELASTIC_USE_AGENT_STORE=False
# torchrun's variables win over mpirun's and Slurm's.
expect_launch "launcher=torchrun rank=1 size=2 local_rank=0 addr=a port=5" \
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=a MASTER_PORT=5 OMPI_COMM_WORLD_RANK=3 \
  OMPI_COMM_WORLD_SIZE=4 SLURM_PROCID=2 SLURM_NTASKS=4
expect_launch "launcher=mpirun rank=1 size=4 local_rank=1 addr=127.0.0.1 port=29500" \
  OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=1 \
  OMPI_COMM_WORLD_LOCAL_SIZE=4 SLURM_PROCID=0 SLURM_NTASKS=1
expect_launch "launcher=mpirun rank=5 size=8 local_rank=1 addr=n0 port=29500" \
  OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=8 OMPI_COMM_WORLD_LOCAL_RANK=1 \
  OMPI_COMM_WORLD_LOCAL_SIZE=4 MASTER_ADDR=n0
expect_launch "launcher=mpirun rank=3 size=4 local_rank=3 addr=127.0.0.1 port=4444" \
  PMI_RANK=3 PMI_SIZE=4 MPI_LOCALRANKID=3 MPI_LOCALNRANKS=4 MASTER_PORT=4444
# Slurm: the step's task count, the first host of the step's node list, a
# port from the job and step ids: 20000 + (123456 + 1009 * 2) % 12000.
expect_launch "launcher=slurm rank=5 size=8 local_rank=1 addr=gpu003 port=25474" \
  SLURM_PROCID=5 SLURM_NTASKS=16 SLURM_STEP_NUM_TASKS=8 SLURM_LOCALID=1 \
  "SLURM_STEP_NODELIST=gpu[003-010,012],cpu1" \
  "SLURM_JOB_NODELIST=other[1-4]" SLURM_JOB_ID=123456 SLURM_STEP_ID=2
expect_launch "launcher=slurm rank=1 size=2 local_rank=0 addr=a port=20007" \
  SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_JOB_NODELIST=a,b SLURM_JOB_ID=7
# srun's PMI variables without MPICH's MPI_LOCALRANKID: still Slurm.
expect_launch "launcher=slurm rank=0 size=2 local_rank=0 addr=rack1-n01 port=9" \
  SLURM_PROCID=0 SLURM_STEP_NUM_TASKS=2 "SLURM_STEP_NODELIST=rack[1-2]-n[01-04]" \
  MASTER_PORT=9 PMI_RANK=0 PMI_SIZE=2
expect_launch_error "^planrt: error: RANK=abc: not a number" RANK=abc WORLD_SIZE=2
expect_launch_error "^planrt: error: RANK=4: not below WORLD_SIZE=4" \
  RANK=4 WORLD_SIZE=4 MASTER_ADDR=a MASTER_PORT=1
expect_launch_error "^planrt: error: WORLD_SIZE=0: " WORLD_SIZE=0
expect_launch_error "^planrt: error: WORLD_SIZE=2x: not a number" RANK=0 WORLD_SIZE=2x
expect_launch_error "^planrt: error: MASTER_ADDR is not set" RANK=1 WORLD_SIZE=2
expect_launch_error "^planrt: error: MASTER_PORT=0: not a TCP port" \
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=a MASTER_PORT=0
expect_launch_error "^planrt: error: MASTER_ADDR is not set and the 4 ranks span several nodes" \
  OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_SIZE=2
expect_launch_error "^planrt: error: SLURM_PROCID=-1: not a number" \
  SLURM_PROCID=-1 SLURM_NTASKS=2
expect_launch_error "^planrt: error: SLURM_STEP_NODELIST=gpu\[x\]: " \
  SLURM_PROCID=0 SLURM_NTASKS=2 "SLURM_STEP_NODELIST=gpu[x]" SLURM_JOB_ID=1

# --- one to eight ranks: matching, collectives, communicators -----------------
$CLEAN timeout 30 "$BIN" basic >"$TMP/alone.out" 2>&1 ||
  { fail "basic without launcher variables"; cat "$TMP/alone.out"; }
for n in 1 2 3 4 8; do
  run basic$n $n basic 30
  for r in $(seq 0 $((n - 1))); do
    expect "basic$n" "$r" 0
  done
done

# --- 200 MB each way between ranks 0 and 1 at once ----------------------------
run big 2 big 60
expect big 0 0
expect big 1 0
cat "$TMP/big.0.out" "$TMP/big.1.out"

# --- rendezvous failures ------------------------------------------------------
# Rank 2 of 3 never starts: rank 0 names it and gives up after 3 s; rank 1
# hears why.
EXTRA_ENV=PLANRT_RENDEZVOUS_TIMEOUT=3
run missing 3 init 10 0 1
expect missing 0 1 "^planrt: error: rendezvous at 127\.0\.0\.1:[0-9]+: rank 2 of 3 did not arrive within 3 s \(launcher: torchrun"
expect missing 1 1 "^planrt: error: rank 0 gave up: .*rank 2 of 3 did not arrive"
expect_within missing 6
# Rank 0 never starts: rank 1 says it cannot reach it.
EXTRA_ENV=PLANRT_RENDEZVOUS_TIMEOUT=2
run unreachable 2 init 10 1
expect unreachable 1 1 "^planrt: error: rank 1 \(host [^)]*\): cannot reach rank 0 at 127\.0\.0\.1:[0-9]+ within 2 s"
expect_within unreachable 5
EXTRA_ENV=PLANRT_RENDEZVOUS_TIMEOUT=soon
run badtimeout 2 init 10 1
expect badtimeout 1 2 "^planrt: error: PLANRT_RENDEZVOUS_TIMEOUT=soon: "
EXTRA_ENV=

# --- a rank dies: the others fail at once, naming it --------------------------
run die 4 die 15
expect die 2 9
for r in 0 1 3; do
  expect die $r 1 "^planrt: error: rank 2 \(host [^)]*\) closed its connection without finishing: it died or was killed$"
done
expect_within die 5

# --- MPI_Abort(comm, 3) on rank 1: every rank exits with 3 --------------------
run abort 4 abort 15
for r in 0 1 2 3; do
  expect abort $r 3
done
for r in 0 2 3; do
  expect abort $r 3 "^planrt: error: rank 1 aborted \(exit code 3\)$"
done
expect_within abort 5

echo "net tests: $(($(date +%s) - T0)) s, $FAILURES failure(s)"
[ "$FAILURES" -eq 0 ]
