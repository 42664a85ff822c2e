//===- PlanDialect.h - The global planc dialect -----------------*- C++ -*-===//
#ifndef PLANC_DIALECTS_PLAN_PLANDIALECT_H
#define PLANC_DIALECTS_PLAN_PLANDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/ImplicitLocOpBuilder.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "dialects/plan/OneSixteenBitType.h"
#include "dialects/plan/PlanDialect.h.inc"
#include "dialects/plan/ShardingRule.h"

#define GET_ATTRDEF_CLASSES
#include "dialects/plan/PlanAttrs.h.inc"

#include "dialects/plan/PlanInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialects/plan/PlanOps.h.inc"

namespace planc::plan {

/// Names of the discardable attributes planc puts on func arguments and ops.
inline constexpr llvm::StringLiteral kShardingAttr = "plan.sharding";
inline constexpr llvm::StringLiteral kKindAttr =
    "plan.kind"; // input|label|param|state
inline constexpr llvm::StringLiteral kNameAttr = "plan.name";
/// On a padded embedding table: the rows that are exported (the vocabulary).
inline constexpr llvm::StringLiteral kExportRowsAttr = "plan.export_rows";
inline constexpr llvm::StringLiteral kInitAttr = "plan.init";
/// On an argument of kind "state": non-trainable model state (batch norm's
/// running statistics) rather than optimizer state; exported with the
/// parameters and initialized by its plan.init.
inline constexpr llvm::StringLiteral kBufferAttr = "plan.buffer";
inline constexpr llvm::StringLiteral kModelAttr = "plan.model";
inline constexpr llvm::StringLiteral kTrainStepAttr = "plan.train_step";
/// On the train step's results: "loss", "grad_sumsq", or none (a parameter).
inline constexpr llvm::StringLiteral kResultAttr = "plan.result";
/// The repeat instance (layer index) an op belongs to: set by the frontend on
/// a block's ops and kept by autodiff on their gradients.
inline constexpr llvm::StringLiteral kLayerAttr = "plan.layer";
/// Pipeline stage of an op or argument (plan-partition-stages); -1 for what
/// every stage takes part in (a parameter used by several stages, the sum of
/// the stages' gradient norms).
inline constexpr llvm::StringLiteral kStageAttr = "plan.stage";
/// Pipeline phase of an op: "F" (forward), "B" (input gradient), "W"
/// (weight gradient only: a zero-bubble schedule defers it).
inline constexpr llvm::StringLiteral kPhaseAttr = "plan.phase";

/// The sharding recorded for `value` (on its defining op or, for a block
/// argument, on the function argument), or null when none is recorded.
ShardingAttr getSharding(mlir::Value value);
/// Records the sharding of the single result of `op`.
void setSharding(mlir::Operation *op, ShardingAttr sharding);
/// Records one sharding per result of `op`.
void setShardings(mlir::Operation *op, llvm::ArrayRef<ShardingAttr> shardings);

/// The same sharding without pending sums.
ShardingAttr dropPartial(ShardingAttr sharding);

/// Local (per-rank) shape of a tensor of global shape `shape` sharded as
/// `sharding` on `mesh`.
llvm::SmallVector<int64_t> getLocalShape(llvm::ArrayRef<int64_t> shape,
                                         ShardingAttr sharding, MeshOp mesh);

/// The module's mesh (planc programs have exactly one), or null.
/// The recompute policy: `option` when a pass was given one, else the
/// plan's (plan.parallel's `recompute`, "none" without a parallel section).
std::string recomputePolicy(mlir::ModuleOp module, llvm::StringRef option);
MeshOp getMesh(mlir::ModuleOp module);
/// The train step plan-autodiff made (marked plan.train_step), or null
/// after emitting "expected a train step; run plan-autodiff first".
mlir::func::FuncOp getTrainStepOrError(mlir::ModuleOp module);

/// Output size of a convolution or pooling window along one spatial
/// dimension; <= 0 when the window does not fit.
inline int64_t spatialOutSize(int64_t in, int64_t kernel, int64_t stride,
                              int64_t pad, int64_t dilation = 1) {
  int64_t span = dilation * (kernel - 1) + 1;
  if (stride < 1 || in + 2 * pad < span)
    return 0;
  return (in + 2 * pad - span) / stride + 1;
}

/// The verifier of a norm's parameter gradient (plan's and rank's
/// layernorm_grad and rmsnorm_grad): gamma's type, or gamma's shape in f32
/// (plan-fuse-casts).
mlir::LogicalResult verifyNormParamGrad(mlir::Operation *op, mlir::Type gamma,
                                        mlir::Type grad);

} // namespace planc::plan

#endif
