#!/usr/bin/env bash
# Host step times of a mixture of experts: planc (1 rank x 2 threads) next
# to PyTorch eager with 2 threads (Debian's python3-torch, and the PyPI
# release when bench/host.sh's environment exists) on the same Mixtral-style
# model and batch (examples/models/mixtral.plan; bench/torch_moe.py runs the
# experts as Hugging Face's Mixtral block does), fp32, interleaved in one
# invocation; medians of steps 3..N, the best of two rounds. Prints one
# table and appends it to bench/RESULTS.md with the date and the CPU. Run by
# hand:   ./bench/moe.sh [STEPS]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STEPS="${1:-8}"
BUILD="$ROOT/build"
THREADS=2
cmake --build "$BUILD" -- planc planrt_host plan-tokenize >/dev/null
PLANC="$BUILD/bin/planc"
VENV="${PLANC_BENCH_VENV:-$HOME/.cache/planc/bench-torch}"
PYS=(/usr/bin/python3)
"$VENV/bin/python" -c 'import torch' 2>/dev/null && PYS+=("$VENV/bin/python")
. "$ROOT/bench/common.sh" # scratch_with_tokens, median_ms, best
scratch_with_tokens

rows=()
# NAME VOCAB SEQ D HEADS KV HIDDEN EXPERTS TOP_K LAYERS BATCH
run_config() {
  local label=$1 V=$2 T=$3 D=$4 H=$5 KV=$6 HID=$7 E=$8 K=$9 L=${10} B=${11}
  cat >m.plan <<PLAN
import "$ROOT/examples/models/mixtral.plan"
vocab = $V
seq = $T
d = $D
heads = $H
kv_heads = $KV
hidden = $HID
experts = $E
top_k = $K
layers = $L
parallel { dp = 1 }
train {
  batch = $B
  steps = $STEPS
  optimizer = adamw(lr = 1e-4, betas = [0.9, 0.95], eps = 1e-8, weight_decay = 0.1)
  grad_clip = 1.0
  data = shards("data/tiny_train_*.bin")
}
PLAN
  "$PLANC" m.plan -o m
  local a=() t=() u=()
  for round in 1 2; do
    a+=("$(PLANRT_NUM_THREADS=$THREADS mpirun --bind-to none -np 1 ./m | median_ms)")
    t+=("$("${PYS[0]}" "$ROOT/bench/torch_moe.py" "$V" "$T" "$D" "$H" "$KV" "$HID" "$E" "$K" "$L" "$B" "$STEPS" "$THREADS" | awk '{print $4}')")
    if [ ${#PYS[@]} -gt 1 ]; then
      u+=("$("${PYS[1]}" "$ROOT/bench/torch_moe.py" "$V" "$T" "$D" "$H" "$KV" "$HID" "$E" "$K" "$L" "$B" "$STEPS" "$THREADS" | awk '{print $4}')")
    fi
  done
  local pa pt pu=""
  pa=$(best "${a[@]}")
  pt=$(best "${t[@]}")
  [ ${#u[@]} -gt 0 ] && pu=$(best "${u[@]}")
  local row
  row=$(awk -v l="$label" -v a="$pa" -v t="$pt" -v u="$pu" -v n="$((B * T))" 'BEGIN {
    printf "| %s | %.1f ms, %.0f tok/s | %.1f ms, %.0f tok/s, planc **%.2fx** |", l, a, n / a * 1e3, t, n / t * 1e3, t / a
    if (u != "") printf " %.1f ms, %.0f tok/s, planc **%.2fx** |", u, n / u * 1e3, u / a
    else printf " not installed |" }')
  rows+=("$row")
  echo "$row"
}

DEB_V=$(/usr/bin/python3 -c 'import torch; print(torch.__version__.split("+")[0])')
HEADER="| config | planc 1 rank x $THREADS threads | PyTorch $DEB_V (Debian) eager | PyTorch (PyPI) eager |"
echo "$HEADER"
run_config "tiny Mixtral (V 256, T 64, d 64, 8 experts of 64, top 2, 2 layers, B 16)" 256 64 64 4 2 64 8 2 2 16
run_config "small Mixtral (V 256, T 256, d 256, 8 experts of 512, top 2, 4 layers, B 8)" 256 256 256 8 2 512 8 2 4 8
{
  echo
  echo "## Host step times of a mixture of experts vs PyTorch ($(date +%F), $CPU, $(nproc) cores)"
  echo
  echo "bench/moe.sh $STEPS: fp32, AdamW with clipping, $THREADS threads, medians of steps 3..$STEPS, the best of two interleaved rounds; the ratio is PyTorch's time over planc's (> 1: planc faster). PyTorch runs the experts as Hugging Face's Mixtral block does (bench/torch_moe.py)."
  echo
  echo "$HEADER"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >>"$ROOT/bench/RESULTS.md"
