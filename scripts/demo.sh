#!/usr/bin/env bash
# The demo: builds planc, tokenizes a small text shipped in the repository
# (examples/data/tiny.txt, one token per byte), compiles examples/tiny-gpt.plan
# (a 2-layer GPT, data parallel over 2 ranks) and trains it with
# mpirun -np 2, printing step, loss, gradient norm, time, learning rate and
# tokens/s per step. At the end the trained model writes a short sample of
# text through the forward function planc emitted, and the final loss is
# compared with the byte-level unigram entropy of the text (what a model that
# only knows letter frequencies would reach).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PLANC_BUILD_TARGETS=(planc plan-tokenize planrt_host)
source "$ROOT/scripts/setup.sh"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
DEMO="${PLANC_DEMO_DIR:-$BUILD/demo}"
mkdir -p "$DEMO/data"
cd "$DEMO"
echo "== plan-tokenize -o data/tiny examples/data/tiny.txt"
"$BUILD/bin/plan-tokenize" -o data/tiny "$ROOT/examples/data/tiny.txt"
echo
echo "== planc examples/tiny-gpt.plan -o tiny-gpt"
"$BUILD/bin/planc" "$ROOT/examples/tiny-gpt.plan" -o tiny-gpt
echo "== mpirun -np 2 ./tiny-gpt"
mpirun --oversubscribe -np 2 ./tiny-gpt --generate 300 "$@" | tee train.log
python3 - "$ROOT/examples/data/tiny.txt" train.log <<'PY'
import collections, math, re, sys
data = open(sys.argv[1], "rb").read()
counts = collections.Counter(data)
h = -sum(c / len(data) * math.log(c / len(data)) for c in counts.values())
losses = [float(x) for x in re.findall(r"loss (\S+) \|", open(sys.argv[2]).read())]
print(f"\nbyte-level unigram entropy of the text: {h:.3f} nats; "
      f"loss: {losses[0]:.3f} at step 1 -> {losses[-1]:.3f} at step {len(losses)}")
PY
