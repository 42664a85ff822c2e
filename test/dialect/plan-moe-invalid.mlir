// RUN: plan-opt %s --split-input-file --verify-diagnostics
// Every verifier diagnostic of the mixture-of-experts ops.

func.func @topk_k(%l: tensor<2x4x8xf32>) {
  // expected-error @below {{top_k must be in [1, 8] (the number of experts), got 9}}
  %i = plan.moe_topk %l {top_k = 9 : i64} : tensor<2x4x8xf32> -> tensor<2x4x9xi32>
  return
}

// -----

func.func @topk_shape(%l: tensor<2x4x8xf32>) {
  // expected-error @below {{expects experts [tokens..., 2] for logits 'tensor<2x4x8xf32>', got 'tensor<2x5x2xi32>'}}
  %i = plan.moe_topk %l {top_k = 2 : i64} : tensor<2x4x8xf32> -> tensor<2x5x2xi32>
  return
}

// -----

func.func @topk_rank(%l: tensor<8xf32>) {
  // expected-error @below {{expects logits [tokens..., experts], got 'tensor<8xf32>'}}
  %i = plan.moe_topk %l {top_k = 2 : i64} : tensor<8xf32> -> tensor<2xi32>
  return
}

// -----

func.func @gates_type(%l: tensor<2x4x8xf32>, %i: tensor<2x4x2xi32>) {
  // expected-error @below {{expects f32 gates shaped like the experts 'tensor<2x4x2xi32>', got 'tensor<2x4x2xbf16>'}}
  %g = plan.moe_gates %l, %i : tensor<2x4x8xf32>, tensor<2x4x2xi32> -> tensor<2x4x2xbf16>
  return
}

// -----

func.func @gates_grad(%l: tensor<2x4x8xf32>, %i: tensor<2x4x2xi32>, %d: tensor<2x4x3xf32>) {
  // expected-error @below {{expects an f32 gradient shaped like the experts 'tensor<2x4x2xi32>', got 'tensor<2x4x3xf32>'}}
  %g = plan.moe_gates_grad %l, %i, %d : tensor<2x4x8xf32>, tensor<2x4x2xi32>, tensor<2x4x3xf32>
  return
}

// -----

func.func @act(%x: tensor<6x16xf32>, %i: tensor<6x1xi32>, %g: tensor<6x1xf32>, %up: tensor<4x16x32xf32>, %down: tensor<4x32x16xf32>) {
  // expected-error @below {{act must be "swiglu" or "gelu", got "relu"}}
  %y = plan.moe_experts %x, %i, %g, %up, %down {act = "relu"} : tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x16xf32> -> tensor<6x16xf32>
  return
}

// -----

func.func @gate_missing(%x: tensor<6x16xf32>, %i: tensor<6x1xi32>, %g: tensor<6x1xf32>, %up: tensor<4x16x32xf32>, %down: tensor<4x32x16xf32>) {
  // expected-error @below {{takes a gate weight with act = "swiglu" and none with "gelu"}}
  %y = plan.moe_experts %x, %i, %g, %up, %down {act = "swiglu"} : tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x16xf32> -> tensor<6x16xf32>
  return
}

// -----

func.func @up_shape(%x: tensor<6x16xf32>, %i: tensor<6x1xi32>, %g: tensor<6x1xf32>, %up: tensor<4x8x32xf32>, %down: tensor<4x32x16xf32>) {
  // expected-error @below {{expects up [experts, 16, hidden], got 'tensor<4x8x32xf32>'}}
  %y = plan.moe_experts %x, %i, %g, %up, %down {act = "gelu"} : tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<4x8x32xf32>, tensor<4x32x16xf32> -> tensor<6x16xf32>
  return
}

// -----

func.func @down_shape(%x: tensor<6x16xf32>, %i: tensor<6x1xi32>, %g: tensor<6x1xf32>, %up: tensor<4x16x32xf32>, %down: tensor<3x32x16xf32>) {
  // expected-error @below {{expects down [4, 32, d'], got 'tensor<3x32x16xf32>'}}
  %y = plan.moe_experts %x, %i, %g, %up, %down {act = "gelu"} : tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<3x32x16xf32> -> tensor<6x16xf32>
  return
}

// -----

func.func @gate_shape(%x: tensor<6x16xf32>, %i: tensor<6x1xi32>, %g: tensor<6x1xf32>, %up: tensor<4x16x32xf32>, %down: tensor<4x32x16xf32>, %gate: tensor<4x16x8xf32>) {
  // expected-error @below {{expects gate shaped like up 'tensor<4x16x32xf32>', got 'tensor<4x16x8xf32>'}}
  %y = plan.moe_experts %x, %i, %g, %up, %down, %gate {act = "swiglu"} : tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x16xf32>, tensor<4x16x8xf32> -> tensor<6x16xf32>
  return
}

// -----

func.func @elt(%x: tensor<6x16xbf16>, %i: tensor<6x1xi32>, %g: tensor<6x1xf32>, %up: tensor<4x16x32xf32>, %down: tensor<4x32x16xf32>) {
  // expected-error @below {{expects the weights and the result in the input's element type 'bf16', got 'tensor<4x16x32xf32>'}}
  %y = plan.moe_experts %x, %i, %g, %up, %down {act = "gelu"} : tensor<6x16xbf16>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x16xf32> -> tensor<6x16xbf16>
  return
}

// -----

func.func @routing(%x: tensor<6x16xf32>, %i: tensor<5x1xi32>, %g: tensor<5x1xf32>, %up: tensor<4x16x32xf32>, %down: tensor<4x32x16xf32>) {
  // expected-error @below {{expects experts (i32) and f32 gates [tokens..., K] for the input 'tensor<6x16xf32>', got 'tensor<5x1xi32>' and 'tensor<5x1xf32>'}}
  %y = plan.moe_experts %x, %i, %g, %up, %down {act = "gelu"} : tensor<6x16xf32>, tensor<5x1xi32>, tensor<5x1xf32>, tensor<4x16x32xf32>, tensor<4x32x16xf32> -> tensor<6x16xf32>
  return
}

// -----

func.func @result(%x: tensor<6x16xf32>, %i: tensor<6x1xi32>, %g: tensor<6x1xf32>, %up: tensor<4x16x32xf32>, %down: tensor<4x32x16xf32>) {
  // expected-error @below {{expects a result [tokens..., 16], got 'tensor<6x8xf32>'}}
  %y = plan.moe_experts %x, %i, %g, %up, %down {act = "gelu"} : tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x16xf32> -> tensor<6x8xf32>
  return
}

// -----

func.func @input_rank(%x: tensor<16xf32>, %i: tensor<6x1xi32>, %g: tensor<6x1xf32>, %up: tensor<4x16x32xf32>, %down: tensor<4x32x16xf32>) {
  // expected-error @below {{expects an input [tokens..., d], got 'tensor<16xf32>'}}
  %y = plan.moe_experts %x, %i, %g, %up, %down {act = "gelu"} : tensor<16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x16xf32> -> tensor<6x16xf32>
  return
}

// -----

func.func @grad_gate(%x: tensor<6x16xf32>, %i: tensor<6x1xi32>, %g: tensor<6x1xf32>, %dy: tensor<6x16xf32>, %up: tensor<4x16x32xf32>, %down: tensor<4x32x16xf32>) {
  // expected-error @below {{has a gate gradient exactly when it has a gate weight, of its type}}
  %a:5 = plan.moe_experts_grad %x, %i, %g, %dy, %up, %down {act = "gelu"} : (tensor<6x16xf32>, tensor<6x1xi32>, tensor<6x1xf32>, tensor<6x16xf32>, tensor<4x16x32xf32>, tensor<4x32x16xf32>) -> (tensor<6x16xf32>, tensor<6x1xf32>, tensor<4x16x32xf32>, tensor<4x32x16xf32>, tensor<4x16x32xf32>)
  return
}
