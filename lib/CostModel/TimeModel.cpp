//===- TimeModel.cpp - How long kernels and collectives take on a cluster -===//
#include "planc/CostModel/TimeModel.h"

#include <algorithm>
#include <cmath>

using namespace planc;

// Datasheet numbers (SXM parts where there are several; dense tensor-core
// rates, no sparsity). fp32 is the non-tensor-core rate: fp32 plans run
// fp32 GEMMs; tf32 is the tensor-core rate of `precision = tf32`. The
// links are those of the vendor's reference node (DGX / HGX), per GPU and
// one direction: NVLink 3 / 4 / 5 (300 / 450 / 900 GB/s) and one 200 Gb/s
// (A100) or 400 Gb/s (H100, H200, B200) NIC per GPU; the L40S has no
// NVLink (PCIe 4.0 x16, 32 GB/s) and is assumed with 200 Gb/s per GPU.
static const GpuSpec kGpus[] = {
    // name   fp16/bf16  fp32  HBM GB/s  GB   SMs  tf32  intra inter
    {"a100", 312.0, 19.5, 2039.0, 80.0, 108, 156.0, 300, 25}, // A100 80GB SXM
    {"a100_40gb", 312.0, 19.5, 1555.0, 40.0, 108, 156.0, 300, 25},
    {"h100", 989.0, 67.0, 3350.0, 80.0, 132, 494.7, 450, 50}, // H100 SXM5
    {"h200", 989.0, 67.0, 4800.0, 141.0, 132, 494.7, 450, 50},
    {"b200", 2250.0, 75.0, 8000.0, 180.0, 148, 1100.0, 900, 50},
    {"l40s", 362.0, 91.6, 864.0, 48.0, 142, 183.0, 32, 25},
};

const GpuSpec *planc::findGpu(llvm::StringRef name) {
  for (const GpuSpec &g : kGpus)
    if (name.equals_insensitive(g.name))
      return &g;
  return nullptr;
}

double TimeModel::peakFlops() const {
  return (lowPrecision ? c.gpu->peak16Tflops
          : tf32       ? c.gpu->peakTf32Tflops
                       : c.gpu->peak32Tflops) *
         1e12;
}

double TimeModel::gemmEfficiency(double m, double n, double k,
                                 double batch) const {
  if (m <= 0 || n <= 0 || k <= 0 || batch <= 0)
    return c.k.gemmPeakFraction;
  // Output tiles are spread over the SMs in waves; a partial last wave and
  // the padding of edge tiles leave SMs idle.
  double t = double(c.k.tile);
  double tiles = std::ceil(m / t) * std::ceil(n / t) * batch;
  double waves = std::ceil(tiles / double(c.gpu->sms));
  double used = (m * n * batch) / (waves * double(c.gpu->sms) * t * t);
  // Each tile loads its first K slice and writes its output once: a fixed
  // cost of tileK0 iterations of the K loop.
  double kFraction = k / (k + c.k.tileK0);
  return c.k.gemmPeakFraction * used * kFraction;
}

double TimeModel::gemmTime(double m, double n, double k, double batch,
                           double elemBytes) const {
  double flops = 2.0 * m * n * k * batch;
  double compute = flops / (peakFlops() * gemmEfficiency(m, n, k, batch));
  double bytes = (m * k + k * n + m * n) * batch * elemBytes;
  double memory = bytes / (c.gpu->hbmGBps * 1e9 * c.k.hbmFraction);
  return c.k.kernelLaunchS + std::max(compute, memory);
}

double TimeModel::flashAttentionTime(double batch, double sq, double sk,
                                     double d, bool backward,
                                     double seen) const {
  if (batch <= 0 || sq <= 0 || sk <= 0 || d <= 0)
    return c.k.kernelLaunchS;
  // Causal: a query sees the keys up to its own position, half of them on
  // average (this rank's queries over every rank's keys, likewise).
  double forward = 4.0 * batch * sq * sk * d * seen;
  double flops = backward ? 2.5 * forward : forward;
  double fraction =
      backward ? c.k.flashBackwardFraction : c.k.flashForwardFraction;
  return c.k.kernelLaunchS +
         flops / (peakFlops() * fraction * sk / (sk + c.k.flashKeys0));
}

double TimeModel::tiledAttentionTime(double batch, double sq, double sk,
                                     double d, bool backward) const {
  double launches = backward ? 2 : 1;
  if (batch <= 0 || sq <= 0 || sk <= 0 || d <= 0)
    return launches * c.k.kernelLaunchS;
  double forward = 4.0 * batch * sq * sk * d / 2.0;
  double flops = backward ? 4.5 * forward : forward;
  double rate = lowPrecision
                    ? c.gpu->peak16Tflops * 1e12 * c.k.tilesTensorFraction
                    : c.gpu->peak32Tflops * 1e12 * c.k.tilesSimtFraction;
  return launches * c.k.kernelLaunchS + flops / rate;
}

double TimeModel::memoryTime(double bytes) const {
  return c.k.kernelLaunchS + bytes / (c.gpu->hbmGBps * 1e9 * c.k.hbmFraction);
}

double TimeModel::collectiveTime(llvm::StringRef kind, double bytes, int64_t n,
                                 const Link &link) const {
  if (n <= 1 || bytes <= 0)
    return 0;
  double bw = link.busGBps * 1e9, a = link.hopLatencyS, nn = double(n);
  if (kind == "all_reduce") {
    // nccl-tests: busbw = algbw * 2(n-1)/n for the ring; the tree sends each
    // byte up and down once (2 S) in 2 log2(n) latency steps.
    double ring = 2.0 * (nn - 1) * a + 2.0 * (nn - 1) / nn * bytes / bw;
    double tree = 2.0 * std::ceil(std::log2(nn)) * a + 2.0 * bytes / bw;
    return std::min(ring, tree);
  }
  // all-gather, reduce-scatter, all-to-all: busbw = algbw * (n-1)/n.
  return (nn - 1) * a + (nn - 1) / nn * bytes / bw;
}

double TimeModel::p2pTime(double bytes, const Link &link) const {
  // Between nodes one GPU's message goes through its one NIC.
  double bw = link.interNode ? c.interGBps * c.k.networkFraction : link.busGBps;
  return link.hopLatencyS + bytes / (bw * 1e9);
}

Link planc::linkOf(const ClusterModel &c, const std::vector<std::string> &axes,
                   const std::vector<int64_t> &sizes,
                   const std::vector<std::string> &groupAxes) {
  // Strides of the rank numbering: the last axis varies fastest.
  std::vector<int64_t> stride(axes.size(), 1);
  for (int64_t i = (int64_t)axes.size() - 2; i >= 0; --i)
    stride[i] = stride[i + 1] * sizes[i + 1];
  // Rank 0's group: the ranks whose other coordinates are 0.
  std::vector<int64_t> members{0};
  for (size_t i = 0; i < axes.size(); ++i) {
    if (std::find(groupAxes.begin(), groupAxes.end(), axes[i]) ==
        groupAxes.end())
      continue;
    std::vector<int64_t> next;
    for (int64_t m : members)
      for (int64_t j = 0; j < sizes[i]; ++j)
        next.push_back(m + j * stride[i]);
    members = std::move(next);
  }
  Link l;
  l.perNode = std::count_if(members.begin(), members.end(),
                            [&](int64_t r) { return r < c.gpusPerNode; });
  l.interNode = l.perNode < (int64_t)members.size();
  double nvlink = c.intraGBps * c.k.nvlinkFraction;
  if (!l.interNode) {
    l.busGBps = nvlink;
    l.hopLatencyS = c.k.nvlinkHopLatencyS;
  } else {
    // Each GPU has its own NIC; the group's members in a node drive that
    // many NICs in parallel (NCCL runs one ring per NIC), and NVLink joins
    // them within the node.
    l.busGBps =
        std::min(nvlink, double(l.perNode) * c.interGBps * c.k.networkFraction);
    l.hopLatencyS = c.k.networkHopLatencyS;
  }
  return l;
}

std::vector<AllReduceAlgorithm>
planc::allReduceAlgorithms(double bytes, int64_t n, const Link &link) {
  double S = bytes, nn = double(n), a = link.hopLatencyS;
  double bw = link.busGBps * 1e9;
  double steps = std::ceil(std::log2(std::max(nn, 1.0)));
  std::vector<AllReduceAlgorithm> out;
  if (n <= 1)
    return out;
  // Parameter server (one of the ranks): n-1 others send it S and receive
  // the sum back, all through its one link.
  out.push_back(
      {"parameter_server", 2 * a + 2 * (nn - 1) * S / bw, (nn - 1) * S});
  // Naive: every rank sends its whole buffer to every other and sums.
  out.push_back({"naive", (nn - 1) * a + (nn - 1) * S / bw, (nn - 1) * S});
  // Ring: reduce-scatter then all-gather, n-1 steps of S/n each.
  out.push_back({"ring", 2 * (nn - 1) * a + 2 * (nn - 1) / nn * S / bw,
                 2 * (nn - 1) / nn * S});
  // Binary tree, not pipelined: floor(log2 n) levels up (a parent receives
  // each child's S) and down (it sends S to each child); an inner rank
  // sends S up and S to each child.
  double depth = std::floor(std::log2(nn));
  double children = n > 2 ? 2 : 1;
  out.push_back({"tree", 2 * depth * (a + children * S / bw),
                 n == 2   ? S
                 : n == 3 ? 2 * S
                          : 3 * S});
  // Recursive halving (reduce-scatter) then doubling (all-gather): log2 n
  // steps each, exchanging S/2, S/4, ... (n a power of two; otherwise the
  // next one, as the extra ranks pair up first).
  double p2 = std::exp2(steps);
  out.push_back({"butterfly", 2 * steps * a + 2 * (p2 - 1) / p2 * S / bw,
                 2 * (p2 - 1) / p2 * S});
  return out;
}
