#!/usr/bin/env bash
# planc --report next to Calculon on Narayanan et al.'s Table 1 plans
# (examples/megatron/table1-*.plan): step time, TFLOP/s per GPU (our executed
# FLOPs over each tool's step time), peak memory per GPU and the pipeline
# bubble. Needs a Calculon checkout (https://github.com/calculon-ai/calculon,
# run with Debian's python3 and its numpy and pandas, installed if missing):
#   ./bench/calculon.sh CALCULON_DIR [PLAN...]
# docs/cost-model.md discusses the differences.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
[ $# -ge 1 ] || { echo "usage: $0 CALCULON_DIR [PLAN...]" >&2; exit 2; }
CALCULON="$(cd "$1" && pwd)"; shift
# Calculon imports pandas: Debian's, installed when missing.
if ! /usr/bin/python3 -c "import pandas" 2>/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get install -y -qq python3-pandas >/dev/null
fi
cmake --build "$ROOT/build" -- planc >/dev/null
if [ $# -eq 0 ]; then
  for m in 1.7b 3.6b 7.5b 18.4b 39.1b 76.1b 145.6b 310.1b 529.6b 1008b; do
    set -- "$@" "$ROOT/examples/megatron/table1-$m.plan"
  done
fi
exec /usr/bin/python3 "$ROOT/bench/calculon.py" "$CALCULON" "$ROOT/build/bin/planc" "$@"
