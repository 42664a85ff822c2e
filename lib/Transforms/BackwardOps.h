//===- BackwardOps.h - Which ops of a training step are backward --*- C++
//-*-===//
//
// The ops of a step that depend on the loss gradient (or recompute a
// forward for the backward, `plan.recompute`): what plan-recompute clones
// for and what plan-partition-stages splits into the B and W phases.
//===----------------------------------------------------------------------===//
#ifndef PLANC_TRANSFORMS_BACKWARDOPS_H
#define PLANC_TRANSFORMS_BACKWARDOPS_H

#include "dialects/plan/PlanDialect.h"
#include "llvm/ADT/DenseSet.h"

namespace planc {
inline llvm::DenseSet<mlir::Operation *> backwardOps(mlir::Block &body) {
  llvm::DenseSet<mlir::Operation *> backward;
  for (mlir::Operation &op : body.without_terminator())
    if (mlir::isa<plan::CrossEntropyGradOp, plan::MseLossGradOp,
                  plan::MoeAuxGradOp>(op) ||
        op.hasAttr("plan.recompute") ||
        llvm::any_of(op.getOperands(), [&](mlir::Value v) {
          mlir::Operation *d = v.getDefiningOp();
          return d && backward.contains(d);
        }))
      backward.insert(&op);
  return backward;
}
} // namespace planc

#endif
