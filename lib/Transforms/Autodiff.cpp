//===- Autodiff.cpp - Forward model to training step ----------------------===//
//
// Reverse-mode differentiation on the plan dialect. The forward function is
// straight-line code (the frontend inlines blocks), so one backward sweep over
// the ops in reverse order with an adjoint per value is exact. After the
// sweep come the global gradient norm (always reported; used to clip when
// plan.train asks), then one optimizer update per parameter.
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

/// The gradients of C = op(A) op(B).
/// The attributes attention's gradient shares with it: the heads and the
/// dropout (the backward draws the forward's mask).
static SmallVector<NamedAttribute> attentionAttrs(AttentionOp at) {
  SmallVector<NamedAttribute> attrs;
  for (StringRef name : {"num_heads", "num_kv_heads", "dropout", "dropout_uid"})
    if (Attribute a = at->getAttr(name))
      attrs.push_back(NamedAttribute(name, a));
  return attrs;
}

static LogicalResult backpropMatmul(MatmulOp mm, Value dy, OpBuilder &b,
                                    Adjoints &adj,
                                    llvm::function_ref<bool(Value)> needs) {
  Location loc = mm.getLoc();
  Value a = mm.getLhs(), w = mm.getRhs();
  bool ta = mm.getTransposeLhs(), tb = mm.getTransposeRhs();
  auto mk = [&](Type t, Value l, Value r, bool tl, bool tr) {
    return MatmulOp::create(b, loc, t, l, r, tl, tr).getResult();
  };
  int64_t rankA = cast<RankedTensorType>(a.getType()).getRank();
  int64_t rankW = cast<RankedTensorType>(w.getType()).getRank();
  if (rankA == 2 && rankW == 2) {
    // d op(A) = dC op(B)^T and d op(B) = op(A)^T dC, transposed back when
    // the operand itself was used transposed.
    if (needs(a))
      adj.add(loc, a,
              ta ? mk(a.getType(), w, dy, tb, true)
                 : mk(a.getType(), dy, w, false, !tb));
    if (needs(w))
      adj.add(loc, w,
              tb ? mk(w.getType(), dy, a, true, ta)
                 : mk(w.getType(), a, dy, !ta, false));
    return success();
  }
  if (rankW != 2 || ta)
    return mm.emitError() << "planc cannot differentiate a matmul with a "
                             "batched or transposed left operand and a "
                             "batched right operand yet";
  // Leading dims of A are batch dims: dA is a batched product, dB sums over
  // them (sum_leading: no reshape to [rows, features], so that any leading
  // dimension, the sequence too, may stay split).
  if (needs(a))
    adj.add(loc, a, mk(a.getType(), dy, w, false, !tb));
  if (needs(w)) {
    auto sum = [&](Value l, Value r) {
      auto op = MatmulOp::create(b, loc, w.getType(), l, r, true, false);
      op.setSumLeading(true);
      return op.getResult();
    };
    adj.add(loc, w, tb ? sum(dy, a) : sum(a, dy));
  }
  return success();
}

/// Emits the operand adjoints of `op` given the adjoint `dy` of its result.
/// `needs(v)` says whether v depends on a parameter (only those get adjoints).
static LogicalResult backprop(Operation *op, Value dy, OpBuilder &b,
                              Adjoints &adj,
                              llvm::function_ref<bool(Value)> needs) {
  Location loc = op->getLoc();
  auto gen = [&](auto tag, TypeRange types, ValueRange operands,
                 ArrayRef<NamedAttribute> attrs = {}) {
    return decltype(tag)::create(b, loc, types, operands, attrs).getOperation();
  };
  auto pass = [&](Value v) {
    if (needs(v))
      adj.add(loc, v, dy);
  };
  return llvm::TypeSwitch<Operation *, LogicalResult>(op)
      .Case<MatmulOp>(
          [&](MatmulOp mm) { return backpropMatmul(mm, dy, b, adj, needs); })
      .Case<BiasAddOp>([&](BiasAddOp ba) {
        pass(ba.getInput());
        if (needs(ba.getBias()))
          adj.add(loc, ba.getBias(),
                  BiasGradOp::create(b, loc, ba.getBias().getType(), dy));
        return success();
      })
      .Case<ChannelBiasAddOp>([&](ChannelBiasAddOp ba) {
        pass(ba.getInput());
        if (needs(ba.getBias()))
          adj.add(
              loc, ba.getBias(),
              ChannelBiasGradOp::create(b, loc, ba.getBias().getType(), dy));
        return success();
      })
      .Case<Conv2dOp>([&](Conv2dOp c) {
        bool dx = needs(c.getInput()), dw = needs(c.getFilter());
        if (!dx && !dw)
          return success();
        auto g = Conv2dGradOp::create(
            b, loc, TypeRange{c.getInput().getType(), c.getFilter().getType()},
            c.getInput(), c.getFilter(), dy, c.getStrideAttr(),
            c.getPaddingAttr(), c.getDilationAttr(), c.getGroupsAttr());
        if (dx)
          adj.add(loc, c.getInput(), g.getInputGrad());
        if (dw)
          adj.add(loc, c.getFilter(), g.getFilterGrad());
        return success();
      })
      .Case<BatchNormOp>([&](BatchNormOp bn) {
        auto g = BatchNormGradOp::create(b, loc, bn.getInput(), bn.getGamma(),
                                         dy, bn.getEpsAttr());
        if (needs(bn.getInput()))
          adj.add(loc, bn.getInput(), g.getInputGrad());
        if (needs(bn.getGamma()))
          adj.add(loc, bn.getGamma(), g.getGammaGrad());
        if (needs(bn.getBeta()))
          adj.add(loc, bn.getBeta(), g.getBetaGrad());
        return success();
      })
      .Case<GroupNormOp>([&](GroupNormOp gn) {
        auto g = GroupNormGradOp::create(b, loc,
                                         TypeRange{gn.getInput().getType(),
                                                   gn.getGamma().getType(),
                                                   gn.getGamma().getType()},
                                         gn.getInput(), gn.getGamma(), dy,
                                         gn.getGroupsAttr(), gn.getEpsAttr());
        if (needs(gn.getInput()))
          adj.add(loc, gn.getInput(), g.getInputGrad());
        if (needs(gn.getGamma()))
          adj.add(loc, gn.getGamma(), g.getGammaGrad());
        if (needs(gn.getBeta()))
          adj.add(loc, gn.getBeta(), g.getBetaGrad());
        return success();
      })
      .Case<DropoutOp>([&](DropoutOp d) {
        // Linear in its input: the gradient applies the same mask and scale.
        if (needs(d.getInput()))
          adj.add(loc, d.getInput(),
                  DropoutOp::create(b, loc, dy.getType(), dy, d.getPAttr(),
                                    d.getUidAttr()));
        return success();
      })
      .Case<Pool2dOp>([&](Pool2dOp p) {
        if (needs(p.getInput()))
          adj.add(loc, p.getInput(),
                  Pool2dGradOp::create(b, loc, p.getInput().getType(),
                                       p.getInput(), dy, p.getKindAttr(),
                                       p.getKernelAttr(), p.getStrideAttr(),
                                       p.getPaddingAttr()));
        return success();
      })
      .Case<CastOp>([&](CastOp c) {
        // The gradient of a conversion is the conversion back.
        if (needs(c.getInput()))
          adj.add(loc, c.getInput(),
                  CastOp::create(b, loc, c.getInput().getType(), dy));
        return success();
      })
      .Case<AddOp>([&](AddOp add) {
        pass(add.getLhs());
        pass(add.getRhs());
        return success();
      })
      .Case<SubOp>([&](SubOp sub) {
        pass(sub.getLhs());
        if (needs(sub.getRhs()))
          adj.add(loc, sub.getRhs(),
                  gen(ScaleOp(), dy.getType(), {dy},
                      {b.getNamedAttr("factor", b.getF32FloatAttr(-1.0f))})
                      ->getResult(0));
        return success();
      })
      .Case<MulOp>([&](MulOp m) {
        if (needs(m.getLhs()))
          adj.add(loc, m.getLhs(),
                  gen(MulOp(), dy.getType(), {dy, m.getRhs()})->getResult(0));
        if (needs(m.getRhs()))
          adj.add(loc, m.getRhs(),
                  gen(MulOp(), dy.getType(), {dy, m.getLhs()})->getResult(0));
        return success();
      })
      .Case<ReluOp>([&](ReluOp r) {
        if (needs(r.getInput()))
          adj.add(loc, r.getInput(),
                  ReluGradOp::create(b, loc, dy.getType(), r.getInput(), dy));
        return success();
      })
      .Case<GeluOp>([&](GeluOp g) {
        if (needs(g.getInput()))
          adj.add(loc, g.getInput(),
                  GeluGradOp::create(b, loc, dy.getType(), g.getInput(), dy,
                                     g.getExactAttr()));
        return success();
      })
      .Case<SiluOp>([&](SiluOp s) {
        if (needs(s.getInput()))
          adj.add(loc, s.getInput(),
                  gen(SiluGradOp(), dy.getType(), {s.getInput(), dy})
                      ->getResult(0));
        return success();
      })
      .Case<SoftmaxOp>([&](SoftmaxOp s) {
        // From the output: dx = y * (dy - sum(dy * y)).
        if (needs(s.getInput()))
          adj.add(loc, s.getInput(),
                  gen(SoftmaxGradOp(), dy.getType(), {s.getResult(), dy})
                      ->getResult(0));
        return success();
      })
      .Case<EmbeddingOp>([&](EmbeddingOp e) {
        if (needs(e.getTable()))
          adj.add(
              loc, e.getTable(),
              gen(EmbeddingGradOp(), e.getTable().getType(), {e.getIds(), dy})
                  ->getResult(0));
        return success();
      })
      .Case<PosEmbeddingOp>([&](PosEmbeddingOp p) {
        pass(p.getInput());
        if (needs(p.getTable()))
          adj.add(loc, p.getTable(),
                  gen(PosEmbeddingGradOp(), p.getTable().getType(), {dy})
                      ->getResult(0));
        return success();
      })
      .Case<LayerNormOp>([&](LayerNormOp ln) {
        auto g = LayerNormGradOp::create(b, loc, ln.getInput(), ln.getGamma(),
                                         dy, ln.getEpsAttr());
        if (needs(ln.getInput()))
          adj.add(loc, ln.getInput(), g.getInputGrad());
        if (needs(ln.getGamma()))
          adj.add(loc, ln.getGamma(), g.getGammaGrad());
        if (needs(ln.getBeta()))
          adj.add(loc, ln.getBeta(), g.getBetaGrad());
        return success();
      })
      .Case<RmsNormOp>([&](RmsNormOp rn) {
        auto g = RmsNormGradOp::create(b, loc, rn.getInput(), rn.getGamma(), dy,
                                       rn.getEpsAttr());
        if (needs(rn.getInput()))
          adj.add(loc, rn.getInput(), g.getInputGrad());
        if (needs(rn.getGamma()))
          adj.add(loc, rn.getGamma(), g.getGammaGrad());
        return success();
      })
      .Case<RopeOp>([&](RopeOp r) {
        // A rotation's gradient is the inverse rotation.
        if (!needs(r.getQkv()))
          return success();
        SmallVector<NamedAttribute> attrs = {
            b.getNamedAttr("num_heads", r.getNumHeadsAttr()),
            b.getNamedAttr("num_kv_heads", r.getNumKvHeadsAttr()),
            b.getNamedAttr("theta", r.getThetaAttr())};
        if (!r.getInverse())
          attrs.push_back(b.getNamedAttr("inverse", b.getUnitAttr()));
        adj.add(loc, r.getQkv(),
                gen(RopeOp(), r.getQkv().getType(), {dy}, attrs)->getResult(0));
        return success();
      })
      .Case<AttentionOp>([&](AttentionOp at) {
        if (needs(at.getQkv()))
          adj.add(loc, at.getQkv(),
                  gen(AttentionGradOp(), at.getQkv().getType(),
                      {at.getQkv(), dy}, attentionAttrs(at))
                      ->getResult(0));
        return success();
      })
      .Case<MoeGatesOp>([&](MoeGatesOp g) {
        if (needs(g.getLogits()))
          adj.add(loc, g.getLogits(),
                  gen(MoeGatesGradOp(), g.getLogits().getType(),
                      {g.getLogits(), g.getExperts(), dy})
                      ->getResult(0));
        return success();
      })
      .Case<MoeExpertsOp>([&](MoeExpertsOp m) {
        auto g = MoeExpertsGradOp::create(
            b, loc, m.getInput(), m.getExperts(), m.getGates(), dy, m.getUp(),
            m.getDown(), m.getGate(), m.getActAttr());
        if (needs(m.getInput()))
          adj.add(loc, m.getInput(), g.getInputGrad());
        if (needs(m.getGates()))
          adj.add(loc, m.getGates(), g.getGatesGrad());
        if (needs(m.getUp()))
          adj.add(loc, m.getUp(), g.getUpGrad());
        if (needs(m.getDown()))
          adj.add(loc, m.getDown(), g.getDownGrad());
        if (m.getGate() && needs(m.getGate()))
          adj.add(loc, m.getGate(), g.getGateGrad());
        return success();
      })
      .Case<TransposeOp>([&](TransposeOp t) {
        if (!needs(t.getInput()))
          return success();
        ArrayRef<int64_t> perm = t.getPermutation();
        SmallVector<int64_t> inverse(perm.size());
        for (auto [i, p] : llvm::enumerate(perm))
          inverse[p] = i;
        adj.add(loc, t.getInput(),
                gen(TransposeOp(), t.getInput().getType(), {dy},
                    {b.getNamedAttr("permutation",
                                    b.getDenseI64ArrayAttr(inverse))})
                    ->getResult(0));
        return success();
      })
      .Case<ReshapeOp>([&](ReshapeOp r) {
        if (needs(r.getInput()))
          adj.add(loc, r.getInput(),
                  gen(ReshapeOp(), r.getInput().getType(), {dy})->getResult(0));
        return success();
      })
      .Case<ShardingConstraintOp>([&](ShardingConstraintOp c) {
        pass(c.getInput());
        return success();
      })
      .Default([&](Operation *other) {
        return other->emitError()
               << "planc cannot differentiate '" << other->getName() << "' yet";
      });
}

static FloatAttr toF32(OpBuilder &b, APFloat v) {
  bool lost;
  v.convert(APFloat::IEEEsingle(), APFloat::rmNearestTiesToEven, &lost);
  return b.getF32FloatAttr(v.convertToFloat());
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
  // Parameters are fp32 master weights (the optimizer and its state work
  // on them); a 16-bit compute copy is a plan.cast inside the model
  // (plan-mixed-precision). The loss is fp32.
  for (BlockArgument arg : model.getArguments())
    if (auto t = dyn_cast<ShapedType>(arg.getType());
        t && isa<FloatType>(t.getElementType()) &&
        !t.getElementType().isF32()) {
      model.emitError() << "argument " << arg.getArgNumber() << " is "
                        << t.getElementType()
                        << "; a model's parameters and inputs are f32 (the "
                           "master weights): mixed precision computes on "
                           "plan.cast copies (plan-mixed-precision)";
      return signalPassFailure();
    }
  if (auto t = dyn_cast<ShapedType>(model.getResultTypes()[0]);
      !t || !t.getElementType().isF32()) {
    model.emitError() << "the loss must be f32, got "
                      << model.getResultTypes()[0];
    return signalPassFailure();
  }

  // The step takes the model's arguments and returns the loss, the sum of
  // squares of all gradients, and the updated parameters.
  auto kindOf = [&](unsigned i) {
    auto k = model.getArgAttrOfType<StringAttr>(i, kKindAttr);
    return k ? k.getValue() : StringRef();
  };
  SmallVector<unsigned> params;
  for (unsigned i = 0; i < model.getNumArguments(); ++i)
    if (kindOf(i) == "param")
      params.push_back(i);
  OpBuilder b(module.getContext());
  auto scalar = RankedTensorType::get({}, b.getF32Type());
  SmallVector<Type> resultTypes{model.getResultTypes()[0], scalar};
  for (unsigned i : params)
    resultTypes.push_back(model.getArgumentTypes()[i]);

  b.setInsertionPointAfter(model);
  auto step = func::FuncOp::create(
      b, model.getLoc(), "train_step",
      b.getFunctionType(model.getArgumentTypes(), resultTypes));
  step->setAttr(kTrainStepAttr, b.getUnitAttr());
  step.setAllArgAttrs(model.getAllArgAttrs());
  step.setResultAttr(0, kResultAttr, b.getStringAttr("loss"));
  step.setResultAttr(1, kResultAttr, b.getStringAttr("grad_sumsq"));
  Block *body = step.addEntryBlock();
  // Arguments keep their declarations' locations (diagnostics point there).
  for (auto [to, from] : llvm::zip(step.getArguments(), model.getArguments()))
    to.setLoc(from.getLoc());
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
  Operation *lossOp = loss.getDefiningOp();
  if (!isa_and_nonnull<MseLossOp, CrossEntropyOp>(lossOp)) {
    (lossOp ? lossOp->emitError() : modelReturn->emitError())
        << "planc cannot differentiate the loss '"
        << (lossOp ? lossOp->getName().getStringRef() : StringRef("argument"))
        << "' yet; mse and cross_entropy are supported";
    return signalPassFailure();
  }

  // Batch norm's running statistics: each step folds the whole batch's
  // per-channel sums into them (PyTorch's momentum rule). The sums are
  // pending sums like any contraction, so every plan (dp, microbatches,
  // stages) updates them once per step from the same global batch.
  // The sums are taken right after the batch norm; the statistics are
  // updated after the backward sweep, so that a data-parallel all-reduce of
  // the sums overlaps the backward like a gradient's.
  DenseMap<Value, Value> updatedRunning;
  SmallVector<std::pair<BatchNormOp, BatchNormMomentsOp>> runningUpdates;
  // Likewise a mixture of experts' bias (DeepSeek-V3's balancing): the
  // step's load per expert, counted after the choice, updates it after the
  // backward sweep.
  SmallVector<std::pair<MoeTopkOp, MoeLoadOp>> biasUpdates;
  auto isStateArg = [&](Value v) {
    auto a = dyn_cast<BlockArgument>(v);
    return a && a.getOwner() == body &&
           model.getArgAttr(a.getArgNumber(), kBufferAttr) &&
           kindOf(a.getArgNumber()) == "state";
  };
  for (Operation &op : llvm::make_early_inc_range(*body)) {
    if (auto topk = dyn_cast<MoeTopkOp>(op); topk && topk.getBias()) {
      Value bias = topk.getBias();
      if (!isStateArg(bias) || updatedRunning.count(bias)) {
        topk.emitError() << "the bias of a mixture of experts must be a state "
                            "argument marked '"
                         << kBufferAttr << "', used by one moe_topk";
        return signalPassFailure();
      }
      b.setInsertionPointAfter(topk);
      auto load =
          MoeLoadOp::create(b, topk.getLoc(), bias.getType(), topk.getResult());
      if (Attribute layer = topk->getAttr(kLayerAttr))
        load->setAttr(kLayerAttr, layer);
      biasUpdates.push_back({topk, load});
      updatedRunning[bias] = Value();
      continue;
    }
    auto bn = dyn_cast<BatchNormOp>(op);
    if (!bn || bn.getRunning().empty())
      continue;
    Value rm = bn.getRunning()[0], rv = bn.getRunning()[1];
    if (!isStateArg(rm) || !isStateArg(rv) || updatedRunning.count(rm) ||
        updatedRunning.count(rv) || rm == rv) {
      bn.emitError() << "the running statistics of a batch_norm must be two "
                        "distinct state arguments marked '"
                     << kBufferAttr << "', each used by one batch_norm";
      return signalPassFailure();
    }
    b.setInsertionPointAfter(bn);
    auto t = cast<RankedTensorType>(rm.getType());
    auto moments = BatchNormMomentsOp::create(b, bn.getLoc(), TypeRange{t, t},
                                              bn.getInput());
    if (Attribute layer = bn->getAttr(kLayerAttr))
      moments->setAttr(kLayerAttr, layer);
    runningUpdates.push_back({bn, moments});
    updatedRunning[rm] = updatedRunning[rv] = Value();
  }
  b.setInsertionPointToEnd(body);

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
  Value pred = lossOp->getOperand(0), target = lossOp->getOperand(1);
  if (needs(pred))
    adj.add(lossOp->getLoc(), pred,
            isa<MseLossOp>(lossOp)
                ? Value(MseLossGradOp::create(b, lossOp->getLoc(),
                                              pred.getType(), pred, target))
                : CrossEntropyGradOp::create(
                      b, lossOp->getLoc(), TypeRange(pred.getType()),
                      ValueRange{pred, target},
                      // The vocabulary padding masked out of the loss has no
                      // gradient either.
                      lossOp->getAttrDictionary().getValue())
                      ->getResult(0));
  // The ops of each forward op's gradient keep its layer, so that pipeline
  // stages and recompute can find a layer's backward.
  auto keepLayer = [&](Operation *from, Operation *last) {
    Attribute layer = from->getAttr(kLayerAttr);
    if (!layer)
      return;
    for (Operation *o = last ? last->getNextNode() : &body->front(); o;
         o = o->getNextNode())
      o->setAttr(kLayerAttr, layer);
  };
  for (Operation *op : llvm::reverse(forward)) {
    if (op == lossOp || op->getNumResults() != 1)
      continue;
    // A mixture of experts' load-balancing loss: its gradient seeds the
    // router's logits, like a loss's (scaled like one under fp16).
    if (auto topk = dyn_cast<MoeTopkOp>(op);
        topk && topk.getAuxLoss() && needs(topk.getLogits())) {
      Operation *last = body->empty() ? nullptr : &body->back();
      auto logits = cast<RankedTensorType>(topk.getLogits().getType());
      int64_t sequences =
          logits.getNumElements() /
          (logits.getShape().back() * logits.getShape()[logits.getRank() - 2]);
      adj.add(topk.getLoc(), topk.getLogits(),
              MoeAuxGradOp::create(b, topk.getLoc(), logits, topk.getLogits(),
                                   topk.getResult(), topk.getAuxLossAttr(),
                                   b.getI64IntegerAttr(sequences)));
      keepLayer(op, last);
      continue;
    }
    Value dy = adj.lookup(op->getResult(0));
    if (!dy)
      continue;
    Operation *last = body->empty() ? nullptr : &body->back();
    if (failed(backprop(op, dy, b, adj, needs)))
      return signalPassFailure();
    keepLayer(op, last);
  }

  for (auto [bn, moments] : runningUpdates) {
    Value rm = bn.getRunning()[0], rv = bn.getRunning()[1];
    auto in = bn.getInput().getType();
    auto update = RunningStatsUpdateOp::create(
        b, bn.getLoc(), TypeRange{rm.getType(), rv.getType()}, rm, rv,
        moments.getSum(), moments.getSumSq(), bn.getMomentumAttr(),
        b.getI64IntegerAttr(in.getNumElements() / in.getDimSize(1)));
    if (Attribute layer = bn->getAttr(kLayerAttr))
      update->setAttr(kLayerAttr, layer);
    updatedRunning[rm] = update.getNewMean();
    updatedRunning[rv] = update.getNewVar();
  }

  for (auto [topk, load] : biasUpdates) {
    auto update = MoeBiasUpdateOp::create(
        b, topk.getLoc(), topk.getBias().getType(), topk.getBias(),
        load.getResult(), topk.getBiasUpdateAttr());
    if (Attribute layer = topk->getAttr(kLayerAttr))
      update->setAttr(kLayerAttr, layer);
    updatedRunning[topk.getBias()] = update.getResult();
  }

  // The global gradient norm: one sum of squares over every gradient.
  SmallVector<Value> grads, terms;
  for (unsigned i : params) {
    Value w = step.getArgument(i);
    Value g = adj.lookup(w);
    grads.push_back(g);
    if (!g) {
      auto name = model.getArgAttrOfType<StringAttr>(i, kNameAttr);
      mlir::emitWarning(w.getLoc())
          << "parameter '" << (name ? name.getValue() : "?")
          << "' does not affect the loss; it is left untouched";
      continue;
    }
    terms.push_back(g);
  }
  if (terms.empty()) {
    model.emitError() << "no parameter affects the loss; there is nothing to "
                         "train";
    return signalPassFailure();
  }
  Value sumsq = SumSqOp::create(b, train.getLoc(), TypeRange(scalar), terms,
                                ArrayRef<NamedAttribute>())
                    ->getResult(0);

  SmallVector<Value> results{loss, sumsq}, states;
  SmallVector<DictionaryAttr> stateArgAttrs;
  // What every moment's argument says besides its name, made once.
  NamedAttribute stateKind =
      b.getNamedAttr(kKindAttr, b.getStringAttr("state"));
  NamedAttribute stateInit =
      b.getNamedAttr(kInitAttr, InitAttr::get(b.getContext(), "zeros", 0, 0));
  // The model's state (running statistics) comes first among the updated
  // state, in the order of its arguments; the optimizer's follows.
  for (unsigned i = 0; i < model.getNumArguments(); ++i) {
    if (kindOf(i) != "state")
      continue;
    Value updated = updatedRunning.lookup(step.getArgument(i));
    if (!updated) {
      auto name = model.getArgAttrOfType<StringAttr>(i, kNameAttr);
      mlir::emitError(step.getArgument(i).getLoc())
          << "state argument '" << (name ? name.getValue() : "?")
          << "' is not the running statistics of a batch_norm nor the bias "
             "of a mixture of experts; planc does not know how a step "
             "updates it";
      return signalPassFailure();
    }
    states.push_back(updated);
  }
  for (auto [i, g] : llvm::zip(params, grads)) {
    Value w = step.getArgument(i);
    if (!g) {
      results.push_back(w);
      continue;
    }
    // Clipping by the global norm is part of the update (one op per
    // parameter, not two).
    Value clipSumsq;
    FloatAttr maxNorm;
    if (auto clip = train.getGradClip()) {
      clipSumsq = sumsq;
      maxNorm = toF32(b, *clip);
    }
    Value updated;
    if (train.getOptimizer() == "adamw") {
      // The moments are state the step takes and returns, named after the
      // parameter (zero at the start), so that they have layouts like
      // every other value.
      StringRef pname =
          model.getArgAttrOfType<StringAttr>(i, kNameAttr).getValue();
      // Block arguments now; the function's type and argument attributes
      // are written once at the end (per argument would be quadratic).
      auto stateArg = [&](StringRef suffix) {
        stateArgAttrs.push_back(b.getDictionaryAttr(
            {stateKind,
             b.getNamedAttr(kNameAttr, b.getStringAttr(pname + suffix)),
             stateInit}));
        return body->addArgument(w.getType(), w.getLoc());
      };
      Value m = stateArg(".exp_avg"), v = stateArg(".exp_avg_sq");
      // Decoupled weight decay applies to matrices, not to biases and
      // norm scales (1-D), as GPT-2 and most recipes do.
      bool decays = cast<RankedTensorType>(w.getType()).getRank() >= 2;
      auto aw = AdamWUpdateOp::create(
          b, w.getLoc(), TypeRange{w.getType(), w.getType(), w.getType()}, w, g,
          m, v, clipSumsq, toF32(b, train.getLr()), toF32(b, train.getBeta1()),
          toF32(b, train.getBeta2()), toF32(b, train.getEps()),
          decays ? toF32(b, train.getWeightDecay()) : b.getF32FloatAttr(0),
          maxNorm);
      updated = aw.getResult();
      states.push_back(aw.getNewExpAvg());
      states.push_back(aw.getNewExpAvgSq());
    } else {
      updated = SgdUpdateOp::create(b, w.getLoc(), w.getType(), w, g, clipSumsq,
                                    toF32(b, train.getLr()), maxNorm);
    }
    results.push_back(updated);
  }
  // The updated moments follow the parameters, in the order of their
  // arguments.
  unsigned firstState = results.size();
  results.append(states.begin(), states.end());
  SmallVector<Type> allResults(resultTypes);
  for (Value st : states)
    allResults.push_back(st.getType());
  SmallVector<DictionaryAttr> argAttrs;
  for (unsigned i = 0; i < model.getNumArguments(); ++i)
    argAttrs.push_back(step.getArgAttrDict(i));
  argAttrs.append(stateArgAttrs.begin(), stateArgAttrs.end());
  step.setType(b.getFunctionType(body->getArgumentTypes(), allResults));
  step.setAllArgAttrs(argAttrs);
  SmallVector<DictionaryAttr> resultAttrs;
  for (unsigned r = 0; r < results.size(); ++r)
    resultAttrs.push_back(r < firstState
                              ? step.getResultAttrDict(r)
                              : b.getDictionaryAttr(b.getNamedAttr(
                                    kResultAttr, b.getStringAttr("state"))));
  step.setAllResultAttrs(resultAttrs);
  func::ReturnOp::create(b, modelReturn->getLoc(), results);
}
