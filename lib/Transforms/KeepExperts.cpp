//===- KeepExperts.cpp - recompute = none keeps the experts' activations --===//
//
// A mixture of experts' backward needs its forward's grouping of the routed
// rows, their inputs, the hidden pre-activations and the experts' outputs.
// By default (`selective`, `full`) rank.moe_experts(_swiglu)_grad recomputes
// them from the layer's input: the forward's GEMMs again, a third of the
// experts' backward work. With `recompute = none`, as plan-keep-attention
// does for attention's scores, the forward writes them to a buffer that
// lives until its backward (`rank.moe_experts(_swiglu)_keep`), and the
// backward reads them (`..._grad_kept`). The kept values are those the
// recomputation makes, so the policies give the same bits. A pipeline's
// forward and backward of a layer run in different units (they would need
// the stash): there, `none` recomputes like `selective`.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "planrt/workspace.h"

namespace planc {
#define GEN_PASS_DEF_KEEPEXPERTS
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;

namespace {
struct KeepExpertsPass : public planc::impl::KeepExpertsBase<KeepExpertsPass> {
  using KeepExpertsBase::KeepExpertsBase;
  void runOnOperation() override;
};

/// The backward of `fwd` in its block: the gradient op of the same choices
/// and weights after it.
template <class Grad> Grad backwardOf(Operation *fwd, Value experts) {
  Grad bwd;
  for (Operation *user : experts.getUsers())
    if (auto g = dyn_cast<Grad>(user);
        g && g->getBlock() == fwd->getBlock() && fwd->isBeforeInBlock(g) &&
        g.getInput() == fwd->getOperand(0) &&
        g.getGates() == fwd->getOperand(2) &&
        g.getUp() == fwd->getOperand(fwd->getNumOperands() - 3) &&
        g.getDown() == fwd->getOperand(fwd->getNumOperands() - 2))
      bwd = g;
  return bwd;
}

/// The kept buffer for `fwd`'s sizes.
Value keptBuffer(OpBuilder &b, Operation *fwd, Value experts, Value up,
                 Value down, bool gated) {
  auto e = cast<MemRefType>(experts.getType());
  auto u = cast<MemRefType>(up.getType());
  auto dn = cast<MemRefType>(down.getType());
  int64_t floats = planrt::workspace::moe_kept_floats(
      e.getNumElements(), u.getDimSize(0), u.getDimSize(1), u.getDimSize(2),
      dn.getDimSize(2), gated);
  auto alloc = rk::AllocOp::create(b, fwd->getLoc(),
                                   MemRefType::get({floats}, b.getF32Type()));
  if (auto st = fwd->getAttr(rk::kRankStageAttr))
    alloc->setAttr(rk::kRankStageAttr, st);
  return alloc;
}
} // namespace

void KeepExpertsPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (plan::recomputePolicy(module, policy) != "none")
    return;
  auto step = module.lookupSymbol<func::FuncOp>("plan_step");
  if (!step)
    return;
  SmallVector<Operation *> forwards;
  step.walk([&](Operation *op) {
    if (isa<rk::MoeExpertsOp, rk::MoeExpertsSwigluOp>(op))
      forwards.push_back(op);
  });
  for (Operation *op : forwards) {
    OpBuilder b(op);
    if (auto fwd = dyn_cast<rk::MoeExpertsOp>(op)) {
      auto bwd = backwardOf<rk::MoeExpertsGradOp>(op, fwd.getExperts());
      if (!bwd)
        continue;
      Value kept = keptBuffer(b, op, fwd.getExperts(), fwd.getUp(),
                              fwd.getDown(), false);
      auto k = rk::MoeExpertsKeepOp::create(
          b, fwd.getLoc(), fwd.getInput(), fwd.getExperts(), fwd.getGates(),
          fwd.getUp(), fwd.getDown(), fwd.getOut(), kept,
          fwd.getExpertAxisAttr());
      k->setDiscardableAttrs(fwd->getDiscardableAttrDictionary());
      b.setInsertionPoint(bwd);
      auto g = rk::MoeExpertsGradKeptOp::create(
          b, bwd.getLoc(), bwd.getExperts(), bwd.getGates(), bwd.getGrad(),
          bwd.getUp(), bwd.getDown(), kept, bwd.getInputGrad(),
          bwd.getGatesGrad(), bwd.getUpGrad(), bwd.getDownGrad(),
          bwd.getExpertAxisAttr());
      g->setDiscardableAttrs(bwd->getDiscardableAttrDictionary());
      fwd.erase();
      bwd.erase();
      continue;
    }
    auto fwd = cast<rk::MoeExpertsSwigluOp>(op);
    auto bwd = backwardOf<rk::MoeExpertsSwigluGradOp>(op, fwd.getExperts());
    if (!bwd || bwd.getGate() != fwd.getGate())
      continue;
    Value kept =
        keptBuffer(b, op, fwd.getExperts(), fwd.getUp(), fwd.getDown(), true);
    auto k = rk::MoeExpertsSwigluKeepOp::create(
        b, fwd.getLoc(), fwd.getInput(), fwd.getExperts(), fwd.getGates(),
        fwd.getGate(), fwd.getUp(), fwd.getDown(), fwd.getOut(), kept,
        fwd.getExpertAxisAttr());
    k->setDiscardableAttrs(fwd->getDiscardableAttrDictionary());
    b.setInsertionPoint(bwd);
    auto g = rk::MoeExpertsSwigluGradKeptOp::create(
        b, bwd.getLoc(), bwd.getExperts(), bwd.getGates(), bwd.getGrad(),
        bwd.getGate(), bwd.getUp(), bwd.getDown(), kept, bwd.getInputGrad(),
        bwd.getGatesGrad(), bwd.getGateGrad(), bwd.getUpGrad(),
        bwd.getDownGrad(), bwd.getExpertAxisAttr());
    g->setDiscardableAttrs(bwd->getDiscardableAttrDictionary());
    fwd.erase();
    bwd.erase();
  }
}
