#!/usr/bin/env bash
# Host step times: planc (1 rank x 2 threads, and 2 ranks x 1 thread with
# plain dp and with ZeRO-2) next to
# PyTorch eager with 2 threads (the current release from PyPI, in a virtual
# environment this script creates once, and Debian's python3-torch) on the
# same GPT and batch, fp32, interleaved in one invocation; medians of steps
# 3..N. Prints one table (step time, tokens/s, achieved GFLOP/s, ratio to the
# current PyTorch) with the fp32 peak it assumes and how it was measured, and
# appends it to bench/RESULTS.md with the date and the CPU. Run by hand:
#   ./bench/host.sh [STEPS] [CONFIG...]     CONFIG: tiny gpt2 gpt2-t256
# PLANC_BENCH_VENV: where the PyTorch environment lives
# (default ~/.cache/planc/bench-torch; ~5 GB, about two minutes to install).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STEPS="${1:-8}"
shift || true
CONFIGS=("$@")
[ ${#CONFIGS[@]} -gt 0 ] || CONFIGS=(tiny gpt2 gpt2-t256)
BUILD="$ROOT/build"
THREADS=2
cmake --build "$BUILD" -- planc planrt_host plan-tokenize >/dev/null
PLANC="$BUILD/bin/planc"

VENV="${PLANC_BENCH_VENV:-$HOME/.cache/planc/bench-torch}"
if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  echo "== installing the current PyTorch from PyPI into $VENV (once)"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch numpy
fi
TORCH_NEW="$VENV/bin/python"
TORCH_DEB=/usr/bin/python3
NEW_V=$("$TORCH_NEW" -c 'import torch; print(torch.__version__.split("+")[0])')
DEB_V=$("$TORCH_DEB" -c 'import torch; print(torch.__version__.split("+")[0])')

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$TMP"

# The peak: FMA throughput measured on THREADS threads at the CPU's widest
# vector width, and a large SGEMM for what a GEMM reaches of it.
g++ -O2 -fopenmp "$ROOT/bench/peak.cpp" -ldnnl -o peak
read -r _ ISA PEAK < <(./peak "$THREADS" | grep '^fma')
read -r _ GEMM_N GEMM < <(./peak "$THREADS" | grep '^sgemm')
CPU="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
MHZ="$(grep -m1 'cpu MHz' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
PEAK_LINE="fp32 peak assumed: $PEAK GFLOP/s = $THREADS threads of independent $ISA FMA chains, measured (the clock the cores run at; /proc/cpuinfo says $MHZ MHz); a ${GEMM_N}^3 SGEMM (oneDNN, $THREADS threads) reaches $GEMM GFLOP/s"
echo "$PEAK_LINE"

mkdir -p data
"$BUILD/bin/plan-tokenize" -o data/tiny "$ROOT/examples/data/tiny.txt" >/dev/null

# The multi-rank layout runs two data-parallel plans: plain dp (every rank
# updates all parameters after an all-reduce), and ZeRO-2 (each rank
# updates half of them, with the same traffic: a reduce-scatter of the
# gradients and an all-gather of the parameters) with pad_vocab, so that
# GPT-2's 50257-row table splits by rows (50304).
ZERO_PLAN="zero = 2  pad_vocab = true"

# A plan: NAME VOCAB SEQ D HEADS LAYERS BATCH DP [MORE], from tiny-gpt's
# model; MORE is added to the parallel section.
make_plan() {
  local name=$1 vocab=$2 seq=$3 d=$4 heads=$5 layers=$6 batch=$7 dp=$8
  local par="dp = $dp  ${9:-}"
  cat >"$name.plan" <<PLAN
import "$ROOT/examples/models/gpt.plan"
vocab = $vocab
max_seq = $seq
seq = $seq
d = $d
heads = $heads
layers = $layers
residual_std = 0.02
parallel { $par }
train {
  batch = $batch
  steps = $STEPS
  optimizer = adamw(lr = 1e-4, betas = [0.9, 0.95], eps = 1e-8, weight_decay = 0.1)
  grad_clip = 1.0
  data = shards("data/tiny_train_*.bin")
}
PLAN
  "$PLANC" "$name.plan" -o "$name"
}

. "$ROOT/bench/common.sh" # median_ms, best

rows=()
run_config() {
  local label=$1 vocab=$2 seq=$3 d=$4 heads=$5 layers=$6 batch=$7
  make_plan one "$vocab" "$seq" "$d" "$heads" "$layers" "$batch" 1
  make_plan two "$vocab" "$seq" "$d" "$heads" "$layers" "$batch" 2
  make_plan twoz "$vocab" "$seq" "$d" "$heads" "$layers" "$batch" 2 "$ZERO_PLAN"
  local a=() b=() z=() t=() u=() args=("$vocab" "$seq" "$d" "$heads" "$layers" "$batch" "$STEPS" "$THREADS")
  for round in 1 2; do # interleaved, so that a slow spell hits every system
    a+=("$(PLANRT_NUM_THREADS=$THREADS mpirun --bind-to none -np 1 ./one | median_ms)")
    b+=("$(PLANRT_NUM_THREADS=1 mpirun -np 2 ./two | median_ms)")
    z+=("$(PLANRT_NUM_THREADS=1 mpirun -np 2 ./twoz | median_ms)")
    t+=("$("$TORCH_NEW" "$ROOT/bench/torch_gpt.py" "${args[@]}" | awk '{print $4}')")
    u+=("$("$TORCH_DEB" "$ROOT/bench/torch_gpt.py" "${args[@]}" | awk '{print $4}')")
  done
  # Model FLOPs of a step (fwd + bwd = 3 x fwd): the GEMMs, 6 (12 L d^2 +
  # V d) per token, and attention's two products, 12 L T d per token.
  local row
  row=$(awk -v l="$label" -v a="$(best "${a[@]}")" -v b="$(best "${b[@]}")" \
    -v z="$(best "${z[@]}")" -v t="$(best "${t[@]}")" -v u="$(best "${u[@]}")" \
    -v V="$vocab" -v T="$seq" -v d="$d" -v L="$layers" -v B="$batch" 'BEGIN {
      n = B * T
      f = n * (6 * (12 * L * d * d + V * d) + 12 * L * T * d)
      cell = "%.1f ms, %.0f tok/s, %.1f GFLOP/s"
      printf "| %s | " cell ", **%.2fx** | " cell ", **%.2fx** | " cell ", **%.2fx** | " cell " | " cell " |",
        l, a, n / a * 1e3, f / a / 1e6, t / a, b, n / b * 1e3, f / b / 1e6, t / b,
        z, n / z * 1e3, f / z / 1e6, t / z,
        t, n / t * 1e3, f / t / 1e6, u, n / u * 1e3, f / u / 1e6 }')
  rows+=("$row")
  echo "$row"
}

HEADER="| config | planc 1 rank x $THREADS threads | planc $THREADS ranks x 1 thread, dp | planc $THREADS ranks x 1 thread, dp + ${ZERO_PLAN//  /, } | PyTorch $NEW_V (PyPI) eager, $THREADS threads | PyTorch $DEB_V (Debian) eager, $THREADS threads |"
echo "$HEADER"
for c in "${CONFIGS[@]}"; do
  case "$c" in
  tiny) run_config "tiny-gpt (V 256, T 64, d 64, 2 layers, B 16)" 256 64 64 4 2 16 ;;
  gpt2) run_config "GPT-2 124M (V 50257, T 64, d 768, 12 layers, B 4)" 50257 64 768 12 12 4 ;;
  gpt2-t256) run_config "GPT-2 124M (V 50257, T 256, d 768, 12 layers, B 4)" 50257 256 768 12 12 4 ;;
  *) echo "unknown config '$c' (tiny, gpt2, gpt2-t256)" >&2; exit 2 ;;
  esac
done

{
  echo
  echo "## Host step times vs PyTorch ($(date +%F), $CPU, $(nproc) cores)"
  echo
  echo "bench/host.sh $STEPS: fp32, AdamW with clipping, medians of steps 3..$STEPS, the best of two interleaved rounds; GFLOP/s are model FLOPs (6 per parameter of the GEMMs and 12 L T d per token for attention) over the step time; the ratio is the PyPI PyTorch's time over planc's (> 1: planc faster). $PEAK_LINE."
  echo
  echo "$HEADER"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >>"$ROOT/bench/RESULTS.md"
