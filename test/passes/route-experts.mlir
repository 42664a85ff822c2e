// RUN: plan-opt %s --plan-route-experts --split-input-file | FileCheck %s

// Expert parallelism's collectives over ep as the sharding engine derives
// them (gathers of the experts' input, choices and gates; reduce-scatters of
// their partial output and gradients), and what plan-route-experts makes of
// them: the token gathers that only expert ops read and the reduce-scatters
// of what one expert op wrote become routed by the gathered choices; the
// choices' own gather stays. The input's gather, which came before the
// choices' gather, moves after it.
plan.mesh @mesh axes = ["ep"] shape = [2]
// CHECK-LABEL: func.func @routed
func.func @routed() {
  %x = rank.alloc : memref<2x4x8xf32>
  %c = rank.alloc : memref<2x4x2xi32>
  %g = rank.alloc : memref<2x4x2xf32>
  %dy = rank.alloc : memref<2x4x8xf32>
  %up = rank.alloc : memref<2x8x6xf32>
  %down = rank.alloc : memref<2x6x8xf32>
  %dup = rank.alloc : memref<2x8x6xf32>
  %ddown = rank.alloc : memref<2x6x8xf32>
  %xg = rank.alloc : memref<4x4x8xf32>
  rank.all_gather %x into %xg dim 0 over "ep" : memref<2x4x8xf32> -> memref<4x4x8xf32>
  %cg = rank.alloc : memref<4x4x2xi32>
  rank.all_gather %c into %cg dim 0 over "ep" : memref<2x4x2xi32> -> memref<4x4x2xi32>
  %gg = rank.alloc : memref<4x4x2xf32>
  rank.all_gather %g into %gg dim 0 over "ep" : memref<2x4x2xf32> -> memref<4x4x2xf32>
  %y = rank.alloc : memref<4x4x8xf32>
  rank.moe_experts %xg, %cg, %gg, %up, %down into %y {expert_axis = "ep"} : memref<4x4x8xf32>, memref<4x4x2xi32>, memref<4x4x2xf32>, memref<2x8x6xf32>, memref<2x6x8xf32> -> memref<4x4x8xf32>
  %ys = rank.alloc : memref<2x4x8xf32>
  rank.reduce_scatter %y into %ys dim 0 over "ep" : memref<4x4x8xf32> -> memref<2x4x8xf32>
  %dyg = rank.alloc : memref<4x4x8xf32>
  rank.all_gather %dy into %dyg dim 0 over "ep" : memref<2x4x8xf32> -> memref<4x4x8xf32>
  %dx = rank.alloc : memref<4x4x8xf32>
  %dg = rank.alloc : memref<4x4x2xf32>
  rank.moe_experts_grad %xg, %cg, %gg, %dyg, %up, %down into %dx, %dg, %dup, %ddown {expert_axis = "ep"} : memref<4x4x8xf32>, memref<4x4x2xi32>, memref<4x4x2xf32>, memref<4x4x8xf32>, memref<2x8x6xf32>, memref<2x6x8xf32>, memref<4x4x8xf32>, memref<4x4x2xf32>, memref<2x8x6xf32>, memref<2x6x8xf32>
  %dxs = rank.alloc : memref<2x4x8xf32>
  rank.reduce_scatter %dx into %dxs dim 0 over "ep" : memref<4x4x8xf32> -> memref<2x4x8xf32>
  %dgs = rank.alloc : memref<2x4x2xf32>
  rank.reduce_scatter %dg into %dgs dim 0 over "ep" : memref<4x4x2xf32> -> memref<2x4x2xf32>
  return
}
// CHECK: %[[X:.*]] = rank.alloc : memref<2x4x8xf32>
// CHECK: %[[XG:.*]] = rank.alloc : memref<4x4x8xf32>
// CHECK-NEXT: %[[CG:.*]] = rank.alloc : memref<4x4x2xi32>
// CHECK-NEXT: rank.all_gather %{{.*}} into %[[CG]] dim 0 over "ep"
// CHECK-NEXT: rank.routed_all_gather %[[X]] routed by %[[CG]] into %[[XG]] over "ep" {experts_per_rank = 2 : i64} : memref<2x4x8xf32>, memref<4x4x2xi32> -> memref<4x4x8xf32>
// CHECK: rank.routed_all_gather %{{.*}} routed by %[[CG]] into %[[GG:.*]] over "ep"
// CHECK: rank.moe_experts %[[XG]], %[[CG]], %[[GG]]
// CHECK: rank.routed_reduce_scatter %{{.*}} routed by %[[CG]] into %{{.*}} over "ep" {experts_per_rank = 2 : i64} : memref<4x4x8xf32>, memref<4x4x2xi32> -> memref<2x4x8xf32>
// CHECK: rank.routed_all_gather %{{.*}} routed by %[[CG]] into %[[DYG:.*]] over "ep"
// CHECK: rank.moe_experts_grad %[[XG]], %[[CG]], %[[GG]], %[[DYG]]
// CHECK: rank.routed_reduce_scatter %{{.*}} routed by %[[CG]]
// CHECK: rank.routed_reduce_scatter %{{.*}} routed by %[[CG]]
// CHECK-NOT: rank.all_gather
// CHECK-NOT: rank.reduce_scatter
// CHECK: return

// -----

// What must stay dense: a gathered input that another op reads too (every
// row of it is read), a reduce-scatter of a sum that another op also
// wrote into, a gather over another axis, and a gather whose input is
// written between it and the choices' gather (moving it would read the new
// values).
plan.mesh @mesh axes = ["dp", "ep"] shape = [2, 2]
// CHECK-LABEL: func.func @dense
func.func @dense() {
  %x = rank.alloc : memref<2x4x8xf32>
  %c = rank.alloc : memref<2x4x2xi32>
  %g = rank.alloc : memref<2x4x2xf32>
  %up = rank.alloc : memref<2x8x6xf32>
  %down = rank.alloc : memref<2x6x8xf32>
  // CHECK: rank.all_gather %{{.*}} dim 0 over "ep" : memref<2x4x8xf32>
  %xg = rank.alloc : memref<4x4x8xf32>
  rank.all_gather %x into %xg dim 0 over "ep" : memref<2x4x8xf32> -> memref<4x4x8xf32>
  // CHECK: rank.all_gather %{{.*}} dim 0 over "ep" : memref<2x4x2xf32>
  %gg = rank.alloc : memref<4x4x2xf32>
  rank.all_gather %g into %gg dim 0 over "ep" : memref<2x4x2xf32> -> memref<4x4x2xf32>
  rank.relu %g into %g : memref<2x4x2xf32> -> memref<2x4x2xf32>
  %cg = rank.alloc : memref<4x4x2xi32>
  rank.all_gather %c into %cg dim 0 over "ep" : memref<2x4x2xi32> -> memref<4x4x2xi32>
  %y = rank.alloc : memref<4x4x8xf32>
  rank.moe_experts %xg, %cg, %gg, %up, %down into %y {expert_axis = "ep"} : memref<4x4x8xf32>, memref<4x4x2xi32>, memref<4x4x2xf32>, memref<2x8x6xf32>, memref<2x6x8xf32> -> memref<4x4x8xf32>
  %r = rank.alloc : memref<4x4x8xf32>
  rank.relu %xg into %r : memref<4x4x8xf32> -> memref<4x4x8xf32>
  rank.add %y, %r into %y : memref<4x4x8xf32>, memref<4x4x8xf32> -> memref<4x4x8xf32>
  // CHECK: rank.reduce_scatter %{{.*}} dim 0 over "ep"
  %ys = rank.alloc : memref<2x4x8xf32>
  rank.reduce_scatter %y into %ys dim 0 over "ep" : memref<4x4x8xf32> -> memref<2x4x8xf32>
  // CHECK: rank.all_gather %{{.*}} dim 0 over "dp"
  %xd = rank.alloc : memref<4x4x8xf32>
  rank.all_gather %x into %xd dim 0 over "dp" : memref<2x4x8xf32> -> memref<4x4x8xf32>
  %y2 = rank.alloc : memref<4x4x8xf32>
  rank.moe_experts %xd, %cg, %gg, %up, %down into %y2 {expert_axis = "ep"} : memref<4x4x8xf32>, memref<4x4x2xi32>, memref<4x4x2xf32>, memref<2x8x6xf32>, memref<2x6x8xf32> -> memref<4x4x8xf32>
  // CHECK-NOT: routed
  return
}

// -----

// ep_comm = all_gather keeps every collective dense.
plan.mesh @mesh axes = ["ep"] shape = [2]
plan.parallel {ep_comm = "all_gather"}
// CHECK-LABEL: func.func @all_gather_dispatcher
func.func @all_gather_dispatcher() {
  %x = rank.alloc : memref<2x4x8xf32>
  %c = rank.alloc : memref<2x4x2xi32>
  %g = rank.alloc : memref<2x4x2xf32>
  %up = rank.alloc : memref<2x8x6xf32>
  %down = rank.alloc : memref<2x6x8xf32>
  %cg = rank.alloc : memref<4x4x2xi32>
  rank.all_gather %c into %cg dim 0 over "ep" : memref<2x4x2xi32> -> memref<4x4x2xi32>
  %xg = rank.alloc : memref<4x4x8xf32>
  rank.all_gather %x into %xg dim 0 over "ep" : memref<2x4x8xf32> -> memref<4x4x8xf32>
  %gg = rank.alloc : memref<4x4x2xf32>
  rank.all_gather %g into %gg dim 0 over "ep" : memref<2x4x2xf32> -> memref<4x4x2xf32>
  %y = rank.alloc : memref<4x4x8xf32>
  rank.moe_experts %xg, %cg, %gg, %up, %down into %y {expert_axis = "ep"} : memref<4x4x8xf32>, memref<4x4x2xi32>, memref<4x4x2xf32>, memref<2x8x6xf32>, memref<2x6x8xf32> -> memref<4x4x8xf32>
  %ys = rank.alloc : memref<2x4x8xf32>
  rank.reduce_scatter %y into %ys dim 0 over "ep" : memref<4x4x8xf32> -> memref<2x4x8xf32>
  // CHECK-NOT: routed
  return
}
