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
