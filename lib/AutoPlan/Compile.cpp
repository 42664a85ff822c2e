//===- Compile.cpp - A plan text through the pipeline to its step report --===//
#include "Compile.h"

#include "planc/Frontend/Frontend.h"
#include "planc/Transforms/Passes.h"
#include "planc/Transforms/Pipeline.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

using namespace mlir;
using namespace planc;

CompiledReport planc::compilePlanText(llvm::StringRef path,
                                      llvm::StringRef text, int64_t maxRepeat) {
  CompiledReport out;
  MLIRContext context(MLIRContext::Threading::DISABLED);
  context.loadDialect<plan::PlanDialect, rank::RankDialect, func::FuncDialect,
                      memref::MemRefDialect>();
  context.printOpOnDiagnostic(false);
  // Errors are reasons a plan is rejected; warnings and remarks (the
  // pipeline's stage and bubble remarks) are not shown for every candidate.
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &d) {
    if (d.getSeverity() == DiagnosticSeverity::Error && out.error.empty())
      out.error = d.str();
    return success();
  });
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(text, path),
                               llvm::SMLoc());
  ImportOptions io;
  io.maxRepeat = maxRepeat;
  io.target = "cuda"; // as the pipeline below: the cluster's GPUs
  OwningOpRef<ModuleOp> module = importPlan(sourceMgr, &context, io);
  if (module) {
    PassManager pm(&context);
    PipelineOptions po;
    po.stopAfter = "plan-memory";
    // The planner sizes plans for the cluster's GPUs: the cuda program's
    // memory plan (its 16-bit GEMMs take no fp32 copies).
    po.target = "cuda";
    pm.enableVerifier(false); // once, after the last pass
    if (succeeded(buildPipeline(pm, po)) && succeeded(pm.run(*module)) &&
        succeeded(verify(*module))) {
      ReportOptions ro;
      ro.cuda = true;
      FailureOr<StepReport> r = computeStepReport(*module, ro);
      if (succeeded(r))
        out.report = std::move(*r);
    }
  }
  if (!out.report && out.error.empty())
    out.error = "it does not compile";
  return out;
}
