//===- ShardingAnalysis.h - Factor shardings of the passes -*- C++ -*-===//
//
// What plan-propagate-sharding decides per op is the mesh axes of each
// factor of its sharding rule, recorded as `plan.factor_axes`. From that,
// plan-insert-reshards derives the layout each operand must have, and the
// layout each result gets, with the functions below.
//===----------------------------------------------------------------------===//
#ifndef PLANC_LIB_TRANSFORMS_SHARDINGANALYSIS_H
#define PLANC_LIB_TRANSFORMS_SHARDINGANALYSIS_H

#include "dialects/plan/PlanDialect.h"
#include "llvm/ADT/StringMap.h"

#include <deque>

namespace planc::plan {

inline constexpr llvm::StringLiteral kFactorAxesAttr = "plan.factor_axes";
/// On sharded arguments: "user", "policy", "data" or "zero" (how strongly
/// the layout holds against others; see docs/design.md).
inline constexpr llvm::StringLiteral kShardingOriginAttr =
    "plan.sharding_origin";

/// How one factor is split: its mesh axes and, when it is carried by a
/// packed dimension that the op does not itself interpret (a matmul's
/// output features that are q/k/v), that dimension's segments.
struct FactorSharding {
  llvm::SmallVector<llvm::StringRef, 2> axes;
  llvm::SmallVector<int64_t> segments;
};
using FactorAxes = llvm::SmallVector<FactorSharding>;

/// Whether `v` is a parameter's copy: a plan.cast of an argument of `f`
/// whose kind is "param" (plan-mixed-precision's 16-bit copies).
bool isParamCopy(mlir::Value v, mlir::func::FuncOp f);

/// The factor axes recorded on `op`, or none when it has no record.
std::optional<FactorAxes> readFactorAxes(mlir::Operation *op);
/// Records `axes` on `op`. `cache` (optional) makes each distinct record's
/// attribute once: a step's million ops have a few dozen.
void writeFactorAxes(mlir::Operation *op, const FactorAxes &axes,
                     llvm::StringMap<mlir::ArrayAttr> *cache = nullptr);

/// Sharding rules built once per kind of op. A rule depends only on the
/// op's name, properties, types and discardable attributes
/// (dialects/plan/ShardingRules.cpp), never on `plan.layer`, so the ops of
/// repeated layers share one: a 10000-layer GPT has a handful of kinds of
/// op and a million ops. Rules found here stay valid while the cache lives;
/// the ops it was asked about must outlive it (their properties are
/// compared with later ops').
class RuleCache {
public:
  const OpShardingRule &get(ShardingRuleOpInterface r);

private:
  struct Entry {
    mlir::Operation *op; // the first op with this key: its properties
    const OpShardingRule *rule;
  };
  // Deques: rules and keys do not move as they grow (SmallVector's move
  // may throw, so a vector would copy every rule on each reallocation).
  std::deque<OpShardingRule> rules;
  std::deque<llvm::SmallVector<const void *, 16>> keys;
  llvm::DenseMap<llvm::ArrayRef<const void *>, llvm::SmallVector<Entry, 1>>
      index;
};

/// Layouts made by projectSharding, by what they describe (within one pass
/// and context): a pass makes the same few layouts for millions of values,
/// and each made anew is a dozen uniqued attributes.
using ShardingCache = llvm::StringMap<ShardingAttr>;

/// The layout of a tensor with dimensions `dims` under `factors`: each
/// dimension is split over the axes of its major factor (with the segments
/// the rule gives the dimension, else the factor's), and pending over
/// `partial`.
ShardingAttr projectSharding(mlir::MLIRContext *ctx,
                             mlir::FlatSymbolRefAttr mesh,
                             const OpShardingRule::TensorDims &dims,
                             const FactorAxes &factors,
                             llvm::ArrayRef<llvm::StringRef> partial,
                             ShardingCache *cache = nullptr);

/// The operands' shardings as `op` (with factor axes `factors`) may take
/// them: a pending sum that some use of the value needs whole is resolved
/// once for every use, so it counts as whole here.
/// `rules` (optional) builds the users' rules once per kind.
llvm::SmallVector<ShardingAttr>
effectiveOperandShardings(mlir::Operation *op, const FactorAxes &factors,
                          RuleCache *rules = nullptr);

/// The pending sums among the operands of `op` that it passes through to
/// its results, per operand (empty: that operand must be whole). A pending
/// sum passes only where the op is linear in it, where it would not use an
/// axis twice (one that also splits a factor), and where every other use of
/// the value takes it pending too: a value that one use needs whole is
/// reduced once, for all of them.
llvm::SmallVector<llvm::SmallVector<llvm::StringRef>>
acceptedPartials(mlir::Operation *op, const OpShardingRule &rule,
                 const FactorAxes &factors, RuleCache *rules = nullptr);

/// The sharding of result `i`: its factors' axes, pending over the axes of
/// factors that the operands have and it lacks, and over `passed` (the
/// accepted partials). A factor the op exchanges itself is exchanged over
/// mesh axes only: over the `sequential` ones (microbatches, visited one
/// after another) the result is still a sum.
ShardingAttr resultSharding(mlir::MLIRContext *ctx,
                            mlir::FlatSymbolRefAttr mesh,
                            const OpShardingRule &rule, unsigned i,
                            const FactorAxes &factors,
                            llvm::ArrayRef<llvm::StringRef> passed,
                            llvm::ArrayRef<llvm::StringRef> sequential,
                            ShardingCache *cache = nullptr);
/// The sequential axes of `op`'s module's mesh.
llvm::SmallVector<llvm::StringRef> sequentialAxes(mlir::Operation *op);

/// For each result of the train step `f` that is an updated parameter (no
/// `plan.result` role) or optimizer state (role "state"), the argument it
/// updates, in argument order; null elsewhere.
llvm::SmallVector<mlir::BlockArgument> updatedArgs(mlir::func::FuncOp f);

/// The functions that are distributed: the training step, and the forward
/// model (lowered too, for generation), the step first.
llvm::SmallVector<mlir::func::FuncOp> distributedFunctions(mlir::ModuleOp m);

} // namespace planc::plan

#endif
