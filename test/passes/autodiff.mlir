// RUN: plan-opt %s --plan-autodiff --split-input-file --verify-diagnostics | FileCheck %s

// A linear layer, gelu, a residual add and a transposed matmul: every
// backward rule plus gradient accumulation (x1 feeds two ops).
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 5.000000e-02 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %y: tensor<8x4xf32> {plan.kind = "label", plan.name = "y"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"},
             %b: tensor<4xf32> {plan.kind = "param", plan.name = "b"},
             %v: tensor<4x4xf32> {plan.kind = "param", plan.name = "v"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.bias_add %0, %b : tensor<8x4xf32>, tensor<4xf32>
  %2 = plan.gelu %1 : tensor<8x4xf32>
  %3 = plan.matmul %2, %v {transpose_rhs} : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %4 = plan.add %3, %2 : tensor<8x4xf32>
  %5 = plan.mse_loss %4, %y : tensor<8x4xf32> -> tensor<f32>
  return %5 : tensor<f32>
}

// The forward function stays; the step returns loss and updated parameters.
// CHECK-LABEL: func.func @m(
// CHECK-LABEL: func.func @train_step(
// CHECK-SAME: -> (tensor<f32> {plan.result = "loss"}, tensor<f32> {plan.result = "grad_sumsq"}, tensor<4x4xf32>, tensor<4xf32>, tensor<4x4xf32>) attributes {plan.train_step}
// CHECK: %[[MM:.*]] = plan.matmul %arg0, %arg2
// CHECK: %[[BA:.*]] = plan.bias_add %[[MM]], %arg3
// CHECK: %[[G:.*]] = plan.gelu %[[BA]]
// CHECK: %[[MM2:.*]] = plan.matmul %[[G]], %arg4 {transpose_rhs}
// CHECK: %[[SUM:.*]] = plan.add %[[MM2]], %[[G]]
// CHECK: %[[LOSS:.*]] = plan.mse_loss %[[SUM]], %arg1
// CHECK: %[[DSUM:.*]] = plan.mse_loss_grad %[[SUM]], %arg1
// d(op(A)) for C = A @ B^T: dA = dC @ B, dB = dC^T @ A.
// CHECK: %[[DG1:.*]] = plan.matmul %[[DSUM]], %arg4 : tensor<8x4xf32>, tensor<4x4xf32>
// The two paths into the gelu output are summed.
// CHECK: %[[DG:.*]] = plan.add %[[DSUM]], %[[DG1]]
// CHECK: %[[DV:.*]] = plan.matmul %[[DSUM]], %[[G]] {transpose_lhs}
// CHECK: %[[DBA:.*]] = plan.gelu_grad %[[BA]], %[[DG]]
// CHECK: %[[DB:.*]] = plan.bias_grad %[[DBA]]
// No gradient for the input x, only for w.
// CHECK-NOT: plan.matmul %[[DBA]], %arg2
// CHECK: %[[DW:.*]] = plan.matmul %arg0, %[[DBA]] {transpose_lhs}
// The global gradient norm: one sum of squares over every gradient.
// CHECK: %[[SUMSQ:.*]] = plan.sumsq %[[DW]], %[[DB]], %[[DV]] : tensor<4x4xf32>, tensor<4xf32>, tensor<4x4xf32> -> tensor<f32>
// CHECK: %[[W:.*]] = plan.sgd_update %arg2, %[[DW]] {lr = 5.000000e-02 : f32}
// CHECK: %[[B:.*]] = plan.sgd_update %arg3, %[[DB]]
// CHECK: %[[V:.*]] = plan.sgd_update %arg4, %[[DV]]
// CHECK: return %[[LOSS]], %[[SUMSQ]], %[[W]], %[[B]], %[[V]]

// -----

// AdamW settings come from plan.train.
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "adamw", beta1 = 0.8 : f64, weight_decay = 0.1 : f64, seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %y: tensor<8x4xf32> {plan.kind = "label", plan.name = "y"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.relu %0 : tensor<8x4xf32>
  %2 = plan.mse_loss %1, %y : tensor<8x4xf32> -> tensor<f32>
  return %2 : tensor<f32>
}
// CHECK-LABEL: func.func @train_step(
// CHECK: plan.relu_grad
// CHECK: plan.adamw_update %arg2, %{{.*}} {beta1 = 8.000000e-01 : f32, beta2 = 9.990000e-01 : f32, eps = 9.99999993E-9 : f32, lr = 1.000000e-03 : f32, weight_decay = 1.000000e-01 : f32}

// -----

// expected-error @below {{expected exactly one function marked 'plan.model', found 0}}
module {
  plan.mesh @mesh axes = ["dp"] shape = [1]
}

// -----

// Parameters and inputs are fp32 master weights: mixed precision computes on
// plan.cast copies that plan-mixed-precision inserts.
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
// expected-error @below {{argument 0 is 'bf16'; a model's parameters and inputs are f32 (the master weights): mixed precision computes on plan.cast copies (plan-mixed-precision)}}
func.func @m(%x: tensor<8x4xbf16> {plan.kind = "input", plan.name = "x"},
             %w: tensor<4x4xbf16> {plan.kind = "param", plan.name = "w"}) -> tensor<bf16> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xbf16>, tensor<4x4xbf16> -> tensor<8x4xbf16>
  %1 = plan.mse_loss %0, %x : tensor<8x4xbf16> -> tensor<bf16>
  return %1 : tensor<bf16>
}

// -----

plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.mse_loss %0, %0 : tensor<8x4xf32> -> tensor<f32>
  // expected-error @below {{planc cannot differentiate the loss 'plan.add' yet; mse and cross_entropy are supported}}
  %2 = plan.add %1, %1 : tensor<f32>
  return %2 : tensor<f32>
}

// -----

plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.mse_loss %0, %x : tensor<8x4xf32> -> tensor<f32>
  %2 = plan.add %1, %1 : tensor<f32>
  // expected-error @below {{the model's result must be a loss used by nothing else}}
  return %1 : tensor<f32>
}

// -----

// A transformer-shaped model: 3-D activations, an LM head tied to the
// embedding, layernorm, attention, cross-entropy; AdamW decays only matrices,
// and gradients are clipped by their global norm.
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 2 : i64, grad_clip = 1.0 : f64, lr = 1.000000e-03 : f64, optimizer = "adamw", weight_decay = 0.1 : f64, seed = 1 : i64, steps = 3 : i64}
func.func @gpt(%ids: tensor<2x4xi32> {plan.kind = "input", plan.name = "ids"},
               %tgt: tensor<2x4xi32> {plan.kind = "label", plan.name = "tgt"},
               %wte: tensor<16x8xf32> {plan.kind = "param", plan.name = "wte"},
               %g: tensor<8xf32> {plan.kind = "param", plan.name = "g"},
               %bb: tensor<8xf32> {plan.kind = "param", plan.name = "b"},
               %wqkv: tensor<8x24xf32> {plan.kind = "param", plan.name = "wqkv"}) -> tensor<f32> attributes {plan.model} {
  %x = plan.embedding %ids, %wte : tensor<2x4xi32>, tensor<16x8xf32> -> tensor<2x4x8xf32>
  %n = plan.layernorm %x, %g, %bb : tensor<2x4x8xf32>, tensor<8xf32>
  %qkv = plan.matmul %n, %wqkv : tensor<2x4x8xf32>, tensor<8x24xf32> -> tensor<2x4x24xf32>
  %a = plan.attention %qkv {num_heads = 2 : i64, num_kv_heads = 2 : i64} : tensor<2x4x24xf32> -> tensor<2x4x8xf32>
  %h = plan.add %x, %a : tensor<2x4x8xf32>
  %logits = plan.matmul %h, %wte {transpose_rhs} : tensor<2x4x8xf32>, tensor<16x8xf32> -> tensor<2x4x16xf32>
  %l = plan.cross_entropy %logits, %tgt : tensor<2x4x16xf32>, tensor<2x4xi32> -> tensor<f32>
  return %l : tensor<f32>
}
// CHECK-LABEL: func.func @train_step(
// CHECK: %[[X:.*]] = plan.embedding
// CHECK: %[[N:.*]] = plan.layernorm
// CHECK: %[[QKV:.*]] = plan.matmul
// CHECK: %[[H:.*]] = plan.add
// CHECK: %[[LOGITS:.*]] = plan.matmul %[[H]], %arg2 {transpose_rhs}
// CHECK: %[[DL:.*]] = plan.cross_entropy_grad %[[LOGITS]], %arg1 : tensor<2x4x16xf32>, tensor<2x4xi32>
// Tied head: dh = dlogits @ wte; d wte (head) = dlogits^T @ h over all rows
// (sum_leading: summed over batch and sequence, without a reshape).
// CHECK: %[[DH:.*]] = plan.matmul %[[DL]], %arg2 : tensor<2x4x16xf32>, tensor<16x8xf32> -> tensor<2x4x8xf32>
// CHECK: %[[DWTE1:.*]] = plan.matmul %[[DL]], %[[H]] {sum_leading, transpose_lhs} : tensor<2x4x16xf32>, tensor<2x4x8xf32> -> tensor<16x8xf32>
// CHECK: %[[DQKV:.*]] = plan.attention_grad %[[QKV]], %[[DH]] {num_heads = 2 : i64, num_kv_heads = 2 : i64}
// CHECK: plan.matmul %[[DQKV]], %arg5 {transpose_rhs}
// CHECK: %[[LNX:[^,]*]], %{{.*}}, %{{.*}} = plan.layernorm_grad %[[X]], %arg3, %{{.*}} : tensor<2x4x8xf32>, tensor<8xf32>
// The embedding's gradient is accumulated with the head's.
// CHECK: %[[DX:.*]] = plan.add %[[DH]], %[[LNX]]
// CHECK: %[[DWTE2:.*]] = plan.embedding_grad %arg0, %[[DX]] : tensor<2x4xi32>, tensor<2x4x8xf32> -> tensor<16x8xf32>
// CHECK: %[[DWTE:.*]] = plan.add %[[DWTE1]], %[[DWTE2]]
// CHECK: %[[SUMSQ:.*]] = plan.sumsq %[[DWTE]], %gamma_grad, %beta_grad, %{{[^ ]*}} :
// Clipped by the global norm as it updates.
// CHECK-NEXT: plan.adamw_update %arg2, %[[DWTE]], %{{.*}}, %{{.*}} clipped by %[[SUMSQ]] {{{.*}}max_norm = 1.000000e+00 : f32, weight_decay = 1.000000e-01 : f32} : tensor<16x8xf32>, tensor<f32>
// 1-D parameters (norm scale and shift) are not decayed.
// CHECK: plan.adamw_update %arg3, %{{.*}} {{{.*}}weight_decay = 0.000000e+00 : f32}
// CHECK: plan.adamw_update %arg4, %{{.*}} {{{.*}}weight_decay = 0.000000e+00 : f32}
// CHECK: plan.adamw_update %arg5, %{{.*}} {{{.*}}weight_decay = 1.000000e-01 : f32}

// -----

// d(a - b)/db = -1: the gradient of the subtrahend is scaled.
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 8 : i64, lr = 1.000000e-03 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
func.func @m(%x: tensor<8x4xf32> {plan.kind = "input", plan.name = "x"},
             %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"},
             %v: tensor<4x4xf32> {plan.kind = "param", plan.name = "v"}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %1 = plan.matmul %x, %v : tensor<8x4xf32>, tensor<4x4xf32> -> tensor<8x4xf32>
  %2 = plan.sub %0, %1 : tensor<8x4xf32>
  %3 = plan.mse_loss %2, %x : tensor<8x4xf32> -> tensor<f32>
  return %3 : tensor<f32>
}
// CHECK-LABEL: func.func @train_step(
// CHECK: %[[D:.*]] = plan.mse_loss_grad
// CHECK: %[[NEG:.*]] = plan.scale %[[D]] {factor = -1.000000e+00 : f32}
// CHECK: plan.matmul %arg0, %[[NEG]] {transpose_lhs}
// CHECK: plan.matmul %arg0, %[[D]] {transpose_lhs}

// -----

// Batch norm's running statistics must be state arguments marked
// plan.buffer (the frontend declares them so).
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 2 : i64, lr = 5.000000e-02 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
func.func @bn_param_stats(%x: tensor<2x4x3x3xf32> {plan.kind = "input", plan.name = "x"},
                          %y: tensor<2x4x3x3xf32> {plan.kind = "label", plan.name = "y"},
                          %g: tensor<4xf32> {plan.kind = "param", plan.name = "g"},
                          %b: tensor<4xf32> {plan.kind = "param", plan.name = "b"}) -> tensor<f32> attributes {plan.model} {
  // expected-error @below {{the running statistics of a batch_norm must be two distinct state arguments marked 'plan.buffer', each used by one batch_norm}}
  %0 = plan.batch_norm %x, %g, %b running(%g, %b : tensor<4xf32>, tensor<4xf32>) : tensor<2x4x3x3xf32>, tensor<4xf32>
  %1 = plan.mse_loss %0, %y : tensor<2x4x3x3xf32> -> tensor<f32>
  return %1 : tensor<f32>
}

// -----

// A state argument of the model that no batch norm updates.
plan.mesh @mesh axes = ["dp"] shape = [1]
plan.train {data = "synthetic", global_batch = 2 : i64, lr = 5.000000e-02 : f64, optimizer = "sgd", seed = 1 : i64, steps = 3 : i64}
func.func @stray_state(%x: tensor<2x4xf32> {plan.kind = "input", plan.name = "x"},
                       %y: tensor<2x4xf32> {plan.kind = "label", plan.name = "y"},
                       %w: tensor<4x4xf32> {plan.kind = "param", plan.name = "w"},
                       // expected-error @below {{state argument 'stray' is not the running statistics of a batch_norm nor the bias of a mixture of experts; planc does not know how a step updates it}}
                       %s: tensor<4xf32> {plan.kind = "state", plan.name = "stray", plan.buffer}) -> tensor<f32> attributes {plan.model} {
  %0 = plan.matmul %x, %w : tensor<2x4xf32>, tensor<4x4xf32> -> tensor<2x4xf32>
  %1 = plan.mse_loss %0, %y : tensor<2x4xf32> -> tensor<f32>
  return %1 : tensor<f32>
}
