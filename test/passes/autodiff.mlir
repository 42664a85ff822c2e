// RUN: plan-opt %s --plan-autodiff --split-input-file --verify-diagnostics | FileCheck %s

// A linear layer, gelu, a residual add and a transposed matmul: every
// backward rule plus gradient accumulation (x1 feeds two ops).
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 5.000000e-02 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %y: tensor<8x4xf32> {plan.kind = "label", plan.name = "y"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"},
             %b: tensor<4xf32> {plan.kind = "param", plan.name = "b"},
             %v: tensor<4x4xf32> {plan.kind = "param", plan.name = "v"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.bias_add %0, %b : tensor<8x4xf32>, tensor<4xf32>
  %2 = plan.gelu %1 : tensor<8x4xf32>
  %3 = plan.matmul %2, %v {transpose_rhs} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %4 = plan.add %3, %2 : tensor<8x4xf32>
  %5 = plan.mse_loss %4, %y : tensor<8x4xf32> -> tensor<f32>
  return %5 : tensor<f32>
}

// The forward function stays; the step returns loss and updated parameters.
// CHECK-LABEL: func.func @m(
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: -> (tensor<f32>, tensor<4x4xf32>, tensor<4xf32>, tensor<4x4xf32>) attributes {plan.train_step}
// CHECK: %[[MM:.*]] = plan.matmul %arg0, %arg2
// CHECK: %[[BA:.*]] = plan.bias_add %[[MM]], %arg3
// CHECK: %[[G:.*]] = plan.gelu %[[BA]]
// CHECK: %[[MM2:.*]] = plan.matmul %[[G]], %arg4 {transpose_rhs}
// CHECK: %[[SUM:.*]] = plan.add %[[MM2]], %[[G]]
// CHECK: %[[LOSS:.*]] = plan.mse_loss %[[SUM]], %arg1
// CHECK: %[[DSUM:.*]] = plan.mse_loss_grad %[[SUM]], %arg1
// d(op(A)) for C = A @ B^T: dA = dC @ B, dB = dC^T @ A.
// CHECK: %[[DG1:.*]] = plan.matmul %[[DSUM]], %arg4 : tensor<8x4xf32>, tensor<4x4xf32>
// The two paths into the gelu output are summed.
// CHECK: %[[DG:.*]] = plan.add %[[DSUM]], %[[DG1]]
// CHECK: %[[DV:.*]] = plan.matmul %[[DSUM]], %[[G]] {transpose_lhs}
// CHECK: %[[DBA:.*]] = plan.gelu_grad %[[BA]], %[[DG]]
// CHECK: %[[DB:.*]] = plan.bias_grad %[[DBA]]
// No gradient for the input x, only for w.
// CHECK-NOT: plan.matmul %[[DBA]], %arg2
// CHECK: %[[DW:.*]] = plan.matmul %arg0, %[[DBA]] {transpose_lhs}
// CHECK: %[[W:.*]] = plan.sgd_update %arg2, %[[DW]] {lr = 5.000000e-02 : f32}
// CHECK: %[[B:.*]] = plan.sgd_update %arg3, %[[DB]]
// CHECK: %[[V:.*]] = plan.sgd_update %arg4, %[[DV]]
// CHECK: return %[[LOSS]], %[[W]], %[[B]], %[[V]]

// -----

// AdamW settings come from plan.train.
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "adamw", beta1 = 0.8 : f64, weight_decay = 0.1 : f64, seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %y: tensor<8x4xf32> {plan.kind = "label", plan.name = "y"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.relu %0 : tensor<8x4xf32>
  %2 = plan.mse_loss %1, %y : tensor<8x4xf32> -> tensor<f32>
  return %2 : tensor<f32>
}
// CHECK-LABEL: func.func @train_step(
// CHECK: plan.relu_grad
// CHECK: plan.adamw_update %arg2, %{{.*}} {beta1 = 8.000000e-01 : f32, beta2 = 9.990000e-01 : f32, eps = 9.99999993E-9 : f32, lr = 1.000000e-03 : f32, weight_decay = 1.000000e-01 : f32}

// -----

// expected-error @below {{expected exactly one function marked 'plan.model', found 0}}
module {
  plan.mesh @mesh axes = ["dp"] shape = [1]
}

// -----

plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.mse_loss %0, %0 : tensor<8x4xf32> -> tensor<f32>
  // expected-error @below {{planc cannot differentiate the loss 'plan.add' yet; mse is supported}}
  %2 = plan.add %1, %1 : tensor<f32>
  return %2 : tensor<f32>
}

// -----

plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.mse_loss %0, %x : tensor<8x4xf32> -> tensor<f32>
  %2 = plan.add %1, %1 : tensor<f32>
  // expected-error @below {{the model's result must be a loss used by nothing else}}
  return %1 : tensor<f32>
}
