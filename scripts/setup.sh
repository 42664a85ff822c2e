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
          python3-numpy python3-torch python3-psutil python3-pip)
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

# cuDNN's C++ frontend (header-only; PyPI's nvidia-cudnn-frontend, MIT): the
# cuda backend's 16-bit attention runs cuDNN's flash attention through it.
# Kept outside the clone, like ccache's cache; without it (no PyPI), that
# attention runs planrt's own tiles and the build says so.
CUDNN_FE_VERSION=1.32.0
CUDNN_FE="${XDG_CACHE_HOME:-$HOME/.cache}/planc/cudnn-frontend-$CUDNN_FE_VERSION"
if command -v nvcc >/dev/null && [ ! -f "$CUDNN_FE/include/cudnn_frontend.h" ]; then
  echo "== fetching cuDNN's C++ frontend $CUDNN_FE_VERSION (PyPI)"
  fe_tmp="$(mktemp -d)"
  fetched=no
  for py in python3 /usr/bin/python3; do
    if "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        --implementation cp --platform manylinux_2_28_x86_64 -d "$fe_tmp" \
        "nvidia-cudnn-frontend==$CUDNN_FE_VERSION" >/dev/null 2>&1; then
      fetched=yes
      break
    fi
  done
  if [ "$fetched" = yes ]; then
    "$py" - "$fe_tmp" "$CUDNN_FE" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
z = zipfile.ZipFile(wheel)
names = [n for n in z.namelist() if n.startswith("include/")]
z.extractall(tmp + "/x", names)
os.makedirs(os.path.dirname(dest), exist_ok=True)
shutil.rmtree(dest, ignore_errors=True)
shutil.move(tmp + "/x", dest)
PY
  else
    echo "warning: could not fetch nvidia-cudnn-frontend from PyPI: 16-bit attention on cuda will run planrt's tiles" >&2
  fi
  rm -rf "$fe_tmp"
fi

# ccache keeps its cache outside the clone (~/.cache/ccache), so a fresh
# clone in CI rebuilds the MLIR code cheaply.
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit >/dev/null
fi
# A build configured before the frontend was fetched learns where it is.
if [ -f "$CUDNN_FE/include/cudnn_frontend.h" ] &&
   grep -q '^PLANC_ENABLE_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" &&
   ! grep -q "^PLANRT_CUDNN_FRONTEND_INCLUDE:PATH=$CUDNN_FE/include\$" "$BUILD/CMakeCache.txt"; then
  cmake -S "$ROOT" -B "$BUILD" -DPLANRT_CUDNN_FRONTEND_INCLUDE="$CUDNN_FE/include" >/dev/null
fi
cmake --build "$BUILD" -- "${PLANC_BUILD_TARGETS[@]:-all}"
