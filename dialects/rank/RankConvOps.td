//===- RankConvOps.td - Convolutional-network ops of the rank dialect -----===//
//
// NCHW buffers with this rank's local shapes. Codegen passes the pair
// attributes element by element, attributes in alphabetical order (the
// RuntimeCallOpInterface default), e.g. planrt::conv2d(ctx, input, filter,
// out, dilation_h, dilation_w, groups, padding_h, padding_w, stride_h,
// stride_w).
//===----------------------------------------------------------------------===//
#ifndef RANK_CONV_OPS_TD
#define RANK_CONV_OPS_TD

def Rank_Conv2dOp : Rank_CallOp<"conv2d"> {
  let summary = "2-D convolution without bias (im2col + GEMM per group)";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$filter,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       DenseI64ArrayAttr:$stride, DenseI64ArrayAttr:$padding,
                       DenseI64ArrayAttr:$dilation, I64Attr:$groups);
  let assemblyFormat = [{
    $input `,` $filter `into` $out attr-dict `:` type($input) `,`
    type($filter) `->` type($out)
  }];
}

def Rank_Conv2dGradOp : Rank_CallOp<"conv2d_grad",
    [AllTypesMatch<["input", "input_grad"]>,
     AllTypesMatch<["filter", "filter_grad"]>]> {
  let summary = "d input and d filter of conv2d";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$filter,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$input_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$filter_grad,
                       DenseI64ArrayAttr:$stride, DenseI64ArrayAttr:$padding,
                       DenseI64ArrayAttr:$dilation, I64Attr:$groups);
  let assemblyFormat = [{
    $input `,` $filter `,` $grad `into` $input_grad `,` $filter_grad attr-dict
    `:` type($input) `,` type($filter) `,` type($grad)
  }];
}

def Rank_Pool2dOp : Rank_CallOp<"pool2d"> {
  let summary = "2-D max or average pooling";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       StrAttr:$kind, DenseI64ArrayAttr:$kernel,
                       DenseI64ArrayAttr:$stride, DenseI64ArrayAttr:$padding);
  let assemblyFormat = [{
    $input `into` $out attr-dict `:` type($input) `->` type($out)
  }];
}

def Rank_Pool2dGradOp : Rank_CallOp<"pool2d_grad",
    [AllTypesMatch<["input", "input_grad"]>]> {
  let summary = "d input of pool2d";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$input_grad,
                       StrAttr:$kind, DenseI64ArrayAttr:$kernel,
                       DenseI64ArrayAttr:$stride, DenseI64ArrayAttr:$padding);
  let assemblyFormat = [{
    $input `,` $grad `into` $input_grad attr-dict `:` type($input) `,`
    type($grad)
  }];
}

def Rank_ChannelBiasAddOp : Rank_CallOp<"channel_bias_add"> {
  let summary = "out[n, c, ...] = input[n, c, ...] + bias[c]";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$bias,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out);
  let assemblyFormat = [{
    $input `,` $bias `into` $out attr-dict `:` type($input) `,` type($bias)
    `->` type($out)
  }];
}

def Rank_ChannelBiasGradOp : Rank_CallOp<"channel_bias_grad"> {
  let summary = "out[c] = sum of grad[n, c, ...] over n and the rest, in order";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out);
  let assemblyFormat = "$grad `into` $out attr-dict `:` type($grad) `->` type($out)";
}

def Rank_BatchNormOp : Rank_CallOp<"batch_norm",
    [AllTypesMatch<["gamma", "beta"]>, AllTypesMatch<["input", "out"]>]> {
  let summary = "batch norm (training mode), statistics summed over batch_axes";
  let description = [{
    `batch_axes`: the mesh axes that split the batch; the per-channel sums
    are all-reduced over them (codegen passes them as an axis mask).
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gamma,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$beta,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       StrArrayAttr:$batch_axes, F32Attr:$eps);
  let assemblyFormat = [{
    $input `,` $gamma `,` $beta `into` $out attr-dict `:` type($input) `,`
    type($gamma)
  }];
}

def Rank_BatchNormGradOp : Rank_CallOp<"batch_norm_grad",
    [AllTypesMatch<["input", "grad", "input_grad"]>,
     AllTypesMatch<["gamma", "gamma_grad", "beta_grad"]>]> {
  let summary = "d input, d gamma, d beta of batch norm (whole over batch_axes)";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gamma,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$input_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$gamma_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$beta_grad,
                       StrArrayAttr:$batch_axes, F32Attr:$eps);
  let assemblyFormat = [{
    $input `,` $gamma `,` $grad `into` $input_grad `,` $gamma_grad `,`
    $beta_grad attr-dict `:` type($input) `,` type($gamma)
  }];
}

def Rank_BatchNormInferOp : Rank_CallOp<"batch_norm_infer",
    [AllTypesMatch<["gamma", "beta", "running_mean", "running_var"]>,
     AllTypesMatch<["input", "out"]>]> {
  let summary = "batch norm with the running statistics (evaluation)";
  let description = [{
    out = (input - running_mean[c]) / sqrt(running_var[c] + eps) * gamma[c]
    + beta[c]: channel by channel, no statistic crosses samples or ranks.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gamma,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$beta,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$running_mean,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$running_var,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out, F32Attr:$eps);
  let assemblyFormat = [{
    $input `,` $gamma `,` $beta `,` $running_mean `,` $running_var `into` $out
    attr-dict `:` type($input) `,` type($gamma)
  }];
}

def Rank_BatchNormMomentsOp : Rank_CallOp<"batch_norm_moments",
    [AllTypesMatch<["sum", "sum_sq"]>]> {
  let summary = "per-channel sums of x and x * x over this rank's rows";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$sum,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$sum_sq);
  let assemblyFormat = [{
    $input `into` $sum `,` $sum_sq attr-dict `:` type($input) `->` type($sum)
  }];
}

def Rank_RunningStatsUpdateOp : Rank_CallOp<"running_stats_update",
    [AllTypesMatch<["running_mean", "running_var", "sum", "sum_sq"]>]> {
  let summary = "updates batch norm's running statistics in place from whole sums";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$running_mean,
                       Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$running_var,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$sum,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$sum_sq,
                       I64Attr:$count, F32Attr:$momentum);
  let assemblyFormat = [{
    $running_mean `,` $running_var `,` $sum `,` $sum_sq attr-dict `:`
    type($running_mean)
  }];
}

def Rank_GroupNormOp : Rank_CallOp<"group_norm",
    [AllTypesMatch<["gamma", "beta"]>, AllTypesMatch<["input", "out"]>]> {
  let summary = "group norm: per sample over groups of channels";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gamma,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$beta,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       F32Attr:$eps, I64Attr:$groups);
  let assemblyFormat = [{
    $input `,` $gamma `,` $beta `into` $out attr-dict `:` type($input) `,`
    type($gamma)
  }];
}

def Rank_GroupNormGradOp : Rank_CallOp<"group_norm_grad",
    [AllTypesMatch<["input", "grad", "input_grad"]>,
     AllTypesMatch<["gamma", "gamma_grad", "beta_grad"]>]> {
  let summary = "d input, d gamma, d beta of group norm";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gamma,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$input_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$gamma_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$beta_grad,
                       F32Attr:$eps, I64Attr:$groups);
  let assemblyFormat = [{
    $input `,` $gamma `,` $grad `into` $input_grad `,` $gamma_grad `,`
    $beta_grad attr-dict `:` type($input) `,` type($gamma)
  }];
}

def Rank_DropoutOp : Rank_CallOp<"dropout", [AllTypesMatch<["input", "out"]>]> {
  let summary = "inverted dropout; the mask hashes each element's global index";
  let description = [{
    `d0_axes` .. `d3_axes`: the mesh axes that split each dimension (codegen
    passes axis masks); `microbatches`: how many microbatches also split
    dimension 0 (0: none; the runtime knows the current one), and
    `mb_inner_axes`: those of d0_axes that split each microbatch (expert
    parallelism's; the others split the batch outside the microbatches).
    From these the runtime computes each element's index in the global
    tensor.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       StrArrayAttr:$d0_axes, StrArrayAttr:$d1_axes,
                       StrArrayAttr:$d2_axes, StrArrayAttr:$d3_axes,
                       I64Attr:$microbatches, StrArrayAttr:$mb_inner_axes,
                       F32Attr:$p, I64Attr:$uid);
  let assemblyFormat = [{
    $input `into` $out attr-dict `:` type($input)
  }];
}

#endif
