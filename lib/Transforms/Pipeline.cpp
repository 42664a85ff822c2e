//===- Pipeline.cpp - planc's pass pipeline, in one place -----------------===//
#include "planc/Transforms/Pipeline.h"
#include "planc/Transforms/Passes.h"

#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

namespace {
struct Stage {
  llvm::StringLiteral name;
  std::unique_ptr<Pass> (*create)();
};
// The order of the pipeline: seeds, the training step, layouts, their
// collectives, then per-rank code and C++.
const Stage kStages[] = {
    {"plan-seed-sharding", [] { return planc::createSeedSharding(); }},
    {"plan-mixed-precision", [] { return planc::createMixedPrecision(); }},
    {"plan-autodiff", [] { return planc::createAutodiff(); }},
    {"plan-fuse-casts", [] { return planc::createFuseCasts(); }},
    {"plan-loss-scale", [] { return planc::createLossScale(); }},
    {"plan-recompute", [] { return planc::createRecompute(); }},
    {"plan-propagate-sharding",
     [] { return planc::createPropagateSharding(); }},
    {"plan-insert-reshards", [] { return planc::createInsertReshards(); }},
    {"plan-expand-reshards", [] { return planc::createExpandReshards(); }},
    {"plan-partition-stages", [] { return planc::createPartitionStages(); }},
    {"plan-lower-to-rank", [] { return planc::createLowerToRank(); }},
    {"plan-shard-in-place", [] { return planc::createShardInPlace(); }},
    {"plan-keep-attention", [] { return planc::createKeepAttention(); }},
    {"plan-schedule-pipeline", [] { return planc::createSchedulePipeline(); }},
    {"plan-memory", [] { return planc::createPlanMemory(); }},
    {"plan-lower-rank-to-emitc",
     [] { return planc::createLowerRankToEmitC(); }},
};
} // namespace

llvm::ArrayRef<llvm::StringRef> planc::pipelinePassNames() {
  static const llvm::SmallVector<llvm::StringRef> names = [] {
    llvm::SmallVector<llvm::StringRef> n;
    for (const Stage &s : kStages)
      n.push_back(s.name);
    return n;
  }();
  return names;
}

LogicalResult planc::buildPipeline(OpPassManager &pm,
                                   const PipelineOptions &options) {
  StringRef stop = options.stopAfter;
  if (!stop.empty() && !llvm::is_contained(pipelinePassNames(), stop))
    return failure();
  for (const Stage &s : kStages) {
    pm.addPass(s.create());
    if (s.name == stop)
      break;
  }
  return success();
}

void planc::registerPipeline() {
  PassPipelineRegistration<PipelineOptions>(
      "planc-pipeline", "What planc runs: .plan IR to EmitC (see stop-after)",
      [](OpPassManager &pm, const PipelineOptions &options) {
        // An unknown stop-after runs nothing; planc reports it itself.
        (void)buildPipeline(pm, options);
      });
}
