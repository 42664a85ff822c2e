#!/usr/bin/env bash
# The GPU suite, step 2 of 2: runs on a bare GPU node, from the directory
# bench/gpu/prepare.sh filled.
#   DIR/run.sh OUT
# Needs the NVIDIA driver, CUDA 13's cuBLASLt and NCCL (in /usr/local/cuda or
# the nvidia-* wheels of python3's site-packages) and python3 with torch; no
# MPI, cmake or build tree. Every step runs under a time limit and the suite
# goes on after a failure. Writes under OUT (at most 8 files): table.md (the
# table printed last), results.json, logs.tar.gz (every log and the GPU
# runs' parameters). Exit code 0 when every correctness row holds and the
# speed runs ran. SUITE_BUDGET (seconds, default 480) bounds the whole: a
# step that could run past it is skipped and reported as such.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:?usage: run.sh OUT}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT
PY="${PYTHON:-python3}"
START=$(date +%s)

# cuBLASLt and NCCL: a CUDA install first, then the wheels torch brings.
WHEEL_LIBS="$("$PY" - <<'PY'
import glob, os, site, sys
roots = [p for p in sys.path if p.endswith("-packages")]
try:
    roots += site.getsitepackages()
except AttributeError:
    pass
dirs = []
for r in dict.fromkeys(roots):
    dirs += sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib")))
print(":".join(dict.fromkeys(dirs)))
PY
)"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${WHEEL_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cd "$HERE"
"$PY" -c 'import tarfile; tarfile.open("bin.tar.xz").extractall(".")' || exit 1
GPU="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
echo "== $(date -u +%FT%TZ) GPU: ${GPU:-none found}; commit $(cat "$HERE/commit")"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >"$LOGS/nvidia-smi.txt" 2>&1
if ldd "$HERE/bin/tiny-gpt-fp32" | grep 'not found'; then
  echo "run.sh: the cuda programs miss libraries (above); LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
fi
ldd "$HERE/bin/tiny-gpt-fp32" >"$LOGS/ldd.txt" 2>&1

cd "$HERE"
# step NAME LIMIT COMMAND...: runs with a time limit, output to LOGS/NAME.log,
# status to LOGS/NAME.rc; prints one line.
step() {
  local name="$1" limit="$2"
  shift 2
  # The device tool stops a command after its own limit and returns only
  # what is under OUT then: past the suite's budget, steps are skipped (and
  # fail the table) so that the table is still written.
  if [ $(( $(date +%s) - START + limit )) -gt "${SUITE_BUDGET:-480}" ]; then
    echo "skipped: the suite's budget (SUITE_BUDGET=${SUITE_BUDGET:-480} s) would be exceeded" >"$LOGS/$name.log"
    echo 125 >"$LOGS/$name.rc"
    printf "%-28s skipped (budget)\n" "$name"
    return
  fi
  local t0=$(date +%s%N)
  timeout -k 5 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$rc" >"$LOGS/$name.rc"
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf "%-28s rc %-3s %4d.%01d s\n" "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100))
  [ "$rc" = 0 ] || tail -5 "$LOGS/$name.log" | sed 's/^/    /'
}

# program NAME LIMIT [ENV=VALUE...] bin/PROG ARGS...: a planc program's
# step; where it fails (not by a time limit), it runs again for one step
# with CUDA_LAUNCH_BLOCKING=1, so that an asynchronous fault is reported by
# the launch that made it (planrt names each kernel's work), into
# LOGS/NAME-blocking.log; at most DIAGNOSE (default 4) such reruns.
DIAGNOSED=0
program() {
  local name="$1" limit="$2"
  shift 2
  step "$name" "$limit" "$@"
  local rc
  rc=$(cat "$LOGS/$name.rc")
  case "$rc" in 0 | 124 | 125 | 137) return ;; esac
  [ "$DIAGNOSED" -lt "${DIAGNOSE:-4}" ] || return
  DIAGNOSED=$((DIAGNOSED + 1))
  # The command without its --save/--log-json/--steps arguments.
  local args=() skip=0 a
  for a in "$@"; do
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    case "$a" in --save | --log-json | --steps) skip=1; continue ;; esac
    args+=("$a")
  done
  step "$name-blocking" 45 env CUDA_LAUNCH_BLOCKING=1 "${args[@]}" --steps 1
}

# 1. The small plans on the GPU (one process, no launcher), against the host.
for p in tiny-gpt-fp32 tiny-gpt-long-fp32 tiny-gpt-bf16 tiny-gpt-fp16 tiny-gpt-odd-bf16 tiny-gpt-mb-fp32 tiny-gpt-mb-bf16 tiny-gpt-drop-fp32 tiny-gpt-drop-bf16 tiny-llama-fp32 tiny-llama-bf16 tiny-mixtral-fp32 resnet-small-fp32; do
  program "$p" 45 "bin/$p" --save "$LOGS/$p.safetensors" --log-json "$LOGS/$p.json"
done
# The fp32 plan with every cuBLASLt epilogue turned off (bias, GELU and
# their gradients as separate kernels): tells an epilogue's fault from the
# rest's when tiny-gpt-fp32 misses the host.
program tiny-gpt-fp32-noepi 45 env PLANRT_GEMM_EPILOGUES=off bin/tiny-gpt-fp32 \
  --save "$LOGS/tiny-gpt-fp32-noepi.safetensors" --log-json "$LOGS/tiny-gpt-fp32-noepi.json"
# 16-bit attention on cuDNN (PLANRT_ATTENTION=cudnn: the run fails where
# cuDNN cannot run it) and on planrt's tiles, the same program.
program tiny-gpt-long-bf16 45 env PLANRT_ATTENTION=cudnn bin/tiny-gpt-long-bf16 \
  --log-json "$LOGS/tiny-gpt-long-bf16.json"
program tiny-gpt-long-bf16-tiles 45 env PLANRT_ATTENTION=tiles bin/tiny-gpt-long-bf16 \
  --log-json "$LOGS/tiny-gpt-long-bf16-tiles.json"
# Context parallelism's attention tiles against the host functors (the
# cases of test/runtime/cuda/cp_attention_cases.h).
step cp-tiles 30 bin/cp-tiles
# all_gather's 16-bit attention whole on cuDNN (two chunks of queries over
# key prefixes, the mask aligned to the last key), then ring's blocks on
# cuDNN (a chunk or two of queries over a block, merged by log-sum-exp),
# against the same functors; PLANRT_ATTENTION=cudnn: a case cuDNN declines
# fails, saying why.
step cp-cudnn 60 env PLANRT_ATTENTION=cudnn bin/cp-tiles --cudnn
# Their speed on a 32k-token sequence (cp 4): cuDNN against the tiles, and
# ring's blocks on cuDNN against all_gather's.
step cp-speed 45 env PLANRT_ATTENTION=cudnn bin/cp-tiles --speed
# 2. compute-sanitizer over tiny-gpt: memcheck (2 steps), racecheck (1);
# and over three cases of the cp tiles (5: fp32 ring at head dim 128; 10:
# bf16 ring at 64; 11: fp16 ring at 128, the tensor-core tiles' largest
# shared memory).
if command -v compute-sanitizer >/dev/null; then
  step memcheck 90 compute-sanitizer --tool memcheck --error-exitcode 9 \
    bin/tiny-gpt-fp32 --steps 2 --quiet
  # racecheck: the block kernels' shared memory (a missing barrier).
  step racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 9 \
    bin/tiny-gpt-fp32 --steps 1 --quiet
  step cp-tiles-memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 9 \
    bin/cp-tiles 5 10 11
  step cp-tiles-racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
    bin/cp-tiles 5 10 11
else
  for t in memcheck racecheck cp-tiles-memcheck cp-tiles-racecheck; do
    echo "compute-sanitizer not found" >"$LOGS/$t.log"; echo 127 >"$LOGS/$t.rc"
  done
fi
# 3. GPT-2 124M, B 16, T 1024: planc, then PyTorch on the same GPU.
for p in gpt2-bf16 gpt2-tf32 gpt2-fp32; do
  program "$p" 90 "bin/$p" --quiet --log-json "$LOGS/$p.json"
done
T="50257 1024 768 12 12 16 12 8 cuda"
step torch-bf16-eager 120 "$PY" torch_gpt.py $T bfloat16 eager
step torch-tf32-eager 120 "$PY" torch_gpt.py $T tf32 eager
step torch-bf16-compile 240 "$PY" torch_gpt.py $T bfloat16 compile

# 4. Where GPT-2 bf16's step goes, kernel by kernel (ncu, one step), while
# the suite has time left: which kernels to write first.
if command -v ncu >/dev/null && [ $(( $(date +%s) - START )) -lt "${NCU_UNTIL:-200}" ]; then
  step ncu-gpt2-bf16 120 ncu --clock-control none --metrics gpu__time_duration.sum \
    --csv --page raw --log-file "$LOGS/ncu.csv" bin/gpt2-bf16 --steps 1 --quiet
  "$PY" kernels.py "$LOGS/ncu.csv" >"$LOGS/kernels.txt" 2>&1 && cp "$LOGS/kernels.txt" "$OUT/kernels.txt"
  head -25 "$LOGS/kernels.txt"
fi

echo "== suite took $(( $(date +%s) - START )) s"
"$PY" summarize.py "$HERE" "$LOGS" "$GPU" "$OUT"
status=$?
tar -czf "$OUT/logs.tar.gz" -C "$LOGS" .
exit $status
