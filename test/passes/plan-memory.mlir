// RUN: plan-opt %s --split-input-file --plan-memory | FileCheck %s

// A straight-line step: each buffer moves to its first use, lives until its
// last one, and its bytes are reused once it is dead (256-byte granules).
// mse_loss takes one granule of partial sums (its workspace), live for the
// op only. The gradients the optimizer reads are of kind "gradient".
module {
  plan.mesh @mesh axes = ["dp"] shape = [2]
  rank.input_decl @x : memref<4x4xf32> role "input" batch_axis "dp"
  rank.input_decl @y : memref<4x2xf32> role "label" batch_axis "dp"
  rank.param_decl @w : memref<4x2xf32> init <normal, 0.000000e+00, 5.000000e-01>
  func.func @plan_step() {
    %0 = rank.input @x : memref<4x4xf32>
    %1 = rank.input @y : memref<4x2xf32>
    %2 = rank.param @w : memref<4x2xf32>
    %4 = rank.alloc : memref<4x2xf32>
    %5 = rank.alloc : memref<4x2xf32>
    %7 = rank.alloc : memref<f32>
    %8 = rank.alloc : memref<4x2xf32>
    %11 = rank.alloc : memref<4x2xf32>
    rank.matmul %0, %2 into %4 {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> -> memref<4x2xf32>
    rank.relu %4 into %5 : memref<4x2xf32> -> memref<4x2xf32>
    rank.mse_loss %5, %1 into %7 {scale = 6.250000e-02 : f32} : memref<4x2xf32>, memref<4x2xf32> -> memref<f32>
    rank.mse_loss_grad %5, %1 into %8 {scale = 6.250000e-02 : f32} : memref<4x2xf32>, memref<4x2xf32> -> memref<4x2xf32>
    rank.matmul %0, %8 into %11 {transpose_lhs = true, transpose_rhs = false} : memref<4x4xf32>, memref<4x2xf32> -> memref<4x2xf32>
    rank.all_reduce %11 over ["dp"] : memref<4x2xf32>
    rank.sgd_update %2, %11 {lr = 1.000000e-01 : f32} : memref<4x2xf32>, memref<4x2xf32>
    rank.report_loss %7 : memref<f32>
    return
  }
}

// CHECK-LABEL: func.func @plan_step()
// CHECK-SAME: rank.arena_bytes = array<i64: 768>, rank.buffer_bytes = array<i64: 1536>
// CHECK: %[[A:.*]] = rank.alloc {kind = "activation", offset = 0 : i64} : memref<4x2xf32>
// CHECK-NEXT: rank.matmul %{{.*}}, %{{.*}} into %[[A]]
// CHECK-NEXT: %[[B:.*]] = rank.alloc {kind = "activation", offset = 256 : i64} : memref<4x2xf32>
// CHECK-NEXT: rank.relu %[[A]] into %[[B]]
// CHECK-NEXT: rank.dealloc %[[A]]
// CHECK-NEXT: %[[L:.*]] = rank.alloc {kind = "activation", offset = 0 : i64} : memref<f32>
// CHECK-NEXT: rank.mse_loss %[[B]], %{{.*}} into %[[L]] {rank.workspace = array<i64: 512, 256>
// CHECK-NEXT: %[[D:.*]] = rank.alloc {kind = "activation", offset = 512 : i64} : memref<4x2xf32>
// CHECK-NEXT: rank.mse_loss_grad %[[B]], %{{.*}} into %[[D]]
// CHECK-NEXT: rank.dealloc %[[B]]
// CHECK-NEXT: %[[G:.*]] = rank.alloc {kind = "gradient", offset = 256 : i64} : memref<4x2xf32>
// CHECK-NEXT: rank.matmul %{{.*}}, %[[D]] into %[[G]]
// CHECK-NEXT: rank.dealloc %[[D]]
// CHECK-NEXT: rank.all_reduce %[[G]]
// CHECK-NEXT: rank.sgd_update %{{.*}}, %[[G]]
// CHECK-NEXT: rank.dealloc %[[G]]
// CHECK-NEXT: rank.report_loss %[[L]]
// CHECK-NEXT: rank.dealloc %[[L]]
// CHECK-NEXT: return

// -----

// A microbatch loop's body is planned on its own and takes one block of the
// parent's arena while the loop runs; an accumulator allocated before the
// loop lives across it. A bucket reduced by all_reduce_start lives until
// its wait even where nothing reads it in between; its subviews are the
// gradients, so the bucket is of kind "gradient".
module {
  plan.mesh @mesh axes = ["dp"] shape = [2]
  rank.input_decl @x : memref<8x4xf32> role "input" batch_axis "dp"
  rank.param_decl @w : memref<4x4xf32> init <zeros>
  func.func @plan_step() {
    %x = rank.input @x : memref<8x4xf32>
    %w = rank.param @w : memref<4x4xf32>
    %acc = rank.alloc : memref<4x4xf32>
    rank.fill %acc {value = 0.000000e+00 : f32} : memref<4x4xf32>
    rank.microbatch_loop 2 {
    ^bb0(%mb: index):
      %xm = rank.rows %x, %mb of 2 : memref<8x4xf32> -> memref<4x4xf32>
      %h = rank.alloc : memref<4x4xf32>
      rank.matmul %xm, %w into %h {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf32>, memref<4x4xf32> -> memref<4x4xf32>
      %g = rank.alloc : memref<4x4xf32>
      rank.matmul %xm, %h into %g {transpose_lhs = true, transpose_rhs = false} : memref<4x4xf32>, memref<4x4xf32> -> memref<4x4xf32>
      rank.add %acc, %g into %acc : memref<4x4xf32>, memref<4x4xf32> -> memref<4x4xf32>
    }
    %bucket = rank.alloc : memref<16xf32>
    %gv = rank.subview %bucket[0] : memref<16xf32> -> memref<4x4xf32>
    rank.copy %acc into %gv : memref<4x4xf32> -> memref<4x4xf32>
    rank.all_reduce_start %bucket over ["dp"] slot 0 : memref<16xf32>
    %t = rank.alloc : memref<4x4xf32>
    rank.relu %w into %t : memref<4x4xf32> -> memref<4x4xf32>
    rank.collective_wait slot 0
    rank.sgd_update %w, %gv {lr = 1.000000e-01 : f32} : memref<4x4xf32>, memref<4x4xf32>
    return
  }
}

// CHECK-LABEL: func.func @plan_step()
// CHECK-SAME: rank.arena_bytes = array<i64: 768>, rank.buffer_bytes = array<i64: 1280>
// CHECK: %[[ACC:.*]] = rank.alloc {kind = "gradient", offset = 0 : i64} : memref<4x4xf32>
// CHECK-NEXT: rank.fill %[[ACC]]
// CHECK-NEXT: rank.microbatch_loop 2 {
// CHECK: %[[H:.*]] = rank.alloc {kind = "activation", offset = 256 : i64} : memref<4x4xf32>
// CHECK: %[[G:.*]] = rank.alloc {kind = "gradient", offset = 512 : i64} : memref<4x4xf32>
// CHECK-NEXT: rank.matmul %{{.*}}, %[[H]] into %[[G]]
// CHECK-NEXT: rank.dealloc %[[H]]
// CHECK-NEXT: rank.add %[[ACC]], %[[G]] into %[[ACC]]
// CHECK-NEXT: rank.dealloc %[[G]]
// CHECK-NEXT: }
// CHECK-NEXT: %[[BK:.*]] = rank.alloc {kind = "gradient", offset = 256 : i64} : memref<16xf32>
// CHECK: rank.copy %[[ACC]]
// CHECK-NEXT: rank.dealloc %[[ACC]]
// CHECK-NEXT: rank.all_reduce_start %[[BK]]
// CHECK-NEXT: %[[T:.*]] = rank.alloc {kind = "activation", offset = 0 : i64} : memref<4x4xf32>
// CHECK-NEXT: rank.relu
// CHECK-NEXT: rank.dealloc %[[T]]
// CHECK-NEXT: rank.collective_wait slot 0
// CHECK-NEXT: rank.sgd_update %{{.*}}, %{{.*}}
// CHECK-NEXT: rank.dealloc %[[BK]]
// CHECK-NEXT: return
