//===- Passes.td - planc's pass pipeline ----------------------------------===//
#ifndef PLANC_TRANSFORMS_PASSES_TD
#define PLANC_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

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

def PropagateSharding : Pass<"plan-propagate-sharding", "mlir::ModuleOp"> {
  let summary = "Give every value of the training step a sharding";
  let description = [{
    Starting from the shardings on the step's arguments (inputs split over
    the data-parallel axis, parameters replicated, unless annotated
    otherwise), applies each op's ShardingRuleOpInterface rule in program
    order and records the result as `plan.sharding`. Operands that the op
    cannot consume as pending sums are treated as if reduced first; the
    collective-insertion pass makes that explicit.
  }];
  let dependentDialects = ["::planc::plan::PlanDialect"];
}

def InsertCollectives : Pass<"plan-insert-collectives", "mlir::ModuleOp"> {
  let summary = "Insert all-reduces where pending sums must be resolved";
  let description = [{
    Wherever a value that is `partial` over some mesh axes (for example a
    data-parallel weight gradient, or the loss) is used by an op that needs
    it whole (an optimizer update, a nonlinearity, the step's results),
    inserts one `plan.all_reduce` over those axes. Sums of partial values
    stay partial, so gradients that are accumulated are reduced once.
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
  }];
  let dependentDialects = ["::planc::rank::RankDialect",
                           "::mlir::memref::MemRefDialect"];
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
