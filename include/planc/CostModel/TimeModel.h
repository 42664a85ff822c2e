//===- TimeModel.h - How long kernels and collectives take on a cluster ---===//
//
// The time part of the cost model (docs/cost-model.md states every formula
// and constant): GEMMs at a fraction of the GPU's peak that depends on their
// size (tile and wave quantization on the GPU's SMs, a per-tile K overhead),
// memory-bound kernels at a fraction of HBM bandwidth, collectives by the
// ring and tree formulas nccl-tests uses for bus bandwidth, over the link the
// group crosses (NVLink within a node, the network between nodes), and
// point-to-point transfers at link bandwidth.
//===----------------------------------------------------------------------===//
#ifndef PLANC_COSTMODEL_TIMEMODEL_H
#define PLANC_COSTMODEL_TIMEMODEL_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace planc {

/// A GPU kind's datasheet numbers (dense, no sparsity).
struct GpuSpec {
  const char *name;      // as the cluster section spells it
  double peak16Tflops;   // fp16/bf16 tensor cores, dense
  double peak32Tflops;   // fp32 (no TF32): what an fp32 plan computes at
  double hbmGBps;        // memory bandwidth
  double memoryGB;       // memory capacity
  int64_t sms;           // streaming multiprocessors (GEMM waves)
  double peakTf32Tflops; // fp32 GEMMs on tensor cores (precision = tf32)
  // The usual links of a node built around it (GB/s per GPU, one
  // direction): the cluster section's intra_bw / inter_bw when not given.
  double intraGBps; // NVLink (PCIe where it has none)
  double interGBps; // the node's NICs divided among its GPUs
};

/// The kinds the cluster section accepts; nullptr when unknown.
const GpuSpec *findGpu(llvm::StringRef name);

/// Efficiency constants of the model, one set for every GPU kind.
struct TimeConstants {
  double gemmPeakFraction = 0.76; // a full wave of large tiles
  int64_t tile = 128;             // GEMM output tile (square)
  double tileK0 = 128;            // per-tile overhead, in K iterations
  double kernelLaunchS = 4e-6;    // per kernel
  double hbmFraction = 0.80;      // memory-bound kernels
  double nvlinkFraction = 0.80;   // NCCL bus bandwidth / NVLink bandwidth
  double networkFraction = 0.90;  // NCCL bus bandwidth / NIC bandwidth
  double nvlinkHopLatencyS = 2e-6;
  double networkHopLatencyS = 6e-6;
  // Fused (flash) causal attention, cuDNN's SDPA: the fraction of the
  // 16-bit peak its executed FLOPs reach at long rows, and the keys per
  // row at which it reaches half of that (the per-row-block cost of loading
  // the queries, writing the output, and the diagonal's masked tiles).
  double flashForwardFraction = 0.39;
  double flashBackwardFraction = 0.45;
  double flashKeys0 = 512;
  // planrt's own attention tiles (runtime/lib/cuda/attention.cu), where
  // cuDNN does not run: the fraction of the peak their executed FLOPs
  // reached in GPT-2 124M's step on an H200 (bench/RESULTS.md, 2026-11-27):
  // 16-bit operands on the tensor cores (WMMA) 35.4 ms, fp32 on the SIMT
  // cores 86 ms, for 1.70 TFLOP each.
  double tilesTensorFraction = 0.048;
  double tilesSimtFraction = 0.29;
};

/// The machines: a GPU kind, GPUs per node and per-GPU link bandwidths
/// (GB/s, one direction); `assumed` when the plan has no cluster section.
struct ClusterModel {
  const GpuSpec *gpu = nullptr;
  int64_t gpusPerNode = 8;
  double intraGBps = 300, interGBps = 25;
  bool assumed = false;
  // The bandwidths taken from the GPU kind (the section did not set them).
  bool intraAssumed = false, interAssumed = false;
  TimeConstants k;
};

/// Where a group of ranks communicates.
struct Link {
  bool interNode = false;
  int64_t perNode = 1; // members of the group in one node
  double busGBps = 0;  // bus bandwidth a collective reaches over it
  double hopLatencyS = 0;
};

struct TimeModel {
  ClusterModel c;
  bool lowPrecision = false; // fp16/bf16 tensor cores
  bool tf32 = false;         // fp32 values, TF32 tensor-core GEMMs

  double peakFlops() const;
  /// Fraction of peak a GEMM (batch of `batch` M x N x K products) reaches.
  double gemmEfficiency(double m, double n, double k, double batch = 1) const;
  /// A GEMM's time: its FLOPs at gemmEfficiency, or its bytes at HBM rate
  /// when slower, plus a launch.
  double gemmTime(double m, double n, double k, double batch,
                  double elemBytes) const;
  /// A fused causal attention (cuDNN's SDPA) over `batch` heads of `sq`
  /// queries and `sk` keys of head size `d`: the forward's two products over
  /// the unmasked half of the scores (the fraction `seen` of them: 1 for an
  /// attention without a mask), or the backward's five (it computes the
  /// scores again), at flash*Fraction of the 16-bit peak scaled by sk / (sk
  /// + flashKeys0), plus a launch. No score matrix in memory.
  double flashAttentionTime(double batch, double sq, double sk, double d,
                            bool backward, double seen = 0.5) const;
  /// planrt's attention tiles over the same problem: the causal forward's
  /// two products, or the backward's nine (grad_q: the scores and dP in
  /// each of its two passes, then dQ; grad_kv: the scores, dP, dV and dK;
  /// context parallelism's tiles: a forward for the rows' statistics, then
  /// seven), on the tensor cores for 16-bit plans, else fp32 on the SIMT
  /// cores (TF32 plans too), plus a launch (two for the backward).
  double tiledAttentionTime(double batch, double sq, double sk, double d,
                            bool backward) const;
  /// A memory-bound kernel moving `bytes`.
  double memoryTime(double bytes) const;
  /// A collective of `kind` (all_reduce, all_gather, reduce_scatter,
  /// all_to_all) with payload `bytes` (all-gather: the gathered output;
  /// reduce-scatter: the full input) over `n` ranks on `link`: the faster
  /// of ring and (all-reduce only) tree.
  double collectiveTime(llvm::StringRef kind, double bytes, int64_t n,
                        const Link &link) const;
  /// A point-to-point transfer of `bytes` over `link`.
  double p2pTime(double bytes, const Link &link) const;
};

/// An all-reduce algorithm of the textbooks, costed for one message.
struct AllReduceAlgorithm {
  const char *name;
  double timeS = 0;
  double sentBytes = 0; // by the rank that sends the most
};
/// Parameter server, naive (everyone sends everything to everyone), ring,
/// binary tree (reduce then broadcast, not pipelined) and recursive
/// halving/doubling ("butterfly") for `bytes` over `n` ranks, each rank's
/// link at `link.busGBps` with `link.hopLatencyS` per message step
/// (docs/cost-model.md states the formulas).
std::vector<AllReduceAlgorithm> allReduceAlgorithms(double bytes, int64_t n,
                                                    const Link &link);

/// The link of the group of ranks that differ only in `groupAxes`, given the
/// mesh's (non-sequential) axes outermost first (the last varies fastest
/// across consecutive ranks, which fill a node before the next).
Link linkOf(const ClusterModel &c, const std::vector<std::string> &axes,
            const std::vector<int64_t> &sizes,
            const std::vector<std::string> &groupAxes);

} // namespace planc

#endif
