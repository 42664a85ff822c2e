//===- KeepParamCopies.cpp - 16-bit weights written by the optimizer -----===//
//
// Mixed precision keeps fp32 master weights and runs the model on 16-bit
// copies of them: plan-mixed-precision casts each weight where the forward
// reads it, and the backward, whose copies the memory plan does not keep
// alive, casts it again. For GPT-2 124M that is 273 casts a step (the LM
// head's 38.6M-element table three times), each a pass over the fp32
// weight and a launch of its own, for copies that change only when the
// optimizer writes the weight.
//
// So, as Megatron and llm.c keep their bf16 weights, each such parameter of
// @plan_step gets a copy kept across steps (rank.param_decl `copy`), read
// through rank.param_copy where the casts' buffers were read; its optimizer
// update (rank.adamw_update / rank.sgd_update `copy`) rounds the updated
// value into it in the same pass over the weight, and planrt rounds it
// again whenever it sets the parameter otherwise (start, --resume,
// --init-from). The evaluation function (@plan_forward) reads the same
// copies. The rounding is the cast's, so the bits do not change. The cost
// is memory: the copies live across steps (2 bytes per parameter, counted
// in the parameters' bytes), where the casts' buffers lived in the arena for
// part of the step.
//
// A parameter keeps a copy when, in @plan_step:
// - one optimizer update writes it, whole, and nothing else does;
// - it is cast, whole, into fresh buffers of one 16-bit type that nothing
//   but the cast writes, all before the update.
// Not under ZeRO: there a 16-bit plan's parameter is this rank's 1/dp shard
// of the fp32 weight, cast and then gathered at each use, so the casts are
// 1/dp of the work, and a plan asks for ZeRO to save memory, which copies
// held across steps would spend (GPT-3 175B on 80 GB H100s,
// examples/megatron/dgxc-175b-h100.plan: 2.8 GB more).
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace planc {
#define GEN_PASS_DEF_KEEPPARAMCOPIES
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;

namespace {
struct KeepParamCopiesPass
    : public planc::impl::KeepParamCopiesBase<KeepParamCopiesPass> {
  using KeepParamCopiesBase::KeepParamCopiesBase;
  void runOnOperation() override;
};

/// Whether `op` writes `root` or a view of it. An op whose effects are not
/// known counts as writing what it touches.
bool writes(Operation *op, Value root) {
  auto effects = dyn_cast<MemoryEffectOpInterface>(op);
  if (!effects)
    return llvm::any_of(op->getOperands(),
                        [&](Value o) { return rk::viewRoot(o) == root; });
  SmallVector<MemoryEffects::EffectInstance> list;
  effects.getEffects(list);
  return llvm::any_of(list, [&](const MemoryEffects::EffectInstance &e) {
    return isa<MemoryEffects::Write>(e.getEffect()) && e.getValue() &&
           rk::viewRoot(e.getValue()) == root;
  });
}

/// The ops of a function in program order, and the ops that touch each
/// buffer (its value or a view of it).
struct Touches {
  DenseMap<Operation *, int64_t> order;
  DenseMap<Value, SmallVector<Operation *>> ops;
  explicit Touches(func::FuncOp fn) {
    fn.walk([&](Operation *op) {
      order[op] = int64_t(order.size());
      for (Value operand : op->getOperands()) {
        SmallVector<Operation *> &list = ops[rk::viewRoot(operand)];
        if (list.empty() || list.back() != op)
          list.push_back(op);
      }
    });
  }
  /// Whether every op that touches `buffer` (a cast's) comes before `op`.
  bool allBefore(Value buffer, Operation *op) const {
    auto it = ops.find(buffer);
    return it == ops.end() || llvm::all_of(it->second, [&](Operation *t) {
             return order.lookup(t) < order.lookup(op);
           });
  }
};

/// The cast of `param` into a fresh buffer that nothing else writes, also
/// through a view; null if `op` is not one.
rk::CastOp castOfParam(Operation *op, Value param, const Touches &touches) {
  auto c = dyn_cast<rk::CastOp>(op);
  if (!c || c.getInput() != param || !c.getOut().getDefiningOp<rk::AllocOp>())
    return {};
  auto it = touches.ops.find(c.getOut());
  if (it != touches.ops.end())
    for (Operation *t : it->second)
      if (t != op && !isa<rk::DeallocOp>(t) && writes(t, c.getOut()))
        return {};
  return c;
}

/// What a parameter of one function reads: its casts, and (in @plan_step)
/// its update.
struct Uses {
  SmallVector<rk::CastOp> casts;
  Operation *update = nullptr;
  bool ok = true;
};

/// The casts (and update) of each parameter of `fn`, in program order.
DenseMap<Value, Uses> usesOf(func::FuncOp fn, const Touches &touches) {
  DenseMap<Value, Uses> uses;
  fn.walk([&](rk::ParamOp p) { uses[p.getResult()]; });
  fn.walk([&](Operation *op) {
    for (Value operand : op->getOperands()) {
      auto it = uses.find(rk::viewRoot(operand));
      if (it == uses.end())
        continue;
      Uses &u = it->second;
      Value param = it->first;
      if (rk::CastOp c = castOfParam(op, param, touches)) {
        // A cast after the update would read the new weight.
        if (u.update)
          u.ok = false;
        else if (!llvm::is_contained(u.casts, c))
          u.casts.push_back(c);
        continue;
      }
      if (!writes(op, param))
        continue;
      bool update = isa<rk::AdamWUpdateOp, rk::SgdUpdateOp>(op) &&
                    op->getOperand(0) == param && !u.update;
      if (update)
        u.update = op;
      else if (u.update != op)
        u.ok = false;
    }
  });
  return uses;
}

/// The 16-bit element type all of `casts` write; null if they differ.
Type castType(ArrayRef<rk::CastOp> casts) {
  Type t;
  for (rk::CastOp c : casts) {
    Type e = c.getOut().getType().getElementType();
    if (!(e.isBF16() || e.isF16()) || (t && t != e))
      return {};
    t = e;
  }
  return t;
}

/// Replaces each cast's buffer with `copy` and erases the cast, its
/// allocation and deallocations.
void readCopy(ArrayRef<rk::CastOp> casts, Value copy) {
  for (rk::CastOp c : casts) {
    auto alloc = c.getOut().getDefiningOp<rk::AllocOp>();
    c.erase();
    for (Operation *user : llvm::make_early_inc_range(alloc->getUsers()))
      if (isa<rk::DeallocOp>(user))
        user->erase();
    alloc.getResult().replaceAllUsesWith(copy);
    alloc.erase();
  }
}

/// A rank.param_copy of `p`'s parameter, after it.
Value copyOf(rk::ParamOp p, Type elem) {
  OpBuilder b(p->getContext());
  b.setInsertionPointAfter(p);
  auto copy = rk::ParamCopyOp::create(
      b, p.getLoc(), MemRefType::get(p.getType().getShape(), elem),
      p.getNameAttr());
  copy->setDiscardableAttrs(p->getDiscardableAttrDictionary());
  return copy;
}
} // namespace

void KeepParamCopiesPass::runOnOperation() {
  if (!enabled)
    return;
  ModuleOp module = getOperation();
  auto step = module.lookupSymbol<func::FuncOp>("plan_step");
  if (!step)
    return;
  for (auto par : module.getOps<plan::ParallelOp>())
    if (par.getZeroStage() > 0)
      return;
  SymbolTable symbols(module);
  auto bytes = step->getAttrOfType<DenseI64ArrayAttr>(rk::kExpectedBytesAttr);
  SmallVector<int64_t> expected(bytes ? bytes.asArrayRef()
                                      : ArrayRef<int64_t>());
  // Parameters with copies: name -> the copy's element type.
  llvm::StringMap<Type> kept;
  Touches touches(step);
  DenseMap<Value, Uses> uses = usesOf(step, touches);
  // In program order, so the IR does not depend on the map's order.
  SmallVector<rk::ParamOp> params;
  step.walk([&](rk::ParamOp p) { params.push_back(p); });
  for (rk::ParamOp p : params) {
    Uses &u = uses[p.getResult()];
    Type elem = castType(u.casts);
    if (!u.ok || !u.update || u.casts.empty() || !elem)
      continue;
    // The casts' buffers are read before the update writes the copy.
    if (!llvm::all_of(u.casts, [&](rk::CastOp c) {
          return touches.allBefore(c.getOut(), u.update);
        }))
      continue;
    auto decl = symbols.lookup<rk::ParamDeclOp>(p.getName());
    if (!decl || decl.getCopyAttr() || decl.getType() != p.getType())
      continue;
    decl.setCopyAttr(TypeAttr::get(elem));
    kept[p.getName()] = elem;
    Value copy = copyOf(p, elem);
    readCopy(u.casts, copy);
    if (auto aw = dyn_cast<rk::AdamWUpdateOp>(u.update))
      aw.getCopyMutable().assign(copy);
    else
      cast<rk::SgdUpdateOp>(u.update).getCopyMutable().assign(copy);
    // The runtime's parameter bytes (per pipeline coordinate: stage
    // modulo their count; every coordinate for stage -1, a weight tied
    // across stages) include the copy.
    int64_t coords = int64_t(expected.size()) / 3;
    auto stageAttr = decl->getAttrOfType<IntegerAttr>(rk::kRankStageAttr);
    int64_t stage = stageAttr ? stageAttr.getInt() : -1;
    int64_t add = p.getType().getNumElements() * 2;
    for (int64_t c = 0; c < coords; ++c)
      if (stage < 0 || stage % coords == c)
        expected[3 * c] += add;
  }
  if (bytes)
    step->setAttr(rk::kExpectedBytesAttr,
                  DenseI64ArrayAttr::get(&getContext(), expected));

  // Evaluation reads the same copies (valid between steps).
  auto forward = module.lookupSymbol<func::FuncOp>("plan_forward");
  if (!forward || kept.empty())
    return;
  Touches fwdTouches(forward);
  DenseMap<Value, Uses> fwdUses = usesOf(forward, fwdTouches);
  SmallVector<rk::ParamOp> fwdParams;
  forward.walk([&](rk::ParamOp p) { fwdParams.push_back(p); });
  for (rk::ParamOp p : fwdParams) {
    auto it = kept.find(p.getName());
    if (it == kept.end())
      continue;
    Uses &u = fwdUses[p.getResult()];
    if (!u.ok || u.update || u.casts.empty() || castType(u.casts) != it->second)
      continue;
    readCopy(u.casts, copyOf(p, it->second));
  }
}
