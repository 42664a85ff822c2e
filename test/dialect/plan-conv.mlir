// RUN: plan-opt %s --split-input-file | plan-opt --split-input-file | FileCheck %s
// The convolutional-network ops round-trip, with every spatial attribute.

// CHECK-LABEL: func.func @conv
// CHECK: plan.conv2d %arg0, %arg1 {dilation = array<i64: 2, 2>, groups = 1 : i64, padding = array<i64: 2, 2>, stride = array<i64: 1, 1>} : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32> -> tensor<2x4x8x8xf32>
// CHECK: plan.channel_bias_add %{{.*}}, %arg2 : tensor<2x4x8x8xf32>, tensor<4xf32>
// CHECK: plan.pool2d %{{.*}} {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0>, stride = array<i64: 2, 2>} : tensor<2x4x8x8xf32> -> tensor<2x4x4x4xf32>
// CHECK: plan.pool2d_grad %{{.*}}, %{{.*}} {kernel = array<i64: 2, 2>, kind = "max", padding = array<i64: 0, 0>, stride = array<i64: 2, 2>} : tensor<2x4x8x8xf32>, tensor<2x4x4x4xf32>
// CHECK: plan.conv2d_grad %arg0, %arg1, %{{.*}} {{.*}} : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<2x4x8x8xf32>
// CHECK: plan.channel_bias_grad %{{.*}} : tensor<2x4x8x8xf32> -> tensor<4xf32>
func.func @conv(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %y = plan.conv2d %x, %w {stride = array<i64: 1, 1>, padding = array<i64: 2, 2>, dilation = array<i64: 2, 2>, groups = 1 : i64} : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32> -> tensor<2x4x8x8xf32>
  %z = plan.channel_bias_add %y, %b : tensor<2x4x8x8xf32>, tensor<4xf32>
  %p = plan.pool2d %z {kind = "max", kernel = array<i64: 2, 2>, stride = array<i64: 2, 2>, padding = array<i64: 0, 0>} : tensor<2x4x8x8xf32> -> tensor<2x4x4x4xf32>
  %dz = plan.pool2d_grad %z, %p {kind = "max", kernel = array<i64: 2, 2>, stride = array<i64: 2, 2>, padding = array<i64: 0, 0>} : tensor<2x4x8x8xf32>, tensor<2x4x4x4xf32>
  %dx, %dw = plan.conv2d_grad %x, %w, %dz {stride = array<i64: 1, 1>, padding = array<i64: 2, 2>, dilation = array<i64: 2, 2>, groups = 1 : i64} : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<2x4x8x8xf32>
  %db = plan.channel_bias_grad %dz : tensor<2x4x8x8xf32> -> tensor<4xf32>
  return %db : tensor<4xf32>
}

// -----

// Batch norm with running statistics, and the ops plan-autodiff adds to
// update them.
// CHECK-LABEL: func.func @bn_running
// CHECK: plan.batch_norm %arg0, %arg1, %arg2 running(%arg3, %arg4 : tensor<4xf32>, tensor<4xf32>) {momentum = 3.000000e-01 : f32} : tensor<2x4x3x3xf32>, tensor<4xf32>
// CHECK: %[[S:.*]], %[[Q:.*]] = plan.batch_norm_moments %arg0 : tensor<2x4x3x3xf32> -> tensor<4xf32>
// CHECK: plan.running_stats_update %arg3, %arg4, %[[S]], %[[Q]] {count = 18 : i64, momentum = 3.000000e-01 : f32} : tensor<4xf32>
func.func @bn_running(%x: tensor<2x4x3x3xf32>, %g: tensor<4xf32>, %b: tensor<4xf32>,
                      %rm: tensor<4xf32>, %rv: tensor<4xf32>) {
  %y = plan.batch_norm %x, %g, %b running(%rm, %rv : tensor<4xf32>, tensor<4xf32>) {eps = 1.0e-5 : f32, momentum = 0.3 : f32} : tensor<2x4x3x3xf32>, tensor<4xf32>
  %s, %q = plan.batch_norm_moments %x : tensor<2x4x3x3xf32> -> tensor<4xf32>
  %m2, %v2 = plan.running_stats_update %rm, %rv, %s, %q {count = 18 : i64, momentum = 0.3 : f32} : tensor<4xf32>
  return
}
