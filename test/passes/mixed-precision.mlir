// RUN: plan-opt %s --plan-mixed-precision | FileCheck %s
// RUN: plan-opt %s --plan-mixed-precision --plan-autodiff --plan-fuse-casts | FileCheck %s --check-prefix=STEP
// RUN: plan-opt %s --plan-mixed-precision=precision=fp16 --plan-autodiff --plan-fuse-casts | FileCheck %s --check-prefix=FP16
// RUN: plan-opt %s --plan-mixed-precision=precision=fp32 | FileCheck %s --check-prefix=FP32
// RUN: not plan-opt %s --plan-mixed-precision=precision=fp8 2>&1 | FileCheck %s --check-prefix=BAD

// precision = bf16: parameters and the input stay f32 arguments, each use
// reads a bf16 cast (two for the tied w), activations are bf16, the loss
// reads f32.
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 5.000000e-02 : f64, optimizer = "sgd", precision = "bf16", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %y: tensor<8x4xf32> {plan.kind = "label", plan.name = "y"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"},
             %b: tensor<4xf32> {plan.kind = "param", plan.name = "b"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w {plan.layer = 0 : i64} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.bias_add %0, %b : tensor<8x4xf32>, tensor<4xf32>
  %2 = plan.gelu %1 : tensor<8x4xf32>
  %3 = plan.matmul %2, %w {transpose_rhs} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %4 = plan.mse_loss %3, %y : tensor<8x4xf32> -> tensor<f32>
  return %4 : tensor<f32>
}

// CHECK-LABEL: func.func @m(
// CHECK-SAME: %arg0: tensor<8x4xf32>
// CHECK: %[[X:.*]] = plan.cast %arg0 {plan.layer = 0 : i64} : tensor<8x4xf32> -> tensor<8x4xbf16>
// CHECK: %[[W:.*]] = plan.cast %arg2 {plan.layer = 0 : i64} : tensor<4x4xf32> -> tensor<4x4xbf16>
// CHECK: %[[MM:.*]] = plan.matmul %[[X]], %[[W]] {plan.layer = 0 : i64} : tensor<8x4xbf16>, tensor<4x4xbf16> -> tensor<8x4xbf16>
// CHECK: %[[B:.*]] = plan.cast %arg3 : tensor<4xf32> -> tensor<4xbf16>
// CHECK: %[[BA:.*]] = plan.bias_add %[[MM]], %[[B]] : tensor<8x4xbf16>, tensor<4xbf16>
// CHECK: %[[G:.*]] = plan.gelu %[[BA]] : tensor<8x4xbf16>
// CHECK: %[[W2:.*]] = plan.cast %arg2 : tensor<4x4xf32> -> tensor<4x4xbf16>
// CHECK: %[[MM2:.*]] = plan.matmul %[[G]], %[[W2]] {transpose_rhs}
// The loss and its label are f32.
// CHECK: %[[P:.*]] = plan.cast %[[MM2]] : tensor<8x4xbf16> -> tensor<8x4xf32>
// CHECK: plan.mse_loss %[[P]], %arg1 : tensor<8x4xf32> -> tensor<f32>

// In the step, w's gradient is two terms (one per cast); both come out of
// their GEMMs in f32 (plan-fuse-casts), the bias gradient too, and they are
// summed in f32.
// STEP-LABEL: func.func @train_step(
// STEP: plan.mse_loss_grad {{.*}} : tensor<8x4xf32>
// STEP: %[[DP:.*]] = plan.cast %{{.*}} : tensor<8x4xf32> -> tensor<8x4xbf16>
// STEP: %[[DW2:.*]] = plan.matmul %[[DP]], %{{.*}} {transpose_lhs} : tensor<8x4xbf16>, tensor<8x4xbf16> -> tensor<4x4xf32>
// STEP: %[[DB:.*]] = plan.bias_grad %{{.*}} : tensor<8x4xbf16> -> tensor<4xf32>
// STEP: %[[DW1:.*]] = plan.matmul %{{.*}} {plan.layer = 0 : i64, transpose_lhs} : tensor<8x4xbf16>, tensor<8x4xbf16> -> tensor<4x4xf32>
// STEP: plan.add %[[DW2]], %[[DW1]] {plan.layer = 0 : i64} : tensor<4x4xf32>
// STEP: plan.sgd_update {{.*}} : tensor<4x4xf32>

// fp16: gradients stay fp16 until summed; the two terms of w are summed in
// fp16 and widened once (no pipeline here).
// FP16-LABEL: func.func @train_step(
// FP16: %[[DW2:.*]] = plan.matmul {{.*}} {transpose_lhs} : tensor<8x4xf16>, tensor<8x4xf16> -> tensor<4x4xf16>
// FP16: %[[DW1:.*]] = plan.matmul {{.*}} {plan.layer = 0 : i64, transpose_lhs} : tensor<8x4xf16>, tensor<8x4xf16> -> tensor<4x4xf16>
// FP16: %[[S:.*]] = plan.add %[[DW2]], %[[DW1]] : tensor<4x4xf16>
// FP16: plan.cast %[[S]] : tensor<4x4xf16> -> tensor<4x4xf32>

// fp32 changes nothing.
// FP32-NOT: plan.cast

// BAD: error: unknown precision 'fp8'; expected fp32, tf32, bf16 or fp16
