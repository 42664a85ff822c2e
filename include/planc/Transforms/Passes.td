//===- Passes.td - planc's pass pipeline ----------------------------------===//
#ifndef PLANC_TRANSFORMS_PASSES_TD
#define PLANC_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def SeedSharding : Pass<"plan-seed-sharding", "mlir::ModuleOp"> {
  let summary = "Write the plan's strategy as sharding seeds on the model";
  let description = [{
    Inputs and labels: the batch split over `dp` (origin "data"). With
    `tensor_policy = "megatron"` and tp > 1: the first linear of every
    attention (by heads, as q/k/v segments) and MLP split by columns over
    `tp`, embedding tables by rows and an untied LM head by columns
    (origin "policy"); with sequence parallelism, a constraint at every norm
    input splitting the sequence over `tp`. Arguments that already have a
    layout (user annotations) are left as they are. With microbatches > 1
    (and no pipeline) the mesh gets the sequential axis `mb`. The options
    replace the plan's settings when given, so that a planner (or a test)
    can try strategies on the same IR.
  }];
  let options = [
    Option<"tensorPolicy", "tensor-policy", "std::string", "\"\"",
           "none or megatron (default: plan.parallel's tensor_policy)">,
    Option<"sequenceParallel", "sequence-parallel", "std::string", "\"\"",
           "true or false (default: plan.parallel's sequence_parallel)">,
    Option<"microbatchCount", "microbatches", "int64_t", "0",
           "microbatches per step (default: plan.parallel's microbatches)">,
  ];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def MixedPrecision : Pass<"plan-mixed-precision", "mlir::ModuleOp"> {
  let summary = "precision = bf16 | fp16: the model computes on 16-bit copies";
  let description = [{
    Rewrites the `plan.model` function for the train's precision. The
    arguments stay f32: parameters are the master weights the optimizer
    updates. Each use of a parameter or an f32 data input reads it through
    its own `plan.cast` to the 16-bit type (so its gradient is cast back to
    f32 by autodiff, one per use), and every float op result becomes 16-bit:
    the model computes on 16-bit parameters and stores 16-bit activations.
    A loss reads f32 casts of its operands, so the loss and its first
    gradient are f32. The ops compute in fp32 and round their 16-bit results
    (planrt). Nothing changes with precision = fp32 or tf32.
  }];
  let options = [
    Option<"precision", "precision", "std::string", "\"\"",
           "fp32, tf32, bf16 or fp16 (default: plan.train's precision)">,
  ];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def Autodiff : Pass<"plan-autodiff", "mlir::ModuleOp"> {
  let summary = "Turn the model's forward function into a training step";
  let description = [{
    Finds the function marked `plan.model` (the forward pass ending in a
    scalar loss) and adds `@train_step`: the forward ops, their
    reverse-mode derivative with respect to every parameter, and one
    optimizer update per parameter. The step returns the loss and the
    updated parameters, in the order of the model's parameters.
  }];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def FuseCasts : Pass<"plan-fuse-casts", "mlir::ModuleOp"> {
  let summary = "A matmul or gradient sum whose only use widens it writes the wide type";
  let description = [{
    In the train step, `plan.cast` to f32 of a bf16 `plan.matmul`,
    `plan.embedding_grad`, `plan.bias_grad` or `plan.pos_embedding_grad`
    result that has no other use becomes the op
    writing f32 itself: both accumulate in fp32 either way, so the rounding
    to 16 bits in between is dropped. fp16 gradients stay fp16 until they
    are summed, as Megatron sums them (plan.cast's sharding rule); without a
    pipeline, the sum of a parameter's per-use gradients
    `cast(a) + cast(b)` becomes `cast(a + b)`, so a tied embedding's
    gradient is reduced once. The weight gradients of mixed precision come out of their GEMM
    in fp32, summed over microbatches and ranks in fp32 (Megatron's
    gradient-accumulation fusion), and the logits reach the loss in fp32
    without a 16-bit copy. With bf16, a `plan.cross_entropy_grad` whose only
    use narrows it to bf16 writes bf16 itself (fp32 math, one rounding), so
    no fp32 loss gradient of the logits' size is kept.
  }];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def LossScale : Pass<"plan-loss-scale", "mlir::ModuleOp"> {
  let summary = "loss_scale = dynamic: scale the loss gradient, unscale the parameters' gradients";
  let description = [{
    In the train step of an fp16 plan with `loss_scale = dynamic`
    (Micikevicius et al. 2018): the loss gradient (the result of
    `plan.cross_entropy_grad` or `plan.mse_loss_grad`) is multiplied by the
    runtime's loss scale S (`plan.loss_scale`), so that small fp16
    gradients do not underflow, and every parameter gradient is multiplied
    by 1/S (`plan.loss_scale {inverse}`) before its norm, clipping and
    update read it. Both are linear, so an fp16 gradient is reduced scaled
    and unscaled in fp32. The runtime skips a step whose unscaled gradients
    overflowed on any rank (rank.loss_scale_check) and adjusts S.
  }];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def Recompute : Pass<"plan-recompute", "mlir::ModuleOp"> {
  let summary = "Recompute each layer's forward in its backward (recompute = full)";
  let description = [{
    With `recompute = full`: right before a layer's first backward op, the
    layer's forward ops are cloned (`plan.recompute`) and the backward reads
    the clones, so the backward needs only the layer's input (with a
    pipeline, one stashed tensor per layer and microbatch). Same ops on the
    same values: results are bit for bit those without recompute.
    `selective` changes nothing here: the attention gradient recomputes the
    probabilities; `none` keeps the score matrix (plan-keep-attention).
  }];
  let options = [
    Option<"policy", "policy", "std::string", "\"\"",
           "none, selective or full (default: plan.parallel's recompute)">,
  ];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def PropagateSharding : Pass<"plan-propagate-sharding", "mlir::ModuleOp"> {
  let summary = "Give every value of the training step a layout on the mesh";
  let description = [{
    From the seeds (sharded arguments with their `plan.sharding_origin`,
    and `plan.sharding_constraint`s), propagates layouts through every op's
    factor-based sharding rule, forward and backward to a fixed point, with
    priorities (user, then policy and data, then ZeRO storage). Records the
    axes of each op's factors (`plan.factor_axes`) and each result's layout
    (`plan.sharding`); arguments left open become replicated. Two
    annotations that disagree are an error naming both.
  }];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def InsertReshards : Pass<"plan-insert-reshards", "mlir::ModuleOp"> {
  let summary = "Insert a plan.reshard wherever a use needs another layout";
  let description = [{
    For every op, the layout each operand must have follows from the op's
    factor axes; where the operand's layout differs, a `plan.reshard` is
    inserted (shared by the uses of an intermediate value and placed after
    it; placed before each use of a parameter). Removes the sharding
    constraints.
  }];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def Rematerialize : Pass<"plan-rematerialize", "mlir::ModuleOp"> {
  let summary = "Rebuild cheap forward values in the backward instead of keeping them";
  let description = [{
    A forward value the backward reads is kept from the forward to the
    backward (with a pipeline, in the stash of every microbatch in flight).
    Two kinds are cheaper to rebuild than to keep, and each is cloned
    (`plan.recompute`) right before its first backward use:
    a gathered activation (a `plan.reshard` that only undoes splits, such as
    sequence parallelism's all-gather before a column-parallel matmul) keeps
    its shard and is gathered again, as Megatron-LM does; a parameter's
    16-bit copy (`plan.cast` of an argument, also after a ZeRO-3 gather) is
    cast again from the fp32 parameter, which is kept anyway (without
    microbatches: with them the copy is made once per step for all of
    them). The clones compute the same bits.
  }];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def ExpandReshards : Pass<"plan-expand-reshards", "mlir::ModuleOp"> {
  let summary = "Lower each plan.reshard to the cheapest collectives";
  let description = [{
    partial -> whole: all-reduce; partial -> split: reduce-scatter; split ->
    whole: all-gather; whole -> split: a local slice; a split moved to
    another dimension: all-to-all. Each collective names its mesh axis.
  }];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def PartitionStages : Pass<"plan-partition-stages", "mlir::ModuleOp"> {
  let summary = "Cut the layers into pipeline stages; stage and phase per op";
  let description = [{
    With pp * virtual_stages = S > 1: the repeated layers (`plan.layer`) are
    cut into S contiguous stages, at the plan's `stage_boundaries` or
    balanced by FLOPs (the ops before the first layer count for stage 0,
    those after the last for stage S - 1). Every op of the step and the
    model gets `plan.stage` (its layer's, else its operands', else its
    users'; -1 where several stages take part) and `plan.phase` ("F"
    forward, "B" what the input gradient sent to the previous stage needs,
    "W" the weight gradients); arguments get the stage of their users. The
    step records `plan.stage_first_layers` and `plan.stage_flops` (forward,
    B, W FLOPs of each stage) and a remark states the cut.
  }];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def LowerToRank : Pass<"plan-lower-to-rank", "mlir::ModuleOp"> {
  let summary = "Lower the global training step to what one rank executes";
  let description = [{
    Replaces `@train_step` by `@plan_step` in the rank dialect: parameters
    and inputs become module-level declarations with their local shapes,
    every tensor becomes a buffer of its local shape, every op a
    destination-style rank op, `plan.all_reduce` an in-place collective,
    and the loss is reported to the runtime. Parameters are updated in
    place. The forward function is dropped.

    Context parallelism without `cp_comm`: all-to-all where `cp` divides
    the heads and it moves fewer bytes than gathering the keys and values,
    on every target (on cuda all three exchanges run cuDNN for a 16-bit
    attention without dropout).
  }];
  let dependentDialects = ["::planc::rank::RankDialect",
                           "::mlir::memref::MemRefDialect"];
}

def ShardInPlace : Pass<"plan-shard-in-place", "mlir::ModuleOp"> {
  let summary = "ZeRO's updates in the parameters' own memory: no shard copies, no copy back";
  let description = [{
    As lowered, a sharded update copies its shard out of the whole buffer
    (`rank.shard_slice`), updates the copy, all-gathers it into a new
    buffer and copies that back into the parameter at the end of the step.
    In `@plan_step` (without a pipeline), where nothing else touches the
    parameter in between: the all-gather writes into the parameter itself
    and the copy back goes; and a shard along dimension 0 (of a parameter,
    or of a whole gradient that is not read again) becomes a view,
    `rank.shard_view`, so the update writes the parameter's memory and the
    gather runs in place. Same values, fewer passes over memory.
  }];
  let dependentDialects = ["::planc::rank::RankDialect"];
}

def RouteExperts : Pass<"plan-route-experts", "mlir::ModuleOp"> {
  let summary = "Expert parallelism moves only the routed rows (all-to-all dispatcher)";
  let description = [{
    A `rank.all_gather` over the expert axis (dimension 0) whose buffer only
    expert ops of that axis read, as their input, gates or output gradient,
    becomes `rank.routed_all_gather` by the group's choices (the buffer
    their choices are gathered into): only the rows routed to a rank's
    experts reach it, the others are zero, and the experts read none of
    them. A `rank.reduce_scatter` over the expert axis of what one expert op
    wrote (its output, or its input and gates gradients) becomes
    `rank.routed_reduce_scatter`: a rank sends back only the rows its
    experts wrote (elsewhere they are zero). Each is one all-to-all with
    variable counts (planrt: point-to-point messages per pair of ranks). Nothing else changes, so the results are those of the
    dense collectives; `ep_comm = all_gather` (plan.parallel) keeps those.
  }];
  let dependentDialects = ["::planc::rank::RankDialect"];
}

def KeepExperts : Pass<"plan-keep-experts", "mlir::ModuleOp"> {
  let summary = "recompute = none: a mixture of experts keeps its activations for the backward";
  let description = [{
    With `recompute = none`, each `rank.moe_experts(_swiglu)` of
    `@plan_step` whose backward (`rank.moe_experts(_swiglu)_grad` of the same
    choices and weights) runs in the same block becomes
    `rank.moe_experts(_swiglu)_keep`, writing its grouping of the routed rows,
    their inputs, the hidden pre-activations and the experts' outputs to a
    new buffer (planrt/workspace.h moe_kept_floats), and the backward
    `rank.moe_experts(_swiglu)_grad_kept`, which reads them instead of
    recomputing the forward's GEMMs (a third of the experts' backward work).
    `selective` and `full` recompute them. Same values, same results. In a
    pipeline the two run in different units and are left as they are.
  }];
  let options = [
    Option<"policy", "policy", "std::string", "\"\"",
           "none, selective or full (default: plan.parallel's recompute)">,
  ];
  let dependentDialects = ["::planc::rank::RankDialect"];
}

def KeepParamCopies : Pass<"plan-keep-param-copies", "mlir::ModuleOp"> {
  let summary = "Mixed precision's 16-bit weights kept across steps, written by the optimizer";
  let description = [{
    A parameter of `@plan_step` that one optimizer update writes whole, and
    that is cast whole into fresh 16-bit buffers before it, keeps its 16-bit
    copy across steps instead (`rank.param_decl ... copy bf16`): the casts
    and their buffers go, their readers read `rank.param_copy`, and the
    update (`rank.adamw_update` / `rank.sgd_update` `copy %c`) rounds the
    new weight into the copy in its own pass. `@plan_forward` reads the same
    copies. The bits do not change; the copies cost 2 bytes per parameter
    across steps (`rank.expected_bytes` counts them with the parameters).
    Not under ZeRO (`zero_stage` > 0), whose 16-bit plans cast their 1/dp
    shard of each weight at each use and keep their memory budget.
  }];
  let options = [
    Option<"enabled", "enabled", "bool", "true",
           "false: leave the casts (planc --param-copies=false)">,
  ];
  let dependentDialects = ["::planc::rank::RankDialect"];
}

def KeepAttention : Pass<"plan-keep-attention", "mlir::ModuleOp"> {
  let summary = "What attention keeps for its backward: the score matrix (recompute = none), cuDNN's log-sum-exp (cuda), ring's log-sum-exp";
  let description = [{
    With `recompute = none`, each `rank.attention` of `@plan_step` whose
    backward (`rank.attention_grad` of the same qkv) runs in the same block
    becomes `rank.attention_keep`, writing its exponentials [B, H, S, S] and
    row statistics [B, H, S, 2] to two new buffers, and the backward
    `rank.attention_grad_kept`, which reads them instead of recomputing q.k
    and exp. `selective` (and `full`) recompute them. Same values, same
    results. In a pipeline the two run in different units and are left as
    they are. On the cuda target no score matrix is kept (its tiled
    attention recomputes the exponentials tile by tile from the row
    statistics, flash attention's way); instead, under every policy, a
    16-bit attention without dropout that cuDNN may run becomes
    `rank.attention_lse`, writing each row's log-sum-exp [B, H, S] to a new
    buffer, and its backward `rank.attention_grad_lse`, which reads it and
    the forward's output (unless something between the two writes that
    output), so that cuDNN's backward does not run the forward again. The
    output must be alive in the backward anyway (read there, as the output
    projection's weight gradient does) or the forward run next to its
    backward with no other attention between (recomputed in its layer's
    backward): keeping it then costs at most one layer's backward. The
    output of context parallelism's all-to-all (every position of the
    rank's heads, which only `rank.heads_to_seq` reads) is kept as well:
    one more output per layer, as DeepSpeed-Ulysses holds, for the forward
    a long sequence's backward would run again. Context
    parallelism's all_gather attention alike: `rank.attention_cp` gains
    `keeping %lse` (its two chunks' log-sum-exps, one f32 buffer) and its
    `rank.attention_cp_grad` reads `kept %out, %lse`. Its ring, on every
    target and under every policy: `rank.attention_ring` gains `keeping
    %lse` (each row's log-sum-exp after the ring, f32 [B, H, L]) and its
    `rank.attention_ring_grad` in the same block reads `kept %out, %lse`
    (the same output conditions), taking the rows' statistics and delta
    from them instead of running the forward's ring again. In a pipeline,
    where the backward runs in a later unit of the forward's stage and the
    forward's output is stashed for it or for a later unit anyway (zero
    bubble's W), the log-sum-exp goes through the stash in a slot of its
    own, and the backward's unit reads the output's slot.
  }];
  let options = [
    Option<"policy", "policy", "std::string", "\"\"",
           "none, selective or full (default: plan.parallel's recompute)">,
    Option<"target", "target", "std::string", "\"host\"",
           "host or cuda: the planrt backend the program links">,
  ];
  let dependentDialects = ["::planc::rank::RankDialect"];
}

def SchedulePipeline : Pass<"plan-schedule-pipeline", "mlir::ModuleOp"> {
  let summary = "Order each pipeline rank's units by the schedule, then verify it";
  let description = [{
    For a `rank.pipeline` without timelines: one `rank.timeline` per
    pipeline rank in the order of its schedule (gpipe, 1f1b,
    interleaved_1f1b or zero_bubble). Then, generated or written by hand,
    the timelines are verified: every unit runs once per microbatch on the
    rank of its stage, stash reads follow their writes, and a simulation of
    all ranks (asynchronous sends, blocking receives matched in order per
    pair of ranks) completes within the schedule's bound on microbatches in
    flight. An error names the rank, the step, the unit and the microbatch;
    a remark gives the simulated bubble.
  }];
  let options = [
    Option<"unitCosts", "unit-costs", "bool", "false",
           "simulate every unit with cost 1 instead of its stage's FLOPs">,
  ];
  let dependentDialects = ["::planc::rank::RankDialect"];
}

def FuseEpilogues : Pass<"plan-fuse-epilogues", "mlir::ModuleOp"> {
  let summary = "cuda: bias, GELU and their gradients in the GEMMs' epilogues, the LM head's loss and gradient in one pass";
  let description = [{
    On the cuda target, `rank.matmul` (not accumulating) into a buffer whose
    only reader is a `rank.bias_add` of a bias as long as the product's last
    dim, of the same element type, in the same block, becomes one
    `rank.matmul_bias` at the bias add's place: cuBLASLt adds the bias in
    the GEMM's epilogue, and the product's buffer and the pass over it go.
    The matmul moves down to the bias add only when every op between them
    writes nothing but buffers allocated between them (a 16-bit plan's
    cast of the bias, typically). A `rank.gelu` (tanh form) that reads the
    result next, with nothing reading it in between, joins as well:
    `rank.matmul_bias_gelu` writes the pre-activation (for the backward)
    and the GELU. In the backward, a matmul whose product only a
    `rank.gelu_grad` reads (as its output gradient) becomes
    `rank.matmul_dgelu` at the gelu_grad's place (the derivative in the
    epilogue, reading the pre-activation), and a `rank.bias_grad` of dy
    with the non-accumulating `rank.matmul` x^T dy (dy not transposed)
    becomes `rank.matmul_bias_grad` at the later one's place (cuBLASLt sums
    dy's rows as it reads them), when the ops between neither write what
    the moved op reads nor touch what it writes. The LM head's `rank.cross_entropy` and
    `rank.cross_entropy_grad` of the same logits (written by a
    non-accumulating `rank.matmul`, read by nothing else but observers)
    become one `rank.cross_entropy_in_place` at the loss's place: the
    gradient is written over the logits, which the GEMM writes in the
    gradient's 16-bit type when that is its operands' type (else the
    gradient already has the logits' type); not for a classifier. On the
    host nothing changes: planrt would run the ops there anyway.
  }];
  let options = [
    Option<"target", "target", "std::string", "\"host\"",
           "host or cuda: the planrt backend the program links">,
  ];
  let dependentDialects = ["::planc::rank::RankDialect"];
}

def PlanMemory : Pass<"plan-memory", "mlir::ModuleOp"> {
  let summary = "Give every buffer and workspace of a step an offset in one arena";
  let description = [{
    Liveness-based memory planning of `@plan_step` and `@plan_forward`:
    every `rank.alloc` (but the pipeline stash) moves to its first use and
    gets an `offset` and a `kind` (activation or gradient), a `rank.dealloc`
    after its last use (for a buffer reduced by `rank.all_reduce_start`,
    after the matching wait), and every op that takes temporaries
    (planrt/workspace.h) a `rank.workspace` ([offset, bytes]). Buffers whose lifetimes
    do not overlap share bytes; a microbatch loop's body and each pipeline
    unit are planned on their own and share one block of the arena. The
    function records `rank.arena_bytes` (the arena each pipeline coordinate
    needs, which the runtime checks against what it measures) and
    `rank.buffer_bytes` (the same buffers without reuse). The workspace of
    an op given bf16/f16 buffers depends on the target: a cuda 16-bit GEMM
    takes no fp32 copies, the host's does.
  }];
  let options = [
    Option<"target", "target", "std::string", "\"host\"",
           "host or cuda: the planrt backend the program links">,
  ];
  let dependentDialects = ["::planc::rank::RankDialect"];
}

def LowerRankToEmitC : Pass<"plan-lower-rank-to-emitc", "mlir::ModuleOp"> {
  let summary = "Lower the rank level to EmitC calls into planrt";
  let description = [{
    Turns declarations into `plan_setup`, the step into `plan_step` and adds
    `main`; each rank op becomes one `emitc.call_opaque` into planrt. The
    size of the result grows with the number of distinct layers, not with
    ranks, steps or microbatches.
  }];
  let dependentDialects = ["::mlir::emitc::EmitCDialect"];
}

#endif
