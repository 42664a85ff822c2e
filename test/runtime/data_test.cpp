// Deterministic init, synthetic data, safetensors, and the training driver
// on a standalone single-rank host Context.
#include "context.h"
#include "mlp_plan.h"
#include "planrt/internal.h"
#include "planrt/planrt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

using namespace planrt;

namespace {

const bool kDeathStyle = [] {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return true;
}();

TEST(Init, DeterministicPerSeedNameIndex) {
  for (int64_t kind : {InitNormal, InitUniform}) {
    for (int64_t i = 0; i < 100; ++i) {
      float a = internal::init_value(42, "w1", i, kind, 0.0f, 1.0f);
      EXPECT_EQ(a, internal::init_value(42, "w1", i, kind, 0.0f, 1.0f));
    }
    int same_name = 0, same_seed = 0, same_index = 0;
    for (int64_t i = 0; i < 100; ++i) {
      float a = internal::init_value(42, "w1", i, kind, 0.0f, 1.0f);
      same_name += a == internal::init_value(42, "w2", i, kind, 0.0f, 1.0f);
      same_seed += a == internal::init_value(43, "w1", i, kind, 0.0f, 1.0f);
      same_index +=
          a == internal::init_value(42, "w1", i + 1, kind, 0.0f, 1.0f);
    }
    EXPECT_EQ(same_name, 0);
    EXPECT_EQ(same_seed, 0);
    EXPECT_EQ(same_index, 0);
  }
  EXPECT_EQ(internal::init_value(1, "b", 3, InitZeros, 5.0f, 6.0f), 0.0f);
  EXPECT_EQ(internal::init_value(1, "b", 3, InitOnes, 5.0f, 6.0f), 1.0f);
}

TEST(Init, DistributionMoments) {
  const int n = 20000;
  double s = 0, s2 = 0, lo = 1e9, hi = -1e9, us = 0;
  for (int i = 0; i < n; ++i) {
    double v = internal::init_value(7, "w", i, InitNormal, 1.0f, 0.5f);
    s += v;
    s2 += v * v;
    double u = internal::init_value(7, "w", i, InitUniform, -2.0f, 3.0f);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    us += u;
  }
  double mean = s / n, var = s2 / n - mean * mean;
  EXPECT_NEAR(mean, 1.0, 0.02);
  EXPECT_NEAR(std::sqrt(var), 0.5, 0.02);
  EXPECT_GE(lo, -2.0);
  EXPECT_LT(hi, 3.0);
  EXPECT_NEAR(us / n, 0.5, 0.05);
}

TEST(Init, ParamsOfAContextUseGlobalIndex) {
  Context *ctx = internal::create_context("init", false);
  declare_param(ctx, "w", 2, 3, 4, 1, 1, InitNormal, 0.0f, 0.3f);
  set_training(ctx, 1, 99, 0, 0);
  internal::start(ctx);
  auto v = internal::to_host(ctx, param(ctx, 0));
  for (int64_t i = 0; i < 12; ++i)
    EXPECT_EQ(v[i], internal::init_value(99, "w", i, InitNormal, 0.0f, 0.3f));
  internal::destroy_context(ctx);
}

TEST(SyntheticData, SameRowsForAnySplit) {
  const int64_t in = 16, out = 3;
  std::vector<float> full(16 * in), lo(8 * in), hi(8 * in);
  internal::synthetic_inputs(42, 5, 0, 0, 16, in, full.data());
  internal::synthetic_inputs(42, 5, 0, 0, 8, in, lo.data());
  internal::synthetic_inputs(42, 5, 0, 8, 8, in, hi.data());
  EXPECT_TRUE(std::equal(lo.begin(), lo.end(), full.begin()));
  EXPECT_TRUE(std::equal(hi.begin(), hi.end(), full.begin() + 8 * in));
  for (float v : full) {
    EXPECT_GE(v, -1.0f);
    EXPECT_LT(v, 1.0f);
  }
  std::vector<float> yfull(16 * out), ylo(8 * out), yhi(8 * out);
  internal::synthetic_labels(42, full.data(), 16, in, out, yfull.data());
  internal::synthetic_labels(42, lo.data(), 8, in, out, ylo.data());
  internal::synthetic_labels(42, hi.data(), 8, in, out, yhi.data());
  EXPECT_TRUE(std::equal(ylo.begin(), ylo.end(), yfull.begin()));
  EXPECT_TRUE(std::equal(yhi.begin(), yhi.end(), yfull.begin() + 8 * out));

  // Another step or seed gives other data.
  std::vector<float> other(16 * in);
  internal::synthetic_inputs(42, 6, 0, 0, 16, in, other.data());
  EXPECT_NE(other, full);
  internal::synthetic_inputs(43, 5, 0, 0, 16, in, other.data());
  EXPECT_NE(other, full);
}

TEST(SyntheticData, InputsOfAContextMatchGenerator) {
  mlp_plan::dp = 1;
  Context *ctx = internal::create_context("data", false);
  mlp_plan::setup(ctx);
  internal::start(ctx);
  internal::begin_step(ctx, 3);
  auto x = internal::to_host(ctx, input(ctx, 0));
  auto y = internal::to_host(ctx, input(ctx, 1));
  std::vector<float> wx(x.size()), wy(y.size());
  internal::synthetic_inputs(42, 3, 0, 0, 16, mlp_plan::kIn, wx.data());
  internal::synthetic_labels(42, wx.data(), 16, mlp_plan::kIn, mlp_plan::kOut,
                             wy.data());
  EXPECT_EQ(x, wx);
  EXPECT_EQ(y, wy);
  internal::destroy_context(ctx);
}

TEST(SyntheticData, RejectsBadDescriptions) {
  auto run_bad = [](void (*setup)(Context *)) {
    Context *ctx = internal::create_context("bad", false);
    setup(ctx);
    internal::start(ctx);
  };
  EXPECT_DEATH(run_bad([](Context *c) {
                 declare_input(c, "x", RoleInput, 2, 4, 3, 1, 1, -1);
               }),
               "needs exactly one input and one label");
  EXPECT_DEATH(run_bad([](Context *c) {
                 declare_input(c, "x", RoleInput, 3, 4, 3, 2, 1, -1);
                 declare_input(c, "y", RoleLabel, 2, 4, 1, 1, 1, -1);
               }),
               "needs a 2-D input and a 2-D label");
  EXPECT_DEATH(run_bad([](Context *c) {
                 declare_input(c, "x", RoleInput, 2, 4, 3, 1, 1, -1);
                 declare_input(c, "y", RoleLabel, 2, 4, 1, 1, 1, -1);
                 set_training(c, 1, 1, 4, 7);
               }),
               "unsupported data_kind 7");
  EXPECT_DEATH(run_bad([](Context *c) {
                 declare_mesh_axis(c, "dp", 1);
                 declare_input(c, "x", RoleInput, 2, 4, 3, 1, 1, 0);
                 declare_input(c, "y", RoleLabel, 2, 4, 1, 1, 1, 0);
                 set_training(c, 1, 1, 8, 0);
               }),
               "global batch 8 does not match");
}

// Expert parallelism with microbatches: each rank's rows are one run per
// microbatch, split over ep inside the dp rank's microbatch; over the mesh
// the runs cover the global batch once.
TEST(SyntheticData, ExpertParallelRunsCoverTheBatchOnce) {
  Context *ctx = internal::create_context("runs", false);
  declare_mesh_axis(ctx, "dp", 2);
  declare_mesh_axis(ctx, "ep", 2);
  // 6 local rows: 3 microbatches of 2; the global batch is 24 rows.
  declare_input(ctx, "x", RoleInput, 2, 6, 3, 1, 1, 0);
  set_input_inner_axis(ctx, 0, 1, 3);
  const InputDesc &in = ctx->inputs[0];
  EXPECT_EQ(batch_ranks(ctx, in), 4);
  std::vector<int> seen(24, 0);
  for (int64_t d = 0; d < 2; ++d)
    for (int64_t e = 0; e < 2; ++e) {
      ctx->coords = {d, e};
      for (int64_t c = 0; c < 3; ++c) {
        int64_t r0 = batch_run_row0(ctx, in, c);
        // Microbatch c of dp rank d is rows [(3 d + c) 4, +4), ep's half e.
        EXPECT_EQ(r0, ((3 * d + c) * 2 + e) * 2) << d << e << c;
        for (int64_t r = 0; r < 2; ++r)
          ++seen[(size_t)(r0 + r)];
      }
    }
  EXPECT_EQ(seen, std::vector<int>(24, 1));
  EXPECT_DEATH(set_input_inner_axis(ctx, 0, 0, 3),
               "needs an input split over a batch axis and another mesh axis");
  EXPECT_DEATH(set_input_inner_axis(ctx, 0, 1, 4),
               "4 runs do not divide its 6 rows");
  internal::destroy_context(ctx);
}

std::string read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Safetensors, RoundTrip) {
  std::vector<float> a = {1.0f, -2.5f, 3.25f, 4.0f, 5.0f, 6.0f};
  std::vector<float> b = {0.125f};
  std::string path = testing::TempDir() + "planrt_st_" +
                     std::to_string(getpid()) + ".safetensors";
  internal::write_safetensors(
      path, {{"w\"1", {2, 3}, a.data()}, {"b", {}, b.data()}});
  std::string bytes = read_file(path);
  std::remove(path.c_str());
  ASSERT_GE(bytes.size(), 8u);
  uint64_t hl = 0;
  for (int i = 0; i < 8; ++i)
    hl |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
  EXPECT_EQ(hl % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + hl + 4 * (a.size() + b.size()));
  std::string header = bytes.substr(8, hl);
  std::string json = header.substr(0, header.find_last_not_of(' ') + 1);
  EXPECT_EQ(json, "{\"w\\\"1\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                  "\"data_offsets\":[0,24]},\"b\":{\"dtype\":\"F32\","
                  "\"shape\":[],\"data_offsets\":[24,28]}}");
  std::vector<float> data(a.size() + b.size());
  std::memcpy(data.data(), bytes.data() + 8 + hl, data.size() * 4);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), data.begin()));
  EXPECT_EQ(data.back(), b[0]);
}

TEST(Driver, TrainsSingleRankAndSaves) {
  mlp_plan::dp = 1;
  Context *ctx = internal::create_context("mlp", false);
  mlp_plan::setup(ctx);
  internal::start(ctx);
  auto losses = internal::train(ctx, mlp_plan::step, 30, /*quiet=*/true);
  ASSERT_EQ(losses.size(), 30u);
  for (float l : losses)
    ASSERT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), losses.front());

  std::string path = testing::TempDir() + "planrt_save_" +
                     std::to_string(getpid()) + ".safetensors";
  internal::save_safetensors(ctx, path);
  std::string bytes = read_file(path);
  std::remove(path.c_str());
  uint64_t hl = 0;
  for (int i = 0; i < 8; ++i)
    hl |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
  std::string header = bytes.substr(8, hl);
  EXPECT_NE(header.find("\"w1\":{\"dtype\":\"F32\",\"shape\":[16,32],"
                        "\"data_offsets\":[0,2048]}"),
            std::string::npos);
  EXPECT_NE(header.find("\"b2\":{\"dtype\":\"F32\",\"shape\":[2]"),
            std::string::npos);
  auto w1 = internal::to_host(ctx, param(ctx, 0));
  std::vector<float> saved(w1.size());
  std::memcpy(saved.data(), bytes.data() + 8 + hl, saved.size() * 4);
  EXPECT_EQ(saved, w1);
  internal::destroy_context(ctx);
}

TEST(Driver, ArenaIsReusedAcrossSteps) {
  Context *ctx = internal::create_context("arena", false);
  internal::start(ctx);
  internal::begin_step(ctx, 1);
  // More than one chunk's worth: the arena grows, then is consolidated.
  Tensor *a = alloc(ctx, 1, 262144, 1, 1, 1);
  Tensor *b = alloc(ctx, 1, 262144, 1, 1, 1);
  EXPECT_NE(a->data, b->data);
  internal::begin_step(ctx, 2);
  Tensor *c = alloc(ctx, 1, 262144, 1, 1, 1);
  Tensor *d = alloc(ctx, 1, 262144, 1, 1, 1);
  EXPECT_EQ((char *)d->data - (char *)c->data, 262144 * 4);
  EXPECT_EQ((uintptr_t)c->data % 256, 0u);
  internal::destroy_context(ctx);
}

} // namespace
