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
// A pipeline's forward and backward of a layer run in different units
// (they would need the stash): there, `none` recomputes like `selective`.
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

/// Whether cuDNN's backward `bwd` may read the output and log-sum-exp of
/// its forward `fwd`: a 16-bit attention without dropout cuDNN may run,
/// whose output may be kept (outputMayBeKept).
template <class Fwd, class Bwd>
bool cudnnMayKeep(Fwd fwd, Bwd bwd, bool ulysses) {
  if (!outputMayBeKept(fwd, bwd, ulysses))
    return false;
  auto qkv = cast<MemRefType>(fwd.getQkv().getType());
  int64_t d = qkv.getDimSize(2) / (fwd.getNumHeads() + 2 * fwd.getNumKvHeads());
  return planrt::workspace::outside::cudnn_attention(
      !qkv.getElementType().isF32(), fwd.getDropout().convertToFloat() > 0, d);
}

/// A new f32 buffer of `shape` before `fwd`, in its pipeline stage.
Value allocBefore(Operation *fwd, ArrayRef<int64_t> shape) {
  OpBuilder builder(fwd);
  auto alloc = rk::AllocOp::create(
      builder, fwd->getLoc(), MemRefType::get(shape, builder.getF32Type()));
  if (auto st = fwd->getAttr(rk::kRankStageAttr))
    alloc->setAttr(rk::kRankStageAttr, st);
  return alloc.getResult();
}

/// The cuda target: a 16-bit attention without dropout that cuDNN may run
/// (planrt/workspace.h outside::cudnn_attention) keeps each row's
/// log-sum-exp [B, H, S] for its backward, which also reads the forward's
/// output (cudnnMayKeep), so cuDNN's backward does not run the forward
/// again.
void keepForCudnn(func::FuncOp step) {
  SmallVector<rk::AttentionOp> forwards;
  step.walk([&](rk::AttentionOp a) { forwards.push_back(a); });
  for (rk::AttentionOp fwd : forwards) {
    rk::AttentionGradOp bwd = backwardOf(fwd);
    if (!bwd || !cudnnMayKeep(fwd, bwd, /*ulysses=*/true))
      continue;
    auto qkv = cast<MemRefType>(fwd.getQkv().getType());
    Value lse = allocBefore(fwd, {qkv.getDimSize(0), (int64_t)fwd.getNumHeads(),
                                  qkv.getDimSize(1)});
    rebuild<rk::AttentionLseOp>(fwd, fwd.getQkv(), fwd.getOut(), lse);
    rebuild<rk::AttentionGradLseOp>(bwd, bwd.getQkv(), fwd.getOut(), lse,
                                    bwd.getGrad(), bwd.getOut());
    fwd.erase();
    bwd.erase();
  }
}
/// Context parallelism's all_gather on the cuda target: likewise, a
/// rank.attention_cp that cuDNN may run keeps its chunks' log-sum-exps
/// (`keeping`, planrt/workspace.h outside::cudnn_cp_lse_floats) for its
/// rank.attention_cp_grad of the same local qkv in its block, which reads
/// them with the forward's output (`kept`): its backward then runs no
/// chunk's forward again.
void keepCpForCudnn(func::FuncOp step) {
  SmallVector<rk::AttentionCpOp> forwards;
  step.walk([&](rk::AttentionCpOp a) { forwards.push_back(a); });
  // The runtime's backward reads what the forward kept where cuDNN runs
  // it with its own kv: the gathered keys' buffers must be alike (whole
  // buffers of one type, aligned as the forward's test wants).
  auto wholeBuffer = [](Value v) { return v.getDefiningOp<rk::AllocOp>(); };
  for (rk::AttentionCpOp fwd : forwards) {
    rk::AttentionCpGradOp bwd;
    for (Operation *user : fwd.getQkv().getUsers())
      if (auto g = dyn_cast<rk::AttentionCpGradOp>(user);
          g && g->getBlock() == fwd->getBlock() && !g.getLse() &&
          g.getNumHeads() == fwd.getNumHeads() &&
          g.getNumKvHeads() == fwd.getNumKvHeads() &&
          g.getAxis() == fwd.getAxis() && fwd->isBeforeInBlock(g))
        bwd = g;
    if (!bwd || fwd.getLse() ||
        fwd.getKv().getType() != bwd.getKv().getType() ||
        !wholeBuffer(fwd.getKv()) || !wholeBuffer(bwd.getKv()) ||
        !cudnnMayKeep(fwd, bwd, /*ulysses=*/false))
      continue;
    auto qkv = cast<MemRefType>(fwd.getQkv().getType());
    Value lse = allocBefore(
        fwd, {planrt::workspace::outside::cudnn_cp_lse_floats(
                 qkv.getDimSize(0), fwd.getNumHeads(), qkv.getDimSize(1))});
    fwd.getLseMutable().assign(lse);
    bwd.getFwdOutMutable().assign(fwd.getOut());
    bwd.getLseMutable().assign(lse);
  }
}
/// Context parallelism's ring, on every target: a rank.attention_ring
/// keeps each row's log-sum-exp after the ring (`keeping`, f32 [B, H, L])
/// for its rank.attention_ring_grad of the same local qkv in its block,
/// which reads it with the forward's output (`kept`, outputMayBeKept): the
/// rows' statistics and delta = dout . out come from them, so the gradient
/// runs no forward ring (G blocks of attention and G - 1 shifts fewer), on
/// the host's functors, planrt's tiles and cuDNN alike.
void keepRing(func::FuncOp step) {
  SmallVector<rk::AttentionRingOp> forwards;
  step.walk([&](rk::AttentionRingOp a) { forwards.push_back(a); });
  for (rk::AttentionRingOp fwd : forwards) {
    rk::AttentionRingGradOp bwd;
    for (Operation *user : fwd.getQkv().getUsers())
      if (auto g = dyn_cast<rk::AttentionRingGradOp>(user);
          g && g->getBlock() == fwd->getBlock() && !g.getLse() &&
          g.getNumHeads() == fwd.getNumHeads() &&
          g.getNumKvHeads() == fwd.getNumKvHeads() &&
          g.getAxis() == fwd.getAxis() &&
          g.getDropoutAttr() == fwd.getDropoutAttr() &&
          g.getDropoutUid() == fwd.getDropoutUid() && fwd->isBeforeInBlock(g))
        bwd = g;
    if (!bwd || fwd.getLse() || !outputMayBeKept(fwd, bwd, false))
      continue;
    auto qkv = cast<MemRefType>(fwd.getQkv().getType());
    Value lse = allocBefore(fwd, {qkv.getDimSize(0), (int64_t)fwd.getNumHeads(),
                                  qkv.getDimSize(1)});
    fwd.getLseMutable().assign(lse);
    bwd.getFwdOutMutable().assign(fwd.getOut());
    bwd.getLseMutable().assign(lse);
  }
}
} // namespace

void KeepAttentionPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto step = module.lookupSymbol<func::FuncOp>("plan_step");
  if (!step)
    return;
  keepRing(step);
  if (target == "cuda") {
    keepForCudnn(step);
    keepCpForCudnn(step);
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
