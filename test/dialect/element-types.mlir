// RUN: plan-opt %s --split-input-file --verify-diagnostics | FileCheck %s
// The plan and rank dialects carry f32, bf16 and f16 float tensors and
// buffers (mixed precision, issue 9, will produce the 16-bit ones); the
// float operands and results of one op share one element type.

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

func.func @plan_mixed(%x: tensor<8x4xbf16>, %w: tensor<4x4xf32>) {
  // expected-error @below {{'plan.matmul' op mixes float element types 'bf16' and 'f32'; the float operands and results of one op share one type}}
  %0 = plan.matmul %x, %w : tensor<8x4xbf16>, tensor<4x4xf32> -> tensor<8x4xbf16>
  return
}

// -----

func.func @rank_mixed(%x: memref<4x4xf16>, %w: memref<4x2xf16>) {
  %t = rank.alloc : memref<4x2xf32>
  // expected-error @below {{'rank.matmul' op mixes float element types 'f16' and 'f32'; the float operands and results of one op share one type}}
  rank.matmul %x, %w into %t {transpose_lhs = false, transpose_rhs = false} : memref<4x4xf16>, memref<4x2xf16> -> memref<4x2xf32>
  return
}

// -----

func.func @plan_f64(%x: tensor<8x4xf64>) {
  // expected-error @below {{operand #0 must be ranked tensor of 32-bit float or bfloat16 type or 16-bit float values}}
  %0 = plan.relu %x : tensor<8x4xf64>
  return
}
