//===- RankOps.td - The per-rank planc dialect ----------------------------===//
#ifndef RANK_OPS_TD
#define RANK_OPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "dialects/plan/PlanAttrs.td"

def Rank_Dialect : Dialect {
  let name = "rank";
  let cppNamespace = "::planc::rank";
  let summary = "Per-rank level of planc: what one rank executes";
  let description = [{
    Values are buffers (`memref`) with the local shape one rank holds.
    Communication is explicit (`rank.all_reduce` over mesh axes), compute
    ops write into destination buffers, and parameters and per-step inputs
    are declared at module level with their local shapes. Every compute op
    is one call into the planrt runtime.
  }];
  let dependentDialects = ["::planc::plan::PlanDialect",
                           "::mlir::memref::MemRefDialect"];
}

def RuntimeCallOpInterface : OpInterface<"RuntimeCallOpInterface"> {
  let cppNamespace = "::planc::rank";
  let description = [{
    An op that codegen turns into one planrt call: the callee gets the
    runtime context, then the op's operands in order, then the attributes
    that getRuntimeAttrNames lists (by default all inherent attributes, in
    alphabetical order, which is how ODS lists them). A string attribute
    whose name ends in `axis` names a mesh axis and is passed as the axis's
    index (-1 for the empty string: no axis); an array attribute whose name
    ends in `axes` is passed as an axis mask (0 when it is absent).
  }];
  let methods = [
    InterfaceMethod<"The planrt function this op calls.", "std::string",
      "getRuntimeCallee", (ins), "",
      "return (\"planrt::\" + $_op->getName().stripDialect()).str();">,
    InterfaceMethod<"Attributes passed to the callee, in order.",
      "::llvm::SmallVector<::llvm::StringRef>", "getRuntimeAttrNames", (ins), "",
      "return ::llvm::SmallVector<::llvm::StringRef>($_op->getName().getAttributeNames());">,
  ];
}

def WorkspaceOpInterface : OpInterface<"WorkspaceOpInterface"> {
  let cppNamespace = "::planc::rank";
  let description = [{
    An op that takes temporaries of its own while it runs (statistics,
    partial sums, im2col columns, a collective's staging buffer). The bytes
    are those of `planrt/workspace.h`, which the runtime shares, so the
    memory plan reserves exactly what the op takes; the runtime checks it on
    every call. Attached to the ops as external models (Workspace.cpp).
  }];
  let methods = [
    InterfaceMethod<"Bytes of temporaries the op takes, given the mesh.",
      "int64_t", "getWorkspaceBytes",
      (ins "const ::planc::rank::WorkspaceEnv &":$env)>,
  ];
}

class Rank_Op<string mnemonic, list<Trait> traits = []>
    : Op<Rank_Dialect, mnemonic, !listconcat(traits, [Plan_OneSixteenBitType])>;

// Float buffers: f32, bf16 or f16 (one type per op; mixed precision, issue
// 9, will produce the 16-bit ones).
def Rank_FloatBuffer : MemRefOf<[F32, BF16, F16]>;
// Per-step inputs may be token ids, and step buffers a mixture of experts'
// choices.
def Rank_DataBuffer : MemRefOf<[F32, BF16, F16, I32]>;
def Rank_I32Buffer : MemRefOf<[I32]>;

//===--- Declarations ------------------------------------------------------===//

def Rank_ParamDeclOp : Rank_Op<"param_decl", [Symbol]> {
  let summary = "A trainable parameter: this rank's shard and its initializer";
  let description = [{
    `export_rows` (optional) exports only the leading rows (a padded
    vocabulary's real size).
    `type` is the local shape. With `sharding`, the global parameter is split
    as it says (axes of a dimension outer first; segments split one by one);
    initialization and export use global element indices, so values do not
    depend on the plan.
    With `copy` (bf16 or f16; plan-keep-param-copies), planrt also keeps the
    parameter rounded to that type, which `rank.param_copy` reads: the
    optimizer update writes it with the parameter, and planrt rounds it
    again whenever it sets the parameter otherwise (start, --resume,
    --init-from). It is derived, so checkpoints do not hold it.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttrOf<Rank_FloatBuffer>:$type,
                       Plan_InitAttr:$init, OptionalAttr<Plan_ShardingAttr>:$sharding,
                       OptionalAttr<I64Attr>:$export_rows,
                       OptionalAttr<TypeAttr>:$copy);
  let assemblyFormat = [{
    $sym_name `:` $type `init` $init (`sharding` $sharding^)? (`copy` $copy^)?
    attr-dict
  }];
  let hasVerifier = 1;
}

def Rank_StateDeclOp : Rank_Op<"state_decl", [Symbol]> {
  let summary = "State kept across steps: this rank's shard";
  let description = [{
    Optimizer state (AdamW moments) starts at zero and is written only to
    checkpoints. A `buffer` is non-trainable model state (batch norm's
    running statistics): it starts as `init` says (zeros without it), and
    is also exported with the parameters (`--save`) and loaded by
    `--init-from`.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttrOf<Rank_FloatBuffer>:$type,
                       OptionalAttr<Plan_ShardingAttr>:$sharding,
                       UnitAttr:$buffer, OptionalAttr<Plan_InitAttr>:$init);
  let assemblyFormat = [{
    $sym_name `:` $type (`buffer` $buffer^)? (`init` $init^)?
    (`sharding` $sharding^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Rank_InputDeclOp : Rank_Op<"input_decl", [Symbol]> {
  let summary = "A per-step input or label: this rank's rows of the batch";
  let description = [{
    When `batch_axis` is set, dimension 0 is split over that mesh axis and
    this rank reads rows `[coord * n, (coord + 1) * n)` of the global batch;
    with a `batch_inner_axis` too (expert parallelism's ranks take samples
    like data-parallel ones), over both, the inner one within each block of
    the outer: block `coord * inner_size + inner_coord`. With `batch_runs`
    (microbatches), the rank's rows are that many runs, and each run of the
    outer block is split over the inner axis.
    When `seq_axis` is set (context parallelism), dimension 1 is split over
    that axis: the sequence is cut into 2 G chunks and the rank with
    coordinate g reads chunks g and 2 G - 1 - g.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, TypeAttrOf<Rank_DataBuffer>:$type,
                       StrAttr:$role, OptionalAttr<StrAttr>:$batch_axis,
                       OptionalAttr<StrAttr>:$seq_axis,
                       OptionalAttr<StrAttr>:$batch_inner_axis,
                       OptionalAttr<I64Attr>:$batch_runs);
  let assemblyFormat = [{
    $sym_name `:` $type `role` $role (`batch_axis` $batch_axis^)?
    (`batch_inner_axis` $batch_inner_axis^)? (`seq_axis` $seq_axis^)?
    attr-dict
  }];
  let hasVerifier = 1;
}

//===--- Buffers -----------------------------------------------------------===//

def Rank_ParamOp : Rank_Op<"param", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "This rank's buffer of a declared parameter";
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Rank_FloatBuffer:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Rank_ParamCopyOp : Rank_Op<"param_copy", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "This rank's 16-bit copy of a declared parameter";
  let description = [{
    The parameter rounded to its declaration's `copy` type, as `rank.cast`
    would round it: valid whenever a step or evaluation runs, written by the
    parameter's optimizer update (which must name it as its `copy`).
  }];
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Rank_FloatBuffer:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Rank_StateOp : Rank_Op<"state", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "This rank's buffer of declared optimizer state";
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Rank_FloatBuffer:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Rank_InputOp : Rank_Op<"input", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "This rank's buffer of a declared per-step input";
  let arguments = (ins FlatSymbolRefAttr:$name);
  let results = (outs Rank_DataBuffer:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
}

def Rank_MicrobatchLoopOp : Rank_Op<"microbatch_loop",
    [SingleBlock, NoTerminator]> {
  let summary = "Runs its body once per microbatch";
  let description = [{
    The body's argument is the microbatch index, from 0 to `count` - 1.
    Scratch buffers allocated in the body live for one iteration; buffers
    that outlive the loop (gradient accumulators) are allocated before it.

    ```mlir
    rank.microbatch_loop 4 {
    ^bb0(%mb: index):
      %x = rank.rows %input, %mb of 4 : memref<8x16xi32> -> memref<2x16xi32>
      ...
    }
    ```
  }];
  let arguments = (ins I64Attr:$count);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$count $body attr-dict";
}

//===--- Pipeline ------------------------------------------------------------===//

def Rank_PipelineOp : Rank_Op<"pipeline", [SingleBlock, NoTerminator]> {
  let summary = "The units of a pipelined step and the order each pipeline rank runs them in";
  let description = [{
    The mesh axis `axis` carries `stages` / (its size) stages per pipeline
    rank (stage s on the rank whose coordinate is s mod size). The body holds
    the `rank.unit`s (numbered by position, from 0) and then one
    `rank.timeline` per pipeline rank: the units and microbatches that rank
    runs, in order (`schedule` names the schedule they follow). Values pass
    between units only through `rank.send` / `rank.recv` (another pipeline
    rank) and the stash (`rank.stash_put` / `rank.stash_get`, this rank).

    ```mlir
    rank.pipeline over "pp" stages 2 microbatches 4 schedule "1f1b" {
      rank.unit stage 0 phase "F" { ^bb0(%mb: index): ... }
      ...
      rank.timeline 0 { rank.exec 0 mb 0  rank.exec 0 mb 1 ... }
      rank.timeline 1 { ... }
    }
    ```
  }];
  let arguments = (ins StrAttr:$axis, I64Attr:$stages, I64Attr:$microbatches,
                       StrAttr:$schedule);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `over` $axis `stages` $stages `microbatches` $microbatches `schedule`
    $schedule $body attr-dict
  }];
}

def Rank_UnitOp : Rank_Op<"unit", [SingleBlock, NoTerminator,
                                   HasParent<"PipelineOp">]> {
  let summary = "One stage's forward (F), input gradient (B) or weight gradient (W) for one microbatch";
  let description = [{
    The body's argument is the microbatch. Scratch allocated in the body
    lives until the unit ends. `last` marks the stage's last backward phase
    (the microbatch's activations are then no longer in flight).
  }];
  let arguments = (ins I64Attr:$stage, StrAttr:$phase, UnitAttr:$last);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "`stage` $stage `phase` $phase (`last` $last^)? $body attr-dict";
}

def Rank_TimelineOp : Rank_Op<"timeline", [SingleBlock, NoTerminator,
                                           HasParent<"PipelineOp">]> {
  let summary = "What pipeline rank `rank` runs, in order (rank.exec ops)";
  let arguments = (ins I64Attr:$rank);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$rank $body attr-dict";
}

def Rank_ExecOp : Rank_Op<"exec", [HasParent<"TimelineOp">]> {
  let summary = "Runs unit number `unit` for microbatch `mb`";
  let arguments = (ins I64Attr:$unit, I64Attr:$mb);
  let assemblyFormat = "$unit `mb` $mb attr-dict";
}

def Rank_SendOp : Rank_Op<"send"> {
  let summary = "Sends a buffer to the pipeline rank of `to_stage` (asynchronous)";
  let description = [{
    `transfer` names the value moved (the same on the matching
    `rank.recv`); the microbatch is the enclosing unit's. Messages between
    two ranks are received in the order they are sent.
  }];
  let arguments = (ins Arg<Rank_DataBuffer, "", [MemRead]>:$buffer,
                       I64Attr:$transfer, I64Attr:$to_stage);
  let assemblyFormat = "$buffer `to` `stage` $to_stage `transfer` $transfer attr-dict `:` type($buffer)";
}

def Rank_RecvOp : Rank_Op<"recv"> {
  let summary = "Receives into a buffer from the pipeline rank of `from_stage` (blocking)";
  let arguments = (ins Arg<Rank_DataBuffer, "", [MemWrite]>:$buffer,
                       I64Attr:$transfer, I64Attr:$from_stage);
  let assemblyFormat = "$buffer `from` `stage` $from_stage `transfer` $transfer attr-dict `:` type($buffer)";
}

def Rank_StashPutOp : Rank_Op<"stash_put"> {
  let summary = "Keeps a buffer for `readers` later units of this rank (this microbatch)";
  let arguments = (ins Arg<Rank_DataBuffer, "", [MemRead]>:$buffer,
                       I64Attr:$slot, I64Attr:$readers);
  let assemblyFormat = "$buffer `slot` $slot `readers` $readers attr-dict `:` type($buffer)";
}

def Rank_StashGetOp : Rank_Op<"stash_get"> {
  let summary = "The buffer a previous unit kept in `slot` for this microbatch";
  let arguments = (ins I64Attr:$slot);
  let results = (outs Rank_DataBuffer:$result);
  let assemblyFormat = "`slot` $slot attr-dict `:` type($result)";
}

def Rank_StashReleaseOp : Rank_Op<"stash_release"> {
  let summary = "This unit is done with `slot` (its memory is freed after the last reader)";
  let arguments = (ins I64Attr:$slot);
  let assemblyFormat = "`slot` $slot attr-dict";
}

def Rank_SubviewOp : Rank_Op<"subview", [Pure]> {
  let summary = "Elements [offset, offset + size) of a buffer, with a shape (a view)";
  let arguments = (ins Rank_FloatBuffer:$source, I64Attr:$offset);
  let results = (outs Rank_FloatBuffer:$result);
  let assemblyFormat = [{
    $source `[` $offset `]` attr-dict `:` type($source) `->` type($result)
  }];
}

def Rank_RowsOp : Rank_Op<"rows", [Pure]> {
  let summary = "Block `index` of `count` along dimension 0 (a view)";
  let arguments = (ins Rank_DataBuffer:$source, Index:$index, I64Attr:$count);
  let results = (outs Rank_DataBuffer:$result);
  let assemblyFormat = [{
    $source `,` $index `of` $count attr-dict `:` type($source) `->` type($result)
  }];
}

def Rank_ShardViewOp : Rank_Op<"shard_view", [Pure]> {
  let summary = "This rank's block along dimension 0 over mesh axis `axis` (a view)";
  let description = [{
    What `rank.shard_slice ... dim 0` copies, seen in place: block g of G
    along dimension 0, g being this rank's coordinate on `axis` and G its
    size (the result's dimension 0 times G is the source's).
  }];
  let arguments = (ins Rank_FloatBuffer:$source, StrAttr:$axis);
  let results = (outs Rank_FloatBuffer:$result);
  let assemblyFormat = [{
    $source `over` $axis attr-dict `:` type($source) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Rank_AllocOp : Rank_Op<"alloc"> {
  let summary = "A scratch buffer of the step";
  let description = [{
    With `rank.stash`, the buffer outlives its pipeline unit (it is kept with
    `rank.stash_put`). With `rank.stage = s`, only the ranks that hold stage s
    allocate it. `plan-memory` gives every other alloc an `offset` in the
    rank's arena and a `kind` ("activation" or "gradient"), moves it to its
    first use and ends its life with `rank.dealloc` after its last one.
  }];
  let arguments = (ins OptionalAttr<I64Attr>:$offset,
                       OptionalAttr<StrAttr>:$kind);
  let results = (outs Res<Rank_DataBuffer, "", [MemAlloc]>:$result);
  let builders = [OpBuilder<(ins "::mlir::Type":$type), [{
    build($_builder, $_state, type, ::mlir::IntegerAttr(), ::mlir::StringAttr());
  }]>];
  let assemblyFormat = "attr-dict `:` type($result)";
}

def Rank_DeallocOp : Rank_Op<"dealloc"> {
  let summary = "Ends the life of a planned buffer: its arena bytes may be reused";
  let description = [{
    Inserted by `plan-memory` after the last use of a `rank.alloc` (for a
    buffer reduced by `rank.all_reduce_start`, after the matching wait). The
    runtime checks that no two live buffers share bytes, and counts the live
    bytes of each kind.
  }];
  let arguments = (ins Arg<Rank_DataBuffer, "", [MemFree]>:$buffer);
  let assemblyFormat = "$buffer attr-dict `:` type($buffer)";
}

//===--- Compute (destination-style: the last operand is written) ----------===//

class Rank_CallOp<string mnemonic, list<Trait> traits = []>
    : Rank_Op<mnemonic, !listconcat(traits, [RuntimeCallOpInterface])>;

def Rank_MatmulOp : Rank_CallOp<"matmul",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface,
                               ["getRuntimeCallee", "getRuntimeAttrNames"]>]> {
  let summary = "out = op(a) @ op(b), each viewed as [rows, last dim]";
  let description = [{
    With `accumulate`, out += op(a) @ op(b) (planrt::matmul_accumulate): a
    weight gradient summed over microbatches by its GEMM, with no temporary
    and no separate add. (`out` is declared read as well for that case.)
    With `plus %r` (an unbiased projection whose product only fed the
    residual stream's add, plan-fuse-epilogues on the cuda target), out =
    %r + op(a) @ op(b) (planrt::matmul_add: cuBLASLt's C, beta = 1); %r has
    out's type, in another buffer.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$lhs,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$rhs,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemRead]>:$residual,
                       Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$out,
                       BoolAttr:$transpose_lhs, BoolAttr:$transpose_rhs,
                       UnitAttr:$accumulate);
  let assemblyFormat = [{
    $lhs `,` $rhs (`plus` $residual^)? `into` $out attr-dict `:` type($lhs) `,` type($rhs) (`plus` type($residual)^)? `->` type($out)
  }];
  let hasVerifier = 1;
}

def Rank_MatmulBiasOp : Rank_CallOp<"matmul_bias",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface,
                               ["getRuntimeCallee", "getRuntimeAttrNames"]>]> {
  let summary = "out = op(a) @ op(b) + bias (+ residual), bias along out's last dim";
  let description = [{
    A matmul whose only use is a bias add (plan-fuse-epilogues, cuda
    target): planrt::matmul_bias adds the bias in the GEMM's epilogue
    (cuBLASLt's CUBLASLT_EPILOGUE_BIAS) instead of a pass over out. The
    bias has out's element type. With `plus %r` (the residual add that was
    the biased product's only reader), planrt::matmul_bias_add also adds
    %r, of out's type, as the GEMM's C matrix (beta = 1): out is rounded
    once. Where the backend has no such epilogue, planrt runs the matmul,
    the bias add and the add, as before.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$lhs,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$rhs,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$bias,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemRead]>:$residual,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       BoolAttr:$transpose_lhs, BoolAttr:$transpose_rhs);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` $bias (`plus` $residual^)? `into` $out attr-dict `:` type($lhs) `,` type($rhs) `,` type($bias) (`plus` type($residual)^)? `->` type($out)
  }];
  let hasVerifier = 1;
}

def Rank_MatmulBiasGeluOp : Rank_CallOp<"matmul_bias_gelu",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "pre = op(a) @ op(b) + bias; out = gelu(pre), tanh form";
  let description = [{
    A `rank.matmul_bias` whose result a `rank.gelu` reads next
    (plan-fuse-epilogues, cuda target): planrt::matmul_bias_gelu writes the
    pre-activation (which the backward's gelu_grad reads) and its GELU from
    the GEMM's epilogue (cuBLASLt's CUBLASLT_EPILOGUE_GELU_AUX_BIAS, the
    tanh form). Where the backend has no such epilogue, planrt runs the
    matmul, the bias add and the gelu, as before.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$lhs,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$rhs,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$bias,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$pre,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       BoolAttr:$transpose_lhs, BoolAttr:$transpose_rhs);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` $bias `into` $pre `,` $out attr-dict `:` type($lhs) `,` type($rhs) `,` type($bias) `->` type($pre) `,` type($out)
  }];
  let hasVerifier = 1;
}

def Rank_MatmulDgeluOp : Rank_CallOp<"matmul_dgelu",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "dpre = (op(a) @ op(b)) * gelu'(pre), tanh form";
  let description = [{
    A matmul whose product's only reader is a `rank.gelu_grad` with `pre`
    as its input (plan-fuse-epilogues, cuda target): the GELU's backward
    applied in the GEMM's epilogue (cuBLASLt's CUBLASLT_EPILOGUE_DGELU,
    reading the pre-activation that `rank.matmul_bias_gelu` wrote), so the
    product is never written. Where the backend has no such epilogue,
    planrt runs the matmul and the gelu_grad, as before.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$lhs,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$rhs,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$pre,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       BoolAttr:$transpose_lhs, BoolAttr:$transpose_rhs);
  let assemblyFormat = [{
    $lhs `,` $rhs `,` $pre `into` $out attr-dict `:` type($lhs) `,` type($rhs) `,` type($pre) `->` type($out)
  }];
  let hasVerifier = 1;
}

def Rank_MatmulBiasGradOp : Rank_CallOp<"matmul_bias_grad",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface,
                               ["getRuntimeCallee", "getRuntimeAttrNames"]>]> {
  let summary = "out = op(a) @ op(b); bias_grad = sum over the rows of b";
  let description = [{
    A linear layer's weight gradient (x^T dy) and its bias gradient (the
    column sums of dy), which `rank.bias_grad` computed in a pass of its own
    over dy (plan-fuse-epilogues, cuda target): cuBLASLt sums dy's rows as
    the GEMM reads them (CUBLASLT_EPILOGUE_BGRADA). `rhs` is not
    transposed. Where the backend has no such epilogue, planrt runs the
    matmul and the bias_grad, as before (so the op takes bias_grad's
    workspace). With `accumulate` (microbatches), out += op(a) @ op(b)
    (planrt::matmul_bias_grad_accumulate, beta = 1) and bias_grad is still
    written, not added to. (`out` is declared read as well for that case.)
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$lhs,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$rhs,
                       Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$out,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$bias_grad,
                       BoolAttr:$transpose_lhs, BoolAttr:$transpose_rhs,
                       UnitAttr:$accumulate);
  let assemblyFormat = [{
    $lhs `,` $rhs `into` $out `,` $bias_grad attr-dict `:` type($lhs) `,` type($rhs) `->` type($out) `,` type($bias_grad)
  }];
  let hasVerifier = 1;
}

class Rank_UnaryCallOp<string mnemonic, string doc> : Rank_CallOp<mnemonic> {
  let summary = doc;
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out);
  let assemblyFormat = "$input `into` $out attr-dict `:` type($input) `->` type($out)";
}

class Rank_BinaryCallOp<string mnemonic, string doc> : Rank_CallOp<mnemonic> {
  let summary = doc;
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$lhs,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$rhs,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out);
  let assemblyFormat = [{
    $lhs `,` $rhs `into` $out attr-dict `:` type($lhs) `,` type($rhs) `->` type($out)
  }];
}

def Rank_BiasAddOp : Rank_BinaryCallOp<"bias_add", "out = input + bias (last dim)">;
def Rank_AddOp : Rank_BinaryCallOp<"add", "out = lhs + rhs">;
def Rank_ReluGradOp : Rank_BinaryCallOp<"relu_grad", "out = dy * (x > 0)">;
def Rank_GeluGradOp : Rank_BinaryCallOp<"gelu_grad", "out = dy * gelu'(x)">;
def Rank_ReluOp : Rank_UnaryCallOp<"relu", "out = max(x, 0)">;
def Rank_GeluOp : Rank_UnaryCallOp<"gelu", "out = gelu(x), tanh form">;
def Rank_GeluExactOp : Rank_UnaryCallOp<"gelu_exact", "out = gelu(x), erf form">;
def Rank_GeluExactGradOp : Rank_BinaryCallOp<"gelu_exact_grad", "out = dy * gelu'(x), erf form">;
def Rank_BiasGradOp : Rank_UnaryCallOp<"bias_grad", "out[j] = sum over rows of dy[., j]">;

def Rank_MseLossOp : Rank_CallOp<"mse_loss"> {
  let summary = "out = scale * sum((pred - target)^2)";
  let description = [{
    `scale` is one over the number of elements of the global tensor, so
    summing `out` over the ranks that hold parts of it gives the mean.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$prediction,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$target,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out, F32Attr:$scale);
  let assemblyFormat = [{
    $prediction `,` $target `into` $out attr-dict `:` type($prediction) `,` type($target) `->` type($out)
  }];
}

def Rank_MseLossGradOp : Rank_CallOp<"mse_loss_grad"> {
  let summary = "out = 2 * scale * (pred - target)";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$prediction,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$target,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out, F32Attr:$scale);
  let assemblyFormat = [{
    $prediction `,` $target `into` $out attr-dict `:` type($prediction) `,` type($target) `->` type($out)
  }];
}

def Rank_SgdUpdateOp : Rank_CallOp<"sgd_update",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeCallee"]>]> {
  let summary = "param -= lr * grad, in place";
  let description = [{
    With `copy %c`, the updated parameter is also rounded into `%c` (its
    `rank.param_copy`) in the same pass.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$param,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemWrite]>:$copy,
                       F32Attr:$lr);
  let assemblyFormat = [{
    $param `,` $grad (`copy` $copy^)? attr-dict `:` type($param) `,` type($grad) (`,` type($copy)^)?
  }];
  let hasVerifier = 1;
}

def Rank_AdamWUpdateOp : Rank_CallOp<"adamw_update",
    [AttrSizedOperandSegments, DeclareOpInterfaceMethods<RuntimeCallOpInterface,
                               ["getRuntimeCallee", "getRuntimeAttrNames"]>]> {
  let summary = "AdamW step in place on the parameter and its two moments";
  let description = [{
    With `clipped by %sumsq`, the gradient is first scaled as
    `rank.clip_by_global_norm %grad, %sumsq {max_norm}` would scale it (the
    same factor, the same rounding) without being written back: one pass
    over the gradient instead of two. With `copy %c`, the updated parameter
    is also rounded into `%c` (its `rank.param_copy`) in the same pass.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$param,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$exp_avg,
                       Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$exp_avg_sq,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemRead]>:$clip_sumsq,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemWrite]>:$copy,
                       F32Attr:$lr, F32Attr:$beta1,
                       F32Attr:$beta2, F32Attr:$eps, F32Attr:$weight_decay,
                       OptionalAttr<F32Attr>:$max_norm);
  let assemblyFormat = [{
    $param `,` $grad `,` $exp_avg `,` $exp_avg_sq (`clipped` `by` $clip_sumsq^)? (`copy` $copy^)? attr-dict `:` type($param) `,` type($grad) `,` type($exp_avg) `,` type($exp_avg_sq) (`,` type($clip_sumsq)^)? (`copy` type($copy)^)?
  }];
  let hasVerifier = 1;
}

def Rank_ReportLossOp : Rank_CallOp<"report_loss"> {
  let summary = "Hands this step's (reduced) loss to the runtime for logging";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$loss);
  let assemblyFormat = "$loss attr-dict `:` type($loss)";
}

//===--- Transformer layers (forward and backward) --------------------------===//

class Rank_TernaryCallOp<string mnemonic, string doc> : Rank_CallOp<mnemonic> {
  let summary = doc;
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$a,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$b,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$c,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out);
  let assemblyFormat = [{
    $a `,` $b `,` $c `into` $out attr-dict `:` type($a) `,` type($b) `,`
    type($c) `->` type($out)
  }];
}

def Rank_CopyOp : Rank_UnaryCallOp<"copy", "out = input">;
def Rank_CastOp : Rank_UnaryCallOp<"cast",
    "out = input in out's element type (f32, bf16, f16; round to nearest even)">;
def Rank_SiluOp : Rank_UnaryCallOp<"silu", "out = x * sigmoid(x)">;
def Rank_SoftmaxOp : Rank_UnaryCallOp<"softmax", "softmax over the last dimension">;
def Rank_SiluGradOp : Rank_BinaryCallOp<"silu_grad", "out = dy * silu'(x)">;
def Rank_SoftmaxGradOp : Rank_BinaryCallOp<"softmax_grad", "out = y * (dy - sum(dy * y)) from y = softmax">;
def Rank_MulOp : Rank_BinaryCallOp<"mul", "out = lhs * rhs">;
def Rank_ScaleOp : Rank_CallOp<"scale"> {
  let summary = "out = factor * x";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out, F32Attr:$factor);
  let assemblyFormat = "$input `into` $out attr-dict `:` type($input) `->` type($out)";
}
def Rank_SubOp : Rank_BinaryCallOp<"sub", "out = lhs - rhs">;
def Rank_LossScaleOp : Rank_CallOp<"loss_scale"> {
  let summary = "out = S * x, or x / S with inverse (S: the runtime's loss scale)";
  let description = [{
    With `inverse` the runtime also notes whether any element of the result
    is not finite (an overflow of the scaled fp16 backward).
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       BoolAttr:$inverse);
  let assemblyFormat = "$input `into` $out attr-dict `:` type($input) `->` type($out)";
}
def Rank_LossScaleCheckOp : Rank_CallOp<"loss_scale_check"> {
  let summary = "Every rank learns whether any rank's unscaled gradients overflowed";
  let description = [{
    A collective over all ranks, before the first optimizer update: with an
    overflow anywhere, this step's updates (and clipping) are skipped on
    every rank and the loss scale halves.
  }];
  let assemblyFormat = "attr-dict";
}
// With a `seq_axis` (context parallelism), the rows are this rank's part of
// the sequence split over that axis (planrt::seq_position: two chunks).
def Rank_PosEmbeddingOp : Rank_CallOp<"pos_embedding"> {
  let summary = "out[b, s] = x[b, s] + table[position of s]";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$lhs,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$rhs,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       DefaultValuedStrAttr<StrAttr, "">:$seq_axis);
  let assemblyFormat = [{
    $lhs `,` $rhs `into` $out attr-dict `:` type($lhs) `,` type($rhs) `->` type($out)
  }];
}
def Rank_PosEmbeddingGradOp : Rank_CallOp<"pos_embedding_grad"> {
  let summary = "dtable[position of s] = sum over b of dy[b, s]; 0 elsewhere";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       DefaultValuedStrAttr<StrAttr, "">:$seq_axis);
  let assemblyFormat = "$input `into` $out attr-dict `:` type($input) `->` type($out)";
}

def Rank_EmbeddingOp : Rank_CallOp<"embedding"> {
  let summary = "out[...] = table[ids[...]]";
  let description = [{
    With a `vocab_axis`, the table holds this rank's rows of the vocabulary
    (block `coord` of that axis) and other ids give zero rows.
  }];
  let arguments = (ins Arg<Rank_I32Buffer, "", [MemRead]>:$ids,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$table,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       DefaultValuedStrAttr<StrAttr, "">:$vocab_axis);
  let assemblyFormat = [{
    $ids `,` $table `into` $out attr-dict `:` type($ids) `,` type($table) `->` type($out)
  }];
}

// The scatter of dy rows at ids into a table's gradient; embedding_grad
// zeroes the table first, embedding_grad_add adds to what it holds.
class Rank_EmbeddingGradBase<string mnemonic, string doc, list<OpVariableDecorator> outEffects>
    : Rank_CallOp<mnemonic> {
  let summary = doc;
  let arguments = (ins Arg<Rank_I32Buffer, "", [MemRead]>:$ids,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", outEffects>:$out,
                       DefaultValuedStrAttr<StrAttr, "">:$vocab_axis);
  let assemblyFormat = [{
    $ids `,` $grad `into` $out attr-dict `:` type($ids) `,` type($grad) `->` type($out)
  }];
}

def Rank_EmbeddingGradOp : Rank_EmbeddingGradBase<"embedding_grad",
    "dtable = scatter-add of dy rows at ids (overwrites dtable)", [MemWrite]>;

// A tied embedding's gradient added into the other use's (the LM head's),
// in place.
def Rank_EmbeddingGradAddOp : Rank_EmbeddingGradBase<"embedding_grad_add",
    "out += scatter-add of dy rows at ids", [MemRead, MemWrite]>;

def Rank_LayerNormOp : Rank_CallOp<"layernorm",
    [AllTypesMatch<["gamma", "beta"]>]> {
  let summary = "layernorm over the last dimension";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gamma,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$beta,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out, F32Attr:$eps);
  let assemblyFormat = [{
    $input `,` $gamma `,` $beta `into` $out attr-dict `:` type($input) `,`
    type($gamma) `->` type($out)
  }];
}

def Rank_LayerNormGradOp : Rank_CallOp<"layernorm_grad",
    [AllTypesMatch<["input", "grad", "input_grad"]>,
     AllTypesMatch<["gamma_grad", "beta_grad"]>,
     DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeCallee"]>]> {
  let summary = "d input, d gamma, d beta of layernorm (statistics recomputed)";
  let description = [{
    d gamma and d beta have gamma's type, or gamma's shape in f32. With
    `plus %r` (the residual stream's gradient, of d input's type, in another
    buffer: the add that was d input's only reader, plan-fuse-epilogues on
    the cuda target), planrt::layernorm_grad_add writes d input = %r + the
    norm's input gradient, rounded once.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gamma,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemRead]>:$residual,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$input_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$gamma_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$beta_grad,
                       F32Attr:$eps);
  let assemblyFormat = [{
    $input `,` $gamma `,` $grad (`plus` $residual^)? `into` $input_grad `,`
    $gamma_grad `,` $beta_grad attr-dict `:` type($input) `,` type($gamma)
    (`plus` type($residual)^)? `->` type($gamma_grad)
  }];
  let hasVerifier = 1;
}

def Rank_RmsNormOp : Rank_CallOp<"rmsnorm"> {
  let summary = "rmsnorm over the last dimension";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gamma,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out, F32Attr:$eps);
  let assemblyFormat = [{
    $input `,` $gamma `into` $out attr-dict `:` type($input) `,` type($gamma)
    `->` type($out)
  }];
}

def Rank_RmsNormGradOp : Rank_CallOp<"rmsnorm_grad",
    [AllTypesMatch<["input", "grad", "input_grad"]>,
     DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeCallee"]>]> {
  let summary = "d input, d gamma of rmsnorm";
  let description = [{
    d gamma has gamma's type, or gamma's shape in f32. `plus %r`: as
    rank.layernorm_grad's (planrt::rmsnorm_grad_add).
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$gamma,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemRead]>:$residual,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$input_grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$gamma_grad,
                       F32Attr:$eps);
  let assemblyFormat = [{
    $input `,` $gamma `,` $grad (`plus` $residual^)? `into` $input_grad `,`
    $gamma_grad attr-dict `:` type($input) `,` type($gamma)
    (`plus` type($residual)^)? `->` type($gamma_grad)
  }];
  let hasVerifier = 1;
}

// Attention dropout on every rank attention op (planrt.h attention): p
// (0: none), the mask's uid, and what places this rank's rows in the global
// [B, H, S, S] probabilities, as rank.dropout does: the axes that split the
// batch, the microbatches and those of the axes that split each microbatch,
// and the axes that split the heads (outer, then within them: context
// parallelism's head split).
// Their defaults (no dropout) are left out of the printed IR.
defvar Rank_AttnDropoutArgs = (ins
    DefaultValuedAttr<F32Attr, "0.0f">:$dropout,
    DefaultValuedAttr<I64Attr, "0">:$dropout_uid,
    DefaultValuedAttr<StrArrayAttr, "{}">:$batch_axes,
    DefaultValuedAttr<I64Attr, "0">:$microbatches,
    DefaultValuedAttr<StrArrayAttr, "{}">:$mb_inner_axes,
    DefaultValuedAttr<StrArrayAttr, "{}">:$head_axes,
    DefaultValuedAttr<StrArrayAttr, "{}">:$head_inner_axes);
class Rank_AttentionCallOp<string mnemonic>
    : Rank_CallOp<mnemonic, [DeclareOpInterfaceMethods<RuntimeCallOpInterface,
                                                       ["getRuntimeAttrNames"]>]> {
  let extraClassDefinition = [{
    ::llvm::SmallVector<::llvm::StringRef> $cppClass::getRuntimeAttrNames() {
      return {"num_heads", "num_kv_heads", "dropout", "dropout_uid",
              "batch_axes", "microbatches", "mb_inner_axes", "head_axes",
              "head_inner_axes"};
    }
  }];
}

def Rank_AttentionOp : Rank_AttentionCallOp<"attention"> {
  let summary = "causal attention over packed qkv (GQA when num_kv_heads < num_heads)";
  let arguments = !con((ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads),
                       Rank_AttnDropoutArgs);
  let assemblyFormat = "$qkv `into` $out attr-dict `:` type($qkv) `->` type($out)";
}

def Rank_RopeOp : Rank_CallOp<"rope",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "rotary position embedding of packed qkv's query and key heads (plan.rope)";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads, F64Attr:$theta,
                       BoolAttr:$inverse,
                       DefaultValuedStrAttr<StrAttr, "">:$seq_axis);
  let assemblyFormat = "$qkv `into` $out attr-dict `:` type($qkv) `->` type($out)";
}

// Context parallelism by all-to-all (Ulysses). Along the last dimension,
// the seq-split side holds segments (q_width wide, then two of kv_width when
// kv_width > 0: packed q/k/v), each split into G blocks of whole heads over
// `axis`; the other side holds every position of block g of each segment,
// in position order.
def Rank_SeqToHeadsOp : Rank_CallOp<"seq_to_heads",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "[B, S/G, W] split by sequence -> [B, S, W/G] split by heads";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       I64Attr:$q_width, I64Attr:$kv_width, StrAttr:$axis);
  let assemblyFormat = [{
    $input `into` $out `over` $axis attr-dict `:` type($input) `->` type($out)
  }];
  let hasVerifier = 1;
}
// Context parallelism by all-gather: this rank's queries against every
// position's keys and values (planrt/context_parallel.h).
def Rank_KvGatherOp : Rank_CallOp<"kv_gather",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "kv [B, S, 2 kv_width] = every position's keys and values of the ranks' qkv [B, S/G, W]";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$kv,
                       I64Attr:$q_width, I64Attr:$kv_width, StrAttr:$axis);
  let assemblyFormat = [{
    $qkv `into` $kv `over` $axis attr-dict `:` type($qkv) `->` type($kv)
  }];
}
def Rank_AttentionCpOp : Rank_CallOp<"attention_cp",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface,
                               ["getRuntimeCallee", "getRuntimeAttrNames"]>]> {
  let summary = "causal attention of this rank's queries (qkv's rows, split over `axis`) over every position's kv";
  let description = [{
    With `keeping %lse` (plan-keep-attention on the cuda target, for a
    16-bit attention without dropout that cuDNN may run): where cuDNN runs
    the rank's two chunks of queries (planrt::attention_cp_lse), each
    chunk's log-sum-exp [B, H, rows] goes to `lse` (f32, packed chunk by
    chunk at planrt/workspace.h outside::cudnn_cp_lse_at, of
    outside::cudnn_cp_lse_floats), so that `rank.attention_cp_grad` reads
    it and this output instead of running the forward again. Where cuDNN
    does not run, `lse` is not written and the gradient recomputes.
  }];
  let arguments = !con((ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$kv,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemWrite]>:$lse,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads, StrAttr:$axis),
                       Rank_AttnDropoutArgs);
  let assemblyFormat = [{
    $qkv `,` $kv `into` $out (`keeping` $lse^)? `over` $axis attr-dict `:`
    type($qkv) `,` type($kv) `->` type($out) (`keeping` type($lse)^)?
  }];
}
def Rank_AttentionCpGradOp : Rank_CallOp<"attention_cp_grad",
    [AttrSizedOperandSegments,
     DeclareOpInterfaceMethods<RuntimeCallOpInterface,
                               ["getRuntimeCallee", "getRuntimeAttrNames"]>]> {
  let summary = "dqkv's query columns and the keys' and values' partial gradients (f32) of attention_cp";
  let description = [{
    With `kept %o, %lse` (the forward's output and what its `keeping`
    wrote; planrt::attention_cp_grad_lse): where cuDNN ran the forward with
    them, its backward reads them instead of running each chunk's forward
    again. Elsewhere the gradient recomputes as without them.
  }];
  let arguments = !con((ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$kv,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$dkv,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemRead]>:$fwd_out,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemRead]>:$lse,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads, StrAttr:$axis),
                       Rank_AttnDropoutArgs);
  let assemblyFormat = [{
    $qkv `,` $kv `,` $grad (`kept` $fwd_out^ `,` $lse)? `into` $out `,` $dkv
    `over` $axis attr-dict `:` type($qkv) `,` type($kv) `,` type($grad)
    (`kept` type($fwd_out)^ `,` type($lse))? `->` type($out) `,` type($dkv)
  }];
  let hasVerifier = 1;
}
def Rank_KvReduceScatterOp : Rank_CallOp<"kv_reduce_scatter",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "dqkv's key and value columns = this rank's positions of the sum over `axis` of dkv";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$dkv,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       I64Attr:$q_width, I64Attr:$kv_width, StrAttr:$axis);
  let assemblyFormat = [{
    $dkv `into` $out `over` $axis attr-dict `:` type($dkv) `->` type($out)
  }];
}
// Context parallelism by ring: the keys and values go round the ranks of
// `axis`, one rank's block per step (planrt/context_parallel.h).
def Rank_AttentionRingOp : Rank_CallOp<"attention_ring",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface,
                               ["getRuntimeCallee", "getRuntimeAttrNames"]>]> {
  let summary = "causal attention of this rank's queries over every rank's keys and values, passed round a ring";
  let description = [{
    With `keeping %lse` (plan-keep-attention, where the gradient of the same
    qkv runs in this block and the output stays as written until then):
    each query row's log-sum-exp after the ring goes to `lse` (f32 [B, H,
    L]; planrt::attention_ring_lse), so that `rank.attention_ring_grad`
    reads it and this output instead of running the forward's ring again.
  }];
  let arguments = !con((ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemWrite]>:$lse,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads, StrAttr:$axis),
                       Rank_AttnDropoutArgs);
  let assemblyFormat = [{
    $qkv `into` $out (`keeping` $lse^)? `over` $axis attr-dict `:` type($qkv)
    `->` type($out) (`keeping` type($lse)^)?
  }];
  let hasVerifier = 1;
}
def Rank_AttentionRingGradOp : Rank_CallOp<"attention_ring_grad",
    [AttrSizedOperandSegments,
     DeclareOpInterfaceMethods<RuntimeCallOpInterface,
                               ["getRuntimeCallee", "getRuntimeAttrNames"]>]> {
  let summary = "d qkv of attention_ring (its rows' statistics recomputed by one more ring)";
  let description = [{
    With `kept %o, %lse` (the forward's output and what its `keeping`
    wrote; planrt::attention_ring_grad_lse): the rows' statistics and
    delta = dout . out come from them, and the gradient runs no forward
    ring: one ring of the keys and values fewer.
  }];
  let arguments = !con((ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemRead]>:$fwd_out,
                       Arg<Optional<Rank_FloatBuffer>, "", [MemRead]>:$lse,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads, StrAttr:$axis),
                       Rank_AttnDropoutArgs);
  let assemblyFormat = [{
    $qkv `,` $grad (`kept` $fwd_out^ `,` $lse)? `into` $out `over` $axis
    attr-dict `:` type($qkv) `,` type($grad) (`kept` type($fwd_out)^ `,`
    type($lse))? `->` type($out)
  }];
  let hasVerifier = 1;
}
def Rank_HeadsToSeqOp : Rank_CallOp<"heads_to_seq",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "[B, S, W/G] split by heads -> [B, S/G, W] split by sequence";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       I64Attr:$q_width, I64Attr:$kv_width, StrAttr:$axis);
  let assemblyFormat = [{
    $input `into` $out `over` $axis attr-dict `:` type($input) `->` type($out)
  }];
  let hasVerifier = 1;
}

def Rank_AttentionGradOp : Rank_AttentionCallOp<"attention_grad"> {
  let summary = "d qkv of causal attention (probabilities recomputed)";
  let arguments = !con((ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads),
                       Rank_AttnDropoutArgs);
  let assemblyFormat = [{
    $qkv `,` $grad `into` $out attr-dict `:` type($qkv) `,` type($grad) `->` type($out)
  }];
}

def Rank_AttentionKeepOp : Rank_AttentionCallOp<"attention_keep"> {
  let summary = "attention that keeps its exponentials and row statistics for the backward";
  let description = [{
    With `recompute = none`: `keep` [B, H, S, S] receives each query row's
    exp(scale q.k - m) and `stats` [B, H, S, 2] the row's (m, sum), so that
    `rank.attention_grad_kept` need not recompute the score matrix. The
    values are those the recomputation makes: the same results, bit for bit.
  }];
  let arguments = !con((ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$keep,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$stats,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads),
                       Rank_AttnDropoutArgs);
  let assemblyFormat = [{
    $qkv `into` $out `,` $keep `,` $stats attr-dict `:` type($qkv) `->`
    type($out) `,` type($keep) `,` type($stats)
  }];
}

def Rank_AttentionGradKeptOp : Rank_AttentionCallOp<"attention_grad_kept"> {
  let summary = "d qkv of causal attention from what rank.attention_keep kept";
  let arguments = !con((ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$keep,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$stats,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads),
                       Rank_AttnDropoutArgs);
  let assemblyFormat = [{
    $qkv `,` $keep `,` $stats `,` $grad `into` $out attr-dict `:` type($qkv)
    `,` type($keep) `,` type($stats) `,` type($grad) `->` type($out)
  }];
}

def Rank_AttentionLseOp : Rank_AttentionCallOp<"attention_lse"> {
  let summary = "attention that keeps each row's log-sum-exp for cuDNN's backward (cuda)";
  let description = [{
    plan-keep-attention on the cuda target, for a 16-bit attention without
    dropout that cuDNN may run: `lse` [B, H, S] (f32) receives each query
    row's log-sum-exp when cuDNN runs the forward, so that
    `rank.attention_grad_lse` reads it and the forward's output instead of
    running cuDNN's forward again. Where cuDNN does not run, `lse` is not
    written and the backward recomputes as `rank.attention_grad` does.
  }];
  let arguments = !con((ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$lse,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads),
                       Rank_AttnDropoutArgs);
  let assemblyFormat = [{
    $qkv `into` $out `,` $lse attr-dict `:` type($qkv) `->` type($out) `,` type($lse)
  }];
}

def Rank_AttentionGradLseOp : Rank_AttentionCallOp<"attention_grad_lse"> {
  let summary = "d qkv of causal attention from the forward's output and log-sum-exp (cuda)";
  let arguments = !con((ins Arg<Rank_FloatBuffer, "", [MemRead]>:$qkv,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$fwd_out,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$lse,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads),
                       Rank_AttnDropoutArgs);
  let assemblyFormat = [{
    $qkv `,` $fwd_out `,` $lse `,` $grad `into` $out attr-dict `:` type($qkv)
    `,` type($fwd_out) `,` type($lse) `,` type($grad) `->` type($out)
  }];
}

def Rank_CrossEntropyOp : Rank_CallOp<"cross_entropy"> {
  let summary = "out = scale * sum over rows of (logsumexp(row) - row[target])";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$logits,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$targets,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out, F32Attr:$scale,
                       DefaultValuedAttr<I64Attr, "0">:$valid_classes);
  let assemblyFormat = [{
    $logits `,` $targets `into` $out attr-dict `:` type($logits) `,` type($targets) `->` type($out)
  }];
}

def Rank_CrossEntropyGradOp : Rank_CallOp<"cross_entropy_grad"> {
  let summary = "out = scale * (softmax(row) - onehot(target))";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$logits,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$targets,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out, F32Attr:$scale,
                       DefaultValuedAttr<I64Attr, "0">:$valid_classes);
  let assemblyFormat = [{
    $logits `,` $targets `into` $out attr-dict `:` type($logits) `,` type($targets) `->` type($out)
  }];
}

def Rank_CrossEntropyInPlaceOp : Rank_CallOp<"cross_entropy_in_place",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "cross_entropy and cross_entropy_grad in one pass, the gradient over the logits";
  let description = [{
    out = scale * sum over rows of (logsumexp(row) - row[target]), and the
    logits replaced by grad_scale * (softmax(row) - onehot(target)): what
    plan-fuse-epilogues makes of the LM head's loss and its gradient on the
    cuda target (the logits in the GEMM's 16-bit type, read once for both).
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$logits,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$targets,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out, F32Attr:$scale,
                       F32Attr:$grad_scale,
                       DefaultValuedAttr<I64Attr, "0">:$valid_classes);
  let assemblyFormat = [{
    $logits `,` $targets `into` $out attr-dict `:` type($logits) `,` type($targets) `->` type($out)
  }];
}

//===--- Gradient norm ------------------------------------------------------===//

def Rank_FillOp : Rank_CallOp<"fill"> {
  let summary = "Sets every element to `value`";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemWrite]>:$buffer, F32Attr:$value);
  let assemblyFormat = "$buffer attr-dict `:` type($buffer)";
}

def Rank_SumSqAccumulateOp : Rank_CallOp<"sumsq_accumulate"> {
  let summary = "acc += sum(g^2)";
  let description = [{
    With `replicated_axes`, only the rank whose coordinate is 0 on each of
    them adds: `g` is whole over those axes and `acc` is summed over them
    later, which would count it once per rank.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$acc,
                       OptionalAttr<StrArrayAttr>:$replicated_axes);
  let assemblyFormat = "$input `into` $acc attr-dict `:` type($input) `->` type($acc)";
}

def Rank_ClipByGlobalNormOp : Rank_CallOp<"clip_by_global_norm"> {
  let summary = "g *= min(1, max_norm / sqrt(sumsq)), in place";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$grad,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$sumsq,
                       F32Attr:$max_norm);
  let assemblyFormat = "$grad `,` $sumsq attr-dict `:` type($grad) `,` type($sumsq)";
}

def Rank_ReportGradNormOp : Rank_CallOp<"report_grad_norm"> {
  let summary = "Hands this step's gradient sum of squares to the runtime for logging";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$sumsq);
  let assemblyFormat = "$sumsq attr-dict `:` type($sumsq)";
}

//===--- Observation ----------------------------------------------------------===//

def Rank_ObserveOp : Rank_Op<"observe"> {
  let summary = "Lets the runtime snapshot a buffer under a name";
  let description = [{
    A no-op unless the program was asked to record the current step
    (`--dump-step0`): then the buffer's contents at this point are copied and
    later written under `name` (e.g. `input/<name>`, `logits`,
    `grad/<param>`), for checking a run against an independent
    implementation. Id buffers (i32) are written as f32 values.
  }];
  let arguments = (ins Arg<Rank_DataBuffer, "", [MemRead]>:$buffer,
                       StrAttr:$name);
  let assemblyFormat = "$buffer `as` $name attr-dict `:` type($buffer)";
}

//===--- Views ----------------------------------------------------------------===//

def Rank_ViewOp : Rank_Op<"view", [Pure]> {
  let summary = "The same buffer seen with another shape (same element count)";
  let arguments = (ins Rank_FloatBuffer:$source);
  let results = (outs Rank_FloatBuffer:$result);
  let assemblyFormat = "$source attr-dict `:` type($source) `->` type($result)";
  let hasVerifier = 1;
}

//===--- Communication ----------------------------------------------------===//

def Rank_AllReduceOp : Rank_Op<"all_reduce"> {
  let summary = "In-place sum over the ranks that differ only in `axes`";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$buffer,
                       StrArrayAttr:$axes);
  let assemblyFormat = "$buffer `over` $axes attr-dict `:` type($buffer)";
}

def Rank_AllReduceStartOp : Rank_Op<"all_reduce_start"> {
  let summary = "Starts an in-place sum over `axes` without waiting for it";
  let description = [{
    A gradient bucket is reduced as soon as its gradients are final, while
    the rest of backward runs; `rank.collective_wait` with the same slot
    waits for it before the buffer is used again.
  }];
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$buffer,
                       StrArrayAttr:$axes, I64Attr:$slot);
  let assemblyFormat = "$buffer `over` $axes `slot` $slot attr-dict `:` type($buffer)";
}

def Rank_CollectiveWaitOp : Rank_Op<"collective_wait"> {
  let summary = "Waits for the collective started on `slot`";
  let arguments = (ins I64Attr:$slot);
  let assemblyFormat = "`slot` $slot attr-dict";
}

def Rank_AllReduceMaxOp : Rank_Op<"all_reduce_max"> {
  let summary = "In-place maximum over the ranks that differ only in `axes`";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead, MemWrite]>:$buffer,
                       StrArrayAttr:$axes);
  let assemblyFormat = "$buffer `over` $axes attr-dict `:` type($buffer)";
}

// Collectives that move a dimension's split, over one named axis. The
// runtime takes (in, out, dims..., axis). Those that only move values also
// move i32 (mixture-of-experts choices).
class Rank_DimCollectiveOp<string mnemonic, string doc,
                           Type buffer = Rank_FloatBuffer>
    : Rank_CallOp<mnemonic,
        [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = doc;
  let arguments = (ins Arg<buffer, "", [MemRead]>:$input,
                       Arg<buffer, "", [MemWrite]>:$out,
                       I64Attr:$dim, StrAttr:$axis);
  let assemblyFormat = [{
    $input `into` $out `dim` $dim `over` $axis attr-dict `:` type($input) `->` type($out)
  }];
  let hasVerifier = 1;
}

def Rank_AllGatherOp : Rank_DimCollectiveOp<"all_gather",
    "out = the blocks of every rank of `axis`, concatenated along `dim`",
    Rank_DataBuffer>;
def Rank_ReduceScatterOp : Rank_DimCollectiveOp<"reduce_scatter",
    "out = this rank's block along `dim` of the sum over `axis`">;
def Rank_ShardSliceOp : Rank_DimCollectiveOp<"shard_slice",
    "out = this rank's block along `dim` (local, no communication)",
    Rank_DataBuffer>;

def Rank_AllToAllOp : Rank_CallOp<"all_to_all",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "Moves the split over `axis` from `gather_dim` to `split_dim`";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$input,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       I64Attr:$gather_dim, I64Attr:$split_dim, StrAttr:$axis);
  let assemblyFormat = [{
    $input `into` $out `gather` $gather_dim `split` $split_dim `over` $axis attr-dict `:` type($input) `->` type($out)
  }];
}

//===--- Vocab-parallel cross-entropy --------------------------------------===//
// The logits' class dimension is split over `vocab_axis`; between these
// local parts the compiler puts the collectives (max, then sum of stats).

def Rank_RowMaxOp : Rank_UnaryCallOp<"row_max", "out[r] = max over the last dimension of x[r]">;

def Rank_CeLocalStatsOp : Rank_CallOp<"ce_local_stats",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "stats[r] = (sum exp(logits[r] - rowmax[r]), the target's logit if owned)";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$logits,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$targets,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$rowmax,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$stats,
                       StrAttr:$vocab_axis,
                       DefaultValuedAttr<I64Attr, "0">:$valid_classes);
  let assemblyFormat = [{
    $logits `,` $targets `,` $rowmax `into` $stats attr-dict `:` type($logits) `,` type($targets) `,` type($rowmax) `->` type($stats)
  }];
}

def Rank_CeLossFromStatsOp : Rank_CallOp<"ce_loss_from_stats"> {
  let summary = "out = scale * sum over rows of (rowmax + log(stats[r, 0]) - stats[r, 1])";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$stats,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$rowmax,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out, F32Attr:$scale);
  let assemblyFormat = [{
    $stats `,` $rowmax `into` $out attr-dict `:` type($stats) `,` type($rowmax) `->` type($out)
  }];
}

def Rank_CeGradFromStatsOp : Rank_CallOp<"ce_grad_from_stats",
    [DeclareOpInterfaceMethods<RuntimeCallOpInterface, ["getRuntimeAttrNames"]>]> {
  let summary = "dlogits = scale * (exp(logits - rowmax) / stats[r, 0] - onehot(owned target))";
  let arguments = (ins Arg<Rank_FloatBuffer, "", [MemRead]>:$logits,
                       Arg<Rank_I32Buffer, "", [MemRead]>:$targets,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$rowmax,
                       Arg<Rank_FloatBuffer, "", [MemRead]>:$stats,
                       Arg<Rank_FloatBuffer, "", [MemWrite]>:$out,
                       F32Attr:$scale, StrAttr:$vocab_axis,
                       DefaultValuedAttr<I64Attr, "0">:$valid_classes);
  let assemblyFormat = [{
    $logits `,` $targets `,` $rowmax `,` $stats `into` $out attr-dict `:` type($logits) `,` type($targets) `,` type($rowmax) `,` type($stats) `->` type($out)
  }];
}

include "dialects/rank/RankConvOps.td"
include "dialects/rank/RankMoeOps.td"

#endif
