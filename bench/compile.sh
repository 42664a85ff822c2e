#!/usr/bin/env bash
# Compile time and peak memory of planc, by model size: the 1T-parameter plan
# of Narayanan et al. over 3072 GPUs, GPT-3 175B, and tiny-gpt with 100, 1000
# and 10000 layers (time and memory should grow linearly with the layers and
# not at all with the GPUs). Prints a table and appends it to
# bench/RESULTS.md with the date and the CPU. Run by hand:
#   ./bench/compile.sh [BUILD_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="${1:-$ROOT/build}"
cmake --build "$BUILD" -- planc >/dev/null
PLANC="$BUILD/bin/planc"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# One measurement: label, then the planc arguments. Each plan compiles
# RUNS times (default 3): this VM's speed swings by 20% between minutes, so
# the table gives the fastest and the median run (and the largest peak).
RUNS="${RUNS:-3}"
rows=()
measure() {
  local label="$1"
  shift
  local times=() kb_max=0
  for ((i = 0; i < RUNS; i++)); do
    /usr/bin/time -f "%e %M" -o "$TMP/time" "$PLANC" "$@" -o /dev/null \
      2>"$TMP/err" >/dev/null || { echo "planc failed for $label:"; cat "$TMP/err"; exit 1; }
    read -r secs kb <"$TMP/time"
    times+=("$secs")
    ((kb > kb_max)) && kb_max=$kb
  done
  local sorted fastest median
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  fastest=$(echo "$sorted" | head -1)
  median=$(echo "$sorted" | sed -n "$(((RUNS + 1) / 2))p")
  rows+=("| $label | $fastest | $median | $((kb_max / 1024)) |")
  echo "$label: fastest $fastest s, median $median s (runs: ${times[*]}), $((kb_max / 1024)) MiB"
}

# The whole pipeline, through code generation (--emit=cpp: the generated C++,
# without compiling it).
measure "1T params, 3072 GPUs (tp 8, pp 64, dp 6, 512 microbatches, fp16), --emit=cpp" \
  "$ROOT/examples/megatron/gpt-1t.plan" --emit=cpp
measure "GPT-3 175B, 1536 GPUs (interleaved, 128 microbatches, bf16), --emit=cpp" \
  "$ROOT/examples/gpt3-175b.plan" --emit=cpp
for L in 100 1000 10000; do
  sed -e "s/^layers = .*/layers = $L/" \
      -e "s|\"models/gpt.plan\"|\"$ROOT/examples/models/gpt.plan\"|" \
      "$ROOT/examples/tiny-gpt.plan" >"$TMP/l$L.plan"
  measure "tiny-gpt, $L layers, --emit=cpp" "$TMP/l$L.plan" --emit=cpp
done

{
  echo
  echo "## Compile time ($(date -u +%Y-%m-%d), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
  echo
  echo "| plan | fastest of $RUNS s | median s | peak MiB |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee -a "$ROOT/bench/RESULTS.md"
