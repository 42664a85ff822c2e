//===- SchedulePipeline.cpp - Order the pipeline's units, then prove it ---===//
//
// Gives every `rank.pipeline` without timelines the order of its schedule
// (lib/Pipeline: gpipe, 1f1b, interleaved_1f1b, zero_bubble) as one
// `rank.timeline` per pipeline rank, then verifies whatever timelines the
// pipeline has, generated or written by hand: every unit of every
// microbatch runs once, on the rank of its stage; what a unit reads from the
// stash was put there earlier on that rank; and a simulation of all ranks
// (asynchronous sends, blocking receives, messages matched in order per pair
// of ranks, as MPI and NCCL match them) runs to the end without a deadlock
// and within the schedule's bound on microbatches in flight. A violation is
// an error naming the rank, the step, the unit and the microbatch.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"
#include "planc/Transforms/PipelineSchedule.h"

#include "llvm/Support/FormatVariadic.h"

namespace planc {
#define GEN_PASS_DEF_SCHEDULEPIPELINE
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;
namespace pl = planc::pipeline;

namespace {
struct SchedulePipelinePass
    : public planc::impl::SchedulePipelineBase<SchedulePipelinePass> {
  using SchedulePipelineBase::SchedulePipelineBase;
  void runOnOperation() override;
};

/// Each rank's stages in order for a single microbatch: F up the stages,
/// then B (and W) down.
llvm::Expected<std::vector<std::vector<pl::Action>>>
oneMicrobatch(pl::Shape shape, pl::Kind kind) {
  std::vector<std::vector<pl::Action>> order(shape.ranks);
  for (int64_t s = 0; s < shape.stages(); ++s)
    order[shape.rankOf(s)].push_back({pl::Phase::F, s, 0});
  for (int64_t s = shape.stages() - 1; s >= 0; --s) {
    order[shape.rankOf(s)].push_back({pl::Phase::B, s, 0});
    if (pl::splitsWeightGrad(kind))
      order[shape.rankOf(s)].push_back({pl::Phase::W, s, 0});
  }
  return order;
}

pl::Phase phaseOf(rk::UnitOp u) {
  StringRef p = u.getPhase();
  return p == "F" ? pl::Phase::F : p == "B" ? pl::Phase::B : pl::Phase::W;
}
} // namespace

FailureOr<PipelineSimulation>
planc::simulatePipeline(rk::PipelineOp pipe, int64_t ppSize, bool unitCosts) {
  int64_t stages = pipe.getStages(), m = pipe.getMicrobatches();
  bool splitW = false;
  if (auto kind = pl::parseKind(pipe.getSchedule()))
    splitW = pl::splitsWeightGrad(*kind);
  // Durations: the stage's FLOPs of each phase (a unit cost without them);
  // B carries W when the schedule does not split it.
  auto flops = pipe->getAttrOfType<DenseI64ArrayAttr>("stage_flops");
  auto cost = [&](rk::UnitOp u) -> double {
    if (unitCosts || !flops || (int64_t)flops.size() != 3 * stages)
      return 1.0;
    int64_t s = u.getStage();
    double scale = 1e-9 / std::max<int64_t>(1, m);
    switch (phaseOf(u)) {
    case pl::Phase::F:
      return flops[3 * s] * scale;
    case pl::Phase::B:
      return (flops[3 * s + 1] + (splitW ? 0 : flops[3 * s + 2])) * scale;
    case pl::Phase::W:
      return flops[3 * s + 2] * scale;
    }
    return 1.0;
  };
  return simulatePipeline(pipe, ppSize, cost, /*transfer=*/0);
}

FailureOr<PipelineSimulation>
planc::simulatePipeline(rk::PipelineOp pipe, int64_t ppSize,
                        llvm::function_ref<double(rk::UnitOp)> cost,
                        double transfer) {
  SmallVector<rk::UnitOp> units(pipe.getBody().front().getOps<rk::UnitOp>());
  auto kind = pl::parseKind(pipe.getSchedule());
  if (!kind)
    return pipe.emitError()
           << "unknown schedule '" << pipe.getSchedule() << "'";
  PipelineSimulation sim;
  int64_t stages = pipe.getStages(), m = pipe.getMicrobatches();
  sim.program.shape = {ppSize, stages / ppSize, m};
  sim.program.splitW = pl::splitsWeightGrad(*kind);
  sim.program.ranks.resize(ppSize);
  sim.program.transfer = transfer;
  // One duration and one list of stash and transfer ops per unit, not per
  // execution of it: a large plan executes each unit hundreds of times.
  std::vector<double> unitCost;
  std::vector<SmallVector<Operation *>> unitComm(units.size());
  for (auto [i, u] : llvm::enumerate(units)) {
    unitCost.push_back(cost(u));
    u.walk([&](Operation *op) {
      if (isa<rk::StashGetOp, rk::StashPutOp, rk::RecvOp, rk::SendOp>(op))
        unitComm[i].push_back(op);
    });
  }
  for (auto t : pipe.getBody().front().getOps<rk::TimelineOp>()) {
    int64_t r = t.getRank();
    if (r < 0 || r >= ppSize)
      return t.emitError() << "timeline of pipeline rank " << r
                           << ", but pp = " << ppSize;
    // Stash: (slot, microbatch) put on this rank so far.
    std::set<std::pair<int64_t, int64_t>> stashed;
    int64_t stepIndex = 0;
    for (auto e : t.getBody().front().getOps<rk::ExecOp>()) {
      if (e.getUnit() < 0 || e.getUnit() >= (int64_t)units.size())
        return e.emitError() << "pipeline rank " << r << ", step " << stepIndex
                             << ": no unit " << e.getUnit();
      rk::UnitOp u = units[e.getUnit()];
      int64_t mb = e.getMb();
      auto what = [&] {
        return llvm::formatv("pipeline rank {0}, step {1} ({2}{3} of "
                             "stage {4}, microbatch {3})",
                             r, stepIndex, u.getPhase(), mb, u.getStage())
            .str();
      };
      if (mb < 0 || mb >= m)
        return e.emitError()
               << what() << ": there are " << m << " microbatches";
      pl::Step step;
      step.action = {phaseOf(u), u.getStage(), mb};
      step.cost = unitCost[e.getUnit()];
      for (Operation *op : unitComm[e.getUnit()]) {
        if (auto get = dyn_cast<rk::StashGetOp>(op);
            get && !stashed.count({get.getSlot(), mb}))
          return e.emitError()
                 << what() << " reads stash slot " << get.getSlot()
                 << ", which no earlier step of this rank put there";
        if (auto put = dyn_cast<rk::StashPutOp>(op))
          stashed.insert({put.getSlot(), mb});
        if (auto recv = dyn_cast<rk::RecvOp>(op))
          step.recvs.push_back(
              {recv.getFromStage() % ppSize, recv.getTransfer(), mb});
        if (auto send = dyn_cast<rk::SendOp>(op))
          step.sends.push_back(
              {send.getToStage() % ppSize, send.getTransfer(), mb});
      }
      sim.program.ranks[r].push_back(std::move(step));
      ++stepIndex;
    }
  }
  SmallVector<int64_t> bounds;
  for (int64_t s = 0; s < stages; ++s)
    bounds.push_back(m == 1 ? 1
                            : pl::inFlightBound(*kind, sim.program.shape, s));
  llvm::Expected<pl::Timeline> timeline = pl::simulate(sim.program, bounds);
  if (!timeline)
    return pipe.emitError()
           << "the " << pipe.getSchedule()
           << " schedule is not safe: " << llvm::toString(timeline.takeError());
  sim.timeline = std::move(*timeline);
  return sim;
}

void SchedulePipelinePass::runOnOperation() {
  ModuleOp module = getOperation();
  plan::MeshOp mesh = plan::getMesh(module);
  int64_t ppSize = mesh ? mesh.getAxisSize("pp") : 1;
  WalkResult result = module.walk([&](rk::PipelineOp pipe) {
    Block &body = pipe.getBody().front();
    SmallVector<rk::UnitOp> units(body.getOps<rk::UnitOp>());
    auto kind = pl::parseKind(pipe.getSchedule());
    if (!kind) {
      pipe.emitError() << "unknown schedule '" << pipe.getSchedule()
                       << "'; expected gpipe, 1f1b, interleaved_1f1b or "
                          "zero_bubble";
      return WalkResult::interrupt();
    }
    if (body.getOps<rk::TimelineOp>().empty()) {
      pl::Shape shape{ppSize, int64_t(pipe.getStages()) / ppSize,
                      int64_t(pipe.getMicrobatches())};
      // One microbatch (the forward that generation runs) goes through the
      // stages in turn whatever the schedule: forwards up, backwards down.
      auto order = shape.microbatches == 1 ? oneMicrobatch(shape, *kind)
                                           : pl::makeSchedule(*kind, shape);
      if (!order) {
        pipe.emitError() << llvm::toString(order.takeError());
        return WalkResult::interrupt();
      }
      // Unit number of (stage, phase).
      std::map<std::pair<int64_t, int>, int64_t> unitOf;
      for (auto [i, u] : llvm::enumerate(units))
        unitOf[{u.getStage(), int(phaseOf(u))}] = i;
      OpBuilder b(pipe.getContext());
      b.setInsertionPointToEnd(&body);
      for (auto [r, actions] : llvm::enumerate(*order)) {
        auto t =
            rk::TimelineOp::create(b, pipe.getLoc(), b.getI64IntegerAttr(r));
        OpBuilder tb = OpBuilder::atBlockEnd(&t.getBody().emplaceBlock());
        for (const pl::Action &a : actions) {
          auto it = unitOf.find({a.stage, int(a.phase)});
          if (it == unitOf.end()) {
            pipe.emitError()
                << "the schedule runs " << pl::label(a) << " of stage "
                << a.stage << ", which has no unit";
            return WalkResult::interrupt();
          }
          rk::ExecOp::create(tb, pipe.getLoc(),
                             tb.getI64IntegerAttr(it->second),
                             tb.getI64IntegerAttr(a.mb));
        }
      }
    }
    FailureOr<PipelineSimulation> sim =
        simulatePipeline(pipe, ppSize, unitCosts);
    if (failed(sim))
      return WalkResult::interrupt();
    std::string peaks;
    for (int64_t p : sim->timeline.peakInFlight)
      peaks += (peaks.empty() ? "" : " ") + std::to_string(p);
    pipe->setAttr("bubble_fraction",
                  FloatAttr::get(Float64Type::get(pipe.getContext()),
                                 sim->timeline.bubbleFraction));
    // Generation's forward (one microbatch) has no bubble worth a remark.
    auto fn = pipe->getParentOfType<func::FuncOp>();
    if (fn && fn.getName() == "plan_forward")
      return WalkResult::advance();
    pipe.emitRemark() << llvm::formatv(
        "schedule {0} over {1} pipeline ranks, {2} stages, {3} microbatches: "
        "bubble {4:F1}% of the busy time (simulated with {6}), "
        "microbatches in flight per stage at most {5}",
        pipe.getSchedule(), ppSize, pipe.getStages(), pipe.getMicrobatches(),
        100.0 * sim->timeline.bubbleFraction, peaks,
        unitCosts ? "unit costs" : "each stage's FLOPs");
    return WalkResult::advance();
  });
  if (result.wasInterrupted())
    signalPassFailure();
}
