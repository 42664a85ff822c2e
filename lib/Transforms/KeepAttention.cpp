//===- KeepAttention.cpp - What attention keeps for its backward ---------===//
//
// The three recompute policies are three points of one trade between memory
// and backward work:
// - `full` recomputes each layer's forward in its backward (plan-recompute);
// - `selective` keeps the layers' activations but not the attention core
//   (the S x S score matrix per head, Korthikanti et al. 2022):
//   rank.attention_grad recomputes q.k and the exponentials;
// - `none` keeps the score matrix too: here, each rank.attention whose
//   backward (a rank.attention_grad of the same qkv) runs in the same block
//   becomes rank.attention_keep, which writes its exponentials [B, H, S, S]
//   and row statistics [B, H, S, 2] to two new buffers, and the backward
//   becomes rank.attention_grad_kept, which reads them: no q.k products or
//   exp in the backward, S^2 more floats per head and sample alive between
//   the two. The kept values are those the recomputation makes, so the
//   three policies give the same bits.
// A pipeline's forward and backward of a layer run in different units: the
// score matrix is not stashed, and there `none` recomputes like
// `selective`. The log-sum-exps below are (4 bytes per row and head): they
// go through the stash from the forward's unit to the backward's, which
// reads the forward's output there too (zero bubble: the backward's B unit
// joins the readers of the output's slot, held for W anyway).
// The cuda target keeps no score matrix under any policy: its tiled
// attention (runtime/lib/cuda/attention.cu) recomputes the exponentials
// tile by tile from the row statistics, as flash attention does, which is
// cheaper on a GPU than writing and reading back S^2 floats per head. What
// it keeps instead is for cuDNN's flash attention (16-bit, no dropout),
// whose backward reads the forward's output and each row's log-sum-exp:
// the forward becomes rank.attention_lse, writing the log-sum-exp [B, H, S]
// (4 bytes per row and head) to a new buffer, and the backward
// rank.attention_grad_lse, which reads it and the forward's output (which
// the output projection's weight gradient keeps alive anyway). Without
// them cuDNN's backward runs the forward again first (a sixth of
// attention's work, in buffers outside the plan). Where the tiles run
// instead, the two are ignored and the backward recomputes as before.
// Context parallelism's all_gather attention (rank.attention_cp, two cuDNN
// calls a rank) keeps its chunks' log-sum-exps alike, in one buffer. Its
// ring (rank.attention_ring) keeps each row's log-sum-exp on every target
// and under every policy: its gradient otherwise runs the whole forward
// ring again (every block's attention and the shifts) for the rows'
// statistics, where the log-sum-exp and the output it reads anyway give
// them.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "planrt/workspace.h"

namespace planc {
#define GEN_PASS_DEF_KEEPATTENTION
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;

namespace {
struct KeepAttentionPass
    : public planc::impl::KeepAttentionBase<KeepAttentionPass> {
  using KeepAttentionBase::KeepAttentionBase;
  void runOnOperation() override;
};
} // namespace

namespace {
/// The rank.attention_grad of `fwd`'s qkv in its block, after it, with its
/// heads; null if none.
rk::AttentionGradOp backwardOf(rk::AttentionOp fwd) {
  rk::AttentionGradOp bwd;
  for (Operation *user : fwd.getQkv().getUsers())
    if (auto g = dyn_cast<rk::AttentionGradOp>(user);
        g && g->getBlock() == fwd->getBlock() &&
        g.getNumHeads() == fwd.getNumHeads() &&
        g.getNumKvHeads() == fwd.getNumKvHeads() && fwd->isBeforeInBlock(g))
      bwd = g;
  return bwd;
}

/// Builds NewOp(operands..., old's attributes) at `old`'s place, with
/// old's discardable attributes (old stays for the caller to erase).
template <class NewOp, class OldOp, class... Operands>
void rebuild(OldOp old, Operands... operands) {
  OpBuilder b(old);
  auto op = NewOp::create(b, old.getLoc(), operands..., old.getNumHeads(),
                          old.getNumKvHeads(), old.getDropout(),
                          old.getDropoutUid(), old.getBatchAxes(),
                          old.getMicrobatches(), old.getMbInnerAxes(),
                          old.getHeadAxes(), old.getHeadInnerAxes());
  op->setDiscardableAttrs(old->getDiscardableAttrDictionary());
}

/// Whether `op`, or an op nested in it, may write or free the buffer
/// `root` (through any view of it).
bool writes(Operation *op, Value root) {
  WalkResult r = op->walk([&](Operation *inner) {
    for (Value v : inner->getOperands()) {
      if (!isa<MemRefType>(v.getType()) || rk::viewRoot(v) != root)
        continue;
      auto effects = dyn_cast<MemoryEffectOpInterface>(inner);
      if (!effects)
        return isPure(inner) ? WalkResult::advance() : WalkResult::interrupt();
      SmallVector<MemoryEffects::EffectInstance> list;
      effects.getEffects(list);
      for (const MemoryEffects::EffectInstance &e : list)
        if (e.getValue() == v && !isa<MemoryEffects::Read>(e.getEffect()))
          return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return r.wasInterrupted();
}

/// Whether an op from `from` (excluded) to `to` (excluded) may write or
/// free `buffer` or a view of what it views.
bool writtenBetween(Operation *from, Operation *to, Value buffer) {
  Value root = rk::viewRoot(buffer);
  for (Operation *op = from->getNextNode(); op != to; op = op->getNextNode())
    if (writes(op, root))
      return true;
  return false;
}

/// Whether `buffer` (or what it views) is read between the last writer of
/// `grad`'s buffer before `bwd` and `bwd` itself: the forward's output is
/// then alive in the backward anyway (the output projection's weight
/// gradient reads it), so reading it in `bwd` costs nearly nothing. Where
/// the attention writes a buffer of its own that only the forward reads,
/// keeping it holds a whole output per layer (ulyssesOutput says when that
/// pays).
bool readInBackward(Operation *bwd, Value grad, Value buffer) {
  Value root = rk::viewRoot(buffer), gradRoot = rk::viewRoot(grad);
  for (Operation *op = bwd->getPrevNode(); op; op = op->getPrevNode()) {
    if (llvm::any_of(op->getOperands(), [&](Value v) {
          return isa<MemRefType>(v.getType()) && rk::viewRoot(v) == root;
        }))
      return true;
    if (writes(op, gradRoot))
      return false; // grad's producer
  }
  return false;
}

/// Whether no other attention runs between `fwd` and `bwd`: the forward
/// recomputed in its layer's backward (recompute = full), or a model of one
/// layer. Keeping the output then holds it for one layer's backward at
/// most, even where nothing else reads it there.
bool sameLayer(Operation *fwd, Operation *bwd) {
  for (Operation *op = fwd->getNextNode(); op != bwd; op = op->getNextNode()) {
    WalkResult r = op->walk([](Operation *inner) {
      return isa<rk::AttentionOp, rk::AttentionGradOp, rk::AttentionLseOp,
                 rk::AttentionGradLseOp, rk::AttentionKeepOp,
                 rk::AttentionGradKeptOp, rk::AttentionCpOp,
                 rk::AttentionCpGradOp, rk::AttentionRingOp,
                 rk::AttentionRingGradOp>(inner)
                 ? WalkResult::interrupt()
                 : WalkResult::advance();
    });
    if (r.wasInterrupted())
      return false;
  }
  return true;
}

/// Whether `out` is context parallelism's all-to-all (Ulysses) output:
/// every position of this rank's heads, which only rank.heads_to_seq reads
/// (into the rank's positions of every head). Keeping it for the backward
/// holds one more output per layer, as DeepSpeed-Ulysses' flash attention
/// does, and saves the forward the backward would run again: the larger
/// share of a long sequence's step, which is what cp is for.
bool ulyssesOutput(Value out, Operation *fwd) {
  return llvm::all_of(out.getUsers(), [&](Operation *user) {
    return user == fwd || isa<rk::HeadsToSeqOp>(user);
  });
}

/// Whether the backward `bwd` may read the output of its forward `fwd`:
/// it has the gradient's type, nothing between the two writes it, and it
/// is alive in the backward anyway (read there, as the output projection's
/// weight gradient does, or recomputed beside it), or is Ulysses'
/// heads-split output (`ulysses`: one more output per layer).
template <class Fwd, class Bwd>
bool outputMayBeKept(Fwd fwd, Bwd bwd, bool ulysses) {
  auto qkv = cast<MemRefType>(fwd.getQkv().getType());
  Value out = fwd.getOut();
  return out.getType() == bwd.getGrad().getType() &&
         cast<MemRefType>(out.getType()).getElementType() ==
             qkv.getElementType() &&
         rk::viewRoot(bwd.getOut()) != rk::viewRoot(out) &&
         !writtenBetween(fwd, bwd, out) &&
         (readInBackward(bwd, bwd.getGrad(), out) || sameLayer(fwd, bwd) ||
          (ulysses && ulyssesOutput(out, fwd)));
}

/// A new f32 buffer of `shape` before `fwd`, in its pipeline stage; with
/// `stashed`, kept past fwd's pipeline unit (LowerToRank's rank.stash).
Value allocBefore(Operation *fwd, ArrayRef<int64_t> shape,
                  bool stashed = false) {
  OpBuilder builder(fwd);
  auto alloc = rk::AllocOp::create(
      builder, fwd->getLoc(), MemRefType::get(shape, builder.getF32Type()));
  if (auto st = fwd->getAttr(rk::kRankStageAttr))
    alloc->setAttr(rk::kRankStageAttr, st);
  if (stashed)
    alloc->setAttr("rank.stash", builder.getUnitAttr());
  return alloc.getResult();
}

//===--- Across a pipeline's units ----------------------------------------===//
//
// In a pipeline (LowerToRank's rank.unit ops) a layer's forward runs in its
// stage's F unit and its backward in a later unit of the same stage, which
// reads the forward's buffers through the stash: rank.stash_put at the end
// of the forward's unit, rank.stash_get at the start of the reader's. What
// the forward keeps for its backward travels the same way, in a slot of its
// own; the forward's output is read there only where it is stashed for the
// backward's unit or for later ones (the output projection's weight
// gradient reads it, in B or, with zero bubble, in W), so keeping holds the
// log-sum-exp per microbatch in flight, nothing more.

/// The stash slot unit `u` puts `v` into, or -1.
int64_t slotOf(rk::UnitOp u, Value v) {
  for (auto put : u.getBody().front().getOps<rk::StashPutOp>())
    if (put.getBuffer() == v)
      return (int64_t)put.getSlot();
  return -1;
}

/// What unit `u` gets from stash slot `slot`, or null.
Value stashedIn(rk::UnitOp u, int64_t slot) {
  for (auto get : u.getBody().front().getOps<rk::StashGetOp>())
    if ((int64_t)get.getSlot() == slot)
      return get.getResult();
  return Value();
}

/// Whether an op of `op`'s block after it (`after`) or before it may write
/// or free `buffer` or a view of what it views.
bool writtenAround(Operation *op, Value buffer, bool after) {
  Value root = rk::viewRoot(buffer);
  Block *block = op->getBlock();
  for (Operation &o : *block) {
    bool beyond = after ? op->isBeforeInBlock(&o) : o.isBeforeInBlock(op);
    if (beyond && writes(&o, root))
      return true;
  }
  return false;
}

/// The ops of type Bwd that may be `fwd`'s backward: readers of its qkv
/// after it in its block, or, where fwd runs in a pipeline unit, readers of
/// the stash's copy of that qkv in the later units of its stage.
template <class Bwd> SmallVector<Bwd> backwardsOf(Operation *fwd, Value qkv) {
  SmallVector<Bwd> found;
  for (Operation *user : qkv.getUsers())
    if (auto g = dyn_cast<Bwd>(user);
        g && g->getBlock() == fwd->getBlock() && fwd->isBeforeInBlock(g))
      found.push_back(g);
  auto uf = dyn_cast<rk::UnitOp>(fwd->getParentOp());
  int64_t slot = uf ? slotOf(uf, qkv) : -1;
  if (slot < 0 || !found.empty())
    return found;
  for (Operation &op : uf->getBlock()->getOperations()) {
    auto ub = dyn_cast<rk::UnitOp>(op);
    if (!ub || ub == uf || ub.getStage() != uf.getStage() ||
        ub.getPhase() == "F")
      continue;
    if (Value got = stashedIn(ub, slot))
      for (Operation *user : got.getUsers())
        if (auto g = dyn_cast<Bwd>(user);
            g && g->getBlock() == got.getParentBlock())
          found.push_back(g);
  }
  return found;
}

/// Slots for what a forward keeps across units, after the pipeline's own.
struct Slots {
  int64_t next = 0;
  explicit Slots(func::FuncOp step) {
    step.walk([&](Operation *op) {
      if (auto put = dyn_cast<rk::StashPutOp>(op))
        next = std::max(next, (int64_t)put.getSlot() + 1);
    });
  }
  /// `v` (of `from`'s unit) where `to` reads it: itself in the same block,
  /// else through a new slot (put at the end of from's unit, got at the
  /// start of to's and released at its end).
  Value carry(Value v, Operation *from, Operation *to) {
    if (from->getBlock() == to->getBlock())
      return v;
    Block *put = from->getBlock(), *get = to->getBlock();
    OpBuilder b(from->getContext());
    Location loc = from->getLoc();
    b.setInsertionPointToEnd(put);
    rk::StashPutOp::create(b, loc, v, b.getI64IntegerAttr(next),
                           b.getI64IntegerAttr(1));
    b.setInsertionPointToStart(get);
    Value got =
        rk::StashGetOp::create(b, loc, v.getType(), b.getI64IntegerAttr(next));
    b.setInsertionPointToEnd(get);
    rk::StashReleaseOp::create(b, loc, b.getI64IntegerAttr(next));
    ++next;
    return got;
  }
  /// Makes unit `to` one more reader of the stash slot `put` fills: its
  /// value there (got at to's start, released at its end). The slot's
  /// buffer stays as long as before where `to` runs before its last reader.
  Value addReader(rk::StashPutOp put, Block *to) {
    OpBuilder b(put->getContext());
    Location loc = put.getLoc();
    put.setReaders(put.getReaders() + 1);
    b.setInsertionPointToStart(to);
    Value got = rk::StashGetOp::create(b, loc, put.getBuffer().getType(),
                                       put.getSlotAttr());
    b.setInsertionPointToEnd(to);
    rk::StashReleaseOp::create(b, loc, put.getSlotAttr());
    return got;
  }
};

/// Where `bwd` runs in another pipeline unit than `fwd`: fwd's output as
/// bwd's unit gets it from the stash, where it may read it (outputMayBeKept's
/// conditions: the gradient's type, its own output elsewhere, and nothing
/// after the forward in its unit or before the backward in its unit writes
/// it); null otherwise. Where the output is stashed for later units only
/// (zero bubble: the weight gradient reads it in W, the backward runs in
/// B), bwd's unit becomes one more reader of its slot: B runs before W, so
/// the output is held no longer than before.
template <class Fwd, class Bwd>
Value outputAcrossUnits(Fwd fwd, Bwd bwd, Slots &slots) {
  rk::UnitOp uf = dyn_cast<rk::UnitOp>(fwd->getParentOp());
  rk::UnitOp ub = dyn_cast<rk::UnitOp>(bwd->getParentOp());
  if (!uf || !ub || uf == ub)
    return Value();
  rk::StashPutOp put;
  for (auto p : uf.getBody().front().getOps<rk::StashPutOp>())
    if (p.getBuffer() == fwd.getOut())
      put = p;
  if (!put)
    return Value();
  Value out = stashedIn(ub, (int64_t)put.getSlot());
  auto type = cast<MemRefType>(fwd.getOut().getType());
  if (type != bwd.getGrad().getType() ||
      type.getElementType() !=
          cast<MemRefType>(fwd.getQkv().getType()).getElementType() ||
      (out && rk::viewRoot(bwd.getOut()) == rk::viewRoot(out)) ||
      writtenAround(fwd, fwd.getOut(), /*after=*/true) ||
      (out && writtenAround(bwd, out, /*after=*/false)))
    return Value();
  if (!out) {
    // The units that read the slot already all run after bwd's (later
    // phases of the same stage); bwd's unit joins them.
    for (Operation &op : uf->getBlock()->getOperations()) {
      auto u = dyn_cast<rk::UnitOp>(op);
      if (u && u != ub && stashedIn(u, (int64_t)put.getSlot()) &&
          u.getPhase() != "W")
        return Value();
    }
    out = slots.addReader(put, &ub.getBody().front());
  }
  return out;
}

/// fwd's backward of type Bwd (the last of backwardsOf that `match`
/// accepts) and fwd's output as it may read it (outputMayBeKept in one
/// block, outputAcrossUnits across a pipeline's units); none where it may
/// not.
template <class Bwd, class Fwd, class Match>
std::optional<std::pair<Bwd, Value>> keptPair(Fwd fwd, bool ulysses,
                                              Slots &slots, Match match) {
  Bwd bwd;
  for (Bwd g : backwardsOf<Bwd>(fwd, fwd.getQkv()))
    if (match(g))
      bwd = g;
  if (!bwd)
    return std::nullopt;
  if (bwd->getBlock() == fwd->getBlock())
    return outputMayBeKept(fwd, bwd, ulysses)
               ? std::optional<std::pair<Bwd, Value>>({bwd, fwd.getOut()})
               : std::nullopt;
  Value out = outputAcrossUnits(fwd, bwd, slots);
  return out ? std::optional<std::pair<Bwd, Value>>({bwd, out}) : std::nullopt;
}

/// Gives context parallelism's `fwd` (`keeping`) and `bwd` (`kept`, with
/// fwd's output as bwd reads it, `out`) a new log-sum-exp buffer of
/// `shape`, carried to bwd's unit where that is another.
template <class Fwd, class Bwd>
void keepLse(Fwd fwd, Bwd bwd, Value out, ArrayRef<int64_t> shape,
             Slots &slots) {
  Value lse = allocBefore(fwd, shape, bwd->getBlock() != fwd->getBlock());
  fwd.getLseMutable().assign(lse);
  bwd.getFwdOutMutable().assign(out);
  bwd.getLseMutable().assign(slots.carry(lse, fwd, bwd));
}

/// Whether cuDNN may run the attention `fwd` (16 bits, no dropout, a head
/// dim it takes).
template <class Fwd> bool cudnnMayRun(Fwd fwd) {
  auto qkv = cast<MemRefType>(fwd.getQkv().getType());
  int64_t d = qkv.getDimSize(2) / (fwd.getNumHeads() + 2 * fwd.getNumKvHeads());
  return planrt::workspace::outside::cudnn_attention(
      !qkv.getElementType().isF32(), fwd.getDropout().convertToFloat() > 0, d);
}

/// The cuda target: a 16-bit attention without dropout that cuDNN may run
/// (planrt/workspace.h outside::cudnn_attention) keeps each row's
/// log-sum-exp [B, H, S] for its backward, which also reads the forward's
/// output (keptPair: in the forward's block, or in a later pipeline unit
/// through the stash), so cuDNN's backward does not run the forward again.
void keepForCudnn(func::FuncOp step, Slots &slots) {
  SmallVector<rk::AttentionOp> forwards;
  step.walk([&](rk::AttentionOp a) { forwards.push_back(a); });
  for (rk::AttentionOp fwd : forwards) {
    if (!cudnnMayRun(fwd))
      continue;
    auto pair = keptPair<rk::AttentionGradOp>(
        fwd, /*ulysses=*/true, slots, [&](rk::AttentionGradOp g) {
          return g.getNumHeads() == fwd.getNumHeads() &&
                 g.getNumKvHeads() == fwd.getNumKvHeads();
        });
    if (!pair)
      continue;
    auto [bwd, out] = *pair;
    auto qkv = cast<MemRefType>(fwd.getQkv().getType());
    Value lse = allocBefore(
        fwd, {qkv.getDimSize(0), (int64_t)fwd.getNumHeads(), qkv.getDimSize(1)},
        bwd->getBlock() != fwd->getBlock());
    rebuild<rk::AttentionLseOp>(fwd, fwd.getQkv(), fwd.getOut(), lse);
    rebuild<rk::AttentionGradLseOp>(bwd, bwd.getQkv(), out,
                                    slots.carry(lse, fwd, bwd), bwd.getGrad(),
                                    bwd.getOut());
    fwd.erase();
    bwd.erase();
  }
}
/// Context parallelism's all_gather on the cuda target: likewise, a
/// rank.attention_cp that cuDNN may run keeps its chunks' log-sum-exps
/// (`keeping`, planrt/workspace.h outside::cudnn_cp_lse_floats) for its
/// rank.attention_cp_grad of the same local qkv, which reads them with the
/// forward's output (`kept`): its backward then runs no chunk's forward
/// again.
void keepCpForCudnn(func::FuncOp step, Slots &slots) {
  SmallVector<rk::AttentionCpOp> forwards;
  step.walk([&](rk::AttentionCpOp a) { forwards.push_back(a); });
  // The runtime's backward reads what the forward kept where cuDNN runs
  // it with its own kv: the gathered keys' buffers must be alike (whole
  // buffers of one type, aligned as the forward's test wants).
  auto wholeBuffer = [](Value v) { return v.getDefiningOp<rk::AllocOp>(); };
  for (rk::AttentionCpOp fwd : forwards) {
    if (fwd.getLse() || !cudnnMayRun(fwd) || !wholeBuffer(fwd.getKv()))
      continue;
    auto pair = keptPair<rk::AttentionCpGradOp>(
        fwd, /*ulysses=*/false, slots, [&](rk::AttentionCpGradOp g) {
          return !g.getLse() && g.getNumHeads() == fwd.getNumHeads() &&
                 g.getNumKvHeads() == fwd.getNumKvHeads() &&
                 g.getAxis() == fwd.getAxis() &&
                 g.getKv().getType() == fwd.getKv().getType() &&
                 wholeBuffer(g.getKv());
        });
    if (!pair)
      continue;
    auto qkv = cast<MemRefType>(fwd.getQkv().getType());
    keepLse(fwd, pair->first, pair->second,
            {planrt::workspace::outside::cudnn_cp_lse_floats(
                qkv.getDimSize(0), fwd.getNumHeads(), qkv.getDimSize(1))},
            slots);
  }
}
/// Context parallelism's ring, on every target: a rank.attention_ring
/// keeps each row's log-sum-exp after the ring (`keeping`, f32 [B, H, L])
/// for its rank.attention_ring_grad of the same local qkv, which reads it
/// with the forward's output (`kept`, keptPair): the rows' statistics and
/// delta = dout . out come from them, so the gradient runs no forward ring
/// (G blocks of attention and G - 1 shifts fewer), on the host's functors,
/// planrt's tiles and cuDNN alike.
void keepRing(func::FuncOp step, Slots &slots) {
  SmallVector<rk::AttentionRingOp> forwards;
  step.walk([&](rk::AttentionRingOp a) { forwards.push_back(a); });
  for (rk::AttentionRingOp fwd : forwards) {
    if (fwd.getLse())
      continue;
    auto pair = keptPair<rk::AttentionRingGradOp>(
        fwd, /*ulysses=*/false, slots, [&](rk::AttentionRingGradOp g) {
          return !g.getLse() && g.getNumHeads() == fwd.getNumHeads() &&
                 g.getNumKvHeads() == fwd.getNumKvHeads() &&
                 g.getAxis() == fwd.getAxis() &&
                 g.getDropoutAttr() == fwd.getDropoutAttr() &&
                 g.getDropoutUid() == fwd.getDropoutUid();
        });
    if (!pair)
      continue;
    auto qkv = cast<MemRefType>(fwd.getQkv().getType());
    keepLse(fwd, pair->first, pair->second,
            {qkv.getDimSize(0), (int64_t)fwd.getNumHeads(), qkv.getDimSize(1)},
            slots);
  }
}
} // namespace

void KeepAttentionPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto step = module.lookupSymbol<func::FuncOp>("plan_step");
  if (!step)
    return;
  Slots slots(step);
  keepRing(step, slots);
  if (target == "cuda") {
    keepForCudnn(step, slots);
    keepCpForCudnn(step, slots);
    return;
  }
  if (plan::recomputePolicy(module, policy) != "none")
    return;
  SmallVector<rk::AttentionOp> forwards;
  step.walk([&](rk::AttentionOp a) { forwards.push_back(a); });
  for (rk::AttentionOp fwd : forwards) {
    rk::AttentionGradOp bwd = backwardOf(fwd);
    if (!bwd)
      continue;
    auto qkv = cast<MemRefType>(fwd.getQkv().getType());
    int64_t b = qkv.getDimSize(0), s = qkv.getDimSize(1), h = fwd.getNumHeads();
    OpBuilder builder(fwd);
    Location loc = fwd.getLoc();
    Type f32 = builder.getF32Type();
    auto keep =
        rk::AllocOp::create(builder, loc, MemRefType::get({b, h, s, s}, f32));
    auto stats =
        rk::AllocOp::create(builder, loc, MemRefType::get({b, h, s, 2}, f32));
    for (Operation *alloc : {keep.getOperation(), stats.getOperation()})
      if (auto st = fwd->getAttr(rk::kRankStageAttr))
        alloc->setAttr(rk::kRankStageAttr, st);
    rebuild<rk::AttentionKeepOp>(fwd, fwd.getQkv(), fwd.getOut(),
                                 keep.getResult(), stats.getResult());
    rebuild<rk::AttentionGradKeptOp>(bwd, bwd.getQkv(), keep.getResult(),
                                     stats.getResult(), bwd.getGrad(),
                                     bwd.getOut());
    fwd.erase();
    bwd.erase();
  }
}
