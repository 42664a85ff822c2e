// Unit tests of the cost model's time model: the GEMM efficiency function,
// the nccl-tests ring/tree formulas, and which link a group of ranks
// crosses for a mesh order and node size.
#include "planc/CostModel/TimeModel.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace planc;

namespace {

TimeModel a100() {
  TimeModel tm;
  tm.c.gpu = findGpu("a100");
  tm.lowPrecision = true;
  return tm;
}

TEST(TimeModel, GpuKinds) {
  for (const char *g : {"a100", "a100_40gb", "h100", "h200", "b200", "l40s"})
    EXPECT_NE(findGpu(g), nullptr) << g;
  EXPECT_EQ(findGpu("v100"), nullptr);
  EXPECT_EQ(findGpu("a100")->peak16Tflops, 312.0);
  EXPECT_EQ(findGpu("a100")->memoryGB, 80.0);
  EXPECT_EQ(findGpu("a100_40gb")->memoryGB, 40.0);
  EXPECT_LT(findGpu("a100_40gb")->hbmGBps, findGpu("a100")->hbmGBps);
  EXPECT_GT(findGpu("h100")->peak16Tflops, 3 * findGpu("a100")->peak16Tflops);
  TimeModel tm = a100();
  EXPECT_EQ(tm.peakFlops(), 312e12);
  tm.lowPrecision = false;
  EXPECT_EQ(tm.peakFlops(), 19.5e12);
}

TEST(TimeModel, GemmEfficiency) {
  TimeModel tm = a100();
  const TimeConstants &k = tm.c.k;
  // 8 x 108 tiles of 128 x 128: whole waves, so only the K overhead.
  double m = 128 * 8, n = 128 * 108, kk = 4096;
  EXPECT_DOUBLE_EQ(tm.gemmEfficiency(m, n, kk),
                   k.gemmPeakFraction * kk / (kk + k.tileK0));
  // One tile more needs another wave, mostly idle.
  EXPECT_NEAR(tm.gemmEfficiency(m + 1, n, kk) / tm.gemmEfficiency(m, n, kk),
              (m + 1) * n / (9 * 108 * 128.0 * 128.0) /
                  (m * n / (8 * 108 * 128.0 * 128.0)),
              1e-12);
  // A head dimension of 96 pads its tile to 128.
  EXPECT_NEAR(tm.gemmEfficiency(2048, 96, 2048, 1080) /
                  tm.gemmEfficiency(2048, 128, 2048, 1080),
              0.75, 1e-3);
  // Larger is never slower per FLOP for whole waves; small K costs.
  EXPECT_LT(tm.gemmEfficiency(2048, 2048, 64),
            tm.gemmEfficiency(2048, 2048, 8192));
  // A tiny GEMM is memory- or launch-bound.
  EXPECT_GE(tm.gemmTime(8, 8, 8, 1, 2), k.kernelLaunchS);
}

TEST(TimeModel, Collectives) {
  TimeModel tm = a100();
  Link l;
  l.busGBps = 100;
  l.hopLatencyS = 0;
  double S = 1e9;
  // Bandwidth terms as nccl-tests defines bus bandwidth.
  EXPECT_DOUBLE_EQ(tm.collectiveTime("all_reduce", S, 8, l),
                   2.0 * 7 / 8 * S / 100e9);
  EXPECT_DOUBLE_EQ(tm.collectiveTime("all_gather", S, 8, l),
                   7.0 / 8 * S / 100e9);
  EXPECT_DOUBLE_EQ(tm.collectiveTime("reduce_scatter", S, 4, l),
                   3.0 / 4 * S / 100e9);
  EXPECT_EQ(tm.collectiveTime("all_reduce", S, 1, l), 0);
  // With latency, the tree wins on many ranks and small messages.
  l.hopLatencyS = 1e-5;
  double small = 1e3;
  EXPECT_DOUBLE_EQ(tm.collectiveTime("all_reduce", small, 1024, l),
                   2.0 * 10 * 1e-5 + 2.0 * small / 100e9);
  EXPECT_DOUBLE_EQ(tm.collectiveTime("all_reduce", S, 2, l),
                   2.0 * 1e-5 + S / 100e9);
}

TEST(TimeModel, Links) {
  ClusterModel c;
  c.gpu = findGpu("a100");
  c.gpusPerNode = 8;
  c.intraGBps = 300;
  c.interGBps = 25;
  std::vector<std::string> axes{"pp", "dp", "tp"};
  std::vector<int64_t> sizes{4, 4, 8};
  // tp innermost: within a node, on NVLink.
  Link tp = linkOf(c, axes, sizes, {"tp"});
  EXPECT_FALSE(tp.interNode);
  EXPECT_DOUBLE_EQ(tp.busGBps, 300 * c.k.nvlinkFraction);
  // dp strides over nodes, one member per node: one NIC.
  Link dp = linkOf(c, axes, sizes, {"dp"});
  EXPECT_TRUE(dp.interNode);
  EXPECT_EQ(dp.perNode, 1);
  EXPECT_DOUBLE_EQ(dp.busGBps, 25 * c.k.networkFraction);
  // dp x tp spans 4 nodes with 8 members in each: 8 NICs in parallel,
  // capped by NVLink.
  Link both = linkOf(c, axes, sizes, {"dp", "tp"});
  EXPECT_TRUE(both.interNode);
  EXPECT_EQ(both.perNode, 8);
  EXPECT_DOUBLE_EQ(both.busGBps, std::min(300 * c.k.nvlinkFraction,
                                          8 * 25 * c.k.networkFraction));
  // tp = 2 innermost, dp = 4 next: dp has 4 members per node.
  Link dp4 = linkOf(c, {"dp", "tp"}, {8, 2}, {"dp"});
  EXPECT_TRUE(dp4.interNode);
  EXPECT_EQ(dp4.perNode, 4);
  // The same axes in the other order: dp innermost, within a node.
  EXPECT_FALSE(linkOf(c, {"tp", "dp"}, {2, 4}, {"dp"}).interNode);
  // Point-to-point between nodes: one GPU's NIC.
  TimeModel tm;
  tm.c = c;
  Link pp = linkOf(c, axes, sizes, {"pp"});
  EXPECT_TRUE(pp.interNode);
  EXPECT_DOUBLE_EQ(tm.p2pTime(1e9, pp),
                   pp.hopLatencyS + 1e9 / (25e9 * c.k.networkFraction));
}

} // namespace

namespace {
TEST(TimeModel, AllReduceAlgorithms) {
  Link l;
  l.busGBps = 100;
  l.hopLatencyS = 1e-5;
  double S = 1e9, bw = 100e9, a = 1e-5;
  auto algos = allReduceAlgorithms(S, 8, l);
  ASSERT_EQ(algos.size(), 5u);
  auto get = [&](const char *n) {
    for (auto &x : algos)
      if (std::string(x.name) == n)
        return x;
    ADD_FAILURE() << n;
    return AllReduceAlgorithm{n};
  };
  EXPECT_DOUBLE_EQ(get("parameter_server").timeS, 2 * a + 14 * S / bw);
  EXPECT_DOUBLE_EQ(get("parameter_server").sentBytes, 7 * S);
  EXPECT_DOUBLE_EQ(get("naive").timeS, 7 * a + 7 * S / bw);
  EXPECT_DOUBLE_EQ(get("ring").timeS, 14 * a + 2.0 * 7 / 8 * S / bw);
  EXPECT_DOUBLE_EQ(get("ring").sentBytes, 2.0 * 7 / 8 * S);
  EXPECT_DOUBLE_EQ(get("tree").timeS, 2 * 3 * (a + 2 * S / bw));
  EXPECT_DOUBLE_EQ(get("tree").sentBytes, 3 * S);
  // The butterfly moves what the ring moves in log2 n steps, not n - 1.
  EXPECT_DOUBLE_EQ(get("butterfly").sentBytes, get("ring").sentBytes);
  EXPECT_DOUBLE_EQ(get("butterfly").timeS, 6 * a + 2.0 * 7 / 8 * S / bw);
  // Two ranks: a tree is one exchange each way.
  auto two = allReduceAlgorithms(S, 2, l);
  EXPECT_DOUBLE_EQ(two[3].timeS, 2 * (a + S / bw));
  EXPECT_DOUBLE_EQ(two[3].sentBytes, S);
  EXPECT_TRUE(allReduceAlgorithms(S, 1, l).empty());
}
} // namespace
