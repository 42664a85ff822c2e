// RUN: plan-opt %s --plan-memory | FileCheck %s --check-prefixes=CHECK,HOST
// RUN: plan-opt %s --plan-memory=target=cuda | FileCheck %s --check-prefixes=CHECK,CUDA
// RUN: not plan-opt %s --plan-memory=target=tpu 2>&1 | FileCheck %s --check-prefix=BAD

// The workspace of ops given bf16 buffers (planrt/workspace.h): an op whose
// kernels read and write 16-bit buffers in place (add, bias_grad into f32)
// takes nothing; any other takes one fp32 copy per 16-bit operand
// (softmax: 2 x 1024 B). A 16-bit matmul copies its operands on the host
// (1024 + 16384 + 1024 B; a and b only for an f32 result) and not on cuda,
// whose cuBLASLt reads them as they are. (On cuda the placement by size
// wins: 17408 B, where placing in program order takes 17920 B.)
module {
  plan.mesh @mesh axes = ["dp"] shape = [1]
  func.func @plan_step() {
    %a = rank.alloc : memref<4x64xbf16>
    %b = rank.alloc : memref<64x64xbf16>
    %c = rank.alloc : memref<4x64xbf16>
    %d = rank.alloc : memref<4x64xbf16>
    %e = rank.alloc : memref<4x64xbf16>
    %w = rank.alloc : memref<64x64xf32>
    %g = rank.alloc : memref<64xf32>
    rank.matmul %a, %b into %c {transpose_lhs = false, transpose_rhs = false} : memref<4x64xbf16>, memref<64x64xbf16> -> memref<4x64xbf16>
    rank.add %c, %a into %d : memref<4x64xbf16>, memref<4x64xbf16> -> memref<4x64xbf16>
    rank.softmax %d into %e : memref<4x64xbf16> -> memref<4x64xbf16>
    rank.matmul %a, %e into %w {transpose_lhs = true, transpose_rhs = false} : memref<4x64xbf16>, memref<4x64xbf16> -> memref<64x64xf32>
    rank.bias_grad %e into %g : memref<4x64xbf16> -> memref<64xf32>
    rank.report_grad_norm %g : memref<64xf32>
    return
  }
}

// HOST: func.func @plan_step() attributes {rank.arena_bytes = array<i64: 27648>, rank.buffer_bytes = array<i64: 49408>, rank.workspace_bytes = array<i64: 18432>}
// CUDA: func.func @plan_step() attributes {rank.arena_bytes = array<i64: 17408>, rank.buffer_bytes = array<i64: 28928>, rank.workspace_bytes = array<i64: 2048>}
// HOST: rank.matmul {{.*}} {rank.workspace = array<i64: {{[0-9]+}}, 18432>, transpose_lhs = false
// CUDA: rank.matmul {{.*}} {transpose_lhs = false
// CHECK: rank.add %{{.*}}, %{{.*}} into %{{.*}} : memref<4x64xbf16>
// CHECK: rank.softmax {{.*}} {rank.workspace = array<i64: {{[0-9]+}}, 2048>}
// HOST: rank.matmul {{.*}} {rank.workspace = array<i64: {{[0-9]+}}, 2048>, transpose_lhs = true
// CUDA: rank.matmul {{.*}} {transpose_lhs = true
// CHECK: rank.bias_grad %{{.*}} into %{{.*}} : memref<4x64xbf16> -> memref<64xf32>

// BAD: error: plan-memory: target must be host or cuda, got 'tpu'
