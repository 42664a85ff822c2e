// Tests run with `mpirun -np 2`: all-reduce over mesh groups, context
// parallelism's exchanges and attentions, and a 2-rank
// data-parallel run against a 1-rank run of the same plan.
#include "../mlp_plan.h"
#include "mpi_main.h"
#include "planrt/internal.h"
#include "planrt/planrt.h"
#include "planrt/workspace.h"

#include <gtest/gtest.h>
#include <mpi.h>

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

int world_rank() { return planrt_test::worldRank(); }

Context *mesh_context(std::vector<std::pair<const char *, int64_t>> axes) {
  Context *ctx = internal::create_context("mpi", /*use_mpi=*/true);
  for (auto &a : axes)
    declare_mesh_axis(ctx, a.first, a.second);
  internal::start(ctx);
  internal::begin_step(ctx, 1);
  return ctx;
}

std::vector<float> reduce(Context *ctx, int64_t mask) {
  Tensor *t = alloc(ctx, 2, 3, 5, 1, 1);
  std::vector<float> v(15);
  for (int i = 0; i < 15; ++i)
    v[i] = (float)(i + 1) * (world_rank() + 1) + 0.25f;
  internal::from_host(ctx, t, v);
  all_reduce_sum(ctx, t, mask);
  return internal::to_host(ctx, t);
}

TEST(AllReduce, SumsOverTheDpAxis) {
  Context *ctx = mesh_context({{"dp", 2}});
  auto got = reduce(ctx, 1);
  for (int i = 0; i < 15; ++i)
    EXPECT_EQ(got[i], (float)(i + 1) * 3 + 0.5f);
  // Mask 0: no-op.
  got = reduce(ctx, 0);
  for (int i = 0; i < 15; ++i)
    EXPECT_EQ(got[i], (float)(i + 1) * (world_rank() + 1) + 0.25f);
  internal::destroy_context(ctx);
}

TEST(AllReduce, GroupsFollowTheAxisMask) {
  // Mesh dp=2 x tp=1: the tp group of every rank is itself.
  Context *ctx = mesh_context({{"dp", 2}, {"tp", 1}});
  auto alone = reduce(ctx, 2);
  auto both = reduce(ctx, 3);
  auto dp = reduce(ctx, 1);
  for (int i = 0; i < 15; ++i) {
    EXPECT_EQ(alone[i], (float)(i + 1) * (world_rank() + 1) + 0.25f);
    EXPECT_EQ(both[i], (float)(i + 1) * 3 + 0.5f);
    EXPECT_EQ(dp[i], both[i]);
  }
  internal::destroy_context(ctx);
  // Mesh pp=1 x tp=2: the last axis varies fastest, so tp spans both ranks.
  ctx = mesh_context({{"pp", 1}, {"tp", 2}});
  auto pp = reduce(ctx, 1);
  auto tp = reduce(ctx, 2);
  for (int i = 0; i < 15; ++i) {
    EXPECT_EQ(pp[i], (float)(i + 1) * (world_rank() + 1) + 0.25f);
    EXPECT_EQ(tp[i], (float)(i + 1) * 3 + 0.5f);
  }
  internal::destroy_context(ctx);
}

struct RunResult {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
};

RunResult run_plan(int64_t dp, bool use_mpi, bool adamw, int64_t steps) {
  mlp_plan::dp = dp;
  mlp_plan::use_adamw = adamw;
  Context *ctx = internal::create_context("mlp", use_mpi);
  mlp_plan::setup(ctx);
  internal::start(ctx);
  RunResult r;
  r.losses = internal::train(ctx, mlp_plan::step, steps, /*quiet=*/true);
  for (int i = 0; i < 4; ++i)
    r.params.push_back(internal::to_host(ctx, param(ctx, i)));
  internal::destroy_context(ctx);
  return r;
}

void expect_same_run(const RunResult &one, const RunResult &two) {
  ASSERT_EQ(one.losses.size(), two.losses.size());
  for (size_t s = 0; s < one.losses.size(); ++s)
    EXPECT_NEAR(two.losses[s], one.losses[s], 1e-5 * std::fabs(one.losses[s]))
        << "step " << s + 1;
  for (size_t p = 0; p < one.params.size(); ++p)
    for (size_t i = 0; i < one.params[p].size(); ++i)
      ASSERT_NEAR(two.params[p][i], one.params[p][i],
                  1e-4 * std::max(1.0f, std::fabs(one.params[p][i])))
          << "param " << p << " element " << i;
  EXPECT_LT(two.losses.back(), two.losses.front());
}

TEST(DataParallel, TwoRanksMatchOneRankSgd) {
  RunResult one = run_plan(1, /*use_mpi=*/false, false, 30);
  RunResult two = run_plan(2, /*use_mpi=*/true, false, 30);
  expect_same_run(one, two);
}

TEST(DataParallel, TwoRanksMatchOneRankAdamW) {
  RunResult one = run_plan(1, /*use_mpi=*/false, true, 30);
  RunResult two = run_plan(2, /*use_mpi=*/true, true, 30);
  expect_same_run(one, two);
  // Both ranks hold the same parameters.
  for (auto &p : two.params) {
    std::vector<float> other(p.size());
    if (world_rank() == 0) {
      MPI_Send(p.data(), (int)p.size(), MPI_FLOAT, 1, 0, MPI_COMM_WORLD);
    } else {
      MPI_Recv(other.data(), (int)p.size(), MPI_FLOAT, 0, 0, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      EXPECT_EQ(other, p);
    }
  }
}

std::vector<float> init_full_w() {
  Context *ctx = internal::create_context("tp1", /*use_mpi=*/false);
  declare_param(ctx, "w", 2, 4, 6, 1, 1, InitNormal, 0.0f, 1.0f);
  set_training(ctx, 1, 5, 0, 0);
  internal::start(ctx);
  auto v = internal::to_host(ctx, param(ctx, 0));
  internal::destroy_context(ctx);
  return v;
}

TEST(ShardedParams, InitAndSaveUseGlobalIndices) {
  std::vector<float> full = init_full_w(); // [4, 6] on one rank
  Context *ctx = internal::create_context("tp2", /*use_mpi=*/true);
  declare_mesh_axis(ctx, "tp", 2);
  declare_param(ctx, "w", 2, 4, 3, 1, 1, InitNormal, 0.0f, 1.0f);
  shard_param(ctx, 0, 1, 0); // columns split over tp
  set_training(ctx, 1, 5, 0, 0);
  internal::start(ctx);
  auto local = internal::to_host(ctx, param(ctx, 0));
  int r = world_rank();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(local[i * 3 + j], full[i * 6 + r * 3 + j]);

  std::string path =
      "/tmp/planrt_mpi_save_" + std::to_string(getpid()) + ".safetensors";
  // Every rank calls it; rank 0 writes.
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s", path.c_str());
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  path = buf;
  internal::save_safetensors(ctx, path);
  if (r == 0) {
    std::ifstream f(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), {});
    std::remove(path.c_str());
    uint64_t hl = 0;
    for (int i = 0; i < 8; ++i)
      hl |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
    EXPECT_NE(bytes.find("\"shape\":[4,6]"), std::string::npos);
    ASSERT_EQ(bytes.size(), 8 + hl + 24 * 4);
    std::vector<float> saved(24);
    std::memcpy(saved.data(), bytes.data() + 8 + hl, 24 * 4);
    EXPECT_EQ(saved, full);
  }
  internal::destroy_context(ctx);
}

TEST(TokenShards, EachRankReadsItsRowsOfTheGlobalBatch) {
  // Rank 0 writes one shard of 50 tokens (token i = 3 i + 1); both ranks
  // train over dp = 2 with 2 local rows of 4 tokens (global batch 4, 16
  // tokens per step; the position rule is checked in tokens_test) and
  // compare with a 1-rank read.
  char tmpl[] = "/tmp/planrt_mpi_tokens_XXXXXX";
  std::string dir;
  if (world_rank() == 0)
    dir = mkdtemp(tmpl);
  char buf[64] = {};
  std::snprintf(buf, sizeof(buf), "%s", dir.c_str());
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  dir = buf;
  std::string path = dir + "/shard.bin";
  if (world_rank() == 0) {
    std::vector<unsigned char> b(1024 + 100, 0);
    int32_t h[3] = {20240520, 1, 50};
    std::memcpy(b.data(), h, sizeof(h)); // little-endian host
    for (int i = 0; i < 50; ++i)
      b[1024 + 2 * i] = (unsigned char)(3 * i + 1);
    std::ofstream(path, std::ios::binary)
        .write((const char *)b.data(), (std::streamsize)b.size());
  }
  MPI_Barrier(MPI_COMM_WORLD);

  Context *ctx = internal::create_context("tokens", true);
  declare_mesh_axis(ctx, "dp", 2);
  declare_input(ctx, "x", RoleInput, 2, 2, 4, 1, 1, 0);
  set_input_dtype(ctx, 0, I32);
  declare_input(ctx, "y", RoleLabel, 2, 2, 4, 1, 1, 0);
  set_input_dtype(ctx, 1, I32);
  set_training(ctx, 4, 1, 4, DataTokenShards);
  set_data_path(ctx, path.c_str());
  ASSERT_EQ(internal::open_training_data(ctx), "");
  internal::start(ctx);
  internal::TokenShards shards;
  ASSERT_EQ(internal::open_token_shards(path, shards), "");
  for (int64_t step = 1; step <= 4; ++step) {
    internal::begin_step(ctx, step);
    std::vector<int32_t> x(16), y(16);
    ASSERT_EQ(
        internal::token_batch(shards, step, 4, 4, 0, 4, x.data(), y.data()),
        "");
    auto gx = internal::to_host_ids(ctx, input(ctx, 0));
    auto gy = internal::to_host_ids(ctx, input(ctx, 1));
    int r = world_rank();
    EXPECT_EQ(gx,
              std::vector<int32_t>(x.begin() + 8 * r, x.begin() + 8 * r + 8));
    EXPECT_EQ(gy,
              std::vector<int32_t>(y.begin() + 8 * r, y.begin() + 8 * r + 8));
    int64_t pos = internal::token_step_position(50, 4, 4, step) + 8 * r;
    EXPECT_EQ(gx[0], 3 * pos + 1) << step;
  }
  internal::destroy_context(ctx);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::remove(path.c_str());
    rmdir(dir.c_str());
  }
}

//===--- Context parallelism (cp = 2)
//--------------------------------------===//
//
// Each rank holds positions of a global [B, S, W] packed q/k/v: chunks g and
// 2G - 1 - g of S / 2G rows. The exchanges must move exactly the right
// values, and the three attentions (all-to-all around the ordinary kernel,
// all-gather, ring) must give, on the rank's rows, what one rank's
// attention over the whole sequence gives, forward and backward.

constexpr int64_t kB = 2, kS = 8, kH = 4, kKV = 2, kD = 4,
                  kW = (kH + 2 * kKV) * kD;

std::vector<float> global_values(int64_t n, float salt) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i)
    v[i] = std::sin(0.37f * float(i) + salt) * 0.8f;
  return v;
}

/// The position of local row t of rank g (of G) with L local rows.
int64_t position(int64_t g, int64_t G, int64_t L, int64_t t) {
  int64_t c = L / 2;
  return t < c ? g * c + t : (2 * G - 1 - g) * c + (t - c);
}

/// This rank's rows of a global [B, S, W] tensor.
std::vector<float> local_rows(const std::vector<float> &all, int64_t W,
                              int64_t g, int64_t G) {
  int64_t L = kS / G;
  std::vector<float> out;
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t t = 0; t < L; ++t) {
      int64_t p = position(g, G, L, t);
      out.insert(out.end(), all.begin() + (b * kS + p) * W,
                 all.begin() + (b * kS + p + 1) * W);
    }
  return out;
}

Tensor *tensor3(Context *ctx, int64_t d0, int64_t d1, int64_t d2,
                const std::vector<float> &v) {
  Tensor *t = alloc(ctx, 3, d0, d1, d2, 1);
  if (!v.empty())
    internal::from_host(ctx, t, v);
  return t;
}

void expect_near(const std::vector<float> &got, const std::vector<float> &want,
                 float tol, const char *what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol) << what << " at " << i;
}

TEST(ContextParallel, ExchangesMoveTheRightValues) {
  Context *ctx = mesh_context({{"cp", 2}});
  int64_t g = world_rank(), G = 2, L = kS / G;
  auto all = global_values(kB * kS * kW, 0.1f);
  Tensor *qkv = tensor3(ctx, kB, L, kW, local_rows(all, kW, g, G));
  // seq_to_heads: every position, in order, of this rank's half of each
  // segment's heads; heads_to_seq brings the rows back exactly.
  Tensor *heads = tensor3(ctx, kB, kS, kW / G, {});
  seq_to_heads(ctx, qkv, heads, kH * kD, kKV * kD, 0);
  auto h = internal::to_host(ctx, heads);
  int64_t q = kH * kD / G, kv = kKV * kD / G;
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t p = 0; p < kS; ++p)
      for (int64_t c = 0; c < kW / G; ++c) {
        int64_t col = c < q        ? g * q + c
                      : c < q + kv ? kH * kD + g * kv + (c - q)
                                   : kH * kD + kKV * kD + g * kv + (c - q - kv);
        ASSERT_EQ(h[(b * kS + p) * (kW / G) + c], all[(b * kS + p) * kW + col])
            << b << " " << p << " " << c;
      }
  Tensor *back = tensor3(ctx, kB, L, kW, {});
  heads_to_seq(ctx, heads, back, kH * kD, kKV * kD, 0);
  EXPECT_EQ(internal::to_host(ctx, back), local_rows(all, kW, g, G));
  // kv_gather: every position's keys and values, in position order.
  Tensor *kvs = tensor3(ctx, kB, kS, 2 * kKV * kD, {});
  kv_gather(ctx, qkv, kvs, kH * kD, kKV * kD, 0);
  auto k = internal::to_host(ctx, kvs);
  for (int64_t r = 0; r < kB * kS; ++r)
    for (int64_t c = 0; c < 2 * kKV * kD; ++c)
      ASSERT_EQ(k[r * 2 * kKV * kD + c], all[r * kW + kH * kD + c]);
  internal::destroy_context(ctx);
}

TEST(ContextParallel, AttentionEqualsOneRank) {
  Context *ctx = mesh_context({{"cp", 2}});
  int64_t g = world_rank(), G = 2, L = kS / G;
  auto all = global_values(kB * kS * kW, 0.3f);
  auto dy = global_values(kB * kS * kH * kD, 1.7f);
  // One rank's attention over the whole sequence (no collective).
  Tensor *whole = tensor3(ctx, kB, kS, kW, all);
  Tensor *ref = tensor3(ctx, kB, kS, kH * kD, {});
  attention(ctx, whole, ref, kH, kKV);
  Tensor *dref = tensor3(ctx, kB, kS, kW, {});
  attention_grad(ctx, whole, tensor3(ctx, kB, kS, kH * kD, dy), dref, kH, kKV);
  auto want = local_rows(internal::to_host(ctx, ref), kH * kD, g, G);
  auto dwant = local_rows(internal::to_host(ctx, dref), kW, g, G);

  Tensor *qkv = tensor3(ctx, kB, L, kW, local_rows(all, kW, g, G));
  Tensor *dout = tensor3(ctx, kB, L, kH * kD, local_rows(dy, kH * kD, g, G));
  // all_gather.
  Tensor *kvs = tensor3(ctx, kB, kS, 2 * kKV * kD, {});
  kv_gather(ctx, qkv, kvs, kH * kD, kKV * kD, 0);
  Tensor *out = tensor3(ctx, kB, L, kH * kD, {});
  attention_cp(ctx, qkv, kvs, out, kH, kKV, 0);
  expect_near(internal::to_host(ctx, out), want, 1e-5f, "attention_cp");
  Tensor *dqkv = tensor3(ctx, kB, L, kW, {});
  Tensor *dkv = tensor3(ctx, kB, kS, 2 * kKV * kD, {});
  attention_cp_grad(ctx, qkv, kvs, dout, dqkv, dkv, kH, kKV, 0);
  kv_reduce_scatter(ctx, dkv, dqkv, kH * kD, kKV * kD, 0);
  expect_near(internal::to_host(ctx, dqkv), dwant, 1e-5f, "attention_cp_grad");
  // Kept for cuDNN (attention_cp_lse, attention_cp_grad_lse): on the host
  // the same bits, the kept buffer unwritten.
  Tensor *kout = tensor3(ctx, kB, L, kH * kD, {});
  Tensor *lse = alloc(
      ctx, 1, workspace::outside::cudnn_cp_lse_floats(kB, kH, L), 1, 1, 1);
  fill(ctx, lse, 7.0f);
  attention_cp_lse(ctx, qkv, kvs, kout, lse, kH, kKV, 0);
  EXPECT_EQ(internal::to_host(ctx, kout), internal::to_host(ctx, out));
  for (float v : internal::to_host(ctx, lse))
    ASSERT_EQ(v, 7.0f);
  Tensor *kd = tensor3(ctx, kB, L, kW, {});
  Tensor *kdkv = tensor3(ctx, kB, kS, 2 * kKV * kD, {});
  attention_cp_grad(ctx, qkv, kvs, dout, dqkv, dkv, kH, kKV, 0);
  attention_cp_grad_lse(ctx, qkv, kvs, dout, kd, kdkv, kout, lse, kH, kKV, 0);
  EXPECT_EQ(internal::to_host(ctx, kdkv), internal::to_host(ctx, dkv));
  kv_reduce_scatter(ctx, kdkv, kd, kH * kD, kKV * kD, 0);
  expect_near(internal::to_host(ctx, kd), dwant, 1e-5f,
              "attention_cp_grad_lse");
  // ring.
  Tensor *rout = tensor3(ctx, kB, L, kH * kD, {});
  attention_ring(ctx, qkv, rout, kH, kKV, 0);
  expect_near(internal::to_host(ctx, rout), want, 1e-5f, "attention_ring");
  Tensor *rd = tensor3(ctx, kB, L, kW, {});
  attention_ring_grad(ctx, qkv, dout, rd, kH, kKV, 0);
  expect_near(internal::to_host(ctx, rd), dwant, 1e-5f, "attention_ring_grad");
  // ring keeping each row's log-sum-exp (attention_ring_lse), and the
  // gradient from it and the output instead of the forward's ring again.
  Tensor *klse = alloc(ctx, 3, kB, kH, L, 1);
  Tensor *krout = tensor3(ctx, kB, L, kH * kD, {});
  attention_ring_lse(ctx, qkv, krout, klse, kH, kKV, 0);
  EXPECT_EQ(internal::to_host(ctx, krout), internal::to_host(ctx, rout));
  std::vector<float> lse_want;
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t t = 0; t < L; ++t) {
        // log sum_j exp(q . k_j / sqrt(D)) over the keys up to the row's
        // position, from the whole sequence's values.
        const int64_t p = position(g, G, L, t), kh = h / (kH / kKV);
        const float *q = all.data() + (b * kS + p) * kW + h * kD;
        double sum = 0;
        for (int64_t j = 0; j <= p; ++j) {
          const float *k = all.data() + (b * kS + j) * kW + (kH + kh) * kD;
          double dot = 0;
          for (int64_t d = 0; d < kD; ++d)
            dot += double(q[d]) * k[d];
          sum += std::exp(dot / std::sqrt(double(kD)));
        }
        lse_want.push_back(float(std::log(sum)));
      }
  expect_near(internal::to_host(ctx, klse), lse_want, 1e-5f,
              "attention_ring_lse's log-sum-exps");
  Tensor *krd = tensor3(ctx, kB, L, kW, {});
  attention_ring_grad_lse(ctx, qkv, dout, krd, krout, klse, kH, kKV, 0);
  expect_near(internal::to_host(ctx, krd), dwant, 1e-5f,
              "attention_ring_grad_lse");
  // all_to_all: the ordinary kernel on every position of half the heads.
  Tensor *heads = tensor3(ctx, kB, kS, kW / G, {});
  seq_to_heads(ctx, qkv, heads, kH * kD, kKV * kD, 0);
  Tensor *hout = tensor3(ctx, kB, kS, kH * kD / G, {});
  attention(ctx, heads, hout, kH / G, kKV / G);
  Tensor *aout = tensor3(ctx, kB, L, kH * kD, {});
  heads_to_seq(ctx, hout, aout, kH * kD, 0, 0);
  expect_near(internal::to_host(ctx, aout), want, 1e-5f, "all_to_all");
  internal::destroy_context(ctx);
}

} // namespace

int main(int argc, char **argv) {
  return planrt_test::runMpiTests(argc, argv, 2, "planrt_mpi_tests");
}
