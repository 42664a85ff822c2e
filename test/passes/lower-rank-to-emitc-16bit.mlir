// RUN: plan-opt %s --plan-memory --plan-lower-rank-to-emitc | FileCheck %s
// 16-bit buffers (mixed precision): the arena places them at 2 bytes per
// element and allocates them with their planrt::DType (2 = BF16); a cast
// converts; an op reading a bf16 buffer gets, as temporaries, an fp32 copy
// of it (256-byte rounded), before its own, unless planrt reads it in place
// (gelu).

module {
  plan.mesh @mesh axes = ["dp"] shape = [1]
  plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "sgd", precision = "bf16", seed = 1 : i64, steps = 3 : i64}
  rank.input_decl @x : memref<8x64xf32> role "input" batch_axis "dp"
  rank.input_decl @y : memref<8x64xf32> role "label" batch_axis "dp"
  func.func @plan_step() attributes {rank.expected_bytes = array<i64: 0, 0, 0>} {
    %x = rank.input @x : memref<8x64xf32>
    %y = rank.input @y : memref<8x64xf32>
    %h = rank.alloc : memref<8x64xbf16>
    rank.cast %x into %h : memref<8x64xf32> -> memref<8x64xbf16>
    %g = rank.alloc : memref<8x64xbf16>
    rank.gelu %h into %g : memref<8x64xbf16> -> memref<8x64xbf16>
    %s = rank.alloc : memref<8x64xbf16>
    rank.softmax %g into %s : memref<8x64xbf16> -> memref<8x64xbf16>
    %w = rank.alloc : memref<8x64xf32>
    rank.cast %s into %w : memref<8x64xbf16> -> memref<8x64xf32>
    %l = rank.alloc : memref<f32>
    rank.mse_loss %w, %y into %l {scale = 1.0 : f32} : memref<8x64xf32>, memref<8x64xf32> -> memref<f32>
    rank.report_loss %l : memref<f32>
    return
  }
}

// CHECK-LABEL: emitc.func @plan_step(
// 512 elements of bf16: 1024 bytes, dtype 2.
// CHECK: %[[H:.*]] = call_opaque "planrt::alloc_at"(%{{.*}}) {args = [0 : index, #emitc.opaque<"0">, #emitc.opaque<"0">, #emitc.opaque<"2">, #emitc.opaque<"8">, #emitc.opaque<"64">, #emitc.opaque<"1">, #emitc.opaque<"1">, #emitc.opaque<"2">]}
// A cast takes no temporaries.
// CHECK-NOT: op_workspace
// CHECK: call_opaque "planrt::cast"(%{{.*}}, %{{.*}}, %[[H]])
// CHECK: %[[G:.*]] = call_opaque "planrt::alloc_at"(%{{.*}}) {args = [0 : index, #emitc.opaque<"1024">, #emitc.opaque<"0">, #emitc.opaque<"2">, #emitc.opaque<"8">, #emitc.opaque<"64">, #emitc.opaque<"1">, #emitc.opaque<"1">, #emitc.opaque<"2">]}
// gelu reads and writes bf16 in place: no temporaries.
// CHECK-NOT: op_workspace
// CHECK: call_opaque "planrt::gelu"(%{{.*}}, %[[H]], %[[G]])
// softmax's input and output are bf16: two fp32 copies of 2048 bytes.
// CHECK: call_opaque "planrt::op_workspace"(%{{.*}}) {args = [0 : index, #emitc.opaque<"{{[0-9]+}}">, #emitc.opaque<"4096">]}
// CHECK-NEXT: call_opaque "planrt::softmax"(%{{.*}}, %[[G]], %{{.*}})
// An f32 buffer is allocated as before (no dtype argument).
// CHECK: call_opaque "planrt::alloc_at"(%{{.*}}) {args = [0 : index, #emitc.opaque<"{{[0-9]+}}">, #emitc.opaque<"0">, #emitc.opaque<"2">, #emitc.opaque<"8">, #emitc.opaque<"64">, #emitc.opaque<"1">, #emitc.opaque<"1">]}
// CHECK: call_opaque "planrt::cast"
