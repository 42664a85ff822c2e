#!/bin/sh
# planc --autoplan on the Table 1 plans and the 1T-parameter plan: how long
# each search takes on this machine (the issue's target: under 10 s for the
# 1T model on 3072 GPUs) and how the best plan found compares with the
# paper's configuration (both as planc --report predicts them).
# usage: bench/autoplan.sh [BUILD_DIR]   (default: build)
set -e
cd "$(dirname "$0")/.."
PLANC=${1:-build}/bin/planc
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
echo "$(date -u +%F) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
printf '| plan | search s | plans considered | compiled | paper config step s | best step s | speed-up | best plan |\n|---|---|---|---|---|---|---|---|\n'
for f in examples/megatron/table1-*.plan examples/megatron/gpt-1t.plan; do
  start=$(date +%s.%N)
  "$PLANC" "$f" --autoplan -o "$T/best.plan" > "$T/out.txt"
  end=$(date +%s.%N)
  considered=$(sed -n 's/^ *\([0-9]*\) plans considered.*/\1/p' "$T/out.txt")
  compiled=$(sed -n 's/.* \([0-9]*\) plans compiled in.*/\1/p' "$T/out.txt")
  best=$(grep -m1 '^1' "$T/out.txt")
  you=$(grep -m1 '^you' "$T/out.txt")
  plan=$(echo "$best" | sed 's/^1\(=you\)\? *//; s/ \{2,\}.*//')
  # After the plan: step s, TFLOP/s, MFU, bubble, GB, fits, est. s.
  bs=$(echo "$best" | awk '{print $(NF-6)}')
  ys=$(echo "$you" | awk '{print $(NF-6)}')
  printf '| %s | %.2f | %s | %s | %s | %s | %.2fx | %s |\n' "$(basename "$f")" \
    "$(echo "$end - $start" | bc)" "$considered" "$compiled" "$ys" "$bs" \
    "$(echo "$ys / $bs" | bc -l)" "$plan"
done
