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
// The backward has the mirror images. The GEMM of GELU's output gradient
// (dh = dy W2^T) is read only by rank.gelu_grad (dpre = dh gelu'(pre)):
// rank.matmul_dgelu applies the derivative in the epilogue
// (CUBLASLT_EPILOGUE_DGELU, reading the pre-activation the forward's
// epilogue wrote), at the gelu_grad's place, and dh is never written. A
// linear layer's bias gradient (rank.bias_grad: column sums of dy, a pass
// of its own over dy) and its weight gradient (x^T dy, dy not transposed,
// not accumulating) read the same dy: rank.matmul_bias_grad sums dy's rows
// as the GEMM reads them (CUBLASLT_EPILOGUE_BGRADA), at the later op's
// place; the ops between may not write what the earlier one reads or
// touch what it writes.
//
// The LM head's GEMM feeds the loss: rank.cross_entropy reads the logits
// (fp32, even in a 16-bit plan, where the GEMM widens its output for the
// fp32 loss), then rank.cross_entropy_grad reads them again and writes the
// gradient the backward GEMMs read into a buffer of its own. For GPT-2 (B
// 16, T 1024, 50304 classes) that is a 3.3 GB buffer written once and read
// five times (the loss's two passes, the gradient's three), and a 1.6 GB
// one. On the cuda target the two become rank.cross_entropy_in_place: the
// GEMM writes the logits in the gradient's type (bf16: cuBLASLt rounds its
// fp32 accumulators once), and one kernel per row computes the loss and
// writes the gradient over the logits, which nothing reads afterwards. The
// loss's statistics stay fp32, from bf16 logits, as PyTorch's autocast
// computes them. The fused op sits at the loss's place; the logits'
// observers (--dump-step0) move before it. With fp32 (or fp16, whose loss
// gradient stays fp32 for the loss scale) the gradient is written over the
// fp32 logits. Not for a classifier, whose accuracy reads the logits.
//
// The residual stream's gradient meets each norm's input gradient in a
// rank.add (dx_stream + dx_norm into a fresh buffer: 24 a step for GPT-2,
// each three passes over B T C). Where that add is the norm gradient's
// input-gradient's only reader, the norm's backward kernel adds the other
// operand as it writes dx (rank.layernorm_grad / rmsnorm_grad ... plus %r),
// at the add's place when the norm's backward can move down to it (past
// ops that write only fresh buffers and touch neither its parameters'
// gradients nor the add's output), else at the norm's place (see
// fusableNormResidual). fp32 on the host gives the same bits; 16-bit rounds
// once instead of twice (and nvcc may contract the add into the multiply).
//
// The host keeps every pair: planrt would run the separate ops there
// anyway, and its 16-bit bits (the product rounded before the add, fp32
// logits) stay what every test expects.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Dominance.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace planc {
#define GEN_PASS_DEF_FUSEEPILOGUES
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;
using rk::viewRoot;

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

/// Whether buffers a and b may share elements (views of one buffer whose
/// ranges overlap, or may).
bool overlap(Value a, Value b) {
  return rk::extentOf(a).overlaps(rk::extentOf(b));
}

/// Whether `op` (between an op that moves and the place it lands) may read
/// or write elements of `v`. A view (a pure op) accesses nothing.
bool touches(Operation *op, Value v) {
  if (isPure(op))
    return false;
  return llvm::any_of(op->getOperands(), [&](Value o) {
    return isa<MemRefType>(o.getType()) && overlap(o, v);
  });
}

/// The bias add that is the only reader of mm's product, when the pair
/// can be one rank.matmul_bias; null otherwise.
rk::BiasAddOp fusableAdd(rk::MatmulOp mm) {
  if (mm.getAccumulate() || mm.getResidual())
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
/// Erases `alloc`'s deallocations, and the allocation itself once nothing
/// else uses it: a buffer a fusion no longer writes.
void dropBuffer(Operation *alloc) {
  for (Operation *user : llvm::make_early_inc_range(alloc->getUsers()))
    if (isa<rk::DeallocOp>(user))
      user->erase();
  if (alloc->use_empty())
    alloc->erase();
}

/// The rank.add that is the only reader (besides deallocations) of
/// `value`, a buffer of its own that `producer` writes, with the add's other
/// operand, when the add writes a third buffer of value's type (as the
/// fused op's verifier asks) that none of `reads` is a view of; {null,
/// null} otherwise.
std::pair<Value, rk::AddOp> onlyAddOf(Operation *producer, Value value,
                                      ValueRange reads) {
  if (!value.getDefiningOp<rk::AllocOp>())
    return {};
  rk::AddOp add;
  for (Operation *user : value.getUsers()) {
    if (user == producer || isa<rk::DeallocOp>(user))
      continue;
    auto a = dyn_cast<rk::AddOp>(user);
    if (!a || add || a->getBlock() != producer->getBlock() ||
        !producer->isBeforeInBlock(a))
      return {};
    add = a;
  }
  if (!add || add.getLhs() == add.getRhs() || add.getOut() == value)
    return {};
  Value other = add.getLhs() == value ? add.getRhs() : add.getLhs();
  Value out = add.getOut();
  if (other.getType() != value.getType() || out.getType() != value.getType() ||
      viewRoot(other) == viewRoot(out) || llvm::any_of(reads, [&](Value v) {
        return viewRoot(v) == viewRoot(out);
      }))
    return {};
  return {other, add};
}

/// The rank.add that is the only reader of mm's product (onlyAddOf), with
/// the other operand: the residual stream's add after an attention or MLP
/// output projection (rank.matmul_bias, or an unbiased rank.matmul);
/// {null, null} if none can join. The fused GEMM runs at the add's place,
/// so nothing between may write what it reads; its output is the add's.
template <class Gemm>
std::pair<Value, rk::AddOp> fusableResidual(Gemm mm, ValueRange reads) {
  if (mm.getResidual())
    return {};
  auto [residual, add] = onlyAddOf(mm, mm.getOut(), reads);
  if (!add)
    return {};
  for (Operation *op = mm->getNextNode(); op != add.getOperation();
       op = op->getNextNode())
    if (!writesOnlyFresh(op, mm) || touches(op, add.getOut()))
      return {};
  return {residual, add};
}

/// Whether `op` may write (or free) the buffer `v` is a view of: its
/// declared effects, or, without them, whether it takes that buffer.
bool mayWrite(Operation *op, Value v) {
  auto effects = dyn_cast<MemoryEffectOpInterface>(op);
  if (!effects || op->getNumRegions() != 0)
    return touches(op, v);
  SmallVector<MemoryEffects::EffectInstance> list;
  effects.getEffects(list);
  return llvm::any_of(list, [&](const MemoryEffects::EffectInstance &e) {
    return isa<MemoryEffects::Write, MemoryEffects::Free>(e.getEffect()) &&
           (!e.getValue() || !isa<MemRefType>(e.getValue().getType()) ||
            overlap(e.getValue(), v));
  });
}

/// A norm gradient's input gradient and the rank.add that joins it to the
/// residual stream's gradient (`residual`), and where the fused op goes.
struct NormResidual {
  Value residual;
  rk::AddOp add;
  bool atNorm = false; // at the norm's place (else at the add's)
};

/// The rank.add that is the only reader (besides deallocations) of a norm
/// gradient's input gradient, with the add's other operand: the residual
/// stream's gradient; no add if it cannot join the norm's backward. The
/// fused op runs at the add's place when the ops between write only fresh
/// buffers and touch neither the norm's parameters' gradients (they would
/// read them before they are written) nor the add's output (a single
/// microbatch on one rank). Otherwise (the parameter gradients' all-reduce
/// starts in between, or a microbatch's accumulation reads them) it runs
/// at the norm's place, when the residual and the output exist there (the
/// output's allocation moves up) and nothing between writes the residual
/// or touches the output.
template <class NormGrad>
NormResidual fusableNormResidual(NormGrad g, ValueRange paramGrads,
                                 DominanceInfo &dom) {
  if (g.getResidual())
    return {};
  SmallVector<Value> reads = {g.getInput(), g.getGamma(), g.getGrad()};
  reads.append(paramGrads.begin(), paramGrads.end());
  auto [residual, add] = onlyAddOf(g, g.getInputGrad(), reads);
  if (!add)
    return {};
  Value out = add.getOut();
  bool down = true, up = true;
  auto outAlloc = out.getDefiningOp<rk::AllocOp>();
  bool outMoves = outAlloc && outAlloc->getBlock() == g->getBlock() &&
                  g->isBeforeInBlock(outAlloc);
  if (!dom.properlyDominates(residual, g) ||
      !(outMoves || dom.properlyDominates(out, g)))
    up = false;
  for (Operation *op = g->getNextNode(); op != add.getOperation();
       op = op->getNextNode()) {
    if (op == outAlloc.getOperation())
      continue;
    if (touches(op, out))
      return {};
    if (!writesOnlyFresh(op, g) ||
        llvm::any_of(paramGrads, [&](Value v) { return touches(op, v); }))
      down = false;
    if (mayWrite(op, residual))
      up = false;
  }
  if (!down && !up)
    return {};
  return {residual, add, !down};
}

/// Replaces norm gradient g and the add that reads its input gradient with
/// one op of g's kind (fusableNormResidual said they can, and where), built
/// by `make(builder, residual, out)`.
template <class NormGrad, class Make>
void fuseNormResidual(NormGrad g, NormResidual f, const Make &make) {
  Value out = f.add.getOut();
  OpBuilder builder(f.add);
  if (f.atNorm) {
    if (auto outAlloc = out.getDefiningOp<rk::AllocOp>();
        outAlloc && outAlloc->getBlock() == g->getBlock() &&
        g->isBeforeInBlock(outAlloc))
      outAlloc->moveBefore(g);
    builder.setInsertionPoint(g);
  }
  Operation *fused = make(builder, f.residual, out);
  fused->setDiscardableAttrs(g->getDiscardableAttrDictionary());
  Operation *dx = g.getInputGrad().getDefiningOp();
  f.add.erase();
  g.erase();
  dropBuffer(dx);
}

/// The LM head's loss and its gradient (and the GEMM writing the logits),
/// when they can be one rank.cross_entropy_in_place over `buffer`.
struct InPlaceLoss {
  rk::MatmulOp mm;
  rk::CrossEntropyOp loss;
  SmallVector<rk::ObserveOp> observers;
  Value buffer; // the logits, or the gradient's 16-bit buffer
};

std::optional<InPlaceLoss> fusableLoss(rk::CrossEntropyGradOp grad) {
  Value logits = grad.getLogits(), targets = grad.getTargets();
  Block *block = grad->getBlock();
  auto alloc = logits.getDefiningOp<rk::AllocOp>();
  if (!alloc || alloc->getBlock() != block)
    return std::nullopt;
  // The logits' only users: the GEMM writing them, the loss, the gradient
  // and observers, in this block.
  InPlaceLoss f;
  for (Operation *user : logits.getUsers()) {
    if (user == grad.getOperation())
      continue;
    if (user->getBlock() != block)
      return std::nullopt;
    if (auto mm = dyn_cast<rk::MatmulOp>(user);
        mm && !f.mm && mm.getOut() == logits && mm.getLhs() != logits &&
        mm.getRhs() != logits && !mm.getAccumulate() && !mm.getResidual())
      f.mm = mm;
    else if (auto ce = dyn_cast<rk::CrossEntropyOp>(user);
             ce && !f.loss && ce.getLogits() == logits)
      f.loss = ce;
    else if (auto o = dyn_cast<rk::ObserveOp>(user))
      f.observers.push_back(o);
    else
      return std::nullopt;
  }
  if (!f.mm || !f.loss || f.loss.getTargets() != targets ||
      f.loss.getValidClasses() != grad.getValidClasses() ||
      !f.mm->isBeforeInBlock(f.loss) || !f.loss->isBeforeInBlock(grad))
    return std::nullopt;
  for (rk::ObserveOp o : f.observers)
    if (!f.mm->isBeforeInBlock(o) || !o->isBeforeInBlock(grad))
      return std::nullopt;
  // The gradient's buffer: the logits' type (in place on them), or the
  // GEMM's 16-bit operand type (the GEMM writes into it). Nothing uses it
  // before the gradient.
  // The gradient's buffer is a fresh one of this block: a view of another
  // (or an argument) would keep its old contents once the gradient lives
  // only in the logits.
  Value out = grad.getOut();
  auto outAlloc = out.getDefiningOp<rk::AllocOp>();
  if (!outAlloc || outAlloc->getBlock() != block)
    return std::nullopt;
  auto lt = cast<MemRefType>(logits.getType());
  auto gt = cast<MemRefType>(out.getType());
  Type half = cast<MemRefType>(f.mm.getLhs().getType()).getElementType();
  if (gt == lt)
    f.buffer = logits;
  else if (gt.getShape() == lt.getShape() && gt.getElementType() == half &&
           !half.isF32() &&
           cast<MemRefType>(f.mm.getRhs().getType()).getElementType() == half)
    f.buffer = out;
  else
    return std::nullopt;
  for (Operation *user : out.getUsers()) {
    Operation *at = block->findAncestorOpInBlock(*user);
    if (user != grad.getOperation() && (!at || !grad->isBeforeInBlock(at)))
      return std::nullopt;
  }
  // Between the loss and its gradient, which now run together: nothing
  // but writes to fresh buffers, and none of them the targets or the buffer
  // they are a view of.
  for (Operation *op = f.loss->getNextNode(); op != grad.getOperation();
       op = op->getNextNode())
    if (!writesOnlyFresh(op, f.mm) || touches(op, targets))
      return std::nullopt;
  // A classifier counts its correct rows from the logits (planrt).
  auto fn = grad->getParentOfType<func::FuncOp>();
  if (!fn || rk::classifierClasses(grad->getParentOfType<ModuleOp>(), fn) != 0)
    return std::nullopt;
  return f;
}

void fuseLoss(rk::CrossEntropyGradOp grad, InPlaceLoss &f) {
  Value logits = grad.getLogits(), out = grad.getOut();
  if (f.buffer != logits) {
    out.getDefiningOp()->moveBefore(f.mm);
    f.mm.getOutMutable().assign(f.buffer);
  }
  for (rk::ObserveOp o : f.observers) {
    o.getBufferMutable().assign(f.buffer);
    o->moveBefore(f.loss);
  }
  OpBuilder b(f.loss);
  auto fused = rk::CrossEntropyInPlaceOp::create(
      b, f.loss.getLoc(), f.buffer, f.loss.getTargets(), f.loss.getOut(),
      f.loss.getScaleAttr(), grad.getScaleAttr(), f.loss.getValidClassesAttr());
  fused->setDiscardableAttrs(f.loss->getDiscardableAttrDictionary());
  grad.erase();
  f.loss.erase();
  if (f.buffer == logits)
    out.replaceAllUsesWith(logits);
  for (Value v : {logits, out})
    if (Operation *alloc = v.getDefiningOp(); alloc && alloc->use_empty())
      alloc->erase();
}

/// Whether v can exist before `at`: it does (dominance), or an allocation
/// or a pure view in at's block after it defines v from values that can
/// (hoistDefs then moves those definitions above `at`).
bool hoistable(Value v, Operation *at, DominanceInfo &dom, int depth = 0) {
  if (dom.properlyDominates(v, at))
    return true;
  Operation *def = v.getDefiningOp();
  if (!def || depth > 4 || def->getBlock() != at->getBlock() ||
      !at->isBeforeInBlock(def) || def->getNumRegions() != 0 ||
      !(isa<rk::AllocOp>(def) || isPure(def)))
    return false;
  return llvm::all_of(def->getOperands(), [&](Value o) {
    return hoistable(o, at, dom, depth + 1);
  });
}
void hoistDefs(Value v, Operation *at) {
  Operation *def = v.getDefiningOp();
  if (!def || def->getBlock() != at->getBlock() || !at->isBeforeInBlock(def))
    return;
  for (Value o : def->getOperands())
    hoistDefs(o, at);
  def->moveBefore(at);
}

/// The rank.gelu_grad that is the only reader of mm's product (as its
/// output gradient), when the pair can be one rank.matmul_dgelu, and
/// where: at the gelu_grad's place when nothing between writes what the
/// GEMM reads or touches pre or the output; else (an accumulating weight
/// gradient's GEMM in between, with microbatches) at the GEMM's place, when
/// pre and the output exist there (the output's allocation moves up) and
/// nothing between writes pre or touches the output.
struct DgeluFusion {
  rk::GeluGradOp grad;
  bool atMatmul = false;
};
DgeluFusion fusableDgelu(rk::MatmulOp mm, DominanceInfo &dom) {
  if (mm.getAccumulate() || mm.getResidual())
    return {};
  Value product = mm.getOut();
  auto alloc = product.getDefiningOp<rk::AllocOp>();
  if (!alloc || alloc->getBlock() != mm->getBlock())
    return {};
  rk::GeluGradOp grad;
  for (Operation *user : product.getUsers()) {
    if (user == mm.getOperation())
      continue;
    auto g = dyn_cast<rk::GeluGradOp>(user);
    if (!g || grad || g.getRhs() != product || g.getLhs() == product ||
        g->getBlock() != mm->getBlock() || !mm->isBeforeInBlock(g))
      return {};
    grad = g;
  }
  if (!grad)
    return {};
  // The fused GEMM reads pre and writes the gradient's output (the
  // product's buffer or another) while it reads its operands.
  Value pre = grad.getLhs(), out = grad.getOut();
  if (pre.getType() != out.getType() || out.getType() != product.getType() ||
      llvm::any_of(ValueRange{pre, mm.getLhs(), mm.getRhs()},
                   [&](Value v) { return overlap(v, out); }))
    return {};
  bool atGrad = true, atMatmul = hoistable(pre, mm, dom) &&
                                 (out == product || hoistable(out, mm, dom));
  for (Operation *op = mm->getNextNode(); op != grad.getOperation();
       op = op->getNextNode()) {
    const bool touchesOut = out != product && touches(op, out);
    if (!writesOnlyFresh(op, mm) || touches(op, pre) || touchesOut)
      atGrad = false;
    if (op != out.getDefiningOp() && (mayWrite(op, pre) || touchesOut))
      atMatmul = false;
  }
  if (!atGrad && !atMatmul)
    return {};
  return {grad, !atGrad};
}

/// The weight-gradient GEMM (x^T dy, dy not transposed) that reads the
/// bias gradient's dy, when the two can be one rank.matmul_bias_grad, and
/// where it runs.
struct BiasGradFusion {
  rk::MatmulOp mm;
  bool atFirst = false; // at the earlier op's place (else the later's)
};

/// The fused op runs at the later of the two when the ops between neither
/// write what the earlier one reads nor touch what it writes (one rank).
/// Otherwise (with dp, the earlier one's output is all-reduced in between)
/// at the earlier's place, when the later one's operands exist there (its
/// output's allocation or view moves up) and the ops between neither write
/// what the later one reads nor touch what it writes.
BiasGradFusion fusableBiasGrad(rk::BiasGradOp bg, DominanceInfo &dom) {
  Value dy = bg.getInput();
  auto db = cast<MemRefType>(bg.getOut().getType());
  auto dyType = cast<MemRefType>(dy.getType());
  if (db.getRank() != 1 ||
      db.getDimSize(0) != dyType.getDimSize(dyType.getRank() - 1))
    return {};
  rk::MatmulOp mm;
  for (Operation *user : dy.getUsers()) {
    auto m = dyn_cast<rk::MatmulOp>(user);
    if (m && !mm && m.getRhs() == dy && !m.getTransposeRhs() &&
        !m.getResidual() && m.getLhs() != dy && m->getBlock() == bg->getBlock())
      mm = m;
  }
  if (!mm)
    return {};
  // (Two ranges of one gradient bucket are two buffers.)
  Value outs[] = {mm.getOut(), bg.getOut()};
  if (overlap(outs[0], outs[1]) || llvm::any_of(outs, [&](Value o) {
        return overlap(o, dy) || overlap(o, mm.getLhs());
      }))
    return {};
  const bool mmFirst = mm->isBeforeInBlock(bg);
  Operation *first = mmFirst ? mm.getOperation() : bg.getOperation();
  Operation *second = mmFirst ? bg.getOperation() : mm.getOperation();
  Value firstOut = mmFirst ? outs[0] : outs[1];
  Value secondOut = mmFirst ? outs[1] : outs[0];
  SmallVector<Value> secondReads = {dy};
  if (!mmFirst)
    secondReads.push_back(mm.getLhs());
  // (An accumulating GEMM reads its output too: touching secondOut covers
  // it.)
  bool later = true, earlier = hoistable(secondOut, first, dom) &&
                               llvm::all_of(secondReads, [&](Value v) {
                                 return hoistable(v, first, dom);
                               });
  for (Operation *op = first->getNextNode(); op != second;
       op = op->getNextNode()) {
    if (!writesOnlyFresh(op, first) || touches(op, firstOut))
      later = false;
    if (op != secondOut.getDefiningOp() &&
        (touches(op, secondOut) ||
         llvm::any_of(secondReads, [&](Value v) { return mayWrite(op, v); })))
      earlier = false;
  }
  if (!later && !earlier)
    return {};
  return {mm, !later};
}
} // namespace

void FuseEpiloguesPass::runOnOperation() {
  if (target != "cuda")
    return;
  DominanceInfo dom(getOperation());
  SmallVector<rk::MatmulOp> matmuls;
  getOperation().walk([&](rk::MatmulOp mm) { matmuls.push_back(mm); });
  for (rk::MatmulOp mm : matmuls) {
    rk::BiasAddOp add = fusableAdd(mm);
    if (!add)
      continue;
    OpBuilder builder(add);
    auto fused = rk::MatmulBiasOp::create(
        builder, mm.getLoc(), mm.getLhs(), mm.getRhs(), add.getRhs(),
        /*residual=*/Value(), add.getOut(), mm.getTransposeLhsAttr(),
        mm.getTransposeRhsAttr());
    fused->setDiscardableAttrs(mm->getDiscardableAttrDictionary());
    Operation *alloc = mm.getOut().getDefiningOp();
    add.erase();
    mm.erase();
    if (alloc->use_empty())
      alloc->erase();
    rk::GeluOp gelu = fusableGelu(fused);
    if (!gelu) {
      // The residual add that reads the biased product: its other operand
      // becomes the GEMM's C matrix, at the add's place.
      auto [residual, sum] = fusableResidual(
          fused, {fused.getLhs(), fused.getRhs(), fused.getBias()});
      if (!sum)
        continue;
      builder.setInsertionPoint(sum);
      auto withResidual = rk::MatmulBiasOp::create(
          builder, fused.getLoc(), fused.getLhs(), fused.getRhs(),
          fused.getBias(), residual, sum.getOut(), fused.getTransposeLhsAttr(),
          fused.getTransposeRhsAttr());
      withResidual->setDiscardableAttrs(fused->getDiscardableAttrDictionary());
      Operation *product = fused.getOut().getDefiningOp();
      sum.erase();
      fused.erase();
      dropBuffer(product);
      continue;
    }
    builder.setInsertionPoint(gelu);
    auto withGelu = rk::MatmulBiasGeluOp::create(
        builder, fused.getLoc(), fused.getLhs(), fused.getRhs(),
        fused.getBias(), fused.getOut(), gelu.getOut(),
        fused.getTransposeLhsAttr(), fused.getTransposeRhsAttr());
    withGelu->setDiscardableAttrs(fused->getDiscardableAttrDictionary());
    gelu.erase();
    fused.erase();
  }
  // The backward: GELU's derivative in the GEMM of its output gradient.
  matmuls.clear();
  getOperation().walk([&](rk::MatmulOp mm) { matmuls.push_back(mm); });
  for (rk::MatmulOp mm : matmuls) {
    auto [grad, atMatmul] = fusableDgelu(mm, dom);
    if (!grad)
      continue;
    OpBuilder builder(grad);
    if (atMatmul) {
      hoistDefs(grad.getLhs(), mm);
      hoistDefs(grad.getOut(), mm);
      builder.setInsertionPoint(mm);
    }
    auto fused = rk::MatmulDgeluOp::create(
        builder, mm.getLoc(), mm.getLhs(), mm.getRhs(), grad.getLhs(),
        grad.getOut(), mm.getTransposeLhsAttr(), mm.getTransposeRhsAttr());
    fused->setDiscardableAttrs(mm->getDiscardableAttrDictionary());
    Operation *alloc = mm.getOut().getDefiningOp();
    grad.erase();
    mm.erase();
    if (alloc->use_empty())
      alloc->erase();
  }
  // A linear layer's bias gradient in its weight gradient's GEMM.
  SmallVector<rk::BiasGradOp> biasGrads;
  getOperation().walk([&](rk::BiasGradOp bg) { biasGrads.push_back(bg); });
  for (rk::BiasGradOp bg : biasGrads) {
    auto [mm, atFirst] = fusableBiasGrad(bg, dom);
    if (!mm)
      continue;
    const bool mmFirst = mm->isBeforeInBlock(bg);
    Operation *at = mmFirst == atFirst ? mm.getOperation() : bg.getOperation();
    if (atFirst) { // the later op's operands, defined above it
      hoistDefs(mmFirst ? bg.getOut() : mm.getOut(), at);
      hoistDefs(mm.getLhs(), at);
      hoistDefs(bg.getInput(), at);
    }
    OpBuilder builder(at);
    auto fused = rk::MatmulBiasGradOp::create(
        builder, mm.getLoc(), mm.getLhs(), mm.getRhs(), mm.getOut(),
        bg.getOut(), mm.getTransposeLhsAttr(), mm.getTransposeRhsAttr(),
        mm.getAccumulateAttr());
    fused->setDiscardableAttrs(mm->getDiscardableAttrDictionary());
    bg.erase();
    mm.erase();
  }
  // An unbiased projection's product that only feeds the residual stream's
  // add (Llama's output projections, or a gradient's sum of products): the
  // add's other operand as the GEMM's C.
  matmuls.clear();
  getOperation().walk([&](rk::MatmulOp mm) { matmuls.push_back(mm); });
  for (rk::MatmulOp mm : matmuls) {
    if (mm.getAccumulate())
      continue;
    auto [residual, sum] = fusableResidual(mm, {mm.getLhs(), mm.getRhs()});
    if (!sum)
      continue;
    OpBuilder builder(sum);
    auto fused = rk::MatmulOp::create(
        builder, mm.getLoc(), mm.getLhs(), mm.getRhs(), residual, sum.getOut(),
        mm.getTransposeLhsAttr(), mm.getTransposeRhsAttr(), UnitAttr());
    fused->setDiscardableAttrs(mm->getDiscardableAttrDictionary());
    Operation *product = mm.getOut().getDefiningOp();
    sum.erase();
    mm.erase();
    dropBuffer(product);
  }
  // The residual stream's gradient added where the norms' backward writes
  // their input gradient.
  SmallVector<Operation *> norms;
  getOperation().walk([&](Operation *op) {
    if (isa<rk::LayerNormGradOp, rk::RmsNormGradOp>(op))
      norms.push_back(op);
  });
  for (Operation *op : norms) {
    if (auto g = dyn_cast<rk::LayerNormGradOp>(op)) {
      NormResidual f =
          fusableNormResidual(g, {g.getGammaGrad(), g.getBetaGrad()}, dom);
      if (f.add)
        fuseNormResidual(g, f, [&](OpBuilder &b, Value r, Value o) {
          return rk::LayerNormGradOp::create(
                     b, g.getLoc(), g.getInput(), g.getGamma(), g.getGrad(), r,
                     o, g.getGammaGrad(), g.getBetaGrad(), g.getEpsAttr())
              .getOperation();
        });
    } else if (auto g = dyn_cast<rk::RmsNormGradOp>(op)) {
      NormResidual f = fusableNormResidual(g, {g.getGammaGrad()}, dom);
      if (f.add)
        fuseNormResidual(g, f, [&](OpBuilder &b, Value r, Value o) {
          return rk::RmsNormGradOp::create(b, g.getLoc(), g.getInput(),
                                           g.getGamma(), g.getGrad(), r, o,
                                           g.getGammaGrad(), g.getEpsAttr())
              .getOperation();
        });
    }
  }
  SmallVector<rk::CrossEntropyGradOp> losses;
  getOperation().walk([&](rk::CrossEntropyGradOp g) { losses.push_back(g); });
  for (rk::CrossEntropyGradOp grad : losses)
    if (std::optional<InPlaceLoss> f = fusableLoss(grad))
      fuseLoss(grad, *f);
}
