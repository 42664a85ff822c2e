//===- ExpandReshards.cpp - Each reshard as its cheapest collectives ------===//
//
// A reshard from layout A to layout B becomes, in this order:
//  1. pending sums that B no longer has: over an axis that B splits a
//     dimension with (and A does not), a reduce-scatter on that dimension
//     (half the traffic of an all-reduce, and the result is already split);
//     over the others, one all-reduce;
//  2. splits that B does not have, innermost axis first: an all-to-all when
//     B splits another dimension with that axis next, else an all-gather;
//  3. splits that B adds: a local slice (every rank already holds the data).
// Each op names its mesh axis and records the layout after it.
//===----------------------------------------------------------------------===//
#include "ShardingAnalysis.h"
#include "planc/Transforms/Passes.h"

#include "llvm/ADT/SetVector.h"

namespace planc {
#define GEN_PASS_DEF_EXPANDRESHARDS
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

namespace {
/// A layout being transformed step by step.
struct Layout {
  SmallVector<SmallVector<StringRef>> dims;
  SmallVector<SmallVector<int64_t>> segments;
  llvm::SmallSetVector<StringRef, 4> partial;

  explicit Layout(ShardingAttr s) {
    for (int64_t d = 0; d < s.getRank(); ++d) {
      dims.push_back(s.getDimAxes(d));
      ArrayRef<int64_t> seg = s.getDimSegments(d);
      segments.emplace_back(seg.begin(), seg.end());
    }
    for (StringRef a : s.getPartialAxes())
      partial.insert(a);
  }
  ShardingAttr get(MLIRContext *ctx, FlatSymbolRefAttr mesh) const {
    Builder b(ctx);
    SmallVector<Attribute> d, seg;
    bool any = false;
    for (auto [axes, s] : llvm::zip(dims, segments)) {
      d.push_back(b.getStrArrayAttr(axes));
      bool keep = !axes.empty() && !s.empty();
      any |= keep;
      seg.push_back(DenseI64ArrayAttr::get(ctx, keep ? ArrayRef(s)
                                                     : ArrayRef<int64_t>()));
    }
    if (!any)
      seg.clear();
    return ShardingAttr::get(ctx, mesh, b.getArrayAttr(d),
                             b.getStrArrayAttr(partial.getArrayRef()),
                             b.getArrayAttr(seg));
  }
  /// Whether dims[d] followed by `a` starts `want`.
  bool extendsTo(int64_t d, StringRef a, ArrayRef<StringRef> want) const {
    ArrayRef<StringRef> have = dims[d];
    return want.size() > have.size() && want.take_front(have.size()) == have &&
           want[have.size()] == a;
  }
};

struct ExpandReshardsPass
    : public planc::impl::ExpandReshardsBase<ExpandReshardsPass> {
  void runOnOperation() override;
};
} // namespace

/// Whether `v` only feeds the optimizer: the update and the norm,
/// through widening casts and the inverse loss scale.
static bool onlyForTheUpdate(Value v, int depth = 0) {
  return depth < 4 && llvm::all_of(v.getUsers(), [&](Operation *user) {
           if (isa<AdamWUpdateOp, SgdUpdateOp, SumSqOp>(user))
             return true;
           return isa<CastOp, LossScaleOp>(user) &&
                  onlyForTheUpdate(user->getResult(0), depth + 1);
         });
}

/// ZeRO stage 1 reduces gradients whole (each rank keeps all of them, as
/// DeepSpeed's stage 1 does) and slices its shard for the update; stage 2
/// reduce-scatters them. Whole gradients are summed over the microbatches
/// first, so stage 1 reduces over dp once per step, not once per microbatch.
static bool keepWholeGradients(ReshardOp rs, StringRef axis) {
  auto module = rs->getParentOfType<ModuleOp>();
  int64_t stage = 0;
  for (auto par : module.getOps<ParallelOp>())
    stage = par.getZeroStage();
  return stage == 1 && (axis == "dp" || axis == OpShardingRule::kExpertAxis) &&
         onlyForTheUpdate(rs.getResult());
}

static LogicalResult expand(ReshardOp rs) {
  MLIRContext *ctx = rs.getContext();
  ShardingAttr fromAttr = getSharding(rs.getInput()), to = rs.getSharding();
  if (!fromAttr)
    return rs.emitError() << "the resharded value has no sharding; run "
                             "plan-propagate-sharding first";
  if (fromAttr.getRank() != to.getRank())
    return rs.emitError() << "reshards a rank-" << fromAttr.getRank()
                          << " layout to a rank-" << to.getRank() << " one";
  FlatSymbolRefAttr mesh = to.getMesh();
  Layout cur(fromAttr);
  Layout want(to);
  OpBuilder b(rs);
  Location loc = rs.getLoc();
  Value v = rs.getInput();
  Type type = rs.getType();
  auto record = [&](Operation *op) {
    setSharding(op, cur.get(ctx, mesh));
    // A reshard rebuilt for the backward (plan-rematerialize) stays backward.
    if (rs->hasAttr("plan.recompute"))
      op->setAttr("plan.recompute", UnitAttr::get(ctx));
    v = op->getResult(0);
  };
  // Splitting or unsplitting a segmented dimension would need the segments
  // moved one by one; no layout planc derives asks for it.
  auto plain = [&](int64_t d) -> LogicalResult {
    if (cur.segments[d].empty() && want.segments[d].empty())
      return success();
    return rs.emitError() << "resharding dimension " << d << " from "
                          << fromAttr << " to " << to
                          << " moves a split made of segments; not "
                             "supported yet";
  };

  MeshOp meshOp = getMesh(rs->getParentOfType<ModuleOp>());
  auto trivial = [&](StringRef a) {
    return meshOp && meshOp.getAxisSize(a) == 1;
  };

  // 1. Pending sums.
  SmallVector<StringRef> reduce;
  for (StringRef a : SmallVector<StringRef>(cur.partial.getArrayRef())) {
    if (want.partial.contains(a))
      continue;
    std::optional<int64_t> scatterDim;
    for (int64_t d = 0; d < (int64_t)cur.dims.size(); ++d)
      if (cur.extendsTo(d, a, want.dims[d]))
        scatterDim = d;
    cur.partial.remove(a);
    // ZeRO-1 keeps whole gradients: reduce them, then take the shard.
    if (scatterDim && keepWholeGradients(rs, a))
      scatterDim.reset();
    if (scatterDim && trivial(a)) {
      cur.dims[*scatterDim].push_back(a);
    } else if (scatterDim && succeeded(plain(*scatterDim))) {
      cur.dims[*scatterDim].push_back(a);
      record(ReduceScatterOp::create(b, loc, type, v, *scatterDim, a));
    } else if (scatterDim) {
      return failure();
    } else {
      reduce.push_back(a);
    }
  }
  // An axis of size 1 holds nothing to exchange; a sequential one
  // (microbatches) stays even with one microbatch: the lowering turns its sum
  // into the accumulation of the step's gradients, which a parameter shared
  // by pipeline stages needs from every stage that computes a term.
  llvm::erase_if(reduce, [&](StringRef a) {
    return trivial(a) && !meshOp.isSequential(a);
  });
  if (!reduce.empty())
    record(AllReduceOp::create(b, loc, type, v, b.getStrArrayAttr(reduce)));

  // 2. Splits to undo.
  for (int64_t d = 0; d < (int64_t)cur.dims.size(); ++d) {
    auto isPrefix = [&]() {
      ArrayRef<StringRef> have = cur.dims[d], w = want.dims[d];
      return have.size() <= w.size() && w.take_front(have.size()) == have;
    };
    while (!isPrefix()) {
      if (failed(plain(d)))
        return failure();
      StringRef a = cur.dims[d].back();
      cur.dims[d].pop_back();
      std::optional<int64_t> moveTo;
      for (int64_t e = 0; e < (int64_t)cur.dims.size(); ++e)
        if (e != d && cur.extendsTo(e, a, want.dims[e]))
          moveTo = e;
      if (trivial(a)) {
        if (moveTo)
          cur.dims[*moveTo].push_back(a);
      } else if (moveTo && succeeded(plain(*moveTo))) {
        cur.dims[*moveTo].push_back(a);
        record(AllToAllOp::create(b, loc, type, v, d, *moveTo, a));
      } else if (moveTo) {
        return failure();
      } else {
        record(AllGatherOp::create(b, loc, type, v, d, a));
      }
    }
  }

  // 3. Splits to add.
  for (int64_t d = 0; d < (int64_t)cur.dims.size(); ++d) {
    while (cur.dims[d].size() < want.dims[d].size()) {
      StringRef a = want.dims[d][cur.dims[d].size()];
      bool busy = cur.partial.contains(a) ||
                  llvm::any_of(cur.dims, [&](ArrayRef<StringRef> axes) {
                    return llvm::is_contained(axes, a);
                  });
      if (busy || failed(plain(d)))
        return busy ? rs.emitError()
                          << "cannot reshard " << fromAttr << " to " << to
                          << ": mesh axis '" << a << "' is still in use"
                    : failure();
      cur.dims[d].push_back(a);
      if (!trivial(a))
        record(AllSliceOp::create(b, loc, type, v, d, a));
    }
  }
  for (StringRef a : want.partial)
    if (!cur.partial.contains(a))
      return rs.emitError() << "cannot reshard " << fromAttr << " to " << to
                            << ": a whole value cannot be made a pending sum "
                               "over '"
                            << a << "'";
  rs.getResult().replaceAllUsesWith(v);
  rs.erase();
  return success();
}

void ExpandReshardsPass::runOnOperation() {
  SmallVector<ReshardOp> reshards;
  getOperation().walk([&](ReshardOp rs) { reshards.push_back(rs); });
  for (ReshardOp rs : reshards)
    if (failed(expand(rs)))
      return signalPassFailure();
}
