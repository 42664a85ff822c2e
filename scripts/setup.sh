#!/usr/bin/env bash
# Installs what is missing (Debian packages), then configures and builds planc
# in build/. Idempotent: a second run installs nothing and rebuilds only what
# changed. Sourced by demo.sh and test.sh; usable on its own.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PLANC_BUILD_DIR:-$ROOT/build}"

PACKAGES=(cmake ninja-build g++ ccache python3
          llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools
          antlr4 libantlr4-runtime-dev
          openmpi-bin libopenmpi-dev libdnnl-dev libgtest-dev zlib1g-dev
          nlohmann-json3-dev libcli11-dev libjemalloc-dev
          python3-numpy python3-torch python3-psutil)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# CUDA 13 (with NCCL) lives in /usr/local/cuda when present; the cuda runtime
# and target are built only then.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

# ccache keeps its cache outside the clone (~/.cache/ccache), so a fresh
# clone in CI rebuilds the MLIR code cheaply.
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit >/dev/null
fi
cmake --build "$BUILD" -- "${PLANC_BUILD_TARGETS[@]:-all}"
