//===- StepReport.h - What one training step costs, read from the rank IR -===//
//
// The first part of the cost model: counts, not times. It walks the
// rank-level program (after plan-schedule-pipeline), so what it reports is
// what each rank executes: the parameters it holds, its gradients and
// optimizer state, and the bytes it sends per step by collective kind and
// mesh axes (ring algorithms, as nccl-tests counts them), with collectives
// in a microbatch loop or a pipeline unit counted once per microbatch.
//===----------------------------------------------------------------------===//
#ifndef PLANC_COSTMODEL_STEPREPORT_H
#define PLANC_COSTMODEL_STEPREPORT_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <string>
#include <vector>

namespace planc {

/// The collectives of one kind over one group of mesh axes, per step, on
/// one rank.
struct CommLine {
  std::string kind;  // all_reduce, all_gather, reduce_scatter, all_to_all,
                     // send (pipeline transfers)
  std::string axes;  // e.g. "dp", "dp,tp"; the pipeline axis for send
  int64_t group = 1; // ranks in the group
  int64_t calls = 0;
  double payloadBytes = 0; // the buffers' bytes, summed over the calls
  double sentBytes = 0;    // what this rank sends (ring): all-reduce
                           // 2(n-1)/n, gather/scatter/all-to-all (n-1)/n
};

/// One rank's step (the most loaded pipeline coordinate with a pipeline).
struct StepReport {
  int64_t ranks = 1;
  int64_t params = 0;        // global parameter count
  int64_t paramsPerRank = 0; // held by the most loaded rank
  double stepFlopsPerRank = 0;
  int64_t weightBytes = 0, gradientBytes = 0, optimizerBytes = 0;
  std::vector<CommLine> comm; // sorted by kind, then axes
  double sentBytes() const;
};

/// Reads the report from a module lowered through plan-schedule-pipeline;
/// fails (with an error on the module) when it is not at that level.
mlir::FailureOr<StepReport> computeStepReport(mlir::ModuleOp module);

void printStepReport(const StepReport &r, llvm::raw_ostream &os);
llvm::json::Object stepReportJson(const StepReport &r);

} // namespace planc

#endif
