// RUN: plan-opt %s --plan-keep-attention=policy=none | FileCheck %s
// RUN: plan-opt %s --plan-keep-attention=policy=selective | FileCheck %s --check-prefix=SELECTIVE

// recompute = none: the attention keeps its exponentials [B, H, S, S] and
// row statistics [B, H, S, 2] for its backward, which reads them.
module {
  func.func @plan_step() {
    %qkv = rank.alloc : memref<2x8x48xf32>
    %out = rank.alloc : memref<2x8x16xf32>
    rank.attention %qkv into %out {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x48xf32> -> memref<2x8x16xf32>
    %dout = rank.alloc : memref<2x8x16xf32>
    %dqkv = rank.alloc : memref<2x8x48xf32>
    rank.attention_grad %qkv, %dout into %dqkv {num_heads = 4 : i64, num_kv_heads = 2 : i64} : memref<2x8x48xf32>, memref<2x8x16xf32> -> memref<2x8x48xf32>
    return
  }
}

// CHECK: %[[QKV:.*]] = rank.alloc : memref<2x8x48xf32>
// CHECK: %[[OUT:.*]] = rank.alloc : memref<2x8x16xf32>
// CHECK-NEXT: %[[KEEP:.*]] = rank.alloc : memref<2x4x8x8xf32>
// CHECK-NEXT: %[[STATS:.*]] = rank.alloc : memref<2x4x8x2xf32>
// CHECK-NEXT: rank.attention_keep %[[QKV]] into %[[OUT]], %[[KEEP]], %[[STATS]] {num_heads = 4 : i64, num_kv_heads = 2 : i64}
// CHECK: rank.attention_grad_kept %[[QKV]], %[[KEEP]], %[[STATS]], %{{.*}} into %{{.*}} {num_heads = 4 : i64, num_kv_heads = 2 : i64}
// CHECK-NOT: rank.attention_grad %

// SELECTIVE: rank.attention %
// SELECTIVE: rank.attention_grad %
// SELECTIVE-NOT: keep

// RUN: plan-opt %s --plan-keep-attention="policy=none target=cuda" | FileCheck %s --check-prefix=CUDA
// The cuda target's tiled attention recomputes from the row statistics:
// nothing is kept, the ops stay as they are.
// CUDA-NOT: rank.attention_keep
// CUDA-NOT: rank.attention_grad_kept
// CUDA: rank.attention %{{.*}} into
// CUDA: rank.attention_grad %{{.*}} into
