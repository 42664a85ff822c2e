//===- RankDialect.h - The per-rank planc dialect ---------------*- C++ -*-===//
#ifndef PLANC_DIALECTS_RANK_RANKDIALECT_H
#define PLANC_DIALECTS_RANK_RANKDIALECT_H

#include "dialects/plan/PlanDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/BuiltinOps.h"

#include "dialects/rank/RankDialect.h.inc"

namespace planc::rank {
/// What an op's workspace depends on beyond its operands' shapes.
struct WorkspaceEnv {
  /// The size of a mesh axis by name (1 for an unknown name).
  llvm::function_ref<int64_t(llvm::StringRef)> axisSize;
  /// The program reports a classifier's accuracy (cross_entropy counts it).
  bool classifier = false;
  /// The program is built for cuda (--target=cuda), whose 16-bit GEMMs
  /// take no fp32 copies (planrt/workspace.h native::cuda_matmul).
  bool cuda = false;
};
/// The classes of a classifier trained by `step` (a cross-entropy over class
/// logits with class-id labels, no token input, data not token shards), 0
/// for any other model: the runtime then reports accuracy.
int64_t classifierClasses(mlir::ModuleOp module, mlir::Operation *step);
/// Attaches WorkspaceOpInterface to the ops that take temporaries.
void registerWorkspaceModels(mlir::MLIRContext *ctx);
/// The fp32 copies planrt makes of an op's bf16/f16 buffers while it runs
/// (planrt/workspace.h staging), taken before the op's own temporaries: 0
/// for ops that convert (cast) or move bytes (p2p, stash) themselves, and
/// for ops whose kernels read and write 16-bit buffers as they are
/// (planrt/workspace.h native).
int64_t stagingBytes(mlir::Operation *op, const WorkspaceEnv &env);
} // namespace planc::rank

#include "dialects/rank/RankInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialects/rank/RankOps.h.inc"

namespace planc::rank {
/// The buffer a value views (through rank.view, rank.subview, rank.rows and
/// rank.shard_view), or the value itself.
mlir::Value viewRoot(mlir::Value v);

/// The elements [begin, end) of `root` (viewRoot) a buffer covers: exact
/// through rank.view and rank.subview; the whole root through rank.rows and
/// rank.shard_view, whose block is known at run time.
struct Extent {
  mlir::Value root;
  int64_t begin = 0, end = 0;
  bool overlaps(const Extent &o) const {
    return root == o.root && begin < o.end && o.begin < end;
  }
};
Extent extentOf(mlir::Value v);
} // namespace planc::rank

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
/// On a function planned by plan-memory: the arena bytes each pipeline
/// coordinate uses (one entry without a pipeline), and the bytes of all
/// its planned buffers and workspaces side by side (what the step would take
/// if nothing were reused), per coordinate too.
inline constexpr llvm::StringLiteral kArenaBytesAttr = "rank.arena_bytes";
inline constexpr llvm::StringLiteral kBufferBytesAttr = "rank.buffer_bytes";
/// On a planned function with a pipeline: the bytes of the stash pool each
/// pipeline coordinate needs (the highest byte of the runtime's best-fit
/// allocator on the schedule's stash events, simulated by plan-memory).
inline constexpr llvm::StringLiteral kStashBytesAttr = "rank.stash_bytes";
/// On a planned function: the largest workspace one op takes, per pipeline
/// coordinate.
inline constexpr llvm::StringLiteral kWorkspaceBytesAttr =
    "rank.workspace_bytes";
/// On an op with a workspace: [offset in the arena, bytes].
inline constexpr llvm::StringLiteral kWorkspaceAttr = "rank.workspace";
} // namespace planc::rank

#endif
