//===- Pipeline.cpp - planc's pass pipeline, in one place -----------------===//
#include "planc/Transforms/Pipeline.h"
#include "planc/Transforms/Passes.h"

#include "mlir/Pass/PassRegistry.h"

using namespace mlir;

namespace {
using Create = std::unique_ptr<Pass> (*)(const planc::PipelineOptions &);
struct Stage {
  llvm::StringLiteral name;
  Create create;
};
/// A pass that takes none of the pipeline's options.
template <std::unique_ptr<Pass> (*F)()>
std::unique_ptr<Pass> plain(const planc::PipelineOptions &) {
  return F();
}
// The order of the pipeline: seeds, the training step, layouts, their
// collectives, then per-rank code and C++.
const Stage kStages[] = {
    {"plan-seed-sharding", plain<planc::createSeedSharding>},
    {"plan-mixed-precision", plain<planc::createMixedPrecision>},
    {"plan-autodiff", plain<planc::createAutodiff>},
    {"plan-fuse-casts", plain<planc::createFuseCasts>},
    {"plan-loss-scale", plain<planc::createLossScale>},
    {"plan-recompute", plain<planc::createRecompute>},
    {"plan-propagate-sharding", plain<planc::createPropagateSharding>},
    {"plan-insert-reshards", plain<planc::createInsertReshards>},
    {"plan-rematerialize", plain<planc::createRematerialize>},
    {"plan-expand-reshards", plain<planc::createExpandReshards>},
    {"plan-partition-stages", plain<planc::createPartitionStages>},
    {"plan-lower-to-rank", plain<planc::createLowerToRank>},
    {"plan-shard-in-place", plain<planc::createShardInPlace>},
    {"plan-route-experts", plain<planc::createRouteExperts>},
    {"plan-keep-attention",
     [](const planc::PipelineOptions &o) {
       return planc::createKeepAttention({/*policy=*/"", o.target});
     }},
    {"plan-keep-experts", plain<planc::createKeepExperts>},
    {"plan-schedule-pipeline", plain<planc::createSchedulePipeline>},
    {"plan-keep-param-copies",
     [](const planc::PipelineOptions &o) {
       return planc::createKeepParamCopies({o.paramCopies});
     }},
    {"plan-fuse-epilogues",
     [](const planc::PipelineOptions &o) {
       return planc::createFuseEpilogues({o.target});
     }},
    {"plan-memory",
     [](const planc::PipelineOptions &o) {
       return planc::createPlanMemory({o.target});
     }},
    {"plan-lower-rank-to-emitc", plain<planc::createLowerRankToEmitC>},
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
