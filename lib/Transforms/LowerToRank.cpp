//===- LowerToRank.cpp - Global training step to per-rank code ------------===//
#include "OpFlops.h"
#include "ShardingAnalysis.h"
#include "planc/Transforms/Passes.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/TypeSwitch.h"

namespace planc {
#define GEN_PASS_DEF_LOWERTORANK
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;
namespace rk = planc::rank;

namespace {
/// attention(..., dropout = p)'s attributes on a rank attention op
/// (RankOps.td Rank_AttnDropoutArgs).
struct AttnDropoutAttrs {
  FloatAttr p;
  IntegerAttr uid, microbatches;
  ArrayAttr batchAxes, mbInnerAxes, headAxes, headInnerAxes;
  /// OpT::create(b, loc, args..., these attributes).
  template <class OpT, class... Args>
  OpT create(OpBuilder &b, Location loc, Args &&...args) const {
    return OpT::create(b, loc, std::forward<Args>(args)..., p, uid, batchAxes,
                       microbatches, mbInnerAxes, headAxes, headInnerAxes);
  }
};

struct LowerToRankPass : public planc::impl::LowerToRankBase<LowerToRankPass> {
  using LowerToRankBase::LowerToRankBase;
  void runOnOperation() override;

  /// This rank's buffer type for `v`, or failure (with an error) if a split
  /// dimension does not divide evenly.
  FailureOr<MemRefType> localType(Value v, Operation *user) {
    auto type = cast<RankedTensorType>(v.getType());
    ShardingAttr s = getSharding(v);
    if (!s) {
      user->emitError() << "value has no sharding; run "
                           "plan-propagate-sharding first";
      return failure();
    }
    // A few (type, layout) pairs cover every value of a step.
    MemRefType &known = localTypes[{type, s}];
    if (!known) {
      FailureOr<MemRefType> t = computeLocalType(type, s, user);
      if (failed(t))
        return failure();
      known = *t;
    }
    return known;
  }
  DenseMap<std::pair<Type, Attribute>, MemRefType> localTypes;
  FailureOr<MemRefType> computeLocalType(RankedTensorType type, ShardingAttr s,
                                         Operation *user) {
    for (int64_t d = 0; d < type.getRank(); ++d)
      for (StringRef axis : s.getDimAxes(d))
        if (mesh.getAxisIndex(axis) < 0) {
          user->emitError()
              << "sharding names mesh axis '" << axis << "', which "
              << mesh.getSymName() << " does not have";
          return failure();
        } else if (type.getDimSize(d) % mesh.getAxisSize(axis) != 0) {
          user->emitError() << "dimension " << d << " of size "
                            << type.getDimSize(d) << " cannot be split evenly "
                            << "over mesh axis '" << axis << "' of size "
                            << mesh.getAxisSize(axis);
          return failure();
        }
    return MemRefType::get(getLocalShape(type.getShape(), s, mesh),
                           type.getElementType());
  }

  /// Lowers `src` (the train step, or the forward model) into the
  /// rank-level function `funcName`; the step also makes the declarations.
  LogicalResult lowerFunc(func::FuncOp src, StringRef funcName, bool isStep,
                          func::FuncOp &out);

  /// Makes the values that cross units explicit: kept in the stash for
  /// later units of the same pipeline rank, sent to the others; cuts the
  /// inputs into microbatches in each unit that reads them.
  LogicalResult connectUnits(rk::PipelineOp pipe,
                             const DenseSet<Value> &seqInputBuffers,
                             int64_t microbatches);

  MeshOp mesh;
};
} // namespace

void LowerToRankPass::runOnOperation() {
  ModuleOp module = getOperation();
  mesh = getMesh(module);
  localTypes.clear();
  func::FuncOp step;
  for (auto f : module.getOps<func::FuncOp>())
    if (f->hasAttr(kTrainStepAttr))
      step = f;
  if (!mesh || !step) {
    module.emitError() << "expected a plan.mesh and a train step; run "
                          "plan-autodiff first";
    return signalPassFailure();
  }

  func::FuncOp model;
  for (auto f : module.getOps<func::FuncOp>())
    if (f->hasAttr(kModelAttr))
      model = f;
  // Model FLOPs of one step (the plan-level ops on global shapes, without
  // the forward that recompute runs again), shared by the ranks: what the
  // runtime's MFU divides by the step time.
  double stepFlops = 0;
  step.walk([&](Operation *op) {
    if (isa_and_nonnull<PlanDialect>(op->getDialect()) &&
        !op->hasAttr("plan.recompute"))
      stepFlops += opFlops(op);
  });
  int64_t ranks = 1;
  for (auto [axis, size] : llvm::zip(mesh.getAxes(), mesh.getShape()))
    if (!mesh.isSequential(cast<StringAttr>(axis).getValue()))
      ranks *= size;
  func::FuncOp rankStep, rankForward;
  if (failed(lowerFunc(step, "plan_step", /*isStep=*/true, rankStep)))
    return signalPassFailure();
  rankStep->setAttr(rk::kStepFlopsAttr,
                    FloatAttr::get(Float64Type::get(&getContext()),
                                   stepFlops / double(ranks)));
  // Dynamic loss scaling: every rank learns of an overflow anywhere before
  // its first update, at the step's top level, where all ranks run.
  bool dynamicScale = llvm::any_of(module.getOps<TrainOp>(), [](TrainOp t) {
    return t.getLossScale() == "dynamic";
  });
  if (dynamicScale) {
    for (Operation &top : rankStep.getBody().front()) {
      bool updates = false;
      top.walk([&](Operation *o) {
        updates |=
            isa<rk::SgdUpdateOp, rk::AdamWUpdateOp, rk::ClipByGlobalNormOp>(o);
      });
      if (updates) {
        OpBuilder b(&top);
        rk::LossScaleCheckOp::create(b, top.getLoc());
        break;
      }
    }
  }
  // The forward function serves generation (it computes the logits); with
  // a pipeline, its stages run in turn for one microbatch.
  if (model &&
      failed(lowerFunc(model, "plan_forward", /*isStep=*/false, rankForward)))
    return signalPassFailure();

  // The global functions are fully replaced by the per-rank ones.
  for (auto f : llvm::make_early_inc_range(module.getOps<func::FuncOp>()))
    if (f != rankStep && f != rankForward)
      f.erase();
}

LogicalResult LowerToRankPass::lowerFunc(func::FuncOp src, StringRef funcName,
                                         bool isStep, func::FuncOp &out) {
  MLIRContext *ctx = &getContext();
  OpBuilder b(ctx);
  b.setInsertionPoint(src);
  auto rankFunc = func::FuncOp::create(b, src.getLoc(), funcName,
                                       b.getFunctionType({}, {}));
  out = rankFunc;
  Block *body = rankFunc.addEntryBlock();

  // Declarations and buffers of the arguments.
  DenseMap<Value, Value> buf;
  OpBuilder declB(ctx);
  declB.setInsertionPoint(rankFunc);
  b.setInsertionPointToStart(body);
  int64_t paramBytes = 0, gradBytes = 0, stateBytes = 0;
  // A sequential mesh axis (microbatches): see the loop below.
  StringRef seqAxis;
  int64_t seqSize = 1;
  // Pipeline parallelism: the step's microbatch work is cut into units by
  // stage and phase (see lowerPipelineUnits), ordered by a schedule.
  int64_t ppSize = mesh.getAxisSize("pp");
  bool pipelined = ppSize > 1;
  bool forwardPipe = pipelined && !isStep;
  ParallelOp par;
  for (auto p : src->getParentOfType<ModuleOp>().getOps<ParallelOp>())
    par = p;
  int64_t numStages = ppSize * (par ? par.getVirtualStages() : 1);
  bool splitW = par && par.getSchedule() == "zero_bubble";
  auto stageOf = [](Operation *op) -> int64_t {
    auto s = op->getAttrOfType<IntegerAttr>(kStageAttr);
    return s ? s.getInt() : -1;
  };
  auto argStage = [&](unsigned i) -> int64_t {
    auto s = src.getArgAttrOfType<IntegerAttr>(i, kStageAttr);
    return s ? s.getInt() : -1;
  };
  // Bytes per pipeline coordinate (params, grads, state).
  SmallVector<int64_t> ppBytes(3 * ppSize, 0);
  auto countBytes = [&](int64_t kind, int64_t stage, int64_t bytes) {
    for (int64_t c = 0; c < ppSize; ++c)
      if (stage < 0 || stage % ppSize == c)
        ppBytes[3 * c + kind] += bytes;
  };
  for (auto [a, n] : llvm::zip(mesh.getAxes(), mesh.getShape()))
    if (mesh.isSequential(cast<StringAttr>(a).getValue()) &&
        (n > 1 || pipelined)) {
      seqAxis = cast<StringAttr>(a).getValue();
      seqSize = n;
    }
  SmallVector<BlockArgument> seqInputs;
  auto localElems = [&](Value v) {
    auto t = cast<RankedTensorType>(v.getType());
    int64_t n = 1;
    for (int64_t d : getLocalShape(t.getShape(), getSharding(v), mesh))
      n *= d;
    return n;
  };
  auto withRows = [](ArrayRef<int64_t> shape, int64_t rows) {
    SmallVector<int64_t> out(shape);
    out[0] = rows;
    return out;
  };
  for (BlockArgument arg : src.getArguments()) {
    unsigned i = arg.getArgNumber();
    auto kind = src.getArgAttrOfType<StringAttr>(i, kKindAttr);
    auto name = src.getArgAttrOfType<StringAttr>(i, kNameAttr);
    if (!kind || !name) {
      src.emitError() << "argument " << i << " lacks " << kKindAttr << " or "
                      << kNameAttr;
      return failure();
    }
    FailureOr<MemRefType> type = localType(arg, src);
    if (failed(type))
      return failure();
    auto ref = FlatSymbolRefAttr::get(name);
    Location loc = arg.getLoc();
    if (kind.getValue() == "param") {
      auto init = src.getArgAttrOfType<InitAttr>(i, kInitAttr);
      if (!init)
        init = InitAttr::get(ctx, "zeros", 0, 0);
      if (isStep) {
        ShardingAttr s = getSharding(arg);
        auto decl = rk::ParamDeclOp::create(
            declB, loc, name, *type, init,
            s.isReplicated() ? ShardingAttr() : s,
            src.getArgAttrOfType<IntegerAttr>(i, kExportRowsAttr),
            /*copy=*/TypeAttr());
        paramBytes += type->getNumElements() * 4;
        if (pipelined) {
          decl->setAttr(rk::kRankStageAttr, b.getI64IntegerAttr(argStage(i)));
          countBytes(0, argStage(i), type->getNumElements() * 4);
        }
      }
      buf[arg] = rk::ParamOp::create(b, loc, *type, ref);
      continue;
    }
    if (kind.getValue() == "state") {
      if (isStep) {
        ShardingAttr s = getSharding(arg);
        // Batch norm's running statistics are model state: initialized as
        // the frontend says, exported with the parameters.
        bool buffer = src.getArgAttr(i, kBufferAttr) != nullptr;
        auto decl = rk::StateDeclOp::create(
            declB, loc, name, *type, s.isReplicated() ? ShardingAttr() : s,
            buffer,
            buffer ? src.getArgAttrOfType<InitAttr>(i, kInitAttr) : InitAttr());
        stateBytes += type->getNumElements() * 4;
        if (pipelined) {
          decl->setAttr(rk::kRankStageAttr, b.getI64IntegerAttr(argStage(i)));
          countBytes(2, argStage(i), type->getNumElements() * 4);
        }
      }
      buf[arg] = rk::StateOp::create(b, loc, *type, ref);
      continue;
    }
    ShardingAttr s = getSharding(arg);
    SmallVector<StringRef> batchAxes =
        s.getRank() > 0 ? s.getDimAxes(0) : SmallVector<StringRef>();
    // Microbatches are blocks of this rank's rows, taken in the loop. The
    // expert-parallel axis may split each of them further (the rank's rows
    // are then one run of the global batch per microbatch).
    int64_t runs = 1;
    if (!seqAxis.empty() && llvm::is_contained(batchAxes, seqAxis)) {
      bool last = batchAxes.back() == seqAxis;
      bool beforeEp = batchAxes.size() >= 2 &&
                      batchAxes[batchAxes.size() - 2] == seqAxis &&
                      batchAxes.back() == OpShardingRule::kExpertAxis;
      if (!last && !beforeEp) {
        src.emitError() << "input '" << name.getValue()
                        << "' must be split over the microbatch axis last "
                           "(or just before ep)";
        return failure();
      }
      if (beforeEp)
        runs = seqSize;
      batchAxes.erase(llvm::find(batchAxes, seqAxis));
      type = MemRefType::get(
          withRows(type->getShape(), type->getDimSize(0) * seqSize),
          type->getElementType());
      seqInputs.push_back(arg);
    }
    // Context parallelism splits sequences (dimension 1) over cp.
    StringAttr cpOfInput;
    for (int64_t d = 1; d < s.getRank(); ++d) {
      SmallVector<StringRef> axes = s.getDimAxes(d);
      if (axes.empty())
        continue;
      if (d == 1 && axes.size() == 1 &&
          axes[0] == OpShardingRule::kContextAxis) {
        cpOfInput = StringAttr::get(ctx, axes[0]);
        continue;
      }
      src.emitError() << "input '" << name.getValue()
                      << "' may only be split along its batch dimension "
                         "(and its sequence over cp)";
      return failure();
    }
    if (batchAxes.size() > 2) {
      src.emitError() << "input '" << name.getValue()
                      << "' is split over more than two axes along its batch; "
                         "not supported yet";
      return failure();
    }
    auto batchAxis = [&](size_t k) {
      return k < batchAxes.size() ? StringAttr::get(ctx, batchAxes[k])
                                  : StringAttr();
    };
    if (isStep) {
      rk::InputDeclOp::create(
          declB, loc, name, *type, kind, batchAxis(0), cpOfInput, batchAxis(1),
          runs > 1 ? b.getI64IntegerAttr(runs) : IntegerAttr());
    }
    buf[arg] = rk::InputOp::create(b, loc, *type, ref);
    // What a reference implementation needs to replay step 1 (or an
    // evaluation batch, with the forward function).
    rk::ObserveOp::create(
        b, loc, buf[arg],
        b.getStringAttr((kind.getValue() == "label" ? "label/" : "input/") +
                        name.getValue()));
  }

  auto f32 = [&](double v) { return b.getF32FloatAttr(float(v)); };
  auto lossScale = [&](Value pred) {
    return f32(1.0 /
               double(cast<RankedTensorType>(pred.getType()).getNumElements()));
  };

  // The one mesh axis that splits dimension `dim` of `v`, or null.
  auto splitAxis = [&](Value v, int64_t dim,
                       Operation *user) -> FailureOr<StringAttr> {
    ShardingAttr s = getSharding(v);
    SmallVector<StringRef> axes = s.getDimAxes(dim);
    if (axes.size() > 1) {
      user->emitError() << "dimension " << dim << " split over several axes ("
                        << s << ") is not supported by this op yet";
      return failure();
    }
    return axes.empty() ? StringAttr() : b.getStringAttr(axes[0]);
  };
  // The heads this rank holds: the packed q/k/v dimension is split by heads.
  auto localHeads = [&](Value qkv, int64_t h,
                        int64_t kv) -> std::pair<IntegerAttr, IntegerAttr> {
    int64_t n = 1;
    for (StringRef a : getSharding(qkv).getDimAxes(2))
      n *= mesh.getAxisSize(a);
    return {b.getI64IntegerAttr(h / n), b.getI64IntegerAttr(kv / n)};
  };
  // How dimension `d` of `v` is split, for the dropout masks' global
  // indices: its mesh axes other than the microbatch axis, whether
  // microbatches split it too, and the axes that come after the microbatch
  // axis (they split each microbatch).
  struct DimSplit {
    SmallVector<StringRef> axes, inner;
    bool microbatched = false;
  };
  auto dimSplit = [&](Value v, int64_t d) {
    DimSplit out;
    for (StringRef a : getSharding(v).getDimAxes(d)) {
      if (a == seqAxis)
        out.microbatched = true;
      else
        out.axes.push_back(a);
      if (out.microbatched && a != seqAxis)
        out.inner.push_back(a);
    }
    return out;
  };
  // attention(..., dropout = p): the rank attention ops' dropout attributes
  // (RankOps.td Rank_AttnDropoutArgs) for plan op `op` on `qkv`: the batch
  // placed as rank.dropout places dimension 0, the heads by the axes that
  // split the packed dimension.
  // `headSplit`: the axis that splits each rank's heads further (context
  // parallelism's all-to-all), "" for none.
  auto attnDropout = [&](Operation *op, Value qkv, StringRef headSplit = "") {
    auto p = op->getAttrOfType<FloatAttr>("dropout");
    auto uid = op->getAttrOfType<IntegerAttr>("dropout_uid");
    DimSplit batch;
    SmallVector<StringRef> heads, within;
    // Evaluation and generation (plan_forward) keep every probability, as
    // dropout() keeps every element there.
    if (isStep && p && !p.getValue().isZero()) { // else the defaults
      batch = dimSplit(qkv, 0);
      for (StringRef a : getSharding(qkv).getDimAxes(2))
        heads.push_back(a);
      if (!headSplit.empty())
        within.push_back(headSplit);
    } else {
      p = b.getF32FloatAttr(0.0f);
      uid = b.getI64IntegerAttr(0);
    }
    return AttnDropoutAttrs{
        p,
        uid ? uid : b.getI64IntegerAttr(0),
        b.getI64IntegerAttr(batch.microbatched ? seqSize : 0),
        b.getStrArrayAttr(batch.axes),
        b.getStrArrayAttr(batch.inner),
        b.getStrArrayAttr(heads),
        b.getStrArrayAttr(within)};
  };
  // Context parallelism: "cp" when it splits the sequence (dimension 1) of
  // `v`, else "" (the runtime's "no axis").
  auto contextAxis = [&](Value v) {
    ShardingAttr s = getSharding(v);
    bool split = s && s.getRank() > 1 &&
                 llvm::is_contained(s.getDimAxes(1),
                                    StringRef(OpShardingRule::kContextAxis));
    return b.getStringAttr(split ? OpShardingRule::kContextAxis : "");
  };
  // How context parallelism exchanges for attention: the plan's cp_comm, or
  // else all_to_all where G divides the heads and moves fewer bytes in the
  // forward than gathering the keys and values ((q/k/v + output) (G - 1) /
  // G against keys and values (G - 1) per position), all_gather otherwise.
  // On the cuda target both run the same kernels (cuDNN for a 16-bit
  // attention without dropout, each keeping its log-sum-exp for the
  // backward: plan-keep-attention), and the bytes decide too.
  std::string cpComm;
  for (auto par : src->getParentOfType<ModuleOp>().getOps<ParallelOp>())
    if (std::optional<StringRef> c = par.getCpComm())
      cpComm = c->str();
  auto cpExchange = [&](int64_t h, int64_t kv, int64_t G) -> std::string {
    if (!cpComm.empty())
      return cpComm;
    if (h % G != 0 || kv % G != 0)
      return "all_gather";
    double a2a = double(2 * h + 2 * kv) * double(G - 1) / double(G);
    double gather = double(2 * kv) * double(G - 1);
    return gather < a2a ? "all_gather" : "all_to_all";
  };
  // All-gather: every position's keys and values of attention's packed
  // q/k/v, in position order. They are G times the rank's own: the backward
  // gathers them again (as Megatron-Core does), unless recompute = none
  // keeps everything, where a backward in its forward's block reuses them.
  DenseMap<Value, std::pair<Block *, Value>> gatheredKv;
  bool keepGathered =
      plan::recomputePolicy(src->getParentOfType<ModuleOp>(), "") == "none";
  auto kvGather = [&](Value qkv, Value local, int64_t h, int64_t kv,
                      StringAttr axis, Location loc) -> Value {
    auto it = gatheredKv.find(qkv);
    if (keepGathered && it != gatheredKv.end() &&
        it->second.first == b.getInsertionBlock())
      return it->second.second;
    auto t = cast<MemRefType>(local.getType());
    int64_t G = mesh.getAxisSize(axis.getValue());
    int64_t d = t.getDimSize(2) / (h + 2 * kv);
    Value out = rk::AllocOp::create(
        b, loc,
        MemRefType::get({t.getDimSize(0), t.getDimSize(1) * G, 2 * kv * d},
                        t.getElementType()));
    rk::KvGatherOp::create(b, loc, local, out, h * d, kv * d, axis);
    gatheredKv[qkv] = {b.getInsertionBlock(), out};
    return out;
  };
  // A buffer like `local` [B, S/G, W] as every position of 1/G of W.
  auto headSplitType = [&](Value local, int64_t G) {
    auto t = cast<MemRefType>(local.getType());
    return MemRefType::get(
        {t.getDimSize(0), t.getDimSize(1) * G, t.getDimSize(2) / G},
        t.getElementType());
  };
  // Ulysses: attention's packed qkv, split by sequence over cp, exchanged
  // for every position of 1/G of the heads. A backward in the same block as
  // its forward reuses the forward's exchanged buffer (kept instead of the
  // local qkv, the same bytes); elsewhere (pipeline units, recomputed
  // layers) it exchanges again.
  DenseMap<Value, std::pair<Block *, Value>> headSplitQkv;
  auto headSplit = [&](Value qkv, Value local, int64_t h, int64_t kv,
                       StringAttr axis, Operation *user) -> FailureOr<Value> {
    auto it = headSplitQkv.find(qkv);
    if (it != headSplitQkv.end() && it->second.first == b.getInsertionBlock())
      return it->second.second;
    int64_t G = mesh.getAxisSize(axis.getValue());
    int64_t d = cast<MemRefType>(local.getType()).getDimSize(2) / (h + 2 * kv);
    if (h % G != 0 || kv % G != 0) {
      user->emitError() << "context parallelism by all-to-all gives each of "
                        << "the cp = " << G
                        << " ranks whole key/value heads, but this rank has "
                        << kv << " (and " << h
                        << " query heads); choose a cp that divides " << kv;
      return failure();
    }
    Value out = rk::AllocOp::create(b, user->getLoc(), headSplitType(local, G));
    rk::SeqToHeadsOp::create(b, user->getLoc(), local, out, h * d, kv * d,
                             axis);
    headSplitQkv[qkv] = {b.getInsertionBlock(), out};
    return out;
  };
  // The mesh axes that split a value's batch (dimension 0) across ranks:
  // not the sequential (microbatch) axis, whose parts a loop visits.
  auto batchAxes = [&](Value v) {
    SmallVector<StringRef> axes;
    for (StringRef a : getSharding(v).getDimAxes(0))
      if (a != seqAxis)
        axes.push_back(a);
    return b.getStrArrayAttr(axes);
  };
  // Embedding tables split by rows (vocab-parallel).
  auto rowAxis = [&](Value table, Operation *user) {
    return splitAxis(table, 0, user);
  };
  auto vocabAxis = [&](Value logits, Operation *user) {
    return splitAxis(
        logits, cast<RankedTensorType>(logits.getType()).getRank() - 1, user);
  };
  // The classes a cross-entropy counts (0: all; fewer with a padded
  // vocabulary).
  auto validClasses = [&](Operation *ce) {
    auto v = ce->getAttrOfType<IntegerAttr>("valid_classes");
    return b.getI64IntegerAttr(v ? v.getInt() : 0);
  };
  // Each row's maximum and (sum of exponentials, target logit) over the
  // whole vocabulary, from this rank's columns: computed once per logits
  // and shared by the loss and its gradient.
  DenseMap<std::pair<Value, Value>, std::pair<Value, Value>> statsOf;
  auto ceStats = [&](Value logits, Value targets, StringAttr axis,
                     IntegerAttr valid,
                     Location loc) -> std::pair<Value, Value> {
    auto &slot = statsOf[{logits, targets}];
    if (slot.first)
      return slot;
    auto t = cast<MemRefType>(logits.getType());
    int64_t rows = t.getNumElements() / t.getDimSize(t.getRank() - 1);
    Type f32 = b.getF32Type();
    Value rowmax = rk::AllocOp::create(b, loc, MemRefType::get({rows}, f32));
    rk::RowMaxOp::create(b, loc, logits, rowmax);
    rk::AllReduceMaxOp::create(b, loc, rowmax, b.getStrArrayAttr({axis}));
    Value stats = rk::AllocOp::create(b, loc, MemRefType::get({rows, 2}, f32));
    rk::CeLocalStatsOp::create(b, loc, logits, targets, rowmax, stats, axis,
                               valid);
    rk::AllReduceOp::create(b, loc, stats, b.getStrArrayAttr({axis}));
    return slot = {rowmax, stats};
  };

  // Gradients are observed once whole (after their all-reduce) and before
  // clipping, under the name of the parameter they update.
  auto observeGrad = [&](Operation *update, Value gradBuf, Location loc) {
    auto arg = dyn_cast<BlockArgument>(update->getOperand(0));
    if (!arg)
      return;
    // A reference compares whole gradients; a shard would be mislabeled.
    if (!getSharding(arg).isReplicated())
      return;
    auto name = src.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kNameAttr);
    rk::ObserveOp::create(b, loc, gradBuf,
                          b.getStringAttr("grad/" + name.getValue()));
  };

  // Plan values by the buffer they live in (views share their source's).
  auto rootOf = [](Value buffer) {
    while (auto view = buffer.getDefiningOp<rk::ViewOp>())
      buffer = view.getSource();
    return buffer;
  };
  DenseMap<Value, SmallVector<Value>> valuesOf;
  for (BlockArgument arg : src.getArguments())
    valuesOf[rootOf(buf.lookup(arg))].push_back(arg);
  // Gradient buckets (data parallelism): consecutive reductions over dp (and
  // cp) are grouped until a bucket holds bucket_mb; their values are
  // computed into
  // one buffer, whose all-reduce starts as soon as the last of them is
  // final, without waiting, so that it overlaps the rest of backward; the
  // first use of any of them waits for it. A bucket closes early where a
  // member's reduced value is needed before the next member is ready. (With
  // microbatches the gradients are final only after the loop: no buckets.)
  constexpr unsigned kSlots = 1024; // planrt's collective slots
  struct Bucket {
    Value buffer;
    int64_t elems = 0;
    Type elementType; // of the gradients it holds (mixed precision: f32 or
                      // fp16, reduced in their own type)
    Operation *last = nullptr; // the reduction that starts it
    bool waited = false;
  };
  SmallVector<Bucket> buckets;
  DenseMap<Value, std::pair<unsigned, int64_t>>
      bucketSlice;                     // value -> (bucket, offset)
  DenseMap<Value, unsigned> reducedIn; // reduced value -> bucket
  if (isStep && seqAxis.empty()) {
    double mb = 25.0;
    for (auto par : src->getParentOfType<ModuleOp>().getOps<ParallelOp>())
      mb = par.getBucketMb().convertToDouble();
    int64_t limit = std::max<int64_t>(1, int64_t(mb * 1024 * 1024));
    // fp16 gradients are reduced in fp16, then widened for the master
    // weights (and unscaled, with dynamic loss scaling): each such chain
    // moves to the first use of its end, so that the reductions stay
    // together and share buckets.
    Block &body = src.getBody().front();
    SmallVector<CastOp> widenings;
    for (auto c : body.getOps<CastOp>())
      if (auto ar = c.getInput().getDefiningOp<AllReduceOp>();
          ar && ar->hasOneUse())
        widenings.push_back(c);
    for (CastOp c : widenings) {
      SmallVector<Operation *> chain{c};
      while (chain.back()->hasOneUse() &&
             isa<CastOp, LossScaleOp>(*chain.back()->user_begin()))
        chain.push_back(*chain.back()->user_begin());
      Operation *first = nullptr;
      for (Operation *u : chain.back()->getUsers())
        if (Operation *a = body.findAncestorOpInBlock(*u);
            a && (!first || a->isBeforeInBlock(first)))
          first = a;
      if (first)
        for (Operation *link : chain)
          link->moveBefore(first);
    }
    DenseMap<Operation *, unsigned> pos;
    for (auto [i, o] : llvm::enumerate(src.getBody().front()))
      pos[&o] = i;
    auto firstUse = [&](Value v) {
      unsigned p = ~0u;
      for (Operation *u : v.getUsers())
        p = std::min(p, pos.lookup(u));
      return p;
    };
    SmallVector<AllReduceOp> open;
    int64_t openElems = 0, openBytes = 0;
    unsigned openFirstUse = ~0u; // the earliest use of an open reduction
    auto close = [&]() {
      if (open.empty())
        return;
      Bucket bk;
      bk.elems = openElems;
      bk.elementType =
          cast<RankedTensorType>(open.front().getType()).getElementType();
      bk.last = open.back();
      unsigned index = buckets.size();
      int64_t offset = 0;
      for (AllReduceOp ar : open) {
        bucketSlice[ar.getInput()] = {index, offset};
        reducedIn[ar.getResult()] = index;
        offset += localElems(ar.getInput());
      }
      buckets.push_back(bk);
      open.clear();
      openElems = openBytes = 0;
      openFirstUse = ~0u;
    };
    for (Operation &o : src.getBody().front()) {
      // Over dp, and over cp and ep (context and expert parallelism's
      // ranks are data parallel for every weight but the experts).
      auto ar = dyn_cast<AllReduceOp>(o);
      if (!ar || !llvm::all_of(ar.getAxes(), [](Attribute a) {
            StringRef axis = cast<StringAttr>(a).getValue();
            return axis == "dp" || axis == OpShardingRule::kContextAxis ||
                   axis == OpShardingRule::kExpertAxis;
          }))
        continue;
      Operation *def = ar.getInput().getDefiningOp();
      // Gradients, not the loss (a scalar reported at the end), nor batch
      // norm's sums for its running statistics: a bucket's offsets decide
      // how MPI splits its sum, so the gradients' bucket stays what it is
      // without running statistics (the same rounding).
      if (!def || !ar.getInput().hasOneUse() ||
          isa<BatchNormMomentsOp, MoeLoadOp>(def) ||
          cast<RankedTensorType>(ar.getType()).getRank() == 0 ||
          !isa<ShardingRuleOpInterface>(def) ||
          isa<ReshapeOp, CrossEntropyOp, CrossEntropyGradOp,
              ShardingConstraintOp, SgdUpdateOp, AdamWUpdateOp>(def))
        continue;
      if (openFirstUse < pos[&o] ||
          (!open.empty() && (open.front().getType().getElementType() !=
                                 ar.getType().getElementType() ||
                             open.front().getAxes() != ar.getAxes())))
        close();
      open.push_back(ar);
      openFirstUse = std::min(openFirstUse, firstUse(ar.getResult()));
      openElems += localElems(ar.getInput());
      openBytes +=
          localElems(ar.getInput()) *
          cast<RankedTensorType>(ar.getType()).getElementTypeBitWidth() / 8;
      if (openBytes >= limit)
        close();
    }
    close();
    for (Bucket &bk : buckets)
      bk.buffer = rk::AllocOp::create(
          b, src.getLoc(), MemRefType::get({bk.elems}, bk.elementType));
  }

  // A tied embedding's gradient is the sum of two terms: the LM head's
  // matmul and the embedding's scatter. The matmul writes the sum's buffer
  // (its bucket slice) and the scatter adds into it (embedding_grad_add):
  // neither a zeroed [V, C] table nor the sum is materialized. Only where
  // both terms are this sum's alone and the matmul comes first; not across
  // pipeline stages nor microbatches, whose terms accumulate elsewhere.
  DenseMap<Value, Value> tiedScatter; // embedding_grad result -> term
  DenseMap<Value, Value> sumOfTerm;   // term (matmul result) -> sum
  DenseSet<Operation *> tiedAdds;     // the sums' adds
  if (isStep && !pipelined && seqAxis.empty()) {
    for (auto add : src.getBody().front().getOps<AddOp>()) {
      for (int k = 0; k < 2; ++k) {
        Value x = add->getOperand(k), e = add->getOperand(1 - k);
        auto mm = x.getDefiningOp<MatmulOp>();
        auto eg = e.getDefiningOp<EmbeddingGradOp>();
        if (!mm || !eg || x == e || !x.hasOneUse() || !e.hasOneUse() ||
            mm->getBlock() != add->getBlock() ||
            eg->getBlock() != add->getBlock() || !mm->isBeforeInBlock(eg) ||
            x.getType() != add.getType() || e.getType() != add.getType() ||
            getSharding(x) != getSharding(add.getResult()) ||
            getSharding(e) != getSharding(add.getResult()))
          continue;
        tiedScatter[e] = x;
        sumOfTerm[x] = add.getResult();
        tiedAdds.insert(add);
        break;
      }
    }
  }

  // Microbatching. The ops that touch the sequential axis (a tensor split
  // over it, or a pending sum over it) run in a loop, one microbatch per
  // iteration; a reduction that resolves the sum over it accumulates into a
  // buffer allocated before the loop (and reduces over the other axes after
  // it). Ops that need none of the loop's values run before it (a gathered
  // ZeRO-3 parameter), the rest after it (the optimizer).
  enum Phase { Pre, Loop, Post };
  auto involvesSeq = [&](Value v) {
    ShardingAttr s = getSharding(v);
    if (!s || seqAxis.empty())
      return false;
    if (llvm::is_contained(s.getPartialAxes(), seqAxis))
      return true;
    for (int64_t d = 0; d < s.getRank(); ++d)
      if (llvm::is_contained(s.getDimAxes(d), seqAxis))
        return true;
    return false;
  };
  DenseMap<Value, Phase> phaseOf;
  for (BlockArgument arg : src.getArguments())
    phaseOf[arg] = Pre;
  Operation *loop = nullptr; // the microbatch loop or the pipeline
  Block *loopBody = nullptr;
  Block *body0 = body;
  // Pipeline units by (stage, phase: 0 F, 1 B, 2 W), made with the pipeline
  // in the order F of every stage, then B and W from the last stage down.
  DenseMap<std::pair<int64_t, int64_t>, Block *> unitBody;
  DenseSet<Value> seqInputBuffers;
  auto ensureLoop = [&](Location loc) {
    if (loop)
      return;
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToEnd(body0);
    if (pipelined) {
      // Diagnostics about the schedule point at the parallel section.
      auto pipe = rk::PipelineOp::create(
          b, par ? par.getLoc() : loc, b.getStringAttr("pp"),
          b.getI64IntegerAttr(numStages),
          b.getI64IntegerAttr(forwardPipe ? 1 : seqSize),
          b.getStringAttr(par ? par.getSchedule() : "1f1b"));
      // Each stage's F, B and W FLOPs: the schedule's durations.
      if (auto f = src->getAttrOfType<DenseI64ArrayAttr>("plan.stage_flops"))
        pipe->setAttr("stage_flops", f);
      loop = pipe;
      b.setInsertionPointToStart(&pipe.getBody().emplaceBlock());
      auto makeUnit = [&](int64_t stage, int64_t phase) {
        bool last = phase == (splitW ? 2 : 1);
        auto unit = rk::UnitOp::create(b, loc, b.getI64IntegerAttr(stage),
                                       b.getStringAttr(phase == 0   ? "F"
                                                       : phase == 1 ? "B"
                                                                    : "W"),
                                       last ? b.getUnitAttr() : UnitAttr());
        Block *ub = &unit.getBody().emplaceBlock();
        ub->addArgument(b.getIndexType(), loc);
        unitBody[{stage, phase}] = ub;
      };
      for (int64_t st = 0; st < numStages; ++st)
        makeUnit(st, 0);
      for (int64_t st = numStages - 1; st >= 0; --st)
        makeUnit(st, 1);
      if (splitW)
        for (int64_t st = numStages - 1; st >= 0; --st)
          makeUnit(st, 2);
      // Inputs are cut into microbatches in each unit that reads them.
      for (BlockArgument arg : seqInputs)
        seqInputBuffers.insert(buf.lookup(arg));
      return;
    }
    loop = rk::MicrobatchLoopOp::create(b, loc, b.getI64IntegerAttr(seqSize));
    loopBody = &loop->getRegion(0).emplaceBlock();
    Value mb = loopBody->addArgument(b.getIndexType(), loc);
    b.setInsertionPointToStart(loopBody);
    for (BlockArgument arg : seqInputs) {
      auto t = cast<MemRefType>(buf.lookup(arg).getType());
      auto part =
          MemRefType::get(withRows(t.getShape(), t.getDimSize(0) / seqSize),
                          t.getElementType());
      buf[arg] = rk::RowsOp::create(b, loc, part, buf.lookup(arg), mb,
                                    b.getI64IntegerAttr(seqSize));
    }
  };
  // Pipelines: ops outside the units run only on the ranks that hold their
  // stage (rank.stage); a tied weight's gradient terms from two stages are
  // accumulated by each stage (splitAdds) and summed over pp after the
  // microbatches; the gradient norm's terms are summed per rank and then
  // over pp (ppPartial: plan value -> this rank's partial sum).
  struct Collect : public OpBuilder::Listener {
    SmallVector<Operation *> ops;
    void notifyOperationInserted(Operation *op,
                                 OpBuilder::InsertPoint) override {
      ops.push_back(op);
    }
  } created;
  if (pipelined)
    b.setListener(&created);
  DenseSet<Operation *> unguarded;
  DenseMap<Value, SmallVector<Value>> splitAdds; // plan value -> term buffers
  DenseMap<Value, Value> ppPartial;
  DenseSet<Value> ppReduced;
  SmallVector<rk::AllocOp> deadAllocs; // replaced by an accumulating GEMM
  for (Operation &op : src.getBody().front()) {
    Location loc = op.getLoc();
    // Registered once the op is lowered (this runs at every `continue`).
    llvm::scope_exit registerResults([&] {
      for (Value r : op.getResults())
        if (Value bv = buf.lookup(r))
          valuesOf[rootOf(bv)].push_back(r);
    });
    created.ops.clear();
    llvm::scope_exit markStage([&] {
      int64_t st = stageOf(&op);
      if (!pipelined || st < 0)
        return;
      for (Operation *o : created.ops)
        if (!isa<rk::PipelineOp>(o) && !o->getParentOfType<rk::PipelineOp>() &&
            !unguarded.contains(o))
          o->setAttr(rk::kRankStageAttr, b.getI64IntegerAttr(st));
    });
    Phase phase = Pre;
    bool accumulates = false;
    if (forwardPipe && !isa<func::ReturnOp>(op)) {
      // The forward of a pipeline: every op in its stage's F unit.
      phase = Loop;
    } else if (!seqAxis.empty()) {
      bool inLoop = llvm::any_of(op.getOperands(), involvesSeq) ||
                    llvm::any_of(op.getResults(), involvesSeq);
      accumulates = isa<AllReduceOp>(op) && involvesSeq(op.getOperand(0)) &&
                    !involvesSeq(op.getResult(0));
      // A parameter gathered (ZeRO-3) only for the loop is gathered in it,
      // per microbatch, so that its whole copy lives for one iteration; in
      // 16 bits ZeRO-3 gathers the cast of its shard. (ZeRO 1 and 2 gather
      // a 16-bit copy of their split master weights once per step, before
      // the loop, for every microbatch.)
      auto usedInLoop = [&](Operation *user) {
        return llvm::any_of(user->getOperands(), involvesSeq) ||
               llvm::any_of(user->getResults(), involvesSeq);
      };
      auto gathersParam = [&](Value in) {
        return isa<BlockArgument>(in) ||
               (par && par.getZeroStage() >= 3 && isParamCopy(in, src));
      };
      if (isa<AllGatherOp>(op) && gathersParam(op.getOperand(0)) &&
          !op.getResult(0).use_empty() &&
          llvm::all_of(op.getResult(0).getUsers(), usedInLoop))
        inLoop = true;
      if (accumulates) {
        phase = Post;
      } else if (inLoop) {
        phase = Loop;
      } else {
        for (Value v : op.getOperands())
          phase = std::max(
              phase, phaseOf.lookup(v) == Loop ? Post : phaseOf.lookup(v));
        if (isa<func::ReturnOp>(op))
          phase = Post;
      }
      if (phase == Loop &&
          (isa<AllGatherOp, AllSliceOp, AllToAllOp, ReduceScatterOp>(op) &&
           op.getAttrOfType<StringAttr>("axis").getValue() == seqAxis)) {
        op.emitError() << "moves data between microbatches, which run one "
                          "after the other; not supported";
        return failure();
      }
    }
    if (forwardPipe || !seqAxis.empty()) {
      if (phase == Loop && pipelined) {
        ensureLoop(loc);
        int64_t st = stageOf(&op);
        auto ph = op.getAttrOfType<StringAttr>(kPhaseAttr);
        int64_t phi = !ph || ph.getValue() == "F"       ? 0
                      : ph.getValue() == "B" || !splitW ? 1
                                                        : 2;
        if (st < 0 && !isa<AddOp>(op) &&
            !(isa<ReduceScatterOp>(op) && splitAdds.count(op.getOperand(0)))) {
          op.emitError() << "runs per microbatch on several pipeline stages "
                            "at once; not supported";
          return failure();
        }
        if (st >= 0)
          b.setInsertionPointToEnd(unitBody.lookup({st, phi}));
      } else if (phase == Loop) {
        ensureLoop(loc);
        b.setInsertionPointToEnd(loopBody);
      } else if (phase == Pre && loop) {
        b.setInsertionPoint(loop);
      } else {
        b.setInsertionPointToEnd(body0);
      }
      for (Value r : op.getResults())
        phaseOf[r] = phase;
    }
    // A pipeline's partial sum is summed over pp before its first other use.
    if (pipelined && !(isa<AddOp>(op) && stageOf(&op) < 0 && phase == Post))
      for (Value v : op.getOperands())
        if (Value acc = ppPartial.lookup(v); acc && ppReduced.insert(v).second)
          unguarded.insert(
              rk::AllReduceOp::create(b, loc, acc, b.getStrArrayAttr({"pp"})));
    if (pipelined && phase == Post && isa<AddOp>(op) && stageOf(&op) < 0 &&
        cast<RankedTensorType>(op.getResult(0).getType()).getRank() == 0) {
      Value acc;
      for (Value v : op.getOperands())
        if (Value p = ppPartial.lookup(v); p && !acc)
          acc = p;
      if (!acc) {
        acc = rk::AllocOp::create(b, loc, MemRefType::get({}, b.getF32Type()));
        rk::FillOp::create(b, loc, acc, b.getF32FloatAttr(0));
      }
      for (Value v : op.getOperands()) {
        if (ppPartial.lookup(v) == acc)
          continue;
        Value x = ppPartial.lookup(v) ? ppPartial.lookup(v) : buf.lookup(v);
        auto add =
            rk::AddOp::create(b, loc, TypeRange(), ValueRange{acc, x, acc},
                              ArrayRef<NamedAttribute>());
        // A term every stage holds counts once (on the first pipeline rank).
        Operation *def = v.getDefiningOp();
        int64_t st = def ? stageOf(def) : -1;
        if (!ppPartial.lookup(v))
          add->setAttr(rk::kRankStageAttr,
                       b.getI64IntegerAttr(st >= 0 ? st : 0));
      }
      ppPartial[op.getResult(0)] = acc;
      buf[op.getResult(0)] = acc;
      continue;
    }
    if (pipelined && phase == Loop && isa<AddOp>(op) && stageOf(&op) < 0) {
      // The sum over microbatches (an all-reduce over the sequential axis)
      // may follow a reduce-scatter over dp (ZeRO 2 and 3 scatter each
      // microbatch's gradient, which is linear: each stage scatters its
      // term).
      Value r = op.getResult(0);
      auto onlyUser = [](Value v) -> Operation * {
        return v.hasOneUse() ? *v.getUsers().begin() : nullptr;
      };
      Value summed = r;
      if (auto rs = dyn_cast_or_null<ReduceScatterOp>(onlyUser(r)))
        summed = rs.getResult();
      auto ar = dyn_cast_or_null<AllReduceOp>(onlyUser(summed));
      if (!ar || !involvesSeq(summed) || involvesSeq(ar.getResult())) {
        op.emitError() << "sums values of several pipeline stages per "
                          "microbatch; only gradients of a parameter shared "
                          "by stages are supported";
        return failure();
      }
      SmallVector<Value> terms;
      for (Value v : op.getOperands())
        terms.push_back(buf.lookup(v));
      splitAdds[r] = terms;
      continue;
    }
    if (auto rs = dyn_cast<ReduceScatterOp>(op);
        rs && splitAdds.count(rs.getInput())) {
      FailureOr<MemRefType> type = localType(rs.getResult(), &op);
      if (failed(type))
        return failure();
      SmallVector<Value> scattered;
      for (Value part : splitAdds.lookup(rs.getInput())) {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPointToEnd(part.getParentBlock());
        Value out = rk::AllocOp::create(b, loc, *type);
        rk::ReduceScatterOp::create(b, loc, part, out, rs.getDimAttr(),
                                    rs.getAxisAttr());
        scattered.push_back(out);
      }
      splitAdds[rs.getResult()] = scattered;
      continue;
    }
    // The first use of a bucketed gradient waits for its bucket.
    for (Value v : op.getOperands()) {
      auto it = reducedIn.find(v);
      if (it == reducedIn.end() || buckets[it->second].waited)
        continue;
      rk::CollectiveWaitOp::create(b, loc,
                                   b.getI64IntegerAttr(it->second % kSlots));
      buckets[it->second].waited = true;
    }
    if (accumulates) {
      auto ar = cast<AllReduceOp>(op);
      // The terms: the input, or a shared parameter's gradient terms from
      // several stages, each accumulated where it is computed.
      SmallVector<Value> terms{buf.lookup(ar.getInput())};
      if (auto it = splitAdds.find(ar.getInput()); it != splitAdds.end())
        terms = it->second;
      Value acc;
      {
        OpBuilder::InsertionGuard g(b);
        b.setInsertionPoint(loop);
        acc = rk::AllocOp::create(b, loc, cast<MemRefType>(terms[0].getType()));
        rk::FillOp::create(b, loc, acc, b.getF32FloatAttr(0));
        for (Value part : terms) {
          // A term written by a GEMM into a buffer nothing else reads is
          // accumulated by the GEMM itself (c += a b: no temporary, no add).
          auto alloc = part.getDefiningOp<rk::AllocOp>();
          auto mm = part.hasOneUse()
                        ? dyn_cast<rk::MatmulOp>(*part.getUsers().begin())
                        : rk::MatmulOp();
          if (alloc && mm && mm.getOut() == part && !mm.getAccumulate() &&
              part.getType() == acc.getType()) {
            mm.getOutMutable().assign(acc);
            mm.setAccumulate(true);
            // Erased at the end: buffers key the maps of this lowering.
            deadAllocs.push_back(alloc);
            continue;
          }
          if (pipelined)
            b.setInsertionPointToEnd(part.getParentBlock());
          else
            b.setInsertionPointToEnd(loopBody);
          rk::AddOp::create(b, loc, TypeRange(), ValueRange{acc, part, acc},
                            ArrayRef<NamedAttribute>());
        }
      }
      SmallVector<Attribute> rest;
      for (Attribute a : ar.getAxes())
        if (cast<StringAttr>(a).getValue() != seqAxis)
          rest.push_back(a);
      if (terms.size() > 1)
        rest.push_back(b.getStringAttr("pp"));
      if (!rest.empty())
        rk::AllReduceOp::create(b, loc, acc, b.getArrayAttr(rest));
      buf[ar.getResult()] = acc;
      continue;
    }
    // A reference compares whole tensors of step 1: not per microbatch.
    bool inLoop = phase == Loop;
    auto in = [&](unsigned i) { return buf.lookup(op.getOperand(i)); };
    // The loss, reported by every rank (with a pipeline it is computed on
    // the last stage and sent to every rank).
    auto reportLoss = [&](Value loss) {
      Value local = buf.lookup(loss);
      if (!pipelined) {
        rk::ReportLossOp::create(b, loc, local);
        return;
      }
      Value whole;
      {
        // The forward pipeline's loss lives in the last stage's unit: it is
        // copied out at the unit's end into a buffer made before it.
        OpBuilder::InsertionGuard g(b);
        if (forwardPipe && loop)
          b.setInsertionPoint(loop);
        whole = rk::AllocOp::create(b, loc, cast<MemRefType>(local.getType()));
        rk::FillOp::create(b, loc, whole, b.getF32FloatAttr(0));
      }
      Operation *def = loss.getDefiningOp();
      Operation *localDef = local.getDefiningOp();
      OpBuilder::InsertPoint after = b.saveInsertionPoint();
      bool inUnit =
          forwardPipe && localDef && localDef->getParentOfType<rk::UnitOp>();
      if (inUnit)
        b.setInsertionPointToEnd(localDef->getBlock());
      auto copy =
          rk::CopyOp::create(b, loc, TypeRange(), ValueRange{local, whole},
                             ArrayRef<NamedAttribute>());
      if (!inUnit)
        copy->setAttr(
            rk::kRankStageAttr,
            b.getI64IntegerAttr(def ? std::max<int64_t>(stageOf(def), 0) : 0));
      b.restoreInsertionPoint(after);
      rk::AllReduceOp::create(b, loc, whole, b.getStrArrayAttr({"pp"}));
      rk::ReportLossOp::create(b, loc, whole);
    };
    if (isa<func::ReturnOp>(op) && !isStep) {
      // The forward function's loss is what evaluation reports (generation
      // reads the observed logits).
      if (op.getNumOperands() == 1 && buf.lookup(op.getOperand(0)))
        reportLoss(op.getOperand(0));
      func::ReturnOp::create(b, loc);
      continue;
    }
    if (isa<func::ReturnOp>(op)) {
      // Results: the loss, the gradients' sum of squares, and parameters and
      // optimizer state, updated in place, or computed elsewhere (e.g.
      // gathered after a sharded update) and copied back.
      SmallVector<BlockArgument> updated = updatedArgs(src);
      for (auto [i, v] : llvm::enumerate(op.getOperands())) {
        auto role = src.getResultAttrOfType<StringAttr>(i, kResultAttr);
        if (role && role.getValue() == "loss")
          reportLoss(v);
        else if (role && role.getValue() == "grad_sumsq")
          rk::ReportGradNormOp::create(b, loc, in(i));
        else if (i < updated.size() && updated[i]) {
          Value dst = buf.lookup(updated[i]);
          if (rootOf(in(i)) != rootOf(dst)) {
            auto copy = rk::CopyOp::create(b, loc, in(i), dst);
            if (pipelined && argStage(updated[i].getArgNumber()) >= 0)
              copy->setAttr(
                  rk::kRankStageAttr,
                  b.getI64IntegerAttr(argStage(updated[i].getArgNumber())));
          }
        } else {
          op.emitError() << "result " << i << " is neither the loss, the "
                         << "gradient norm, a parameter nor optimizer state";
          return failure();
        }
      }
      func::ReturnOp::create(b, loc);
      continue;
    }
    // In-place ops overwrite their operand's buffer, which is only safe when
    // every other use of the operand comes before them.
    // A reshape's buffer is a view of its source: every value that shares
    // the buffer counts.
    auto lastUse = [&](Value v) {
      Value root = rootOf(buf.lookup(v));
      return llvm::all_of(valuesOf[root], [&](Value u) {
        return llvm::all_of(u.getUsers(), [&](Operation *user) {
          return user == &op || user->isBeforeInBlock(&op);
        });
      });
    };
    if (auto ar = dyn_cast<AllReduceOp>(op)) {
      if (!lastUse(ar.getInput())) {
        ar.emitError() << "the reduced value has later uses; not supported "
                          "yet";
        return failure();
      }
      if (auto it = reducedIn.find(ar.getResult()); it != reducedIn.end()) {
        Bucket &bk = buckets[it->second];
        if (bk.last == &op) {
          // planrt has kSlots slots: a bucket reuses the slot of the one
          // kSlots before it, which is waited for first.
          if (it->second >= kSlots && !buckets[it->second - kSlots].waited) {
            rk::CollectiveWaitOp::create(
                b, loc, b.getI64IntegerAttr(it->second % kSlots));
            buckets[it->second - kSlots].waited = true;
          }
          rk::AllReduceStartOp::create(
              b, loc, bk.buffer, ar.getAxes(),
              b.getI64IntegerAttr(it->second % kSlots));
        }
        buf[ar.getResult()] = in(0);
        continue;
      }
      rk::AllReduceOp::create(b, loc, in(0), ar.getAxes());
      buf[ar.getResult()] = in(0);
      continue;
    }
    if (isa<AllGatherOp, ReduceScatterOp, AllSliceOp, AllToAllOp>(op)) {
      FailureOr<MemRefType> type = localType(op.getResult(0), &op);
      if (failed(type))
        return failure();
      Value out = rk::AllocOp::create(b, loc, *type);
      auto axis = op.getAttrOfType<StringAttr>("axis");
      if (auto a2a = dyn_cast<AllToAllOp>(op))
        rk::AllToAllOp::create(b, loc, in(0), out, a2a.getGatherDimAttr(),
                               a2a.getSplitDimAttr(), axis);
      else if (isa<AllGatherOp>(op))
        rk::AllGatherOp::create(b, loc, in(0), out,
                                op.getAttrOfType<IntegerAttr>("dim"), axis);
      else if (isa<ReduceScatterOp>(op))
        rk::ReduceScatterOp::create(b, loc, in(0), out,
                                    op.getAttrOfType<IntegerAttr>("dim"), axis);
      else
        rk::ShardSliceOp::create(b, loc, in(0), out,
                                 op.getAttrOfType<IntegerAttr>("dim"), axis);
      buf[op.getResult(0)] = out;
      continue;
    }
    // The gradient norm: each rank adds the squares of its blocks of every
    // gradient into one scalar, a pending sum over the axes that split any
    // of them (one all-reduce, where one per gradient would wait on each).
    // A gradient whole over one of those axes counts on that axis's first
    // rank only. With a pipeline, each term counts on the ranks of its
    // gradient's stage (a shared one on the first stage's), and the scalar
    // is summed over pp before its first use.
    if (auto ss = dyn_cast<SumSqOp>(op)) {
      FailureOr<MemRefType> type = localType(ss.getResult(), &op);
      if (failed(type))
        return failure();
      Value out = rk::AllocOp::create(b, loc, *type);
      Operation *fill = rk::FillOp::create(b, loc, out, f32(0));
      if (pipelined) {
        unguarded.insert(out.getDefiningOp());
        unguarded.insert(fill);
        ppPartial[ss.getResult()] = out;
      }
      SmallVector<StringRef> pending =
          getSharding(ss.getResult()).getPartialAxes();
      for (auto [i, g] : llvm::enumerate(ss.getInputs())) {
        ShardingAttr s = getSharding(g);
        SmallVector<Attribute> whole;
        for (StringRef a : pending) {
          bool splits = false;
          for (int64_t d = 0; s && d < s.getRank() && !splits; ++d)
            splits = llvm::is_contained(s.getDimAxes(d), a);
          if (!splits)
            whole.push_back(b.getStringAttr(a));
        }
        auto acc = rk::SumSqAccumulateOp::create(
            b, loc, in(i), out,
            whole.empty() ? ArrayAttr() : b.getArrayAttr(whole));
        if (pipelined) {
          Operation *def = g.getDefiningOp();
          int64_t st = def ? stageOf(def) : -1;
          acc->setAttr(rk::kRankStageAttr,
                       b.getI64IntegerAttr(std::max<int64_t>(st, 0)));
          unguarded.insert(acc);
        }
      }
      buf[ss.getResult()] = out;
      continue;
    }
    // Cross-entropy over vocab-parallel logits: from row statistics
    // exchanged over the vocabulary's axis (the full logits are gathered only
    // for generation).
    if (isa<CrossEntropyOp, CrossEntropyGradOp>(op)) {
      Value logits = op.getOperand(0), targets = op.getOperand(1);
      FailureOr<StringAttr> axis = vocabAxis(logits, &op);
      if (failed(axis))
        return failure();
      if (*axis) {
        FailureOr<MemRefType> type = localType(op.getResult(0), &op);
        if (failed(type))
          return failure();
        Value out = rk::AllocOp::create(b, loc, *type);
        IntegerAttr valid = validClasses(&op);
        auto [rowmax, stats] = ceStats(in(0), in(1), *axis, valid, loc);
        if (isa<CrossEntropyGradOp>(op)) {
          rk::CeGradFromStatsOp::create(b, loc, in(0), in(1), rowmax, stats,
                                        out, lossScale(targets), *axis, valid);
        } else {
          rk::CeLossFromStatsOp::create(b, loc, stats, rowmax, out,
                                        lossScale(targets));
          if (!isStep) {
            auto t = cast<MemRefType>(in(0).getType());
            SmallVector<int64_t> shape(t.getShape());
            shape.back() *= mesh.getAxisSize(axis->getValue());
            Value whole = rk::AllocOp::create(
                b, loc, MemRefType::get(shape, t.getElementType()));
            rk::AllGatherOp::create(b, loc, in(0), whole,
                                    b.getI64IntegerAttr(t.getRank() - 1),
                                    *axis);
            rk::ObserveOp::create(b, loc, whole, b.getStringAttr("logits"));
          }
        }
        buf[op.getResult(0)] = out;
        continue;
      }
    }
    if (auto r = dyn_cast<ReshapeOp>(op)) {
      FailureOr<MemRefType> type = localType(r.getResult(), &op);
      if (failed(type))
        return failure();
      buf[r.getResult()] = rk::ViewOp::create(b, loc, *type, in(0));
      continue;
    }
    // Evaluation: dropout keeps every element.
    if (isa<DropoutOp>(op) && !isStep) {
      buf[op.getResult(0)] = in(0);
      continue;
    }
    // A mixture of experts' bias is updated in place.
    if (auto up = dyn_cast<MoeBiasUpdateOp>(op)) {
      rk::MoeBiasUpdateOp::create(b, loc, in(0), in(1), up.getRateAttr());
      buf[up.getResult()] = in(0);
      continue;
    }
    // Batch norm's running statistics are updated in place.
    if (auto up = dyn_cast<RunningStatsUpdateOp>(op)) {
      rk::RunningStatsUpdateOp::create(b, loc, in(0), in(1), in(2), in(3),
                                       up.getCountAttr(), up.getMomentumAttr());
      buf[up.getNewMean()] = in(0);
      buf[up.getNewVar()] = in(1);
      continue;
    }
    // Optimizer updates write the parameter's own buffer.
    if (isa<SgdUpdateOp, AdamWUpdateOp>(op)) {
      observeGrad(&op, in(1), loc);
      gradBytes += cast<MemRefType>(in(1).getType()).getNumElements() * 4;
      if (pipelined)
        countBytes(1, stageOf(&op),
                   cast<MemRefType>(in(1).getType()).getNumElements() * 4);
      // The parameter's (shard's) buffer and the moments are updated in
      // place.
      if (auto sgd = dyn_cast<SgdUpdateOp>(op)) {
        // SGD clips the gradient in place first (AdamW's update does it as
        // it reads the gradient).
        if (Value sumsq = sgd.getClipSumsq()) {
          if (!lastUse(sgd.getGrad())) {
            sgd.emitError() << "the clipped gradient has later uses; not "
                               "supported yet";
            return failure();
          }
          rk::ClipByGlobalNormOp::create(b, loc, in(1), buf.lookup(sumsq),
                                         sgd.getMaxNormAttr());
        }
        rk::SgdUpdateOp::create(b, loc, in(0), in(1), /*copy=*/Value(),
                                sgd.getLrAttr());
      } else {
        auto aw = cast<AdamWUpdateOp>(op);
        Value sumsq = aw.getClipSumsq();
        rk::AdamWUpdateOp::create(b, loc, in(0), in(1), in(2), in(3),
                                  sumsq ? buf.lookup(sumsq) : Value(),
                                  /*copy=*/Value(), aw.getLrAttr(),
                                  aw.getBeta1Attr(), aw.getBeta2Attr(),
                                  aw.getEpsAttr(), aw.getWeightDecayAttr(),
                                  aw.getMaxNormAttr());
        buf[aw.getNewExpAvg()] = in(2);
        buf[aw.getNewExpAvgSq()] = in(3);
      }
      buf[op.getResult(0)] = in(0);
      continue;
    }

    // The tied embedding's sum (see tiedScatter): the scatter adds into
    // the matmul's buffer, which is the sum's.
    if (auto it =
            tiedScatter.find(op.getNumResults() ? op.getResult(0) : Value());
        it != tiedScatter.end()) {
      auto eg = cast<EmbeddingGradOp>(op);
      FailureOr<StringAttr> axis = rowAxis(eg.getResult(), &op);
      if (failed(axis))
        return failure();
      Value into = buf.lookup(it->second);
      rk::EmbeddingGradAddOp::create(b, loc, in(0), in(1), into,
                                     *axis ? *axis : b.getStringAttr(""));
      buf[eg.getResult()] = into;
      continue;
    }
    if (tiedAdds.contains(&op)) { // both terms are already in its buffer
      buf[op.getResult(0)] = in(0);
      continue;
    }
    SmallVector<Value> outs;
    for (Value result : op.getResults()) {
      FailureOr<MemRefType> type = localType(result, &op);
      if (failed(type))
        return failure();
      // A tied sum's first term is computed where the sum goes.
      Value dest = sumOfTerm.lookup_or(result, result);
      if (auto it = bucketSlice.find(dest); it != bucketSlice.end())
        outs.push_back(rk::SubviewOp::create(
            b, loc, *type, buckets[it->second.first].buffer,
            b.getI64IntegerAttr(it->second.second)));
      else
        outs.push_back(rk::AllocOp::create(b, loc, *type));
      buf[result] = outs.back();
    }
    Value out = outs.front();
    // Most ops map one to one: their buffers, then the destination.
    SmallVector<Value> operands;
    for (Value v : op.getOperands())
      operands.push_back(buf.lookup(v));
    operands.push_back(out);
    auto same = [&](auto rankOp) {
      decltype(rankOp)::create(b, loc, TypeRange(), operands,
                               ArrayRef<NamedAttribute>());
      return true;
    };
    bool ok =
        llvm::TypeSwitch<Operation *, bool>(&op)
            .Case<MatmulOp>([&](MatmulOp mm) {
              rk::MatmulOp::create(b, loc, in(0), in(1), /*residual=*/Value(),
                                   out, mm.getTransposeLhs(),
                                   mm.getTransposeRhs());
              return true;
            })
            .Case<BiasAddOp>([&](auto) { return same(rk::BiasAddOp()); })
            .Case<CastOp>([&](auto) { return same(rk::CastOp()); })
            .Case<LossScaleOp>([&](LossScaleOp ls) {
              rk::LossScaleOp::create(b, loc, in(0), out,
                                      b.getBoolAttr(ls.getInverse()));
              return true;
            })
            .Case<MulOp>([&](auto) { return same(rk::MulOp()); })
            .Case<ScaleOp>([&](ScaleOp sc) {
              rk::ScaleOp::create(b, loc, in(0), out, sc.getFactorAttr());
              return true;
            })
            .Case<SubOp>([&](auto) { return same(rk::SubOp()); })
            .Case<SiluOp>([&](auto) { return same(rk::SiluOp()); })
            .Case<SiluGradOp>([&](auto) { return same(rk::SiluGradOp()); })
            .Case<SoftmaxOp>([&](auto) { return same(rk::SoftmaxOp()); })
            .Case<SoftmaxGradOp>(
                [&](auto) { return same(rk::SoftmaxGradOp()); })
            .Case<EmbeddingOp>([&](EmbeddingOp e) {
              FailureOr<StringAttr> axis = rowAxis(e.getTable(), &op);
              if (failed(axis))
                return false;
              rk::EmbeddingOp::create(b, loc, in(0), in(1), out,
                                      *axis ? *axis : b.getStringAttr(""));
              return true;
            })
            .Case<EmbeddingGradOp>([&](EmbeddingGradOp e) {
              FailureOr<StringAttr> axis = rowAxis(e.getResult(), &op);
              if (failed(axis))
                return false;
              rk::EmbeddingGradOp::create(b, loc, in(0), in(1), out,
                                          *axis ? *axis : b.getStringAttr(""));
              return true;
            })
            .Case<PosEmbeddingOp>([&](PosEmbeddingOp p) {
              rk::PosEmbeddingOp::create(b, loc, in(0), in(1), out,
                                         contextAxis(p.getInput()));
              return true;
            })
            .Case<PosEmbeddingGradOp>([&](PosEmbeddingGradOp p) {
              rk::PosEmbeddingGradOp::create(b, loc, in(0), out,
                                             contextAxis(p.getGrad()));
              return true;
            })
            .Case<LayerNormOp>([&](LayerNormOp ln) {
              rk::LayerNormOp::create(b, loc, in(0), in(1), in(2), out,
                                      ln.getEpsAttr());
              return true;
            })
            .Case<LayerNormGradOp>([&](LayerNormGradOp g) {
              rk::LayerNormGradOp::create(b, loc, in(0), in(1), in(2),
                                          /*residual=*/Value(), outs[0],
                                          outs[1], outs[2], g.getEpsAttr());
              return true;
            })
            .Case<RmsNormOp>([&](RmsNormOp rn) {
              rk::RmsNormOp::create(b, loc, in(0), in(1), out, rn.getEpsAttr());
              return true;
            })
            .Case<RmsNormGradOp>([&](RmsNormGradOp g) {
              rk::RmsNormGradOp::create(b, loc, in(0), in(1), in(2),
                                        /*residual=*/Value(), outs[0], outs[1],
                                        g.getEpsAttr());
              return true;
            })
            .Case<BatchNormOp>([&](BatchNormOp bn) {
              // The forward function evaluates: the running statistics.
              if (!isStep && !bn.getRunning().empty())
                rk::BatchNormInferOp::create(b, loc, in(0), in(1), in(2), in(3),
                                             in(4), out, bn.getEpsAttr());
              else
                rk::BatchNormOp::create(b, loc, in(0), in(1), in(2), out,
                                        batchAxes(bn.getInput()),
                                        bn.getEpsAttr());
              return true;
            })
            .Case<BatchNormMomentsOp>([&](auto) {
              rk::BatchNormMomentsOp::create(b, loc, in(0), outs[0], outs[1]);
              return true;
            })
            .Case<BatchNormGradOp>([&](BatchNormGradOp g) {
              rk::BatchNormGradOp::create(
                  b, loc, in(0), in(1), in(2), outs[0], outs[1], outs[2],
                  batchAxes(g.getInput()), g.getEpsAttr());
              return true;
            })
            .Case<GroupNormOp>([&](GroupNormOp gn) {
              rk::GroupNormOp::create(b, loc, in(0), in(1), in(2), out,
                                      gn.getEpsAttr(), gn.getGroupsAttr());
              return true;
            })
            .Case<GroupNormGradOp>([&](GroupNormGradOp g) {
              rk::GroupNormGradOp::create(b, loc, in(0), in(1), in(2), outs[0],
                                          outs[1], outs[2], g.getEpsAttr(),
                                          g.getGroupsAttr());
              return true;
            })
            .Case<DropoutOp>([&](DropoutOp d) {
              // The mesh axes of each dimension (up to 4), and whether the
              // microbatch axis splits the batch too.
              SmallVector<Attribute> dims;
              int64_t rank = d.getInput().getType().getRank();
              if (rank > 4) {
                op.emitError() << "dropout supports tensors of rank <= 4";
                return false;
              }
              DimSplit batch = dimSplit(d.getInput(), 0);
              for (int64_t i = 0; i < 4; ++i)
                dims.push_back(b.getStrArrayAttr(
                    i == 0     ? batch.axes
                    : i < rank ? dimSplit(d.getInput(), i).axes
                               : SmallVector<StringRef>()));
              rk::DropoutOp::create(
                  b, loc, in(0), out, cast<ArrayAttr>(dims[0]),
                  cast<ArrayAttr>(dims[1]), cast<ArrayAttr>(dims[2]),
                  cast<ArrayAttr>(dims[3]),
                  b.getI64IntegerAttr(batch.microbatched ? seqSize : 0),
                  b.getStrArrayAttr(batch.inner), d.getPAttr(), d.getUidAttr());
              return true;
            })
            .Case<Conv2dOp>([&](Conv2dOp c) {
              rk::Conv2dOp::create(b, loc, in(0), in(1), out, c.getStrideAttr(),
                                   c.getPaddingAttr(), c.getDilationAttr(),
                                   c.getGroupsAttr());
              return true;
            })
            .Case<Conv2dGradOp>([&](Conv2dGradOp c) {
              rk::Conv2dGradOp::create(b, loc, in(0), in(1), in(2), outs[0],
                                       outs[1], c.getStrideAttr(),
                                       c.getPaddingAttr(), c.getDilationAttr(),
                                       c.getGroupsAttr());
              return true;
            })
            .Case<Pool2dOp>([&](Pool2dOp p) {
              rk::Pool2dOp::create(b, loc, in(0), out, p.getKindAttr(),
                                   p.getKernelAttr(), p.getStrideAttr(),
                                   p.getPaddingAttr());
              return true;
            })
            .Case<Pool2dGradOp>([&](Pool2dGradOp p) {
              rk::Pool2dGradOp::create(b, loc, in(0), in(1), out,
                                       p.getKindAttr(), p.getKernelAttr(),
                                       p.getStrideAttr(), p.getPaddingAttr());
              return true;
            })
            .Case<ChannelBiasAddOp>(
                [&](auto) { return same(rk::ChannelBiasAddOp()); })
            .Case<ChannelBiasGradOp>(
                [&](auto) { return same(rk::ChannelBiasGradOp()); })
            .Case<AttentionOp>([&](AttentionOp a) {
              auto [h, kv] =
                  localHeads(a.getQkv(), a.getNumHeads(), a.getNumKvHeads());
              StringAttr cp = contextAxis(a.getQkv());
              AttnDropoutAttrs z = attnDropout(a, a.getQkv());
              if (cp.getValue().empty()) {
                z.create<rk::AttentionOp>(b, loc, in(0), out, h, kv);
                return true;
              }
              int64_t G = mesh.getAxisSize(cp.getValue());
              std::string how = cpExchange(h.getInt(), kv.getInt(), G);
              if (how == "ring") {
                z.create<rk::AttentionRingOp>(b, loc, in(0), out, Value(), h,
                                              kv, cp);
                return true;
              }
              if (how == "all_gather") {
                Value kvs = kvGather(a.getQkv(), in(0), h.getInt(), kv.getInt(),
                                     cp, loc);
                z.create<rk::AttentionCpOp>(b, loc, in(0), kvs, out, Value(), h,
                                            kv, cp);
                return true;
              }
              z = attnDropout(a, a.getQkv(), cp.getValue());
              FailureOr<Value> qkv = headSplit(a.getQkv(), in(0), h.getInt(),
                                               kv.getInt(), cp, &op);
              if (failed(qkv))
                return false;
              Value o = rk::AllocOp::create(b, loc, headSplitType(out, G));
              z.create<rk::AttentionOp>(b, loc, *qkv, o,
                                        b.getI64IntegerAttr(h.getInt() / G),
                                        b.getI64IntegerAttr(kv.getInt() / G));
              rk::HeadsToSeqOp::create(
                  b, loc, o, out, cast<MemRefType>(out.getType()).getDimSize(2),
                  0, cp);
              return true;
            })
            .Case<MoeTopkOp>([&](MoeTopkOp t) {
              auto capacity = b.getI64IntegerAttr(t.getCapacity().value_or(0));
              if (t.getBias())
                rk::MoeTopkBiasedOp::create(b, loc, in(0), in(1), out,
                                            t.getTopKAttr(), capacity);
              else
                rk::MoeTopkOp::create(b, loc, in(0), out, t.getTopKAttr(),
                                      capacity);
              return true;
            })
            .Case<MoeAuxGradOp>([&](MoeAuxGradOp a) {
              rk::MoeAuxGradOp::create(b, loc, in(0), in(1), out,
                                       a.getCoefficientAttr(),
                                       a.getSequencesAttr());
              return true;
            })
            .Case<MoeLoadOp>([&](auto) { return same(rk::MoeLoadOp()); })
            .Case<MoeGatesOp>([&](auto) { return same(rk::MoeGatesOp()); })
            .Case<MoeGatesGradOp>(
                [&](auto) { return same(rk::MoeGatesGradOp()); })
            .Case<MoeExpertsOp>([&](MoeExpertsOp m) {
              FailureOr<StringAttr> ep = splitAxis(m.getUp(), 0, &op);
              if (failed(ep))
                return false;
              if (m.getGate())
                rk::MoeExpertsSwigluOp::create(b, loc, in(0), in(1), in(2),
                                               in(5), in(3), in(4), out, *ep);
              else
                rk::MoeExpertsOp::create(b, loc, in(0), in(1), in(2), in(3),
                                         in(4), out, *ep);
              return true;
            })
            .Case<MoeExpertsGradOp>([&](MoeExpertsGradOp m) {
              FailureOr<StringAttr> ep = splitAxis(m.getUp(), 0, &op);
              if (failed(ep))
                return false;
              if (m.getGate())
                rk::MoeExpertsSwigluGradOp::create(
                    b, loc, in(0), in(1), in(2), in(3), in(6), in(4), in(5),
                    outs[0], outs[1], outs[4], outs[2], outs[3], *ep);
              else
                rk::MoeExpertsGradOp::create(b, loc, in(0), in(1), in(2), in(3),
                                             in(4), in(5), outs[0], outs[1],
                                             outs[2], outs[3], *ep);
              return true;
            })
            .Case<RopeOp>([&](RopeOp r) {
              auto [h, kv] =
                  localHeads(r.getQkv(), r.getNumHeads(), r.getNumKvHeads());
              rk::RopeOp::create(b, loc, in(0), out, h, kv, r.getThetaAttr(),
                                 b.getBoolAttr(r.getInverse()),
                                 contextAxis(r.getQkv()));
              return true;
            })
            .Case<AttentionGradOp>([&](AttentionGradOp a) {
              auto [h, kv] =
                  localHeads(a.getQkv(), a.getNumHeads(), a.getNumKvHeads());
              StringAttr cp = contextAxis(a.getQkv());
              AttnDropoutAttrs z = attnDropout(a, a.getQkv());
              if (cp.getValue().empty()) {
                z.create<rk::AttentionGradOp>(b, loc, in(0), in(1), out, h, kv);
                return true;
              }
              int64_t G = mesh.getAxisSize(cp.getValue());
              std::string how = cpExchange(h.getInt(), kv.getInt(), G);
              if (how == "ring") {
                z.create<rk::AttentionRingGradOp>(b, loc, in(0), in(1), out,
                                                  Value(), Value(), h, kv, cp);
                return true;
              }
              if (how == "all_gather") {
                Value kvs = kvGather(a.getQkv(), in(0), h.getInt(), kv.getInt(),
                                     cp, loc);
                auto kt = cast<MemRefType>(kvs.getType());
                Value dkv = rk::AllocOp::create(
                    b, loc, MemRefType::get(kt.getShape(), b.getF32Type()));
                z.create<rk::AttentionCpGradOp>(b, loc, in(0), kvs, in(1), out,
                                                dkv, Value(), Value(), h, kv,
                                                cp);
                int64_t kvWidth = kt.getDimSize(2) / 2;
                rk::KvReduceScatterOp::create(
                    b, loc, dkv, out,
                    cast<MemRefType>(out.getType()).getDimSize(2) - 2 * kvWidth,
                    kvWidth, cp);
                return true;
              }
              FailureOr<Value> qkv = headSplit(a.getQkv(), in(0), h.getInt(),
                                               kv.getInt(), cp, &op);
              if (failed(qkv))
                return false;
              int64_t width = cast<MemRefType>(in(1).getType()).getDimSize(2);
              int64_t kvWidth = width / h.getInt() * kv.getInt();
              Value dy = rk::AllocOp::create(b, loc, headSplitType(in(1), G));
              rk::SeqToHeadsOp::create(b, loc, in(1), dy, width, 0, cp);
              Value dx = rk::AllocOp::create(b, loc, headSplitType(out, G));
              z = attnDropout(a, a.getQkv(), cp.getValue());
              z.create<rk::AttentionGradOp>(
                  b, loc, *qkv, dy, dx, b.getI64IntegerAttr(h.getInt() / G),
                  b.getI64IntegerAttr(kv.getInt() / G));
              rk::HeadsToSeqOp::create(b, loc, dx, out, width, kvWidth, cp);
              return true;
            })
            .Case<CrossEntropyOp>([&](CrossEntropyOp ce) {
              rk::CrossEntropyOp::create(b, loc, in(0), in(1), out,
                                         lossScale(ce.getTargets()),
                                         validClasses(&op));
              return true;
            })
            .Case<CrossEntropyGradOp>([&](CrossEntropyGradOp ce) {
              rk::CrossEntropyGradOp::create(b, loc, in(0), in(1), out,
                                             lossScale(ce.getTargets()),
                                             validClasses(&op));
              return true;
            })
            .Case<AddOp>([&](auto) { return same(rk::AddOp()); })
            .Case<ReluGradOp>([&](auto) { return same(rk::ReluGradOp()); })
            .Case<GeluGradOp>([&](GeluGradOp g) {
              return g.getExact() ? same(rk::GeluExactGradOp())
                                  : same(rk::GeluGradOp());
            })
            .Case<ReluOp>([&](auto) { return same(rk::ReluOp()); })
            .Case<GeluOp>([&](GeluOp g) {
              return g.getExact() ? same(rk::GeluExactOp())
                                  : same(rk::GeluOp());
            })
            .Case<BiasGradOp>([&](auto) { return same(rk::BiasGradOp()); })
            .Case<MseLossOp>([&](MseLossOp l) {
              rk::MseLossOp::create(b, loc, in(0), in(1), out,
                                    lossScale(l.getPrediction()));
              return true;
            })
            .Case<MseLossGradOp>([&](MseLossGradOp l) {
              rk::MseLossGradOp::create(b, loc, in(0), in(1), out,
                                        lossScale(l.getPrediction()));
              return true;
            })
            .Default([&](Operation *other) {
              other->emitError()
                  << "no per-rank lowering for '" << other->getName() << "'";
              return false;
            });
    if (!ok)
      return failure();
    // The loss's prediction is what a reference implementation compares.
    if (isa<MseLossOp, CrossEntropyOp>(op) && (!inLoop || forwardPipe))
      rk::ObserveOp::create(b, loc, in(0), b.getStringAttr("logits"));
  }

  b.setListener(nullptr);
  for (rk::AllocOp alloc : deadAllocs)
    alloc.erase();
  if (loop)
    b.setInsertionPointToEnd(body0);
  if (auto pipe = dyn_cast_or_null<rk::PipelineOp>(loop))
    if (failed(connectUnits(pipe, seqInputBuffers, seqSize)))
      return failure();
  // What this rank holds for the training state, for the runtime to check
  // (with a pipeline: per pipeline coordinate).
  if (isStep)
    rankFunc->setAttr(rk::kExpectedBytesAttr,
                      b.getDenseI64ArrayAttr(
                          pipelined ? ArrayRef<int64_t>(ppBytes)
                                    : ArrayRef<int64_t>({paramBytes, gradBytes,
                                                         stateBytes})));
  return success();
}

LogicalResult
LowerToRankPass::connectUnits(rk::PipelineOp pipe,
                              const DenseSet<Value> &seqInputBuffers,
                              int64_t microbatches) {
  OpBuilder b(pipe.getContext());
  int64_t ppSize = mesh.getAxisSize("pp");
  SmallVector<rk::UnitOp> units(pipe.getBody().front().getOps<rk::UnitOp>());
  DenseMap<Operation *, unsigned> index;
  for (auto [i, u] : llvm::enumerate(units))
    index[u] = i;
  auto rankOf = [&](rk::UnitOp u) { return int64_t(u.getStage()) % ppSize; };
  // Earlier in the order every schedule keeps for one microbatch: F before
  // B before W.
  auto order = [&](rk::UnitOp u) {
    StringRef ph = u.getPhase();
    return std::make_pair(ph == "F" ? 0 : ph == "B" ? 1 : 2, index[u]);
  };
  // Ops a unit starts with (receives, stash reads), kept in order.
  DenseMap<Operation *, Operation *> prologueEnd;
  auto atPrologue = [&](rk::UnitOp u) {
    Block &body = u.getBody().front();
    if (Operation *last = prologueEnd.lookup(u))
      b.setInsertionPointAfter(last);
    else
      b.setInsertionPointToStart(&body);
  };
  auto prologue = [&](rk::UnitOp u, Operation *op) { prologueEnd[u] = op; };

  // Inputs: this microbatch's rows, once per unit.
  llvm::MapVector<Value, SmallVector<OpOperand *>> foreign;
  for (rk::UnitOp u : units) {
    DenseMap<Value, Value> rowsOf;
    SmallVector<OpOperand *> uses;
    u.walk([&](Operation *op) {
      for (OpOperand &o : op->getOpOperands())
        uses.push_back(&o);
    });
    for (OpOperand *o : uses) {
      Value v = o->get();
      if (seqInputBuffers.contains(v)) {
        Value &r = rowsOf[v];
        if (!r) {
          atPrologue(u);
          auto t = cast<MemRefType>(v.getType());
          SmallVector<int64_t> shape(t.getShape());
          shape[0] /= microbatches;
          r = rk::RowsOp::create(b, v.getLoc(),
                                 MemRefType::get(shape, t.getElementType()), v,
                                 u.getBody().front().getArgument(0),
                                 b.getI64IntegerAttr(microbatches));
          prologue(u, r.getDefiningOp());
        }
        o->set(r);
        continue;
      }
      Operation *def = v.getDefiningOp();
      auto home = def ? def->getParentOfType<rk::UnitOp>() : rk::UnitOp();
      if (home && home != u)
        foreign[v].push_back(o);
    }
  }

  int64_t slots = 0, transfers = 0;
  DenseMap<Operation *, SmallVector<int64_t>> releases;
  // Keeps `v` (computed in `home`) for `readers`, each of which reads it
  // through the stash instead.
  auto stash =
      [&](Value v, rk::UnitOp home,
          ArrayRef<std::pair<rk::UnitOp, SmallVector<OpOperand *>>> readers) {
        if (readers.empty())
          return;
        // The memory outlives the unit that made it.
        Value root = v;
        while (Operation *d = root.getDefiningOp()) {
          if (isa<rk::AllocOp>(d)) {
            d->setAttr("rank.stash", b.getUnitAttr());
            break;
          }
          if (!isa<rk::ViewOp, rk::SubviewOp>(d))
            break;
          root = d->getOperand(0);
        }
        int64_t slot = slots++;
        b.setInsertionPointToEnd(&home.getBody().front());
        rk::StashPutOp::create(b, v.getLoc(), v, b.getI64IntegerAttr(slot),
                               b.getI64IntegerAttr(readers.size()));
        for (auto &[u, uses] : readers) {
          atPrologue(u);
          auto get = rk::StashGetOp::create(b, v.getLoc(), v.getType(),
                                            b.getI64IntegerAttr(slot));
          prologue(u, get);
          for (OpOperand *o : uses)
            o->set(get);
          releases[u].push_back(slot);
        }
      };
  for (auto &[v, uses] : foreign) {
    auto home = v.getDefiningOp()->getParentOfType<rk::UnitOp>();
    // Readers by unit, in the order of a microbatch's units.
    llvm::MapVector<Operation *, SmallVector<OpOperand *>> byUnit;
    for (OpOperand *o : uses)
      byUnit[o->getOwner()->getParentOfType<rk::UnitOp>()].push_back(o);
    std::map<int64_t,
             SmallVector<std::pair<rk::UnitOp, SmallVector<OpOperand *>>>>
        byRank;
    for (auto &[u, us] : byUnit)
      byRank[rankOf(cast<rk::UnitOp>(u))].push_back({cast<rk::UnitOp>(u), us});
    for (auto &[r, readers] : byRank) {
      llvm::sort(readers, [&](auto &x, auto &y) {
        return order(x.first) < order(y.first);
      });
      if (r == rankOf(home)) {
        stash(v, home, readers);
        continue;
      }
      // Another pipeline rank: the earliest reader receives it, the others
      // read the received copy from the stash.
      rk::UnitOp first = readers.front().first;
      if (order(first) < order(home)) {
        first.emitError() << "reads a value that stage " << home.getStage()
                          << " computes in a later phase";
        return failure();
      }
      int64_t transfer = transfers++;
      b.setInsertionPointToEnd(&home.getBody().front());
      rk::SendOp::create(b, v.getLoc(), v, b.getI64IntegerAttr(transfer),
                         b.getI64IntegerAttr(first.getStage()));
      atPrologue(first);
      auto got =
          rk::AllocOp::create(b, v.getLoc(), cast<MemRefType>(v.getType()));
      rk::RecvOp::create(b, v.getLoc(), got, b.getI64IntegerAttr(transfer),
                         b.getI64IntegerAttr(home.getStage()));
      prologue(first, got->getNextNode());
      for (OpOperand *o : readers.front().second)
        o->set(got);
      stash(got, first, ArrayRef(readers).drop_front());
    }
  }
  for (auto &[u, list] : releases) {
    b.setInsertionPointToEnd(&cast<rk::UnitOp>(u).getBody().front());
    for (int64_t slot : list)
      rk::StashReleaseOp::create(b, u->getLoc(), b.getI64IntegerAttr(slot));
  }
  // Every value a unit computes for other units now travels explicitly.
  WalkResult bad = pipe.walk([&](rk::UnitOp u) {
    WalkResult r = u.walk([&](Operation *op) {
      for (Value v : op->getOperands()) {
        Operation *d = v.getDefiningOp();
        auto home = d ? d->getParentOfType<rk::UnitOp>() : rk::UnitOp();
        if (home && home != u) {
          op->emitError() << "uses a value of another pipeline unit";
          return WalkResult::interrupt();
        }
      }
      return WalkResult::advance();
    });
    return r;
  });
  return failure(bad.wasInterrupted());
}
