//===- MixedPrecision.cpp - The model computes on 16-bit copies -----------===//
//
// precision = bf16 | fp16 (Micikevicius et al. 2018; Megatron's bf16): the
// parameters stay fp32 master weights, GEMM operands and activations are
// 16-bit, and the loss is fp32. The pass only retypes the forward model and
// inserts plan.cast; autodiff differentiates the casts (a cast's gradient
// is the cast back, so parameter gradients arrive in fp32) and
// plan-fuse-casts lets the weight-gradient GEMMs write fp32 directly.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Verifier.h"

namespace planc {
#define GEN_PASS_DEF_MIXEDPRECISION
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

namespace {
struct MixedPrecisionPass
    : public planc::impl::MixedPrecisionBase<MixedPrecisionPass> {
  using MixedPrecisionBase::MixedPrecisionBase;
  void runOnOperation() override;
};

bool isF32Float(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && t.getElementType().isF32();
}

bool is16BitFloat(Value v) {
  auto t = dyn_cast<RankedTensorType>(v.getType());
  return t && isa<FloatType>(t.getElementType()) && !t.getElementType().isF32();
}

/// Losses read fp32: their statistics (log-sum-exp, squared errors) and the
/// loss itself are kept in fp32. So do a mixture of experts' routing (the
/// choice and the gates from fp32 router logits, as Megatron-Core and
/// DeepSeek-V3 route) and batch norm (below).
bool readsFp32(Operation *op) {
  return isa<CrossEntropyOp, MseLossOp, MoeTopkOp, MoeGatesOp>(op);
}

} // namespace

void MixedPrecisionPass::runOnOperation() {
  ModuleOp module = getOperation();
  std::string mode = precision;
  if (mode.empty()) {
    mode = "fp32";
    for (auto train : module.getOps<TrainOp>())
      mode = train.getPrecision().str();
  }
  if (mode != "fp32" && mode != "tf32" && mode != "bf16" && mode != "fp16") {
    module.emitError() << "unknown precision '" << mode
                       << "'; expected fp32, tf32, bf16 or fp16";
    return signalPassFailure();
  }
  // tf32 keeps every value in fp32: only the cuda target's GEMMs differ.
  if (mode == "fp32" || mode == "tf32")
    return;
  OpBuilder b(module.getContext());
  Type half = mode == "bf16" ? Type(b.getBF16Type()) : Type(b.getF16Type());

  for (auto model : module.getOps<func::FuncOp>()) {
    if (!model->hasAttr(kModelAttr))
      continue;
    auto kindOf = [&](BlockArgument arg) {
      auto k =
          model.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kKindAttr);
      return k ? k.getValue() : StringRef();
    };
    auto castTo = [&](Operation *user, Value v, Type elt) {
      b.setInsertionPoint(user);
      auto t = cast<RankedTensorType>(v.getType());
      auto c = CastOp::create(b, user->getLoc(), t.clone(elt), v);
      // The cast belongs to its reader's layer (pipeline stages, recompute).
      if (Attribute layer = user->getAttr(kLayerAttr))
        c->setAttr(kLayerAttr, layer);
      return c.getResult();
    };
    for (Operation &op : llvm::make_early_inc_range(
             model.getBody().front().without_terminator())) {
      if (isa<CastOp>(op))
        continue;
      if (readsFp32(&op) || isa<BatchNormOp>(op)) {
        for (OpOperand &use : op.getOpOperands())
          if (is16BitFloat(use.get()))
            use.set(castTo(&op, use.get(), b.getF32Type()));
        // Batch norm runs in fp32 (its running statistics are fp32 state,
        // and gamma must have their type) and hands a 16-bit copy on, as
        // cuDNN's batch norm takes 16-bit activations with fp32 parameters.
        if (isa<BatchNormOp>(op)) {
          b.setInsertionPointAfter(&op);
          Value y = op.getResult(0);
          auto t = cast<RankedTensorType>(y.getType());
          auto c = CastOp::create(b, op.getLoc(), t.clone(half), y);
          if (Attribute layer = op.getAttr(kLayerAttr))
            c->setAttr(kLayerAttr, layer);
          y.replaceAllUsesExcept(c.getResult(), c);
        }
        continue;
      }
      for (OpOperand &use : op.getOpOperands()) {
        auto arg = dyn_cast<BlockArgument>(use.get());
        if (!arg || !isF32Float(arg))
          continue;
        StringRef kind = kindOf(arg);
        if (kind == "input" || kind == "param")
          use.set(castTo(&op, arg, half));
      }
      for (Value r : op.getResults())
        if (isF32Float(r))
          r.setType(cast<RankedTensorType>(r.getType()).clone(half));
    }
    if (failed(mlir::verify(model))) {
      model.emitError() << "the model does not type-check in " << mode
                        << " (plan-mixed-precision)";
      return signalPassFailure();
    }
  }
}
