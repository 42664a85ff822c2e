//===- PartitionStages.cpp - Cut the layers into pipeline stages ----------===//
//
// With pp * virtual_stages = S > 1 stages, the repeated layers (the
// `plan.layer` the frontend puts on a block's ops and autodiff keeps on their
// gradients) are cut into S contiguous groups, by the plan's
// stage_boundaries or, without them, so that the most expensive stage costs
// the least (FLOPs of forward and backward; the ops before the first layer,
// e.g. the embeddings, count for stage 0 and those after the last, e.g. the
// head and the loss, for stage S - 1).
//
// Every op of the step and the model then gets a stage (`plan.stage`): its
// layer's, else the one stage its operands come from, else its users'. An
// op whose operands come from several stages (a tied weight's gradient
// contributions, the sum of all gradients' squares) gets -1: every stage
// takes part. Backward ops get a phase (`plan.phase`): "B" for what the
// input gradient sent to the previous stage needs, "W" for the rest (weight
// gradients, which a zero-bubble schedule defers); forward ops get "F".
// Parameters and state get the stage of their users (-1 if several).
//===----------------------------------------------------------------------===//
#include "ArgAttrBatch.h"
#include "BackwardOps.h"
#include "OpFlops.h"
#include "planc/Transforms/Passes.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/Support/FormatVariadic.h"

namespace planc {
#define GEN_PASS_DEF_PARTITIONSTAGES
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

namespace {
struct PartitionStagesPass
    : public planc::impl::PartitionStagesBase<PartitionStagesPass> {
  using PartitionStagesBase::PartitionStagesBase;
  void runOnOperation() override;
};
} // namespace

/// The first layer of each of `stages` contiguous non-empty groups of
/// `cost.size()` layers minimizing the largest group's cost; `pre` counts
/// with the first group and `post` with the last.
static SmallVector<int64_t> balance(ArrayRef<double> cost, double pre,
                                    double post, int64_t stages) {
  int64_t n = cost.size();
  auto groupCost = [&](int64_t i, int64_t j) { // layers [i, j)
    double c = 0;
    for (int64_t l = i; l < j; ++l)
      c += cost[l];
    return c + (i == 0 ? pre : 0) + (j == n ? post : 0);
  };
  // Greedy fill for a bound: as many layers per group as fit, leaving at
  // least one layer for each later group.
  auto cut = [&](double bound, SmallVector<int64_t> &starts) {
    starts.assign(1, 0);
    int64_t i = 0;
    for (int64_t g = 0; g < stages; ++g) {
      int64_t left = stages - g - 1;
      int64_t j = i + 1;
      while (j < n - left + 1 && j < n && groupCost(i, j + 1) <= bound &&
             n - (j + 1) >= left)
        ++j;
      if (g == stages - 1)
        j = n;
      if (groupCost(i, j) > bound)
        return false;
      if (g + 1 < stages)
        starts.push_back(j);
      i = j;
    }
    return true;
  };
  double lo = 0, hi = groupCost(0, n);
  SmallVector<int64_t> best, tmp;
  cut(hi, best);
  for (int it = 0; it < 64 && hi - lo > 1e-9 * hi; ++it) {
    double mid = (lo + hi) / 2;
    if (cut(mid, tmp)) {
      hi = mid;
      best = tmp;
    } else {
      lo = mid;
    }
  }
  return best;
}

/// "1.25 GFLOP", "601.7 PFLOP": FLOPs with an SI prefix.
static std::string flopText(double f) {
  const char *prefix[] = {"", "k", "M", "G", "T", "P", "E"};
  int i = 0;
  while (f >= 1000 && i < 6) {
    f /= 1000;
    ++i;
  }
  return llvm::formatv("{0:F3} {1}FLOP", f, prefix[i]).str();
}

/// Stages of the ops of `f` (see the file comment). Returns the stage of
/// every op and argument.
static void assignStages(func::FuncOp f, ArrayRef<int64_t> stageOfLayer) {
  Block &body = f.getBody().front();
  Builder b(f.getContext());
  constexpr int64_t kUnset = -2;
  DenseMap<Operation *, int64_t> stage;
  auto valueStage = [&](Value v) -> int64_t {
    Operation *d = v.getDefiningOp();
    return d ? stage.lookup(d) : kUnset;
  };
  SmallVector<Operation *> deferred;
  for (Operation &op : body.without_terminator()) {
    stage[&op] = kUnset;
    if (auto layer = op.getAttrOfType<IntegerAttr>(kLayerAttr)) {
      stage[&op] = stageOfLayer[layer.getInt()];
      continue;
    }
    llvm::SmallSetVector<int64_t, 2> from;
    bool shared = false;
    for (Value v : op.getOperands()) {
      int64_t s = valueStage(v);
      if (s == -1)
        shared = true;
      else if (s >= 0)
        from.insert(s);
    }
    // A sum with a shared term stays shared (the gradient norm, which the
    // stages' terms add up to); a stage's own op that reads a shared value
    // (an update clipped by the global norm) stays the stage's.
    if (from.size() == 1 && !(shared && isa<AddOp, SumSqOp>(op)))
      stage[&op] = from[0];
    else if (from.size() > 1 || shared)
      stage[&op] = -1;
    else
      deferred.push_back(&op);
  }
  // Ops fed by arguments only take their users' stage.
  for (Operation *op : llvm::reverse(deferred)) {
    llvm::SmallSetVector<int64_t, 2> to;
    for (Operation *user : op->getUsers())
      if (int64_t s = stage.lookup(user); s != kUnset && user != op)
        to.insert(s);
    stage[op] = to.size() == 1 ? to[0] : to.empty() ? 0 : -1;
  }

  // Phases: forward until the loss gradient; among backward ops, the input
  // gradient's (B) are those the values another stage receives need.
  llvm::DenseSet<Operation *> backward = backwardOps(body);
  llvm::DenseSet<Operation *> inputGrad;
  for (Operation &op : llvm::reverse(body.without_terminator())) {
    if (!backward.contains(&op))
      continue;
    int64_t s = stage.lookup(&op);
    bool needed = llvm::any_of(op.getUsers(), [&](Operation *user) {
      int64_t us = stage.lookup(user);
      return (inputGrad.contains(user) && us == s) ||
             (us >= 0 && us != s && s >= 0 && !isa<func::ReturnOp>(user));
    });
    if (needed)
      inputGrad.insert(&op);
  }
  for (Operation &op : body.without_terminator()) {
    op.setAttr(kStageAttr, b.getI64IntegerAttr(stage.lookup(&op)));
    op.setAttr(kPhaseAttr, b.getStringAttr(!backward.contains(&op)   ? "F"
                                           : inputGrad.contains(&op) ? "B"
                                                                     : "W"));
  }
  ArgAttrBatch argAttrs(f);
  for (BlockArgument arg : f.getArguments()) {
    llvm::SmallSetVector<int64_t, 2> to;
    for (Operation *user : arg.getUsers())
      if (!isa<func::ReturnOp>(user))
        to.insert(stage.lookup(user));
    int64_t s = to.size() == 1 ? to[0] : to.empty() ? 0 : -1;
    argAttrs.set(arg.getArgNumber(), kStageAttr, b.getI64IntegerAttr(s));
  }
  argAttrs.commit();
}

void PartitionStagesPass::runOnOperation() {
  ModuleOp module = getOperation();
  MeshOp mesh = getMesh(module);
  ParallelOp par;
  for (auto p : module.getOps<ParallelOp>())
    par = p;
  int64_t pp = mesh ? mesh.getAxisSize("pp") : 1;
  int64_t v = par ? par.getVirtualStages() : 1;
  int64_t stages = pp * v;
  if (stages <= 1)
    return;
  func::FuncOp step, model;
  for (auto f : module.getOps<func::FuncOp>()) {
    if (f->hasAttr(kTrainStepAttr))
      step = f;
    if (f->hasAttr(kModelAttr))
      model = f;
  }
  if (!step) {
    module.emitError() << "expected a train step; run plan-autodiff first";
    return signalPassFailure();
  }

  // Cost per layer (forward and backward), and of what comes before the
  // first layer and after the last.
  int64_t layers = 0;
  step.walk([&](Operation *op) {
    if (auto l = op->getAttrOfType<IntegerAttr>(kLayerAttr))
      layers = std::max(layers, l.getInt() + 1);
  });
  if (layers < stages) {
    (par ? par.getOperation() : mesh.getOperation())->emitError()
        << "pipeline parallelism cuts the model's repeated layers into pp * "
           "virtual_stages = "
        << stages << " stages, but the model has " << layers << " layer"
        << (layers == 1 ? "" : "s") << "; use fewer stages or more layers";
    return signalPassFailure();
  }
  SmallVector<double> cost(layers, 0.0);
  double pre = 0, post = 0;
  bool seenLayer = false;
  for (Operation &op : step.getBody().front().without_terminator()) {
    double f = opFlops(&op);
    if (auto l = op.getAttrOfType<IntegerAttr>(kLayerAttr)) {
      cost[l.getInt()] += f;
      seenLayer = true;
    } else if (!seenLayer) {
      pre += f;
    } else if (isa<AdamWUpdateOp, SgdUpdateOp, SumSqOp>(op)) {
      // The optimizer runs once per step on each stage's own parameters.
    } else {
      post += f;
    }
  }

  SmallVector<int64_t> starts;
  std::optional<ArrayRef<int64_t>> given =
      par ? par.getStageBoundaries() : std::nullopt;
  if (given) {
    starts.push_back(0);
    starts.append(given->begin(), given->end());
    if ((int64_t)starts.size() != stages || starts.back() >= layers) {
      par.emitError() << "stage_boundaries must give pp * virtual_stages - 1 "
                         "= "
                      << stages - 1 << " increasing layer indices below "
                      << layers;
      return signalPassFailure();
    }
  } else {
    starts = balance(cost, pre, post, stages);
  }
  SmallVector<int64_t> stageOfLayer(layers);
  for (int64_t s = 0; s < stages; ++s)
    for (int64_t l = starts[s]; l < (s + 1 < stages ? starts[s + 1] : layers);
         ++l)
      stageOfLayer[l] = s;

  assignStages(step, stageOfLayer);
  if (model)
    assignStages(model, stageOfLayer);

  // The cut and each stage's cost (forward, input gradient, weight gradient
  // FLOPs of the whole batch) in the IR and in a remark.
  SmallVector<int64_t> flops(3 * stages, 0);
  for (Operation &op : step.getBody().front().without_terminator()) {
    int64_t s = op.getAttrOfType<IntegerAttr>(kStageAttr).getInt();
    if (s < 0 || isa<AdamWUpdateOp, SgdUpdateOp, SumSqOp>(op))
      continue;
    StringRef ph = op.getAttrOfType<StringAttr>(kPhaseAttr).getValue();
    flops[3 * s + (ph == "F" ? 0 : ph == "B" ? 1 : 2)] += int64_t(opFlops(&op));
  }
  Builder b(module.getContext());
  step->setAttr("plan.stage_first_layers", b.getDenseI64ArrayAttr(starts));
  step->setAttr("plan.stage_flops", b.getDenseI64ArrayAttr(flops));
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "pipeline: " << stages << " stages (pp = " << pp
     << ", virtual_stages = " << v << ")"
     << (given ? " at the plan's stage_boundaries" : ", balanced by FLOPs")
     << ":";
  for (int64_t s = 0; s < stages; ++s) {
    int64_t first = starts[s],
            last = (s + 1 < stages ? starts[s + 1] : layers) - 1;
    double total = double(flops[3 * s] + flops[3 * s + 1] + flops[3 * s + 2]);
    os << (s ? ";" : "") << " stage " << s << " = "
       << (s == 0 ? "embeddings + " : "") << "layers " << first;
    if (last > first)
      os << "-" << last;
    os << (s == stages - 1 ? " + head and loss" : "") << " (" << flopText(total)
       << ")";
  }
  (par ? par.getOperation() : mesh.getOperation())->emitRemark() << os.str();
}
