#!/usr/bin/env bash
# Fuzzes the .plan frontend with libFuzzer (tools/plan-fuzz).
#
#   scripts/fuzz.sh [seconds] [libFuzzer options...]
#
# Builds plan-fuzz in build-fuzz/ with clang++-22 and
# -fsanitize=fuzzer,address,undefined (a separate build; build/ is not
# touched), fuzzes for `seconds` (default 600) starting from fuzz/corpus with
# fuzz/plan.dict, then merges what was found back into fuzz/corpus
# (-merge=1 keeps only inputs that add coverage). Crashes, timeouts and OOMs
# are written to build-fuzz/artifacts/; the log is build-fuzz/fuzz.log.
# FUZZ_JOBS=N (N > 1) fuzzes in N processes (-fork=N) and keeps going after a
# crash, timeout or OOM; the default, one process, stops at the first.
#
# To reproduce a finding: build-fuzz/bin/plan-fuzz build-fuzz/artifacts/crash-...
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-fuzz"
SECONDS_TO_RUN="${1:-600}"
shift || true
JOBS="${FUZZ_JOBS:-1}"

# clang-22 and its fuzzer runtime come from Debian; installed when missing.
if ! command -v clang++-22 >/dev/null ||
  [ ! -e /usr/lib/llvm-22/lib/clang/22/lib/linux/libclang_rt.fuzzer-x86_64.a ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-22 libclang-rt-22-dev >/dev/null
fi

if [ ! -f "$BUILD/build.ninja" ]; then
  LAUNCHER=()
  command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  # -O1 -g without -DNDEBUG: the frontend's and MLIR's header assertions
  # stay on, so a failed cast<> or a bad index is a finding too.
  cmake -S "$ROOT" -B "$BUILD" -G Ninja \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DPLANC_FUZZ=ON -DPLANC_ENABLE_CUDA=OFF "${LAUNCHER[@]}"
fi
ninja -C "$BUILD" plan-fuzz

mkdir -p "$BUILD/artifacts" "$ROOT/fuzz/corpus"
cd "$BUILD"
FUZZ=("$BUILD/bin/plan-fuzz" -max_len=4096 -timeout=10 -rss_limit_mb=4096
  -dict="$ROOT/fuzz/plan.dict" -artifact_prefix="$BUILD/artifacts/")
# New inputs go to a scratch directory; fuzz/corpus is only read.
rm -rf "$BUILD/new-corpus" && mkdir -p "$BUILD/new-corpus"
status=0
if [ "$JOBS" -gt 1 ]; then
  # Fork mode: a crash, timeout or OOM is saved and fuzzing goes on.
  "${FUZZ[@]}" -max_total_time="$SECONDS_TO_RUN" -fork="$JOBS" \
    -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 "$@" \
    "$BUILD/new-corpus" "$ROOT/fuzz/corpus" 2>&1 | tee "$BUILD/fuzz.log" ||
    status=$?
else
  "${FUZZ[@]}" -max_total_time="$SECONDS_TO_RUN" -print_final_stats=1 "$@" \
    "$BUILD/new-corpus" "$ROOT/fuzz/corpus" 2>&1 |
    tee "$BUILD/fuzz.log" || status=$?
fi

# Minimize the old and new inputs into a fresh corpus, then replace.
rm -rf "$BUILD/merged" && mkdir -p "$BUILD/merged"
"${FUZZ[@]}" -merge=1 "$BUILD/merged" "$ROOT/fuzz/corpus" \
  "$BUILD/new-corpus" 2>&1 | tail -n 3
if [ -n "$(ls -A "$BUILD/merged")" ]; then
  rm -rf "$ROOT/fuzz/corpus"
  mv "$BUILD/merged" "$ROOT/fuzz/corpus"
fi
echo "corpus: $(ls "$ROOT/fuzz/corpus" | wc -l) files"
ls "$BUILD/artifacts" | sed 's/^/artifact: /' || true
exit "$status"
