//===- Recompute.cpp - Recompute layers' activations in backward ----------===//
//
// With `recompute = full`, the backward of every layer (`plan.layer`, kept by
// autodiff) reads no activation of that layer's forward: right before the
// layer's first backward op, its forward ops are cloned (marked
// `plan.recompute`) from the layer's inputs, and the backward reads the
// clones. What a layer's backward needs from its forward is then only its
// input, so with a pipeline the stash holds one tensor per layer and
// microbatch. The clones are the same ops on the same values, so losses and
// parameters are bit for bit those of `recompute = none`.
//
// `recompute = selective` (Korthikanti et al. 2022: recompute the attention
// core, softmax and score matrix) changes nothing here: plan.attention_grad
// recomputes the probabilities from q, k and v. It is `none` that keeps the
// score matrix, at rank level (plan-keep-attention).
//===----------------------------------------------------------------------===//
#include "BackwardOps.h"
#include "planc/Transforms/Passes.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"

namespace planc {
#define GEN_PASS_DEF_RECOMPUTE
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

namespace {
struct RecomputePass : public planc::impl::RecomputeBase<RecomputePass> {
  using RecomputeBase::RecomputeBase;
  void runOnOperation() override;
};
} // namespace

void RecomputePass::runOnOperation() {
  ModuleOp module = getOperation();
  std::string mode = recomputePolicy(module, policy);
  if (mode != "none" && mode != "selective" && mode != "full") {
    module.emitError() << "unknown recompute policy '" << mode
                       << "'; expected none, selective or full";
    return signalPassFailure();
  }
  if (mode != "full")
    return;
  func::FuncOp step = getTrainStepOrError(module);
  if (!step)
    return signalPassFailure();
  Block &body = step.getBody().front();

  // Backward ops: those that depend on the loss gradient.
  llvm::DenseSet<Operation *> backward = backwardOps(body);

  // Each layer's forward ops, in order.
  std::map<int64_t, SmallVector<Operation *>> forwardOf;
  for (Operation &op : body.without_terminator())
    if (auto l = op.getAttrOfType<IntegerAttr>(kLayerAttr);
        l && !backward.contains(&op))
      forwardOf[l.getInt()].push_back(&op);

  OpBuilder b(module.getContext());
  int64_t recomputed = 0;
  for (auto &[layer, ops] : forwardOf) {
    llvm::DenseSet<Operation *> inLayer(ops.begin(), ops.end());
    // The first op of this layer's backward that reads one of its
    // activations.
    Operation *first = nullptr;
    for (Operation *op : ops)
      for (Operation *user : op->getUsers()) {
        auto l = user->getAttrOfType<IntegerAttr>(kLayerAttr);
        if (backward.contains(user) && l && l.getInt() == layer &&
            (!first || user->isBeforeInBlock(first)))
          first = user;
      }
    if (!first)
      continue;
    b.setInsertionPoint(first);
    IRMapping map;
    for (Operation *op : ops) {
      Operation *clone = b.clone(*op, map);
      clone->setAttr("plan.recompute", b.getUnitAttr());
    }
    // The layer's backward reads the clones; other layers' (the next
    // layer reads this one's output as its input) keep the original.
    auto ofLayer = [&](Operation *user) {
      auto l = user->getAttrOfType<IntegerAttr>(kLayerAttr);
      return backward.contains(user) && l && l.getInt() == layer;
    };
    for (Operation *op : ops)
      for (auto [orig, copy] :
           llvm::zip(op->getResults(), map.lookup(op)->getResults()))
        orig.replaceUsesWithIf(
            copy, [&](OpOperand &use) { return ofLayer(use.getOwner()); });
    ++recomputed;
  }
  // Clones nobody reads (the layer's last residual add, whose gradient
  // needs no activation) are dropped.
  for (Operation &op : llvm::make_early_inc_range(llvm::reverse(body)))
    if (op.hasAttr("plan.recompute") && op.use_empty())
      op.erase();
  (void)recomputed;
}
