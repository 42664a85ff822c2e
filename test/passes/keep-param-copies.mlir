// RUN: plan-opt %s --split-input-file --plan-keep-param-copies | FileCheck %s
// RUN: plan-opt %s --split-input-file --plan-keep-param-copies="enabled=false" | FileCheck %s --check-prefix=OFF

// A weight cast to bf16 in the forward and again in the backward, updated
// by AdamW: one copy kept across steps, read where the casts' buffers were,
// written by the update; the evaluation reads it too. The runtime's
// parameter bytes count the copy (8 x 4 x 2 bytes).
rank.param_decl @w : memref<8x4xf32> init <normal, 0.0, 0.02>
rank.state_decl @w.m : memref<8x4xf32>
rank.state_decl @w.v : memref<8x4xf32>
func.func @plan_step() attributes {rank.expected_bytes = array<i64: 128, 128, 256>} {
  %w = rank.param @w : memref<8x4xf32>
  %m = rank.state @w.m : memref<8x4xf32>
  %v = rank.state @w.v : memref<8x4xf32>
  %x = rank.alloc : memref<2x8xbf16>
  %c1 = rank.alloc : memref<8x4xbf16>
  rank.cast %w into %c1 : memref<8x4xf32> -> memref<8x4xbf16>
  %y = rank.alloc : memref<2x4xbf16>
  rank.matmul %x, %c1 into %y {transpose_lhs = false, transpose_rhs = false} : memref<2x8xbf16>, memref<8x4xbf16> -> memref<2x4xbf16>
  rank.dealloc %c1 : memref<8x4xbf16>
  %c2 = rank.alloc : memref<8x4xbf16>
  rank.cast %w into %c2 : memref<8x4xf32> -> memref<8x4xbf16>
  %dx = rank.alloc : memref<2x8xbf16>
  rank.matmul %y, %c2 into %dx {transpose_lhs = false, transpose_rhs = true} : memref<2x4xbf16>, memref<8x4xbf16> -> memref<2x8xbf16>
  rank.dealloc %c2 : memref<8x4xbf16>
  %g = rank.alloc : memref<8x4xf32>
  rank.adamw_update %w, %g, %m, %v {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, weight_decay = 0.1 : f32} : memref<8x4xf32>, memref<8x4xf32>, memref<8x4xf32>, memref<8x4xf32>
  return
}
func.func @plan_forward() {
  %w = rank.param @w : memref<8x4xf32>
  %x = rank.alloc : memref<2x8xbf16>
  %c = rank.alloc : memref<8x4xbf16>
  rank.cast %w into %c : memref<8x4xf32> -> memref<8x4xbf16>
  %y = rank.alloc : memref<2x4xbf16>
  rank.matmul %x, %c into %y {transpose_lhs = false, transpose_rhs = false} : memref<2x8xbf16>, memref<8x4xbf16> -> memref<2x4xbf16>
  return
}
// CHECK: rank.param_decl @w : memref<8x4xf32> init <normal, 0.000000e+00, 2.000000e-02> copy bf16
// CHECK-LABEL: func.func @plan_step
// CHECK-SAME: rank.expected_bytes = array<i64: 192, 128, 256>
// CHECK: %[[W:.*]] = rank.param @w : memref<8x4xf32>
// CHECK-NEXT: %[[C:.*]] = rank.param_copy @w : memref<8x4xbf16>
// CHECK-NOT: rank.cast
// CHECK: rank.matmul %{{.*}}, %[[C]] into
// CHECK: rank.matmul %{{.*}}, %[[C]] into
// CHECK-NOT: rank.dealloc %[[C]]
// CHECK: rank.adamw_update %[[W]], %{{.*}}, %{{.*}}, %{{.*}} copy %[[C]] {{.*}} copy memref<8x4xbf16>
// CHECK-LABEL: func.func @plan_forward
// CHECK: %[[FC:.*]] = rank.param_copy @w : memref<8x4xbf16>
// CHECK-NOT: rank.cast
// CHECK: rank.matmul %{{.*}}, %[[FC]] into
// OFF-NOT: copy
// OFF: rank.cast
// OFF: rank.cast
// OFF: rank.adamw_update
// OFF-NOT: copy

// -----

// SGD, and pipeline stages' parameters: the bytes grow on the coordinate
// that owns stage 3 of 2 coordinates (3 mod 2 = 1), and on every one for
// stage -1 (a weight tied across stages); the copy carries the stage.
rank.param_decl @w : memref<4xf32> init <zeros> {rank.stage = 3 : i64}
rank.param_decl @t : memref<8xf32> init <zeros> {rank.stage = -1 : i64}
func.func @plan_step() attributes {rank.expected_bytes = array<i64: 32, 0, 0, 48, 16, 0>} {
  %w = rank.param @w {rank.stage = 3 : i64} : memref<4xf32>
  %c = rank.alloc : memref<4xf16>
  rank.cast %w into %c : memref<4xf32> -> memref<4xf16>
  %g = rank.alloc : memref<4xf32>
  rank.sgd_update %w, %g {lr = 1.0e-1 : f32} : memref<4xf32>, memref<4xf32>
  %t = rank.param @t : memref<8xf32>
  %ct = rank.alloc : memref<8xbf16>
  rank.cast %t into %ct : memref<8xf32> -> memref<8xbf16>
  %gt = rank.alloc : memref<8xf32>
  rank.sgd_update %t, %gt {lr = 1.0e-1 : f32} : memref<8xf32>, memref<8xf32>
  return
}
// CHECK: rank.param_decl @w : memref<4xf32> init <zeros> copy f16
// CHECK-SAME: rank.stage = 3
// CHECK: rank.param_decl @t : memref<8xf32> init <zeros> copy bf16
// CHECK-LABEL: func.func @plan_step
// CHECK-SAME: array<i64: 48, 0, 0, 72, 16, 0>
// CHECK: %[[C:.*]] = rank.param_copy @w {rank.stage = 3 : i64} : memref<4xf16>
// CHECK: rank.sgd_update %{{.*}}, %{{.*}} copy %[[C]] {lr = {{.*}}} : memref<4xf32>, memref<4xf32>, memref<4xf16>
// CHECK: %[[T:.*]] = rank.param_copy @t : memref<8xbf16>
// CHECK: rank.sgd_update %{{.*}}, %{{.*}} copy %[[T]] {lr = {{.*}}} : memref<8xf32>, memref<8xf32>, memref<8xbf16>

// -----

// Kept as they are: a cast after the update (it reads the new weight), a
// weight something else writes too, a cast buffer something else writes
// (also through a view), an update of a slice (a view), casts to two
// types, and a cast buffer read after the update (it holds the old
// weight, the copy the new one).
rank.param_decl @a : memref<4xf32> init <zeros>
rank.param_decl @b : memref<4xf32> init <zeros>
rank.param_decl @c : memref<4xf32> init <zeros>
rank.param_decl @d : memref<4xf32> init <zeros>
rank.param_decl @e : memref<4xf32> init <zeros>
rank.param_decl @f : memref<4xf32> init <zeros>
rank.param_decl @h : memref<4xf32> init <zeros>
func.func @plan_step() {
  %g = rank.alloc : memref<4xf32>
  %a = rank.param @a : memref<4xf32>
  rank.sgd_update %a, %g {lr = 1.0e-1 : f32} : memref<4xf32>, memref<4xf32>
  %ca = rank.alloc : memref<4xbf16>
  rank.cast %a into %ca : memref<4xf32> -> memref<4xbf16>
  %b = rank.param @b : memref<4xf32>
  %cb = rank.alloc : memref<4xbf16>
  rank.cast %b into %cb : memref<4xf32> -> memref<4xbf16>
  rank.scale %g into %b {factor = 2.0 : f32} : memref<4xf32> -> memref<4xf32>
  rank.sgd_update %b, %g {lr = 1.0e-1 : f32} : memref<4xf32>, memref<4xf32>
  %c = rank.param @c : memref<4xf32>
  %cc = rank.alloc : memref<4xbf16>
  rank.cast %c into %cc : memref<4xf32> -> memref<4xbf16>
  %x = rank.alloc : memref<4xbf16>
  rank.scale %x into %cc {factor = 2.0 : f32} : memref<4xbf16> -> memref<4xbf16>
  rank.sgd_update %c, %g {lr = 1.0e-1 : f32} : memref<4xf32>, memref<4xf32>
  %d = rank.param @d : memref<4xf32>
  %cd = rank.alloc : memref<4xbf16>
  rank.cast %d into %cd : memref<4xf32> -> memref<4xbf16>
  %dh = rank.subview %d[2] : memref<4xf32> -> memref<2xf32>
  %gh = rank.alloc : memref<2xf32>
  rank.sgd_update %dh, %gh {lr = 1.0e-1 : f32} : memref<2xf32>, memref<2xf32>
  %e = rank.param @e : memref<4xf32>
  %ce1 = rank.alloc : memref<4xbf16>
  rank.cast %e into %ce1 : memref<4xf32> -> memref<4xbf16>
  %ce2 = rank.alloc : memref<4xf16>
  rank.cast %e into %ce2 : memref<4xf32> -> memref<4xf16>
  rank.sgd_update %e, %g {lr = 1.0e-1 : f32} : memref<4xf32>, memref<4xf32>
  %f = rank.param @f : memref<4xf32>
  %cf = rank.alloc : memref<4xbf16>
  rank.cast %f into %cf : memref<4xf32> -> memref<4xbf16>
  %vf = rank.view %cf : memref<4xbf16> -> memref<2x2xbf16>
  rank.fill %vf {value = 0.0 : f32} : memref<2x2xbf16>
  rank.sgd_update %f, %g {lr = 1.0e-1 : f32} : memref<4xf32>, memref<4xf32>
  %h = rank.param @h : memref<4xf32>
  %ch = rank.alloc : memref<4xbf16>
  rank.cast %h into %ch : memref<4xf32> -> memref<4xbf16>
  rank.sgd_update %h, %g {lr = 1.0e-1 : f32} : memref<4xf32>, memref<4xf32>
  %yh = rank.alloc : memref<4xbf16>
  rank.scale %ch into %yh {factor = 2.0 : f32} : memref<4xbf16> -> memref<4xbf16>
  return
}
// CHECK-NOT: copy
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: param_copy
// CHECK-COUNT-8: rank.cast
// CHECK-NOT: copy

// -----

// ZeRO (the plan's zero_stage > 0): the casts of the shards stay.
plan.parallel {zero_stage = 1 : i64}
rank.param_decl @w : memref<4xf32> init <zeros>
func.func @plan_step() {
  %w = rank.param @w : memref<4xf32>
  %c = rank.alloc : memref<4xbf16>
  rank.cast %w into %c : memref<4xf32> -> memref<4xbf16>
  %g = rank.alloc : memref<4xf32>
  rank.sgd_update %w, %g {lr = 1.0e-1 : f32} : memref<4xf32>, memref<4xf32>
  return
}
// CHECK-NOT: copy
// CHECK: rank.cast
