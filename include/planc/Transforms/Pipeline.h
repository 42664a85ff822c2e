//===- Pipeline.h - planc's pass pipeline, in one place ---------*- C++ -*-===//
//
// planc and plan-opt run the same pipeline: planc builds it with
// buildPipeline, plan-opt registers it as `--planc-pipeline` (with
// `stop-after=<pass>`).
//===----------------------------------------------------------------------===//
#ifndef PLANC_TRANSFORMS_PIPELINE_H
#define PLANC_TRANSFORMS_PIPELINE_H

#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace planc {

struct PipelineOptions : public mlir::PassPipelineOptions<PipelineOptions> {
  Option<std::string> stopAfter{
      *this, "stop-after",
      llvm::cl::desc("Stop after this pass (its argument, e.g. "
                     "plan-propagate-sharding); empty: run them all")};
  Option<std::string> target{
      *this, "target", llvm::cl::init("host"),
      llvm::cl::desc("host or cuda: the backend the program links (the "
                     "memory plan's 16-bit GEMM workspace depends on it)")};
  Option<bool> paramCopies{
      *this, "param-copies", llvm::cl::init(true),
      llvm::cl::desc("Keep mixed precision's 16-bit weights across steps, "
                     "written by the optimizer (plan-keep-param-copies)")};
};

/// The arguments of the pipeline's passes, in order.
llvm::ArrayRef<llvm::StringRef> pipelinePassNames();

/// Adds the passes (up to options.stopAfter) to `pm`; fails on an unknown
/// stop-after name.
mlir::LogicalResult buildPipeline(mlir::OpPassManager &pm,
                                  const PipelineOptions &options);

/// Registers `--planc-pipeline` for plan-opt.
void registerPipeline();

} // namespace planc

#endif
