//===- Sharding.cpp - Sharding propagation and collective insertion -------===//
#include "planc/Transforms/Passes.h"

namespace planc {
#define GEN_PASS_DEF_PROPAGATESHARDING
#define GEN_PASS_DEF_INSERTCOLLECTIVES
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

static SmallVector<ShardingAttr> operandShardings(Operation *op) {
  SmallVector<ShardingAttr> out;
  for (Value v : op->getOperands())
    out.push_back(getSharding(v));
  return out;
}

/// The functions that are distributed: the training step, and the forward
/// model (lowered too, for generation).
static SmallVector<func::FuncOp> trainSteps(ModuleOp module) {
  SmallVector<func::FuncOp> steps;
  for (auto f : module.getOps<func::FuncOp>())
    if (f->hasAttr(kTrainStepAttr) || f->hasAttr(kModelAttr))
      steps.push_back(f);
  return steps;
}

namespace {
struct PropagateShardingPass
    : public planc::impl::PropagateShardingBase<PropagateShardingPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshOp mesh = getMesh(module);
    if (!mesh) {
      module.emitError() << "expected a plan.mesh op";
      return signalPassFailure();
    }
    auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
    for (func::FuncOp step : trainSteps(module)) {
      // Unannotated arguments are replicated.
      for (BlockArgument arg : step.getArguments())
        if (!getSharding(arg))
          step.setArgAttr(arg.getArgNumber(), kShardingAttr,
                          ShardingAttr::getReplicated(
                              &getContext(), meshRef,
                              cast<RankedTensorType>(arg.getType()).getRank()));
      WalkResult r = step.walk([&](Operation *op) -> WalkResult {
        if (auto ar = dyn_cast<AllReduceOp>(op)) {
          ShardingAttr in = getSharding(ar.getInput());
          SmallVector<Attribute> rest;
          for (Attribute a : in.getPartial())
            if (!llvm::is_contained(ar.getAxes(), a))
              rest.push_back(a);
          setSharding(
              op, ShardingAttr::get(&getContext(), in.getMesh(), in.getDims(),
                                    ArrayAttr::get(&getContext(), rest)));
          return WalkResult::advance();
        }
        auto rule = dyn_cast<ShardingRuleOpInterface>(op);
        if (!rule)
          return WalkResult::advance();
        SmallVector<ShardingAttr> in = operandShardings(op);
        // Operands the op cannot take as pending sums will be reduced
        // first (plan-insert-collectives); the rule sees them whole.
        if (!rule.acceptsPartialOperands(in))
          for (ShardingAttr &s : in)
            s = dropPartial(s);
        FailureOr<SmallVector<ShardingAttr>> out =
            rule.inferResultShardings(in);
        if (failed(out))
          return WalkResult::interrupt();
        setShardings(op, *out);
        return WalkResult::advance();
      });
      if (r.wasInterrupted())
        return signalPassFailure();
    }
  }
};

struct InsertCollectivesPass
    : public planc::impl::InsertCollectivesBase<InsertCollectivesPass> {
  void runOnOperation() override {
    for (func::FuncOp step : trainSteps(getOperation())) {
      // One reduction per partial value, placed right after its definition
      // so that every user that needs it whole shares it.
      DenseMap<Value, Value> reduced;
      auto reduce = [&](Value v) -> Value {
        Value &slot = reduced[v];
        if (slot)
          return slot;
        ShardingAttr s = getSharding(v);
        OpBuilder b(v.getContext());
        if (Operation *def = v.getDefiningOp())
          b.setInsertionPointAfter(def);
        else
          b.setInsertionPointToStart(v.getParentBlock());
        auto ar =
            AllReduceOp::create(b, v.getLoc(), v.getType(), v, s.getPartial());
        setSharding(ar, dropPartial(s));
        return slot = ar.getResult();
      };
      step.walk([&](Operation *op) {
        if (isa<AllReduceOp>(op))
          return;
        SmallVector<ShardingAttr> in = operandShardings(op);
        if (llvm::none_of(in,
                          [](ShardingAttr s) { return s && s.isPartial(); }))
          return;
        auto rule = dyn_cast<ShardingRuleOpInterface>(op);
        if (rule && rule.acceptsPartialOperands(in))
          return;
        for (OpOperand &use : op->getOpOperands())
          if (ShardingAttr s = getSharding(use.get()); s && s.isPartial())
            use.set(reduce(use.get()));
      });
    }
  }
};
} // namespace
