// RUN: plan-opt %s --split-input-file | plan-opt --split-input-file | FileCheck %s
// The mixture-of-experts ops round-trip, with and without a gate weight.

// CHECK-LABEL: func.func @swiglu
// CHECK: plan.moe_topk %arg0 {top_k = 2 : i64} : tensor<2x4x8xf32> -> tensor<2x4x2xi32>
// CHECK: plan.moe_gates %arg0, %{{.*}} : tensor<2x4x8xf32>, tensor<2x4x2xi32> -> tensor<2x4x2xf32>
// CHECK: plan.moe_experts %arg1, %{{.*}}, %{{.*}}, %arg2, %arg3, %arg4 {act = "swiglu"} : tensor<2x4x16xbf16>, tensor<2x4x2xi32>, tensor<2x4x2xf32>, tensor<8x16x32xbf16>, tensor<8x32x16xbf16>, tensor<8x16x32xbf16> -> tensor<2x4x16xbf16>
// CHECK: plan.moe_experts_grad %arg1, %{{.*}}, %{{.*}}, %{{.*}}, %arg2, %arg3, %arg4 {act = "swiglu"} : (tensor<2x4x16xbf16>, tensor<2x4x2xi32>, tensor<2x4x2xf32>, tensor<2x4x16xbf16>, tensor<8x16x32xbf16>, tensor<8x32x16xbf16>, tensor<8x16x32xbf16>) -> (tensor<2x4x16xbf16>, tensor<2x4x2xf32>, tensor<8x16x32xbf16>, tensor<8x32x16xbf16>, tensor<8x16x32xbf16>)
// CHECK: plan.moe_gates_grad %arg0, %{{.*}}, %{{.*}} : tensor<2x4x8xf32>, tensor<2x4x2xi32>, tensor<2x4x2xf32>
func.func @swiglu(%l: tensor<2x4x8xf32>, %x: tensor<2x4x16xbf16>, %up: tensor<8x16x32xbf16>, %down: tensor<8x32x16xbf16>, %gate: tensor<8x16x32xbf16>) -> tensor<2x4x8xf32> {
  %i = plan.moe_topk %l {top_k = 2 : i64} : tensor<2x4x8xf32> -> tensor<2x4x2xi32>
  %g = plan.moe_gates %l, %i : tensor<2x4x8xf32>, tensor<2x4x2xi32> -> tensor<2x4x2xf32>
  %y = plan.moe_experts %x, %i, %g, %up, %down, %gate {act = "swiglu"} : tensor<2x4x16xbf16>, tensor<2x4x2xi32>, tensor<2x4x2xf32>, tensor<8x16x32xbf16>, tensor<8x32x16xbf16>, tensor<8x16x32xbf16> -> tensor<2x4x16xbf16>
  %dx, %dg, %du, %dd, %dgate = plan.moe_experts_grad %x, %i, %g, %y, %up, %down, %gate {act = "swiglu"} : (tensor<2x4x16xbf16>, tensor<2x4x2xi32>, tensor<2x4x2xf32>, tensor<2x4x16xbf16>, tensor<8x16x32xbf16>, tensor<8x32x16xbf16>, tensor<8x16x32xbf16>) -> (tensor<2x4x16xbf16>, tensor<2x4x2xf32>, tensor<8x16x32xbf16>, tensor<8x32x16xbf16>, tensor<8x16x32xbf16>)
  %dl = plan.moe_gates_grad %l, %i, %dg : tensor<2x4x8xf32>, tensor<2x4x2xi32>, tensor<2x4x2xf32>
  return %dl : tensor<2x4x8xf32>
}

// -----

// CHECK-LABEL: func.func @gelu
// CHECK: plan.moe_experts %arg0, %arg1, %arg2, %arg3, %arg4 {act = "gelu"} : tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x8xf32> -> tensor<6x8xf32>
// CHECK: plan.moe_experts_grad %arg0, %arg1, %arg2, %{{.*}}, %arg3, %arg4 {act = "gelu"} : (tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<6x8xf32>, tensor<4x16x32xf32>, tensor<4x32x8xf32>) -> (tensor<6x16xf32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x8xf32>)
func.func @gelu(%x: tensor<6x16xf32>, %i: tensor<6x1xi32>, %g: tensor<6x1xf32>, %up: tensor<4x16x32xf32>, %down: tensor<4x32x8xf32>) -> tensor<6x16xf32> {
  %y = plan.moe_experts %x, %i, %g, %up, %down {act = "gelu"} : tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x8xf32> -> tensor<6x8xf32>
  %dx, %dg, %du, %dd = plan.moe_experts_grad %x, %i, %g, %y, %up, %down {act = "gelu"} : (tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<6x8xf32>, tensor<4x16x32xf32>, tensor<4x32x8xf32>) -> (tensor<6x16xf32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x8xf32>)
  return %dx : tensor<6x16xf32>
}
