// RUN: plan-opt %s | plan-opt | FileCheck %s
// RUN: plan-opt %s --mlir-print-op-generic | plan-opt | FileCheck %s

// CHECK: plan.mesh @mesh axes = ["dp", "tp"] shape = [2, 4]
plan.mesh @mesh axes = ["dp", "tp"] shape = [2, 4]
// CHECK: plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64}
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-01 : f64, optimizer = "sgd", seed = 3 : i64, steps = 5 : i64}

// CHECK-LABEL: func.func @ops(
// CHECK-SAME: plan.init = #plan.init<normal, 0.000000e+00, 2.000000e-02>
// CHECK-SAME: plan.init = #plan.init<zeros>
// CHECK-SAME: plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>
func.func @ops(%w: tensor<4x4xf32> {plan.init = #plan.init<normal, 0.0, 0.02>},
               %b: tensor<4xf32> {plan.init = #plan.init<zeros>},
               %x: tensor<8x4xf32> {plan.sharding = #plan.sharding<@mesh, [[dp], []]>}) {
  // CHECK: plan.matmul %{{.*}}, %{{.*}} {transpose_rhs} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %0 = plan.matmul %x, %w {transpose_rhs} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  // CHECK: plan.bias_add
  %1 = plan.bias_add %0, %b : tensor<8x4xf32>, tensor<4xf32>
  // CHECK: plan.relu
  %2 = plan.relu %1 : tensor<8x4xf32>
  // CHECK: plan.gelu
  %3 = plan.gelu %2 : tensor<8x4xf32>
  // CHECK: plan.add
  %4 = plan.add %3, %2 : tensor<8x4xf32>
  // CHECK: plan.relu_grad
  %5 = plan.relu_grad %1, %4 : tensor<8x4xf32>
  // CHECK: plan.gelu_grad
  %6 = plan.gelu_grad %2, %5 : tensor<8x4xf32>
  // CHECK: plan.bias_grad %{{.*}} : tensor<8x4xf32> -> tensor<4xf32>
  %7 = plan.bias_grad %6 : tensor<8x4xf32> -> tensor<4xf32>
  // CHECK: plan.mse_loss %{{.*}}, %{{.*}} : tensor<8x4xf32> -> tensor<f32>
  %8 = plan.mse_loss %4, %x : tensor<8x4xf32> -> tensor<f32>
  // CHECK: plan.mse_loss_grad
  %9 = plan.mse_loss_grad %4, %x : tensor<8x4xf32>
  // CHECK: plan.all_reduce %{{.*}} over ["dp"] {plan.sharding = #plan.sharding<@mesh, []>}
  %10 = plan.all_reduce %8 over ["dp"] {plan.sharding = #plan.sharding<@mesh, []>} : tensor<f32>
  // CHECK: plan.sgd_update %{{.*}}, %{{.*}} {lr = 1.000000e-01 : f32}
  %11 = plan.sgd_update %b, %7 {lr = 0.1 : f32} : tensor<4xf32>
  // CHECK: plan.adamw_update
  %12:3 = plan.adamw_update %b, %7, %b, %b {lr = 0.1 : f32, beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, weight_decay = 0.1 : f32} : tensor<4xf32>
  // CHECK: #plan.sharding<@mesh, {{\[\[}}], [tp]], partial = [dp]>
  %13 = plan.relu %0 {plan.sharding = #plan.sharding<@mesh, [[], [tp]], partial = [dp]>} : tensor<8x4xf32>
  // CHECK: plan.sumsq %{{.*}}, %{{.*}} : tensor<8x4xf32>, tensor<4xf32> -> tensor<f32>
  %14 = plan.sumsq %6, %7 : tensor<8x4xf32>, tensor<4xf32> -> tensor<f32>
  // CHECK: plan.sgd_update %{{.*}}, %{{.*}} clipped by %{{.*}} {lr = 1.000000e-01 : f32, max_norm = 1.000000e+00 : f32} : tensor<4xf32>, tensor<f32>
  %15 = plan.sgd_update %b, %7 clipped by %14 {lr = 0.1 : f32, max_norm = 1.0 : f32} : tensor<4xf32>, tensor<f32>
  // CHECK: plan.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} clipped by %{{.*}} {{{.*}}max_norm = 5.000000e-01 : f32{{.*}}} : tensor<4xf32>, tensor<f32>
  %16:3 = plan.adamw_update %b, %7, %b, %b clipped by %14 {lr = 0.1 : f32, beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, weight_decay = 0.1 : f32, max_norm = 0.5 : f32} : tensor<4xf32>, tensor<f32>
  return
}
