// A pipeline-parallel program in the shape codegen emits: a 2-stage model
// (stage 0: z = x @ w0, a = relu(z); stage 1: y = a @ w1 + b, MSE loss) run
// as 4 microbatches on a PLAN_PP x PLAN_DP mesh (pp outer). Stage 0 owns w0
// and its AdamW moments, stage 1 owns w1 (split over dp on its columns) and
// its moments; b is held by every rank. The schedule is 1F1B with two
// pipeline ranks and F0 F1 B1 B0 per microbatch with one (both stages on
// one rank: the sends go to the rank itself). Activations and gradients
// travel with send/recv, the forward's values wait in the stash for the
// backward (alloc_stash tensors, a view of one, a parameter).
//
// The update of every parameter uses the gradient 0.1 w (elementwise, the
// same bytes on any mesh), so the planrt-pipeline-save test can compare
// what --save-init, --save-every and --save write on 2 x 2 and on one rank.
// --dump-step0 collects what stage 1 observes ("logits") and what stage 0
// observes ("grad/w0") on rank 0.
// With PLAN_P2P_MISMATCH stage 1 receives the activation of microbatch 1
// into a tensor of the wrong size: the run must fail with both counts.
#include "planrt/planrt.h"

#include <initializer_list>

#ifndef PLAN_PP
#define PLAN_PP 2
#endif
#ifndef PLAN_DP
#define PLAN_DP 2
#endif

namespace {
constexpr int64_t kPp = PLAN_PP, kDp = PLAN_DP, kStages = 2, kMb = 4;
constexpr int64_t kAxisPp = 0, kAxisDp = 1;
constexpr int64_t kRows = 16 / kDp, kD = 8, kOut = 4;
constexpr int64_t kMbRows = kRows / kMb;
// Units: stage * 2 + phase.
int64_t owner(int64_t stage) { return stage % kPp; }
} // namespace

static void plan_setup(planrt::Context *ctx) {
  planrt::declare_mesh_axis(ctx, "pp", kPp);
  planrt::declare_mesh_axis(ctx, "dp", kDp);
  planrt::declare_pipeline(ctx, kAxisPp, kStages);
  planrt::declare_param(ctx, "w0", 2, kD, kD, 1, 1, 2, 0.0f, 0.5f);
  planrt::set_param_stage(ctx, 0, 0);
  planrt::declare_param(ctx, "w1", 2, kD, kOut / kDp, 1, 1, 3, -1.0f, 1.0f);
  planrt::shard_param(ctx, 1, 1, kAxisDp);
  planrt::set_param_stage(ctx, 1, 1);
  planrt::declare_param(ctx, "b", 1, kOut, 1, 1, 1, 2, 0.0f, 1.0f);
  planrt::declare_state(ctx, "w0.m", 2, kD, kD, 1, 1);
  planrt::declare_state(ctx, "w0.v", 2, kD, kD, 1, 1);
  planrt::declare_state(ctx, "w1.m", 2, kD, kOut / kDp, 1, 1);
  planrt::declare_state(ctx, "w1.v", 2, kD, kOut / kDp, 1, 1);
  for (int64_t i = 0; i < 4; ++i)
    planrt::set_state_stage(ctx, i, i / 2);
  planrt::declare_input(ctx, "x", 0, 2, kRows, kD, 1, 1, kAxisDp);
  planrt::declare_input(ctx, "y", 1, 2, kRows, kOut, 1, 1, kAxisDp);
  planrt::set_training(ctx, 4, 11, 16, 0);
  // Bytes per pipeline coordinate.
  const int64_t w0 = kD * kD, w1 = kD * kOut / kDp, b = kOut;
  if (kPp == 2) {
    planrt::expect_pipeline_bytes(ctx, 0, 4 * (w0 + b), 4 * (w0 + b),
                                  4 * 2 * w0);
    planrt::expect_pipeline_bytes(ctx, 1, 4 * (w1 + b), 4 * (w1 + b),
                                  4 * 2 * w1);
    // 1F1B: coordinate c warms up with P - c - 1 forwards.
    for (int64_t c = 0; c < kPp; ++c) {
      int64_t warm = kPp - c - 1, f = 0, bw = 0;
      for (; f < warm; ++f)
        planrt::schedule_add(ctx, c, c * 2, f);
      while (bw < kMb) {
        if (f < kMb)
          planrt::schedule_add(ctx, c, c * 2, f++);
        planrt::schedule_add(ctx, c, c * 2 + 1, bw++);
      }
    }
  } else {
    planrt::expect_pipeline_bytes(ctx, 0, 4 * (w0 + w1 + b), 4 * (w0 + w1 + b),
                                  4 * 2 * (w0 + w1));
    for (int64_t mb = 0; mb < kMb; ++mb)
      for (int64_t u : {0, 2, 3, 1})
        planrt::schedule_add(ctx, 0, u, mb);
  }
}

static void plan_step(planrt::Context *ctx) {
  using planrt::Tensor;
  Tensor *x = planrt::input(ctx, 0), *lbl = planrt::input(ctx, 1);
  Tensor *w0 = planrt::param(ctx, 0), *w1 = planrt::param(ctx, 1);
  Tensor *b = planrt::param(ctx, 2);
  const float scale = 1.0f / (16.0f * kOut);
  Tensor *loss = planrt::alloc(ctx, 0, 1, 1, 1, 1);
  planrt::fill(ctx, loss, 0.0f);
  for (int64_t i = 0; i < planrt::schedule_length(ctx); ++i) {
    int64_t unit = planrt::schedule_unit(ctx, i),
            mb = planrt::schedule_mb(ctx, i);
    int64_t stage = unit / 2, phase = unit % 2;
    planrt::unit_begin(ctx, stage, phase, mb, phase);
    if (unit == 0) { // F stage 0
      Tensor *xm = planrt::rows(ctx, x, mb, kMb);
      Tensor *z = planrt::alloc_stash(ctx, 2, kMbRows, kD, 1, 1);
      planrt::matmul(ctx, xm, w0, z, false, false);
      planrt::stash_put(ctx, z, 0, mb, 1);
      Tensor *a = planrt::alloc(ctx, 2, kMbRows, kD, 1, 1);
      planrt::relu(ctx, z, a);
      planrt::send(ctx, a, kAxisPp, owner(1));
    } else if (unit == 2) { // F stage 1
      Tensor *a = planrt::alloc_stash(ctx, 2, kMbRows, kD, 1, 1);
#ifdef PLAN_P2P_MISMATCH
      if (mb == 1)
        a = planrt::alloc(ctx, 1, 4, 1, 1, 1);
#endif
      planrt::recv(ctx, a, kAxisPp, owner(0));
      planrt::stash_put(ctx, a, 1, mb, 1);
      // A second entry in the same allocation (a view) and a parameter.
      planrt::stash_put(ctx, planrt::view(ctx, a, 1, kMbRows * kD, 1, 1, 1), 2,
                        mb, 1);
      planrt::stash_put(ctx, w1, 3, mb, 1);
      Tensor *wf = planrt::alloc(ctx, 2, kD, kOut, 1, 1);
      planrt::all_gather(ctx, w1, wf, 1, kAxisDp);
      Tensor *y = planrt::alloc(ctx, 2, kMbRows, kOut, 1, 1);
      planrt::matmul(ctx, a, wf, y, false, false);
      planrt::bias_add(ctx, y, b, y);
      planrt::observe(ctx, y, "logits"); // on stage 1's ranks
      Tensor *l = planrt::alloc(ctx, 0, 1, 1, 1, 1);
      planrt::mse_loss(ctx, y, planrt::rows(ctx, lbl, mb, kMb), l, scale);
      planrt::add(ctx, loss, l, loss);
    } else if (unit == 3) { // B stage 1
      Tensor *a = planrt::stash_get(ctx, 1, mb);
      Tensor *flat = planrt::stash_get(ctx, 2, mb);
      Tensor *w1s = planrt::stash_get(ctx, 3, mb);
      Tensor *wf = planrt::alloc(ctx, 2, kD, kOut, 1, 1);
      planrt::all_gather(ctx, w1s, wf, 1, kAxisDp);
      Tensor *y = planrt::alloc(ctx, 2, kMbRows, kOut, 1, 1);
      planrt::matmul(ctx, planrt::view(ctx, flat, 2, kMbRows, kD, 1, 1), wf, y,
                     false, false);
      planrt::bias_add(ctx, y, b, y);
      Tensor *dy = planrt::alloc(ctx, 2, kMbRows, kOut, 1, 1);
      planrt::mse_loss_grad(ctx, y, planrt::rows(ctx, lbl, mb, kMb), dy, scale);
      Tensor *da = planrt::alloc(ctx, 2, kMbRows, kD, 1, 1);
      planrt::matmul(ctx, dy, wf, da, false, true);
      (void)a;
      planrt::send(ctx, da, kAxisPp, owner(0));
      for (int64_t slot : {1, 2, 3})
        planrt::stash_release(ctx, slot, mb);
    } else { // B stage 0
      Tensor *z = planrt::stash_get(ctx, 0, mb);
      Tensor *da = planrt::alloc(ctx, 2, kMbRows, kD, 1, 1);
      planrt::recv(ctx, da, kAxisPp, owner(1));
      Tensor *dz = planrt::alloc(ctx, 2, kMbRows, kD, 1, 1);
      planrt::relu_grad(ctx, z, da, dz);
      planrt::stash_release(ctx, 0, mb);
    }
    planrt::unit_end(ctx);
  }
  // The loss lives on the last stage: zero elsewhere, summed over pp and dp.
  planrt::all_reduce_sum(ctx, loss, 3);
  planrt::report_loss(ctx, loss);
  for (int64_t p = 0; p < 2; ++p) {
    Tensor *w = planrt::param(ctx, p);
    if (!w)
      continue;
    Tensor *g = planrt::alloc(ctx, 2, w->shape[0], w->shape[1], 1, 1);
    planrt::scale(ctx, w, g, 0.1f);
    if (p == 0)
      planrt::observe(ctx, g, "grad/w0"); // on stage 0's ranks
    planrt::adamw_update(ctx, w, g, planrt::state(ctx, 2 * p),
                         planrt::state(ctx, 2 * p + 1), 0.05f, 0.9f, 0.95f,
                         1e-8f, 0.1f);
  }
  Tensor *gb = planrt::alloc(ctx, 1, kOut, 1, 1, 1);
  planrt::scale(ctx, b, gb, 0.1f);
  planrt::sgd_update(ctx, b, gb, 0.5f);
}

int main(int argc, char **argv) {
  return planrt::run(argc, argv, "pipeline", plan_setup, plan_step);
}
