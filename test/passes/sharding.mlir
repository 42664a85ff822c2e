// RUN: plan-opt %s --plan-propagate-sharding --split-input-file --verify-diagnostics | FileCheck %s
// RUN: plan-opt %s --plan-propagate-sharding --plan-insert-reshards --plan-expand-reshards --split-input-file --verify-diagnostics | FileCheck %s --check-prefix=COLL

// Data parallel: the batch is split over dp, so activations are split,
// contractions over the batch (weight gradients), bias gradients and the loss
// are dp-partial; the optimizer needs them whole.
plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @train_step(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x", plan.sharding = #plan.sharding<@mesh, [[dp], []]>},
                      %y: tensor<8x2xf32> {plan.kind = "label", plan.name = "y", plan.sharding = #plan.sharding<@mesh, [[dp], []]>},
                      %w: tensor<4x2xf32> {plan.kind = "param", plan.name = "w"},
                      %b: tensor<2xf32> {plan.kind = "param", plan.name = "b"}) -> (tensor<f32> {plan.result = "loss"}, tensor<4x2xf32>, tensor<2xf32>) attributes {plan.train_step} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x2xf32> -> tensor<8x2xf32>
  %1 = plan.bias_add %0, %b : tensor<8x2xf32>, tensor<2xf32>
  %2 = plan.mse_loss %1, %y : tensor<8x2xf32> -> tensor<f32>
  %3 = plan.mse_loss_grad %1, %y : tensor<8x2xf32>
  %4 = plan.bias_grad %3 : tensor<8x2xf32> -> tensor<2xf32>
  %5 = plan.matmul %x, %3 {transpose_lhs} : tensor<8x4xf32>, tensor<8x2xf32> -> tensor<4x2xf32>
  %6 = plan.matmul %x, %3 {transpose_lhs} : tensor<8x4xf32>, tensor<8x2xf32> -> tensor<4x2xf32>
  %7 = plan.add %5, %6 : tensor<4x2xf32>
  %8 = plan.sgd_update %w, %7 {lr = 1.0 : f32} : tensor<4x2xf32>
  %9 = plan.sgd_update %b, %4 {lr = 1.0 : f32} : tensor<2xf32>
  return %2, %8, %9 : tensor<f32>, tensor<4x2xf32>, tensor<2xf32>
}
// Unannotated parameters nothing splits are replicated.
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %arg2: tensor<4x2xf32> {{{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}], []]>}
// CHECK: plan.matmul %arg0, %arg2 {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK: plan.bias_add {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK: plan.mse_loss {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, [], partial = [dp]>}
// CHECK: plan.mse_loss_grad {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK: plan.bias_grad {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}]], partial = [dp]>}
// CHECK: plan.matmul {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}], []], partial = [dp]>, transpose_lhs}
// CHECK: plan.matmul {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}], []], partial = [dp]>, transpose_lhs}
// A sum of partial values stays partial.
// CHECK: plan.add {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}], []], partial = [dp]>}
// CHECK: plan.sgd_update {{.*}} plan.sharding = #plan.sharding<@mesh, {{\[\[}}], []]>}

// One all-reduce per partial value that must be whole, right after it is
// computed; the accumulated gradient is reduced once, after the add.
// COLL: %[[LOSS:.*]] = plan.mse_loss
// COLL-NEXT: %[[RLOSS:.*]] = plan.all_reduce %[[LOSS]] over ["dp"] {plan.sharding = #plan.sharding<@mesh, []>}
// COLL: %[[DB:.*]] = plan.bias_grad
// COLL-NEXT: %[[RDB:.*]] = plan.all_reduce %[[DB]] over ["dp"]
// COLL: %[[G1:.*]] = plan.matmul
// COLL-NOT: plan.all_reduce
// COLL: %[[SUM:.*]] = plan.add
// COLL-NEXT: %[[RSUM:.*]] = plan.all_reduce %[[SUM]] over ["dp"]
// COLL: plan.sgd_update %arg2, %[[RSUM]]
// COLL: plan.sgd_update %arg3, %[[RDB]]
// COLL: return %[[RLOSS]],

// -----

// A whole operand meets a split contraction: it is sliced locally (no
// communication) and the product is a pending sum.
plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @train_step(%x: tensor<8x4xf32> {plan.sharding = #plan.sharding<@mesh, [[], [dp]]>},
                      %w: tensor<4x2xf32> {plan.sharding = #plan.sharding<@mesh, [[], []]>}) -> tensor<8x2xf32> attributes {plan.train_step} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x2xf32> -> tensor<8x2xf32>
  return %0 : tensor<8x2xf32>
}
// CHECK-LABEL: func.func @train_step
// CHECK: plan.matmul {{.*}}plan.factor_axes = {{\[\[}}], ["dp"], []], plan.sharding = #plan.sharding<@mesh, {{\[\[}}], []], partial = [dp]>
// COLL: %[[S:.*]] = plan.all_slice %arg1 dim 0 over "dp" {plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>}
// COLL-NEXT: %[[P:.*]] = plan.matmul %arg0, %[[S]]
// COLL-NEXT: plan.all_reduce %[[P]] over ["dp"]

// -----

// Backward: an open argument takes the layout its use needs.
plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @train_step(%x: tensor<8x2xf32> {plan.sharding = #plan.sharding<@mesh, [[dp], []]>},
                      %y: tensor<8x2xf32>) -> tensor<8x2xf32> attributes {plan.train_step} {
  %0 = plan.add %x, %y : tensor<8x2xf32>
  return %0 : tensor<8x2xf32>
}
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %arg1: tensor<8x2xf32> {plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>}

// -----

// One mesh axis splits one factor of an op: the batch keeps dp (the first
// claim at equal priority), so the bias is gathered whole.
plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @train_step(%x: tensor<8x2xf32> {plan.sharding = #plan.sharding<@mesh, [[dp], []]>},
                      %b: tensor<2xf32> {plan.sharding = #plan.sharding<@mesh, [[dp]]>}) -> tensor<8x2xf32> attributes {plan.train_step} {
  %0 = plan.bias_add %x, %b : tensor<8x2xf32>, tensor<2xf32>
  return %0 : tensor<8x2xf32>
}
// CHECK-LABEL: func.func @train_step
// CHECK: plan.bias_add {{.*}}plan.factor_axes = {{\[\[}}"dp"], []]
// COLL: %[[B:.*]] = plan.all_gather %arg1 dim 0 over "dp"
// COLL-NEXT: plan.bias_add %arg0, %[[B]]

// -----

// Two annotations that split one factor differently cannot both hold.
plan.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
// expected-note @below {{the first is set here}}
func.func @train_step(%x: tensor<8x4xf32> {plan.sharding = #plan.sharding<@mesh, [[], [dp]]>},
                      // expected-note @below {{the second is set here}}
                      %w: tensor<4x2xf32> {plan.sharding = #plan.sharding<@mesh, [[tp], []]>}) -> tensor<8x2xf32> attributes {plan.train_step} {
  // expected-error @below {{conflicting shardings from two annotations: one dimension is split over [dp] by one and over [tp] by the other}}
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x2xf32> -> tensor<8x2xf32>
  return %0 : tensor<8x2xf32>
}

// -----

// expected-error @below {{expected a plan.mesh op}}
module {
}
