//===- Autodiff.cpp - Forward model to training step ----------------------===//
//
// Reverse-mode differentiation on the plan dialect. The forward function is
// straight-line code (the frontend unrolls blocks), so one backward sweep over
// the ops in reverse order with an adjoint per value is exact.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/TypeSwitch.h"

namespace planc {
#define GEN_PASS_DEF_AUTODIFF
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

namespace {

/// Adjoints of the values of one function, accumulated with plan.add.
class Adjoints {
public:
  explicit Adjoints(OpBuilder &b) : b(b) {}

  void add(Location loc, Value v, Value grad) {
    Value &slot = map[v];
    slot = slot ? AddOp::create(b, loc, grad.getType(), slot, grad).getResult()
                : grad;
  }
  Value lookup(Value v) const { return map.lookup(v); }

private:
  OpBuilder &b;
  DenseMap<Value, Value> map;
};

struct AutodiffPass : public planc::impl::AutodiffBase<AutodiffPass> {
  void runOnOperation() override;
};

} // namespace

/// Emits the operand adjoints of `op` given the adjoint `dy` of its result.
/// `needs(v)` says whether v depends on a parameter (only those get adjoints).
static LogicalResult backprop(Operation *op, Value dy, OpBuilder &b,
                              Adjoints &adj,
                              llvm::function_ref<bool(Value)> needs) {
  Location loc = op->getLoc();
  auto typeOf = [](Value v) { return v.getType(); };
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case<MatmulOp>([&](MatmulOp mm) {
        Value a = mm.getLhs(), bb = mm.getRhs();
        bool ta = mm.getTransposeLhs(), tb = mm.getTransposeRhs();
        auto mk = [&](Type t, Value l, Value r, bool tl, bool tr) {
          return MatmulOp::create(b, loc, t, l, r, tl, tr).getResult();
        };
        // C = op(A) op(B): d op(A) = dC op(B)^T and d op(B) = op(A)^T dC,
        // transposed back when the operand itself was used transposed.
        if (needs(a))
          adj.add(loc, a,
                  ta ? mk(typeOf(a), bb, dy, tb, true)
                     : mk(typeOf(a), dy, bb, false, !tb));
        if (needs(bb))
          adj.add(loc, bb,
                  tb ? mk(typeOf(bb), dy, a, true, ta)
                     : mk(typeOf(bb), a, dy, !ta, false));
        return success();
      })
      .Case<BiasAddOp>([&](BiasAddOp ba) {
        if (needs(ba.getInput()))
          adj.add(loc, ba.getInput(), dy);
        if (needs(ba.getBias()))
          adj.add(loc, ba.getBias(),
                  BiasGradOp::create(b, loc, typeOf(ba.getBias()), dy));
        return success();
      })
      .Case<AddOp>([&](AddOp add) {
        for (Value v : {add.getLhs(), add.getRhs()})
          if (needs(v))
            adj.add(loc, v, dy);
        return success();
      })
      .Case<ReluOp>([&](ReluOp r) {
        if (needs(r.getInput()))
          adj.add(loc, r.getInput(),
                  ReluGradOp::create(b, loc, typeOf(dy), r.getInput(), dy));
        return success();
      })
      .Case<GeluOp>([&](GeluOp g) {
        if (needs(g.getInput()))
          adj.add(loc, g.getInput(),
                  GeluGradOp::create(b, loc, typeOf(dy), g.getInput(), dy));
        return success();
      })
      .Default([&](Operation *other) {
        return other->emitError()
               << "planc cannot differentiate '" << other->getName() << "' yet";
      });
}

void AutodiffPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto trains = module.getOps<TrainOp>();
  SmallVector<func::FuncOp> models;
  for (auto f : module.getOps<func::FuncOp>())
    if (f->hasAttr(kModelAttr))
      models.push_back(f);
  if (models.size() != 1) {
    module.emitError() << "expected exactly one function marked '" << kModelAttr
                       << "', found " << models.size();
    return signalPassFailure();
  }
  if (trains.empty()) {
    module.emitError() << "expected a plan.train op with the optimizer "
                          "settings";
    return signalPassFailure();
  }
  TrainOp train = *trains.begin();
  func::FuncOp model = models.front();
  if (!model.getBody().hasOneBlock() || model.getNumResults() != 1) {
    model.emitError() << "the model must be one block returning the loss";
    return signalPassFailure();
  }

  // The step takes the model's arguments and returns the loss and the
  // updated parameters.
  auto kindOf = [&](unsigned i) {
    auto k = model.getArgAttrOfType<StringAttr>(i, kKindAttr);
    return k ? k.getValue() : StringRef();
  };
  SmallVector<unsigned> params;
  for (unsigned i = 0; i < model.getNumArguments(); ++i)
    if (kindOf(i) == "param")
      params.push_back(i);
  SmallVector<Type> resultTypes{model.getResultTypes()[0]};
  for (unsigned i : params)
    resultTypes.push_back(model.getArgumentTypes()[i]);

  OpBuilder b(module.getContext());
  b.setInsertionPointAfter(model);
  auto step = func::FuncOp::create(
      b, model.getLoc(), "train_step",
      b.getFunctionType(model.getArgumentTypes(), resultTypes));
  step->setAttr(kTrainStepAttr, b.getUnitAttr());
  step.setAllArgAttrs(model.getAllArgAttrs());
  Block *body = step.addEntryBlock();
  b.setInsertionPointToEnd(body);

  IRMapping mapping;
  mapping.map(model.getArguments(), step.getArguments());
  Operation *modelReturn = model.getBody().front().getTerminator();
  for (Operation &op : model.getBody().front().without_terminator())
    b.clone(op, mapping);
  Value loss = mapping.lookup(modelReturn->getOperand(0));

  if (!llvm::hasSingleElement(modelReturn->getOperand(0).getUses())) {
    modelReturn->emitError()
        << "the model's result must be a loss used by nothing else";
    return signalPassFailure();
  }
  auto lossOp = loss.getDefiningOp<MseLossOp>();
  if (!lossOp) {
    Operation *def = loss.getDefiningOp();
    (def ? def->emitError() : modelReturn->emitError())
        << "planc cannot differentiate the loss '"
        << (def ? def->getName().getStringRef() : StringRef("argument"))
        << "' yet; mse is supported";
    return signalPassFailure();
  }

  // Values that depend on a parameter: only they need adjoints.
  llvm::DenseSet<Value> active;
  for (unsigned i : params)
    active.insert(step.getArgument(i));
  for (Operation &op : body->getOperations())
    if (llvm::any_of(op.getOperands(),
                     [&](Value v) { return active.contains(v); }))
      active.insert(op.getResults().begin(), op.getResults().end());
  auto needs = [&](Value v) { return active.contains(v); };

  Adjoints adj(b);
  SmallVector<Operation *> forward;
  for (Operation &op : body->getOperations())
    forward.push_back(&op);
  // Seed: d loss / d prediction, with d loss = 1.
  if (needs(lossOp.getPrediction()))
    adj.add(lossOp.getLoc(), lossOp.getPrediction(),
            MseLossGradOp::create(b, lossOp.getLoc(),
                                  lossOp.getPrediction().getType(),
                                  lossOp.getPrediction(), lossOp.getTarget()));
  for (Operation *op : llvm::reverse(forward)) {
    if (op == lossOp || op->getNumResults() != 1)
      continue;
    Value dy = adj.lookup(op->getResult(0));
    if (!dy)
      continue;
    if (failed(backprop(op, dy, b, adj, needs)))
      return signalPassFailure();
  }

  SmallVector<Value> results{loss};
  for (unsigned i : params) {
    Value w = step.getArgument(i);
    Value g = adj.lookup(w);
    if (!g) {
      auto name = model.getArgAttrOfType<StringAttr>(i, kNameAttr);
      mlir::emitWarning(model.getLoc())
          << "parameter '" << (name ? name.getValue() : "?")
          << "' does not affect the loss; it is left untouched";
      results.push_back(w);
      continue;
    }
    auto f32 = [&](APFloat v) {
      bool lost;
      v.convert(APFloat::IEEEsingle(), APFloat::rmNearestTiesToEven, &lost);
      return b.getF32FloatAttr(v.convertToFloat());
    };
    Value updated;
    if (train.getOptimizer() == "adamw")
      updated = AdamWUpdateOp::create(
          b, w.getLoc(), w.getType(), w, g, f32(train.getLr()),
          f32(train.getBeta1()), f32(train.getBeta2()), f32(train.getEps()),
          f32(train.getWeightDecay()));
    else
      updated = SgdUpdateOp::create(b, w.getLoc(), w.getType(), w, g,
                                    f32(train.getLr()));
    results.push_back(updated);
  }
  func::ReturnOp::create(b, modelReturn->getLoc(), results);
}
