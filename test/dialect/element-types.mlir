// RUN: plan-opt %s --split-input-file --verify-diagnostics | FileCheck %s
// The plan and rank dialects carry f32, bf16 and f16 float tensors and
// buffers (mixed precision). Ops compute in fp32, so one op may mix f32
// with one 16-bit type, never bf16 with f16; plan.cast and rank.cast
// convert.

// CHECK-LABEL: func.func @plan_bf16
func.func @plan_bf16(%x: tensor<8x4xbf16>, %w: tensor<4x4xbf16>, %b: tensor<4xbf16>) -> tensor<8x4xbf16> {
  // CHECK: plan.matmul {{.*}} : tensor<8x4xbf16>, tensor<4x4xbf16> -> tensor<8x4xbf16>
  %0 = plan.matmul %x, %w : tensor<8x4xbf16>, tensor<4x4xbf16> -> tensor<8x4xbf16>
  // CHECK: plan.bias_add {{.*}} : tensor<8x4xbf16>, tensor<4xbf16>
  %1 = plan.bias_add %0, %b : tensor<8x4xbf16>, tensor<4xbf16>
  // CHECK: plan.gelu {{.*}} : tensor<8x4xbf16>
  %2 = plan.gelu %1 : tensor<8x4xbf16>
  return %2 : tensor<8x4xbf16>
}

// CHECK-LABEL: func.func @plan_f16
func.func @plan_f16(%x: tensor<8x4xf16>) -> tensor<8x4xf16> {
  // CHECK: plan.relu {{.*}} : tensor<8x4xf16>
  %0 = plan.relu %x : tensor<8x4xf16>
  return %0 : tensor<8x4xf16>
}

// CHECK-LABEL: func.func @rank_bf16
func.func @rank_bf16(%x: memref<4x4xbf16>, %w: memref<4x2xbf16>) {
  // CHECK: rank.alloc : memref<4x2xbf16>
  %t = rank.alloc : memref<4x2xbf16>
  // CHECK: rank.matmul {{.*}} : memref<4x4xbf16>, memref<4x2xbf16> -> memref<4x2xbf16>
  rank.matmul %x, %w into %t {transpose_lhs = false, transpose_rhs = false} : memref<4x4xbf16>, memref<4x2xbf16> -> memref<4x2xbf16>
  return
}

// -----

// CHECK-LABEL: func.func @mixed_with_f32
func.func @mixed_with_f32(%x: tensor<8x4xbf16>, %w: tensor<4x4xf32>) -> tensor<4x4xf32> {
  // CHECK: plan.cast {{.*}} : tensor<4x4xf32> -> tensor<4x4xbf16>
  %w16 = plan.cast %w : tensor<4x4xf32> -> tensor<4x4xbf16>
  // A weight gradient out of bf16 operands in f32.
  // CHECK: plan.matmul {{.*}} : tensor<8x4xbf16>, tensor<8x4xbf16> -> tensor<4x4xf32>
  %g = plan.matmul %x, %x {transpose_lhs} : tensor<8x4xbf16>, tensor<8x4xbf16> -> tensor<4x4xf32>
  return %g : tensor<4x4xf32>
}

// CHECK-LABEL: func.func @rank_cast
func.func @rank_cast(%x: memref<4x4xf32>) {
  %t = rank.alloc : memref<4x4xf16>
  // CHECK: rank.cast {{.*}} : memref<4x4xf32> -> memref<4x4xf16>
  rank.cast %x into %t : memref<4x4xf32> -> memref<4x4xf16>
  return
}

// -----

func.func @plan_mixed(%x: tensor<8x4xbf16>, %w: tensor<4x4xf16>) {
  // expected-error @below {{'plan.matmul' op mixes the 16-bit float types 'bf16' and 'f16'; one op holds f32 and at most one 16-bit type (convert with plan.cast)}}
  %0 = plan.matmul %x, %w : tensor<8x4xbf16>, tensor<4x4xf16> -> tensor<8x4xbf16>
  return
}

// -----

func.func @rank_mixed(%x: memref<4x4xf16>, %w: memref<4x2xf16>) {
  %t = rank.alloc : memref<4x2xbf16>
  // expected-error @below {{'rank.matmul' op mixes the 16-bit float types 'f16' and 'bf16'; one op holds f32 and at most one 16-bit type (convert with plan.cast)}}
  rank.matmul %x, %w into %t {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf16>, memref<4x2xf16> -> memref<4x2xbf16>
  return
}

// -----

func.func @cast_shape(%x: tensor<8x4xf32>) {
  // expected-error @below {{'plan.cast' op converts 'tensor<8x4xf32>' to 'tensor<4x8xbf16>'; a cast keeps the shape}}
  %0 = plan.cast %x : tensor<8x4xf32> -> tensor<4x8xbf16>
  return
}

// -----

func.func @plan_f64(%x: tensor<8x4xf64>) {
  // expected-error @below {{operand #0 must be ranked tensor of 32-bit float or bfloat16 type or 16-bit float values}}
  %0 = plan.relu %x : tensor<8x4xf64>
  return
}
