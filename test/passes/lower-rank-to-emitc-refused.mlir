// RUN: plan-opt %s --plan-lower-rank-to-emitc --split-input-file --verify-diagnostics
// What the code generator does not implement yet is refused with the
// setting named, never ignored.

// Dynamic loss scaling has no runtime yet (fp16 without it compiles).
// expected-error @below {{loss_scale = dynamic is not implemented by the code generator yet}}
plan.train {data = "synthetic", global_batch = 8 : i64, loss_scale = "dynamic", lr = 1.000000e-03 : f64, optimizer = "sgd", precision = "fp16", seed = 1 : i64, steps = 3 : i64}
plan.mesh @mesh axes = ["dp"] shape = [1]
func.func @plan_step() {
  return
}
