//===- FuseCasts.cpp - A sum writes the type its only reader wants --------===//
//
// planrt's matmul and its gradient sums (embedding_grad, bias_grad,
// pos_embedding_grad, a norm's parameter gradients) accumulate in fp32 and
// round only when they store a 16-bit result, so such a result widened by its
// only user is the fp32 result rounded once for nothing. With mixed precision
// this is where every weight gradient comes from (autodiff's cast back to the
// fp32 master weight) and where the logits meet the fp32 loss. Likewise the
// cross-entropy gradient, narrowed to bf16 by its only user, writes bf16.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace planc {
#define GEN_PASS_DEF_FUSECASTS
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

namespace {
struct FuseCastsPass : public planc::impl::FuseCastsBase<FuseCastsPass> {
  void runOnOperation() override;
};
} // namespace

/// fp16: the gradients of a parameter's uses are summed in fp16 and widened
/// once, as a 16-bit .grad accumulates them in Megatron's fp16 training, so
/// the sum over ranks runs once per parameter. Without a pipeline only: a
/// parameter shared by two pipeline stages (a tied embedding) has its
/// stages' terms reduced where the stages meet.
static void sumF16GradsBeforeWidening(ModuleOp module) {
  plan::MeshOp mesh = plan::getMesh(module);
  if (mesh && mesh.getAxisSize("pp") > 1)
    return;
  SmallVector<AddOp> adds;
  module.walk([&](AddOp add) {
    auto fn = add->getParentOfType<func::FuncOp>();
    auto l = add.getLhs().getDefiningOp<CastOp>();
    auto r = add.getRhs().getDefiningOp<CastOp>();
    if (fn && fn->hasAttr(kTrainStepAttr) && l && r && l->hasOneUse() &&
        r->hasOneUse() && l != r &&
        l.getInput().getType() == r.getInput().getType() &&
        l.getInput().getType().getElementType().isF16())
      adds.push_back(add);
  });
  for (AddOp add : adds) {
    auto l = add.getLhs().getDefiningOp<CastOp>();
    auto r = add.getRhs().getDefiningOp<CastOp>();
    OpBuilder b(add);
    Value sum = AddOp::create(b, add.getLoc(), l.getInput().getType(),
                              l.getInput(), r.getInput());
    add.getResult().replaceAllUsesWith(
        CastOp::create(b, add.getLoc(), add.getType(), sum).getResult());
    add.erase();
    l.erase();
    r.erase();
  }
}

void FuseCastsPass::runOnOperation() {
  ModuleOp module = getOperation();
  sumF16GradsBeforeWidening(module);
  // On a pipeline, a tied parameter's terms come from different stages and
  // are summed over pp in fp32 (plan-lower-to-rank), so fp16 gradients are
  // widened first and summed in fp32 there, like bf16 ones.
  plan::MeshOp mesh = plan::getMesh(module);
  bool wideSums = mesh && mesh.getAxisSize("pp") > 1;
  if (wideSums)
    module.walk([&](CastOp c) {
      auto fn = c->getParentOfType<func::FuncOp>();
      if (fn && fn->hasAttr(kTrainStepAttr) &&
          c.getInput().getType().getElementType().isF16() &&
          c.getType().getElementType().isF32())
        c->setAttr("plan.sum_wide", UnitAttr::get(c.getContext()));
    });
  SmallVector<CastOp> casts;
  getOperation().walk([&](CastOp c) {
    auto fn = c->getParentOfType<func::FuncOp>();
    if (!fn || !fn->hasAttr(kTrainStepAttr))
      return;
    Operation *src = c.getInput().getDefiningOp();
    // fp16 gradients are summed in fp16 (the cast's sharding rule), but on
    // pipelines.
    Type from = c.getInput().getType().getElementType();
    if (isa_and_nonnull<MatmulOp, EmbeddingGradOp, BiasGradOp,
                        PosEmbeddingGradOp>(src) &&
        src->hasOneUse() && (from.isBF16() || (from.isF16() && wideSums)) &&
        c.getType().getElementType().isF32())
      casts.push_back(c);
  });
  // The loss gradient narrowed to bf16 for the backward GEMMs: the
  // cross-entropy gradient writes bf16 itself (fp32 math, rounded once), so
  // no fp32 copy of the logits' size is kept. (fp16 keeps its fp32 loss
  // gradient: plan-loss-scale scales it before it is narrowed.)
  getOperation().walk([&](CastOp c) {
    auto fn = c->getParentOfType<func::FuncOp>();
    auto src = c.getInput().getDefiningOp<CrossEntropyGradOp>();
    if (fn && fn->hasAttr(kTrainStepAttr) && src && src->hasOneUse() &&
        c.getInput().getType().getElementType().isF32() &&
        c.getType().getElementType().isBF16())
      casts.push_back(c);
  });
  // A norm's parameter gradients (sums over rows, like bias_grad's), both
  // widened by their only users: written in f32 (PyTorch's autocast runs
  // the norms in fp32 too).
  getOperation().walk([&](Operation *op) {
    auto fn = op->getParentOfType<func::FuncOp>();
    if (!isa<LayerNormGradOp, RmsNormGradOp>(op) || !fn ||
        !fn->hasAttr(kTrainStepAttr))
      return;
    SmallVector<CastOp> widen;
    for (Value g : op->getResults().drop_front()) {
      Type from = cast<ShapedType>(g.getType()).getElementType();
      CastOp c =
          g.hasOneUse() ? dyn_cast<CastOp>(*g.getUsers().begin()) : CastOp();
      if (!c || !(from.isBF16() || (from.isF16() && wideSums)) ||
          !c.getType().getElementType().isF32())
        return;
      widen.push_back(c);
    }
    append_range(casts, widen);
  });
  for (CastOp c : casts) {
    Value src = c.getInput();
    src.setType(c.getType());
    c.getResult().replaceAllUsesWith(src);
    c.erase();
  }
}
