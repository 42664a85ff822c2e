// RUN: plan-opt %s | plan-opt | FileCheck %s

// CHECK: rank.param_decl @w : memref<4x2xf32> init <normal, 0.000000e+00, 5.000000e-01>
rank.param_decl @w : memref<4x2xf32> init <normal, 0.0, 0.5>
// CHECK: rank.input_decl @x : memref<4x4xf32> role "input" batch_axis "dp"
rank.input_decl @x : memref<4x4xf32> role "input" batch_axis "dp"
// CHECK: rank.input_decl @y : memref<4x2xf32> role "label"{{$}}
rank.input_decl @y : memref<4x2xf32> role "label"
func.func @step() {
  // CHECK: rank.input @x : memref<4x4xf32>
  %x = rank.input @x : memref<4x4xf32>
  %y = rank.input @y : memref<4x2xf32>
  // CHECK: rank.param @w : memref<4x2xf32>
  %w = rank.param @w : memref<4x2xf32>
  // CHECK: rank.alloc : memref<4x2xf32>
  %t = rank.alloc : memref<4x2xf32>
  // CHECK: rank.matmul %{{.*}}, %{{.*}} into %{{.*}} {transpose_lhs = false, transpose_rhs = false}
  rank.matmul %x, %w into %t {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> -> memref<4x2xf32>
  // CHECK: rank.matmul_bias %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}} {transpose_lhs = false, transpose_rhs = true}
  %w2 = rank.alloc : memref<2x4xf32>
  %bias2 = rank.alloc : memref<2xf32>
  rank.matmul_bias %x, %w2, %bias2 into %t {transpose_lhs = false, transpose_rhs = true} : memref<4x4xf32>, memref<2x4xf32>, memref<2xf32> -> memref<4x2xf32>
  %g2 = rank.alloc : memref<4x2xf32>
  // CHECK: rank.matmul_bias_gelu %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}}, %{{.*}} {transpose_lhs = false, transpose_rhs = true}
  rank.matmul_bias_gelu %x, %w2, %bias2 into %t, %g2 {transpose_lhs = false, transpose_rhs = true} : memref<4x4xf32>, memref<2x4xf32>, memref<2xf32> -> memref<4x2xf32>, memref<4x2xf32>
  %d2 = rank.alloc : memref<4x2xf32>
  // CHECK: rank.matmul_dgelu %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}} {transpose_lhs = false, transpose_rhs = true}
  rank.matmul_dgelu %x, %w2, %t into %d2 {transpose_lhs = false, transpose_rhs = true} : memref<4x4xf32>, memref<2x4xf32>, memref<4x2xf32> -> memref<4x2xf32>
  %dw = rank.alloc : memref<4x2xf32>
  %db = rank.alloc : memref<2xf32>
  // CHECK: rank.matmul_bias_grad %{{.*}}, %{{.*}} into %{{.*}}, %{{.*}} {transpose_lhs = true, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> -> memref<4x2xf32>, memref<2xf32>
  rank.matmul_bias_grad %x, %t into %dw, %db {transpose_lhs = true, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> -> memref<4x2xf32>, memref<2xf32>
  %l = rank.alloc : memref<f32>
  %logits = rank.alloc : memref<4x8xbf16>
  %ids = rank.alloc : memref<4xi32>
  // CHECK: rank.cross_entropy_in_place %{{.*}}, %{{.*}} into %{{.*}} {grad_scale = 2.500000e-01 : f32, scale = 5.000000e-01 : f32, valid_classes = 7 : i64} : memref<4x8xbf16>, memref<4xi32> -> memref<f32>
  rank.cross_entropy_in_place %logits, %ids into %l {scale = 0.5 : f32, grad_scale = 0.25 : f32, valid_classes = 7} : memref<4x8xbf16>, memref<4xi32> -> memref<f32>
  // CHECK: rank.mse_loss {{.*}} {scale = 1.250000e-01 : f32}
  rank.mse_loss %t, %y into %l {scale = 0.125 : f32} : memref<4x2xf32>, memref<4x2xf32> -> memref<f32>
  // CHECK: rank.all_reduce %{{.*}} over ["dp"] : memref<f32>
  rank.all_reduce %l over ["dp"] : memref<f32>
  // CHECK: rank.sgd_update
  rank.sgd_update %w, %w {lr = 0.1 : f32} : memref<4x2xf32>, memref<4x2xf32>
  // CHECK: rank.report_loss
  rank.report_loss %l : memref<f32>
  return
}

// AdamW, plain and clipping its gradient by a global sum of squares.
// CHECK-LABEL: func.func @adamw(
// CHECK: rank.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {beta1 = {{.*}}} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32>{{$}}
// CHECK: rank.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} clipped by %{{.*}} {{{.*}}max_norm = 1.000000e+00 : f32{{.*}}} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<f32>
func.func @adamw(%w: memref<4xf32>, %g: memref<4xf32>, %m: memref<4xf32>, %v: memref<4xf32>, %sq: memref<f32>) {
  rank.adamw_update %w, %g, %m, %v {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, weight_decay = 0.1 : f32} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32>
  rank.adamw_update %w, %g, %m, %v clipped by %sq {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, max_norm = 1.0 : f32, weight_decay = 0.1 : f32} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<f32>
  return
}

// A parameter with a kept 16-bit copy (plan-keep-param-copies): its
// declaration, the copy, and the updates that write it.
// CHECK: rank.param_decl @wc : memref<4xf32> init <zeros> copy bf16
rank.param_decl @wc : memref<4xf32> init <zeros> copy bf16
// CHECK-LABEL: func.func @copies(
// CHECK: %[[C:.*]] = rank.param_copy @wc : memref<4xbf16>
// CHECK: rank.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} clipped by %{{.*}} copy %[[C]] {{{.*}}} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<f32> copy memref<4xbf16>
// CHECK: rank.adamw_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} copy %[[C]] {{{.*}}} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32> copy memref<4xbf16>
// CHECK: rank.sgd_update %{{.*}}, %{{.*}} copy %[[C]] {lr = {{.*}}} : memref<4xf32>, memref<4xf32>, memref<4xbf16>
func.func @copies(%g: memref<4xf32>, %m: memref<4xf32>, %v: memref<4xf32>, %sq: memref<f32>) {
  %w = rank.param @wc : memref<4xf32>
  %c = rank.param_copy @wc : memref<4xbf16>
  rank.adamw_update %w, %g, %m, %v clipped by %sq copy %c {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, max_norm = 1.0 : f32, weight_decay = 0.1 : f32} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<f32> copy memref<4xbf16>
  rank.adamw_update %w, %g, %m, %v copy %c {beta1 = 0.9 : f32, beta2 = 0.95 : f32, eps = 1.0e-8 : f32, lr = 1.0e-3 : f32, weight_decay = 0.1 : f32} : memref<4xf32>, memref<4xf32>, memref<4xf32>, memref<4xf32> copy memref<4xbf16>
  rank.sgd_update %w, %g copy %c {lr = 0.1 : f32} : memref<4xf32>, memref<4xf32>, memref<4xbf16>
  return
}

// Batch norm's running statistics: model state with an initializer, the
// sums and the in-place update of a step, and evaluation with them.
// CHECK: rank.state_decl @bn.running_mean : memref<4xf32> buffer init <zeros>
rank.state_decl @bn.running_mean : memref<4xf32> buffer init <zeros>
// CHECK: rank.state_decl @bn.running_var : memref<4xf32> buffer init <ones>
rank.state_decl @bn.running_var : memref<4xf32> buffer init <ones>
func.func @bn(%x: memref<2x4x3x3xf32>, %g: memref<4xf32>) {
  %rm = rank.state @bn.running_mean : memref<4xf32>
  %rv = rank.state @bn.running_var : memref<4xf32>
  %s = rank.alloc : memref<4xf32>
  %q = rank.alloc : memref<4xf32>
  // CHECK: rank.batch_norm_moments %{{.*}} into %{{.*}}, %{{.*}} : memref<2x4x3x3xf32> -> memref<4xf32>
  rank.batch_norm_moments %x into %s, %q : memref<2x4x3x3xf32> -> memref<4xf32>
  // CHECK: rank.running_stats_update %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {count = 18 : i64, momentum = 1.000000e-01 : f32} : memref<4xf32>
  rank.running_stats_update %rm, %rv, %s, %q {count = 18 : i64, momentum = 0.1 : f32} : memref<4xf32>
  %y = rank.alloc : memref<2x4x3x3xf32>
  // CHECK: rank.batch_norm_infer %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} into %{{.*}} {eps = 9.99999974E-6 : f32} : memref<2x4x3x3xf32>, memref<4xf32>
  rank.batch_norm_infer %x, %g, %g, %rm, %rv into %y {eps = 1.0e-5 : f32} : memref<2x4x3x3xf32>, memref<4xf32>
  return
}

// The tied embedding's scatter, added into the table's other gradient.
// CHECK-LABEL: func.func @tied(
// CHECK: rank.embedding_grad_add %{{.*}}, %{{.*}} into %{{.*}} {vocab_axis = "tp"} : memref<2x4xi32>, memref<2x4x8xf32> -> memref<16x8xf32>
func.func @tied(%ids: memref<2x4xi32>, %dy: memref<2x4x8xf32>, %dw: memref<16x8xf32>) {
  rank.embedding_grad_add %ids, %dy into %dw {vocab_axis = "tp"} : memref<2x4xi32>, memref<2x4x8xf32> -> memref<16x8xf32>
  return
}
