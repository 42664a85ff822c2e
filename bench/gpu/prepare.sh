#!/usr/bin/env bash
# The GPU suite, step 1 of 2: runs here, on a machine without a GPU.
#   bench/gpu/prepare.sh DIR
# Builds into DIR (at most 64 MiB) everything a bare GPU node needs to check
# and time planc's cuda target, then DIR/run.sh OUT runs it there (see that
# script). DIR holds:
#   bin.tar.xz  the cuda programs (sm_80 and sm_90), no MPI among their needs,
#             and cp-tiles (context parallelism's attention tiles against
#             the host functors)
#   data/     token shards from plan-tokenize (enough for every run)
#   ref/      the host target's runs of the same plans: logs and parameters
#   plans/    the plans, and planc --report=json of the GPT-2 plans for the
#             H100 and the H200 (the cost model's prediction for the table)
#   run.sh, summarize.py, kernels.py, compare_runs.py, torch_gpt.py
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DIR="${1:?usage: bench/gpu/prepare.sh DIR}"
GPT2_STEPS="${GPT2_STEPS:-12}"
TINY_STEPS=20

PLANC_BUILD_TARGETS=(planc plan-tokenize planrt_host planrt_cuda planrt_cuda_cp_tiles)
source "$ROOT/scripts/setup.sh"
if ! grep -q '^PLANC_ENABLE_CUDA:.*=ON' "$BUILD/CMakeCache.txt"; then
  echo "bench/gpu/prepare.sh: this build has no CUDA (nvcc not found when $BUILD was configured)" >&2
  exit 1
fi
PLANC="$BUILD/bin/planc"
rm -rf "$DIR"
mkdir -p "$DIR"/{bin,data,ref,plans}
DIR="$(cd "$DIR" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# Token data: the repository's text, one token per byte, about 2 MB of
# tokens: GPT-2's B 16 x T 1024 takes 16 400 per step.
find "$ROOT/docs" "$ROOT/runtime" "$ROOT/lib" "$ROOT/examples/data" -type f \
  \( -name '*.md' -o -name '*.cpp' -o -name '*.h' -o -name '*.txt' \) | sort >"$DIR/data/inputs"
xargs "$BUILD/bin/plan-tokenize" --val-fraction 0.01 -o "$DIR/data/tiny" <"$DIR/data/inputs" >/dev/null
rm "$DIR/data/inputs"

# The plans. Parity plans run on one rank: the GPU node has one GPU.
cd "$DIR/plans"
tiny_gpt() { # PRECISION-LINES -> plan on stdout
  sed -e "s|\"models/gpt.plan\"|\"$ROOT/examples/models/gpt.plan\"|" \
    -e 's/dp = 2/dp = 1/' -e "s/steps = 600/steps = $TINY_STEPS/" \
    -e "s|^train {|train {\n$1|" "$ROOT/examples/tiny-gpt.plan"
}
tiny_gpt "" >tiny-gpt-fp32.plan
# Attention over several tiles of 64 with a partial last one, head dim 64:
# what the GPU's tiled attention does on GPT-2, at a size the host runs.
sed -e 's/^max_seq = 64$/max_seq = 130/' -e 's/^seq = 64$/seq = 130/' \
  -e 's/^d = 64$/d = 128/' -e 's/^heads = 4$/heads = 2/' -e 's/batch = 16/batch = 4/' \
  tiny-gpt-fp32.plan >tiny-gpt-long-fp32.plan
grep -q '^seq = 130$' tiny-gpt-long-fp32.plan && grep -q '^heads = 2$' tiny-gpt-long-fp32.plan &&
  grep -q '^d = 128$' tiny-gpt-long-fp32.plan
# The same in bf16: run.sh runs it on cuDNN's flash attention (and fails
# if cuDNN cannot run it) and on planrt's tiles, both against fp32.
sed -e "s|^train {|train {\n  precision = bf16|" tiny-gpt-long-fp32.plan >tiny-gpt-long-bf16.plan
tiny_gpt "  precision = bf16" >tiny-gpt-bf16.plan
# Two microbatches: the weight gradients' GEMMs add into the step's
# accumulators (planrt::matmul_accumulate, cuBLASLt with beta = 1).
for p in fp32 bf16; do
  sed -e 's/^  dp = 1$/  dp = 1\n  microbatches = 2/' tiny-gpt-$p.plan >tiny-gpt-mb-$p.plan
  grep -q '^  microbatches = 2$' tiny-gpt-mb-$p.plan
done
# A vocabulary of 259: the cuda program pads the tied table to 384 rows
# (pad_vocab's default there: the LM head's GEMMs on aligned rows) and masks
# the padding; against the host's fp32 run of the unpadded table.
sed -e 's/^vocab = 256 /vocab = 259 /' tiny-gpt-fp32.plan >tiny-gpt-odd-fp32.plan
grep -q '^vocab = 259 ' tiny-gpt-odd-fp32.plan
sed -e "s|^train {|train {\n  precision = bf16|" tiny-gpt-odd-fp32.plan >tiny-gpt-odd-bf16.plan
tiny_gpt "  precision = fp16\n  loss_scale = dynamic" >tiny-gpt-fp16.plan
# Attention dropout 0.1 in both layers: the GPU's attention tiles (fp32 and
# tensor-core) draw the host functors' mask; against the host's fp32 run.
sed -e 's/out_bias = attn_proj_b, heads = heads)/out_bias = attn_proj_b, heads = heads, dropout = 0.1)/' \
  "$ROOT/examples/models/gpt.plan" >gpt-dropout.plan
grep -q 'dropout = 0.1' gpt-dropout.plan
sed -e "s|\"$ROOT/examples/models/gpt.plan\"|\"$PWD/gpt-dropout.plan\"|" tiny-gpt-fp32.plan \
  >tiny-gpt-drop-fp32.plan
grep -q 'gpt-dropout.plan' tiny-gpt-drop-fp32.plan
sed -e "s|^train {|train {\n  precision = bf16|" tiny-gpt-drop-fp32.plan >tiny-gpt-drop-bf16.plan
tiny_llama() {
  sed -e "s|\"models/llama.plan\"|\"$ROOT/examples/models/llama.plan\"|" \
    -e "s/steps = 5/steps = $TINY_STEPS/" -e "s/decay_steps = 5/decay_steps = $TINY_STEPS/" \
    -e "s|^train {|train {\n$1|" "$ROOT/test/e2e/Inputs/tiny-llama.plan"
}
tiny_llama "" >tiny-llama-fp32.plan
tiny_llama "  precision = bf16" >tiny-llama-bf16.plan
# A mixture of experts with every routing feature: the auxiliary loss, the
# bias balancing and a per-sequence capacity (tiny-mixtral, 4 experts, top 2).
sed -e 's/act = swiglu)/act = swiglu, aux_loss = 0.01, capacity_factor = 1.0, bias_update = 0.001)/' \
  "$ROOT/examples/models/mixtral.plan" >mixtral-balanced.plan
grep -q 'bias_update = 0.001' mixtral-balanced.plan
sed -e "s|\"models/mixtral.plan\"|\"$PWD/mixtral-balanced.plan\"|" \
  -e "s/steps = 5/steps = $TINY_STEPS/" -e "s/decay_steps = 5/decay_steps = $TINY_STEPS/" \
  "$ROOT/test/e2e/Inputs/tiny-mixtral.plan" >tiny-mixtral-fp32.plan
sed -e 's/dp = 2/dp = 1/' -e "s/steps = 150/steps = $TINY_STEPS/" \
  "$ROOT/examples/resnet-small.plan" >resnet-small-fp32.plan
gpt2() { # PRECISION-LINE GPU
  cat <<PLAN
import "$ROOT/examples/models/gpt.plan"
vocab = 50257
max_seq = 1024
seq = 1024
d = 768
heads = 12
layers = 12
residual_std = 0.02 / 4.898979
train {
$1
  batch = 16
  steps = $GPT2_STEPS
  optimizer = adamw(lr = 6e-4, betas = [0.9, 0.95], eps = 1e-8, weight_decay = 0.1)
  grad_clip = 1.0
  data = shards("data/tiny_train_*.bin")
}
cluster { nodes = 1  gpus_per_node = 1  gpu = $2  intra_bw = 450  inter_bw = 50 }
PLAN
}
for gpu in h100 h200; do
  gpt2 "" $gpu >gpt2-fp32.$gpu.plan
  gpt2 "  precision = bf16" $gpu >gpt2-bf16.$gpu.plan
  # fp32 values with TF32 GEMMs: PyTorch's fp32 row runs TF32 too.
  gpt2 "  precision = tf32" $gpu >gpt2-tf32.$gpu.plan
  for p in fp32 tf32 bf16; do
    "$PLANC" gpt2-$p.$gpu.plan --target=cuda --report=json >gpt2-$p.$gpu.report.json
  done
done
cp gpt2-fp32.h100.plan gpt2-fp32.plan
cp gpt2-bf16.h100.plan gpt2-bf16.plan
cp gpt2-tf32.h100.plan gpt2-tf32.plan

# The cuda programs, and the host reference runs of the small plans (one
# rank, the same plan, with --log-json for the memory comparison).
cd "$DIR"
SMALL=(tiny-gpt-fp32 tiny-gpt-long-fp32 tiny-gpt-long-bf16 tiny-gpt-bf16 tiny-gpt-fp16 tiny-gpt-odd-bf16 tiny-gpt-mb-fp32 tiny-gpt-mb-bf16 tiny-gpt-drop-fp32 tiny-gpt-drop-bf16 tiny-llama-fp32 tiny-llama-bf16 tiny-mixtral-fp32 resnet-small-fp32)
for p in "${SMALL[@]}" gpt2-fp32 gpt2-tf32 gpt2-bf16; do
  "$PLANC" "plans/$p.plan" --target=cuda -o "bin/$p"
  strip "bin/$p"
done
# Context parallelism's attention tiles against the host functors (a cp
# plan needs two ranks, which one GPU cannot hold under NCCL).
cp "$BUILD/bin/planrt_cuda_cp_tiles" bin/cp-tiles
strip bin/cp-tiles
for p in "${SMALL[@]}" tiny-gpt-odd-fp32; do
  "$PLANC" "plans/$p.plan" -o "ref/$p-host"
  mpirun --oversubscribe -np 1 "ref/$p-host" --save "ref/$p.safetensors" \
    --log-json "ref/$p.json" >"ref/$p.log"
  rm "ref/$p-host"
  "$PLANC" "plans/$p.plan" --target=cuda --report=json >"plans/$p.report.json"
done

if readelf -d bin/* | grep -i 'NEEDED.*mpi'; then
  echo "bench/gpu/prepare.sh: a cuda program needs MPI" >&2
  exit 1
fi
# The programs share most of their bytes (planrt's kernels, 15 MB of device
# code in each): with a window larger than one program (64 MiB), xz packs
# 16 of them (290 MB) into about 7 MB; run.sh unpacks them with python3's
# tarfile.
tar -cf - bin | xz -T1 --lzma2=preset=6,dict=64MiB >bin.tar.xz
rm -rf bin
cp "$ROOT/bench/gpu/run.sh" "$ROOT/bench/gpu/summarize.py" "$ROOT/bench/gpu/kernels.py" \
  "$ROOT/test/e2e/compare_runs.py" "$ROOT/bench/torch_gpt.py" "$DIR/"
git -C "$ROOT" rev-parse --short HEAD >"$DIR/commit" 2>/dev/null || echo unknown >"$DIR/commit"
size=$(du -sm "$DIR" | cut -f1)
echo "bench/gpu/prepare.sh: $DIR holds ${size} MiB"
if [ "$size" -gt 64 ]; then
  echo "bench/gpu/prepare.sh: over the 64 MiB a GPU node receives" >&2
  exit 1
fi
