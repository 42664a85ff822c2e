//===- RankMoeOps.td - Mixture-of-experts ops of the rank dialect ---------===//
//
// This rank's tokens (leading dimensions) with whole experts; one planrt
// call each (runtime/lib/moe_impl.inc). The swiglu experts are separate ops
// from the gelu ones because they take one more weight.
//===----------------------------------------------------------------------===//
#ifndef RANK_MOE_OPS_TD
#define RANK_MOE_OPS_TD

def Rank_MoeTopkOp : Rank_CallOp<"moe_topk"> {
  let summary = "each token's top_k experts by logit (plan.moe_topk)";
  let description = [{
    `capacity` 0: none; else at most that many of a sequence's tokens per
    expert, the rest dropped (written -(e + 1)).
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$logits,
                       Arg<Rank_I32Buffer, "", [MemWrite]>:$out,
                       I64Attr:$top_k, I64Attr:$capacity);
  let assemblyFormat = "$logits `into` $out attr-dict `:` type($logits) `->` type($out)";
}

def Rank_MoeTopkBiasedOp : Rank_CallOp<"moe_topk_biased"> {
  let summary = "each token's top_k experts by probability plus bias";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$logits,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$bias,
                       Arg<Rank_I32Buffer, "", [MemWrite]>:$out,
                       I64Attr:$top_k, I64Attr:$capacity);
  let assemblyFormat = [{
    $logits `,` $bias `into` $out attr-dict `:` type($logits) `,` type($bias) `->` type($out)
  }];
}

def Rank_MoeAuxGradOp : Rank_CallOp<"moe_aux_grad"> {
  let summary = "d logits of the per-sequence load-balancing loss (plan.moe_aux_grad)";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$logits,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       F64Attr:$coefficient, I64Attr:$sequences);
  let assemblyFormat = [{
    $logits `,` $experts `into` $out attr-dict `:` type($logits) `,` type($experts) `->` type($out)
  }];
}

def Rank_MoeLoadOp : Rank_CallOp<"moe_load"> {
  let summary = "choices per expert over this rank's tokens (plan.moe_load)";
  let arguments = (ins Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out);
  let assemblyFormat = "$experts `into` $out attr-dict `:` type($experts) `->` type($out)";
}

def Rank_MoeBiasUpdateOp : Rank_CallOp<"moe_bias_update",
    [AllTypesMatch<["bias", "load"]>]> {
  let summary = "the experts' bias updated in place from the step's load";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$bias,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$load,
                       F32Attr:$rate);
  let assemblyFormat = "$bias `,` $load attr-dict `:` type($bias)";
}

def Rank_MoeGatesOp : Rank_CallOp<"moe_gates"> {
  let summary = "the chosen experts' renormalised probabilities (plan.moe_gates)";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$logits,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out);
  let assemblyFormat = [{
    $logits `,` $experts `into` $out attr-dict `:` type($logits) `,` type($experts) `->` type($out)
  }];
}

def Rank_MoeGatesGradOp : Rank_CallOp<"moe_gates_grad"> {
  let summary = "d logits of moe_gates";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$logits,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out);
  let assemblyFormat = [{
    $logits `,` $experts `,` $grad `into` $out attr-dict `:` type($logits) `,`
    type($experts) `,` type($grad) `->` type($out)
  }];
}

// With an `expert_axis` (expert parallelism), the weights hold this rank's
// experts (block `coord` of that axis): the rows routed elsewhere are left
// out, so the output is this rank's part of a sum over the axis, and the
// gates' gradient is zero for the choices of other ranks' experts.

def Rank_MoeExpertsOp : Rank_CallOp<"moe_experts"> {
  let summary = "tokens through their gelu experts, summed by the gates";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gates,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$up,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$down,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       DefaultValuedStrAttr<StrAttr, "">:$expert_axis);
  let assemblyFormat = [{
    $input `,` $experts `,` $gates `,` $up `,` $down `into` $out attr-dict `:`
    type($input) `,` type($experts) `,` type($gates) `,` type($up) `,`
    type($down) `->` type($out)
  }];
}

def Rank_MoeExpertsSwigluOp : Rank_CallOp<"moe_experts_swiglu"> {
  let summary = "tokens through their swiglu experts, summed by the gates";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gates,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gate,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$up,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$down,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       DefaultValuedStrAttr<StrAttr, "">:$expert_axis);
  let assemblyFormat = [{
    $input `,` $experts `,` $gates `,` $gate `,` $up `,` $down `into` $out
    attr-dict `:` type($input) `,` type($experts) `,` type($gates) `,`
    type($gate) `,` type($up) `,` type($down) `->` type($out)
  }];
}

def Rank_MoeExpertsGradOp : Rank_CallOp<"moe_experts_grad"> {
  let summary = "d input, d gates, d up, d down of the gelu experts";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gates,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$up,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$down,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$input_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$gates_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$up_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$down_grad,
                       DefaultValuedStrAttr<StrAttr, "">:$expert_axis);
  let assemblyFormat = [{
    $input `,` $experts `,` $gates `,` $grad `,` $up `,` $down `into`
    $input_grad `,` $gates_grad `,` $up_grad `,` $down_grad attr-dict `:`
    type(operands)
  }];
}

def Rank_MoeExpertsSwigluGradOp : Rank_CallOp<"moe_experts_swiglu_grad"> {
  let summary = "d input, d gates, d gate, d up, d down of the swiglu experts";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gates,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gate,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$up,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$down,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$input_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$gates_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$gate_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$up_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$down_grad,
                       DefaultValuedStrAttr<StrAttr, "">:$expert_axis);
  let assemblyFormat = [{
    $input `,` $experts `,` $gates `,` $grad `,` $gate `,` $up `,` $down `into`
    $input_grad `,` $gates_grad `,` $gate_grad `,` $up_grad `,` $down_grad
    attr-dict `:` type(operands)
  }];
}

// recompute = none (plan-keep-experts): the forward keeps its grouping, the
// rows' inputs, the hidden pre-activations and the experts' outputs in
// `kept` (planrt/workspace.h moe_kept_floats), and the backward reads them
// instead of recomputing the forward, then overwrites them (its last use).

def Rank_MoeExpertsKeepOp : Rank_CallOp<"moe_experts_keep"> {
  let summary = "moe_experts keeping its activations for the backward";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gates,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$up,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$down,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$kept,
                       DefaultValuedStrAttr<StrAttr, "">:$expert_axis);
  let assemblyFormat = [{
    $input `,` $experts `,` $gates `,` $up `,` $down `into` $out `,` $kept
    attr-dict `:` type(operands)
  }];
}

def Rank_MoeExpertsSwigluKeepOp : Rank_CallOp<"moe_experts_swiglu_keep"> {
  let summary = "moe_experts_swiglu keeping its activations for the backward";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gates,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gate,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$up,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$down,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$kept,
                       DefaultValuedStrAttr<StrAttr, "">:$expert_axis);
  let assemblyFormat = [{
    $input `,` $experts `,` $gates `,` $gate `,` $up `,` $down `into` $out `,`
    $kept attr-dict `:` type(operands)
  }];
}

def Rank_MoeExpertsGradKeptOp : Rank_CallOp<"moe_experts_grad_kept"> {
  let summary = "moe_experts_grad from the kept activations";
  let arguments = (ins Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gates,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$up,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$down,
                       Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$kept,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$input_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$gates_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$up_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$down_grad,
                       DefaultValuedStrAttr<StrAttr, "">:$expert_axis);
  let assemblyFormat = [{
    $experts `,` $gates `,` $grad `,` $up `,` $down `,` $kept `into`
    $input_grad `,` $gates_grad `,` $up_grad `,` $down_grad attr-dict `:`
    type(operands)
  }];
}

def Rank_MoeExpertsSwigluGradKeptOp : Rank_CallOp<"moe_experts_swiglu_grad_kept"> {
  let summary = "moe_experts_swiglu_grad from the kept activations";
  let arguments = (ins Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gates,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gate,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$up,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$down,
                       Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$kept,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$input_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$gates_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$gate_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$up_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$down_grad,
                       DefaultValuedStrAttr<StrAttr, "">:$expert_axis);
  let assemblyFormat = [{
    $experts `,` $gates `,` $grad `,` $gate `,` $up `,` $down `,` $kept `into`
    $input_grad `,` $gates_grad `,` $gate_grad `,` $up_grad `,` $down_grad
    attr-dict `:` type(operands)
  }];
}

// Expert parallelism's all-to-all dispatcher (plan-route-experts): the
// gathers of the experts' operands over ep and the reduce-scatters of their
// partial outputs, restricted to the rows that a member's experts read
// (the group's choices `experts` say which), in one all-to-all with
// variable counts each.

def Rank_RoutedAllGatherOp : Rank_CallOp<"routed_all_gather",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "all_gather along dimension 0 of the rows this rank's experts need";
  let description = [{
    `out` is the all-gather of `input` over `axis` along dimension 0, except
    that a row of another rank's block arrives only if one of its choices
    in `experts` (the group's, [rows of out, K]) is among this rank's
    `experts_per_rank` experts; the other rows are zero.
  }];
  let arguments = (ins Arg<Rank_DataBuffer, "", [MemRead]>:$input,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_DataBuffer, "", [MemWrite]>:$out,
                       I64Attr:$experts_per_rank, StrAttr:$axis);
  let assemblyFormat = [{
    $input `routed` `by` $experts `into` $out `over` $axis attr-dict `:`
    type($input) `,` type($experts) `->` type($out)
  }];
  let hasVerifier = 1;
}

def Rank_RoutedReduceScatterOp : Rank_CallOp<"routed_reduce_scatter",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "reduce_scatter along dimension 0 of the rows each rank's experts wrote";
  let description = [{
    `out` is this rank's block (dimension 0) of the sum over `axis` of
    `input`, where each rank's rows that its experts did not need (by the
    group's choices `experts`) are taken as zero and not sent. The sum runs
    in rank order.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$experts,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       I64Attr:$experts_per_rank, StrAttr:$axis);
  let assemblyFormat = [{
    $input `routed` `by` $experts `into` $out `over` $axis attr-dict `:`
    type($input) `,` type($experts) `->` type($out)
  }];
  let hasVerifier = 1;
}

#endif
