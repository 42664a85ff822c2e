//===- Rematerialize.cpp - Rebuild cheap forward values in backward -------===//
//
// What the backward reads from the forward stays alive from one to the other
// (with a pipeline, once per microbatch in flight). Two kinds of forward
// values cost far less to rebuild than to keep:
//  - a gathered activation: a reshard that only undoes splits (sequence
//    parallelism's all-gather of a norm's output before a column-parallel
//    matmul, whose weight gradient reads it again) keeps 1/n of the bytes if
//    the shard is kept and gathered again, as Megatron-LM does;
//  - a 16-bit copy of a parameter (a cast of an argument, possibly gathered
//    by ZeRO-3 after it): the fp32 parameter is alive anyway, so the copy is
//    cast (and gathered) again. Not with microbatches: there the copy is
//    made once per step for every microbatch, and identical copies (the
//    forward's, and recompute = full's for the backward) become one.
// Each such op is cloned (`plan.recompute`, so later passes treat it as
// backward) right before its first backward user, which reads the clone.
// Not the gathers of a mixture of experts' operands (expert parallelism)
// with recompute = none outside a pipeline: there the experts' forward
// keeps its grouped rows for the backward (plan-keep-experts, which needs
// the backward to read the forward's very operands), so gathering them
// again would only add collectives and a recomputed forward.
// Clones are the same ops on the same values: the bits do not change.
// Recompute = full needs none of this inside a layer (the layer's backward
// reads plan-recompute's clones), but it still applies at the layers' edges.
//===----------------------------------------------------------------------===//
#include "BackwardOps.h"
#include "ShardingAnalysis.h"
#include "planc/Transforms/Passes.h"

namespace planc {
#define GEN_PASS_DEF_REMATERIALIZE
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

namespace {
struct RematerializePass
    : public planc::impl::RematerializeBase<RematerializePass> {
  void runOnOperation() override;
};
} // namespace

/// Whether a reshard only gathers: no pending sums, and every dimension keeps
/// a prefix of its axes, with at least one real (size > 1) axis dropped.
static bool onlyGathers(ReshardOp rs, MeshOp mesh) {
  ShardingAttr from = getSharding(rs.getInput()), to = rs.getSharding();
  if (!from || !mesh || from.getRank() != to.getRank() ||
      !from.getPartialAxes().empty() || !to.getPartialAxes().empty())
    return false;
  bool drops = false;
  for (int64_t d = 0; d < from.getRank(); ++d) {
    SmallVector<StringRef> have = from.getDimAxes(d), want = to.getDimAxes(d);
    if (want.size() > have.size() ||
        !llvm::equal(ArrayRef(have).take_front(want.size()), want))
      return false;
    if (want.size() < have.size() && !from.getDimSegments(d).empty())
      return false; // segments would move one by one
    for (StringRef a : ArrayRef(have).drop_front(want.size()))
      drops |= mesh.getAxisSize(a) > 1;
  }
  return drops;
}

void RematerializePass::runOnOperation() {
  ModuleOp module = getOperation();
  func::FuncOp step;
  for (auto f : module.getOps<func::FuncOp>())
    if (f->hasAttr(kTrainStepAttr))
      step = f;
  if (!step)
    return;
  MeshOp mesh = getMesh(module);
  bool microbatched =
      mesh && mesh.getAxisIndex("mb") >= 0 && mesh.getAxisSize("mb") > 1;
  Block &body = step.getBody().front();

  // With microbatches, a parameter's copy is made once per step, outside
  // the microbatch loop or pipeline units, and serves every microbatch's
  // forward and backward (as Megatron-LM keeps its fp16 weights): it is not
  // cast again, and two identical copies of one layer (the forward's and
  // the one recompute = full made for the backward), which would both live
  // through the step, become the first. Only within a layer: copies for
  // different layers or stages (a tied embedding's) stay where their users are.
  if (microbatched) {
    DenseMap<std::tuple<Value, Type, Attribute, Attribute>, Value> first;
    for (Operation &op :
         llvm::make_early_inc_range(body.without_terminator())) {
      auto c = dyn_cast<CastOp>(op);
      Attribute layer = op.getAttr(kLayerAttr);
      if (!c || !layer || !isa<BlockArgument>(c->getOperand(0)))
        continue;
      auto [it, fresh] = first.try_emplace(
          {c->getOperand(0), c.getType(), getSharding(c.getResult()), layer},
          c.getResult());
      if (fresh)
        continue;
      c.getResult().replaceAllUsesWith(it->second);
      c->erase();
    }
  }

  llvm::DenseSet<Operation *> backward = backwardOps(body);
  // ZeRO 1 and 2 split a parameter only as fp32 master weights (its 16-bit
  // copy is gathered once per step and serves forward and backward, as
  // Megatron-LM keeps its 16-bit weights whole): gathering it again would
  // add a collective per parameter and save nothing at the step's peak.
  int64_t zeroStage = 0;
  for (auto par : module.getOps<ParallelOp>())
    zeroStage = par.getZeroStage();
  auto gathersMaster = [&](ReshardOp rs) {
    return (zeroStage == 1 || zeroStage == 2) &&
           isParamCopy(rs.getInput(), step);
  };
  bool keepsExperts =
      plan::recomputePolicy(module, "") == "none" &&
      !(mesh && mesh.getAxisIndex("pp") >= 0 && mesh.getAxisSize("pp") > 1);

  // Rebuildable forward ops: gathers of anything, and casts of arguments or
  // of rebuildable ops (a parameter's copy after its ZeRO-3 gather).
  llvm::DenseSet<Operation *> rebuildable;
  SmallVector<Operation *> order;
  for (Operation &op : body.without_terminator()) {
    if (backward.contains(&op))
      continue;
    bool ok = false;
    if (auto rs = dyn_cast<ReshardOp>(op))
      ok = onlyGathers(rs, mesh) && !gathersMaster(rs) &&
           !(keepsExperts && llvm::any_of(op.getUsers(), [](Operation *u) {
               return isa<MoeExpertsGradOp>(u);
             }));
    else if (auto c = dyn_cast<CastOp>(op); c && !microbatched) {
      Value in = c->getOperand(0);
      ok = isa<BlockArgument>(in) || rebuildable.contains(in.getDefiningOp());
    }
    if (ok) {
      rebuildable.insert(&op);
      order.push_back(&op);
    }
  }

  // Last first, so that a cast's clone then counts as a backward user of the
  // gather (or cast) it reads, which is cloned in turn.
  OpBuilder b(module.getContext());
  for (Operation *op : llvm::reverse(order)) {
    Operation *first = nullptr;
    for (Operation *user : op->getUsers())
      if (backward.contains(user) && (!first || user->isBeforeInBlock(first)))
        first = user;
    if (!first)
      continue;
    b.setInsertionPoint(first);
    Operation *clone = b.clone(*op);
    clone->setAttr("plan.recompute", b.getUnitAttr());
    backward.insert(clone);
    op->getResult(0).replaceUsesWithIf(clone->getResult(0), [&](OpOperand &u) {
      return backward.contains(u.getOwner());
    });
    if (op->use_empty())
      op->erase();
  }
}
