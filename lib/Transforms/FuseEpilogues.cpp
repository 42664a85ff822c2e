//===- FuseEpilogues.cpp - A GEMM adds its bias in its epilogue (cuda) ----===//
//
// A linear layer lowers to rank.matmul into a fresh buffer, then
// rank.bias_add from it into another: on a GPU, two passes over the
// product (the GEMM writes it, the add reads and writes it again), which
// for GPT-2 124M (B 16, T 1024) are 48 launches and about 4.7 ms of a
// step on an H200. cuBLASLt adds a bias in the GEMM's epilogue
// (CUBLASLT_EPILOGUE_BIAS), while the tile is still in registers, so on
// the cuda target the pair becomes one rank.matmul_bias and the product's
// buffer goes away.
//
// The fused op runs where the bias add ran (the bias, in a 16-bit plan, is
// cast between the two), so the matmul moves down past the ops between
// them. That is safe when those ops write only buffers allocated between
// the two: nothing the GEMM reads can change. Anything else (a collective
// in place, a view, an op with regions or unknown effects) keeps the pair
// as it is. A row-parallel layer's bias is added after its all-reduce, so
// it is not the GEMM's only reader's neighbour and stays unfused.
//
// A GELU (tanh form, GPT's) that reads the biased product next goes into
// the epilogue too (CUBLASLT_EPILOGUE_GELU_AUX_BIAS): the GEMM writes the
// pre-activation, which the backward's gelu_grad reads, and the GELU, as
// rank.matmul_bias_gelu at the gelu's place. The same rule for the ops
// between, and none of them may read the pre-activation (it would be read
// before the fused GEMM writes it).
//
// The host keeps the pair: planrt would run the GEMM and the add there
// anyway, and its 16-bit bits (the product rounded before the add) stay
// what every test expects.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace planc {
#define GEN_PASS_DEF_FUSEEPILOGUES
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;

namespace {
struct FuseEpiloguesPass
    : public planc::impl::FuseEpiloguesBase<FuseEpiloguesPass> {
  using FuseEpiloguesBase::FuseEpiloguesBase;
  void runOnOperation() override;
};

/// Whether `op`, between `from` and its bias add, writes only buffers
/// allocated after `from` (so the GEMM may run after it).
bool writesOnlyFresh(Operation *op, Operation *from) {
  if (isa<rk::AllocOp>(op))
    return true;
  auto effects = dyn_cast<MemoryEffectOpInterface>(op);
  if (!effects || op->getNumRegions() != 0)
    return false;
  SmallVector<MemoryEffects::EffectInstance> list;
  effects.getEffects(list);
  for (const MemoryEffects::EffectInstance &e : list) {
    if (!isa<MemoryEffects::Write>(e.getEffect()))
      continue;
    Value v = e.getValue();
    auto alloc = v ? v.getDefiningOp<rk::AllocOp>() : rk::AllocOp();
    if (!alloc || alloc->getBlock() != from->getBlock() ||
        !from->isBeforeInBlock(alloc))
      return false;
  }
  return true;
}

/// The bias add that is the only reader of mm's product, when the pair
/// can be one rank.matmul_bias; null otherwise.
rk::BiasAddOp fusableAdd(rk::MatmulOp mm) {
  if (mm.getAccumulate())
    return {};
  Value product = mm.getOut();
  auto alloc = product.getDefiningOp<rk::AllocOp>();
  if (!alloc)
    return {};
  rk::BiasAddOp add;
  for (Operation *user : product.getUsers()) {
    if (user == mm.getOperation())
      continue;
    auto b = dyn_cast<rk::BiasAddOp>(user);
    if (!b || add || b.getLhs() != product || b.getRhs() == product ||
        b.getOut() == product || b->getBlock() != mm->getBlock() ||
        !mm->isBeforeInBlock(b))
      return {};
    add = b;
  }
  // The fused GEMM writes the add's output while it reads its inputs.
  if (!add || add.getOut() == mm.getLhs() || add.getOut() == mm.getRhs())
    return {};
  auto out = cast<MemRefType>(add.getOut().getType());
  auto bias = cast<MemRefType>(add.getRhs().getType());
  if (out != cast<MemRefType>(product.getType()) || bias.getRank() != 1 ||
      bias.getDimSize(0) != out.getDimSize(out.getRank() - 1) ||
      bias.getElementType() != out.getElementType())
    return {};
  for (Operation *op = mm->getNextNode(); op != add.getOperation();
       op = op->getNextNode())
    if (!writesOnlyFresh(op, mm))
      return {};
  return add;
}

/// The rank.gelu that reads mm's result next, when the GELU can join the
/// epilogue; null otherwise.
rk::GeluOp fusableGelu(rk::MatmulBiasOp mm) {
  Value pre = mm.getOut();
  // pre is a buffer of its own (no view of it, or of what it views, can
  // be read in between), and the gelu is its first reader after mm.
  if (!pre.getDefiningOp<rk::AllocOp>())
    return {};
  Operation *next = nullptr;
  for (Operation *user : pre.getUsers()) {
    if (user == mm.getOperation())
      continue;
    Operation *at = mm->getBlock()->findAncestorOpInBlock(*user);
    if (!at || !mm->isBeforeInBlock(at))
      return {}; // a view made earlier, or a use we cannot place
    if (!next || at->isBeforeInBlock(next))
      next = at;
  }
  auto gelu = dyn_cast_or_null<rk::GeluOp>(next);
  if (!gelu || gelu.getInput() != pre || gelu.getOut() == pre ||
      gelu.getOut().getType() != pre.getType() ||
      llvm::is_contained({mm.getLhs(), mm.getRhs(), mm.getBias()},
                         gelu.getOut()))
    return {};
  for (Operation *op = mm->getNextNode(); op != gelu.getOperation();
       op = op->getNextNode())
    if (!writesOnlyFresh(op, mm) || llvm::is_contained(op->getOperands(), pre))
      return {};
  return gelu;
}
} // namespace

void FuseEpiloguesPass::runOnOperation() {
  if (target != "cuda")
    return;
  SmallVector<rk::MatmulOp> matmuls;
  getOperation().walk([&](rk::MatmulOp mm) { matmuls.push_back(mm); });
  for (rk::MatmulOp mm : matmuls) {
    rk::BiasAddOp add = fusableAdd(mm);
    if (!add)
      continue;
    OpBuilder builder(add);
    auto fused = rk::MatmulBiasOp::create(
        builder, mm.getLoc(), mm.getLhs(), mm.getRhs(), add.getRhs(),
        add.getOut(), mm.getTransposeLhsAttr(), mm.getTransposeRhsAttr());
    fused->setDiscardableAttrs(mm->getDiscardableAttrDictionary());
    Operation *alloc = mm.getOut().getDefiningOp();
    add.erase();
    mm.erase();
    if (alloc->use_empty())
      alloc->erase();
    rk::GeluOp gelu = fusableGelu(fused);
    if (!gelu)
      continue;
    builder.setInsertionPoint(gelu);
    auto withGelu = rk::MatmulBiasGeluOp::create(
        builder, fused.getLoc(), fused.getLhs(), fused.getRhs(),
        fused.getBias(), fused.getOut(), gelu.getOut(),
        fused.getTransposeLhsAttr(), fused.getTransposeRhsAttr());
    withGelu->setDiscardableAttrs(fused->getDiscardableAttrDictionary());
    gelu.erase();
    fused.erase();
  }
}
