#!/usr/bin/env bash
# usage: requeue.sh CKPT_DIR SIGNALS LOG -- COMMAND...
# Runs COMMAND (an mpirun line) once per signal in SIGNALS (a word list of
# KILL and TERM), each time in its own session, and interrupts it once the
# checkpoint directory holds a complete checkpoint newer than when it
# started: KILL goes to the whole session (mpirun and every rank at once,
# as a preemption or a node failure does), TERM to the ranks only (as
# `scancel --signal=TERM` does; they finish the step, write a checkpoint
# and exit 0). Then it runs COMMAND once more to the end. Every run's output
# goes to LOG.N (N from 1), and one line per run to stdout:
#   run N: SIGNAL after checkpoint STEP, exit CODE
#   run N: to the end, exit CODE
# Exits non-zero only when it could not do that (a run ended before it
# could be interrupted, or made no checkpoint within 120 s); whatever it
# started is killed, so nothing stays behind.
set -u
ckpt=$1 signals=$2 log=$3
shift 4

newest() { # the newest complete checkpoint's step, 0 if none
  n=0
  for m in "$ckpt"/step-*/manifest.json; do
    [ -f "$m" ] || continue
    s=${m%/manifest.json}
    s=${s##*/step-}
    s=$(expr "$s" + 0)
    [ "$s" -gt "$n" ] && n=$s
  done
  echo $n
}

gone() { # every process of the run's session killed and gone
  pkill -KILL -s "$pid" 2>/dev/null
  while pgrep -s "$pid" > /dev/null; do sleep 0.05; done
}

run=0
for sig in $signals; do
  run=$((run + 1))
  before=$(newest)
  setsid "$@" > "$log.$run" 2>&1 &
  pid=$!
  i=0
  while [ "$(newest)" -le "$before" ]; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "requeue.sh: run $run ended before a new checkpoint (see $log.$run)" >&2
      exit 1
    fi
    i=$((i + 1))
    if [ $i -gt 12000 ]; then
      gone
      echo "requeue.sh: run $run wrote no checkpoint within 120 s" >&2
      exit 1
    fi
    sleep 0.01
  done
  at=$(newest)
  # Open MPI gives each rank its own process group: the session holds them.
  if [ "$sig" = KILL ]; then
    pkill -KILL -s "$pid"
  else
    kill "-$sig" $(pgrep -s "$pid" | grep -vx "$pid")
  fi
  wait "$pid" 2>/dev/null
  code=$?
  gone
  echo "run $run: $sig after checkpoint $at, exit $code"
done
run=$((run + 1))
"$@" > "$log.$run" 2>&1
echo "run $run: to the end, exit $?"
