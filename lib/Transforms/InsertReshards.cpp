//===- InsertReshards.cpp - Make every layout change explicit -------------===//
//
// After propagation each op records the axes of its factors; the layout
// each operand must have follows from them (and from which pending sums the
// op passes through). Where a value's layout differs, a `plan.reshard` to the
// needed layout is inserted. A reshard of an intermediate value is shared by
// its uses and placed right after the value is computed (a gradient is
// reduced once, as soon as it is final); a parameter's is placed right
// before each use, so that a ZeRO-3 parameter is gathered just before it is
// needed and its gathered copy dies right after. Sharding constraints have
// done their job once their operand is resharded: they are removed.
//===----------------------------------------------------------------------===//
#include "ShardingAnalysis.h"
#include "planc/Transforms/Passes.h"

#include "llvm/ADT/SetVector.h"

namespace planc {
#define GEN_PASS_DEF_INSERTRESHARDS
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

namespace {
struct InsertReshardsPass
    : public planc::impl::InsertReshardsBase<InsertReshardsPass> {
  void runOnOperation() override;
};
} // namespace

/// The layout each operand of `op` must have (none where anything goes),
/// after checking that the recorded result layouts are what the op computes
/// from the layouts its operands will have: anything else would be a
/// miscompile. One rule, one reading of the factor axes for both.
static LogicalResult requiredShardings(Operation *op,
                                       SmallVectorImpl<ShardingAttr> &out,
                                       ArrayRef<StringRef> sequential,
                                       ShardingCache &cache, RuleCache &rules) {
  MLIRContext *ctx = op->getContext();
  out.assign(op->getNumOperands(), ShardingAttr());
  if (auto c = dyn_cast<ShardingConstraintOp>(op)) {
    out[0] = c.getSharding();
    return success();
  }
  if (auto ret = dyn_cast<func::ReturnOp>(op)) {
    auto f = cast<func::FuncOp>(op->getParentOp());
    // The loss and the gradient norm are reported whole; a parameter goes
    // back as its argument came in.
    SmallVector<BlockArgument> params = updatedArgs(f);
    for (auto [i, v] : llvm::enumerate(ret.getOperands())) {
      ShardingAttr s = getSharding(v);
      if (!s)
        continue;
      out[i] = i < params.size() && params[i]
                   ? getSharding(params[i])
                   : ShardingAttr::getReplicated(ctx, s.getMesh(), s.getRank());
    }
    return success();
  }
  auto ruleOp = dyn_cast<ShardingRuleOpInterface>(op);
  if (!ruleOp)
    return success();
  std::optional<FactorAxes> axes = readFactorAxes(op);
  if (!axes)
    return op->emitError() << "has no " << kFactorAxesAttr
                           << "; run plan-propagate-sharding first";
  const OpShardingRule &rule = rules.get(ruleOp);
  if (axes->size() != rule.factors.size())
    return op->emitError() << kFactorAxesAttr << " lists " << axes->size()
                           << " factors but the op's rule has "
                           << rule.factors.size();
  SmallVector<ShardingAttr> actual;
  for (Value v : op->getOperands())
    actual.push_back(getSharding(v));
  auto passed = acceptedPartials(op, rule, *axes, &rules);
  for (unsigned i = 0; i < op->getNumOperands(); ++i) {
    if (!actual[i])
      return op->emitError() << "operand " << i
                             << " has no sharding; run "
                                "plan-propagate-sharding first";
    out[i] = projectSharding(ctx, actual[i].getMesh(), rule.operands[i], *axes,
                             passed[i], &cache);
  }
  llvm::SmallSetVector<StringRef, 4> through;
  for (auto &p : passed)
    through.insert(p.begin(), p.end());
  for (unsigned i = 0; i < op->getNumResults(); ++i) {
    ShardingAttr want = getSharding(op->getResult(i));
    ShardingAttr got =
        resultSharding(ctx, want ? want.getMesh() : nullptr, rule, i, *axes,
                       through.getArrayRef(), sequential, &cache);
    if (want != got)
      return op->emitError() << "result " << i << " is recorded as " << want
                             << " but the op computes " << got
                             << " from its operands; run "
                                "plan-propagate-sharding again";
  }
  return success();
}

/// Whether two layouts place the same elements on every rank: axes of size
/// 1 split nothing (a batch of 1 "split" over dp = 1 is whole), so a reshard
/// between layouts that differ only in them moves nothing and is not
/// inserted (the reshard op takes f32 only; token inputs are i32).
static bool sameLayout(ShardingAttr a, ShardingAttr b, MeshOp mesh) {
  if (a == b)
    return true;
  if (!mesh || a.getRank() != b.getRank())
    return false;
  // A split over one rank is no split; but a sum over microbatches is an
  // accumulation even over one (see plan-expand-reshards).
  auto real = [&](SmallVector<StringRef> axes, bool sums) {
    llvm::erase_if(axes, [&](StringRef x) {
      return mesh.getAxisSize(x) == 1 && !(sums && mesh.isSequential(x));
    });
    return axes;
  };
  for (int64_t d = 0; d < a.getRank(); ++d) {
    SmallVector<StringRef> ax = real(a.getDimAxes(d), false),
                           bx = real(b.getDimAxes(d), false);
    if (ax != bx)
      return false;
    if (!ax.empty() && a.getDimSegments(d) != b.getDimSegments(d))
      return false;
  }
  return real(a.getPartialAxes(), true) == real(b.getPartialAxes(), true);
}

void InsertReshardsPass::runOnOperation() {
  MeshOp mesh = getMesh(getOperation());
  for (func::FuncOp f : distributedFunctions(getOperation())) {
    DenseMap<std::pair<Value, Attribute>, Value> shared;
    auto reshard = [&](Value v, ShardingAttr to, Operation *user) -> Value {
      OpBuilder b(v.getContext());
      bool isArg = isa<BlockArgument>(v);
      if (!isArg) {
        Value &slot = shared[{v, to}];
        if (slot)
          return slot;
        b.setInsertionPointAfterValue(v);
        auto rs = ReshardOp::create(b, v.getLoc(), v.getType(), v, to);
        setSharding(rs, to);
        return slot = rs.getResult();
      }
      b.setInsertionPoint(user);
      auto rs = ReshardOp::create(b, user->getLoc(), v.getType(), v, to);
      setSharding(rs, to);
      return rs.getResult();
    };
    SmallVector<Operation *> ops;
    f.walk([&](Operation *op) {
      if (!isa<ReshardOp>(op))
        ops.push_back(op);
    });
    // Every op's needs are computed before any use is rewired: what an op
    // accepts depends on the other uses of its operands as they are now.
    SmallVector<SmallVector<ShardingAttr>> needs(ops.size());
    ShardingCache cache;
    RuleCache rules;
    SmallVector<StringRef> sequential = sequentialAxes(getOperation());
    for (auto [op, need] : llvm::zip(ops, needs)) {
      if (failed(requiredShardings(op, need, sequential, cache, rules)))
        return signalPassFailure();
    }
    for (auto [op, need] : llvm::zip(ops, needs)) {
      for (OpOperand &use : op->getOpOperands()) {
        ShardingAttr want = need[use.getOperandNumber()];
        ShardingAttr have = getSharding(use.get());
        if (want && have && !sameLayout(want, have, mesh))
          use.set(reshard(use.get(), want, op));
      }
      if (auto c = dyn_cast<ShardingConstraintOp>(op)) {
        c.getResult().replaceAllUsesWith(c.getInput());
        c.erase();
      }
    }
  }
}
