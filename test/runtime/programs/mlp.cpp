// A program in the shape planc's code generator emits: a 2-layer MLP trained
// data-parallel over a 2-rank mesh. Used by the planrt-run-* tests.
#include "planrt/planrt.h"

static void plan_setup(planrt::Context *ctx) {
  planrt::declare_mesh_axis(ctx, "dp", 2);
  planrt::declare_param(ctx, "w1", 2, 16, 32, 1, 1, 2, 0.0f, 0.25f);
  planrt::declare_param(ctx, "b1", 1, 32, 1, 1, 1, 0, 0.0f, 0.0f);
  planrt::declare_param(ctx, "w2", 2, 32, 1, 1, 1, 2, 0.0f, 0.18f);
  planrt::declare_param(ctx, "b2", 1, 1, 1, 1, 1, 0, 0.0f, 0.0f);
  planrt::declare_state(ctx, "w1.exp_avg", 2, 16, 32, 1, 1);
  planrt::declare_state(ctx, "w1.exp_avg_sq", 2, 16, 32, 1, 1);
  planrt::declare_input(ctx, "x", 0, 2, 8, 16, 1, 1, 0);
  planrt::declare_input(ctx, "y", 1, 2, 8, 1, 1, 1, 0);
  planrt::set_training(ctx, 50, 42, 16, 0);
}

static void plan_step(planrt::Context *ctx) {
  planrt::Tensor *x = planrt::input(ctx, 0);
  planrt::Tensor *y = planrt::input(ctx, 1);
  planrt::Tensor *w1 = planrt::param(ctx, 0);
  planrt::Tensor *b1 = planrt::param(ctx, 1);
  planrt::Tensor *w2 = planrt::param(ctx, 2);
  planrt::Tensor *b2 = planrt::param(ctx, 3);
  planrt::Tensor *t0 = planrt::alloc(ctx, 2, 8, 32, 1, 1);
  planrt::matmul(ctx, x, w1, t0, false, false);
  planrt::Tensor *t1 = planrt::alloc(ctx, 2, 8, 32, 1, 1);
  planrt::bias_add(ctx, t0, b1, t1);
  planrt::Tensor *t2 = planrt::alloc(ctx, 2, 8, 32, 1, 1);
  planrt::gelu(ctx, t1, t2);
  planrt::Tensor *t3 = planrt::alloc(ctx, 2, 8, 1, 1, 1);
  planrt::matmul(ctx, t2, w2, t3, false, false);
  planrt::Tensor *t4 = planrt::alloc(ctx, 2, 8, 1, 1, 1);
  planrt::bias_add(ctx, t3, b2, t4);
  planrt::Tensor *loss = planrt::alloc(ctx, 0, 1, 1, 1, 1);
  planrt::mse_loss(ctx, t4, y, loss, 0.0625f);
  planrt::Tensor *g4 = planrt::alloc(ctx, 2, 8, 1, 1, 1);
  planrt::mse_loss_grad(ctx, t4, y, g4, 0.0625f);
  planrt::Tensor *gw2 = planrt::alloc(ctx, 2, 32, 1, 1, 1);
  planrt::matmul(ctx, t2, g4, gw2, true, false);
  planrt::Tensor *gb2 = planrt::alloc(ctx, 1, 1, 1, 1, 1);
  planrt::bias_grad(ctx, g4, gb2);
  planrt::Tensor *g2 = planrt::alloc(ctx, 2, 8, 32, 1, 1);
  planrt::matmul(ctx, g4, w2, g2, false, true);
  planrt::Tensor *g1 = planrt::alloc(ctx, 2, 8, 32, 1, 1);
  planrt::gelu_grad(ctx, t1, g2, g1);
  planrt::Tensor *gw1 = planrt::alloc(ctx, 2, 16, 32, 1, 1);
  planrt::matmul(ctx, x, g1, gw1, true, false);
  planrt::Tensor *gb1 = planrt::alloc(ctx, 1, 32, 1, 1, 1);
  planrt::bias_grad(ctx, g1, gb1);
  planrt::all_reduce_sum(ctx, gw1, 1);
  planrt::all_reduce_sum(ctx, gb1, 1);
  planrt::all_reduce_sum(ctx, gw2, 1);
  planrt::all_reduce_sum(ctx, gb2, 1);
  planrt::adamw_update(ctx, w1, gw1, planrt::state(ctx, 0),
                       planrt::state(ctx, 1), 0.01f, 0.9f, 0.999f, 1e-8f,
                       0.01f);
  planrt::sgd_update(ctx, b1, gb1, 0.05f);
  planrt::sgd_update(ctx, w2, gw2, 0.05f);
  planrt::sgd_update(ctx, b2, gb2, 0.05f);
  planrt::all_reduce_sum(ctx, loss, 1);
  planrt::report_loss(ctx, loss);
}

int main(int argc, char **argv) {
  return planrt::run(argc, argv, "mlp", plan_setup, plan_step);
}
