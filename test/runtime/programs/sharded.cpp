// A program in the shape codegen emits, with parameters split over a
// PLAN_DP x PLAN_TP mesh (dp outer) in every way planrt supports: one dim
// over two axes, two dims over different axes, a packed [q | k | v] weight
// split by segments, a 3-D weight with segments over both axes, and a
// replicated bias. Each step minimizes 0.05 * sum(w^2) for every weight
// (gradient 0.1 w, computed elementwise, so every element's update is the
// same on any mesh): AdamW with declared state for three parameters, SGD for
// two. Built for 2 x 2 and 1 x 1; the planrt-sharded-* tests compare what
// --save-init, --save-every and --save write on both (the same bytes), and
// the memory accounting line. With PLAN_WRONG_BYTES the program declares
// 4 bytes of parameters too many to expect_bytes, so the run must fail.
#include "planrt/planrt.h"

#include <initializer_list>

#ifndef PLAN_DP
#define PLAN_DP 2
#endif
#ifndef PLAN_TP
#define PLAN_TP 2
#endif

namespace {
constexpr int64_t kDp = PLAN_DP, kTp = PLAN_TP;
// Local shapes.
constexpr int64_t kQkv[2] = {8, 32 / kTp};        // segments 16, 8, 8 / tp
constexpr int64_t kIn[2] = {8 / (kDp * kTp), 12}; // rows over dp, tp
constexpr int64_t kEmb[2] = {16 / kTp, 6 / kDp};  // rows tp, columns dp
constexpr int64_t kBias = 5;
constexpr int64_t kW3[3] = {3, 6, 16 / (kDp * kTp)}; // segments 4, 12
constexpr int64_t kParamElems = kQkv[0] * kQkv[1] + kIn[0] * kIn[1] +
                                kEmb[0] * kEmb[1] + kBias +
                                kW3[0] * kW3[1] * kW3[2];
// m and v of wqkv, w_in and w3.
constexpr int64_t kStateElems =
    2 * (kQkv[0] * kQkv[1] + kIn[0] * kIn[1] + kW3[0] * kW3[1] * kW3[2]);
#ifdef PLAN_WRONG_BYTES
constexpr int64_t kExtraBytes = 4;
#else
constexpr int64_t kExtraBytes = 0;
#endif
} // namespace

static void plan_setup(planrt::Context *ctx) {
  planrt::declare_mesh_axis(ctx, "dp", kDp);
  planrt::declare_mesh_axis(ctx, "tp", kTp);
  planrt::declare_param(ctx, "wqkv", 2, kQkv[0], kQkv[1], 1, 1, 2, 0.0f, 0.5f);
  planrt::shard_param(ctx, 0, 1, 1);
  planrt::set_param_segments(ctx, 0, 1, 16, 8, 8);
  planrt::declare_param(ctx, "w_in", 2, kIn[0], kIn[1], 1, 1, 3, -1.0f, 1.0f);
  planrt::shard_param(ctx, 1, 0, 0);
  planrt::shard_param(ctx, 1, 0, 1);
  planrt::declare_param(ctx, "emb", 2, kEmb[0], kEmb[1], 1, 1, 2, 0.0f, 1.0f);
  planrt::shard_param(ctx, 2, 0, 1);
  planrt::shard_param(ctx, 2, 1, 0);
  planrt::declare_param(ctx, "b", 1, kBias, 1, 1, 1, 3, 0.0f, 1.0f);
  planrt::declare_param(ctx, "w3", 3, kW3[0], kW3[1], kW3[2], 1, 2, 0.0f, 1.0f);
  planrt::shard_param(ctx, 4, 2, 0);
  planrt::shard_param(ctx, 4, 2, 1);
  planrt::set_param_segments(ctx, 4, 2, 4, 12, 0);
  planrt::declare_state(ctx, "wqkv.m", 2, kQkv[0], kQkv[1], 1, 1);
  planrt::declare_state(ctx, "wqkv.v", 2, kQkv[0], kQkv[1], 1, 1);
  planrt::declare_state(ctx, "w_in.m", 2, kIn[0], kIn[1], 1, 1);
  planrt::declare_state(ctx, "w_in.v", 2, kIn[0], kIn[1], 1, 1);
  planrt::declare_state(ctx, "w3.m", 3, kW3[0], kW3[1], kW3[2], 1);
  planrt::declare_state(ctx, "w3.v", 3, kW3[0], kW3[1], kW3[2], 1);
  planrt::expect_bytes(ctx, 4 * kParamElems + kExtraBytes, 4 * kParamElems,
                       4 * kStateElems);
  planrt::set_training(ctx, 4, 7, 0, 0);
}

static void plan_step(planrt::Context *ctx) {
  planrt::Tensor *w[5];
  planrt::Tensor *g[5];
  for (int i = 0; i < 5; ++i) {
    w[i] = planrt::param(ctx, i);
    g[i] = planrt::alloc(ctx, w[i]->ndim, w[i]->shape[0], w[i]->shape[1],
                         w[i]->shape[2], w[i]->shape[3]);
    planrt::scale(ctx, w[i], g[i], 0.1f);
  }
  // loss = 0.05 * sum(w^2) over the whole parameters: sums of squares per
  // set of splitting axes, each all-reduced over those axes (the one over
  // the whole mesh overlaps the other sums).
  planrt::Tensor *all = planrt::alloc(ctx, 0, 1, 1, 1, 1);
  planrt::fill(ctx, all, 0.0f);
  for (int i : {1, 2, 4})
    planrt::sumsq_accumulate(ctx, w[i], all);
  planrt::all_reduce_sum_start(ctx, all, 3, 0);
  planrt::Tensor *tp = planrt::alloc(ctx, 0, 1, 1, 1, 1);
  planrt::fill(ctx, tp, 0.0f);
  planrt::sumsq_accumulate(ctx, w[0], tp);
  planrt::all_reduce_sum(ctx, tp, 2);
  planrt::sumsq_accumulate(ctx, w[3], tp); // replicated: local is whole
  planrt::collective_wait(ctx, 0);
  planrt::Tensor *sum = planrt::alloc(ctx, 0, 1, 1, 1, 1);
  planrt::add(ctx, all, tp, sum);
  planrt::Tensor *loss = planrt::alloc(ctx, 0, 1, 1, 1, 1);
  planrt::scale(ctx, sum, loss, 0.05f);
  planrt::report_loss(ctx, loss);
  planrt::adamw_update(ctx, w[0], g[0], planrt::state(ctx, 0),
                       planrt::state(ctx, 1), 0.05f, 0.9f, 0.95f, 1e-8f, 0.1f);
  planrt::adamw_update(ctx, w[1], g[1], planrt::state(ctx, 2),
                       planrt::state(ctx, 3), 0.05f, 0.9f, 0.95f, 1e-8f, 0.1f);
  planrt::sgd_update(ctx, w[2], g[2], 0.5f);
  planrt::sgd_update(ctx, w[3], g[3], 0.5f);
  planrt::adamw_update(ctx, w[4], g[4], planrt::state(ctx, 4),
                       planrt::state(ctx, 5), 0.05f, 0.9f, 0.95f, 1e-8f, 0.1f);
}

int main(int argc, char **argv) {
  return planrt::run(argc, argv, "sharded", plan_setup, plan_step);
}
