// RUN: plan-opt %s --plan-mixed-precision --plan-autodiff --plan-fuse-casts --plan-loss-scale | FileCheck %s
// RUN: plan-opt %s --plan-seed-sharding --plan-mixed-precision --plan-autodiff --plan-fuse-casts --plan-loss-scale --plan-propagate-sharding --plan-insert-reshards --plan-expand-reshards --plan-lower-to-rank | FileCheck %s --check-prefix=RANK

// fp16 with loss_scale = dynamic: the loss gradient is scaled, each
// parameter gradient unscaled before its norm and update; w's two terms
// (it is used twice) are summed in fp16 first.
plan.mesh @mesh axes = ["dp"] shape = [2]
plan.train {data = "synthetic", global_batch = 8 : i64, loss_scale = "dynamic", lr = 5.000000e-02 : f64, optimizer = "sgd", precision = "fp16", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %y: tensor<8x4xf32> {plan.kind = "label", plan.name = "y"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.gelu %0 : tensor<8x4xf32>
  %2 = plan.matmul %1, %w {transpose_rhs} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %3 = plan.mse_loss %2, %y : tensor<8x4xf32> -> tensor<f32>
  return %3 : tensor<f32>
}

// CHECK-LABEL: func.func @train_step(
// CHECK: %[[DL:.*]] = plan.mse_loss_grad
// CHECK-NEXT: %[[S:.*]] = plan.loss_scale %[[DL]] : tensor<8x4xf32>
// CHECK-NEXT: plan.cast %[[S]] : tensor<8x4xf32> -> tensor<8x4xf16>
// CHECK: %[[G:.*]] = plan.cast %{{.*}} : tensor<4x4xf16> -> tensor<4x4xf32>
// CHECK-NEXT: %[[U:.*]] = plan.loss_scale %[[G]] {inverse} : tensor<4x4xf32>
// CHECK-NEXT: plan.sumsq %[[U]]
// CHECK: plan.sgd_update %arg2, %[[U]]

// At rank level: the scaled fp16 gradient is all-reduced, widened and
// unscaled; every rank checks for an overflow before the update.
// RANK-LABEL: func.func @plan_step(
// RANK: rank.loss_scale %{{.*}} into %{{.*}} {inverse = false}
// RANK: rank.all_reduce_start {{.*}} : memref<16xf16>
// RANK: rank.cast {{.*}} : memref<4x4xf16> -> memref<4x4xf32>
// RANK: rank.loss_scale %{{.*}} into %{{.*}} {inverse = true} : memref<4x4xf32> -> memref<4x4xf32>
// RANK: rank.loss_scale_check
// RANK-NEXT: rank.sgd_update
