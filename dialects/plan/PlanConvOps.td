//===- PlanConvOps.td - Convolutional-network ops of the plan dialect -----===//
//
// Tensors are NCHW. Spatial hyper-parameters are pairs [height, width].
// Included from PlanOps.td; the verifiers and the output-size arithmetic are
// in ConvOps.cpp, the sharding rules with every other op's.
//===----------------------------------------------------------------------===//
#ifndef PLAN_CONV_OPS_TD
#define PLAN_CONV_OPS_TD

// The spatial attributes of convolution and pooling.
class Plan_SpatialOp<string mnemonic, list<Trait> traits = []>
    : Plan_ComputeOp<mnemonic, traits> {
  let hasVerifier = 1;
}

def Plan_Conv2dOp : Plan_SpatialOp<"conv2d"> {
  let summary = "2-D convolution (cross-correlation), NCHW, without bias";
  let description = [{
    `input` is `[N, C, H, W]`, `filter` is `[O, C / groups, KH, KW]`; the
    result is `[N, O, HO, WO]` with
    `HO = (H + 2 * padding[0] - dilation[0] * (KH - 1) - 1) / stride[0] + 1`
    (likewise WO). Zero padding. The bias is `plan.channel_bias_add`.

    ```mlir
    %y = plan.conv2d %x, %w {stride = array<i64: 1, 1>, padding = array<i64: 1, 1>,
        dilation = array<i64: 1, 1>, groups = 1 : i64}
        : tensor<8x3x32x32xf32>, tensor<16x3x3x3xf32> -> tensor<8x16x32x32xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$filter,
                       DenseI64ArrayAttr:$stride, DenseI64ArrayAttr:$padding,
                       DenseI64ArrayAttr:$dilation, I64Attr:$groups);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $filter attr-dict `:` type($input) `,` type($filter) `->` type($result)
  }];
}

def Plan_Conv2dGradOp : Plan_SpatialOp<"conv2d_grad",
    [AllTypesMatch<["input", "input_grad"]>,
     AllTypesMatch<["filter", "filter_grad"]>]> {
  let summary = "Gradients of conv2d: input and filter";
  let description = [{
    `grad` is the gradient of the convolution's result. The filter gradient
    sums over the batch, the input gradient over the output channels.
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$filter,
                       Plan_FloatTensor:$grad,
                       DenseI64ArrayAttr:$stride, DenseI64ArrayAttr:$padding,
                       DenseI64ArrayAttr:$dilation, I64Attr:$groups);
  let results = (outs Plan_FloatTensor:$input_grad, Plan_FloatTensor:$filter_grad);
  let assemblyFormat = [{
    $input `,` $filter `,` $grad attr-dict `:` type($input) `,` type($filter)
    `,` type($grad)
  }];
}

def Plan_ChannelBiasAddOp : Plan_ComputeOp<"channel_bias_add",
    [AllTypesMatch<["input", "result"]>]> {
  let summary = "Adds a per-channel bias: result[n, c, ...] = input[n, c, ...] + bias[c]";
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$bias);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input `,` $bias attr-dict `:` type($input) `,` type($bias)";
  let hasVerifier = 1;
}

def Plan_ChannelBiasGradOp : Plan_ComputeOp<"channel_bias_grad", []> {
  let summary = "Gradient of a per-channel bias: the output gradient summed over all but dimension 1";
  let arguments = (ins Plan_FloatTensor:$grad);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$grad attr-dict `:` type($grad) `->` type($result)";
  let hasVerifier = 1;
}

def Plan_Pool2dOp : Plan_SpatialOp<"pool2d"> {
  let summary = "2-D max or average pooling, NCHW";
  let description = [{
    `kind` is "max" or "avg". `HO = (H + 2 * padding[0] - kernel[0]) /
    stride[0] + 1` (likewise WO). Padding never wins a max; an average
    divides by the whole window, padding included (PyTorch's default).

    ```mlir
    %y = plan.pool2d %x {kind = "max", kernel = array<i64: 2, 2>,
        stride = array<i64: 2, 2>, padding = array<i64: 0, 0>}
        : tensor<8x16x32x32xf32> -> tensor<8x16x16x16xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input, StrAttr:$kind,
                       DenseI64ArrayAttr:$kernel, DenseI64ArrayAttr:$stride,
                       DenseI64ArrayAttr:$padding);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
}

def Plan_Pool2dGradOp : Plan_SpatialOp<"pool2d_grad",
    [AllTypesMatch<["input", "result"]>]> {
  let summary = "Input gradient of pool2d (max: to the first maximum of each window)";
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$grad,
                       StrAttr:$kind, DenseI64ArrayAttr:$kernel,
                       DenseI64ArrayAttr:$stride, DenseI64ArrayAttr:$padding);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $grad attr-dict `:` type($input) `,` type($grad)
  }];
}

def Plan_BatchNormOp : Plan_ComputeOp<"batch_norm",
    [AllTypesMatch<["input", "result"]>, AllTypesMatch<["gamma", "beta"]>]> {
  let summary = "Batch normalization over all but dimension 1";
  let description = [{
    `input` is `[N, C, ...]`. In the training step each channel is
    normalized with the mean and the biased variance of its values over
    the batch and the spatial dimensions, then scaled by `gamma[c]` and
    shifted by `beta[c]`. The statistics cover the whole (global) batch:
    when the batch is split over data-parallel ranks, the lowering sums the
    per-channel statistics over them (synchronized batch norm), so results
    do not depend on dp.

    `running` (optional): the running mean and variance `[C]`, model state
    (arguments of kind "state" marked `plan.buffer`). plan-autodiff makes
    the training step update them once per step from the whole batch's
    statistics (`plan.batch_norm_moments`, `plan.running_stats_update` with
    `momentum`); the forward function (evaluation) normalizes with them
    instead of the batch's statistics.

    ```mlir
    %y = plan.batch_norm %x, %g, %b {eps = 1.0e-05 : f32} : tensor<8x16x4x4xf32>, tensor<16xf32>
    %z = plan.batch_norm %x, %g, %b running(%rm, %rv : tensor<16xf32>, tensor<16xf32>)
        {eps = 1.0e-05 : f32, momentum = 1.0e-01 : f32} : tensor<8x16x4x4xf32>, tensor<16xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$gamma,
                       Plan_FloatTensor:$beta, Variadic<Plan_FloatTensor>:$running,
                       DefaultValuedAttr<F32Attr, "1e-5">:$eps,
                       DefaultValuedAttr<F32Attr, "0.1">:$momentum);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $gamma `,` $beta (`running` `(` $running^ `:` type($running) `)`)?
    attr-dict `:` type($input) `,` type($gamma)
  }];
  let hasVerifier = 1;
}

def Plan_BatchNormMomentsOp : Plan_ComputeOp<"batch_norm_moments",
    [AllTypesMatch<["sum", "sum_sq"]>]> {
  let summary = "Per-channel sums of x and x * x over all but dimension 1";
  let description = [{
    `input` is `[N, C, ...]`; `sum[c]` and `sum_sq[c]` add up its values
    and their squares over the batch and the rest. A sum over a split batch
    is a pending sum like any contraction (an all-reduce over dp, an
    accumulation over microbatches), so the running statistics see the
    whole batch of a step whatever the plan.

    ```mlir
    %s, %q = plan.batch_norm_moments %x : tensor<8x16x4x4xf32> -> tensor<16xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input);
  let results = (outs Plan_FloatTensor:$sum, Plan_FloatTensor:$sum_sq);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($sum)";
  let hasVerifier = 1;
}

def Plan_RunningStatsUpdateOp : Plan_ComputeOp<"running_stats_update",
    [AllTypesMatch<["running_mean", "running_var", "sum", "sum_sq",
                    "new_mean", "new_var"]>]> {
  let summary = "Batch norm's running statistics after one step (PyTorch's rule)";
  let description = [{
    With `count` values per channel in the batch, `mean = sum / count` and
    the unbiased variance `var = (sum_sq - sum * mean) / (count - 1)`:
    `new_mean = (1 - momentum) * running_mean + momentum * mean`, likewise
    `new_var` with `var`.

    ```mlir
    %m2, %v2 = plan.running_stats_update %m, %v, %s, %q {count = 128 : i64,
        momentum = 1.0e-01 : f32} : tensor<16xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$running_mean, Plan_FloatTensor:$running_var,
                       Plan_FloatTensor:$sum, Plan_FloatTensor:$sum_sq,
                       F32Attr:$momentum, I64Attr:$count);
  let results = (outs Plan_FloatTensor:$new_mean, Plan_FloatTensor:$new_var);
  let assemblyFormat = [{
    $running_mean `,` $running_var `,` $sum `,` $sum_sq attr-dict `:`
    type($running_mean)
  }];
  let hasVerifier = 1;
}

def Plan_BatchNormGradOp : Plan_ComputeOp<"batch_norm_grad",
    [AllTypesMatch<["input", "grad", "input_grad"]>,
     AllTypesMatch<["gamma", "gamma_grad", "beta_grad"]>]> {
  let summary = "Gradients of batch_norm: input, scale and shift (statistics recomputed)";
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$gamma,
                       Plan_FloatTensor:$grad, DefaultValuedAttr<F32Attr, "1e-5">:$eps);
  let results = (outs Plan_FloatTensor:$input_grad, Plan_FloatTensor:$gamma_grad,
                      Plan_FloatTensor:$beta_grad);
  let assemblyFormat = [{
    $input `,` $gamma `,` $grad attr-dict `:` type($input) `,` type($gamma)
  }];
  let builders = [OpBuilder<(ins "::mlir::Value":$input, "::mlir::Value":$gamma,
                                 "::mlir::Value":$grad, "::mlir::FloatAttr":$eps), [{
    build($_builder, $_state, ::mlir::TypeRange{input.getType(), gamma.getType(),
          gamma.getType()}, input, gamma, grad, eps);
  }]>];
}

def Plan_GroupNormOp : Plan_ComputeOp<"group_norm",
    [AllTypesMatch<["input", "result"]>, AllTypesMatch<["gamma", "beta"]>]> {
  let summary = "Group normalization: per sample, over groups of channels and the rest";
  let description = [{
    `input` is `[N, C, ...]`; the channels are `groups` consecutive groups,
    each normalized per sample with the mean and biased variance of its
    values, then each channel is scaled by `gamma[c]` and shifted by
    `beta[c]`. No statistic crosses samples, so the batch splits freely.

    ```mlir
    %y = plan.group_norm %x, %g, %b {groups = 4 : i64, eps = 1.0e-05 : f32} : tensor<8x16x4x4xf32>, tensor<16xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$gamma,
                       Plan_FloatTensor:$beta, I64Attr:$groups,
                       DefaultValuedAttr<F32Attr, "1e-5">:$eps);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $gamma `,` $beta attr-dict `:` type($input) `,` type($gamma)
  }];
  let hasVerifier = 1;
}

def Plan_GroupNormGradOp : Plan_ComputeOp<"group_norm_grad",
    [AllTypesMatch<["input", "grad", "input_grad"]>,
     AllTypesMatch<["gamma", "gamma_grad", "beta_grad"]>]> {
  let summary = "Gradients of group_norm: input, scale and shift (statistics recomputed)";
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$gamma,
                       Plan_FloatTensor:$grad, I64Attr:$groups,
                       DefaultValuedAttr<F32Attr, "1e-5">:$eps);
  let results = (outs Plan_FloatTensor:$input_grad, Plan_FloatTensor:$gamma_grad,
                      Plan_FloatTensor:$beta_grad);
  let assemblyFormat = [{
    $input `,` $gamma `,` $grad attr-dict `:` type($input) `,` type($gamma)
  }];
}

def Plan_DropoutOp : Plan_ComputeOp<"dropout", [AllTypesMatch<["input", "result"]>]> {
  let summary = "Inverted dropout with a mask that depends on no plan";
  let description = [{
    Zeroes each element with probability `p` and scales the others by
    1 / (1 - p). Whether an element is kept is a hash of (seed, step, `uid`,
    the element's index in the global tensor), so every plan (any split of
    any dimension, microbatches, pipeline stages, recompute) draws the same
    mask. `uid` tells the dropout ops of a model apart.

    ```mlir
    %y = plan.dropout %x {p = 1.0e-01 : f32, uid = 0 : i64} : tensor<8x64xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input, F32Attr:$p, I64Attr:$uid);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

#endif
