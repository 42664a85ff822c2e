// RUN: plan-opt %s --plan-propagate-sharding --plan-expand-reshards --split-input-file --verify-diagnostics | FileCheck %s

// Each change of layout as its cheapest collective, on its named axis.
plan.mesh @mesh axes = ["dp", "tp"] shape = [2, 2]
func.func @train_step(%x: tensor<8x4xf32> {plan.kind = "input", plan.sharding = #plan.sharding<@mesh, [[dp], [tp]]>},
                      %w: tensor<4x4xf32> {plan.kind = "input", plan.sharding = #plan.sharding<@mesh, [[], []]>}) -> tensor<8x4xf32> attributes {plan.train_step} {
  // Contracting the tp-split dimension: a tp-partial product.
  %p = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  // partial -> split: reduce-scatter.
  %a = plan.reshard %p <@mesh, [[dp], [tp]]> : tensor<8x4xf32>
  // split -> whole: all-gather.
  %b = plan.reshard %a <@mesh, [[dp], []]> : tensor<8x4xf32>
  // whole -> split: a local slice.
  %c = plan.reshard %b <@mesh, [[dp, tp], []]> : tensor<8x4xf32>
  // a split moved to another dimension: all-to-all.
  %d = plan.reshard %c <@mesh, [[dp], [tp]]> : tensor<8x4xf32>
  // partial -> whole: all-reduce.
  %e = plan.reshard %p <@mesh, [[dp], []]> : tensor<8x4xf32>
  %f = plan.add %d, %e : tensor<8x4xf32>
  return %f : tensor<8x4xf32>
}
// CHECK-LABEL: func.func @train_step
// CHECK: %[[P:.*]] = plan.matmul {{.*}}partial = [tp]>
// CHECK-NEXT: %[[A:.*]] = plan.reduce_scatter %[[P]] dim 1 over "tp" {plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [tp]]>}
// CHECK-NEXT: %[[B:.*]] = plan.all_gather %[[A]] dim 1 over "tp" {plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>}
// CHECK-NEXT: %[[C:.*]] = plan.all_slice %[[B]] dim 0 over "tp" {plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp, tp], []]>}
// CHECK-NEXT: %[[D:.*]] = plan.all_to_all %[[C]] gather 0 split 1 over "tp" {plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], [tp]]>}
// CHECK-NEXT: %[[E:.*]] = plan.all_reduce %[[P]] over ["tp"] {plan.sharding = #plan.sharding<@mesh, {{\[\[}}dp], []]>}

// -----

// A size-1 axis holds nothing to exchange.
plan.mesh @mesh axes = ["dp", "tp"] shape = [1, 2]
func.func @train_step(%x: tensor<8x4xf32> {plan.kind = "input", plan.sharding = #plan.sharding<@mesh, [[dp], []]>}) -> tensor<8x4xf32> attributes {plan.train_step} {
  %a = plan.reshard %x <@mesh, [[], []]> : tensor<8x4xf32>
  return %a : tensor<8x4xf32>
}
// CHECK-LABEL: func.func @train_step
// CHECK-NOT: plan.all_gather
// CHECK: return %arg0

// -----

plan.mesh @mesh axes = ["tp"] shape = [2]
func.func @train_step(%x: tensor<8x12xf32> {plan.kind = "input", plan.sharding = #plan.sharding<@mesh, [[], [tp] {4, 4, 4}]>}) -> tensor<8x12xf32> attributes {plan.train_step} {
  // expected-error @below {{resharding dimension 1 from #plan.sharding<@mesh, [[], [tp] {4, 4, 4}]> to #plan.sharding<@mesh, [[], []]> moves a split made of segments; not supported yet}}
  %a = plan.reshard %x <@mesh, [[], []]> : tensor<8x12xf32>
  return %a : tensor<8x12xf32>
}
