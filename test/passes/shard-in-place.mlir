// RUN: plan-opt %s --plan-shard-in-place --split-input-file | FileCheck %s

// A ZeRO update as plan-lower-to-rank emits it: the shard is copied out of
// the parameter, updated, gathered into a new buffer and copied back. It
// becomes an update through a view of the parameter and a gather in place.
// CHECK-LABEL: func.func @plan_step(
// CHECK: %[[W:.*]] = rank.param @w
// CHECK: %[[S:.*]] = rank.shard_view %[[W]] over "dp" : memref<8x4xf32> -> memref<4x4xf32>
// CHECK-NEXT: rank.adamw_update %[[S]],
// CHECK-NEXT: rank.all_gather %[[S]] into %[[W]] dim 0 over "dp"
// CHECK-NOT: rank.copy
// CHECK-NOT: rank.shard_slice
// CHECK: return
rank.param_decl @w : memref<8x4xf32> init <zeros>
func.func @plan_step() {
  %w = rank.param @w : memref<8x4xf32>
  %g = rank.alloc : memref<4x4xf32>
  %m = rank.alloc : memref<4x4xf32>
  %v = rank.alloc : memref<4x4xf32>
  %s = rank.alloc : memref<4x4xf32>
  rank.shard_slice %w into %s dim 0 over "dp" : memref<8x4xf32> -> memref<4x4xf32>
  rank.adamw_update %s, %g, %m, %v {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, weight_decay = 0.1 : f32} : memref<4x4xf32>, memref<4x4xf32>, memref<4x4xf32>, memref<4x4xf32>
  %f = rank.alloc : memref<8x4xf32>
  rank.all_gather %s into %f dim 0 over "dp" : memref<4x4xf32> -> memref<8x4xf32>
  rank.copy %f into %w : memref<8x4xf32> -> memref<8x4xf32>
  return
}

// -----

// A shard along dimension 1 stays a copy, but its gather still writes the
// parameter (no copy back). A whole gradient slice (ZeRO-1) that nothing
// reads afterwards becomes a view of its bucket.
// CHECK-LABEL: func.func @plan_step(
// CHECK: %[[W:.*]] = rank.param @w
// CHECK: %[[G:.*]] = rank.subview %[[BUCKET:.*]][32]
// CHECK: %[[GS:.*]] = rank.shard_view %[[G]] over "dp"
// CHECK-NEXT: %[[GV:.*]] = rank.view %[[GS]]
// CHECK: rank.shard_slice %[[W]] into %[[S:.*]] dim 1
// CHECK: rank.adamw_update %[[S]], %[[GV]],
// CHECK: rank.all_gather %[[S]] into %[[W]] dim 1 over "dp"
// CHECK-NOT: rank.copy
rank.param_decl @w : memref<8x4xf32> init <zeros>
func.func @plan_step() {
  %w = rank.param @w : memref<8x4xf32>
  %bucket = rank.alloc : memref<64xf32>
  %gw = rank.subview %bucket[32] : memref<64xf32> -> memref<8x4xf32>
  rank.all_reduce %bucket over ["dp"] : memref<64xf32>
  %gs = rank.alloc : memref<4x4xf32>
  rank.shard_slice %gw into %gs dim 0 over "dp" : memref<8x4xf32> -> memref<4x4xf32>
  %gv = rank.view %gs : memref<4x4xf32> -> memref<8x2xf32>
  %m = rank.alloc : memref<8x2xf32>
  %v = rank.alloc : memref<8x2xf32>
  %s = rank.alloc : memref<8x2xf32>
  rank.shard_slice %w into %s dim 1 over "dp" : memref<8x4xf32> -> memref<8x2xf32>
  rank.adamw_update %s, %gv, %m, %v {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, weight_decay = 0.1 : f32} : memref<8x2xf32>, memref<8x2xf32>, memref<8x2xf32>, memref<8x2xf32>
  %f = rank.alloc : memref<8x4xf32>
  rank.all_gather %s into %f dim 1 over "dp" : memref<8x2xf32> -> memref<8x4xf32>
  rank.copy %f into %w : memref<8x4xf32> -> memref<8x4xf32>
  return
}

// -----

// What another op reads in between keeps its copies: the parameter is
// observed between the gather and the copy back, and the bucket's gradient
// is read again after its slice is taken.
// CHECK-LABEL: func.func @plan_step(
// CHECK: rank.shard_slice %{{.*}} into %{{.*}} dim 0
// CHECK: rank.shard_slice %{{.*}} into %{{.*}} dim 0
// CHECK: rank.all_gather %{{.*}} into %[[F:.*]] dim 0
// CHECK: rank.observe
// CHECK: rank.copy %[[F]] into
rank.param_decl @w : memref<8x4xf32> init <zeros>
func.func @plan_step() {
  %w = rank.param @w : memref<8x4xf32>
  %gw = rank.alloc : memref<8x4xf32>
  %gs = rank.alloc : memref<4x4xf32>
  rank.shard_slice %gw into %gs dim 0 over "dp" : memref<8x4xf32> -> memref<4x4xf32>
  %m = rank.alloc : memref<4x4xf32>
  %v = rank.alloc : memref<4x4xf32>
  %s = rank.alloc : memref<4x4xf32>
  rank.shard_slice %w into %s dim 0 over "dp" : memref<8x4xf32> -> memref<4x4xf32>
  rank.adamw_update %s, %gs, %m, %v {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, weight_decay = 0.1 : f32} : memref<4x4xf32>, memref<4x4xf32>, memref<4x4xf32>, memref<4x4xf32>
  rank.fill %gw {value = 0.0 : f32} : memref<8x4xf32>
  %f = rank.alloc : memref<8x4xf32>
  rank.all_gather %s into %f dim 0 over "dp" : memref<4x4xf32> -> memref<8x4xf32>
  rank.observe %w as "w" : memref<8x4xf32>
  rank.copy %f into %w : memref<8x4xf32> -> memref<8x4xf32>
  return
}
