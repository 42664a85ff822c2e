//===- LossScale.cpp - Dynamic loss scaling for fp16 ----------------------===//
//
// fp16's smallest normal value is 6e-5: many gradients of a step are
// smaller. Scaling the loss gradient by S (2^16 to start) moves the whole
// backward into fp16's range; the parameter gradients are divided by S
// again, in fp32 after their widening, before anything reads them. S itself
// is runtime state (planrt: halved on an overflow, which skips the step,
// doubled after 2000 clean steps), read by plan.loss_scale.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace planc {
#define GEN_PASS_DEF_LOSSSCALE
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

namespace {
struct LossScalePass : public planc::impl::LossScaleBase<LossScalePass> {
  void runOnOperation() override;
};

/// `v` multiplied by the loss scale (or its inverse) right after its
/// definition, replacing every other use of `v`.
void scaleAfterDefinition(Value v, bool inverse) {
  Operation *def = v.getDefiningOp();
  OpBuilder b(def->getContext());
  b.setInsertionPointAfter(def);
  auto s = LossScaleOp::create(b, def->getLoc(), v.getType(), v,
                               inverse ? b.getUnitAttr() : UnitAttr());
  if (Attribute layer = def->getAttr(kLayerAttr))
    s->setAttr(kLayerAttr, layer);
  v.replaceAllUsesExcept(s.getResult(), s);
}

} // namespace

void LossScalePass::runOnOperation() {
  ModuleOp module = getOperation();
  auto trains = module.getOps<TrainOp>();
  if (trains.empty() || (*trains.begin()).getLossScale() != "dynamic")
    return;
  func::FuncOp step = getTrainStepOrError(module);
  if (!step)
    return signalPassFailure();
  SmallVector<Value> lossGrads, paramGrads;
  step.walk([&](Operation *op) {
    if (isa<CrossEntropyGradOp, MseLossGradOp, MoeAuxGradOp>(op))
      lossGrads.push_back(op->getResult(0));
    if (isa<SgdUpdateOp, AdamWUpdateOp>(op)) {
      Value g = op->getOperand(1);
      if (g.getDefiningOp() && !llvm::is_contained(paramGrads, g))
        paramGrads.push_back(g);
    }
  });
  if (lossGrads.empty()) {
    step.emitError() << "loss_scale = dynamic: no loss gradient to scale";
    return signalPassFailure();
  }
  for (Value g : lossGrads)
    scaleAfterDefinition(g, /*inverse=*/false);
  // Each parameter gradient is unscaled whole, once: its sum over
  // microbatches (and a tied weight's terms, from several pipeline stages)
  // comes first (see acceptedPartials), so this runs once per step.
  for (Value g : paramGrads)
    scaleAfterDefinition(g, /*inverse=*/true);
}
