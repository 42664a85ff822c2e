#!/bin/sh
# usage: signal_rank.sh SIGNAL RANK OUT -- MPIRUN-COMMAND...
# Runs MPIRUN-COMMAND in the background (output to OUT.log), waits until the
# program printed "step 3/" (training started), sends SIGNAL (STOP or KILL)
# to the process of MPI rank RANK (a child of mpirun with
# OMPI_COMM_WORLD_RANK=RANK), then waits at most 60 s for mpirun to exit and
# writes "exit=CODE seconds=S" to OUT.result: CODE is mpirun's exit status
# and S the whole seconds from the signal to mpirun's exit. Whatever is left
# (the stopped rank, or mpirun after 60 s) is continued and killed, so
# nothing stays behind. Exits non-zero only when it could not do this.
set -u
sig=$1 rank=$2 out=$3
shift 4
"$@" > "$out.log" 2>&1 &
mpirun_pid=$!

fail() {
  echo "signal_rank.sh: $*" >&2
  kill -KILL "$mpirun_pid" 2>/dev/null
  exit 1
}

i=0
until grep -q '^step 3/' "$out.log" 2>/dev/null; do
  kill -0 "$mpirun_pid" 2>/dev/null || fail "the program ended before step 3"
  i=$((i + 1))
  [ $i -le 600 ] || fail "no 'step 3/' line within 60 s"
  sleep 0.1
done

pid=
for p in $(pgrep -P "$mpirun_pid"); do
  if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null |
      grep -qx "OMPI_COMM_WORLD_RANK=$rank"; then
    pid=$p
  fi
done
[ -n "$pid" ] || fail "no process of rank $rank under mpirun ($mpirun_pid)"

t0=$(date +%s%N)
kill "-$sig" "$pid"
i=0
while kill -0 "$mpirun_pid" 2>/dev/null; do
  i=$((i + 1))
  if [ $i -gt 600 ]; then
    kill -CONT "$pid" 2>/dev/null
    kill -KILL "$pid" 2>/dev/null
    fail "mpirun still runs 60 s after SIG$sig to rank $rank"
  fi
  sleep 0.1
done
wait "$mpirun_pid"
code=$?
t1=$(date +%s%N)
kill -CONT "$pid" 2>/dev/null
kill -KILL "$pid" 2>/dev/null
echo "exit=$code seconds=$(( (t1 - t0) / 1000000000 ))" > "$out.result"
