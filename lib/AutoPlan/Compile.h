//===- Compile.h - A plan text through the pipeline to its step report ----===//
#ifndef PLANC_LIB_AUTOPLAN_COMPILE_H
#define PLANC_LIB_AUTOPLAN_COMPILE_H

#include "planc/CostModel/StepReport.h"

#include <optional>
#include <string>

namespace planc {

struct CompiledReport {
  std::optional<StepReport> report;
  std::string error; // the first error when it did not compile
};

/// Parses `text` as the file `path` (imports resolve next to it), runs the
/// pipeline through plan-memory and reads the cost model's report: what
/// `planc --report` prints for that file. `maxRepeat` > 0 cuts the model's
/// repeats to that many layers (ImportOptions). Self-contained (its own
/// MLIR context), so calls may run on several threads at once.
CompiledReport compilePlanText(llvm::StringRef path, llvm::StringRef text,
                               int64_t maxRepeat = 0);

} // namespace planc

#endif
