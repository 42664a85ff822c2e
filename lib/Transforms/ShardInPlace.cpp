//===- ShardInPlace.cpp - ZeRO's updates in the parameters' memory --------===//
//
// plan-lower-to-rank lowers a sharded update (ZeRO) value by value: the
// shard is a copy (rank.shard_slice into a new buffer), the update writes
// the copy, the gathered whole goes to another new buffer, and that is
// copied back into the parameter when the step returns. Three passes over
// memory that change no value. Here, in @plan_step's top-level block:
//   1. an all-gather whose result is only copied back into a buffer P
//      writes P directly when nothing touches P in between;
//   2. a shard along dimension 0 becomes a view of the whole
//      (rank.shard_view) when what the update writes through it cannot be
//      seen by another op, and what it reads cannot be changed by one; the
//      gather of such a shard back into P runs in place.
// Aliasing is by element ranges of the underlying buffer (rank.subview
// offsets; blocks of dynamic position count as the whole buffer). Pipelined
// steps are left alone (their updates run per stage).
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace planc {
#define GEN_PASS_DEF_SHARDINPLACE
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;

namespace {

using rk::Extent;
using rk::extentOf;

bool isView(Operation *op) {
  return isa<rk::ViewOp, rk::SubviewOp, rk::RowsOp, rk::ShardViewOp>(op);
}

/// Whether `op` may write (or read) its operand `v`; ops that do not say
/// are assumed to do both.
bool touches(Operation *op, Value v, bool write) {
  auto effects = dyn_cast<MemoryEffectOpInterface>(op);
  if (!effects)
    return true;
  SmallVector<MemoryEffects::EffectInstance> list;
  effects.getEffects(list);
  return llvm::any_of(list, [&](const MemoryEffects::EffectInstance &e) {
    if (e.getValue() && e.getValue() != v)
      return false;
    return write ? isa<MemoryEffects::Write>(e.getEffect())
                 : isa<MemoryEffects::Read>(e.getEffect());
  });
}

/// Ops of one pipeline stage (their updates run per stage).
bool staged(Operation *op) { return op->hasAttr(rk::kRankStageAttr); }

/// One memory access: a top-level op (or the top-level ancestor of a
/// nested one), the operand and its extent.
struct Access {
  Operation *top, *op;
  Value operand;
  Extent extent;
  bool dead = false; // its op was erased
};

class Rewriter {
public:
  explicit Rewriter(func::FuncOp step) : block(step.getBody().front()) {}

  void run() {
    // Collecting the accesses walks the whole step: skip what has nothing
    // to rewrite (no ZeRO: 1.2 s of a 10000-layer GPT's compile).
    auto gathers = llvm::to_vector(block.getOps<rk::AllGatherOp>());
    if (!gathers.empty()) {
      collect();
      for (auto ag : gathers)
        gatherIntoDestination(ag);
    }
    auto shards = llvm::to_vector(block.getOps<rk::ShardSliceOp>());
    if (shards.empty())
      return;
    collect();
    for (auto ss : shards)
      shardAsView(ss);
  }

private:
  Block &block;
  std::vector<Access> accesses;
  DenseMap<Value, SmallVector<size_t>> byRoot; // root -> its accesses
  DenseMap<Operation *, int64_t> pos;

  void collect() {
    accesses.clear();
    byRoot.clear();
    pos.clear();
    int64_t i = 0;
    for (Operation &top : block) {
      pos[&top] = i++;
      top.walk([&](Operation *op) {
        if (isView(op))
          return;
        for (Value v : op->getOperands())
          if (isa<MemRefType>(v.getType()))
            record({&top, op, v, extentOf(v)});
      });
    }
  }

  void record(Access a) {
    byRoot[a.extent.root].push_back(accesses.size());
    accesses.push_back(a);
  }

  /// The live accesses to `e` (by extent) of ops after `from` and, with
  /// `to`, before it.
  SmallVector<Access *> accessesTo(const Extent &e, Operation *from,
                                   Operation *to = nullptr) {
    SmallVector<Access *> out;
    for (size_t i : byRoot.lookup(e.root)) {
      Access &a = accesses[i];
      if (!a.dead && pos[a.top] > pos[from] && (!to || pos[a.top] < pos[to]) &&
          a.extent.overlaps(e))
        out.push_back(&a);
    }
    return out;
  }

  /// Before erasing `op`: it accesses nothing any more.
  void forget(Operation *op) {
    for (Value v : op->getOperands())
      if (isa<MemRefType>(v.getType()))
        for (size_t i : byRoot.lookup(extentOf(v).root))
          if (accesses[i].op == op)
            accesses[i].dead = true;
  }

  // 1. all_gather %s into %f ... copy %f into %P  ->  all_gather %s into %P.
  void gatherIntoDestination(rk::AllGatherOp ag) {
    Value whole = ag.getOut();
    auto alloc = whole.getDefiningOp<rk::AllocOp>();
    if (!alloc || staged(ag) || staged(alloc))
      return;
    rk::CopyOp back;
    for (Operation *user : whole.getUsers()) {
      if (user == ag.getOperation())
        continue;
      auto c = dyn_cast<rk::CopyOp>(user);
      if (!c || back || c.getInput() != whole || c->getBlock() != &block ||
          staged(c))
        return;
      back = c;
    }
    if (!back || !ag->isBeforeInBlock(back))
      return;
    Value dest = back.getOut();
    if (dest.getType() != whole.getType())
      return;
    Extent e = extentOf(dest);
    if (extentOf(ag.getInput()).overlaps(e) || !accessesTo(e, ag, back).empty())
      return;
    forget(back);
    forget(ag);
    byRoot.erase(whole);
    ag.getOutMutable().assign(dest);
    record({ag, ag, ag.getInput(), extentOf(ag.getInput())});
    record({ag, ag, dest, e});
    back.erase();
    alloc.erase();
  }

  // 2. shard_slice %X into %s dim 0  ->  %s = shard_view %X.
  void shardAsView(rk::ShardSliceOp ss) {
    Value shard = ss.getOut(), whole = ss.getInput();
    auto alloc = shard.getDefiningOp<rk::AllocOp>();
    if (ss.getDim() != 0 || !alloc || staged(ss) || staged(alloc))
      return;
    for (Operation *user : shard.getUsers())
      if (user != ss.getOperation() &&
          (user->getBlock() != &block || !ss->isBeforeInBlock(user)))
        return;
    bool shardWritten = llvm::any_of(shard.getUsers(), [&](Operation *user) {
      return user != ss.getOperation() && touches(user, shard, /*write=*/true);
    });
    // The gather of the updated shard back into the whole, in place.
    auto gatherBack = [&](const Access &a) {
      auto ag = dyn_cast<rk::AllGatherOp>(a.op);
      return ag && ag.getInput() == shard && ag.getOut() == whole &&
             ag.getDim() == 0 && ag.getAxis() == ss.getAxis();
    };
    // Nobody else writes the whole after the slice (the view would change
    // under the shard's readers), nor reads it when the shard is written.
    for (Access *a : accessesTo(extentOf(whole), ss))
      if (!gatherBack(*a) &&
          (shardWritten || touches(a->op, a->operand, /*write=*/true)))
        return;
    forget(ss);
    OpBuilder b(ss);
    auto view = rk::ShardViewOp::create(b, ss.getLoc(), shard.getType(), whole,
                                        ss.getAxisAttr());
    // What went through the shard's buffer now goes to the whole's.
    SmallVector<size_t> moved = byRoot.lookup(shard);
    byRoot.erase(shard);
    Extent e = extentOf(view);
    for (size_t i : moved) {
      accesses[i].operand = view;
      accesses[i].extent = e;
      byRoot[e.root].push_back(i);
    }
    shard.replaceAllUsesWith(view.getResult());
    ss.erase();
    alloc.erase();
  }
};

struct ShardInPlacePass
    : public planc::impl::ShardInPlaceBase<ShardInPlacePass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto step = module.lookupSymbol<func::FuncOp>("plan_step");
    if (!step || step.isExternal())
      return;
    bool pipelined = false;
    step.walk([&](Operation *op) {
      pipelined |= isa<rk::PipelineOp>(op) || staged(op);
    });
    if (pipelined)
      return;
    Rewriter(step).run();
  }
};

} // namespace
