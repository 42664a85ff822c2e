//===- ShardingRule.h - Sharding rules of plan ops, as data -----*- C++ -*-===//
//
// An op states how its tensors' dimensions relate through *factors* of its
// iteration space, the way OpenXLA Shardy's op sharding rules do: a matmul
// `[i, k] x [k, j] -> [i, j]` has factors i, k and j; k appears in no result,
// so splitting it leaves each rank a summand (the result is partial over the
// axes that split k). One propagation engine reads these rules for every op,
// including the gradient ops autodiff creates; no op has a hand-written case.
//===----------------------------------------------------------------------===//
#ifndef PLANC_DIALECTS_PLAN_SHARDINGRULE_H
#define PLANC_DIALECTS_PLAN_SHARDINGRULE_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>

namespace planc::plan {

struct OpShardingRule {
  struct Factor {
    int64_t size;
    /// The factor must stay whole on every rank (a normalized or softmax
    /// dimension, the sequence of causal attention): operands split along it
    /// are gathered first.
    bool needsReplication = false;
    /// The factor may be split, and the op's lowering exchanges over its
    /// axes what it needs (vocab-parallel cross-entropy): results that lack
    /// the factor are whole over those axes, not pending sums.
    bool exchangedByOp = false;
    /// The sequence of position-dependent ops (attention, rope, position
    /// embeddings): it may be split over the context-parallel mesh axis
    /// only (a split over other axes is gathered first), and the op's
    /// lowering tells its kernel which positions the rank's rows are.
    bool positional = false;
    /// Factors of different groups are dimensions of unrelated tensors (the
    /// gradients sumsq adds up): a mesh axis splits at most one factor per
    /// group, not per op.
    int64_t group = 0;
  };
  /// The mesh axis that splits the sequence for context parallelism.
  static constexpr const char *kContextAxis = "cp";
  /// The mesh axis that splits mixture-of-experts weights by experts.
  static constexpr const char *kExpertAxis = "ep";
  /// A tensor dimension: its factors, major to minor (size-1 factors are
  /// left out; no factor: the dimension is never split), and, when the
  /// dimension is the concatenation of segments that are each split on
  /// their own (packed q/k/v), their global sizes.
  struct Dim {
    llvm::SmallVector<int64_t, 1> factors;
    llvm::SmallVector<int64_t> segments;
  };
  using TensorDims = llvm::SmallVector<Dim>;

  /// Which operands may be pending sums (the op is linear in them):
  ///  - None:  every operand must be whole;
  ///  - Each:  at most one of `linearOperands` may be partial (a product is
  ///           linear in each factor, not in both);
  ///  - Joint: all of `linearOperands` partial alike, or none (a sum).
  enum class Linearity { None, Each, Joint };

  llvm::SmallVector<Factor> factors;
  llvm::SmallVector<TensorDims> operands, results;
  Linearity linearity = Linearity::None;
  llvm::SmallVector<unsigned> linearOperands;

  int64_t addFactor(int64_t size, bool needsReplication = false) {
    factors.push_back({size, needsReplication});
    return (int64_t)factors.size() - 1;
  }
  /// A tensor whose dimension i is factor `fs[i]` (-1: no factor).
  static TensorDims tensor(llvm::ArrayRef<int64_t> fs) {
    TensorDims t;
    for (int64_t f : fs) {
      t.emplace_back();
      if (f >= 0)
        t.back().factors.push_back(f);
    }
    return t;
  }
  void setLinear(Linearity l, llvm::ArrayRef<unsigned> ops) {
    linearity = l;
    linearOperands.assign(ops.begin(), ops.end());
  }
  bool isLinearIn(unsigned operand) const {
    return llvm::is_contained(linearOperands, operand);
  }
};

} // namespace planc::plan

#endif
