//===- KeepAttention.cpp - recompute = none keeps attention's scores -----===//
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
// The cuda target keeps nothing either: its tiled attention (runtime/lib/
// cuda/attention.cu) recomputes the exponentials tile by tile from the row
// statistics, as flash attention does, which is cheaper on a GPU than
// writing and reading back S^2 floats per head, and it never reads `keep`.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

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

void KeepAttentionPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (plan::recomputePolicy(module, policy) != "none" || target == "cuda")
    return;
  auto step = module.lookupSymbol<func::FuncOp>("plan_step");
  if (!step)
    return;
  SmallVector<rk::AttentionOp> forwards;
  step.walk([&](rk::AttentionOp a) { forwards.push_back(a); });
  for (rk::AttentionOp fwd : forwards) {
    rk::AttentionGradOp bwd;
    for (Operation *user : fwd.getQkv().getUsers())
      if (auto g = dyn_cast<rk::AttentionGradOp>(user);
          g && g->getBlock() == fwd->getBlock() &&
          g.getNumHeads() == fwd.getNumHeads() &&
          g.getNumKvHeads() == fwd.getNumKvHeads() && fwd->isBeforeInBlock(g))
        bwd = g;
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
    auto kept = rk::AttentionKeepOp::create(
        builder, loc, fwd.getQkv(), fwd.getOut(), keep, stats,
        fwd.getNumHeads(), fwd.getNumKvHeads(), fwd.getDropout(),
        fwd.getDropoutUid(), fwd.getBatchAxes(), fwd.getMicrobatches(),
        fwd.getMbInnerAxes(), fwd.getHeadAxes(), fwd.getHeadInnerAxes());
    kept->setDiscardableAttrs(fwd->getDiscardableAttrDictionary());
    builder.setInsertionPoint(bwd);
    auto grad = rk::AttentionGradKeptOp::create(
        builder, bwd.getLoc(), bwd.getQkv(), keep, stats, bwd.getGrad(),
        bwd.getOut(), bwd.getNumHeads(), bwd.getNumKvHeads(), bwd.getDropout(),
        bwd.getDropoutUid(), bwd.getBatchAxes(), bwd.getMicrobatches(),
        bwd.getMbInnerAxes(), bwd.getHeadAxes(), bwd.getHeadInnerAxes());
    grad->setDiscardableAttrs(bwd->getDiscardableAttrDictionary());
    fwd.erase();
    bwd.erase();
  }
}
