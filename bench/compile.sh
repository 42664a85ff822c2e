#!/usr/bin/env bash
# Compile time and peak memory of planc, by model size: the 1T-parameter plan
# of Narayanan et al. over 3072 GPUs, GPT-3 175B, and tiny-gpt with 100, 1000
# and 10000 layers (time and memory should grow linearly with the layers and
# not at all with the GPUs). Prints a table and appends it to
# bench/RESULTS.md with the date and the CPU. Run by hand:
#   ./bench/compile.sh [BUILD_DIR]
# With REF=/path/to/another/planc (e.g. one built from an older commit), each
# plan is also compiled by it, run for run in turn with this build's planc,
# and the table gives both side by side: this VM's speed drifts between
# minutes, so only the ratio within one invocation compares builds.
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
REF="${REF:-}"
rows=()
# fastest and median of the seconds given
stats() {
  local sorted
  sorted=$(printf '%s\n' "$@" | sort -n)
  echo "$(echo "$sorted" | head -1) $(echo "$sorted" | sed -n "$((($# + 1) / 2))p")"
}
measure() {
  local label="$1"
  shift
  local times=() ref_times=() kb_max=0 bin secs kb
  for ((i = 0; i < RUNS; i++)); do
    for bin in "$PLANC" ${REF:+"$REF"}; do
      /usr/bin/time -f "%e %M" -o "$TMP/time" "$bin" "$@" -o /dev/null \
        2>"$TMP/err" >/dev/null || { echo "$bin failed for $label:"; cat "$TMP/err"; exit 1; }
      read -r secs kb <"$TMP/time"
      if [[ "$bin" == "$PLANC" ]]; then
        times+=("$secs")
        ((kb > kb_max)) && kb_max=$kb
      else
        ref_times+=("$secs")
      fi
    done
  done
  local fastest median
  read -r fastest median < <(stats "${times[@]}")
  if [[ -n "$REF" ]]; then
    local rf rm
    read -r rf rm < <(stats "${ref_times[@]}")
    rows+=("| $label | $fastest | $median | $((kb_max / 1024)) | $rf | $rm | $(awk "BEGIN{printf \"%.2f\", $median / $rm}") |")
    echo "$label: fastest $fastest s, median $median s (runs: ${times[*]}); reference: fastest $rf s, median $rm s (runs: ${ref_times[*]})"
  else
    rows+=("| $label | $fastest | $median | $((kb_max / 1024)) |")
    echo "$label: fastest $fastest s, median $median s (runs: ${times[*]}), $((kb_max / 1024)) MiB"
  fi
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
  if [[ -n "$REF" ]]; then
    echo "Reference: $REF ($("$REF" --version 2>/dev/null | head -1)), run in turn with this build."
    echo
    echo "| plan | fastest of $RUNS s | median s | peak MiB | reference fastest s | reference median s | median / reference |"
    echo "|---|---|---|---|---|---|---|"
  else
    echo "| plan | fastest of $RUNS s | median s | peak MiB |"
    echo "|---|---|---|---|"
  fi
  printf '%s\n' "${rows[@]}"
} | tee -a "$ROOT/bench/RESULTS.md"
