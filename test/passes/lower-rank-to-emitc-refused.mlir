// RUN: plan-opt %s --plan-lower-rank-to-emitc --split-input-file --verify-diagnostics
// What the code generator does not implement yet is refused with the
// setting or type named, never emitted as if it were f32.

// expected-error @below {{precision = bf16 is not implemented by the code generator yet}}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "sgd", precision = "bf16", seed = 1 : i64, steps = 3 : i64}
plan.mesh @mesh axes = ["dp"] shape = [1]
func.func @plan_step() {
  return
}

// -----

// The dialects carry 16-bit buffers for mixed precision; planrt has no
// 16-bit tensors yet.
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
rank.param_decl @w : memref<4x2xf32> init <zeros>
func.func @plan_step() {
  // expected-error @below {{a bf16 buffer is not implemented by the code generator yet}}
  %t = rank.alloc : memref<4x2xbf16>
  return
}
