#!/usr/bin/env bash
# Host step times: planc (1 rank x 2 threads, and 2 ranks x 1 thread) next to
# PyTorch eager (Debian's python3-torch, 2 threads) on the same GPT and batch,
# fp32, interleaved in one invocation; medians of steps 3..N. Prints a table
# and appends it to bench/RESULTS.md with the date and the CPU. Run by hand:
#   ./bench/host.sh [STEPS]
# Not yet what issue 12 asks for in full: the current PyTorch from PyPI (a
# virtual environment) and a T 256 case are still to be added.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STEPS="${1:-12}"
BUILD="$ROOT/build"
cmake --build "$BUILD" -- planc planrt_host plan-tokenize >/dev/null
PLANC="$BUILD/bin/planc"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$TMP"
mkdir -p data
"$BUILD/bin/plan-tokenize" -o data/tiny "$ROOT/examples/data/tiny.txt" >/dev/null

# A plan: NAME VOCAB SEQ D HEADS LAYERS BATCH, from tiny-gpt's shape.
make_plan() {
  local name=$1 vocab=$2 seq=$3 d=$4 heads=$5 layers=$6 batch=$7 dp=$8
  cat >"$name-dp$dp.plan" <<PLAN
import "$ROOT/examples/models/gpt.plan"
vocab = $vocab
max_seq = $seq
seq = $seq
d = $d
heads = $heads
layers = $layers
residual_std = 0.02
parallel { dp = $dp }
train {
  batch = $batch
  steps = $STEPS
  optimizer = adamw(lr = 1e-4, betas = [0.9, 0.95], eps = 1e-8, weight_decay = 0.1)
  grad_clip = 1.0
  data = shards("data/tiny_train_*.bin")
}
PLAN
  "$PLANC" "$name-dp$dp.plan" -o "$name-dp$dp"
}

median_ms() { # step lines on stdin -> median of steps 3..N
  grep -o '| [0-9.]* ms' | awk 'NR > 2 {print $2}' | sort -n |
    awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
}

rows=()
run_config() {
  local label=$1 vocab=$2 seq=$3 d=$4 heads=$5 layers=$6 batch=$7
  make_plan cfg "$vocab" "$seq" "$d" "$heads" "$layers" "$batch" 1
  make_plan cfg "$vocab" "$seq" "$d" "$heads" "$layers" "$batch" 2
  local a=() b=() t=()
  for round in 1 2; do # interleaved
    a+=("$(PLANRT_NUM_THREADS=2 mpirun --bind-to none -np 1 ./cfg-dp1 | median_ms)")
    b+=("$(mpirun -np 2 ./cfg-dp2 | median_ms)")
    t+=("$(/usr/bin/python3 "$ROOT/bench/torch_gpt.py" "$vocab" "$seq" "$d" \
      "$heads" "$layers" "$batch" "$STEPS" 2 | awk '{print $3}')")
  done
  local best_a best_b best_t
  best_a=$(printf '%s\n' "${a[@]}" | sort -n | head -1)
  best_b=$(printf '%s\n' "${b[@]}" | sort -n | head -1)
  best_t=$(printf '%s\n' "${t[@]}" | sort -n | head -1)
  local tokens=$((batch * seq))
  local row
  row=$(awk -v l="$label" -v a="$best_a" -v b="$best_b" -v t="$best_t" \
    -v n="$tokens" 'BEGIN {
      printf "| %s | %.1f ms (%.0f tok/s, %.2fx) | %.1f ms (%.0f tok/s, %.2fx) | %.1f ms (%.0f tok/s) |",
        l, a, n / a * 1e3, t / a, b, n / b * 1e3, t / b, t, n / t * 1e3 }')
  rows+=("$row")
  echo "$row"
}

echo "| config | planc 1 rank x 2 threads | planc 2 ranks x 1 thread | PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)') eager, 2 threads |"
run_config "tiny-gpt (V 256, T 64, d 64, 2 layers, B 16)" 256 64 64 4 2 16
run_config "GPT-2 124M (V 50257, T 64, d 768, 12 layers, B 4)" 50257 64 768 12 12 4

{
  echo
  echo "## Host step times vs PyTorch ($(date +%F), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores)"
  echo
  echo "bench/host.sh $STEPS: fp32, AdamW with clipping, medians of steps 3..$STEPS, the best of two interleaved rounds; ratio = PyTorch time / planc time (> 1: planc faster)."
  echo
  echo "| config | planc 1 rank x 2 threads | planc 2 ranks x 1 thread | PyTorch eager, 2 threads |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >>"$ROOT/bench/RESULTS.md"
