//===- Pipeline.cpp - planc's pass pipeline, in one place -----------------===//
#include "planc/Transforms/Pipeline.h"
#include "planc/Transforms/Passes.h"

#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

namespace {
struct Stage {
  llvm::StringLiteral name;
  std::unique_ptr<Pass> (*create)(const planc::PipelineOptions &);
};
// The order of the pipeline: seeds, the training step, layouts, their
// collectives, then per-rank code and C++.
const Stage kStages[] = {
    {"plan-seed-sharding",
     [](const planc::PipelineOptions &) {
       return planc::createSeedSharding();
     }},
    {"plan-mixed-precision",
     [](const planc::PipelineOptions &) {
       return planc::createMixedPrecision();
     }},
    {"plan-autodiff",
     [](const planc::PipelineOptions &) { return planc::createAutodiff(); }},
    {"plan-fuse-casts",
     [](const planc::PipelineOptions &) { return planc::createFuseCasts(); }},
    {"plan-loss-scale",
     [](const planc::PipelineOptions &) { return planc::createLossScale(); }},
    {"plan-recompute",
     [](const planc::PipelineOptions &) { return planc::createRecompute(); }},
    {"plan-propagate-sharding",
     [](const planc::PipelineOptions &) {
       return planc::createPropagateSharding();
     }},
    {"plan-insert-reshards",
     [](const planc::PipelineOptions &) {
       return planc::createInsertReshards();
     }},
    {"plan-expand-reshards",
     [](const planc::PipelineOptions &) {
       return planc::createExpandReshards();
     }},
    {"plan-partition-stages",
     [](const planc::PipelineOptions &) {
       return planc::createPartitionStages();
     }},
    {"plan-lower-to-rank",
     [](const planc::PipelineOptions &) { return planc::createLowerToRank(); }},
    {"plan-shard-in-place",
     [](const planc::PipelineOptions &) {
       return planc::createShardInPlace();
     }},
    {"plan-keep-attention",
     [](const planc::PipelineOptions &) {
       return planc::createKeepAttention();
     }},
    {"plan-schedule-pipeline",
     [](const planc::PipelineOptions &) {
       return planc::createSchedulePipeline();
     }},
    {"plan-memory",
     [](const planc::PipelineOptions &o) {
       return planc::createPlanMemory({o.target});
     }},
    {"plan-lower-rank-to-emitc",
     [](const planc::PipelineOptions &) {
       return planc::createLowerRankToEmitC();
     }},
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
    pm.addPass(s.create(options));
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
