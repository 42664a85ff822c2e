//===- AutoPlan.h - Search the parallel plans of a model for the fastest --===//
//
// `planc FILE.plan --autoplan` (docs/cost-model.md, "The auto-planner").
// Three phases:
//  1. Probes: the model cut to one and to two layers is compiled through the
//     whole pipeline for every (tp, sequence parallel, recompute, micro batch)
//     and costed by the cost model (StepReport); the difference is what one
//     layer costs a rank (time, activations, parameters), the rest is the
//     embeddings, head and loss. Nothing of a layer's cost is a formula.
//  2. Screening: every combination of dp, tp, pp, mesh order, virtual
//     stages, schedule, micro batch, ZeRO stage, sequence parallelism and
//     recompute that fills the cluster is checked (invalid ones counted by
//     reason) and estimated from the probes: stages of layers, the pipeline's
//     fill and drain, its transfers, the data-parallel collectives of the
//     ZeRO stage over the link the mesh order gives, the optimizer, and the
//     memory of the most loaded rank.
//  3. Verification: the best estimates are written as plans and compiled
//     whole; the cost model's report of each compiled plan (what
//     `planc --report` prints) ranks them, next to the user's own plan.
//===----------------------------------------------------------------------===//
#ifndef PLANC_AUTOPLAN_AUTOPLAN_H
#define PLANC_AUTOPLAN_AUTOPLAN_H

#include "planc/CostModel/StepReport.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace planc {

/// One parallel plan for the model, batch and cluster of the input.
struct ParallelConfig {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1, ep = 1, virtualStages = 1;
  int64_t microBatch = 1, microbatches = 1, zero = 0;
  bool sequenceParallel = false;
  std::string schedule = "1f1b", recompute = "none";
  // Outermost first; cp (context parallelism) always sits just outside tp,
  // and ep (expert parallelism) just inside dp.
  std::vector<std::string> order = {"pp", "dp", "tp"};

  /// "dp 6 tp 8 pp 64 v 2 interleaved_1f1b mbs 1 m 512 zero 1 sp full".
  std::string describe() const;
};

/// A compiled plan's cost (the report) or why it was not kept.
struct Verified {
  ParallelConfig config;
  double estimatedStepTime = 0;
  double estimatedMemory = 0;
  std::optional<StepReport> report; // set when it compiled
  std::string problem;              // why it was rejected, if it was
};

struct AutoPlanOptions {
  unsigned verify = 4;  // compiled plans (besides the user's)
  unsigned show = 5;    // rows printed
  unsigned threads = 0; // compile threads; 0: the machine's cores
};

struct AutoPlanResult {
  int64_t gpus = 0, layers = 0, globalBatch = 0;
  std::string cluster; // "384 nodes x 8 a100", or the assumed one
  // considered = rejected before the estimate + duplicates + screened.
  int64_t considered = 0, duplicates = 0, screened = 0, probes = 0;
  int64_t compiled = 0;                    // whole plans, the input's included
  std::map<std::string, int64_t> rejected; // reason -> count
  std::vector<Verified> ranked;            // compiled, fitting, fastest first
  std::vector<Verified> dropped;           // compiled and rejected
  std::optional<Verified> user;            // the input's own plan
  bool userIsBest = false; // nothing found beats it: ranked[0] is it
  std::string bestText;    // the input, best plan written in
  double probeSeconds = 0, screenSeconds = 0, verifySeconds = 0;
};

/// Searches the plans of the model in `text` (the contents of `path`,
/// whose imports resolve relative to it). `userModule` is the input as
/// parsed (its model, batch, cluster and plan). Fails with a message when
/// not even the probes compile.
llvm::Expected<AutoPlanResult> autoPlan(llvm::StringRef path,
                                        llvm::StringRef text,
                                        mlir::ModuleOp userModule,
                                        const AutoPlanOptions &options);

void printAutoPlan(const AutoPlanResult &r, unsigned show,
                   llvm::raw_ostream &os);

/// The input's text with `c` as its parallel section (the settings the
/// search does not choose, bucket_mb and pad_vocab, kept) and its
/// micro_batch set.
std::string writePlan(llvm::StringRef text, const ParallelConfig &c,
                      llvm::StringRef comment);

} // namespace planc

#endif
