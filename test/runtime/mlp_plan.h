// A 2-layer MLP plan as planc emits it, with the data-parallel degree as a
// parameter, shared by the unit and MPI tests.
#ifndef PLANRT_TEST_MLP_PLAN_H
#define PLANRT_TEST_MLP_PLAN_H

#include "planrt/planrt.h"

namespace mlp_plan {

constexpr int64_t kGlobalBatch = 16, kIn = 16, kHidden = 32, kOut = 2;
inline int64_t dp = 1;        // ranks on the "dp" axis
inline bool use_adamw = true; // w1 trained with AdamW, the rest with SGD

inline void setup(planrt::Context *ctx) {
  int64_t rows = kGlobalBatch / dp;
  planrt::declare_mesh_axis(ctx, "dp", dp);
  planrt::declare_param(ctx, "w1", 2, kIn, kHidden, 1, 1, planrt::InitNormal,
                        0.0f, 0.25f);
  planrt::declare_param(ctx, "b1", 1, kHidden, 1, 1, 1, planrt::InitUniform,
                        -0.1f, 0.1f);
  planrt::declare_param(ctx, "w2", 2, kHidden, kOut, 1, 1, planrt::InitNormal,
                        0.0f, 0.18f);
  planrt::declare_param(ctx, "b2", 1, kOut, 1, 1, 1, planrt::InitZeros, 0.0f,
                        0.0f);
  planrt::declare_state(ctx, "w1.exp_avg", 2, kIn, kHidden, 1, 1);
  planrt::declare_state(ctx, "w1.exp_avg_sq", 2, kIn, kHidden, 1, 1);
  planrt::declare_input(ctx, "x", planrt::RoleInput, 2, rows, kIn, 1, 1, 0);
  planrt::declare_input(ctx, "y", planrt::RoleLabel, 2, rows, kOut, 1, 1, 0);
  planrt::set_training(ctx, 20, 42, kGlobalBatch, 0);
}

inline void step(planrt::Context *ctx) {
  using namespace planrt;
  int64_t rows = kGlobalBatch / dp;
  float scale = 1.0f / (float)(kGlobalBatch * kOut);
  Tensor *x = input(ctx, 0), *y = input(ctx, 1);
  Tensor *w1 = param(ctx, 0), *b1 = param(ctx, 1), *w2 = param(ctx, 2),
         *b2 = param(ctx, 3);
  Tensor *z1 = alloc(ctx, 2, rows, kHidden, 1, 1);
  matmul(ctx, x, w1, z1, false, false);
  Tensor *a1 = alloc(ctx, 2, rows, kHidden, 1, 1);
  bias_add(ctx, z1, b1, a1);
  Tensor *h = alloc(ctx, 2, rows, kHidden, 1, 1);
  gelu(ctx, a1, h);
  Tensor *z2 = alloc(ctx, 2, rows, kOut, 1, 1);
  matmul(ctx, h, w2, z2, false, false);
  Tensor *p = alloc(ctx, 2, rows, kOut, 1, 1);
  bias_add(ctx, z2, b2, p);
  Tensor *loss = alloc(ctx, 0, 1, 1, 1, 1);
  mse_loss(ctx, p, y, loss, scale);
  Tensor *dp_ = alloc(ctx, 2, rows, kOut, 1, 1);
  mse_loss_grad(ctx, p, y, dp_, scale);
  Tensor *gw2 = alloc(ctx, 2, kHidden, kOut, 1, 1);
  matmul(ctx, h, dp_, gw2, true, false);
  Tensor *gb2 = alloc(ctx, 1, kOut, 1, 1, 1);
  bias_grad(ctx, dp_, gb2);
  Tensor *dh = alloc(ctx, 2, rows, kHidden, 1, 1);
  matmul(ctx, dp_, w2, dh, false, true);
  Tensor *da1 = alloc(ctx, 2, rows, kHidden, 1, 1);
  gelu_grad(ctx, a1, dh, da1);
  Tensor *gw1 = alloc(ctx, 2, kIn, kHidden, 1, 1);
  matmul(ctx, x, da1, gw1, true, false);
  Tensor *gb1 = alloc(ctx, 1, kHidden, 1, 1, 1);
  bias_grad(ctx, da1, gb1);
  all_reduce_sum(ctx, gw1, 1);
  all_reduce_sum(ctx, gb1, 1);
  all_reduce_sum(ctx, gw2, 1);
  all_reduce_sum(ctx, gb2, 1);
  if (use_adamw)
    adamw_update(ctx, w1, gw1, state(ctx, 0), state(ctx, 1), 0.01f, 0.9f,
                 0.999f, 1e-8f, 0.01f);
  else
    sgd_update(ctx, w1, gw1, 0.1f);
  sgd_update(ctx, b1, gb1, 0.1f);
  sgd_update(ctx, w2, gw2, 0.1f);
  sgd_update(ctx, b2, gb2, 0.1f);
  all_reduce_sum(ctx, loss, 1);
  report_loss(ctx, loss);
}

} // namespace mlp_plan

#endif
