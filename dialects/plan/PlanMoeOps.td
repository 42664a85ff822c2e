//===- PlanMoeOps.td - Mixture-of-experts ops of the plan dialect ---------===//
//
// A `moe(...)` layer is a router matmul (plan.matmul), the routing
// (plan.moe_topk, plan.moe_gates) and the experts (plan.moe_experts).
// Tokens are the leading dimensions `[T...]` of every operand; their
// layout is whatever the plan gives them (split over dp, over tp with
// sequence parallelism, ...): every op here works token by token, and the
// experts' weights are whole on every rank. Included from PlanOps.td; the
// verifiers, the sharding rules and the notes on the gradients are in
// MoeOps.cpp, the kernels in runtime/lib/moe_impl.inc.
//===----------------------------------------------------------------------===//
#ifndef PLAN_MOE_OPS_TD
#define PLAN_MOE_OPS_TD

class Plan_MoeOp<string mnemonic, list<Trait> traits = []>
    : Plan_ComputeOp<mnemonic, traits> {
  let hasVerifier = 1;
}

def Plan_MoeTopkOp : Plan_MoeOp<"moe_topk"> {
  let summary = "The top_k experts of each token, by router logit";
  let description = [{
    `logits` is `[T..., E]`; the result `[T..., K]` (i32) lists each token's
    K experts with the largest logits (the largest softmax probabilities),
    largest first; equal scores go to the lower expert index. Not
    differentiable (the gates carry the gradient).

    With `bias` (`[E]`, f32: DeepSeek-V3's balancing), the choice is by
    softmax probability plus the expert's bias instead; the bias changes
    the choice only.

    With `capacity` C, the last token dimension is a sequence: walking it in
    order (and each token's choices in order), an expert takes at most C of
    the sequence's tokens; a choice beyond is dropped and written as
    `-(e + 1)` (its expert still readable, its output zero). The sequence
    stays whole on every rank, so the same choices drop under every plan.

    The routing's training terms ride on the op, for plan-autodiff:
    `aux_loss` (a coefficient) seeds the backward with plan.moe_aux_grad,
    and `bias_update` (a rate) updates `bias` after each step from the
    step's plan.moe_load (plan.moe_bias_update).

    ```mlir
    %i = plan.moe_topk %logits {top_k = 2 : i64} : tensor<4x16x8xf32> -> tensor<4x16x2xi32>
    %j = plan.moe_topk %logits, %bias {bias_update = 1.0e-03 : f32, capacity = 5 : i64, top_k = 2 : i64}
        : tensor<4x16x8xf32>, tensor<8xf32> -> tensor<4x16x2xi32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$logits,
                       Optional<Plan_FloatTensor>:$bias, I64Attr:$top_k,
                       OptionalAttr<I64Attr>:$capacity,
                       OptionalAttr<F64Attr>:$aux_loss,
                       OptionalAttr<F32Attr>:$bias_update);
  let results = (outs Plan_I32Tensor:$result);
  let assemblyFormat = [{
    $logits (`,` $bias^)? attr-dict `:` type($logits) (`,` type($bias)^)? `->` type($result)
  }];
}

def Plan_MoeAuxGradOp : Plan_MoeOp<"moe_aux_grad",
    [AllTypesMatch<["logits", "result"]>]> {
  let summary = "d logits of the load-balancing loss, per sequence";
  let description = [{
    The Switch / GShard load-balancing loss, taken per sequence (the last
    token dimension) and averaged over the `sequences` of the step:
    `coefficient / sequences * sum_b E * sum_e f[b, e] P[b, e]`, with
    `f[b, e]` the share of sequence b's S * K choices that picked expert e
    (dropped or not) and `P[b, e]` the mean softmax probability of e over
    its S tokens. `f` is a count (no gradient), so the result is, through
    the softmax, `d P` = `coefficient / sequences * E * f[b, e] / S` for
    every token of sequence b. A seed of the backward, like a loss's
    gradient. The sequence stays whole on every rank.

    ```mlir
    %d = plan.moe_aux_grad %logits, %i {coefficient = 1.0e-02 : f64, sequences = 4 : i64}
        : tensor<4x16x8xf32>, tensor<4x16x2xi32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$logits, Plan_I32Tensor:$experts,
                       F64Attr:$coefficient, I64Attr:$sequences);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $experts attr-dict `:` type($logits) `,` type($experts)
  }];
}

def Plan_MoeLoadOp : Plan_MoeOp<"moe_load"> {
  let summary = "How many choices picked each expert (f32 counts)";
  let description = [{
    `load[e]` counts the entries of `experts` (dropped ones too) equal to
    e. A sum over the tokens, so a split of them leaves a pending sum (an
    all-reduce over dp, an accumulation over microbatches): the bias update
    sees the whole step's load under every plan.

    ```mlir
    %n = plan.moe_load %i : tensor<4x16x2xi32> -> tensor<8xf32>
    ```
  }];
  let arguments = (ins Plan_I32Tensor:$experts);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$experts attr-dict `:` type($experts) `->` type($result)";
}

def Plan_MoeBiasUpdateOp : Plan_MoeOp<"moe_bias_update",
    [AllTypesMatch<["bias", "load", "result"]>]> {
  let summary = "DeepSeek-V3's bias balancing: one step of the experts' bias";
  let description = [{
    `result[e] = bias[e] + rate * sign(mean(load) - load[e])`: an expert
    chosen less than the mean gains, one chosen more loses.

    ```mlir
    %b2 = plan.moe_bias_update %b, %n {rate = 1.0e-03 : f32} : tensor<8xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$bias, Plan_FloatTensor:$load,
                       F32Attr:$rate);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$bias `,` $load attr-dict `:` type($bias)";
}

def Plan_MoeGatesOp : Plan_MoeOp<"moe_gates"> {
  let summary = "The chosen experts' softmax probabilities, renormalised";
  let description = [{
    `gates[t, k] = p[t, i[t, k]] / sum_j p[t, i[t, j]]` with `p` the softmax
    of the token's logits: the softmax of the chosen logits alone (Mixtral's
    routing). f32 whatever the logits' type.

    ```mlir
    %g = plan.moe_gates %logits, %i : tensor<4x16x8xf32>, tensor<4x16x2xi32> -> tensor<4x16x2xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$logits, Plan_I32Tensor:$experts);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $experts attr-dict `:` type($logits) `,` type($experts) `->` type($result)
  }];
}

def Plan_MoeGatesGradOp : Plan_MoeOp<"moe_gates_grad",
    [AllTypesMatch<["logits", "result"]>]> {
  let summary = "d logits of plan.moe_gates";
  let description = [{
    With `g` the gates recomputed from `logits`: for a chosen expert
    `i[t, k]`, `d logits = g_k (d g_k - sum_j g_j d g_j)`; zero for the
    others.
  }];
  let arguments = (ins Plan_FloatTensor:$logits, Plan_I32Tensor:$experts,
                       Plan_FloatTensor:$grad);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $experts `,` $grad attr-dict `:` type($logits) `,` type($experts) `,` type($grad)
  }];
}

def Plan_MoeExpertsOp : Plan_MoeOp<"moe_experts"> {
  let summary = "Each token through its experts' MLPs, summed by its gates";
  let description = [{
    `x [T..., d]`, `experts [T..., K]` (i32, from plan.moe_topk), `gates
    [T..., K]` (f32), `up [E, d, h]`, `down [E, h, d']` and, for `act =
    "swiglu"`, `gate [E, d, h]`. The result `[T..., d']` is
    `y[t] = sum_k gates[t, k] * f_e(x[t])` with `e = experts[t, k]` and
    `f_e(x) = (silu(x gate[e]) * (x up[e])) down[e]` (swiglu) or
    `gelu(x up[e]) down[e]` (gelu, the tanh form). Dropless: every token
    reaches all K experts. A rank groups its tokens by expert (in token
    order) and runs one GEMM per expert and weight.

    ```mlir
    %y = plan.moe_experts %x, %i, %g, %up, %down, %gate {act = "swiglu"}
        : tensor<4x16x32xf32>, tensor<4x16x2xi32>, tensor<4x16x2xf32>,
          tensor<8x32x64xf32>, tensor<8x64x32xf32>, tensor<8x32x64xf32>
          -> tensor<4x16x32xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_I32Tensor:$experts,
                       Plan_FloatTensor:$gates, Plan_FloatTensor:$up,
                       Plan_FloatTensor:$down,
                       Optional<Plan_FloatTensor>:$gate, StrAttr:$act);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $experts `,` $gates `,` $up `,` $down (`,` $gate^)? attr-dict `:`
    type($input) `,` type($experts) `,` type($gates) `,` type($up) `,`
    type($down) (`,` type($gate)^)? `->` type($result)
  }];
}

def Plan_MoeExpertsGradOp : Plan_MoeOp<"moe_experts_grad",
    [AllTypesMatch<["input", "input_grad"]>,
     AllTypesMatch<["gates", "gates_grad"]>,
     AllTypesMatch<["up", "up_grad"]>,
     AllTypesMatch<["down", "down_grad"]>]> {
  let summary = "Gradients of plan.moe_experts (the experts' MLPs recomputed)";
  let description = [{
    `grad` is the gradient of the result. Results: d input, d gates, d up,
    d down and, with `gate`, d gate. The experts' hidden activations are
    recomputed from `input` (nothing of the forward is kept but its
    operands), so the weights' gradients are pending sums over the ranks
    that split the tokens.
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_I32Tensor:$experts,
                       Plan_FloatTensor:$gates, Plan_FloatTensor:$grad,
                       Plan_FloatTensor:$up, Plan_FloatTensor:$down,
                       Optional<Plan_FloatTensor>:$gate, StrAttr:$act);
  let results = (outs Plan_FloatTensor:$input_grad,
                      Plan_FloatTensor:$gates_grad, Plan_FloatTensor:$up_grad,
                      Plan_FloatTensor:$down_grad,
                      Optional<Plan_FloatTensor>:$gate_grad);
  let assemblyFormat = [{
    $input `,` $experts `,` $gates `,` $grad `,` $up `,` $down (`,` $gate^)?
    attr-dict `:` functional-type(operands, results)
  }];
  let builders = [OpBuilder<(ins "::mlir::Value":$input, "::mlir::Value":$experts,
      "::mlir::Value":$gates, "::mlir::Value":$grad, "::mlir::Value":$up,
      "::mlir::Value":$down, "::mlir::Value":$gate, "::mlir::StringAttr":$act), [{
    ::llvm::SmallVector<::mlir::Type> types{input.getType(), gates.getType(),
                                            up.getType(), down.getType()};
    if (gate)
      types.push_back(gate.getType());
    build($_builder, $_state, types, input, experts, gates, grad, up, down,
          gate, act);
  }]>];
}

#endif
