//===- PipelineSchedule.h - A rank.pipeline as a verified program -*- C++
//-*-===//
//
// What plan-schedule-pipeline proves about a pipeline, shared with planc's
// --emit=schedule (the trace and the picture of the same simulation).
//===----------------------------------------------------------------------===//
#ifndef PLANC_TRANSFORMS_PIPELINESCHEDULE_H
#define PLANC_TRANSFORMS_PIPELINESCHEDULE_H

#include "dialects/rank/RankDialect.h"
#include "planc/Pipeline/Schedule.h"

namespace planc {
struct PipelineSimulation {
  pipeline::Program program;
  pipeline::Timeline timeline;
};
/// The program of `pipe`'s timelines (durations from each stage's FLOPs, or
/// 1 for every unit), verified and simulated; errors are emitted on the IR.
mlir::FailureOr<PipelineSimulation>
simulatePipeline(rank::PipelineOp pipe, int64_t ppSize, bool unitCosts = false);
/// The same with each unit's duration given by `unitCost` (seconds, say) and
/// messages arriving `transfer` after their send (the cost model's times).
mlir::FailureOr<PipelineSimulation>
simulatePipeline(rank::PipelineOp pipe, int64_t ppSize,
                 llvm::function_ref<double(rank::UnitOp)> unitCost,
                 double transfer);
} // namespace planc

#endif
