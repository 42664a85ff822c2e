// RUN: plan-opt %s --split-input-file --plan-keep-attention="policy=selective target=cuda" | FileCheck %s
// RUN: plan-opt %s --split-input-file --plan-keep-attention="policy=none target=host" | FileCheck %s --check-prefix=HOST

// cuda, bf16 without dropout (cuDNN's flash attention may run it): the
// forward keeps each row's log-sum-exp [B, H, S], and the backward reads it
// with the forward's output, under any recompute policy. The host keeps
// its score matrix instead (recompute = none).
func.func @plan_step() {
  %qkv = rank.alloc : memref<2x8x128xbf16>
  %out = rank.alloc : memref<2x8x64xbf16>
  rank.attention %qkv into %out {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16> -> memref<2x8x64xbf16>
  %y = rank.alloc : memref<2x8x64xbf16>
  rank.scale %out into %y {factor = 2.0 : f32} : memref<2x8x64xbf16> -> memref<2x8x64xbf16>
  %dout = rank.alloc : memref<2x8x64xbf16>
  %dqkv = rank.alloc : memref<2x8x128xbf16>
  rank.attention_grad %qkv, %dout into %dqkv {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK: %[[QKV:.*]] = rank.alloc : memref<2x8x128xbf16>
// CHECK-NEXT: %[[OUT:.*]] = rank.alloc : memref<2x8x64xbf16>
// CHECK-NEXT: %[[LSE:.*]] = rank.alloc : memref<2x4x8xf32>
// CHECK-NEXT: rank.attention_lse %[[QKV]] into %[[OUT]], %[[LSE]] {num_heads = 4 : i64, num_kv_heads = 2 : i64}
// CHECK: rank.attention_grad_lse %[[QKV]], %[[OUT]], %[[LSE]], %{{.*}} into %{{.*}} {num_heads = 4 : i64, num_kv_heads = 2 : i64}
// CHECK-NOT: rank.attention_grad %
// HOST-LABEL: func.func @plan_step
// HOST: rank.attention_keep
// HOST-NOT: attention_lse

// -----

// Attention dropout (the tiles draw planrt's mask), fp32 (the tiles), or the
// output written between the two: nothing kept.
func.func @plan_step() {
  %qkv = rank.alloc : memref<2x8x128xbf16>
  %out = rank.alloc : memref<2x8x64xbf16>
  rank.attention %qkv into %out {num_heads = 4 : i64, num_kv_heads = 2 : i64, dropout = 1.000000e-01 : f32, dropout_uid = 3 : i64} : memref<2x8x128xbf16> -> memref<2x8x64xbf16>
  %dout = rank.alloc : memref<2x8x64xbf16>
  %dqkv = rank.alloc : memref<2x8x128xbf16>
  rank.attention_grad %qkv, %dout into %dqkv {num_heads = 4 : i64, num_kv_heads = 2 : i64, dropout = 1.000000e-01 : f32, dropout_uid = 3 : i64} : memref<2x8x128xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: attention_lse
// CHECK: return

// -----

func.func @plan_step() {
  %qkv = rank.alloc : memref<2x8x128xf32>
  %out = rank.alloc : memref<2x8x64xf32>
  rank.attention %qkv into %out {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xf32> -> memref<2x8x64xf32>
  %dout = rank.alloc : memref<2x8x64xf32>
  %dqkv = rank.alloc : memref<2x8x128xf32>
  rank.attention_grad %qkv, %dout into %dqkv {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xf32>, memref<2x8x64xf32> -> memref<2x8x128xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: attention_lse
// CHECK: return

// -----

func.func @plan_step(%r: memref<2x8x64xbf16>) {
  %qkv = rank.alloc : memref<2x8x128xbf16>
  %out = rank.alloc : memref<2x8x64xbf16>
  rank.attention %qkv into %out {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16> -> memref<2x8x64xbf16>
  %v = rank.view %out : memref<2x8x64xbf16> -> memref<16x64xbf16>
  %rv = rank.view %r : memref<2x8x64xbf16> -> memref<16x64xbf16>
  rank.add %v, %rv into %v : memref<16x64xbf16>, memref<16x64xbf16> -> memref<16x64xbf16>
  %dout = rank.alloc : memref<2x8x64xbf16>
  %dqkv = rank.alloc : memref<2x8x128xbf16>
  rank.attention_grad %qkv, %dout into %dqkv {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: attention_lse
// CHECK: return

// -----

// The output read only before the backward's output gradient is written,
// with another layer's attention in between: keeping it would hold a whole
// output per layer; not kept. The second layer's forward runs next to its backward
// (as a forward recomputed in its layer's backward does, recompute = full):
// kept, for one layer's backward at most.
func.func @plan_step(%r: memref<2x8x64xbf16>) {
  %qkv = rank.alloc : memref<2x8x128xbf16>
  %out = rank.alloc : memref<2x8x64xbf16>
  rank.attention %qkv into %out {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16> -> memref<2x8x64xbf16>
  %y = rank.alloc : memref<2x8x64xbf16>
  rank.scale %out into %y {factor = 2.0 : f32} : memref<2x8x64xbf16> -> memref<2x8x64xbf16>
  %qkv2 = rank.alloc : memref<2x8x128xbf16>
  %out2 = rank.alloc : memref<2x8x64xbf16>
  rank.attention %qkv2 into %out2 {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16> -> memref<2x8x64xbf16>
  %y2 = rank.alloc : memref<2x8x64xbf16>
  rank.scale %out2 into %y2 {factor = 2.0 : f32} : memref<2x8x64xbf16> -> memref<2x8x64xbf16>
  %dout2 = rank.alloc : memref<2x8x64xbf16>
  rank.scale %r into %dout2 {factor = 2.0 : f32} : memref<2x8x64xbf16> -> memref<2x8x64xbf16>
  %dqkv2 = rank.alloc : memref<2x8x128xbf16>
  rank.attention_grad %qkv2, %dout2 into %dqkv2 {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>
  %dout = rank.alloc : memref<2x8x64xbf16>
  rank.scale %r into %dout {factor = 2.0 : f32} : memref<2x8x64xbf16> -> memref<2x8x64xbf16>
  %dqkv = rank.alloc : memref<2x8x128xbf16>
  rank.attention_grad %qkv, %dout into %dqkv {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK: rank.attention %{{.*}} into
// CHECK: rank.attention_lse
// CHECK: rank.attention_grad_lse
// CHECK: rank.attention_grad %
// CHECK: return

// -----

// Context parallelism's all_gather (cp 2: 8 of 16 positions, every key
// gathered): the forward keeps its two chunks' log-sum-exps (B 2 x H 4 x 4
// rows each, packed: 64 floats) and the gradient reads them with the
// forward's output, which the weight gradient (here a scale) reads in the
// backward anyway. The host keeps nothing for it.
func.func @plan_step() {
  %qkv = rank.alloc : memref<2x8x128xbf16>
  %kv = rank.alloc : memref<2x16x64xbf16>
  %out = rank.alloc : memref<2x8x64xbf16>
  rank.attention_cp %qkv, %kv into %out over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x16x64xbf16> -> memref<2x8x64xbf16>
  %dout = rank.alloc : memref<2x8x64xbf16>
  %w = rank.alloc : memref<2x8x64xbf16>
  rank.scale %out into %w {factor = 2.0 : f32} : memref<2x8x64xbf16> -> memref<2x8x64xbf16>
  %dqkv = rank.alloc : memref<2x8x128xbf16>
  %dkv = rank.alloc : memref<2x16x64xf32>
  rank.attention_cp_grad %qkv, %kv, %dout into %dqkv, %dkv over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x16x64xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>, memref<2x16x64xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK: %[[OUT:.*]] = rank.alloc : memref<2x8x64xbf16>
// CHECK-NEXT: %[[LSE:.*]] = rank.alloc : memref<64xf32>
// CHECK-NEXT: rank.attention_cp %{{.*}}, %{{.*}} into %[[OUT]] keeping %[[LSE]] over "cp" {{.*}} -> memref<2x8x64xbf16> keeping memref<64xf32>
// CHECK: rank.attention_cp_grad %{{.*}}, %{{.*}}, %{{.*}} kept %[[OUT]], %[[LSE]] into
// HOST: rank.attention_cp %{{[^ ]*}}, %{{[^ ]*}} into %{{[^ ]*}} over "cp"
// HOST: rank.attention_cp_grad %{{[^ ]*}}, %{{[^ ]*}}, %{{[^ ]*}} into

// -----

// Attention dropout, fp32 (both the tiles), the output written between the
// two, or keys and values in a view of another buffer (the runtime's
// backward could not tell whether the forward ran cuDNN on them): nothing
// kept.
func.func @plan_step() {
  %qkv = rank.alloc : memref<2x8x128xbf16>
  %kv = rank.alloc : memref<2x16x64xbf16>
  %out = rank.alloc : memref<2x8x64xbf16>
  rank.attention_cp %qkv, %kv into %out over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64, dropout = 1.000000e-01 : f32, dropout_uid = 3 : i64} : memref<2x8x128xbf16>, memref<2x16x64xbf16> -> memref<2x8x64xbf16>
  %dout = rank.alloc : memref<2x8x64xbf16>
  %dqkv = rank.alloc : memref<2x8x128xbf16>
  %dkv = rank.alloc : memref<2x16x64xf32>
  rank.attention_cp_grad %qkv, %kv, %dout into %dqkv, %dkv over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64, dropout = 1.000000e-01 : f32, dropout_uid = 3 : i64} : memref<2x8x128xbf16>, memref<2x16x64xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>, memref<2x16x64xf32>
  %qkv32 = rank.alloc : memref<2x8x128xf32>
  %kv32 = rank.alloc : memref<2x16x64xf32>
  %out32 = rank.alloc : memref<2x8x64xf32>
  rank.attention_cp %qkv32, %kv32 into %out32 over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xf32>, memref<2x16x64xf32> -> memref<2x8x64xf32>
  %dout32 = rank.alloc : memref<2x8x64xf32>
  %dqkv32 = rank.alloc : memref<2x8x128xf32>
  %dkv32 = rank.alloc : memref<2x16x64xf32>
  rank.attention_cp_grad %qkv32, %kv32, %dout32 into %dqkv32, %dkv32 over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xf32>, memref<2x16x64xf32>, memref<2x8x64xf32> -> memref<2x8x128xf32>, memref<2x16x64xf32>
  %qkv3 = rank.alloc : memref<2x8x128xbf16>
  %out3 = rank.alloc : memref<2x8x64xbf16>
  rank.attention_cp %qkv3, %kv into %out3 over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x16x64xbf16> -> memref<2x8x64xbf16>
  %r = rank.alloc : memref<2x8x64xbf16>
  rank.add %out3, %r into %out3 : memref<2x8x64xbf16>, memref<2x8x64xbf16> -> memref<2x8x64xbf16>
  %dqkv3 = rank.alloc : memref<2x8x128xbf16>
  %dkv3 = rank.alloc : memref<2x16x64xf32>
  rank.attention_cp_grad %qkv3, %kv, %dout into %dqkv3, %dkv3 over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x16x64xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>, memref<2x16x64xf32>
  %qkv4 = rank.alloc : memref<2x8x128xbf16>
  %kvbig = rank.alloc : memref<2x1024xbf16>
  %kv4 = rank.view %kvbig : memref<2x1024xbf16> -> memref<2x16x64xbf16>
  %out4 = rank.alloc : memref<2x8x64xbf16>
  rank.attention_cp %qkv4, %kv4 into %out4 over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x16x64xbf16> -> memref<2x8x64xbf16>
  %w4 = rank.alloc : memref<2x8x64xbf16>
  rank.scale %out4 into %w4 {factor = 2.0 : f32} : memref<2x8x64xbf16> -> memref<2x8x64xbf16>
  %dqkv4 = rank.alloc : memref<2x8x128xbf16>
  %dkv4 = rank.alloc : memref<2x16x64xf32>
  rank.attention_cp_grad %qkv4, %kv4, %dout into %dqkv4, %dkv4 over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x16x64xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>, memref<2x16x64xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: keeping
// CHECK-NOT: kept
// CHECK: return


// -----

// Context parallelism's all-to-all (Ulysses): the output of every position
// of this rank's heads is read only by heads_to_seq. It is kept for the
// backward with its log-sum-exp (one more output per layer, as
// DeepSpeed-Ulysses keeps): the backward runs no forward again.
func.func @plan_step(%dy: memref<2x8x32xbf16>) {
  %qkv = rank.alloc : memref<2x8x64xbf16>
  %o = rank.alloc : memref<2x8x32xbf16>
  rank.attention %qkv into %o {num_heads = 2 : i64, num_kv_heads = 1 : i64} : memref<2x8x64xbf16> -> memref<2x8x32xbf16>
  %out = rank.alloc : memref<2x4x64xbf16>
  rank.heads_to_seq %o into %out over "cp" {kv_width = 0 : i64, q_width = 64 : i64} : memref<2x8x32xbf16> -> memref<2x4x64xbf16>
  %qkv2 = rank.alloc : memref<2x8x64xbf16>
  %o2 = rank.alloc : memref<2x8x32xbf16>
  rank.attention %qkv2 into %o2 {num_heads = 2 : i64, num_kv_heads = 1 : i64} : memref<2x8x64xbf16> -> memref<2x8x32xbf16>
  %dqkv = rank.alloc : memref<2x8x64xbf16>
  rank.attention_grad %qkv, %dy into %dqkv {num_heads = 2 : i64, num_kv_heads = 1 : i64} : memref<2x8x64xbf16>, memref<2x8x32xbf16> -> memref<2x8x64xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK: %[[O:.*]] = rank.alloc : memref<2x8x32xbf16>
// CHECK-NEXT: %[[LSE:.*]] = rank.alloc : memref<2x2x8xf32>
// CHECK-NEXT: rank.attention_lse %{{.*}} into %[[O]], %[[LSE]]
// CHECK: rank.heads_to_seq %[[O]]
// CHECK: rank.attention_grad_lse %{{.*}}, %[[O]], %[[LSE]], %{{.*}} into

