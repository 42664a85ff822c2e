//===- PlanOps.td - Ops and attributes of the plan dialect ----------------===//
#ifndef PLAN_OPS_TD
#define PLAN_OPS_TD

include "dialects/plan/PlanAttrs.td"
include "dialects/plan/PlanInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/IR/CommonTypeConstraints.td"
include "mlir/IR/OpBase.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

//===----------------------------------------------------------------------===//
// Module-level ops
//===----------------------------------------------------------------------===//

def Plan_MeshOp : Plan_Op<"mesh", [Symbol]> {
  let summary = "A named device mesh: axes with sizes";
  let description = [{
    The ranks of a run arranged as a grid. Axes are listed outermost first;
    the last axis varies fastest across consecutive ranks (within a node).
    Axes named in `sequential` are not spread over ranks but over time: a
    tensor split over one is processed one block after the other on the
    same rank (microbatches, axis "mb"), and a pending sum over it is
    accumulated.

    ```mlir
    plan.mesh @mesh axes = ["dp"] shape = [2]
    plan.mesh @mesh axes = ["dp", "mb"] shape = [2, 4] {sequential = ["mb"]}
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrArrayAttr:$axes,
                       DenseI64ArrayAttr:$shape,
                       OptionalAttr<StrArrayAttr>:$sequential);
  let assemblyFormat = "$sym_name `axes` `=` $axes `shape` `=` $shape attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getNumRanks();
    /// Whether axis `name` is iterated in time rather than spread over ranks.
    bool isSequential(::llvm::StringRef name);
    /// Index of axis `name`, or -1.
    int64_t getAxisIndex(::llvm::StringRef name);
    int64_t getAxisSize(::llvm::StringRef name);
  }];
}

def Plan_TrainOp : Plan_Op<"train"> {
  let summary = "Training-loop and optimizer settings of the program";
  let description = [{
    ```mlir
    plan.train {data = "synthetic", global_batch = 32 : i64, lr = 5.0e-02 : f64,
                optimizer = "sgd", seed = 3 : i64, steps = 50 : i64,
                precision = "bf16", grad_clip = 1.0 : f64,
                lr_schedule = "cosine", warmup_steps = 10 : i64}
    ```
    - `steps`, `seed`, `global_batch` (samples per optimizer step, all ranks
      together).
    - `data`: `"synthetic"` (generated from the seed), `"shards"` (token
      shards read from `data_path`, which is then required) or `"cifar10"`
      (CIFAR-10 binary batches matching `data_path`).
    - `optimizer`: `"sgd"` or `"adamw"`; AdamW also uses `beta1`, `beta2`,
      `eps` and `weight_decay`. `lr` is the peak learning rate.
    - `micro_batch` (optional): samples per microbatch; divides
      `global_batch`.
    - `precision`: `"fp32"` (default), `"tf32"` (fp32 values, the cuda
      target's fp32 GEMMs on TF32 tensor cores), `"bf16"` or `"fp16"`;
      `loss_scale`: `"none"` (default) or `"dynamic"` (fp16 only).
    - `grad_clip` (optional): clip the global gradient norm to this value.
    - `lr_schedule`: `"constant"` (default) or `"cosine"`, after
      `warmup_steps` of linear warmup (default 0); cosine decays to `min_lr`
      (optional, default 0) over `decay_steps` (optional, default `steps`).
    - `checkpoint_dir` (optional) and `checkpoint_every` (steps between
      checkpoints; 0, the default, means never).
  }];
  // New attributes go after the existing ones so that positional builders
  // keep their meaning.
  let arguments = (ins I64Attr:$steps, I64Attr:$seed, I64Attr:$global_batch,
                       StrAttr:$data, StrAttr:$optimizer, F64Attr:$lr,
                       DefaultValuedAttr<F64Attr, "0.9">:$beta1,
                       DefaultValuedAttr<F64Attr, "0.999">:$beta2,
                       DefaultValuedAttr<F64Attr, "1e-8">:$eps,
                       DefaultValuedAttr<F64Attr, "0.0">:$weight_decay,
                       OptionalAttr<I64Attr>:$micro_batch,
                       DefaultValuedAttr<StrAttr, "\"fp32\"">:$precision,
                       DefaultValuedAttr<StrAttr, "\"none\"">:$loss_scale,
                       OptionalAttr<F64Attr>:$grad_clip,
                       DefaultValuedAttr<StrAttr, "\"constant\"">:$lr_schedule,
                       DefaultValuedAttr<I64Attr, "0">:$warmup_steps,
                       OptionalAttr<F64Attr>:$min_lr,
                       OptionalAttr<I64Attr>:$decay_steps,
                       OptionalAttr<StrAttr>:$data_path,
                       OptionalAttr<StrAttr>:$checkpoint_dir,
                       DefaultValuedAttr<I64Attr, "0">:$checkpoint_every);
  let builders = [
    // The original settings only; everything added later takes its default.
    OpBuilder<(ins "::mlir::IntegerAttr":$steps, "::mlir::IntegerAttr":$seed,
                   "::mlir::IntegerAttr":$global_batch,
                   "::mlir::StringAttr":$data, "::mlir::StringAttr":$optimizer,
                   "::mlir::FloatAttr":$lr, "::mlir::FloatAttr":$beta1,
                   "::mlir::FloatAttr":$beta2, "::mlir::FloatAttr":$eps,
                   "::mlir::FloatAttr":$weight_decay), [{
      build($_builder, $_state, steps, seed, global_batch, data, optimizer, lr,
            beta1, beta2, eps, weight_decay, /*micro_batch=*/nullptr,
            /*precision=*/nullptr, /*loss_scale=*/nullptr,
            /*grad_clip=*/nullptr, /*lr_schedule=*/nullptr,
            /*warmup_steps=*/nullptr, /*min_lr=*/nullptr,
            /*decay_steps=*/nullptr, /*data_path=*/nullptr,
            /*checkpoint_dir=*/nullptr, /*checkpoint_every=*/nullptr);
    }]>
  ];
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

def Plan_ParallelOp : Plan_Op<"parallel"> {
  let summary = "How the training step is parallelized (beyond the mesh)";
  let description = [{
    At most one per module; every attribute has a default.

    ```mlir
    plan.parallel {schedule = "interleaved_1f1b", microbatches = 8 : i64,
                   virtual_stages = 2 : i64, zero_stage = 1 : i64,
                   recompute = "selective", sequence_parallel = true,
                   tensor_policy = "megatron",
                   stage_boundaries = array<i64: 4, 8, 12>}
    ```
    - `schedule`: pipeline schedule, `"gpipe"`, `"1f1b"` (default) or
      `"interleaved_1f1b"`.
    - `microbatches` (default 1) per optimizer step, per pipeline.
    - `virtual_stages` (default 1): model chunks per pipeline rank; more than
      one only with `"interleaved_1f1b"`.
    - `zero_stage` (default 0): ZeRO sharding of optimizer state (1),
      gradients (2) and parameters (3) over the data-parallel axis.
    - `bucket_mb` (default 25.0): gradient all-reduce bucket size in MiB.
    - `recompute`: activation recomputation, `"none"` (default),
      `"selective"` or `"full"`.
    - `sequence_parallel` (default false): split norms and dropout along the
      sequence over the tensor-parallel axis.
    - `tensor_policy`: how layers are split over the tensor-parallel axis,
      `"none"` (default) or `"megatron"` (column- then row-parallel pairs).
    - `stage_boundaries` (optional): the layer indices at which pipeline
      stages 1, 2, ... start, strictly increasing and > 0.
    - `cp_comm` (optional): how context parallelism (the mesh axis `cp`)
      exchanges what attention needs: `"all_to_all"` (Ulysses: sequence
      for heads), `"all_gather"` (every position's keys and values) or
      `"ring"` (the keys and values passed round). Left out, the compiler
      chooses.
    - `ep_comm` (optional): how expert parallelism (the mesh axis `ep`)
      moves tokens to their experts and their outputs back:
      `"all_to_all"` (the default: only the rows routed to another rank's
      experts move, rk.routed_all_gather / routed_reduce_scatter) or
      `"all_gather"` (every rank of the group receives every token, and
      the partial outputs are reduce-scattered; Megatron-Core's all-gather
      dispatcher).
  }];
  let arguments = (ins
      DefaultValuedAttr<StrAttr, "\"1f1b\"">:$schedule,
      DefaultValuedAttr<I64Attr, "1">:$microbatches,
      DefaultValuedAttr<I64Attr, "1">:$virtual_stages,
      DefaultValuedAttr<I64Attr, "0">:$zero_stage,
      DefaultValuedAttr<F64Attr, "25.0">:$bucket_mb,
      DefaultValuedAttr<StrAttr, "\"none\"">:$recompute,
      DefaultValuedAttr<BoolAttr, "false">:$sequence_parallel,
      DefaultValuedAttr<StrAttr, "\"none\"">:$tensor_policy,
      OptionalAttr<DenseI64ArrayAttr>:$stage_boundaries,
      OptionalAttr<StrAttr>:$cp_comm,
      OptionalAttr<StrAttr>:$ep_comm);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

def Plan_ClusterOp : Plan_Op<"cluster"> {
  let summary = "The machines the program is planned for";
  let description = [{
    ```mlir
    plan.cluster {nodes = 2 : i64, gpus_per_node = 8 : i64, gpu = "H100",
                  intra_node_gbps = 450.0 : f64, inter_node_gbps = 50.0 : f64}
    ```
    `nodes` and `gpus_per_node` are at least 1; the bandwidths (GB/s, one
    direction, per GPU) are positive. A bandwidth left out is the GPU
    kind's usual one (the cost model's table).
  }];
  let arguments = (ins I64Attr:$nodes, I64Attr:$gpus_per_node, StrAttr:$gpu,
                       OptionalAttr<F64Attr>:$intra_node_gbps,
                       OptionalAttr<F64Attr>:$inter_node_gbps);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Tensor ops
//===----------------------------------------------------------------------===//

// f32, bf16 or f16 (one type per op; mixed precision, issue 9, will produce
// the 16-bit ones).
def Plan_FloatTensor : RankedTensorOf<[F32, BF16, F16]>;
def Plan_FloatScalar : 0DTensorOf<[F32, BF16, F16]>;
// What layout changes that only move values take: floats, and the i32
// expert choices of mixture-of-experts routing.
def Plan_MovableTensor : RankedTensorOf<[F32, BF16, F16, I32]>;

// Every compute op states its sharding rule (dialects/plan/ShardingRules.cpp).
class Plan_ComputeOp<string mnemonic, list<Trait> traits = []>
    : Plan_Op<mnemonic, !listconcat(traits, [Pure,
        DeclareOpInterfaceMethods<ShardingRuleOpInterface>])>;

def Plan_MatmulOp : Plan_ComputeOp<"matmul", []> {
  let summary = "Matrix product c = op(a) @ op(b), optionally batched";
  let description = [{
    `lhs` is `[..., M, K]` (rank >= 2); `transpose_lhs` and `transpose_rhs`
    swap the last two dimensions of their operand. `rhs` is either 2-D
    `[K, N]` (a weight shared by the whole batch) or has the same leading
    batch dimensions as `lhs`. The result is `[..., M, N]` with the batch
    dimensions of `lhs`.

    With `sum_leading`, both operands have the same leading dimensions and
    they are summed over as well: the result is `[M, N]`, the sum of the
    batch's products (a weight's gradient over every position). Splitting a
    leading dimension leaves each rank a summand, whichever dimension it is
    (the batch over dp, the sequence over cp).

    ```mlir
    %y = plan.matmul %x, %w : tensor<8x16x32xf32>, tensor<32x64xf32> -> tensor<8x16x64xf32>
    %s = plan.matmul %q, %k {transpose_rhs}
        : tensor<8x16x32xf32>, tensor<8x16x32xf32> -> tensor<8x16x16xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$lhs, Plan_FloatTensor:$rhs,
                       UnitAttr:$transpose_lhs, UnitAttr:$transpose_rhs,
                       UnitAttr:$sum_leading);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Plan_BiasAddOp : Plan_ComputeOp<"bias_add", [AllTypesMatch<["input", "result"]>]> {
  let summary = "Adds a 1-D bias along the last dimension";
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$bias);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input `,` $bias attr-dict `:` type($input) `,` type($bias)";
  let hasVerifier = 1;
}

def Plan_BiasGradOp : Plan_ComputeOp<"bias_grad", []> {
  let summary = "Gradient of a bias: sum of the output gradient over all but the last dimension";
  let arguments = (ins Plan_FloatTensor:$grad);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$grad attr-dict `:` type($grad) `->` type($result)";
  let hasVerifier = 1;
}

def Plan_CastOp : Plan_ComputeOp<"cast", []> {
  let summary = "Converts a float tensor to another float element type";
  let description = [{
    Rounds to nearest even (narrowing) or widens exactly: mixed precision's
    conversions, made by plan-mixed-precision (the 16-bit compute copy of an
    fp32 master weight; fp32 logits for the loss) and by autodiff (a cast's
    gradient is the cast back). Laid out like its input; a pending sum passes
    through it, so a gradient summed over ranks is summed in the wider type.

    ```mlir
    %w16 = plan.cast %w : tensor<64x64xf32> -> tensor<64x64xbf16>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

class Plan_BinaryOp<string mnemonic, string doc>
    : Plan_ComputeOp<mnemonic, [SameOperandsAndResultType]> {
  let summary = doc;
  let arguments = (ins Plan_FloatTensor:$lhs, Plan_FloatTensor:$rhs);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

class Plan_UnaryOp<string mnemonic, string doc>
    : Plan_ComputeOp<mnemonic, [SameOperandsAndResultType]> {
  let summary = doc;
  let arguments = (ins Plan_FloatTensor:$input);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Plan_AddOp : Plan_BinaryOp<"add", "Elementwise sum">;
def Plan_ReluOp : Plan_UnaryOp<"relu", "max(x, 0)">;
def Plan_GeluOp : Plan_UnaryOp<"gelu",
    "GELU: tanh approximation (GPT-2's), or the exact erf form with `exact`"> {
  let arguments = (ins Plan_FloatTensor:$input, UnitAttr:$exact);
}
def Plan_ReluGradOp : Plan_BinaryOp<"relu_grad",
    "Input gradient of relu: `relu_grad %x, %dy` = dy * (x > 0)">;
def Plan_GeluGradOp : Plan_BinaryOp<"gelu_grad",
    "Input gradient of gelu: `gelu_grad %x, %dy` = dy * gelu'(x)"> {
  let arguments = (ins Plan_FloatTensor:$lhs, Plan_FloatTensor:$rhs,
                       UnitAttr:$exact);
}

//===----------------------------------------------------------------------===//
// Transformer ops
//===----------------------------------------------------------------------===//

def Plan_I32Tensor : RankedTensorOf<[I32]>;

def Plan_MulOp : Plan_BinaryOp<"mul", "Elementwise product"> {
  let description = [{
    ```mlir
    %z = plan.mul %x, %y : tensor<8x16xf32>
    ```
    Sharding: both operands distributed alike; the product is linear in each
    factor, so one partial factor gives a partial product.
  }];
}

def Plan_SubOp : Plan_BinaryOp<"sub", "Elementwise difference lhs - rhs"> {
  let description = [{
    ```mlir
    %z = plan.sub %x, %y : tensor<8x16xf32>
    ```
    Sharding: both operands distributed alike; a difference of pending sums
    over the same axes is a pending sum.
  }];
}

def Plan_LossScaleOp : Plan_UnaryOp<"loss_scale",
    "Multiplies by the runtime's dynamic loss scale (its inverse with `inverse`)"> {
  let description = [{
    `loss_scale = dynamic` (plan-loss-scale): the loss gradient is
    multiplied by the scale S before the fp16 backward, and each parameter
    gradient by 1/S (`inverse`) before its norm and update. S lives in the
    runtime, which halves it and skips the step when an unscaled gradient is
    not finite on any rank, and doubles it after a run of clean steps.
    Laid out like its input; linear.
  }];
  let arguments = (ins Plan_FloatTensor:$input, UnitAttr:$inverse);
}

def Plan_ScaleOp : Plan_UnaryOp<"scale", "Multiplies by a constant"> {
  let description = [{
    `plan.scale %x {factor = -1.0 : f32}`, laid out like its input. Made by
    autodiff (the gradient of `a - b` with respect to `b`).
  }];
  let arguments = (ins Plan_FloatTensor:$input, F32Attr:$factor);
}

def Plan_SiluOp : Plan_UnaryOp<"silu", "SiLU (swish): x * sigmoid(x)"> {
  let description = [{
    ```mlir
    %y = plan.silu %x : tensor<8x16xf32>
    ```
    Sharding: the result is laid out like the operand.
  }];
}

def Plan_SoftmaxOp : Plan_ComputeOp<"softmax", [SameOperandsAndResultType]> {
  let summary = "Softmax over the last dimension";
  let description = [{
    ```mlir
    %p = plan.softmax %x : tensor<8x16xf32>
    ```
    The last dimension must not be split (each row is normalized whole).
  }];
  let arguments = (ins Plan_FloatTensor:$input);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Plan_EmbeddingOp : Plan_ComputeOp<"embedding", []> {
  let summary = "Looks up rows of a table: result[i..., :] = table[ids[i...], :]";
  let description = [{
    `ids` (i32, rank >= 1) index the rows of `table` `[V, D]`; the result has
    the shape of `ids` followed by `D`.

    ```mlir
    %h = plan.embedding %ids, %wte : tensor<8x128xi32>, tensor<50304x768xf32> -> tensor<8x128x768xf32>
    ```
    Sharding: the result's leading dimensions follow those of `ids`. A table
    split along the vocabulary (dim 0) gives a partial result (each rank
    contributes the rows it owns, zeros elsewhere: vocab-parallel embedding);
    a table split along dim 1 splits the result's last dimension. The lookup
    is linear in the table, so a partial table gives a partial result; `ids`
    must not be partial.
  }];
  let arguments = (ins Plan_I32Tensor:$ids, Plan_FloatTensor:$table);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $ids `,` $table attr-dict `:` type($ids) `,` type($table) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Plan_PosEmbeddingOp : Plan_ComputeOp<"pos_embedding",
    [AllTypesMatch<["input", "result"]>]> {
  let summary = "Adds learned position embeddings: result[b, s, :] = input[b, s, :] + table[s, :]";
  let description = [{
    `input` is `[B, S, D]` and `table` `[max_seq, D]` with `S <= max_seq`;
    rows `0..S-1` of the table are added to every sequence of the batch.

    ```mlir
    %x = plan.pos_embedding %h, %wpe : tensor<8x128x768xf32>, tensor<1024x768xf32>
    ```
    Sharding: the result is laid out like `input`; the table's rows stay
    whole, and the positions may be split over `cp` only (each rank adds
    its positions' rows; its gradient is then a sum over cp).
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$table);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $table attr-dict `:` type($input) `,` type($table)
  }];
  let hasVerifier = 1;
}

def Plan_LayerNormOp : Plan_ComputeOp<"layernorm",
    [AllTypesMatch<["input", "result"]>, AllTypesMatch<["gamma", "beta"]>]> {
  let summary = "Layer normalization over the last dimension";
  let description = [{
    `result = (x - mean) / sqrt(var + eps) * gamma + beta`, with the mean and
    (biased) variance taken over the last dimension. `gamma` and `beta` are
    1-D with the size of that dimension.

    ```mlir
    %y = plan.layernorm %x, %g, %b {eps = 1.0e-05 : f32} : tensor<8x16x64xf32>, tensor<64xf32>
    ```
    Sharding: the normalized (last) dimension stays whole, so `gamma` and
    `beta` are whole; the other dimensions (batch, sequence) may be split and
    the result is laid out like `x`.
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$gamma,
                       Plan_FloatTensor:$beta,
                       DefaultValuedAttr<F32Attr, "1e-5">:$eps);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $gamma `,` $beta attr-dict `:` type($input) `,` type($gamma)
  }];
  let hasVerifier = 1;
}

def Plan_RmsNormOp : Plan_ComputeOp<"rmsnorm",
    [AllTypesMatch<["input", "result"]>]> {
  let summary = "RMS normalization over the last dimension";
  let description = [{
    `result = x / sqrt(mean(x^2) + eps) * gamma`, the mean taken over the
    last dimension; `gamma` is 1-D with the size of that dimension.

    ```mlir
    %y = plan.rmsnorm %x, %g {eps = 1.0e-05 : f32} : tensor<8x16x64xf32>, tensor<64xf32>
    ```
    Sharding: as `plan.layernorm`.
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$gamma,
                       DefaultValuedAttr<F32Attr, "1e-5">:$eps);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $input `,` $gamma attr-dict `:` type($input) `,` type($gamma)
  }];
  let hasVerifier = 1;
}

def Plan_AttentionOp : Plan_ComputeOp<"attention"> {
  let summary = "Causal scaled-dot-product self-attention, packed q/k/v input";
  let description = [{
    `qkv` is `[B, S, (H + 2 * KV) * Dh]`, laid out along the last dimension
    as the `H` query heads, then the `KV` key heads, then the `KV` value
    heads, each `Dh` wide (`H` = `num_heads`, `KV` = `num_kv_heads`; `H` is a
    multiple of `KV`, and query head `h` attends with key/value head
    `h / (H / KV)`: multi-, grouped- or multi-query attention). Position `i`
    attends to positions `<= i` with scores scaled by `1 / sqrt(Dh)`. The
    result is `[B, S, H * Dh]`, the heads' outputs side by side.

    ```mlir
    %a = plan.attention %qkv {num_heads = 12 : i64, num_kv_heads = 12 : i64}
        : tensor<8x128x2304xf32> -> tensor<8x128x768xf32>
    ```
    Sharding: the batch may be split, and the heads (a factor of size
    `num_kv_heads`): the packed dimension is then split as three segments,
    so that each rank holds whole query heads with their key/value heads.
    The sequence is positional: it may be split over the context-parallel
    axis `cp` only (each rank holding two chunks of it), where the lowering
    exchanges what causal attention needs (`plan.parallel`'s `cp_comm`);
    a split over any other axis is gathered first.

    With `dropout` = p (attention(..., dropout = p)), each attention
    probability is zeroed with probability p and the others scaled by
    1 / (1 - p) before they weight the values, as GPT-3 and Megatron train;
    the mask hashes the probability's index in the global [B, H, S, S]
    tensor with `dropout_uid` (dropout()'s rule), so it is the same for
    every plan.
  }];
  let arguments = (ins Plan_FloatTensor:$qkv, I64Attr:$num_heads,
                       I64Attr:$num_kv_heads, OptionalAttr<F32Attr>:$dropout,
                       OptionalAttr<I64Attr>:$dropout_uid);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$qkv attr-dict `:` type($qkv) `->` type($result)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Width of one head (Dh).
    int64_t getHeadDim();
  }];
}

def Plan_RopeOp : Plan_ComputeOp<"rope", [SameOperandsAndResultType]> {
  let summary = "Rotary position embedding of the query and key heads of packed qkv";
  let description = [{
    `qkv` is packed as for `plan.attention`: `[B, S, (H + 2 * KV) * Dh]`.
    Each query and key head vector `x` (Dh wide, even) at sequence position
    `p` is rotated in Llama's rotate-half convention: for `i < Dh / 2`, with
    `a = p * theta^(-2i / Dh)`,
    `y[i] = x[i] cos a - x[i + Dh/2] sin a` and
    `y[i + Dh/2] = x[i + Dh/2] cos a + x[i] sin a`; the value heads pass
    through. `inverse` rotates by `-a`: the transpose, which is the
    gradient. Positions are global: a sequence split over `cp` rotates each
    rank's rows by their positions (like attention's, the sequence may be
    split over cp only); the batch and the heads may be split, as for
    `plan.attention`. Linear.

    ```mlir
    %r = plan.rope %qkv {num_heads = 8 : i64, num_kv_heads = 2 : i64,
                         theta = 1.0e+04 : f64} : tensor<4x64x768xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$qkv, I64Attr:$num_heads,
                       I64Attr:$num_kv_heads, F64Attr:$theta,
                       UnitAttr:$inverse);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$qkv attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Plan_CrossEntropyOp : Plan_ComputeOp<"cross_entropy", []> {
  let summary = "Mean softmax cross-entropy over all positions (a scalar)";
  let description = [{
    `logits` is `[..., V]`, `targets` (i32) has the shape of `logits` without
    the last dimension and holds class indices in `[0, V)`. The result is the
    mean over all positions of `-log softmax(logits)[target]`.

    ```mlir
    %l = plan.cross_entropy %logits, %t : tensor<8x128x50304xf32>, tensor<8x128xi32> -> tensor<f32>
    ```
    With `valid_classes`, only classes below it take part (the rest is
    vocabulary padding). Sharding: splitting the leading dimensions gives a
    result that is partial over those axes; a split vocabulary is exchanged
    by the lowering (row maxima and sums), never gathered.
  }];
  let arguments = (ins Plan_FloatTensor:$logits, Plan_I32Tensor:$targets,
                       OptionalAttr<I64Attr>:$valid_classes);
  let results = (outs Plan_FloatScalar:$result);
  let assemblyFormat = [{
    $logits `,` $targets attr-dict `:` type($logits) `,` type($targets) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Plan_TransposeOp : Plan_ComputeOp<"transpose", []> {
  let summary = "Permutes the dimensions of a tensor";
  let description = [{
    Result dimension `i` is input dimension `permutation[i]`.

    ```mlir
    %t = plan.transpose %x {permutation = array<i64: 1, 0>} : tensor<8x4xf32> -> tensor<4x8xf32>
    ```
    Sharding: the dimensions carry their mesh axes along.
  }];
  let arguments = (ins Plan_FloatTensor:$input, DenseI64ArrayAttr:$permutation);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Plan_ReshapeOp : Plan_ComputeOp<"reshape", []> {
  let summary = "Reinterprets a tensor with a new shape (row-major order)";
  let description = [{
    Same elements, same row-major order, a new static shape.

    ```mlir
    %r = plan.reshape %x : tensor<8x128x768xf32> -> tensor<1024x768xf32>
    ```
    Sharding: both shapes are written as products of common factors
    (`[B, S, D] -> [B * S, D]` is factors b, s, d); a dimension made of
    several factors is split by its major one only. Shapes without common
    factors move as one whole block.
  }];
  let arguments = (ins Plan_FloatTensor:$input);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Plan_ShardingConstraintOp : Plan_ComputeOp<"sharding_constraint",
    [SameOperandsAndResultType, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Identity that pins how a value is distributed";
  let description = [{
    The result is the operand, distributed as `sharding` (like Shardy's
    `sdy.sharding_constraint`). Sharding propagation gives the result
    exactly this sharding (at the priority of its `plan.sharding_origin`,
    user by default) and propagates it to the operand; where the operand's
    layout differs, plan-insert-reshards reshards it and removes the
    constraint.

    ```mlir
    %y = plan.sharding_constraint %x <@mesh, [[dp], []]> : tensor<8x4xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_ShardingAttr:$sharding);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input $sharding attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Plan_MseLossOp : Plan_ComputeOp<"mse_loss",
    [AllTypesMatch<["prediction", "target"]>]> {
  let summary = "Mean squared error over all elements (a scalar)";
  let arguments = (ins Plan_FloatTensor:$prediction, Plan_FloatTensor:$target);
  let results = (outs Plan_FloatScalar:$result);
  let assemblyFormat = "$prediction `,` $target attr-dict `:` type($prediction) `->` type($result)";
  let hasVerifier = 1;
}

def Plan_MseLossGradOp : Plan_ComputeOp<"mse_loss_grad",
    [SameOperandsAndResultType]> {
  let summary = "Gradient of mse_loss with respect to the prediction (loss gradient 1)";
  let arguments = (ins Plan_FloatTensor:$prediction, Plan_FloatTensor:$target);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$prediction `,` $target attr-dict `:` type($result)";
}

def Plan_SgdUpdateOp : Plan_ComputeOp<"sgd_update",
    [AllTypesMatch<["param", "grad", "result"]>]> {
  let summary = "Plain SGD step: result = param - lr * grad";
  let description = [{
    With `clipped by %sumsq` (and `max_norm`), the gradient is first scaled
    by min(1, max_norm / sqrt(sumsq)): with the sum of squares of every
    gradient, that clips by the global norm.
  }];
  let arguments = (ins Plan_FloatTensor:$param, Plan_FloatTensor:$grad,
                       Optional<Plan_FloatScalar>:$clip_sumsq, F32Attr:$lr,
                       OptionalAttr<F32Attr>:$max_norm);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $param `,` $grad (`clipped` `by` $clip_sumsq^)? attr-dict `:` type($result)
    (`,` type($clip_sumsq)^)?
  }];
  let hasVerifier = 1;
}

def Plan_AdamWUpdateOp : Plan_ComputeOp<"adamw_update",
    [AllTypesMatch<["param", "grad", "exp_avg", "exp_avg_sq", "result",
                    "new_exp_avg", "new_exp_avg_sq"]>]> {
  let summary = "AdamW step with decoupled weight decay";
  let description = [{
    The moment estimates are optimizer state the step takes and returns
    (arguments of kind "state"), so they have layouts like any value: ZeRO
    splits them over the data-parallel axis. With `clipped by %sumsq` (and
    `max_norm`), the gradient is first scaled as sgd_update's is.

    ```mlir
    %w2, %m2, %v2 = plan.adamw_update %w, %g, %m, %v clipped by %s {beta1 = 0.9 : f32, beta2 = 0.999 : f32, eps = 1.0e-08 : f32, lr = 1.0e-03 : f32, max_norm = 1.0 : f32, weight_decay = 0.1 : f32} : tensor<64x64xf32>, tensor<f32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$param, Plan_FloatTensor:$grad,
                       Plan_FloatTensor:$exp_avg, Plan_FloatTensor:$exp_avg_sq,
                       Optional<Plan_FloatScalar>:$clip_sumsq,
                       F32Attr:$lr, F32Attr:$beta1, F32Attr:$beta2,
                       F32Attr:$eps, F32Attr:$weight_decay,
                       OptionalAttr<F32Attr>:$max_norm);
  let results = (outs Plan_FloatTensor:$result, Plan_FloatTensor:$new_exp_avg,
                      Plan_FloatTensor:$new_exp_avg_sq);
  let assemblyFormat = [{
    $param `,` $grad `,` $exp_avg `,` $exp_avg_sq (`clipped` `by` $clip_sumsq^)?
    attr-dict `:` type($result) (`,` type($clip_sumsq)^)?
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Gradient ops (made by plan-autodiff)
//===----------------------------------------------------------------------===//

def Plan_EmbeddingGradOp : Plan_ComputeOp<"embedding_grad", []> {
  let summary = "Gradient of an embedding table: rows scatter-added from the output gradient";
  let arguments = (ins Plan_I32Tensor:$ids, Plan_FloatTensor:$grad);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $ids `,` $grad attr-dict `:` type($ids) `,` type($grad) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Plan_PosEmbeddingGradOp : Plan_ComputeOp<"pos_embedding_grad", []> {
  let summary = "Gradient of a position table: the output gradient summed over the batch";
  let arguments = (ins Plan_FloatTensor:$grad);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$grad attr-dict `:` type($grad) `->` type($result)";
  let hasVerifier = 1;
}

def Plan_LayerNormGradOp : Plan_ComputeOp<"layernorm_grad",
    [AllTypesMatch<["input", "grad", "input_grad"]>,
     AllTypesMatch<["gamma_grad", "beta_grad"]>]> {
  let summary = "Gradients of layernorm: input, scale and shift";
  let description = [{
    Recomputes the statistics from `input`; `grad` is the gradient of the
    layernorm's output. Results: d input, d gamma, d beta. The parameters'
    gradients have gamma's type, or gamma's shape in f32 (plan-fuse-casts:
    a 16-bit plan's gradients that only widen to the fp32 master weight
    are summed and written in fp32).
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$gamma,
                       Plan_FloatTensor:$grad, DefaultValuedAttr<F32Attr, "1e-5">:$eps);
  let results = (outs Plan_FloatTensor:$input_grad, Plan_FloatTensor:$gamma_grad,
                      Plan_FloatTensor:$beta_grad);
  let assemblyFormat = [{
    $input `,` $gamma `,` $grad attr-dict `:` type($input) `,` type($gamma)
    `->` type($gamma_grad)
  }];
  let hasVerifier = 1;
  let builders = [OpBuilder<(ins "::mlir::Value":$input, "::mlir::Value":$gamma,
                                 "::mlir::Value":$grad, "::mlir::FloatAttr":$eps), [{
    build($_builder, $_state, ::mlir::TypeRange{input.getType(), gamma.getType(),
          gamma.getType()}, input, gamma, grad, eps);
  }]>];
}

def Plan_RmsNormGradOp : Plan_ComputeOp<"rmsnorm_grad",
    [AllTypesMatch<["input", "grad", "input_grad"]>]> {
  let summary = "Gradients of rmsnorm: input and scale";
  let description = [{
    d gamma has gamma's type, or gamma's shape in f32 (as layernorm_grad's).
  }];
  let arguments = (ins Plan_FloatTensor:$input, Plan_FloatTensor:$gamma,
                       Plan_FloatTensor:$grad, DefaultValuedAttr<F32Attr, "1e-5">:$eps);
  let results = (outs Plan_FloatTensor:$input_grad, Plan_FloatTensor:$gamma_grad);
  let assemblyFormat = [{
    $input `,` $gamma `,` $grad attr-dict `:` type($input) `,` type($gamma)
    `->` type($gamma_grad)
  }];
  let hasVerifier = 1;
  let builders = [OpBuilder<(ins "::mlir::Value":$input, "::mlir::Value":$gamma,
                                 "::mlir::Value":$grad, "::mlir::FloatAttr":$eps), [{
    build($_builder, $_state, ::mlir::TypeRange{input.getType(), gamma.getType()},
          input, gamma, grad, eps);
  }]>];
}

def Plan_AttentionGradOp : Plan_ComputeOp<"attention_grad",
    [AllTypesMatch<["qkv", "result"]>]> {
  let summary = "Gradient of causal attention with respect to the packed qkv";
  let arguments = (ins Plan_FloatTensor:$qkv, Plan_FloatTensor:$grad,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads,
                       OptionalAttr<F32Attr>:$dropout,
                       OptionalAttr<I64Attr>:$dropout_uid);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $qkv `,` $grad attr-dict `:` type($qkv) `,` type($grad)
  }];
}

def Plan_SiluGradOp : Plan_BinaryOp<"silu_grad",
    "Input gradient of silu: `silu_grad %x, %dy` = dy * silu'(x)">;
def Plan_SoftmaxGradOp : Plan_BinaryOp<"softmax_grad",
    "Input gradient of softmax from its output: `softmax_grad %y, %dy`">;

def Plan_CrossEntropyGradOp : Plan_ComputeOp<"cross_entropy_grad",
    [AllShapesMatch<["logits", "result"]>]> {
  let summary = "Gradient of cross_entropy (mean over positions) with respect to the logits";
  let description = [{
    The result has the logits' shape and their element type, or the 16-bit
    type its only user narrows it to (plan-fuse-casts: computed in fp32
    either way, rounded once).
  }];
  let arguments = (ins Plan_FloatTensor:$logits, Plan_I32Tensor:$targets,
                       OptionalAttr<I64Attr>:$valid_classes);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $targets attr-dict `:` type($logits) `,` type($targets) `->`
    type($result)
  }];
}

def Plan_SumSqOp : Plan_ComputeOp<"sumsq"> {
  let summary = "Sum of squares of every element of every input (the global gradient norm)";
  let description = [{
    One op for all the gradients: its inputs are laid out independently
    (each may be split over any axes, and one mesh axis may split several
    of them), and the result is a pending sum over every axis that splits
    one of them. The lowering counts an input that is whole over one of
    those axes on that axis's first rank only, so each rank's term adds up
    to the norm in one all-reduce, not one per gradient.
  }];
  let arguments = (ins Variadic<Plan_FloatTensor>:$inputs);
  let results = (outs Plan_FloatScalar:$result);
  let assemblyFormat = "$inputs attr-dict `:` type($inputs) `->` type($result)";
  let hasVerifier = 1;
}

include "dialects/plan/PlanConvOps.td"
include "dialects/plan/PlanMoeOps.td"
include "dialects/plan/PlanCollectiveOps.td"

#endif
