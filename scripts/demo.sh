#!/usr/bin/env bash
# The demo: builds planc, compiles examples/mlp.plan (a two-layer MLP on a
# generated regression task, data parallel over 2 ranks) and trains it with
# mpirun -np 2, printing one line per step.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PLANC_BUILD_TARGETS=(planc planrt_host)
source "$ROOT/scripts/setup.sh"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$BUILD/demo"
echo "== planc examples/mlp.plan -o build/demo/mlp"
"$BUILD/bin/planc" "$ROOT/examples/mlp.plan" -o "$BUILD/demo/mlp"
echo "== mpirun -np 2 build/demo/mlp"
mpirun --oversubscribe -np 2 "$BUILD/demo/mlp" "$@"
