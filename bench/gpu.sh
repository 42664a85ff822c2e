#!/usr/bin/env bash
# GPU runs in one command, for whoever has a GPU (none on the project's CI):
#   ./bench/gpu.sh [STEPS]
# 1. Builds the cuda target and checks that 10 steps of tiny-gpt on the GPU
#    match the host run (fp32: losses and final parameters 1e-4 relative).
# 2. Measures GPT-2 124M (B 16, T 1024) on one GPU in fp32 and bf16
#    (precision = bf16: fp32 master weights): tokens/s, MFU against the
#    card's dense fp32 peak, and the peak memory planrt measured, next to
#    PyTorch eager on the same GPU in fp32 and bf16 (autocast) in the same
#    invocation (when python3 has torch with CUDA). planc's bf16 kernels
#    stage 16-bit operands through fp32 (docs/design.md), so its bf16 row
#    measures that path, and its MFU is still against the fp32 peak.
# Prints one table and appends it with the date and GPU to bench/RESULTS.md.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STEPS="${1:-20}"
BUILD="$ROOT/build"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "bench/gpu.sh: no NVIDIA GPU here (nvidia-smi finds none); run it on a GPU node" >&2
  exit 2
fi
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
# Dense fp32 peaks (no TF32: planrt's cuBLASLt calls compute in fp32), as
# docs/cost-model.md lists them.
case "$GPU" in
*H200*) PEAK32=67e12 ;;
*H100*) PEAK32=67e12 ;;
*A100*) PEAK32=19.5e12 ;;
*B200*) PEAK32=75e12 ;;
*L40S*) PEAK32=91.6e12 ;;
*) PEAK32="" ;;
esac
cmake --build "$BUILD" -- planc planrt_host planrt_cuda plan-tokenize >/dev/null
PLANC="$BUILD/bin/planc"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$TMP"
mkdir -p data
"$BUILD/bin/plan-tokenize" -o data/tiny "$ROOT/examples/data/tiny.txt" >/dev/null

# 1. tiny-gpt, 10 steps, host against GPU (one rank each).
sed -e "s|\"models/gpt.plan\"|\"$ROOT/examples/models/gpt.plan\"|" \
  -e 's/dp = 2/dp = 1/' "$ROOT/examples/tiny-gpt.plan" >tiny.plan
"$PLANC" tiny.plan -o tiny-host
"$PLANC" tiny.plan --target=cuda -o tiny-cuda
mpirun -np 1 ./tiny-host --steps 10 --save host.safetensors >host.log
mpirun -np 1 ./tiny-cuda --steps 10 --save cuda.safetensors >cuda.log
echo "tiny-gpt, 10 steps, GPU against host:"
/usr/bin/python3 "$ROOT/test/e2e/compare_runs.py" host.log host.safetensors \
  cuda.log cuda.safetensors --loss-rtol 1e-4 --param-rtol 1e-4

# 2. GPT-2 124M, B 16, T 1024.
cat >gpt2.plan <<PLAN
import "$ROOT/examples/models/gpt.plan"
vocab = 50257
max_seq = 1024
seq = 1024
d = 768
heads = 12
layers = 12
residual_std = 0.02 / 4.898979
train {
  batch = 16
  steps = $STEPS
  optimizer = adamw(lr = 6e-4, betas = [0.9, 0.95], eps = 1e-8, weight_decay = 0.1)
  grad_clip = 1.0
  data = shards("data/tiny_train_*.bin")
}
PLAN
planc_row() { # PLAN -> "step | tokens/s | MFU | peak memory"
  "$PLANC" "$1.plan" --target=cuda -o "$1-cuda"
  mpirun -np 1 "./$1-cuda" --quiet --log-json "$1.json" ${PEAK32:+--peak-flops $PEAK32}
  /usr/bin/python3 - "$1.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r for r in rows if r.get("type") == "step"][2:]
summary = next(r for r in rows if r.get("type") == "summary")
tok = statistics.median(r["tokens_per_s"] for r in steps)
ms = statistics.median(r["step_time_s"] for r in steps) * 1e3
mfu = statistics.median(r.get("mfu") or 0 for r in steps)
peak = summary["memory"]["max_over_ranks"]["device_peak_bytes"]
print(f"{ms:.1f} ms | {tok:.0f} | {100 * mfu:.1f}% | {peak / 1e9:.2f} GB")
PY
}
sed 's/^train {/train {\n  precision = bf16/' gpt2.plan >gpt2-bf16.plan
planc_fp32=$(planc_row gpt2)
planc_bf16=$(planc_row gpt2-bf16)
torch_fp32="PyTorch with CUDA not available"
torch_bf16="$torch_fp32"
if /usr/bin/python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  torch_fp32=$(/usr/bin/python3 "$ROOT/bench/torch_gpt.py" 50257 1024 768 12 12 16 "$STEPS" 8 cuda float32)
  torch_bf16=$(/usr/bin/python3 "$ROOT/bench/torch_gpt.py" 50257 1024 768 12 12 16 "$STEPS" 8 cuda bfloat16)
fi
{
  echo
  echo "## bench/gpu.sh: $(date -u +%F), $GPU (fp32 peak ${PEAK32:-unknown} FLOP/s)"
  echo
  echo "GPT-2 124M, B 16, T 1024, one GPU; medians of steps 3..$STEPS."
  echo
  echo "| run | step | tokens/s | MFU | peak memory |"
  echo "|---|---|---|---|---|"
  echo "| planc fp32 | $planc_fp32 |"
  echo "| planc bf16 | $planc_bf16 |"
  echo "| PyTorch eager fp32 | $torch_fp32 | | | |"
  echo "| PyTorch eager bf16 autocast | $torch_bf16 | | | |"
} | tee -a "$ROOT/bench/RESULTS.md"
