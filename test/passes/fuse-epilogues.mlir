// RUN: plan-opt %s --split-input-file --plan-fuse-epilogues=target=cuda | FileCheck %s
// RUN: plan-opt %s --split-input-file --plan-fuse-epilogues=target=host | FileCheck %s --check-prefix=HOST

// A linear layer: the product's only reader is the bias add, so the GEMM
// adds the bias in its epilogue and the product's buffer goes. On the host
// nothing changes.
func.func @plan_step(%x: memref<2x8x16xf32>, %w: memref<16x32xf32>, %b: memref<32xf32>) {
  %p = rank.alloc : memref<2x8x32xf32>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = false} : memref<2x8x16xf32>, memref<16x32xf32> -> memref<2x8x32xf32>
  %y = rank.alloc : memref<2x8x32xf32>
  rank.bias_add %p, %b into %y : memref<2x8x32xf32>, memref<32xf32> -> memref<2x8x32xf32>
  rank.gelu %y into %p : memref<2x8x32xf32> -> memref<2x8x32xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[P:.*]] = rank.alloc : memref<2x8x32xf32>
// CHECK-NEXT: rank.matmul %{{.*}}, %{{.*}} into %[[P]]
// CHECK-NEXT: %[[Y:.*]] = rank.alloc
// CHECK-NEXT: rank.bias_add %[[P]]
// HOST-LABEL: func.func @plan_step
// HOST: rank.matmul
// HOST: rank.bias_add

// -----

// The product has a second reader (the gelu above): a fused GEMM would
// never write it, so nothing changes. Without one, the pair fuses.
func.func @plan_step(%x: memref<2x8x16xf32>, %w: memref<32x16xf32>, %b: memref<32xf32>) {
  %p = rank.alloc : memref<2x8x32xf32>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = true, rank.stage = 1 : i64} : memref<2x8x16xf32>, memref<32x16xf32> -> memref<2x8x32xf32>
  %y = rank.alloc : memref<2x8x32xf32>
  rank.bias_add %p, %b into %y : memref<2x8x32xf32>, memref<32xf32> -> memref<2x8x32xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[Y:.*]] = rank.alloc : memref<2x8x32xf32>
// CHECK-NEXT: rank.matmul_bias %arg0, %arg1, %arg2 into %[[Y]] {rank.stage = 1 : i64, transpose_lhs = false, transpose_rhs = true} : memref<2x8x16xf32>, memref<32x16xf32>, memref<32xf32> -> memref<2x8x32xf32>
// CHECK-NEXT: return
// HOST-LABEL: func.func @plan_step
// HOST: rank.matmul %
// HOST: rank.bias_add

// -----

// bf16: the bias is cast between the two. The cast writes a buffer
// allocated after the GEMM, so the GEMM moves down to the add's place.
func.func @plan_step(%x: memref<8x16xbf16>, %w: memref<16x32xbf16>, %b: memref<32xf32>) {
  %p = rank.alloc : memref<8x32xbf16>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = false} : memref<8x16xbf16>, memref<16x32xbf16> -> memref<8x32xbf16>
  %b16 = rank.alloc : memref<32xbf16>
  rank.cast %b into %b16 : memref<32xf32> -> memref<32xbf16>
  %y = rank.alloc : memref<8x32xbf16>
  rank.bias_add %p, %b16 into %y : memref<8x32xbf16>, memref<32xbf16> -> memref<8x32xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[B16:.*]] = rank.alloc : memref<32xbf16>
// CHECK-NEXT: rank.cast %arg2 into %[[B16]]
// CHECK-NEXT: %[[Y:.*]] = rank.alloc : memref<8x32xbf16>
// CHECK-NEXT: rank.matmul_bias %arg0, %arg1, %[[B16]] into %[[Y]]
// CHECK-NEXT: return

// -----

// An op between the two writes the GEMM's input: the GEMM cannot move past
// it, so the pair stays.
func.func @plan_step(%x: memref<8x16xf32>, %w: memref<16x32xf32>, %b: memref<32xf32>, %z: memref<8x16xf32>) {
  %p = rank.alloc : memref<8x32xf32>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = false} : memref<8x16xf32>, memref<16x32xf32> -> memref<8x32xf32>
  rank.gelu %z into %x : memref<8x16xf32> -> memref<8x16xf32>
  %y = rank.alloc : memref<8x32xf32>
  rank.bias_add %p, %b into %y : memref<8x32xf32>, memref<32xf32> -> memref<8x32xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK: rank.matmul %
// CHECK: rank.gelu
// CHECK: rank.bias_add

// -----

// An accumulating GEMM (a weight gradient over microbatches) and a bias
// that repeats along the last dim are left alone.
func.func @plan_step(%x: memref<8x16xf32>, %w: memref<16x32xf32>, %b: memref<32xf32>, %b8: memref<8xf32>) {
  %p = rank.alloc : memref<8x32xf32>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = false, accumulate} : memref<8x16xf32>, memref<16x32xf32> -> memref<8x32xf32>
  %y = rank.alloc : memref<8x32xf32>
  rank.bias_add %p, %b into %y : memref<8x32xf32>, memref<32xf32> -> memref<8x32xf32>
  %q = rank.alloc : memref<8x32xf32>
  rank.matmul %x, %w into %q {transpose_lhs = false, transpose_rhs = false} : memref<8x16xf32>, memref<16x32xf32> -> memref<8x32xf32>
  %z = rank.alloc : memref<8x32xf32>
  rank.bias_add %q, %b8 into %z : memref<8x32xf32>, memref<8xf32> -> memref<8x32xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: rank.matmul_bias
// CHECK: return

// -----

// GPT's MLP: the GELU that reads the biased product next joins the
// epilogue; the pre-activation stays (the backward's gelu_grad reads it).
func.func @plan_step(%x: memref<8x16xbf16>, %w: memref<16x32xbf16>, %b: memref<32xbf16>, %dy: memref<8x32xbf16>) {
  %p = rank.alloc : memref<8x32xbf16>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = false} : memref<8x16xbf16>, memref<16x32xbf16> -> memref<8x32xbf16>
  %y = rank.alloc : memref<8x32xbf16>
  rank.bias_add %p, %b into %y : memref<8x32xbf16>, memref<32xbf16> -> memref<8x32xbf16>
  %g = rank.alloc : memref<8x32xbf16>
  rank.gelu %y into %g : memref<8x32xbf16> -> memref<8x32xbf16>
  %dx = rank.alloc : memref<8x32xbf16>
  rank.gelu_grad %y, %dy into %dx : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[Y:.*]] = rank.alloc : memref<8x32xbf16>
// CHECK-NEXT: %[[G:.*]] = rank.alloc : memref<8x32xbf16>
// CHECK-NEXT: rank.matmul_bias_gelu %arg0, %arg1, %arg2 into %[[Y]], %[[G]] {transpose_lhs = false, transpose_rhs = false} : memref<8x16xbf16>, memref<16x32xbf16>, memref<32xbf16> -> memref<8x32xbf16>, memref<8x32xbf16>
// CHECK-NEXT: %[[DX:.*]] = rank.alloc
// CHECK-NEXT: rank.gelu_grad %[[Y]], %arg3 into %[[DX]]
// HOST-LABEL: func.func @plan_step
// HOST-NOT: matmul_bias
// HOST: rank.gelu %

// -----

// Something reads the biased product before the gelu: the GELU stays out
// (the fused GEMM would write the product after that read). An exact
// (erf) GELU is never fused: the epilogue's is the tanh form.
func.func @plan_step(%x: memref<8x16xf32>, %w: memref<16x32xf32>, %b: memref<32xf32>) {
  %p = rank.alloc : memref<8x32xf32>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = false} : memref<8x16xf32>, memref<16x32xf32> -> memref<8x32xf32>
  %y = rank.alloc : memref<8x32xf32>
  rank.bias_add %p, %b into %y : memref<8x32xf32>, memref<32xf32> -> memref<8x32xf32>
  %r = rank.alloc : memref<8x32xf32>
  rank.relu %y into %r : memref<8x32xf32> -> memref<8x32xf32>
  %g = rank.alloc : memref<8x32xf32>
  rank.gelu %y into %g : memref<8x32xf32> -> memref<8x32xf32>
  %q = rank.alloc : memref<8x32xf32>
  rank.matmul %x, %w into %q {transpose_lhs = false, transpose_rhs = false} : memref<8x16xf32>, memref<16x32xf32> -> memref<8x32xf32>
  %z = rank.alloc : memref<8x32xf32>
  rank.bias_add %q, %b into %z : memref<8x32xf32>, memref<32xf32> -> memref<8x32xf32>
  %e = rank.alloc : memref<8x32xf32>
  rank.gelu_exact %z into %e : memref<8x32xf32> -> memref<8x32xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: matmul_bias_gelu
// CHECK: rank.matmul_bias
// CHECK: rank.relu
// CHECK: rank.gelu %
// CHECK: rank.matmul_bias
// CHECK: rank.gelu_exact

// -----

// A view of the biased product, made before the GEMM and read between the
// bias add and the gelu, would be read before the fused GEMM writes it: the
// GELU stays out. And a fused op never writes one of its inputs: a bias add
// or a gelu into the GEMM's own input keeps the ops apart.
func.func @plan_step(%x: memref<8x16xf32>, %w: memref<16x32xf32>, %b: memref<32xf32>, %w2: memref<16x16xf32>, %b2: memref<16xf32>) {
  %y = rank.alloc : memref<8x32xf32>
  %yv = rank.view %y : memref<8x32xf32> -> memref<16x16xf32>
  %p = rank.alloc : memref<8x32xf32>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = false} : memref<8x16xf32>, memref<16x32xf32> -> memref<8x32xf32>
  rank.bias_add %p, %b into %y : memref<8x32xf32>, memref<32xf32> -> memref<8x32xf32>
  %r = rank.alloc : memref<16x16xf32>
  rank.relu %yv into %r : memref<16x16xf32> -> memref<16x16xf32>
  %g = rank.alloc : memref<8x32xf32>
  rank.gelu %y into %g : memref<8x32xf32> -> memref<8x32xf32>
  %q = rank.alloc : memref<16x16xf32>
  rank.matmul %w2, %w2 into %q {transpose_lhs = false, transpose_rhs = false} : memref<16x16xf32>, memref<16x16xf32> -> memref<16x16xf32>
  rank.bias_add %q, %b2 into %w2 : memref<16x16xf32>, memref<16xf32> -> memref<16x16xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: matmul_bias_gelu
// CHECK: rank.matmul_bias %arg0, %arg1, %arg2
// CHECK-NEXT: rank.alloc
// CHECK-NEXT: rank.relu
// CHECK: rank.gelu %
// CHECK: rank.matmul %arg3, %arg3
// CHECK-NEXT: rank.bias_add

// -----

// bf16 LM head: the GEMM widens the logits for the fp32 loss, and the
// loss gradient is written in bf16 for the backward GEMMs. On the cuda
// target the GEMM writes bf16 logits into the gradient's buffer and one
// op computes the loss and writes the gradient over them, at the loss's
// place; the logits' observer moves before it. On the host nothing
// changes.
func.func @plan_step(%h: memref<2x4x8xbf16>, %w: memref<16x8xbf16>, %t: memref<2x4xi32>) {
  %logits = rank.alloc : memref<2x4x16xf32>
  rank.matmul %h, %w into %logits {transpose_lhs = false, transpose_rhs = true} : memref<2x4x8xbf16>, memref<16x8xbf16> -> memref<2x4x16xf32>
  %loss = rank.alloc : memref<f32>
  rank.cross_entropy %logits, %t into %loss {scale = 1.250000e-01 : f32, valid_classes = 13 : i64} : memref<2x4x16xf32>, memref<2x4xi32> -> memref<f32>
  rank.observe %logits as "logits" : memref<2x4x16xf32>
  %d = rank.alloc : memref<2x4x16xbf16>
  rank.cross_entropy_grad %logits, %t into %d {scale = 2.500000e-01 : f32, valid_classes = 13 : i64} : memref<2x4x16xf32>, memref<2x4xi32> -> memref<2x4x16xbf16>
  %dh = rank.alloc : memref<2x4x8xbf16>
  rank.matmul %d, %w into %dh {transpose_lhs = false, transpose_rhs = false} : memref<2x4x16xbf16>, memref<16x8xbf16> -> memref<2x4x8xbf16>
  rank.report_loss %loss : memref<f32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[D:.*]] = rank.alloc : memref<2x4x16xbf16>
// CHECK-NEXT: rank.matmul %arg0, %arg1 into %[[D]] {{.*}} -> memref<2x4x16xbf16>
// CHECK-NEXT: %[[L:.*]] = rank.alloc : memref<f32>
// CHECK-NEXT: rank.observe %[[D]] as "logits" : memref<2x4x16xbf16>
// CHECK-NEXT: rank.cross_entropy_in_place %[[D]], %arg2 into %[[L]] {grad_scale = 2.500000e-01 : f32, scale = 1.250000e-01 : f32, valid_classes = 13 : i64} : memref<2x4x16xbf16>, memref<2x4xi32> -> memref<f32>
// CHECK-NEXT: %[[DH:.*]] = rank.alloc
// CHECK-NEXT: rank.matmul %[[D]], %arg1 into %[[DH]]
// CHECK-NEXT: rank.report_loss %[[L]]
// CHECK-NOT: memref<2x4x16xf32>
// HOST-NOT: cross_entropy_in_place
// HOST: rank.cross_entropy %
// HOST: rank.cross_entropy_grad

// -----

// fp32: the gradient has the logits' type, so it is written over them and
// its readers read the logits' buffer.
func.func @plan_step(%h: memref<4x8xf32>, %w: memref<8x16xf32>, %t: memref<4xi32>) {
  %logits = rank.alloc : memref<4x16xf32>
  rank.matmul %h, %w into %logits {transpose_lhs = false, transpose_rhs = false} : memref<4x8xf32>, memref<8x16xf32> -> memref<4x16xf32>
  %loss = rank.alloc : memref<f32>
  rank.cross_entropy %logits, %t into %loss {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<f32>
  %d = rank.alloc : memref<4x16xf32>
  rank.cross_entropy_grad %logits, %t into %d {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<4x16xf32>
  %dh = rank.alloc : memref<4x8xf32>
  rank.matmul %d, %w into %dh {transpose_lhs = false, transpose_rhs = true} : memref<4x16xf32>, memref<8x16xf32> -> memref<4x8xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[X:.*]] = rank.alloc : memref<4x16xf32>
// CHECK-NEXT: rank.matmul %arg0, %arg1 into %[[X]]
// CHECK-NEXT: %[[L:.*]] = rank.alloc : memref<f32>
// CHECK-NEXT: rank.cross_entropy_in_place %[[X]], %arg2 into %[[L]] {grad_scale = 2.500000e-01 : f32, scale = 2.500000e-01 : f32} :
// CHECK-NEXT: %[[DH:.*]] = rank.alloc
// CHECK-NEXT: rank.matmul %[[X]], %arg1 into %[[DH]]
// CHECK-NEXT: return

// -----

// What keeps the loss and its gradient apart: the logits read after the
// gradient (they would hold the gradient), the gradient read before it,
// the two over different classes, the targets written in between, and a
// 16-bit gradient of f32 GEMM operands (the GEMM cannot write 16 bits).
func.func @plan_step(%h: memref<4x8xf32>, %w: memref<8x16xf32>, %t: memref<4xi32>, %y: memref<4x16xf32>) {
  %logits = rank.alloc : memref<4x16xf32>
  rank.matmul %h, %w into %logits {transpose_lhs = false, transpose_rhs = false} : memref<4x8xf32>, memref<8x16xf32> -> memref<4x16xf32>
  %loss = rank.alloc : memref<f32>
  rank.cross_entropy %logits, %t into %loss {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<f32>
  %d = rank.alloc : memref<4x16xf32>
  rank.cross_entropy_grad %logits, %t into %d {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<4x16xf32>
  rank.add %logits, %d into %y : memref<4x16xf32>, memref<4x16xf32> -> memref<4x16xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: cross_entropy_in_place
// CHECK: return

// -----

func.func @plan_step(%h: memref<4x8xf32>, %w: memref<8x16xf32>, %t: memref<4xi32>, %y: memref<4x16xf32>) {
  %logits = rank.alloc : memref<4x16xf32>
  rank.matmul %h, %w into %logits {transpose_lhs = false, transpose_rhs = false} : memref<4x8xf32>, memref<8x16xf32> -> memref<4x16xf32>
  %d = rank.alloc : memref<4x16xf32>
  rank.add %d, %y into %y : memref<4x16xf32>, memref<4x16xf32> -> memref<4x16xf32>
  %loss = rank.alloc : memref<f32>
  rank.cross_entropy %logits, %t into %loss {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<f32>
  rank.cross_entropy_grad %logits, %t into %d {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<4x16xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: cross_entropy_in_place
// CHECK: return

// -----

func.func @plan_step(%h: memref<4x8xf32>, %w: memref<8x16xf32>, %t: memref<4xi32>) {
  %logits = rank.alloc : memref<4x16xf32>
  rank.matmul %h, %w into %logits {transpose_lhs = false, transpose_rhs = false} : memref<4x8xf32>, memref<8x16xf32> -> memref<4x16xf32>
  %loss = rank.alloc : memref<f32>
  rank.cross_entropy %logits, %t into %loss {scale = 2.500000e-01 : f32, valid_classes = 15 : i64} : memref<4x16xf32>, memref<4xi32> -> memref<f32>
  %d = rank.alloc : memref<4x16xf32>
  rank.cross_entropy_grad %logits, %t into %d {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<4x16xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: cross_entropy_in_place
// CHECK: return

// -----

func.func @plan_step(%h: memref<4x1x8xf32>, %w: memref<8x16xf32>, %t: memref<4x1xi32>, %r: memref<4x1x3xf32>) {
  %logits = rank.alloc : memref<4x1x16xf32>
  rank.matmul %h, %w into %logits {transpose_lhs = false, transpose_rhs = false} : memref<4x1x8xf32>, memref<8x16xf32> -> memref<4x1x16xf32>
  %loss = rank.alloc : memref<f32>
  rank.cross_entropy %logits, %t into %loss {scale = 2.500000e-01 : f32} : memref<4x1x16xf32>, memref<4x1xi32> -> memref<f32>
  rank.moe_topk %r into %t {top_k = 1 : i64, capacity = 0 : i64} : memref<4x1x3xf32> -> memref<4x1xi32>
  %d = rank.alloc : memref<4x1x16xf32>
  rank.cross_entropy_grad %logits, %t into %d {scale = 2.500000e-01 : f32} : memref<4x1x16xf32>, memref<4x1xi32> -> memref<4x1x16xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: cross_entropy_in_place
// CHECK: return

// -----

func.func @plan_step(%h: memref<4x8xf32>, %w: memref<8x16xf32>, %t: memref<4xi32>) {
  %logits = rank.alloc : memref<4x16xf32>
  rank.matmul %h, %w into %logits {transpose_lhs = false, transpose_rhs = false} : memref<4x8xf32>, memref<8x16xf32> -> memref<4x16xf32>
  %loss = rank.alloc : memref<f32>
  rank.cross_entropy %logits, %t into %loss {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<f32>
  %d = rank.alloc : memref<4x16xbf16>
  rank.cross_entropy_grad %logits, %t into %d {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<4x16xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: cross_entropy_in_place
// CHECK: return

// -----

// The gradient written into a view of a caller's buffer: fused, the
// gradient would live only in the logits and the buffer keep old values.
func.func @plan_step(%h: memref<4x8xf32>, %w: memref<8x16xf32>, %t: memref<4xi32>, %big: memref<64xf32>) {
  %logits = rank.alloc : memref<4x16xf32>
  rank.matmul %h, %w into %logits {transpose_lhs = false, transpose_rhs = false} : memref<4x8xf32>, memref<8x16xf32> -> memref<4x16xf32>
  %loss = rank.alloc : memref<f32>
  rank.cross_entropy %logits, %t into %loss {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<f32>
  %d = rank.view %big : memref<64xf32> -> memref<4x16xf32>
  rank.cross_entropy_grad %logits, %t into %d {scale = 2.500000e-01 : f32} : memref<4x16xf32>, memref<4xi32> -> memref<4x16xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: cross_entropy_in_place
// CHECK: return

// -----

// The targets a view of a fresh buffer that is written between the loss
// and the gradient (through the buffer, not the view).
func.func @plan_step(%h: memref<4x1x8xf32>, %w: memref<8x16xf32>, %r: memref<4x1x3xf32>, %c0: index) {
  %logits = rank.alloc : memref<4x1x16xf32>
  rank.matmul %h, %w into %logits {transpose_lhs = false, transpose_rhs = false} : memref<4x1x8xf32>, memref<8x16xf32> -> memref<4x1x16xf32>
  %tb = rank.alloc : memref<4x1xi32>
  %t = rank.rows %tb, %c0 of 1 : memref<4x1xi32> -> memref<4x1xi32>
  %loss = rank.alloc : memref<f32>
  rank.cross_entropy %logits, %t into %loss {scale = 2.500000e-01 : f32} : memref<4x1x16xf32>, memref<4x1xi32> -> memref<f32>
  rank.moe_topk %r into %tb {top_k = 1 : i64, capacity = 0 : i64} : memref<4x1x3xf32> -> memref<4x1xi32>
  %d = rank.alloc : memref<4x1x16xf32>
  rank.cross_entropy_grad %logits, %t into %d {scale = 2.500000e-01 : f32} : memref<4x1x16xf32>, memref<4x1xi32> -> memref<4x1x16xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: cross_entropy_in_place
// CHECK: return

// -----

// The backward of GELU: the GEMM of its output gradient, read only by the
// gelu_grad, applies the derivative in its epilogue (reading pre), and the
// product's buffer goes.
func.func @plan_step(%dy: memref<8x16xbf16>, %w2: memref<32x16xbf16>, %pre: memref<8x32xbf16>) {
  %dh = rank.alloc : memref<8x32xbf16>
  rank.matmul %dy, %w2 into %dh {transpose_lhs = false, transpose_rhs = true} : memref<8x16xbf16>, memref<32x16xbf16> -> memref<8x32xbf16>
  %dpre = rank.alloc : memref<8x32xbf16>
  rank.gelu_grad %pre, %dh into %dpre : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[D:.*]] = rank.alloc : memref<8x32xbf16>
// CHECK-NEXT: rank.matmul_dgelu %arg0, %arg1, %arg2 into %[[D]] {transpose_lhs = false, transpose_rhs = true} : memref<8x16xbf16>, memref<32x16xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
// CHECK-NEXT: return

// -----

// The product read by another op too, or pre written in between: apart.
func.func @plan_step(%dy: memref<8x16xbf16>, %w2: memref<32x16xbf16>, %pre: memref<8x32xbf16>, %y: memref<8x32xbf16>) {
  %dh = rank.alloc : memref<8x32xbf16>
  rank.matmul %dy, %w2 into %dh {transpose_lhs = false, transpose_rhs = true} : memref<8x16xbf16>, memref<32x16xbf16> -> memref<8x32xbf16>
  %dpre = rank.alloc : memref<8x32xbf16>
  rank.gelu_grad %pre, %dh into %dpre : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  rank.add %dh, %dpre into %y : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: matmul_dgelu
// CHECK: return

// -----

func.func @plan_step(%dy: memref<8x16xbf16>, %w2: memref<32x16xbf16>, %y: memref<8x32xbf16>) {
  %pre = rank.alloc : memref<8x32xbf16>
  %dh = rank.alloc : memref<8x32xbf16>
  rank.matmul %dy, %w2 into %dh {transpose_lhs = false, transpose_rhs = true} : memref<8x16xbf16>, memref<32x16xbf16> -> memref<8x32xbf16>
  rank.gelu %y into %pre : memref<8x32xbf16> -> memref<8x32xbf16>
  %dpre = rank.alloc : memref<8x32xbf16>
  rank.gelu_grad %pre, %dh into %dpre : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: matmul_dgelu
// CHECK: return

// -----

// A linear layer's bias gradient and weight gradient of one dy: one GEMM
// that sums dy's rows in its epilogue, at the later op's place.
func.func @plan_step(%x: memref<8x16xbf16>, %dy: memref<8x32xbf16>, %w: memref<16x32xbf16>) {
  %db = rank.alloc : memref<32xf32>
  rank.bias_grad %dy into %db : memref<8x32xbf16> -> memref<32xf32>
  %dx = rank.alloc : memref<8x16xbf16>
  rank.matmul %dy, %w into %dx {transpose_lhs = false, transpose_rhs = true} : memref<8x32xbf16>, memref<16x32xbf16> -> memref<8x16xbf16>
  %dw = rank.alloc : memref<16x32xf32>
  rank.matmul %x, %dy into %dw {transpose_lhs = true, transpose_rhs = false} : memref<8x16xbf16>, memref<8x32xbf16> -> memref<16x32xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[DB:.*]] = rank.alloc : memref<32xf32>
// CHECK-NEXT: %[[DX:.*]] = rank.alloc : memref<8x16xbf16>
// CHECK-NEXT: rank.matmul %arg1, %arg2 into %[[DX]]
// CHECK-NEXT: %[[DW:.*]] = rank.alloc : memref<16x32xf32>
// CHECK-NEXT: rank.matmul_bias_grad %arg0, %arg1 into %[[DW]], %[[DB]] {transpose_lhs = true, transpose_rhs = false} : memref<8x16xbf16>, memref<8x32xbf16> -> memref<16x32xf32>, memref<32xf32>
// CHECK-NEXT: return

// -----

// The bias gradient read before the weight gradient's GEMM (with dp, its
// all-reduce starts there): the GEMM cannot wait, so the fused op runs at
// the bias gradient's place, the weight gradient's buffer (here a range of
// a gradient bucket, as is the bias gradient's) defined above it.
func.func @plan_step(%x: memref<8x16xbf16>, %dy: memref<8x32xbf16>, %s: memref<32xf32>, %bucket: memref<1024xf32>) {
  %db = rank.subview %bucket[0] : memref<1024xf32> -> memref<32xf32>
  rank.bias_grad %dy into %db : memref<8x32xbf16> -> memref<32xf32>
  rank.add %db, %db into %s : memref<32xf32>, memref<32xf32> -> memref<32xf32>
  %dw = rank.subview %bucket[32] : memref<1024xf32> -> memref<16x32xf32>
  rank.matmul %x, %dy into %dw {transpose_lhs = true, transpose_rhs = false} : memref<8x16xbf16>, memref<8x32xbf16> -> memref<16x32xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[DB:.*]] = rank.subview %arg3[0]
// CHECK-NEXT: %[[DW:.*]] = rank.subview %arg3[32]
// CHECK-NEXT: rank.matmul_bias_grad %arg0, %arg1 into %[[DW]], %[[DB]]
// CHECK-NEXT: rank.add %[[DB]], %[[DB]] into %arg2
// CHECK-NEXT: return

// -----

// Apart: the bias gradient read before the GEMM, which reads x that an op
// between writes; two ranges of a bucket that overlap; dy transposed.
func.func @plan_step(%x: memref<8x16xbf16>, %dy: memref<8x32xbf16>, %s: memref<32xf32>, %bucket: memref<1024xf32>, %dy2: memref<8x32xbf16>) {
  %db = rank.alloc : memref<32xf32>
  rank.bias_grad %dy into %db : memref<8x32xbf16> -> memref<32xf32>
  rank.add %db, %db into %s : memref<32xf32>, memref<32xf32> -> memref<32xf32>
  rank.scale %x into %x {factor = 2.0 : f32} : memref<8x16xbf16> -> memref<8x16xbf16>
  %dw = rank.alloc : memref<16x32xf32>
  rank.matmul %x, %dy into %dw {transpose_lhs = true, transpose_rhs = false} : memref<8x16xbf16>, memref<8x32xbf16> -> memref<16x32xf32>
  %db2 = rank.subview %bucket[0] : memref<1024xf32> -> memref<32xf32>
  rank.bias_grad %dy2 into %db2 : memref<8x32xbf16> -> memref<32xf32>
  %dw2 = rank.subview %bucket[16] : memref<1024xf32> -> memref<16x32xf32>
  rank.matmul %x, %dy2 into %dw2 {transpose_lhs = true, transpose_rhs = false} : memref<8x16xbf16>, memref<8x32xbf16> -> memref<16x32xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: matmul_bias_grad
// CHECK: return

// -----

// An accumulating weight gradient's GEMM (microbatches) keeps accumulating.
func.func @plan_step(%x: memref<8x16xbf16>, %dy: memref<8x32xbf16>, %dw: memref<16x32xf32>) {
  %db = rank.alloc : memref<32xf32>
  rank.bias_grad %dy into %db : memref<8x32xbf16> -> memref<32xf32>
  rank.matmul %x, %dy into %dw {transpose_lhs = true, transpose_rhs = false, accumulate} : memref<8x16xbf16>, memref<8x32xbf16> -> memref<16x32xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[DB:.*]] = rank.alloc : memref<32xf32>
// CHECK-NEXT: rank.matmul_bias_grad %arg0, %arg1 into %arg2, %[[DB]] {accumulate, transpose_lhs = true, transpose_rhs = false}
// CHECK-NEXT: return

// -----

func.func @plan_step(%x: memref<32x16xbf16>, %dy: memref<8x32xbf16>) {
  %db = rank.alloc : memref<32xf32>
  rank.bias_grad %dy into %db : memref<8x32xbf16> -> memref<32xf32>
  %dw = rank.alloc : memref<16x8xf32>
  rank.matmul %x, %dy into %dw {transpose_lhs = true, transpose_rhs = true} : memref<32x16xbf16>, memref<8x32xbf16> -> memref<16x8xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: matmul_bias_grad
// CHECK: return

// -----

// The residual stream: the biased product's only reader (but its
// deallocation) is an add, so the GEMM adds the other operand as its C
// matrix (beta = 1), at the add's place, into the add's output; the
// product's buffer goes. Written in between: only a buffer allocated after
// the GEMM.
func.func @plan_step(%x: memref<8x16xbf16>, %w: memref<16x32xbf16>, %b: memref<32xbf16>, %r: memref<8x32xbf16>) {
  %p = rank.alloc : memref<8x32xbf16>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = false} : memref<8x16xbf16>, memref<16x32xbf16> -> memref<8x32xbf16>
  %y = rank.alloc : memref<8x32xbf16>
  rank.bias_add %p, %b into %y : memref<8x32xbf16>, memref<32xbf16> -> memref<8x32xbf16>
  %t = rank.alloc : memref<8x32xbf16>
  rank.scale %r into %t {factor = 2.0 : f32} : memref<8x32xbf16> -> memref<8x32xbf16>
  %s = rank.alloc : memref<8x32xbf16>
  rank.add %r, %y into %s : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  rank.dealloc %y : memref<8x32xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[T:.*]] = rank.alloc : memref<8x32xbf16>
// CHECK-NEXT: rank.scale %arg3 into %[[T]]
// CHECK-NEXT: %[[S:.*]] = rank.alloc : memref<8x32xbf16>
// CHECK-NEXT: rank.matmul_bias %arg0, %arg1, %arg2 plus %arg3 into %[[S]] {transpose_lhs = false, transpose_rhs = false} : memref<8x16xbf16>, memref<16x32xbf16>, memref<32xbf16> plus memref<8x32xbf16> -> memref<8x32xbf16>
// CHECK-NEXT: return
// HOST: rank.add %arg3

// -----

// Not joined: the add writes in place over the residual (the GEMM would
// read C while it writes D over it: cuBLASLt allows it, the host's
// fallback would not), and a product with a second reader.
func.func @plan_step(%x: memref<8x16xbf16>, %w: memref<16x32xbf16>, %b: memref<32xbf16>, %r: memref<8x32xbf16>) {
  %p = rank.alloc : memref<8x32xbf16>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = false} : memref<8x16xbf16>, memref<16x32xbf16> -> memref<8x32xbf16>
  %y = rank.alloc : memref<8x32xbf16>
  rank.bias_add %p, %b into %y : memref<8x32xbf16>, memref<32xbf16> -> memref<8x32xbf16>
  rank.add %r, %y into %r : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  %p2 = rank.alloc : memref<8x32xbf16>
  rank.matmul %x, %w into %p2 {transpose_lhs = false, transpose_rhs = false} : memref<8x16xbf16>, memref<16x32xbf16> -> memref<8x32xbf16>
  %y2 = rank.alloc : memref<8x32xbf16>
  rank.bias_add %p2, %b into %y2 : memref<8x32xbf16>, memref<32xbf16> -> memref<8x32xbf16>
  %s2 = rank.alloc : memref<8x32xbf16>
  rank.add %r, %y2 into %s2 : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  rank.scale %y2 into %r {factor = 2.0 : f32} : memref<8x32xbf16> -> memref<8x32xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: plus
// CHECK: rank.add
// CHECK: rank.add
// CHECK-NOT: plus

// -----

// The residual stream's gradient meets the norms' input gradients in adds:
// each add that is an input gradient's only reader joins the norm's
// backward (`plus`), at the add's place, into the add's output. Written in
// between: only fresh buffers; the input gradient's buffer goes.
func.func @plan_step(%x: memref<8x16xbf16>, %g: memref<16xbf16>, %dy: memref<8x16xbf16>, %r: memref<8x16xbf16>) {
  %dx = rank.alloc : memref<8x16xbf16>
  %dg = rank.alloc : memref<16xf32>
  %db = rank.alloc : memref<16xf32>
  rank.layernorm_grad %x, %g, %dy into %dx, %dg, %db {eps = 1.0e-05 : f32} : memref<8x16xbf16>, memref<16xbf16> -> memref<16xf32>
  %t = rank.alloc : memref<8x16xbf16>
  rank.scale %r into %t {factor = 2.0 : f32} : memref<8x16xbf16> -> memref<8x16xbf16>
  %s = rank.alloc : memref<8x16xbf16>
  rank.add %r, %dx into %s : memref<8x16xbf16>, memref<8x16xbf16> -> memref<8x16xbf16>
  rank.dealloc %dx : memref<8x16xbf16>
  %dx2 = rank.alloc : memref<8x16xbf16>
  %dg2 = rank.alloc : memref<16xf32>
  rank.rmsnorm_grad %x, %g, %s into %dx2, %dg2 {eps = 1.0e-05 : f32} : memref<8x16xbf16>, memref<16xbf16> -> memref<16xf32>
  %s2 = rank.alloc : memref<8x16xbf16>
  rank.add %dx2, %s into %s2 : memref<8x16xbf16>, memref<8x16xbf16> -> memref<8x16xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[DG:.*]] = rank.alloc : memref<16xf32>
// CHECK-NEXT: %[[DB:.*]] = rank.alloc : memref<16xf32>
// CHECK-NEXT: %[[T:.*]] = rank.alloc : memref<8x16xbf16>
// CHECK-NEXT: rank.scale %arg3 into %[[T]]
// CHECK-NEXT: %[[S:.*]] = rank.alloc : memref<8x16xbf16>
// CHECK-NEXT: rank.layernorm_grad %arg0, %arg1, %arg2 plus %arg3 into %[[S]], %[[DG]], %[[DB]] {eps = 9.99999974E-6 : f32} : memref<8x16xbf16>, memref<16xbf16> plus memref<8x16xbf16> -> memref<16xf32>
// CHECK-NEXT: %[[DG2:.*]] = rank.alloc : memref<16xf32>
// CHECK-NEXT: %[[S2:.*]] = rank.alloc : memref<8x16xbf16>
// CHECK-NEXT: rank.rmsnorm_grad %arg0, %arg1, %[[S]] plus %[[S]] into %[[S2]], %[[DG2]] {eps = 9.99999974E-6 : f32} : memref<8x16xbf16>, memref<16xbf16> plus memref<8x16xbf16> -> memref<16xf32>
// CHECK-NEXT: return
// HOST: rank.layernorm_grad %arg0, %arg1, %arg2 into
// HOST: rank.add
// HOST: rank.rmsnorm_grad %arg0, %arg1, %{{.*}} into
// HOST: rank.add

// -----

// Not joined: an op between reads the norm's parameter gradient (it would
// read it before the moved norm writes it) and writes the residual (the add
// cannot move up to the norm either); the add writes over its other
// operand; the input gradient has a second reader.
func.func @plan_step(%x: memref<8x16xf32>, %g: memref<16xf32>, %dy: memref<8x16xf32>, %r: memref<8x16xf32>, %acc: memref<f32>) {
  %dx = rank.alloc : memref<8x16xf32>
  %dg = rank.alloc : memref<16xf32>
  %db = rank.alloc : memref<16xf32>
  rank.layernorm_grad %x, %g, %dy into %dx, %dg, %db {eps = 1.0e-05 : f32} : memref<8x16xf32>, memref<16xf32> -> memref<16xf32>
  rank.bias_add %r, %dg into %r : memref<8x16xf32>, memref<16xf32> -> memref<8x16xf32>
  %s = rank.alloc : memref<8x16xf32>
  rank.add %r, %dx into %s : memref<8x16xf32>, memref<8x16xf32> -> memref<8x16xf32>
  %dx2 = rank.alloc : memref<8x16xf32>
  %dg2 = rank.alloc : memref<16xf32>
  rank.rmsnorm_grad %x, %g, %dy into %dx2, %dg2 {eps = 1.0e-05 : f32} : memref<8x16xf32>, memref<16xf32> -> memref<16xf32>
  rank.add %r, %dx2 into %r : memref<8x16xf32>, memref<8x16xf32> -> memref<8x16xf32>
  %dx3 = rank.alloc : memref<8x16xf32>
  %dg3 = rank.alloc : memref<16xf32>
  rank.rmsnorm_grad %x, %g, %dy into %dx3, %dg3 {eps = 1.0e-05 : f32} : memref<8x16xf32>, memref<16xf32> -> memref<16xf32>
  %s3 = rank.alloc : memref<8x16xf32>
  rank.add %r, %dx3 into %s3 : memref<8x16xf32>, memref<8x16xf32> -> memref<8x16xf32>
  rank.scale %dx3 into %s3 {factor = 2.0 : f32} : memref<8x16xf32> -> memref<8x16xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: plus
// CHECK: rank.add
// CHECK: rank.add
// CHECK: rank.add
// CHECK-NOT: plus

// -----

// An unbiased projection whose product only feeds an add (Llama's output
// projections; a gradient's sum of two products): the add's other operand
// becomes the GEMM's C, at the add's place, into the add's output. Not for
// an accumulating GEMM, nor an add in place over its other operand.
func.func @plan_step(%x: memref<8x16xbf16>, %w: memref<32x16xbf16>, %r: memref<8x32xbf16>, %dw: memref<16x32xbf16>) {
  %p = rank.alloc : memref<8x32xbf16>
  rank.matmul %x, %w into %p {transpose_lhs = false, transpose_rhs = true} : memref<8x16xbf16>, memref<32x16xbf16> -> memref<8x32xbf16>
  %s = rank.alloc : memref<8x32xbf16>
  rank.add %r, %p into %s : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  rank.dealloc %p : memref<8x32xbf16>
  %acc = rank.alloc : memref<16x32xbf16>
  rank.matmul %x, %s into %acc {transpose_lhs = true, transpose_rhs = false, accumulate} : memref<8x16xbf16>, memref<8x32xbf16> -> memref<16x32xbf16>
  %t = rank.alloc : memref<16x32xbf16>
  rank.add %dw, %acc into %t : memref<16x32xbf16>, memref<16x32xbf16> -> memref<16x32xbf16>
  %p2 = rank.alloc : memref<8x32xbf16>
  rank.matmul %x, %w into %p2 {transpose_lhs = false, transpose_rhs = true} : memref<8x16xbf16>, memref<32x16xbf16> -> memref<8x32xbf16>
  rank.add %r, %p2 into %r : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[S:.*]] = rank.alloc : memref<8x32xbf16>
// CHECK-NEXT: rank.matmul %arg0, %arg1 plus %arg2 into %[[S]] {transpose_lhs = false, transpose_rhs = true} : memref<8x16xbf16>, memref<32x16xbf16> plus memref<8x32xbf16> -> memref<8x32xbf16>
// CHECK-NEXT: %[[ACC:.*]] = rank.alloc : memref<16x32xbf16>
// CHECK-NEXT: rank.matmul %arg0, %[[S]] into %[[ACC]] {accumulate, transpose_lhs = true, transpose_rhs = false}
// CHECK-NEXT: %[[T:.*]] = rank.alloc : memref<16x32xbf16>
// CHECK-NEXT: rank.add %arg3, %[[ACC]] into %[[T]]
// CHECK-NOT: plus
// HOST-NOT: plus

// -----

// With data parallelism the norm's parameter gradients' all-reduce starts
// between the norm and the add, so the norm cannot move down to the add:
// the fused op runs at the norm's place instead, the add's output allocated
// before it. Not when an op between writes the residual.
func.func @plan_step(%x: memref<8x16xf32>, %g: memref<16xf32>, %dy: memref<8x16xf32>, %r: memref<8x16xf32>, %dg: memref<16xf32>, %db: memref<16xf32>) {
  %dx = rank.alloc : memref<8x16xf32>
  rank.layernorm_grad %x, %g, %dy into %dx, %dg, %db {eps = 1.0e-05 : f32} : memref<8x16xf32>, memref<16xf32> -> memref<16xf32>
  rank.all_reduce_start %dg over ["dp"] slot 0 : memref<16xf32>
  rank.collective_wait slot 0
  %s = rank.alloc : memref<8x16xf32>
  rank.add %r, %dx into %s : memref<8x16xf32>, memref<8x16xf32> -> memref<8x16xf32>
  %dx2 = rank.alloc : memref<8x16xf32>
  rank.layernorm_grad %x, %g, %s into %dx2, %dg, %db {eps = 1.0e-05 : f32} : memref<8x16xf32>, memref<16xf32> -> memref<16xf32>
  rank.all_reduce_start %dg over ["dp"] slot 1 : memref<16xf32>
  rank.collective_wait slot 1
  rank.scale %dy into %r {factor = 2.0 : f32} : memref<8x16xf32> -> memref<8x16xf32>
  %s2 = rank.alloc : memref<8x16xf32>
  rank.add %r, %dx2 into %s2 : memref<8x16xf32>, memref<8x16xf32> -> memref<8x16xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[S:.*]] = rank.alloc : memref<8x16xf32>
// CHECK-NEXT: rank.layernorm_grad %arg0, %arg1, %arg2 plus %arg3 into %[[S]], %arg4, %arg5
// CHECK-NEXT: rank.all_reduce_start %arg4 over ["dp"] slot 0
// CHECK-NEXT: rank.collective_wait slot 0
// CHECK-NEXT: %[[DX2:.*]] = rank.alloc : memref<8x16xf32>
// CHECK-NEXT: rank.layernorm_grad %arg0, %arg1, %[[S]] into %[[DX2]], %arg4, %arg5
// CHECK: rank.scale %arg2 into %arg3
// CHECK: rank.add %arg3, %[[DX2]]

// -----

// With microbatches the weight gradients accumulate between the GEMM of
// GELU's output gradient and the gelu_grad (and the bias gradient is added
// to its accumulator before the weight gradient's GEMM): the fused ops run
// at the earlier op's place, the outputs allocated above them; the weight
// gradient's GEMM keeps accumulating.
func.func @plan_step(%x: memref<8x16xbf16>, %dy: memref<8x16xbf16>, %w2: memref<32x16xbf16>, %pre: memref<8x32xbf16>, %h: memref<8x32xbf16>, %acc: memref<16x32xf32>, %acc2: memref<32x16xf32>, %bacc: memref<32xf32>) {
  %p = rank.alloc : memref<8x32xbf16>
  rank.matmul %dy, %w2 into %p {transpose_lhs = false, transpose_rhs = true} : memref<8x16xbf16>, memref<32x16xbf16> -> memref<8x32xbf16>
  rank.matmul %h, %dy into %acc2 {transpose_lhs = true, transpose_rhs = false, accumulate} : memref<8x32xbf16>, memref<8x16xbf16> -> memref<32x16xf32>
  %d = rank.alloc : memref<8x32xbf16>
  rank.gelu_grad %pre, %p into %d : memref<8x32xbf16>, memref<8x32xbf16> -> memref<8x32xbf16>
  %db = rank.alloc : memref<32xf32>
  rank.bias_grad %d into %db : memref<8x32xbf16> -> memref<32xf32>
  rank.add %bacc, %db into %bacc : memref<32xf32>, memref<32xf32> -> memref<32xf32>
  rank.matmul %x, %d into %acc {transpose_lhs = true, transpose_rhs = false, accumulate} : memref<8x16xbf16>, memref<8x32xbf16> -> memref<16x32xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NEXT: %[[D:.*]] = rank.alloc : memref<8x32xbf16>
// CHECK-NEXT: rank.matmul_dgelu %arg1, %arg2, %arg3 into %[[D]]
// CHECK-NEXT: rank.matmul %arg4, %arg1 into %arg6 {accumulate
// CHECK-NEXT: %[[DB:.*]] = rank.alloc : memref<32xf32>
// CHECK-NEXT: rank.matmul_bias_grad %arg0, %[[D]] into %arg5, %[[DB]] {accumulate, transpose_lhs = true, transpose_rhs = false}
// CHECK-NEXT: rank.add %arg7, %[[DB]] into %arg7
// CHECK-NEXT: return
