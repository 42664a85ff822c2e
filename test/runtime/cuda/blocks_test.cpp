// The cuda backend's block kernels (runtime/lib/cuda/*_blocks.h: tiled
// attention, column sums, norms, the classifier) run on the host: each block's
// 256 threads are OpenMP threads, its shared memory a buffer poisoned with NaN
// before every block (a read of a float no thread wrote shows up in the
// results), __syncthreads an OpenMP barrier and the warp shuffle an exchange
// through memory. Compared with the per-row functors of kernels.h, the host's
// reference and the GPU's former kernels: forward (out and the row statistics),
// and backward from the forward's statistics and without them, on shapes with a
// partial last tile, grouped query heads and every head dim the kernels are
// built for.
#include "../typed_vectors.h"
#include "cp_attention_cases.h"
#include "cuda/attention_blocks.h"
#include "cuda/attention_cp_blocks.h"
#include "cuda/attention_cp_tc_blocks.h"
#include "cuda/attention_tc_blocks.h"
#include "cuda/classifier_blocks.h"
#include "cuda/column_sums_blocks.h"
#include "cuda/elementwise_blocks.h"
#include "cuda/embedding_blocks.h"
#include "cuda/norms_blocks.h"
#include "cuda/optimizer_blocks.h"
#include "cuda/sums_blocks.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

using namespace planrt;
using test::narrow;
using test::rel_err;
using test::widen;

namespace {

/// Runs body(lane, smem, bx, by) as the blocks of a gx x gy grid of 256
/// threads.
static_assert(attn::kThreads == 256 && colsum::kThreads == 256 &&
                  sums::kThreads == 256 && embed::kThreads == 256 &&
                  norms::kThreads == 256 && classifier::kThreads == 256 &&
                  optimizer::kThreads == 256,
              "");
template <class F>
void run_blocks(int64_t gx, int64_t gy, size_t smem_floats, const F &body) {
  std::vector<float> smem(smem_floats), xbuf(attn::kThreads);
  omp_set_dynamic(0);
  for (int64_t by = 0; by < gy; ++by)
    for (int64_t bx = 0; bx < gx; ++bx) {
      std::fill(smem.begin(), smem.end(),
                std::numeric_limits<float>::quiet_NaN());
      int threads = 0;
#pragma omp parallel num_threads(attn::kThreads)
      {
        attn::Lane l;
        l.tid = omp_get_thread_num();
        l.tx = l.tid % attn::kTX;
        l.ty = l.tid / attn::kTX;
        l.xbuf = xbuf.data();
#pragma omp single
        threads = omp_get_num_threads();
        body(l, smem.data(), bx, by);
      }
      ASSERT_EQ(threads, attn::kThreads) << "OpenMP gave fewer threads";
    }
}

struct Case {
  int64_t B, S, H, KV;
};

/// Attention dropout p = 0.2 for a problem at batch row 3 and head 1 of a
/// global [8, 6, S, S] (a data- and tensor-parallel rank's).
kernels::AttnDropout dropout_case() {
  return kernels::AttnDropout::make(0.2f, kernels::mix64(77), 3, 8, 1, 6);
}

template <int D>
void check_case(const Case &c, uint32_t seed,
                const kernels::AttnDropout &drop = {}) {
  kernels::AttnShape a{c.B, c.S, c.H, c.KV, D, 1.0f / std::sqrt((float)D)};
  const int64_t rows = a.B * a.H * a.S, n = a.B * a.S * a.width();
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> qkv((size_t)n), dout((size_t)(a.B * a.S * a.H * D));
  for (float &x : qkv)
    x = nd(gen);
  for (float &x : dout)
    x = nd(gen);
  const int64_t gq = (a.S + attn::kRows - 1) / attn::kRows;

  // Forward: the per-row functor against the tiles.
  std::vector<float> out_ref(dout.size()), stats_ref((size_t)(2 * rows));
  std::vector<float> keep((size_t)(rows * a.S));
  kernels::AttentionFn<> ref{qkv.data(),  out_ref.data(),   a,
                             keep.data(), stats_ref.data(), drop};
  for (int64_t i = 0; i < rows; ++i)
    ref(i);
  std::vector<float> out(dout.size(), NAN), stats((size_t)(2 * rows), NAN);
  run_blocks(gq, a.B * a.H, attn::forward_floats<D>(),
             [&](const attn::Lane &l, float *smem, int64_t bx, int64_t by) {
               attn::forward_block<D>(l, smem, a, qkv.data(), out.data(),
                                      stats.data(), by, bx * attn::kRows, drop);
             });
  EXPECT_LT(rel_err(out, out_ref), 1e-5) << "out, D " << D;
  EXPECT_LT(rel_err(stats, stats_ref), 1e-5) << "stats, D " << D;

  // Backward from the forward's statistics and without them.
  std::vector<float> rs_ref((size_t)(2 * rows)), dl_ref((size_t)rows);
  std::vector<float> dq_ref((size_t)n, 0.0f);
  kernels::AttentionGradQFn<> gq_ref{
      qkv.data(), dout.data(), dq_ref.data(), rs_ref.data(), dl_ref.data(), a};
  gq_ref.drop = drop;
  for (int64_t i = 0; i < rows; ++i)
    gq_ref(i);
  kernels::AttentionGradKVFn<> gkv_ref{
      qkv.data(), dout.data(), rs_ref.data(), dl_ref.data(), dq_ref.data(), a};
  gkv_ref.drop = drop;
  for (int64_t j = 0; j < a.B * a.KV * a.S; ++j)
    gkv_ref(j);
  for (bool kept : {true, false}) {
    std::vector<float> dqkv((size_t)n, NAN), rs((size_t)(2 * rows), NAN),
        dl((size_t)rows, NAN);
    const float *st = kept ? stats.data() : nullptr;
    run_blocks(gq, a.B * a.H, attn::grad_q_floats<D>(),
               [&](const attn::Lane &l, float *smem, int64_t bx, int64_t by) {
                 attn::grad_q_block<D>(l, smem, a, qkv.data(), dout.data(),
                                       dqkv.data(), st, rs.data(), dl.data(),
                                       by, bx * attn::kRows, drop);
               });
    run_blocks(gq, a.B * a.KV, attn::grad_kv_floats<D>(),
               [&](const attn::Lane &l, float *smem, int64_t bx, int64_t by) {
                 attn::grad_kv_block<D>(l, smem, a, qkv.data(), dout.data(),
                                        dqkv.data(), rs.data(), dl.data(), by,
                                        bx * attn::kRows, drop);
               });
    EXPECT_LT(rel_err(rs, rs_ref), 1e-5) << "rowstats, D " << D;
    EXPECT_LT(rel_err(dl, dl_ref), 1e-4) << "delta, D " << D;
    EXPECT_LT(rel_err(dqkv, dq_ref), 1e-5)
        << "dqkv, D " << D << (kept ? ", from stats" : ", recomputed");
  }
}

TEST(AttentionBlocks, TilesEqualTheRowFunctors) {
  // S 70: one full tile and a partial one; 4 query heads on 2 kv heads.
  check_case<16>({2, 70, 4, 2}, 1);
  check_case<32>({1, 64, 2, 1}, 2);
  check_case<64>({1, 130, 2, 2}, 3);
  check_case<128>({1, 20, 2, 1}, 4);
  // Attention dropout: the tiles draw the functors' mask.
  check_case<16>({2, 70, 4, 2}, 5, dropout_case());
  check_case<64>({1, 130, 2, 1}, 6, dropout_case());
}

TEST(AttentionBlocks, SixteenBitStorage) {
  // bf16 qkv and dout: the tiles widen on load and round once on store, as
  // the per-row 16-bit functors do; the sums differ in order only.
  using kernels::bf16_t;
  kernels::AttnShape a{1, 70, 4, 2, 16, 0.25f};
  const int64_t rows = a.B * a.H * a.S, n = a.B * a.S * a.width();
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<bf16_t> qkv((size_t)n), out((size_t)(rows * a.D)),
      out_ref(out.size());
  for (bf16_t &x : qkv)
    kernels::st(x, nd(gen));
  kernels::AttentionFn<bf16_t> ref{qkv.data(), out_ref.data(), a};
  for (int64_t i = 0; i < rows; ++i)
    ref(i);
  run_blocks(2, a.B * a.H, attn::forward_floats<16>(),
             [&](const attn::Lane &l, float *smem, int64_t bx, int64_t by) {
               attn::forward_block<16>(l, smem, a, qkv.data(), out.data(),
                                       (float *)nullptr, by, bx * attn::kRows);
             });
  std::vector<float> o(out.size()), r(out.size());
  for (size_t i = 0; i < o.size(); ++i) {
    o[i] = kernels::ld(out[i]);
    r[i] = kernels::ld(out_ref[i]);
  }
  EXPECT_LT(rel_err(o, r), 1e-2);
}

/// The tensor-core tiles (attention_tc_blocks.h, mma.h's host emulation) on
/// 16-bit qkv and dout against the fp32 row functors on the same values
/// widened: they differ by the 16-bit rounding of p, ds and the outputs.
template <int D, class T>
void check_tc_case(const Case &c, uint32_t seed,
                   const kernels::AttnDropout &drop = {}) {
  kernels::AttnShape a{c.B, c.S, c.H, c.KV, D, 1.0f / std::sqrt((float)D)};
  const int64_t rows = a.B * a.H * a.S, n = a.B * a.S * a.width();
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<T> qkv((size_t)n), dout((size_t)(a.B * a.S * a.H * D));
  std::vector<float> qkv32(qkv.size()), dout32(dout.size());
  for (size_t i = 0; i < qkv.size(); ++i) {
    kernels::st(qkv[i], nd(gen));
    qkv32[i] = kernels::ld(qkv[i]);
  }
  for (size_t i = 0; i < dout.size(); ++i) {
    kernels::st(dout[i], nd(gen));
    dout32[i] = kernels::ld(dout[i]);
  }
  const int64_t gq = (a.S + attn::kRows - 1) / attn::kRows;
  // Measured: 2.3e-3 (bf16) and 3e-4 (fp16, 3 more bits).
  const double tol = std::is_same<T, kernels::f16_t>::value ? 1e-3 : 5e-3;

  std::vector<float> out_ref(dout.size()), stats_ref((size_t)(2 * rows));
  std::vector<float> keep((size_t)(rows * a.S));
  kernels::AttentionFn<> ref{qkv32.data(), out_ref.data(),   a,
                             keep.data(),  stats_ref.data(), drop};
  for (int64_t i = 0; i < rows; ++i)
    ref(i);
  std::vector<T> out(dout.size());
  std::vector<float> stats((size_t)(2 * rows), NAN);
  run_blocks(gq, a.B * a.H, attn_tc::forward_bytes<D>() / 4,
             [&](const attn::Lane &l, float *smem, int64_t bx, int64_t by) {
               attn_tc::forward_block<D>(l, (char *)smem, a, qkv.data(),
                                         out.data(), stats.data(), by,
                                         bx * attn::kRows, drop);
             });
  EXPECT_LT(rel_err(widen(out), out_ref), tol) << "out, D " << D;
  EXPECT_LT(rel_err(stats, stats_ref), 1e-5) << "stats, D " << D;

  std::vector<float> rs_ref((size_t)(2 * rows)), dl_ref((size_t)rows);
  std::vector<float> dq_ref((size_t)n, 0.0f);
  kernels::AttentionGradQFn<> gq_ref{qkv32.data(),  dout32.data(),
                                     dq_ref.data(), rs_ref.data(),
                                     dl_ref.data(), a};
  gq_ref.drop = drop;
  for (int64_t i = 0; i < rows; ++i)
    gq_ref(i);
  kernels::AttentionGradKVFn<> gkv_ref{qkv32.data(),  dout32.data(),
                                       rs_ref.data(), dl_ref.data(),
                                       dq_ref.data(), a};
  gkv_ref.drop = drop;
  for (int64_t j = 0; j < a.B * a.KV * a.S; ++j)
    gkv_ref(j);
  for (bool kept : {true, false}) {
    std::vector<T> dqkv((size_t)n);
    std::vector<float> rs((size_t)(2 * rows), NAN), dl((size_t)rows, NAN);
    const float *st = kept ? stats.data() : nullptr;
    run_blocks(gq, a.B * a.H, attn_tc::grad_q_bytes<D>() / 4,
               [&](const attn::Lane &l, float *smem, int64_t bx, int64_t by) {
                 attn_tc::grad_q_block<D>(
                     l, (char *)smem, a, qkv.data(), dout.data(), dqkv.data(),
                     st, rs.data(), dl.data(), by, bx * attn::kRows, drop);
               });
    run_blocks(gq, a.B * a.KV, attn_tc::grad_kv_bytes<D>() / 4,
               [&](const attn::Lane &l, float *smem, int64_t bx, int64_t by) {
                 attn_tc::grad_kv_block<D>(
                     l, (char *)smem, a, qkv.data(), dout.data(), dqkv.data(),
                     rs.data(), dl.data(), by, bx * attn::kRows, drop);
               });
    EXPECT_LT(rel_err(rs, rs_ref), 1e-5) << "rowstats, D " << D;
    EXPECT_LT(rel_err(dl, dl_ref), 1e-4) << "delta, D " << D;
    EXPECT_LT(rel_err(widen(dqkv), dq_ref), tol)
        << "dqkv, D " << D << (kept ? ", from stats" : ", recomputed");
  }
}

TEST(AttentionBlocks, TensorCoreTilesEqualTheRowFunctors) {
  using kernels::bf16_t;
  using kernels::f16_t;
  check_tc_case<16, bf16_t>({2, 70, 4, 2}, 11);
  check_tc_case<32, f16_t>({1, 64, 2, 1}, 12);
  check_tc_case<64, bf16_t>({1, 130, 2, 2}, 13);
  check_tc_case<64, f16_t>({1, 70, 4, 1}, 14);
  check_tc_case<128, bf16_t>({1, 20, 2, 1}, 15);
  // Attention dropout: the functors' mask, drawn by the tensor-core tiles.
  check_tc_case<16, bf16_t>({2, 70, 4, 2}, 16, dropout_case());
  check_tc_case<64, f16_t>({1, 130, 2, 1}, 17, dropout_case());
}

/// Context parallelism's tiles run as host blocks for cp_attention_cases.h
/// (the device suite runs the same cases on a GPU): the fp32 SIMT tiles of
/// attention_cp_blocks.h, or with TC the tensor-core tiles of
/// attention_cp_tc_blocks.h (16-bit storage only).
template <bool TC> struct HostCpTiles {
  template <class F> static void with_dim(int64_t D, const F &f) {
    if (!attn::with_head_dim(D, [&](auto dim) { return f(dim), true; }))
      FAIL() << "no tiles for head dim " << D;
  }
  static int64_t tiles(int64_t rows) {
    return (rows + attn::kRows - 1) / attn::kRows;
  }
  /// Shared memory of `bytes` as floats.
  static size_t floats(size_t bytes) { return (bytes + 3) / 4; }
  template <class T>
  void forward(const kernels::AttnCp &c, const kernels::KvBlock &kb,
               const std::vector<T> &qkv, const std::vector<T> &blk,
               std::vector<float> &acc, std::vector<float> &ml) const {
    with_dim(c.a.D, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      auto body = [&](const attn::Lane &l, float *smem, int64_t bx,
                      int64_t by) {
        if constexpr (TC)
          attn_cp_tc::forward_block<D>(l, (char *)smem, c, kb, qkv.data(),
                                       blk.data(), acc.data(), ml.data(), by,
                                       bx * attn::kRows);
        else
          attn_cp::forward_block<D>(l, smem, c, kb, qkv.data(), blk.data(),
                                    acc.data(), ml.data(), by,
                                    bx * attn::kRows);
      };
      run_blocks(tiles(c.a.S), c.a.B * c.a.H,
                 TC ? floats(attn_tc::forward_bytes<D>())
                    : attn::forward_floats<D>(),
                 body);
    });
  }
  template <class T>
  void grad_q(const kernels::AttnCp &c, const kernels::KvBlock &kb,
              const std::vector<T> &qkv, const std::vector<T> &blk,
              const std::vector<T> &dout, const std::vector<float> &ml,
              const std::vector<float> &delta, std::vector<float> &dq) const {
    with_dim(c.a.D, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      auto body = [&](const attn::Lane &l, float *smem, int64_t bx,
                      int64_t by) {
        if constexpr (TC)
          attn_cp_tc::grad_q_block<D>(
              l, (char *)smem, c, kb, qkv.data(), blk.data(), dout.data(),
              ml.data(), delta.data(), dq.data(), by, bx * attn::kRows);
        else
          attn_cp::grad_q_block<D>(l, smem, c, kb, qkv.data(), blk.data(),
                                   dout.data(), ml.data(), delta.data(),
                                   dq.data(), by, bx * attn::kRows);
      };
      run_blocks(tiles(c.a.S), c.a.B * c.a.H,
                 TC ? floats(attn_tc::grad_q_bytes<D>())
                    : attn::grad_q_floats<D>(),
                 body);
    });
  }
  template <class T>
  void grad_kv(const kernels::AttnCp &c, const kernels::KvBlock &kb,
               const std::vector<T> &qkv, const std::vector<T> &blk,
               const std::vector<T> &dout, const std::vector<float> &ml,
               const std::vector<float> &delta, std::vector<float> &dkv) const {
    with_dim(c.a.D, [&](auto dim) {
      constexpr int D = decltype(dim)::value;
      auto body = [&](const attn::Lane &l, float *smem, int64_t bx,
                      int64_t by) {
        if constexpr (TC)
          attn_cp_tc::grad_kv_block<D>(
              l, (char *)smem, c, kb, qkv.data(), blk.data(), dout.data(),
              ml.data(), delta.data(), dkv.data(), by, bx * attn::kRows);
        else
          attn_cp::grad_kv_block<D>(l, smem, c, kb, qkv.data(), blk.data(),
                                    dout.data(), ml.data(), delta.data(),
                                    dkv.data(), by, bx * attn::kRows);
      };
      run_blocks(tiles(kb.rows), c.a.B * c.a.KV,
                 TC ? floats(attn_tc::grad_kv_bytes<D>())
                    : attn::grad_kv_floats<D>(),
                 body);
    });
  }
};

/// Every case through one runner, each compared at its tolerance.
template <bool TC> void check_cp_cases(const std::vector<test::CpCase> &cases) {
  for (const test::CpCase &cs : cases) {
    const double tol = test::cp_tolerance(cs, TC);
    auto report = [&](const std::string &what, double err) {
      EXPECT_LT(err, tol) << what;
    };
    test::with_store(cs, [&](auto e) {
      using T = decltype(e);
      if constexpr (TC && std::is_same<T, float>::value)
        FAIL() << "the tensor-core tiles take 16-bit storage only";
      else
        test::run_cp_case<T>(cs, HostCpTiles<TC>(), report);
    });
  }
}

TEST(AttentionBlocks, ContextParallelTilesEqualTheBlockFunctors) {
  check_cp_cases<false>(test::cp_cases());
  // 16-bit storage widened on load, as the functors read it.
  check_cp_cases<false>({test::cp_cases_16bit()[0]});
}

TEST(AttentionBlocks, ContextParallelTensorCoreTilesEqualTheBlockFunctors) {
  check_cp_cases<true>(test::cp_cases_16bit());
}

TEST(ColumnSums, BlocksEqualTheColumnFunctors) {
  // 37 columns (two full blocks of 16 and a partial one), 600 rows: in one
  // pass, and in two (three chunks of 256 rows, the last partial, whose
  // sums go through the op's partials, poisoned with NaN before).
  const int64_t rows = 600, C = 37;
  const int64_t chunks = colsum::chunks(rows);
  ASSERT_EQ(chunks, 3);
  ASSERT_EQ(workspace::column_partials(rows, C, 2),
            workspace::floats(chunks * C * 2));
  ASSERT_EQ(workspace::column_partials(256, C, 2), 0);
  std::mt19937 gen(6);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x((size_t)(rows * C)), dy(x.size()), mean((size_t)rows),
      rstd((size_t)rows);
  for (float &v : x)
    v = nd(gen);
  for (float &v : dy)
    v = nd(gen);
  for (int64_t r = 0; r < rows; ++r) {
    mean[(size_t)r] = nd(gen);
    rstd[(size_t)r] = 1.0f + 0.1f * nd(gen);
  }
  const int64_t gx = (C + colsum::kTX - 1) / colsum::kTX;
  // block(l, smem, bx, chunk) over the grid of one or two passes.
  auto run_sums = [&](bool chunked, size_t smem_floats, const auto &block) {
    if (chunked)
      run_blocks(gx, chunks, smem_floats,
                 [&](const attn::Lane &l, float *smem, int64_t bx, int64_t by) {
                   block(l, smem, bx, by);
                 });
    run_blocks(gx, 1, smem_floats,
               [&](const attn::Lane &l, float *smem, int64_t bx, int64_t) {
                 block(l, smem, bx, -1);
               });
  };
  for (bool chunked : {false, true}) {
    const char *how = chunked ? "two passes" : "one pass";
    std::vector<float> partials((size_t)(chunks * C * 2 + 64), NAN);
    float *parts = chunked ? partials.data() : nullptr;
    std::vector<float> db(C, NAN), db_ref(C);
    kernels::BiasGradFn<> bias{dy.data(), db_ref.data(), rows, C};
    for (int64_t j = 0; j < C; ++j)
      bias(j);
    kernels::BiasGradFn<> bias_gpu{dy.data(), db.data(), rows, C, parts};
    run_sums(chunked, colsum::kFloats<1>,
             [&](const attn::Lane &l, float *smem, int64_t bx, int64_t k) {
               colsum::bias_grad_block(l, smem, bias_gpu, bx * colsum::kTX, k);
             });
    EXPECT_LT(rel_err(db, db_ref), 1e-6) << how;
    for (bool layer : {true, false}) {
      // The partials as the plan sizes them (one sum a column for RMS
      // norm, two for LayerNorm), then a guard that must stay untouched.
      const size_t planned = (size_t)(chunks * C * (layer ? 2 : 1));
      std::fill(partials.begin(), partials.end(), NAN);
      std::fill(partials.begin() + (std::ptrdiff_t)planned, partials.end(),
                12345.0f);
      std::vector<float> dg(C, NAN), dbeta(C, NAN), dg_ref(C), dbeta_ref(C);
      const float *mu = layer ? mean.data() : nullptr;
      kernels::NormGradParamFn<> ref{x.data(),
                                     dy.data(),
                                     mu,
                                     rstd.data(),
                                     dg_ref.data(),
                                     layer ? dbeta_ref.data() : nullptr,
                                     rows,
                                     C};
      for (int64_t j = 0; j < C; ++j)
        ref(j);
      kernels::NormGradParamFn<> gpu{
          x.data(),    dy.data(), mu,
          rstd.data(), dg.data(), layer ? dbeta.data() : nullptr,
          rows,        C,         parts};
      run_sums(chunked, colsum::kFloats<2>,
               [&](const attn::Lane &l, float *smem, int64_t bx, int64_t k) {
                 colsum::norm_grad_param_block(l, smem, gpu, bx * colsum::kTX,
                                               k);
               });
      EXPECT_LT(rel_err(dg, dg_ref), 1e-6) << (layer ? "layer" : "rms") << how;
      if (layer) {
        EXPECT_LT(rel_err(dbeta, dbeta_ref), 1e-6) << how;
      } else {
        EXPECT_TRUE(std::isnan(dbeta[0])) << "rms norm wrote a beta gradient";
      }
      for (size_t i = planned; i < partials.size(); ++i)
        ASSERT_EQ(partials[i], 12345.0f)
            << (layer ? "layer" : "rms") << ": past the planned partials";
    }
    // bf16 x and dy with f32 gradients (plan-fuse-casts: the gradients
    // that only widen to the fp32 master weights): the sums of the widened
    // values, stored unrounded.
    std::vector<kernels::bf16_t> xb(x.size()), dyb(dy.size());
    std::vector<float> xw(x.size()), dyw(dy.size());
    for (size_t i = 0; i < x.size(); ++i) {
      xb[i].bits = bf16_from_float(x[i]);
      xw[i] = float_from_bf16(xb[i].bits);
      dyb[i].bits = bf16_from_float(dy[i]);
      dyw[i] = float_from_bf16(dyb[i].bits);
    }
    std::fill(partials.begin(), partials.end(), NAN);
    std::vector<float> dg(C, NAN), dbeta(C, NAN), dg_ref(C), dbeta_ref(C);
    kernels::NormGradParamFn<> ref{
        xw.data(),     dyw.data(),       mean.data(), rstd.data(),
        dg_ref.data(), dbeta_ref.data(), rows,        C};
    for (int64_t j = 0; j < C; ++j)
      ref(j);
    kernels::NormGradParamFn<kernels::bf16_t, float> gpu{
        xb.data(),    dyb.data(), mean.data(), rstd.data(), dg.data(),
        dbeta.data(), rows,       C,           parts};
    run_sums(chunked, colsum::kFloats<2>,
             [&](const attn::Lane &l, float *smem, int64_t bx, int64_t k) {
               colsum::norm_grad_param_block(l, smem, gpu, bx * colsum::kTX, k);
             });
    EXPECT_LT(rel_err(dg, dg_ref), 1e-6) << "bf16 into f32, " << how;
    EXPECT_LT(rel_err(dbeta, dbeta_ref), 1e-6) << "bf16 into f32, " << how;
  }
}

/// The norm and its input gradient on blocks, W elements a lane at a time,
/// against the row functors in T: 37 rows (two blocks of 16 and a partial
/// one) of C columns. Each kernel computes its rows' statistics, the
/// backward stores them, and with `plus` adds the residual stream's
/// gradient to dx. `tol`: the rows' sums run in another order (f32), and
/// 16-bit outputs may round the other way.
template <int W, class T> void check_norms(int64_t C, double tol) {
  const int64_t rows = 37;
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> xf((size_t)(rows * C)), dyf(xf.size()), plusf(xf.size()),
      gammaf((size_t)C), betaf((size_t)C);
  for (float &v : xf)
    v = 2.0f + nd(gen);
  for (float &v : dyf)
    v = nd(gen);
  for (float &v : plusf)
    v = nd(gen);
  for (int64_t j = 0; j < C; ++j) {
    gammaf[(size_t)j] = 1.0f + 0.1f * nd(gen);
    betaf[(size_t)j] = nd(gen);
  }
  // Vectors of 16-byte aligned storage (the grouped path's 128-bit loads).
  std::vector<T> x = narrow<T>(xf), dy = narrow<T>(dyf),
                 plus = narrow<T>(plusf), gamma = narrow<T>(gammaf),
                 beta = narrow<T>(betaf);
  ASSERT_EQ(norms::grouped(C, x.data(), dy.data(), plus.data(), gamma.data(),
                           beta.data()),
            W == norms::kGroup);
  const int64_t gx = (rows + norms::kRowsPerBlock - 1) / norms::kRowsPerBlock;
  const char *what = W == 1 ? "single elements" : "groups";
  for (bool layer : {true, false}) {
    const T *b = layer ? beta.data() : nullptr;
    std::vector<T> out(x.size()), out_ref(x.size());
    kernels::NormFn<T> n_ref{x.data(), gamma.data(), b, out_ref.data(),
                             C,        1e-5f};
    for (int64_t r = 0; r < rows; ++r)
      n_ref(r);
    kernels::NormFn<T> n{x.data(), gamma.data(), b, out.data(), C, 1e-5f};
    run_blocks(gx, 1, 0,
               [&](const attn::Lane &l, float *, int64_t bx, int64_t) {
                 norms::norm_block<W>(l, n, rows, bx * norms::kRowsPerBlock);
               });
    EXPECT_LT(rel_err(widen(out), widen(out_ref)), tol)
        << (layer ? "layer, " : "rms, ") << what;
    for (bool add : {false, true}) {
      std::vector<float> mean(rows, NAN), rstd(rows, NAN), mean_ref(rows, NAN),
          rstd_ref(rows);
      std::vector<T> dx(x.size()), dx_ref(x.size());
      const T *p = add ? plus.data() : nullptr;
      kernels::NormGradXFn<T> g_ref{x.data(),
                                    gamma.data(),
                                    dy.data(),
                                    p,
                                    layer ? mean_ref.data() : nullptr,
                                    rstd_ref.data(),
                                    dx_ref.data(),
                                    C,
                                    1e-5f};
      for (int64_t r = 0; r < rows; ++r)
        g_ref(r);
      kernels::NormGradXFn<T> g{x.data(),
                                gamma.data(),
                                dy.data(),
                                p,
                                layer ? mean.data() : nullptr,
                                rstd.data(),
                                dx.data(),
                                C,
                                1e-5f};
      run_blocks(
          gx, 1, 0, [&](const attn::Lane &l, float *, int64_t bx, int64_t) {
            norms::grad_x_block<W>(l, g, rows, bx * norms::kRowsPerBlock);
          });
      EXPECT_LT(rel_err(rstd, rstd_ref), 1e-6) << what;
      if (layer) {
        EXPECT_LT(rel_err(mean, mean_ref), 1e-6) << what;
      }
      EXPECT_LT(rel_err(widen(dx), widen(dx_ref)), 10 * tol)
          << (layer ? "layer, " : "rms, ") << what;
      if (add && sizeof(T) == 4) { // the row functor's dx + plus
        std::vector<T> dx0(x.size());
        kernels::NormGradXFn<T> g0 = g_ref;
        g0.plus = nullptr;
        g0.dx = dx0.data();
        for (int64_t r = 0; r < rows; ++r)
          g0(r);
        for (size_t i = 0; i < dx0.size(); ++i)
          ASSERT_EQ(kernels::ld(dx_ref[i]),
                    kernels::ld(dx0[i]) + kernels::ld(plus[i]))
              << i;
      }
    }
  }
}

TEST(Norms, HalfWarpRowsEqualTheRowFunctors) {
  // 100 columns: not a multiple of 8, single elements.
  check_norms<1, float>(100, 1e-6);
  // 136 columns: 17 groups of 8, so the half warp's last pass has one
  // group and 15 idle lanes.
  check_norms<norms::kGroup, float>(136, 1e-6);
  // bf16: one 16-byte load per group; a 16-bit output rounds the other way
  // where the sums' order moves it across a rounding boundary.
  check_norms<norms::kGroup, kernels::bf16_t>(136, 4e-3);
  check_norms<1, kernels::bf16_t>(100, 4e-3);
}

TEST(Classifier, BlockRowsEqualTheRowFunctors) {
  // 5 rows of 1000 logits, 990 valid; row 3's target out of range.
  const int64_t rows = 5, C = 1000, valid = 990;
  std::mt19937 gen(8);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits((size_t)(rows * C));
  for (float &v : logits)
    v = nd(gen);
  std::vector<int32_t> targets = {0, 989, 500, 995, 17};
  int flag[2] = {0, 0}, flag_ref[2] = {0, 0};
  std::vector<float> loss(rows, NAN), loss_ref(rows);
  kernels::CrossEntropyFn ref{logits.data(), targets.data(), loss_ref.data(), C,
                              valid,         flag_ref};
  for (int64_t r = 0; r < rows; ++r)
    ref(r);
  kernels::CrossEntropyFn f{
      logits.data(), targets.data(), loss.data(), C, valid, flag};
  run_blocks(rows, 1, classifier::kThreads,
             [&](const attn::Lane &l, float *smem, int64_t bx, int64_t) {
               classifier::forward_block(l, smem, f, bx);
             });
  EXPECT_LT(rel_err(loss, loss_ref), 1e-6);
  EXPECT_EQ(flag[0], 1);
  EXPECT_EQ(flag[1], 995);
  std::vector<float> d(logits.size(), NAN), d_ref(logits.size());
  kernels::CrossEntropyGradFn<> g_ref{
      logits.data(), targets.data(), d_ref.data(), C, valid, 0.2f, flag_ref};
  for (int64_t r = 0; r < rows; ++r)
    g_ref(r);
  kernels::CrossEntropyGradFn<> g{logits.data(), targets.data(), d.data(), C,
                                  valid,         0.2f,           flag};
  run_blocks(rows, 1, classifier::kThreads,
             [&](const attn::Lane &l, float *smem, int64_t bx, int64_t) {
               classifier::grad_block(l, smem, g, bx);
             });
  EXPECT_LT(rel_err(d, d_ref), 1e-6);
  for (int64_t j = 0; j < C; ++j)
    ASSERT_EQ(d[(size_t)(3 * C + j)], 0.0f) << "the bad row is not zero";
}

TEST(Classifier, InPlaceBlocksEqualTheInPlaceFunctor) {
  // The loss and the gradient over bf16 logits in place: 5 rows of 1000,
  // 990 valid (the padding zeroed), row 3's target out of range (a zero
  // row), targets at both ends of a row (read before any thread writes).
  const int64_t rows = 5, C = 1000, valid = 990;
  std::mt19937 gen(9);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<kernels::bf16_t> x((size_t)(rows * C));
  for (auto &v : x)
    kernels::st(v, nd(gen));
  std::vector<kernels::bf16_t> x_ref = x;
  std::vector<int32_t> targets = {0, 989, 500, 995, 17};
  int flag[2] = {0, 0}, flag_ref[2] = {0, 0};
  std::vector<float> loss(rows, NAN), loss_ref(rows);
  kernels::CrossEntropyInPlaceFn<kernels::bf16_t> ref{
      x_ref.data(), targets.data(), loss_ref.data(), C, valid, 0.2f, flag_ref};
  for (int64_t r = 0; r < rows; ++r)
    ref(r);
  kernels::CrossEntropyInPlaceFn<kernels::bf16_t> f{
      x.data(), targets.data(), loss.data(), C, valid, 0.2f, flag};
  run_blocks(rows, 1, classifier::kThreads,
             [&](const attn::Lane &l, float *smem, int64_t bx, int64_t) {
               classifier::in_place_block(l, smem, f, bx);
             });
  EXPECT_LT(rel_err(loss, loss_ref), 1e-6);
  EXPECT_EQ(flag[0], 1);
  EXPECT_EQ(flag[1], 995);
  std::vector<float> d, d_ref;
  for (size_t i = 0; i < x.size(); ++i) {
    d.push_back(kernels::ld(x[i]));
    d_ref.push_back(kernels::ld(x_ref[i]));
  }
  EXPECT_LT(rel_err(d, d_ref), 1e-2); // the sums' order: one bf16 ulp
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = valid; j < C; ++j)
      ASSERT_EQ(d[(size_t)(r * C + j)], 0.0f) << "padding at " << r;
  for (int64_t j = 0; j < C; ++j)
    ASSERT_EQ(d[(size_t)(3 * C + j)], 0.0f) << "the bad row is not zero";
  EXPECT_LT(d[(size_t)(1 * C + 989)], 0.0f) << "the target's -scale";
}

TEST(Classifier, StagedBlocksEqualTheInPlaceBlocks) {
  // The row staged in shared memory gives in_place_block's bits: bf16 and
  // f16 rows of 1000 (125 groups of 8, 990 valid) and fp32 rows of 1000
  // (250 groups of 4), targets at both ends, row 3's out of range.
  const int64_t rows = 5, C = 1000, valid = 990;
  auto check = [&](auto zero) {
    using T = decltype(zero);
    std::mt19937 gen(10);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    std::vector<T> x((size_t)(rows * C));
    for (auto &v : x)
      kernels::st(v, nd(gen));
    std::vector<T> x_ref = x;
    std::vector<int32_t> targets = {0, 989, 500, 995, 17};
    int flag[2] = {0, 0}, flag_ref[2] = {0, 0};
    std::vector<float> loss(rows, NAN), loss_ref(rows, NAN);
    kernels::CrossEntropyInPlaceFn<T> ref{
        x_ref.data(), targets.data(), loss_ref.data(), C,
        valid,        0.2f,           flag_ref};
    run_blocks(rows, 1, classifier::kThreads,
               [&](const attn::Lane &l, float *smem, int64_t bx, int64_t) {
                 classifier::in_place_block(l, smem, ref, bx);
               });
    ASSERT_TRUE(classifier::stageable(x.data(), C));
    kernels::CrossEntropyInPlaceFn<T> f{
        x.data(), targets.data(), loss.data(), C, valid, 0.2f, flag};
    const size_t row_floats = (size_t)C * sizeof(T) / sizeof(float);
    run_blocks(rows, 1, classifier::kThreads + row_floats,
               [&](const attn::Lane &l, float *smem, int64_t bx, int64_t) {
                 classifier::in_place_staged_block(
                     l, smem,
                     reinterpret_cast<T *>(smem + classifier::kThreads), f, bx);
               });
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(loss[(size_t)r], loss_ref[(size_t)r]) << "row " << r;
    EXPECT_EQ(flag[0], 1);
    EXPECT_EQ(flag[1], 995);
    ASSERT_EQ(memcmp(x.data(), x_ref.data(), x.size() * sizeof(T)), 0)
        << sizeof(T) << "-byte logits: not in_place_block's bits";
  };
  check(kernels::bf16_t());
  check(kernels::f16_t());
  check(0.0f);
  // A width that is not whole 16-byte groups stays unstaged.
  std::vector<kernels::bf16_t> odd(1001 + 8);
  EXPECT_FALSE(classifier::stageable(odd.data(), 1001));
  EXPECT_FALSE(classifier::stageable(odd.data() + 1, 1000));
}

TEST(Sums, ChunkBlocksEqualTheChunkFunctors) {
  // 2500 floats: two full chunks of 1024 and a partial one; sums and sums
  // of squares, then the partials added (AccumulateSumFn) and scaled.
  const int64_t n = 2500, chunks = (n + kernels::kReduceChunk - 1) /
                                   kernels::kReduceChunk;
  std::mt19937 gen(21);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v((size_t)n);
  for (float &x : v)
    x = nd(gen);
  for (bool square : {false, true}) {
    std::vector<float> ref((size_t)chunks), got((size_t)chunks, NAN);
    kernels::SumPartialFn fr{v.data(), ref.data(), n, square};
    for (int64_t c = 0; c < chunks; ++c)
      fr(c);
    kernels::SumPartialFn fg{v.data(), got.data(), n, square};
    run_blocks(chunks, 1, sums::kFloats,
               [&](const attn::Lane &l, float *smem, int64_t bx, int64_t) {
                 sums::chunk_block(l, smem, fg, bx);
               });
    EXPECT_LT(rel_err(got, ref), 1e-5) << (square ? "squares" : "sums");
    float acc_ref = 2.0f, acc = 2.0f, scaled_ref = 0.0f, scaled = NAN;
    kernels::AccumulateSumFn{ref.data(), &acc_ref, chunks}(0);
    kernels::ScaledSumFn{ref.data(), &scaled_ref, chunks, 0.5f}(0);
    run_blocks(
        1, 1, sums::kFloats,
        [&](const attn::Lane &l, float *smem, int64_t, int64_t) {
          sums::partials_block(
              l, smem, kernels::AccumulateSumFn{got.data(), &acc, chunks});
          sums::partials_block(
              l, smem, kernels::ScaledSumFn{got.data(), &scaled, chunks, 0.5f});
        });
    EXPECT_NEAR(acc, acc_ref, 1e-4f * std::fabs(acc_ref));
    EXPECT_NEAR(scaled, scaled_ref, 1e-4f * std::fabs(scaled_ref) + 1e-6f);
  }
}

TEST(Sums, BatchedSumsOfSquaresEqualOneLaunchPairPerTensor) {
  // The gradient norm's batch: tensors from 1 element to several chunks,
  // two of them into one accumulator and one into another, summed as one
  // chunk grid and one partials block. The bits of chunk_block and
  // partials_block per tensor, in the tensors' order.
  const std::vector<int64_t> sizes = {1, 700, 1024, 2500, 3, 5000};
  std::mt19937 gen(33);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> v;
  for (int64_t n : sizes) {
    v.emplace_back((size_t)n);
    for (float &x : v.back())
      x = nd(gen);
  }
  float acc_ref[2] = {0.5f, 0.0f}, acc[2] = {0.5f, 0.0f};
  auto which = [](size_t t) { return t == 4 ? 1 : 0; };
  for (size_t t = 0; t < sizes.size(); ++t) {
    int64_t chunks = sums::chunks_of(sizes[t]);
    std::vector<float> partial((size_t)chunks, NAN);
    kernels::SumPartialFn f{v[t].data(), partial.data(), sizes[t], true};
    run_blocks(chunks, 1, sums::kFloats,
               [&](const attn::Lane &l, float *smem, int64_t bx, int64_t) {
                 sums::chunk_block(l, smem, f, bx);
               });
    run_blocks(1, 1, sums::kFloats,
               [&](const attn::Lane &l, float *smem, int64_t, int64_t) {
                 sums::partials_block(
                     l, smem,
                     kernels::AccumulateSumFn{partial.data(),
                                              &acc_ref[which(t)], chunks});
               });
  }
  std::vector<float> partials((size_t)sums::kBatchPartials, NAN);
  sums::SumsqBatch b;
  b.partials = partials.data();
  for (size_t t = 0; t < sizes.size(); ++t) {
    ASSERT_TRUE(sums::queueable(sizes[t]) && sums::fits(b, sizes[t]));
    sums::add(b, v[t].data(), sizes[t], &acc[which(t)]);
  }
  ASSERT_EQ(b.first_chunk[b.count], 1 + 1 + 1 + 3 + 1 + 5);
  run_blocks(b.first_chunk[b.count], 1, sums::kFloats,
             [&](const attn::Lane &l, float *smem, int64_t bx, int64_t) {
               sums::batch_chunk_block(l, smem, b, bx);
             });
  run_blocks(1, 1, sums::kFloats,
             [&](const attn::Lane &l, float *smem, int64_t, int64_t) {
               sums::batch_partials_block(l, smem, b);
             });
  EXPECT_EQ(acc[0], acc_ref[0]);
  EXPECT_EQ(acc[1], acc_ref[1]);
  // A batch is full at kMaxSumsq tensors or at kBatchPartials chunks; a
  // tensor of more than kQueueChunks chunks is never queued.
  EXPECT_FALSE(
      sums::queueable((sums::kQueueChunks + 1) * kernels::kReduceChunk));
  sums::SumsqBatch full;
  for (int t = 0; t < sums::kMaxSumsq; ++t)
    sums::add(full, v[0].data(), 1, &acc[0]);
  EXPECT_FALSE(sums::fits(full, 1));
}

TEST(Embedding, RowRangeBlocksEqualTheColumnFunctor) {
  // 603 rows of dout (three rounds of staged ids, the last partial and
  // ending in a partial batch) into a vocabulary slice of 1100 rows at row0
  // 300 (35 ranges of 32, the last partial; ids of other ranks skipped), 300
  // columns (two column tiles, the second partial), bf16 dout, a table that
  // already holds values (embedding_grad_add: each element starts from its
  // own); a repeated id adds many rows into one table row. The same bits as
  // the functor: each element adds in row order. One bad id raises the flag
  // with its value.
  const int64_t rows = 603, C = 300;
  const kernels::VocabSlice vocab{1100, 300, 2000};
  std::mt19937 gen(31);
  std::uniform_int_distribution<int32_t> id(0, 1999);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<int32_t> ids((size_t)rows);
  for (int32_t &x : ids)
    x = id(gen) % 3 == 0 ? 777 : id(gen);
  ids[123] = 2000; // out of range
  // The ranges' edges (local rows 0, 31, 32, 1087, 1088, 1099) and the ids
  // just outside the slice.
  for (int32_t x : {299, 300, 331, 332, 1387, 1388, 1399, 1400})
    ids[(size_t)(x % 97 + 200)] = x;
  std::vector<kernels::bf16_t> dout((size_t)(rows * C));
  for (auto &x : dout)
    kernels::st(x, nd(gen));
  std::vector<float> ref((size_t)(vocab.V * C));
  for (float &x : ref)
    x = nd(gen);
  std::vector<float> got = ref;
  int flag_ref[2] = {0, 0}, flag[2] = {0, 0};
  kernels::EmbeddingGradColumnFn<kernels::bf16_t> fr{
      ids.data(), dout.data(), ref.data(), rows, vocab, C, flag_ref};
  for (int64_t c = 0; c < C; ++c)
    fr(c);
  kernels::EmbeddingGradColumnFn<kernels::bf16_t> fg{
      ids.data(), dout.data(), got.data(), rows, vocab, C, flag};
  const int64_t tiles = (C + embed::kThreads - 1) / embed::kThreads,
                ranges = (vocab.V + embed::kRangeRows - 1) / embed::kRangeRows;
  ASSERT_EQ(tiles, 2);
  ASSERT_EQ(ranges, 35);
  run_blocks(tiles, ranges, embed::kSmemFloats,
             [&](const attn::Lane &l, float *smem, int64_t bx, int64_t by) {
               embed::grad_block(l, smem, fg, bx * embed::kThreads,
                                 by * embed::kRangeRows, bx == 0 && by == 0);
             });
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0);
  EXPECT_EQ(flag[0], 1);
  EXPECT_EQ(flag[1], 2000);
  EXPECT_EQ(flag_ref[1], 2000);
}

} // namespace

TEST(Optimizer, BatchedAdamWEqualsOneLaunchPerTensor) {
  // Tensors from 1 element to more than kMaxBlocks blocks' worth (their
  // blocks stride), with and without clipping (a factor below 1, then
  // none): each batch's grid updates every element exactly once, with the
  // functor's bits. Tensor t keeps no 16-bit copy, a bf16 or an f16 one
  // (t % 3): written with the update, the parameter's cast bits.
  const std::vector<int64_t> sizes = {
      1,
      255,
      256,
      257,
      768,
      5000,
      optimizer::kMaxBlocks * optimizer::kThreads * optimizer::kPerThread +
          777};
  std::mt19937 gen(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float sumsq : {400.0f, 0.25f}) {
    std::vector<std::vector<float>> w, m, v, g, wr, mr, vr;
    for (int64_t n : sizes) {
      auto fill = [&](float scale) {
        std::vector<float> x((size_t)n);
        for (float &e : x)
          e = scale * nd(gen);
        return x;
      };
      w.push_back(fill(1.0f));
      m.push_back(fill(0.1f));
      v.push_back(fill(0.0f));
      for (float &e : v.back())
        e = 0.01f + std::fabs(nd(gen)) * 0.01f;
      g.push_back(fill(3.0f));
    }
    wr = w, mr = m, vr = v;
    std::vector<std::vector<uint16_t>> copies;
    for (int64_t n : sizes)
      copies.emplace_back((size_t)n, uint16_t(0xffff));
    auto fn = [&](std::vector<std::vector<float>> &W,
                  std::vector<std::vector<float>> &M,
                  std::vector<std::vector<float>> &V, size_t t) {
      kernels::AdamWFn f{W[t].data(), M[t].data(), V[t].data(), g[t].data(),
                         1e-3f,       0.9f,        0.95f,       1e-8f,
                         0.1f,        0.19f,       0.0975f,     &sumsq,
                         1.0f};
      if (t % 3 != 0 && &W == &w)
        f.copy = {copies[t].data(), t % 3 == 2};
      return f;
    };
    for (size_t t = 0; t < sizes.size(); ++t) {
      kernels::AdamWFn f = fn(wr, mr, vr, t);
      for (int64_t i = 0; i < sizes[t]; ++i)
        f(i);
    }
    optimizer::AdamWBatch b;
    for (size_t t = 0; t < sizes.size(); ++t)
      optimizer::add(b, sizes[t], fn(w, m, v, t));
    ASSERT_EQ(b.first_block[b.count], optimizer::grid(b));
    ASSERT_EQ(b.first_block[b.count] - b.first_block[b.count - 1],
              optimizer::kMaxBlocks)
        << "the largest tensor's blocks stride over it";
    run_blocks(optimizer::grid(b), 1, 0,
               [&](const attn::Lane &l, float *, int64_t bx, int64_t) {
                 optimizer::adamw_block(l, b, bx);
               });
    for (size_t t = 0; t < sizes.size(); ++t)
      for (int64_t i = 0; i < sizes[t]; ++i) {
        ASSERT_EQ(w[t][(size_t)i], wr[t][(size_t)i])
            << "w of tensor " << t << " at " << i << ", sumsq " << sumsq;
        ASSERT_EQ(m[t][(size_t)i], mr[t][(size_t)i]) << "m";
        ASSERT_EQ(v[t][(size_t)i], vr[t][(size_t)i]) << "v";
        uint16_t want = t % 3 == 0   ? uint16_t(0xffff)
                        : t % 3 == 1 ? bf16_from_float(w[t][(size_t)i])
                                     : f16_from_float(w[t][(size_t)i]);
        ASSERT_EQ(copies[t][(size_t)i], want)
            << "copy of tensor " << t << " at " << i;
      }
  }
}

TEST(Optimizer, UpdatesWriteTheCastOfTheParameter) {
  // The host's ranges (the copy's kind tested once per range) and the
  // per-element operator() write the same bits as CastFn, for SGD and
  // AdamW, bf16 and f16.
  const int64_t n = 1000;
  std::mt19937 gen(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (bool f16 : {false, true}) {
    std::vector<float> w(n), g(n), m(n, 0.0f), v(n, 0.0f);
    for (int64_t i = 0; i < n; ++i)
      w[i] = nd(gen), g[i] = nd(gen);
    std::vector<float> w2 = w, m2 = m, v2 = v;
    std::vector<uint16_t> c1(n), c2(n), cast(n);
    auto castAll = [&] {
      kernels::CastFn c{w.data(), cast.data(), kernels::CastF32,
                        f16 ? kernels::CastF16 : kernels::CastBF16};
      for (int64_t i = 0; i < n; ++i)
        c(i);
    };
    kernels::SgdFn s1{w.data(), g.data(), 0.1f, {c1.data(), f16}};
    s1.range(0, n);
    kernels::SgdFn s2{w2.data(), g.data(), 0.1f, {c2.data(), f16}};
    for (int64_t i = 0; i < n; ++i)
      s2(i);
    castAll();
    EXPECT_EQ(c1, cast);
    EXPECT_EQ(c2, cast);
    kernels::AdamWFn a1{w.data(), m.data(), v.data(), g.data(), 1e-2f, 0.9f,
                        0.95f,    1e-8f,    0.1f,     0.1f,     0.05f};
    a1.copy = {c1.data(), f16};
    a1.range(0, n);
    kernels::AdamWFn a2{w2.data(), m2.data(), v2.data(), g.data(), 1e-2f, 0.9f,
                        0.95f,     1e-8f,     0.1f,      0.1f,     0.05f};
    a2.copy = {c2.data(), f16};
    for (int64_t i = 0; i < n; ++i)
      a2(i);
    castAll();
    EXPECT_EQ(w, w2);
    EXPECT_EQ(c1, cast);
    EXPECT_EQ(c2, cast);
  }
}

namespace {

/// n elements of T at a 64-byte aligned address (+ `shift` elements),
/// random values (16-bit ones from rounded floats).
template <class T> struct Aligned {
  std::vector<unsigned char> raw;
  T *p;
  Aligned(int64_t n, std::mt19937 &gen, int64_t shift = 0)
      : raw((size_t)(n + shift) * sizeof(T) + 64) {
    uintptr_t a = (uintptr_t)raw.data();
    p = (T *)(raw.data() + (64 - a % 64) % 64) + shift;
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (int64_t i = 0; i < n; ++i)
      kernels::st(p[i], nd(gen));
  }
  Aligned(const Aligned &o) : raw(o.raw) {
    p = (T *)(raw.data() + ((const unsigned char *)o.p - o.raw.data()));
  }
};

template <class T> bool same_bits(const T *a, const T *b, int64_t n) {
  return std::memcmp(a, b, (size_t)n * sizeof(T)) == 0;
}

/// f over [0, n) the way the kernel runs it (elementwise::thread_work on
/// `threads` threads) equals f over [0, n) one element at a time, on the
/// outputs `out` (compared with a run of `ref`, the same functor on copies).
template <class F, class Run>
void expect_groups(const F &f, const F &ref, int64_t n, const Run &compare) {
  ASSERT_TRUE(elementwise::Io<F>::aligned(f));
  for (int64_t i = 0; i < n; ++i)
    ref(i);
  // Fewer threads than groups (each strides) and more.
  const int64_t threads = n / elementwise::kGroup > 8 ? 3 : 64;
  for (int64_t t = 0; t < threads; ++t)
    elementwise::thread_work(f, t, threads, n);
  compare();
}

template <class T> void elementwise_groups_for(int64_t n) {
  using namespace kernels;
  std::mt19937 gen(11 + (int)n);
  Aligned<T> a(n, gen), b(n, gen), out(n, gen);
  Aligned<T> ra(a), rout(out);
  SCOPED_TRACE(::testing::Message()
               << "n " << n << ", " << sizeof(T) * 8 << "-bit");
  auto outs = [&] { EXPECT_TRUE(same_bits(out.p, rout.p, n)); };
  expect_groups(AddFn<T>{a.p, b.p, out.p}, AddFn<T>{a.p, b.p, rout.p}, n, outs);
  expect_groups(SubFn<T>{a.p, b.p, out.p}, SubFn<T>{a.p, b.p, rout.p}, n, outs);
  expect_groups(MulFn<T>{a.p, b.p, out.p}, MulFn<T>{a.p, b.p, rout.p}, n, outs);
  expect_groups(ScaleFn<T>{a.p, out.p, 0.37f}, ScaleFn<T>{a.p, rout.p, 0.37f},
                n, outs);
  expect_groups(MapFn<GeluTanh, T>{a.p, out.p}, MapFn<GeluTanh, T>{a.p, rout.p},
                n, outs);
  expect_groups(MapFn<Silu, T>{a.p, out.p}, MapFn<Silu, T>{a.p, rout.p}, n,
                outs);
  expect_groups(MapGradFn<GeluTanh, T>{a.p, b.p, out.p},
                MapGradFn<GeluTanh, T>{a.p, b.p, rout.p}, n, outs);
  expect_groups(MapGradFn<Relu, T>{a.p, b.p, out.p},
                MapGradFn<Relu, T>{a.p, b.p, rout.p}, n, outs);
  // In place: the output is the first input (a residual add).
  expect_groups(AddFn<T>{a.p, b.p, a.p}, AddFn<T>{ra.p, b.p, ra.p}, n,
                [&] { EXPECT_TRUE(same_bits(a.p, ra.p, n)); });
  // A bias over rows of 24 (a multiple of 8); rows of 12 are not grouped.
  if (n % 24 == 0) {
    Aligned<T> bias(24, gen);
    expect_groups(BiasAddFn<T>{a.p, bias.p, out.p, 24},
                  BiasAddFn<T>{a.p, bias.p, rout.p, 24}, n, outs);
    EXPECT_FALSE(
        elementwise::Io<BiasAddFn<T>>::aligned({a.p, bias.p, out.p, 12}));
  }
  // A view one element in: no groups.
  Aligned<T> shifted(n, gen, 1);
  EXPECT_FALSE(elementwise::Io<AddFn<T>>::aligned({shifted.p, b.p, out.p}));
}

} // namespace

TEST(Elementwise, GroupsEqualTheFunctors) {
  // Whole groups only, a partial last group, fewer elements than a group,
  // and rows of a bias (24 x 37).
  for (int64_t n :
       {int64_t(8 * 37), int64_t(8 * 37 + 5), int64_t(3), int64_t(24 * 37)}) {
    elementwise_groups_for<float>(n);
    elementwise_groups_for<kernels::bf16_t>(n);
    elementwise_groups_for<kernels::f16_t>(n);
  }
}

TEST(Elementwise, CastGroupsEqualTheFunctor) {
  // Every pair of fp32, bf16 and fp16, with a partial last group.
  const int64_t n = 8 * 29 + 7;
  std::mt19937 gen(3);
  Aligned<float> f32(n, gen), out32(n, gen), ref32(out32);
  Aligned<kernels::bf16_t> bf(n, gen), outbf(n, gen), refbf(outbf);
  Aligned<kernels::f16_t> hf(n, gen), outhf(n, gen), refhf(outhf);
  const void *ins[] = {f32.p, bf.p, hf.p};
  void *outs[] = {out32.p, outbf.p, outhf.p};
  void *refs[] = {ref32.p, refbf.p, refhf.p};
  const int types[] = {kernels::CastF32, kernels::CastBF16, kernels::CastF16};
  const size_t widths[] = {4, 2, 2};
  for (int from = 0; from < 3; ++from)
    for (int to = 0; to < 3; ++to) {
      SCOPED_TRACE(::testing::Message() << "from " << from << " to " << to);
      expect_groups(
          kernels::CastFn{ins[from], outs[to], types[from], types[to]},
          kernels::CastFn{ins[from], refs[to], types[from], types[to]}, n, [&] {
            EXPECT_EQ(std::memcmp(outs[to], refs[to], (size_t)n * widths[to]),
                      0);
          });
    }
  Aligned<float> src(n, gen), dst(n, gen), refdst(dst);
  expect_groups(kernels::CopyFn{src.p, dst.p}, kernels::CopyFn{src.p, refdst.p},
                n, [&] { EXPECT_TRUE(same_bits(dst.p, refdst.p, n)); });
}
