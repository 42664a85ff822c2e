// RUN: plan-opt %s --plan-lower-to-rank --split-input-file --verify-diagnostics | FileCheck %s
// RUN: plan-opt %s --plan-lower-to-rank --split-input-file --verify-diagnostics | FileCheck %s --check-prefix=FWD

// The dp=2 training step of a linear + relu model with AdamW, after
// plan-insert-collectives.
module {
  plan.mesh @mesh axes = ["dp"] shape = [2]
  plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "adamw", seed = 1 : i64, steps = 3 : i64}
  func.func @m(%arg0: tensor<8x4xf32> {plan.kind = "input", plan.name = "x", plan.sharding = #plan.sharding<@mesh, [[dp], []]>}, %arg1: tensor<8x2xf32> {plan.kind = "label", plan.name = "y", plan.sharding = #plan.sharding<@mesh, [[dp], []]>}, %arg2: tensor<4x2xf32> {plan.init = #plan.init<normal, 0.000000e+00, 5.000000e-01>, plan.kind = "param", plan.name = "w", plan.sharding = #plan.sharding<@mesh, [[], []]>}, %arg3: tensor<2xf32> {plan.init = #plan.init<zeros>, plan.kind = "param", plan.name = "b", plan.sharding = #plan.sharding<@mesh, [[]]>}) -> tensor<f32> attributes {plan.model} {
    %0 = plan.matmul %arg0, %arg2 {plan.sharding = #plan.sharding<@mesh, [[dp], []]>} : tensor<8x4xf32>, tensor<4x2xf32> -> tensor<8x2xf32>
    %1 = plan.bias_add %0, %arg3 {plan.sharding = #plan.sharding<@mesh, [[dp], []]>} : tensor<8x2xf32>, tensor<2xf32>
    %2 = plan.relu %1 {plan.sharding = #plan.sharding<@mesh, [[dp], []]>} : tensor<8x2xf32>
    %3 = plan.mse_loss %2, %arg1 {plan.sharding = #plan.sharding<@mesh, [], partial = [dp]>} : tensor<8x2xf32> -> tensor<f32>
    %4 = plan.all_reduce %3 over ["dp"] {plan.sharding = #plan.sharding<@mesh, []>} : tensor<f32>
    return %4 : tensor<f32>
  }
  func.func @train_step(%arg0: tensor<8x4xf32> {plan.kind = "input", plan.name = "x", plan.sharding = #plan.sharding<@mesh, [[dp], []]>}, %arg1: tensor<8x2xf32> {plan.kind = "label", plan.name = "y", plan.sharding = #plan.sharding<@mesh, [[dp], []]>}, %arg2: tensor<4x2xf32> {plan.init = #plan.init<normal, 0.000000e+00, 5.000000e-01>, plan.kind = "param", plan.name = "w", plan.sharding = #plan.sharding<@mesh, [[], []]>}, %arg3: tensor<2xf32> {plan.init = #plan.init<zeros>, plan.kind = "param", plan.name = "b", plan.sharding = #plan.sharding<@mesh, [[]]>}, %m0: tensor<4x2xf32> {plan.kind = "state", plan.name = "w.exp_avg", plan.sharding = #plan.sharding<@mesh, [[], []]>}, %v0: tensor<4x2xf32> {plan.kind = "state", plan.name = "w.exp_avg_sq", plan.sharding = #plan.sharding<@mesh, [[], []]>}, %m1: tensor<2xf32> {plan.kind = "state", plan.name = "b.exp_avg", plan.sharding = #plan.sharding<@mesh, [[]]>}, %v1: tensor<2xf32> {plan.kind = "state", plan.name = "b.exp_avg_sq", plan.sharding = #plan.sharding<@mesh, [[]]>}) -> (tensor<f32> {plan.result = "loss"}, tensor<f32> {plan.result = "grad_sumsq"}, tensor<4x2xf32>, tensor<2xf32>, tensor<4x2xf32> {plan.result = "state"}, tensor<4x2xf32> {plan.result = "state"}, tensor<2xf32> {plan.result = "state"}, tensor<2xf32> {plan.result = "state"}) attributes {plan.train_step} {
    %0 = plan.matmul %arg0, %arg2 {plan.sharding = #plan.sharding<@mesh, [[dp], []]>} : tensor<8x4xf32>, tensor<4x2xf32> -> tensor<8x2xf32>
    %1 = plan.bias_add %0, %arg3 {plan.sharding = #plan.sharding<@mesh, [[dp], []]>} : tensor<8x2xf32>, tensor<2xf32>
    %2 = plan.relu %1 {plan.sharding = #plan.sharding<@mesh, [[dp], []]>} : tensor<8x2xf32>
    %3 = plan.mse_loss %2, %arg1 {plan.sharding = #plan.sharding<@mesh, [], partial = [dp]>} : tensor<8x2xf32> -> tensor<f32>
    %4 = plan.all_reduce %3 over ["dp"] {plan.sharding = #plan.sharding<@mesh, []>} : tensor<f32>
    %5 = plan.mse_loss_grad %2, %arg1 {plan.sharding = #plan.sharding<@mesh, [[dp], []]>} : tensor<8x2xf32>
    %6 = plan.relu_grad %1, %5 {plan.sharding = #plan.sharding<@mesh, [[dp], []]>} : tensor<8x2xf32>
    %7 = plan.bias_grad %6 {plan.sharding = #plan.sharding<@mesh, [[]], partial = [dp]>} : tensor<8x2xf32> -> tensor<2xf32>
    %8 = plan.all_reduce %7 over ["dp"] {plan.sharding = #plan.sharding<@mesh, [[]]>} : tensor<2xf32>
    %9 = plan.matmul %arg0, %6 {plan.sharding = #plan.sharding<@mesh, [[], []], partial = [dp]>, transpose_lhs} : tensor<8x4xf32>, tensor<8x2xf32> -> tensor<4x2xf32>
    %10 = plan.all_reduce %9 over ["dp"] {plan.sharding = #plan.sharding<@mesh, [[], []]>} : tensor<4x2xf32>
    %11 = plan.sumsq %10 {plan.sharding = #plan.sharding<@mesh, []>} : tensor<4x2xf32> -> tensor<f32>
    %12 = plan.sumsq %8 {plan.sharding = #plan.sharding<@mesh, []>} : tensor<2xf32> -> tensor<f32>
    %13 = plan.add %11, %12 {plan.sharding = #plan.sharding<@mesh, []>} : tensor<f32>
    %14:3 = plan.adamw_update %arg2, %10, %m0, %v0 {beta1 = 0.899999976 : f32, beta2 = 9.990000e-01 : f32, eps = 9.99999993E-9 : f32, lr = 1.000000e-03 : f32, plan.sharding = [#plan.sharding<@mesh, [[], []]>, #plan.sharding<@mesh, [[], []]>, #plan.sharding<@mesh, [[], []]>], weight_decay = 0.000000e+00 : f32} : tensor<4x2xf32>
    %15:3 = plan.adamw_update %arg3, %8, %m1, %v1 {beta1 = 0.899999976 : f32, beta2 = 9.990000e-01 : f32, eps = 9.99999993E-9 : f32, lr = 1.000000e-03 : f32, plan.sharding = [#plan.sharding<@mesh, [[]]>, #plan.sharding<@mesh, [[]]>, #plan.sharding<@mesh, [[]]>], weight_decay = 0.000000e+00 : f32} : tensor<2xf32>
    return %4, %13, %14#0, %15#0, %14#1, %14#2, %15#1, %15#2 : tensor<f32>, tensor<f32>, tensor<4x2xf32>, tensor<2xf32>, tensor<4x2xf32>, tensor<4x2xf32>, tensor<2xf32>, tensor<2xf32>
  }
}

// Inputs get their local rows; parameters are replicated.
// CHECK-DAG: rank.input_decl @x : memref<4x4xf32> role "input" batch_axis "dp"
// CHECK-DAG: rank.input_decl @y : memref<4x2xf32> role "label" batch_axis "dp"
// CHECK-DAG: rank.param_decl @w : memref<4x2xf32> init <normal, 0.000000e+00, 5.000000e-01>
// CHECK-DAG: rank.param_decl @b : memref<2xf32> init <zeros>
// The AdamW moments are declared state with the parameters' layouts.
// CHECK-DAG: rank.state_decl @w.exp_avg : memref<4x2xf32>
// CHECK-DAG: rank.state_decl @b.exp_avg_sq : memref<2xf32>
// The global functions are gone.
// CHECK-NOT: func.func @m
// CHECK-LABEL: func.func @plan_step()
// CHECK: %[[X:.*]] = rank.input @x : memref<4x4xf32>
// CHECK: %[[W:.*]] = rank.param @w : memref<4x2xf32>
// CHECK: %[[MM:.*]] = rank.alloc : memref<4x2xf32>
// CHECK: rank.matmul %[[X]], %[[W]] into %[[MM]] {transpose_lhs = false, transpose_rhs = false}
// The loss is scaled by 1/(global elements) = 1/16, so its dp-sum is the mean.
// CHECK: rank.mse_loss {{.*}} into %[[LOSS:.*]] {scale = 6.250000e-02 : f32}
// CHECK: rank.all_reduce %[[LOSS]] over ["dp"] : memref<f32>
// CHECK: rank.matmul %[[X]], %{{.*}} into %[[GW:.*]] {transpose_lhs = true, transpose_rhs = false}
// The gradients are reduced in one bucket, started once both are final and
// waited for before their first use.
// CHECK: rank.all_reduce_start %[[BUCKET:.*]] over ["dp"] slot 0 : memref<10xf32>
// CHECK: rank.collective_wait slot 0
// Updates write the parameter and state buffers in place.
// CHECK: rank.adamw_update %[[W]], %[[GW]], %[[M0:.*]], %[[V0:.*]] {
// CHECK: rank.adamw_update
// CHECK-NOT: rank.copy
// CHECK: rank.report_loss %[[LOSS]] : memref<f32>
// CHECK-NEXT: rank.report_grad_norm %{{.*}} : memref<f32>
// CHECK-NEXT: return
// The forward model is lowered too (for generation): it reads the same
// declarations and observes the prediction.
// FWD-LABEL: func.func @plan_forward()
// FWD: rank.mse_loss
// FWD-NEXT: rank.observe %{{.*}} as "logits"
// FWD-NOT: rank.adamw_update
// FWD: return
// FWD-LABEL: func.func @plan_step()

// -----

plan.mesh @mesh axes = ["dp"] shape = [4]
plan.train {data = "synthetic", global_batch = 6 : i64, lr = 1.000000e-03 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
// expected-error @below {{dimension 0 of size 6 cannot be split evenly over mesh axis 'dp' of size 4}}
func.func @train_step(%x: tensor<6x4xf32> {plan.kind = "input", plan.name = "x", plan.sharding = #plan.sharding<@mesh, [[dp], []]>}) -> tensor<6x4xf32> attributes {plan.train_step} {
  return %x : tensor<6x4xf32>
}

// -----

// expected-error @below {{expected a plan.mesh and a train step; run plan-autodiff first}}
module {
  plan.mesh @mesh axes = ["dp"] shape = [4]
}
