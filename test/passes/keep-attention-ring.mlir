// RUN: plan-opt %s --split-input-file --plan-keep-attention="policy=selective target=cuda" | FileCheck %s
// RUN: plan-opt %s --split-input-file --plan-keep-attention="policy=none target=host" | FileCheck %s --check-prefix=HOST
// RUN: plan-opt %s --split-input-file --plan-keep-attention="policy=full target=host" | FileCheck %s --check-prefix=HOST

// Context parallelism's ring, on every target and under every policy, fp32
// and with dropout too: the forward keeps each row's log-sum-exp after the
// ring [B, H, L], and the gradient reads it with the forward's output
// (read in the backward anyway, here by the scale), instead of running the
// forward's ring again.
func.func @plan_step() {
  %qkv = rank.alloc : memref<2x8x128xf32>
  %out = rank.alloc : memref<2x8x64xf32>
  rank.attention_ring %qkv into %out over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64, dropout = 1.000000e-01 : f32, dropout_uid = 3 : i64} : memref<2x8x128xf32> -> memref<2x8x64xf32>
  %dout = rank.alloc : memref<2x8x64xf32>
  %y = rank.alloc : memref<2x8x64xf32>
  rank.scale %out into %y {factor = 2.0 : f32} : memref<2x8x64xf32> -> memref<2x8x64xf32>
  %dqkv = rank.alloc : memref<2x8x128xf32>
  rank.attention_ring_grad %qkv, %dout into %dqkv over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64, dropout = 1.000000e-01 : f32, dropout_uid = 3 : i64} : memref<2x8x128xf32>, memref<2x8x64xf32> -> memref<2x8x128xf32>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK: %[[QKV:.*]] = rank.alloc : memref<2x8x128xf32>
// CHECK-NEXT: %[[OUT:.*]] = rank.alloc : memref<2x8x64xf32>
// CHECK-NEXT: %[[LSE:.*]] = rank.alloc : memref<2x4x8xf32>
// CHECK-NEXT: rank.attention_ring %[[QKV]] into %[[OUT]] keeping %[[LSE]] over "cp" {{.*}} -> memref<2x8x64xf32> keeping memref<2x4x8xf32>
// CHECK: rank.attention_ring_grad %[[QKV]], %{{.*}} kept %[[OUT]], %[[LSE]] into %{{.*}} over "cp"
// HOST-LABEL: func.func @plan_step
// HOST: rank.attention_ring {{.*}} keeping
// HOST: rank.attention_ring_grad {{.*}} kept

// -----

// The output written between the two, or the gradient of another dropout
// draw: nothing kept.
func.func @plan_step() {
  %qkv = rank.alloc : memref<2x8x128xbf16>
  %out = rank.alloc : memref<2x8x64xbf16>
  rank.attention_ring %qkv into %out over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16> -> memref<2x8x64xbf16>
  %dout = rank.alloc : memref<2x8x64xbf16>
  rank.scale %dout into %out {factor = 2.0 : f32} : memref<2x8x64xbf16> -> memref<2x8x64xbf16>
  %dqkv = rank.alloc : memref<2x8x128xbf16>
  rank.attention_ring_grad %qkv, %dout into %dqkv over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x128xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>
  %q2 = rank.alloc : memref<2x8x128xbf16>
  %o2 = rank.alloc : memref<2x8x64xbf16>
  rank.attention_ring %q2 into %o2 over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64, dropout = 1.000000e-01 : f32, dropout_uid = 3 : i64} : memref<2x8x128xbf16> -> memref<2x8x64xbf16>
  %y = rank.alloc : memref<2x8x64xbf16>
  rank.scale %o2 into %y {factor = 2.0 : f32} : memref<2x8x64xbf16> -> memref<2x8x64xbf16>
  %dq2 = rank.alloc : memref<2x8x128xbf16>
  rank.attention_ring_grad %q2, %dout into %dq2 over "cp" {num_heads = 4 : i64, num_kv_heads = 2 : i64, dropout = 1.000000e-01 : f32, dropout_uid = 4 : i64} : memref<2x8x128xbf16>, memref<2x8x64xbf16> -> memref<2x8x128xbf16>
  return
}
// CHECK-LABEL: func.func @plan_step
// CHECK-NOT: keeping
// CHECK-NOT: kept
// CHECK: return
// HOST-LABEL: func.func @plan_step
// HOST-NOT: keeping
// HOST: return
