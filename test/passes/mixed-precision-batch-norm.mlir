// RUN: plan-opt %s --plan-mixed-precision | FileCheck %s
// RUN: plan-opt %s --plan-mixed-precision --plan-autodiff | FileCheck %s --check-prefix=STEP

// precision = bf16 with batch norm: its running statistics are fp32 state
// and gamma/beta must have their type, so the op runs in fp32 on a widened
// copy of its 16-bit input and hands a bf16 copy of its output on.
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 5.000000e-02 : f64, optimizer = "sgd", precision = "bf16", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4x2x2xf32> {plan.kind = "input", plan.name = "x"},
             %y: tensor<8x4x2x2xf32> {plan.kind = "label", plan.name = "y"},
             %g: tensor<4xf32> {plan.kind = "param", plan.name = "g"},
             %b: tensor<4xf32> {plan.kind = "param", plan.name = "b"},
             %rm: tensor<4xf32> {plan.kind = "state", plan.buffer, plan.name = "rm"},
             %rv: tensor<4xf32> {plan.kind = "state", plan.buffer, plan.name = "rv"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.relu %x : tensor<8x4x2x2xf32>
  %1 = plan.batch_norm %0, %g, %b running(%rm, %rv : tensor<4xf32>, tensor<4xf32>) {eps = 1.0e-05 : f32, momentum = 1.0e-01 : f32} : tensor<8x4x2x2xf32>, tensor<4xf32>
  %2 = plan.relu %1 : tensor<8x4x2x2xf32>
  %3 = plan.mse_loss %2, %y : tensor<8x4x2x2xf32> -> tensor<f32>
  return %3 : tensor<f32>
}

// CHECK-LABEL: func.func @m(
// CHECK: %[[R:.*]] = plan.relu %{{.*}} : tensor<8x4x2x2xbf16>
// CHECK-NEXT: %[[W:.*]] = plan.cast %[[R]] : tensor<8x4x2x2xbf16> -> tensor<8x4x2x2xf32>
// CHECK-NEXT: %[[BN:.*]] = plan.batch_norm %[[W]], %arg2, %arg3 running(%arg4, %arg5 : tensor<4xf32>, tensor<4xf32>) {{.*}}: tensor<8x4x2x2xf32>, tensor<4xf32>
// CHECK-NEXT: %[[N:.*]] = plan.cast %[[BN]] : tensor<8x4x2x2xf32> -> tensor<8x4x2x2xbf16>
// CHECK-NEXT: plan.relu %[[N]] : tensor<8x4x2x2xbf16>

// The step differentiates through the casts: batch norm's gradient is fp32,
// and so are gamma's and beta's.
// STEP-LABEL: func.func @train_step(
// STEP: plan.batch_norm_grad {{.*}} : tensor<8x4x2x2xf32>
