//===- RankDialect.h - The per-rank planc dialect ---------------*- C++ -*-===//
#ifndef PLANC_DIALECTS_RANK_RANKDIALECT_H
#define PLANC_DIALECTS_RANK_RANKDIALECT_H

#include "dialects/plan/PlanDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

#include "dialects/rank/RankDialect.h.inc"
#include "dialects/rank/RankInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialects/rank/RankOps.h.inc"

namespace planc::rank {
/// On @plan_step: the bytes of parameters, gradients and optimizer state
/// this rank holds (local shapes), which the runtime checks against what it
/// allocates.
inline constexpr llvm::StringLiteral kExpectedBytesAttr = "rank.expected_bytes";
/// On the rank-level step: the model FLOPs of one training step per rank
/// (f64): the FLOPs of the plan-level step's ops on global shapes (OpFlops)
/// divided by the number of ranks. plan_setup passes it to set_step_flops.
inline constexpr llvm::StringLiteral kStepFlopsAttr = "rank.step_flops";
/// Pipeline stage of a declaration, an allocation or an op outside the
/// pipeline's units: only the ranks that hold the stage run or allocate it.
inline constexpr llvm::StringLiteral kRankStageAttr = "rank.stage";
} // namespace planc::rank

#endif
