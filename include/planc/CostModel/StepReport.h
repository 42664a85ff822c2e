//===- StepReport.h - What one training step costs, read from the rank IR -===//
//
// The cost model (docs/cost-model.md). It walks the rank-level program
// (after plan-schedule-pipeline), so what it reports is what each rank
// executes: the parameters it holds, its gradients and optimizer state, the
// FLOPs it runs (recompute included), the bytes it sends per step by
// collective kind and mesh axes (ring algorithms, as nccl-tests counts them),
// with ops in a microbatch loop or a pipeline unit counted once per
// microbatch; and how long the step takes on the plan's cluster
// (TimeModel.h), the pipeline simulated with those times.
//===----------------------------------------------------------------------===//
#ifndef PLANC_COSTMODEL_STEPREPORT_H
#define PLANC_COSTMODEL_STEPREPORT_H

#include "planc/CostModel/TimeModel.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <optional>
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

/// Where the slowest rank's step time goes (seconds per step).
struct TimeBreakdown {
  double gemm = 0;         // rank.matmul, convolutions
  double attention = 0;    // attention and its gradient (GEMMs and softmax)
  double memoryBound = 0;  // every other kernel
  double collectives = 0;  // blocking collectives, and waits for started ones
  double pipelineWait = 0; // idle inside the pipeline (bubble, transfers)
};

/// One rank's step (the most loaded pipeline coordinate with a pipeline).
struct StepReport {
  int64_t ranks = 1;
  int64_t params = 0;        // global parameter count
  int64_t paramsPerRank = 0; // held by the most loaded rank
  double stepFlopsPerRank = 0;
  int64_t weightBytes = 0, gradientBytes = 0, optimizerBytes = 0;
  // Of weightBytes: the 16-bit copies kept across steps
  // (plan-keep-param-copies).
  int64_t paramCopyBytes = 0;
  double activationBytes = 0; // kept from forward to backward, in flight
  std::vector<double> activationsByCoordinate; // the same per pp coordinate
  // The memory plan (plan-memory) of the fullest rank: the step's arena
  // (activations, gradients and workspace as the plan lays them out, reuse
  // included), its largest op workspace, the stash pool and the inputs. A
  // plan runs in fp32 today: for a 16-bit plan these are the fp32 program's.
  bool planned = false;
  int64_t arenaBytes = 0, workspaceBytes = 0, stashBytes = 0, inputBytes = 0;
  std::vector<CommLine> comm; // sorted by kind, then axes

  // FLOPs of one step, all ranks together.
  double flopsPerStep = 0;      // executed by the ranks, recompute included
  double modelFlopsPerStep = 0; // the model's (global shapes, no recompute)
  double matmulFlops = 0, attentionFlops = 0, otherFlops = 0; // executed

  // Time on the cluster (the slowest pipeline coordinate).
  std::string gpu;
  bool clusterAssumed = false;
  // The links (GB/s per GPU, one direction) and whether each came from the
  // GPU kind because the cluster section did not set it.
  double intraGBps = 0, interGBps = 0;
  bool intraAssumed = false, interAssumed = false;
  std::string precision;
  double peakFlops = 0;
  double stepTime = 0;
  double bubbleFraction = 0;
  double tokensPerStep = 0;
  std::optional<double> tokens; // --tokens
  TimeBreakdown time;
  std::map<std::string, double> timeByOp; // busy seconds by op (slowest)
  // The step's data-parallel gradient bytes all-reduced by each textbook
  // algorithm over the dp group's link (empty without dp).
  double allReduceBytes = 0;
  int64_t allReduceRanks = 1;
  std::vector<AllReduceAlgorithm> allReduce;
  // A mixture of experts: its layers, experts (in all, and per rank: E /
  // ep) and top_k, and the experts' weights (fp32 master bytes) in the
  // whole step and on one rank that holds their layers. The time model
  // assumes balanced routing (tokens x top_k / E rows per expert). With
  // expert parallelism, what the all-gather dispatcher moves over ep per
  // step and rank: the gathers of the tokens, choices and gates, and the
  // reduce-scatters of the outputs (payload, and sent by a ring).
  int64_t moeLayers = 0, moeExperts = 0, moeTopK = 0;
  int64_t moeExpertsPerRank = 0, moeEp = 1;
  int64_t expertWeightBytes = 0, expertWeightBytesPerRank = 0;
  double moeGatherBytes = 0, moeGatherSent = 0, moeScatterBytes = 0,
         moeScatterSent = 0;
  // The all-to-all dispatcher (ep_comm = all_to_all): the routed rows sent
  // to the experts' ranks and back, assuming balanced routing (a share
  // moeRoutedShare of another rank's rows reaches a rank); the choices are
  // still all-gathered (moeGather*).
  double moeDispatchBytes = 0, moeDispatchSent = 0, moeCombineBytes = 0,
         moeCombineSent = 0, moeRoutedShare = 0;
  double gpuMemoryBytes = 0;
  // cuda: what the libraries may hold outside the plan at most (cuBLASLt's
  // workspace, cuDNN's attention buffers: planrt/workspace.h outside), and
  // the largest attention cuDNN may run ("" when none).
  int64_t libraryBytes = 0;
  std::string cudnnAttention;
  /// Pipelined on the cuda target: each send copies its tensor into a
  /// buffer of its own until it is sent (not counted in libraryBytes).
  bool sendCopies = false;

  double sentBytes() const;
  double tokensPerSecond() const { return tokensPerStep / stepTime; }
  double tflopsPerGpu() const {
    return flopsPerStep / double(ranks) / stepTime / 1e12;
  }
  double mfu() const {
    return modelFlopsPerStep / double(ranks) / stepTime / peakFlops;
  }
  /// What the program holds, as planrt allocates it: the fp32 weights and
  /// optimizer state, the planned arena (16-bit activations, copies and
  /// workspace at their own widths) and stash pool, the inputs; the runtime
  /// measures the same at every precision. Without a memory plan (IR before
  /// plan-memory): model states and activations, and the largest workspace.
  double memoryPeakBytes() const {
    if (planned)
      return double(weightBytes + optimizerBytes + arenaBytes + stashBytes +
                    inputBytes);
    return double(weightBytes + gradientBytes + optimizerBytes) +
           activationBytes + double(workspaceBytes);
  }
  /// The plan's peak and what the libraries may hold besides it.
  bool fits() const {
    return memoryPeakBytes() + double(libraryBytes) <= gpuMemoryBytes;
  }
};

struct ReportOptions {
  std::optional<double> tokens; // a training budget: report its time
  bool cuda = false;            // the cuda target: count its libraries' memory
};

/// The plan's cluster section as the time model sees it, or the assumed
/// cluster (A100 80GB, 8 per node) when it has none.
ClusterModel clusterModelOf(mlir::ModuleOp module);

/// Reads the report from a module lowered through plan-schedule-pipeline;
/// fails (with an error on the module) when it is not at that level.
mlir::FailureOr<StepReport> computeStepReport(mlir::ModuleOp module,
                                              const ReportOptions &opts = {});

void printStepReport(const StepReport &r, llvm::raw_ostream &os);
llvm::json::Object stepReportJson(const StepReport &r);

} // namespace planc

#endif
