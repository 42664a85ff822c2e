#!/usr/bin/env bash
# Expert parallelism on host ranks: the same Mixtral-style model and global
# batch on 2 ranks (1 thread each), data parallel (dp 2) next to expert
# parallel (ep 2) with the all-gather dispatcher (ep_comm = all_gather) and
# the all-to-all one (the default), and both with ep 4 (4 ranks on the
# machine's cores), interleaved in one invocation: step time (medians of
# steps 3..N, the best of two rounds), what each rank holds (parameters,
# optimizer state, the step arena's peak, from the run's log) and what it
# sends per step (the report's communication total). Prints one table and
# appends it to bench/RESULTS.md with the date and the CPU. Run by hand:
#   ./bench/moe-ep.sh [STEPS]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
STEPS="${1:-8}"
BUILD="$ROOT/build"
cmake --build "$BUILD" -- planc planrt_host plan-tokenize >/dev/null
PLANC="$BUILD/bin/planc"
. "$ROOT/bench/common.sh" # scratch_with_tokens, median_ms, best
scratch_with_tokens

# small Mixtral: V 256, T 256, d 256, 8 experts of 512, top 2, 4 layers, B 8
write_plan() { # FILE PARALLEL
  cat >"$1" <<PLAN
import "$ROOT/examples/models/mixtral.plan"
vocab = 256
seq = 256
d = 256
heads = 8
kv_heads = 2
hidden = 512
experts = 8
top_k = 2
layers = 4
parallel { $2 }
train {
  batch = 8
  steps = $STEPS
  optimizer = adamw(lr = 1e-4, betas = [0.9, 0.95], eps = 1e-8, weight_decay = 0.1)
  grad_clip = 1.0
  data = shards("data/tiny_train_*.bin")
}
PLAN
}
write_plan dp.plan "dp = 2"
write_plan ep_ag.plan "ep = 2  ep_comm = all_gather"
write_plan ep.plan "ep = 2"
write_plan ep4_ag.plan "ep = 4  ep_comm = all_gather"
write_plan ep4.plan "ep = 4"
PLANS=(dp ep_ag ep ep4_ag ep4)
for p in "${PLANS[@]}"; do "$PLANC" $p.plan -o $p; done
declare -A times
declare -A names=([dp]="dp 2" [ep_ag]="ep 2, all_gather" [ep]="ep 2, all_to_all"
  [ep4_ag]="ep 4, all_gather" [ep4]="ep 4, all_to_all")
declare -A ranks=([dp]=2 [ep_ag]=2 [ep]=2 [ep4_ag]=4 [ep4]=4)
for round in 1 2; do
  for p in "${PLANS[@]}"; do
    PLANRT_NUM_THREADS=1 mpirun --oversubscribe --bind-to none -np ${ranks[$p]} ./$p >$p.log
    times[$p]+="$(median_ms <$p.log) "
  done
done
HEADER="| plan (ranks x 1 thread) | step | per rank: params, optimizer state, step arena peak | sent per step and rank (report) |"
rows=()
for p in "${PLANS[@]}"; do
  # shellcheck disable=SC2086
  t=$(best ${times[$p]})
  mem=$(grep -m1 '^memory per rank' $p.log |
    sed -E 's/.*params ([0-9]+) B, state ([0-9]+) B, step arena peak ([0-9]+) B.*/\1 \2 \3/')
  sent=$("$PLANC" $p.plan --report=json 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["comm_sent_bytes_per_step"])')
  rows+=("$(echo "$mem" | awk -v p="${names[$p]}" -v t="$t" -v s="$sent" '{
    printf "| %s | %.1f ms | %.2f MB, %.2f MB, %.2f MB | %.2f MB |", p, t, $1 / 1e6, $2 / 1e6, $3 / 1e6, s / 1e6 }')")
done
echo "$HEADER"
printf '%s\n' "${rows[@]}"
{
  echo
  echo "## Expert parallelism on host ranks ($(date +%Y-%m-%d), $CPU, $(nproc) cores)"
  echo
  echo "bench/moe-ep.sh $STEPS: small Mixtral (V 256, T 256, d 256, 8 experts of 512, top 2, 4 layers, B 8), fp32, AdamW with clipping; medians of steps 3..$STEPS, the best of two interleaved rounds."
  echo
  echo "$HEADER"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} >>"$ROOT/bench/RESULTS.md"
