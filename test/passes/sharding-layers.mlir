// RUN: plan-opt %s --plan-propagate-sharding --split-input-file --verify-diagnostics | FileCheck %s
// RUN: plan-opt %s --plan-propagate-sharding --plan-insert-reshards --plan-expand-reshards --split-input-file --verify-diagnostics | FileCheck %s --check-prefix=COLL

// Sharding rules of the transformer ops, the batched matmul, reshape,
// transpose and sharding_constraint.

// A data-parallel transformer block: the batch split carries through every
// op; the loss is dp-partial.
plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @train_step(%ids: tensor<2x8xi32> {plan.sharding = #plan.sharding<@mesh, [[dp], []]>},
                      %t: tensor<2x8xi32> {plan.sharding = #plan.sharding<@mesh, [[dp], []]>},
                      %wte: tensor<64x16xf32>, %g: tensor<16xf32>, %b: tensor<16xf32>,
                      %wqkv: tensor<16x48xf32>, %wo: tensor<24x16xf32>, %wout: tensor<16x64xf32>) -> tensor<f32> attributes {plan.train_step} {
  %h = plan.embedding %ids, %wte : tensor<2x8xi32>, tensor<64x16xf32> -> tensor<2x8x16xf32>
  %n = plan.layernorm %h, %g, %b : tensor<2x8x16xf32>, tensor<16xf32>
  %qkv = plan.matmul %n, %wqkv : tensor<2x8x16xf32>, tensor<16x48xf32> -> tensor<2x8x48xf32>
  %a = plan.attention %qkv {num_heads = 4 : i64, num_kv_heads = 2 : i64} : tensor<2x8x48xf32> -> tensor<2x8x24xf32>
  %o = plan.matmul %a, %wo : tensor<2x8x24xf32>, tensor<24x16xf32> -> tensor<2x8x16xf32>
  %r = plan.rmsnorm %o, %g : tensor<2x8x16xf32>, tensor<16xf32>
  %s = plan.silu %r : tensor<2x8x16xf32>
  %m = plan.mul %s, %h : tensor<2x8x16xf32>
  %d = plan.sub %m, %h : tensor<2x8x16xf32>
  %sc = plan.matmul %d, %d {transpose_rhs} : tensor<2x8x16xf32>, tensor<2x8x16xf32> -> tensor<2x8x8xf32>
  %p = plan.softmax %sc : tensor<2x8x8xf32>
  %tr = plan.transpose %d {permutation = array<i64: 0, 2, 1>} : tensor<2x8x16xf32> -> tensor<2x16x8xf32>
  %flat = plan.reshape %d : tensor<2x8x16xf32> -> tensor<2x128xf32>
  %logits = plan.matmul %d, %wout : tensor<2x8x16xf32>, tensor<16x64xf32> -> tensor<2x8x64xf32>
  %loss = plan.cross_entropy %logits, %t : tensor<2x8x64xf32>, tensor<2x8xi32> -> tensor<f32>
  return %loss : tensor<f32>
}
// CHECK-LABEL: func.func @train_step
// CHECK: plan.embedding {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK: plan.layernorm {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK: plan.matmul {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>} : tensor<2x8x16xf32>, tensor<16x48xf32>
// CHECK: plan.attention {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>
// CHECK: plan.matmul {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>} : tensor<2x8x24xf32>
// CHECK: plan.rmsnorm {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK: plan.silu {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK: plan.mul {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK: plan.sub {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>}
// Batched matmul: the batch split of both operands carries.
// CHECK: plan.matmul {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>, transpose_rhs}
// CHECK: plan.softmax {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK: plan.transpose {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>
// Dimension 0 keeps its size, so its split carries.
// CHECK: plan.reshape {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK: plan.matmul {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>} : tensor<2x8x16xf32>, tensor<16x64xf32>
// Each rank sums the losses of its sequences: a summand of the mean.
// CHECK: plan.cross_entropy {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, [], partial = [dp]>}
// COLL: %[[L:.*]] = plan.cross_entropy
// COLL-NEXT: plan.all_reduce %[[L]] over ["dp"]

// -----

// Tensor and vocabulary parallelism over tp, batch over dp.
plan.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
func.func @train_step(%ids: tensor<2x8xi32> {plan.sharding = #plan.sharding<@mesh, [[dp], []]>},
                      %wte: tensor<64x16xf32> {plan.sharding = #plan.sharding<@mesh, [[tp], []]>},
                      %wcol: tensor<64x16xf32> {plan.sharding = #plan.sharding<@mesh, [[], [tp]]>},
                      %w1: tensor<16x32xf32> {plan.sharding = #plan.sharding<@mesh, [[], [tp]]>},
                      %w2: tensor<32x16xf32> {plan.sharding = #plan.sharding<@mesh, [[tp], []]>},
                      %g: tensor<16xf32>) -> tensor<2x8x16xf32> attributes {plan.train_step} {
  // Vocab-parallel: each rank contributes the rows it owns.
  %h = plan.embedding %ids, %wte : tensor<2x8xi32>, tensor<64x16xf32> -> tensor<2x8x16xf32>
  // Split along the embedding width: the result's last dimension is split.
  %hc = plan.embedding %ids, %wte : tensor<2x8xi32>, tensor<64x16xf32> -> tensor<2x8x16xf32>
  %hw = plan.embedding %ids, %wcol : tensor<2x8xi32>, tensor<64x16xf32> -> tensor<2x8x16xf32>
  // The norm needs the sum first.
  %n = plan.rmsnorm %h, %g : tensor<2x8x16xf32>, tensor<16xf32>
  // Megatron MLP: column- then row-parallel.
  %u = plan.matmul %n, %w1 : tensor<2x8x16xf32>, tensor<16x32xf32> -> tensor<2x8x32xf32>
  %a = plan.silu %u : tensor<2x8x32xf32>
  %y = plan.matmul %a, %w2 : tensor<2x8x32xf32>, tensor<32x16xf32> -> tensor<2x8x16xf32>
  // Linear ops keep pending sums.
  %yt = plan.transpose %y {permutation = array<i64: 1, 0, 2>} : tensor<2x8x16xf32> -> tensor<8x2x16xf32>
  %ys = plan.reshape %y : tensor<2x8x16xf32> -> tensor<2x128xf32>
  %ym = plan.mul %y, %n : tensor<2x8x16xf32>
  %yd = plan.sub %y, %y : tensor<2x8x16xf32>
  // Pinning the pending sum keeps it; pinning it whole reduces it first.
  %yp = plan.sharding_constraint %y <@mesh, [[dp], [], []], partial = [tp]> : tensor<2x8x16xf32>
  %yw = plan.sharding_constraint %yp <@mesh, [[dp], [], []]> : tensor<2x8x16xf32>
  return %yw : tensor<2x8x16xf32>
}
// CHECK-LABEL: func.func @train_step
// CHECK: plan.embedding {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []], partial = [tp]>}
// CHECK: plan.embedding {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []], partial = [tp]>}
// CHECK: plan.embedding {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK: plan.rmsnorm {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>}
// CHECK: plan.matmul {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], [tp]]>}
// CHECK: plan.silu {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], [tp]]>}
// Contracting the tp-split dimension leaves tp-partial sums.
// CHECK: plan.matmul {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []], partial = [tp]>}
// CHECK: plan.transpose {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}], [dp], []], partial = [tp]>
// CHECK: plan.reshape {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []], partial = [tp]>}
// CHECK: plan.mul {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []], partial = [tp]>}
// CHECK: plan.sub {{.*}} {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []], partial = [tp]>}
// CHECK: plan.sharding_constraint {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []], partial = [tp]>
// CHECK: plan.sharding_constraint {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [], []]>
// COLL: %[[H:.*]] = plan.embedding
// COLL-NEXT: %[[RH:.*]] = plan.all_reduce %[[H]] over ["tp"]
// COLL: plan.rmsnorm %[[RH]]
// The pending sum is reduced once, right after it is computed, for the
// constraint that wants it whole; constraints are gone once applied.
// COLL: %[[Y:.*]] = plan.matmul %{{.*}}, %arg4
// COLL-NEXT: %[[RY:.*]] = plan.all_reduce %[[Y]] over ["tp"]
// COLL-NOT: plan.sharding_constraint
// COLL: return

// -----

// A replicated value narrows to a split locally.
plan.mesh @mesh axes = ["dp"] shape = [2]
func.func @train_step(%x: tensor<8x4xf32>) -> tensor<8x4xf32> attributes {plan.train_step} {
  %0 = plan.sharding_constraint %x <@mesh, [[dp], []]> : tensor<8x4xf32>
  %1 = plan.reshape %x : tensor<8x4xf32> -> tensor<4x8xf32>
  return %0 : tensor<8x4xf32>
}
// The constraint's layout flows back to the open argument, and on to the
// reshape ([8, 4] -> [4, 8]: dimension 0's factor 4 leads both).
// CHECK-LABEL: func.func @train_step
// CHECK-SAME: %arg0: tensor<8x4xf32> {plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK: plan.sharding_constraint {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>
// CHECK: plan.reshape {{.*}}plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>}
