//===- OpFlops.cpp - Floating-point operations of a plan op ---------------===//
#include "OpFlops.h"

#include "dialects/plan/PlanDialect.h"

using namespace mlir;
using namespace planc::plan;

static double elems(Type t) {
  auto r = dyn_cast<RankedTensorType>(t);
  return r ? double(r.getNumElements()) : 0.0;
}

double planc::opFlops(Operation *op) {
  if (auto mm = dyn_cast<MatmulOp>(op)) {
    auto lhs = cast<RankedTensorType>(mm.getLhs().getType());
    // The contracted size: lhs's last dim, or its leading dims when
    // transposed (X^T dY over all rows).
    double k = mm.getTransposeLhs()
                   ? elems(lhs) / lhs.getDimSize(lhs.getRank() - 1)
                   : double(lhs.getDimSize(lhs.getRank() - 1));
    return 2.0 * elems(mm.getResult().getType()) * k;
  }
  if (isa<AttentionOp, AttentionGradOp>(op)) {
    // Scores and the weighted sum, 2 B S S (H D) each (the causal mask is
    // not subtracted); the gradient is twice that. The heads' output is the
    // result of attention and operand 1 (dout) of its gradient.
    Value out = isa<AttentionOp>(op) ? op->getResult(0) : op->getOperand(1);
    auto t = cast<RankedTensorType>(out.getType());
    double s = t.getRank() >= 2 ? double(t.getDimSize(1)) : 1.0;
    double f = 4.0 * elems(t) * s;
    return isa<AttentionGradOp>(op) ? 2.0 * f : f;
  }
  if (isa<Conv2dOp, Conv2dGradOp>(op)) {
    // 2 flops per multiply-add: each output element of the convolution sums
    // C / groups * KH * KW products; the gradient does that twice (input
    // and filter).
    auto w = cast<RankedTensorType>(op->getOperand(1).getType());
    Value out = isa<Conv2dOp>(op) ? op->getResult(0) : op->getOperand(2);
    double f = 2.0 * elems(out.getType()) * double(w.getDimSize(1)) *
               double(w.getDimSize(2) * w.getDimSize(3));
    return isa<Conv2dGradOp>(op) ? 2.0 * f : f;
  }
  if (isa<MoeExpertsOp, MoeExpertsGradOp>(op)) {
    // Each routed row (token x top_k) goes through one expert's MLP: 2 flops
    // per multiply-add over the up (and gate) and down weights. The gradient
    // is twice that (model FLOPs: its recomputation of the forward is not
    // counted, as attention_grad's is not).
    auto ids = cast<RankedTensorType>(op->getOperand(1).getType());
    auto up = cast<RankedTensorType>(
        op->getOperand(isa<MoeExpertsOp>(op) ? 3 : 4).getType());
    auto down = cast<RankedTensorType>(
        op->getOperand(isa<MoeExpertsOp>(op) ? 4 : 5).getType());
    bool gated = op->getNumOperands() > (isa<MoeExpertsOp>(op) ? 5u : 6u);
    double perRow =
        double(up.getDimSize(1) * up.getDimSize(2)) * (gated ? 2.0 : 1.0) +
        double(down.getDimSize(1) * down.getDimSize(2));
    double f = 2.0 * elems(ids) * perRow;
    return isa<MoeExpertsGradOp>(op) ? 2.0 * f : f;
  }
  if (auto p = dyn_cast<Pool2dOp>(op))
    return elems(p.getResult().getType()) *
           double(p.getKernel()[0] * p.getKernel()[1]);
  if (auto p = dyn_cast<Pool2dGradOp>(op))
    return elems(p.getGrad().getType()) *
           double(p.getKernel()[0] * p.getKernel()[1]);
  if (isa<ReshapeOp, AllReduceOp, AllGatherOp, ReduceScatterOp, AllSliceOp,
          AllToAllOp>(op))
    return 0.0;
  double n = 0;
  for (Type t : op->getResultTypes())
    n += elems(t);
  return n;
}
