// RUN: plan-opt %s --plan-autodiff --plan-propagate-sharding --plan-insert-reshards --plan-expand-reshards --plan-lower-to-rank | FileCheck %s
// RUN: plan-opt %s --plan-autodiff --plan-propagate-sharding --plan-insert-reshards --plan-expand-reshards --plan-lower-to-rank --plan-lower-rank-to-emitc | FileCheck %s --check-prefix=EMITC

// A transformer-shaped step, data parallel over 2 ranks, down to the rank
// level: token inputs are int32 buffers of local rows, every layer and its
// gradient is one rank op, weight gradients contract over rows through views,
// and the gradient norm is accumulated after the all-reduces.
plan.mesh @mesh axes = ["dp"] shape = [2]
plan.train {data = "synthetic", global_batch = 2 : i64, grad_clip = 1.0 : f64, lr = 1.000000e-03 : f64, optimizer = "adamw", seed = 1 : i64, steps = 3 : i64}
func.func @gpt(%ids: tensor<2x4xi32> {plan.kind = "input", plan.name = "ids", plan.sharding = #plan.sharding<@mesh, [[dp], []]>},
               %tgt: tensor<2x4xi32> {plan.kind = "label", plan.name = "tgt", plan.sharding = #plan.sharding<@mesh, [[dp], []]>},
               %wte: tensor<16x8xf32> {plan.kind = "param", plan.name = "wte"},
               %wpe: tensor<4x8xf32> {plan.kind = "param", plan.name = "wpe"},
               %g: tensor<8xf32> {plan.kind = "param", plan.name = "g"},
               %bb: tensor<8xf32> {plan.kind = "param", plan.name = "b"},
               %wqkv: tensor<8x16xf32> {plan.kind = "param", plan.name = "wqkv"}) -> tensor<f32> attributes {plan.model} {
  %e = plan.embedding %ids, %wte : tensor<2x4xi32>, tensor<16x8xf32> -> tensor<2x4x8xf32>
  %x = plan.pos_embedding %e, %wpe : tensor<2x4x8xf32>, tensor<4x8xf32>
  %n = plan.layernorm %x, %g, %bb : tensor<2x4x8xf32>, tensor<8xf32>
  %qkv = plan.matmul %n, %wqkv : tensor<2x4x8xf32>, tensor<8x16xf32> -> tensor<2x4x16xf32>
  %a = plan.attention %qkv {num_heads = 2 : i64, num_kv_heads = 1 : i64} : tensor<2x4x16xf32> -> tensor<2x4x8xf32>
  %h = plan.add %x, %a : tensor<2x4x8xf32>
  %logits = plan.matmul %h, %wte {transpose_rhs} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
  %l = plan.cross_entropy %logits, %tgt : tensor<2x4x16xf32>, tensor<2x4xi32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK: rank.input_decl @ids : memref<1x4xi32> role "input" batch_axis "dp"
// CHECK: func.func @plan_step()
// CHECK: %[[IDS:.*]] = rank.input @ids : memref<1x4xi32>
// CHECK: rank.embedding %[[IDS]], %{{.*}} into %{{.*}} : memref<1x4xi32>, memref<16x8xf32> -> memref<1x4x8xf32>
// CHECK: rank.pos_embedding
// CHECK: rank.layernorm {{.*}} {eps = 9.99999974E-6 : f32}
// CHECK: rank.attention {{.*}} {num_heads = 2 : i64, num_kv_heads = 1 : i64} : memref<1x4x16xf32> -> memref<1x4x8xf32>
// Cross-entropy is scaled by 1 / (global positions) = 1/8.
// CHECK: rank.cross_entropy {{.*}} {scale = 1.250000e-01 : f32}
// The prediction is offered to the runtime for checking against references.
// CHECK-NEXT: rank.observe %{{.*}} as "logits" : memref<1x4x16xf32>
// CHECK: rank.cross_entropy_grad {{.*}} {scale = 1.250000e-01 : f32}
// The tied table's gradient: the LM head's term is computed into the
// table's slot of the bucket, and the embedding's scatter added to it there
// (no zeroed table, no sum).
// CHECK: %[[GW:.*]] = rank.subview %{{.*}}[{{[0-9]+}}] : memref<{{[0-9]+}}xf32> -> memref<16x8xf32>
// CHECK-NEXT: rank.matmul %{{.*}}, %{{.*}} into %[[GW]] {transpose_lhs = true, transpose_rhs = false} : memref<1x4x16xf32>, memref<1x4x8xf32> -> memref<16x8xf32>
// CHECK: rank.attention_grad
// CHECK: rank.layernorm_grad
// CHECK: rank.pos_embedding_grad
// CHECK-NOT: rank.add
// CHECK: rank.embedding_grad_add %[[IDS]], %{{.*}} into %[[GW]] : memref<1x4xi32>, memref<1x4x8xf32> -> memref<16x8xf32>
// CHECK-NOT: rank.embedding_grad
// CHECK: rank.all_reduce_start %{{.*}} over ["dp"] slot 0
// CHECK: rank.collective_wait slot 0
// CHECK: rank.fill %[[SQ:.*]] {value = 0.000000e+00 : f32} : memref<f32>
// CHECK-NEXT: rank.sumsq_accumulate %[[GW]] into %[[SQ]]
// Gradients are observed whole and before clipping; each AdamW update
// clips its own gradient (no separate pass over it).
// CHECK: rank.observe %[[GW]] as "grad/wte" : memref<16x8xf32>
// CHECK-NOT: rank.clip_by_global_norm
// CHECK: rank.adamw_update %{{.*}}, %[[GW]], %{{.*}}, %{{.*}} clipped by %[[NORM:[0-9]+]] {{{.*}}max_norm = 1.000000e+00 : f32{{.*}}} : memref<16x8xf32>, memref<16x8xf32>, memref<16x8xf32>, memref<16x8xf32>, memref<f32>
// CHECK-NOT: rank.clip_by_global_norm
// CHECK: rank.report_loss
// CHECK-NEXT: rank.report_grad_norm

// EMITC: emitc.func @plan_forward(
// EMITC: "planrt::observe"{{.*}}logits
// EMITC: emitc.func @plan_step(
// EMITC: planrt::attention_grad
// EMITC: planrt::adamw_update_clipped
// EMITC: planrt::report_grad_norm
// EMITC: emitc.func @plan_setup(
// EMITC: planrt::set_input_dtype
// EMITC: "planrt::set_forward"{{.*}}#emitc.opaque<"plan_forward">
