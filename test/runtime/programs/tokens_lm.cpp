// A program in the shape planc's code generator emits for a language model
// trained on token shards: a bigram model (embedding, then a projection to
// the 256 byte-level logits, cross-entropy) data-parallel over 2 ranks, with
// a cosine lr schedule. Reads "tiny_train_*.bin" from the current directory
// (written by plan-tokenize). Used by the planrt-tokens-* tests.
#include "planrt/planrt.h"

static void plan_setup(planrt::Context *ctx) {
  planrt::declare_mesh_axis(ctx, "dp", 2);
  planrt::declare_param(ctx, "wte", 2, 256, 16, 1, 1, 2, 0.0f, 0.02f);
  planrt::declare_param(ctx, "wout", 2, 16, 256, 1, 1, 2, 0.0f, 0.02f);
  planrt::declare_state(ctx, "wte.exp_avg", 2, 256, 16, 1, 1);
  planrt::declare_state(ctx, "wte.exp_avg_sq", 2, 256, 16, 1, 1);
  planrt::declare_state(ctx, "wout.exp_avg", 2, 16, 256, 1, 1);
  planrt::declare_state(ctx, "wout.exp_avg_sq", 2, 16, 256, 1, 1);
  planrt::declare_input(ctx, "x", 0, 2, 2, 8, 1, 1, 0);
  planrt::set_input_dtype(ctx, 0, 1);
  planrt::declare_input(ctx, "y", 1, 2, 2, 8, 1, 1, 0);
  planrt::set_input_dtype(ctx, 1, 1);
  planrt::set_training(ctx, 20, 42, 4, 1);
  planrt::set_data_path(ctx, "tiny_train_*.bin");
  planrt::set_lr_schedule(ctx, 1, 2, 0.001f, 0);
}

static void plan_step(planrt::Context *ctx) {
  planrt::Tensor *x = planrt::input(ctx, 0);
  planrt::Tensor *y = planrt::input(ctx, 1);
  planrt::Tensor *wte = planrt::param(ctx, 0);
  planrt::Tensor *wout = planrt::param(ctx, 1);
  planrt::Tensor *h = planrt::alloc(ctx, 3, 2, 8, 16, 1);
  planrt::embedding(ctx, x, wte, h, -1);
  planrt::Tensor *logits = planrt::alloc(ctx, 3, 2, 8, 256, 1);
  planrt::matmul(ctx, h, wout, logits, false, false);
  planrt::Tensor *loss = planrt::alloc(ctx, 0, 1, 1, 1, 1);
  planrt::cross_entropy(ctx, logits, y, loss, 0.03125f);
  planrt::Tensor *dlogits = planrt::alloc(ctx, 3, 2, 8, 256, 1);
  planrt::cross_entropy_grad(ctx, logits, y, dlogits, 0.03125f);
  planrt::Tensor *gwout = planrt::alloc(ctx, 2, 16, 256, 1, 1);
  planrt::matmul(ctx, h, dlogits, gwout, true, false);
  planrt::Tensor *dh = planrt::alloc(ctx, 3, 2, 8, 16, 1);
  planrt::matmul(ctx, dlogits, wout, dh, false, true);
  planrt::Tensor *gwte = planrt::alloc(ctx, 2, 256, 16, 1, 1);
  planrt::embedding_grad(ctx, x, dh, gwte, -1);
  planrt::all_reduce_sum(ctx, gwte, 1);
  planrt::all_reduce_sum(ctx, gwout, 1);
  planrt::Tensor *sumsq = planrt::alloc(ctx, 0, 1, 1, 1, 1);
  planrt::fill(ctx, sumsq, 0.0f);
  planrt::sumsq_accumulate(ctx, gwte, sumsq);
  planrt::sumsq_accumulate(ctx, gwout, sumsq);
  planrt::report_grad_norm(ctx, sumsq);
  planrt::adamw_update(ctx, wte, gwte, planrt::state(ctx, 0),
                       planrt::state(ctx, 1), 0.01f, 0.9f, 0.95f, 1e-8f, 0.0f);
  planrt::adamw_update(ctx, wout, gwout, planrt::state(ctx, 2),
                       planrt::state(ctx, 3), 0.01f, 0.9f, 0.95f, 1e-8f, 0.0f);
  planrt::all_reduce_sum(ctx, loss, 1);
  planrt::report_loss(ctx, loss);
}

int main(int argc, char **argv) {
  return planrt::run(argc, argv, "tokens_lm", plan_setup, plan_step);
}
