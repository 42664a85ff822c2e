// Kernel tests: every op of planrt.h on the host backend against a
// straightforward double-precision reference.
#include "planrt/internal.h"
#include "planrt/kernels.h"
#include "planrt/planrt.h"

#include "context_fixture.h"
#include "typed_vectors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

using namespace planrt;

namespace {

class KernelTest : public test::ContextTest {
protected:
  KernelTest() : ContextTest("kernels", 1234) {}
  void declare() override {
    declare_param(ctx, "w", 2, 5, 7, 1, 1, InitNormal, 0.0f, 1.0f);
    declare_state(ctx, "w.exp_avg", 2, 5, 7, 1, 1);
    declare_state(ctx, "w.exp_avg_sq", 2, 5, 7, 1, 1);
  }
  std::vector<float> host(const Tensor *t) { return internal::to_host(ctx, t); }
};

void expect_close(const std::vector<float> &got,
                  const std::vector<double> &want, double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i]))
        << "at index " << i;
}

double gelu_ref(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}

TEST_F(KernelTest, MatmulAllTransposeCombinations) {
  const int64_t m = 13, n = 9, k = 21;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor *a = ta ? random({k, m}) : random({m, k});
      Tensor *b = tb ? random({n, k}) : random({k, n});
      Tensor *c = make({m, n});
      matmul(ctx, a, b, c, ta, tb);
      auto av = host(a), bv = host(b);
      std::vector<double> want((size_t)(m * n));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p) {
            double x = ta ? av[p * m + i] : av[i * k + p];
            double y = tb ? bv[j * k + p] : bv[p * n + j];
            s += x * y;
          }
          want[i * n + j] = s;
        }
      SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb);
      expect_close(host(c), want, 1e-5, 1e-5);
    }
}

TEST_F(KernelTest, MatmulRejectsBadShapes) {
  Tensor *a = random({3, 4}), *b = random({5, 6}), *c = make({3, 6});
  EXPECT_DEATH(matmul(ctx, a, b, c, false, false),
               "planrt: error: matmul: shape mismatch");
  Tensor *v = random({4});
  EXPECT_DEATH(matmul(ctx, v, b, c, false, false),
               "planrt: error: matmul: operands must be 2-D");
}

TEST_F(KernelTest, ElementwiseRejectsShapeMismatch) {
  Tensor *a = random({3, 4}), *b = random({4, 3}), *c = make({3, 4});
  EXPECT_DEATH(add(ctx, a, b, c), "planrt: error: add: .* different shapes");
  EXPECT_DEATH(bias_add(ctx, a, random({5}), c),
               "planrt: error: bias_add: x \\[3, 4\\] cannot be viewed");
}

TEST_F(KernelTest, BiasAddAndBiasGrad) {
  Tensor *x = random({6, 3, 5}), *b = random({5}), *out = make({6, 3, 5});
  bias_add(ctx, x, b, out);
  auto xv = host(x), bv = host(b);
  std::vector<double> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i)
    want[i] = (double)xv[i] + bv[i % 5];
  expect_close(host(out), want, 1e-7, 0);

  Tensor *dy = random({37, 11}), *db = make({11});
  bias_grad(ctx, dy, db);
  auto dyv = host(dy);
  std::vector<double> gw(11, 0.0);
  for (int r = 0; r < 37; ++r)
    for (int j = 0; j < 11; ++j)
      gw[j] += dyv[r * 11 + j];
  expect_close(host(db), gw, 1e-5, 1e-6);
}

TEST_F(KernelTest, AddReluReluGrad) {
  Tensor *a = random({4, 9}), *b = random({4, 9}), *out = make({4, 9});
  add(ctx, a, b, out);
  auto av = host(a), bv = host(b);
  std::vector<double> want(av.size());
  for (size_t i = 0; i < av.size(); ++i)
    want[i] = (double)av[i] + bv[i];
  expect_close(host(out), want, 1e-7, 0);

  relu(ctx, a, out);
  for (size_t i = 0; i < av.size(); ++i)
    want[i] = av[i] > 0 ? av[i] : 0.0;
  expect_close(host(out), want, 0, 0);

  relu_grad(ctx, a, b, out);
  for (size_t i = 0; i < av.size(); ++i)
    want[i] = av[i] > 0 ? bv[i] : 0.0;
  expect_close(host(out), want, 0, 0);
}

TEST_F(KernelTest, GeluMatchesReference) {
  Tensor *x = random({8, 16}, -6.0f, 6.0f), *out = make({8, 16});
  gelu(ctx, x, out);
  auto xv = host(x);
  std::vector<double> want(xv.size());
  for (size_t i = 0; i < xv.size(); ++i)
    want[i] = gelu_ref(xv[i]);
  expect_close(host(out), want, 1e-6, 1e-6);
  // Extreme inputs stay finite and saturate.
  for (float v : {-1e4f, -50.0f, -10.0f, 0.0f, 10.0f, 50.0f, 1e4f}) {
    float y = kernels::gelu_fwd(v), d = kernels::gelu_deriv(v);
    EXPECT_TRUE(std::isfinite(y) && std::isfinite(d)) << v;
  }
  EXPECT_EQ(kernels::gelu_fwd(-50.0f), 0.0f);
  EXPECT_EQ(kernels::gelu_fwd(50.0f), 50.0f);
  EXPECT_EQ(kernels::gelu_deriv(50.0f), 1.0f);
}

TEST_F(KernelTest, GeluGradMatchesFiniteDifferences) {
  Tensor *x = random({10, 20}, -5.0f, 5.0f), *dy = random({10, 20});
  Tensor *dx = make({10, 20});
  gelu_grad(ctx, x, dy, dx);
  auto xv = host(x), dyv = host(dy);
  std::vector<double> want(xv.size());
  const double h = 1e-5;
  for (size_t i = 0; i < xv.size(); ++i) {
    double xi = xv[i];
    double fd = (gelu_ref(xi + h) - gelu_ref(xi - h)) / (2 * h);
    want[i] = dyv[i] * fd;
  }
  expect_close(host(dx), want, 1e-5, 1e-6);
}

TEST_F(KernelTest, GeluExactAndGrad) {
  Tensor *x = random({10, 20}, -5.0f, 5.0f), *dy = random({10, 20});
  Tensor *y = make({10, 20}), *dx = make({10, 20});
  gelu_exact(ctx, x, y);
  gelu_exact_grad(ctx, x, dy, dx);
  auto xv = host(x), dyv = host(dy);
  auto ref = [](double v) {
    return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  };
  std::vector<double> want(xv.size()), wantd(xv.size());
  const double h = 1e-5;
  for (size_t i = 0; i < xv.size(); ++i) {
    want[i] = ref(xv[i]);
    wantd[i] = dyv[i] * (ref(xv[i] + h) - ref(xv[i] - h)) / (2 * h);
  }
  expect_close(host(y), want, 1e-5, 1e-6);
  expect_close(host(dx), wantd, 1e-5, 1e-6);
  // It differs from the tanh form (by up to ~1e-3), which this must tell apart.
  Tensor *t = make({10, 20});
  gelu(ctx, x, t);
  double diff = 0;
  auto tv = host(t), yv = host(y);
  for (size_t i = 0; i < tv.size(); ++i)
    diff = std::max(diff, std::abs((double)tv[i] - yv[i]));
  EXPECT_GT(diff, 1e-4);
}

TEST_F(KernelTest, MseLossAndGrad) {
  // More elements than one reduction chunk, and a ragged last chunk.
  const int64_t rows = 700, cols = 3;
  Tensor *p = random({rows, cols}), *t = random({rows, cols});
  Tensor *loss = make({});
  float scale = 1.0f / (rows * cols);
  mse_loss(ctx, p, t, loss, scale);
  auto pv = host(p), tv = host(t);
  double s = 0;
  for (size_t i = 0; i < pv.size(); ++i)
    s += ((double)pv[i] - tv[i]) * ((double)pv[i] - tv[i]);
  expect_close(host(loss), {s * scale}, 1e-5, 0);

  Tensor *g = make({rows, cols});
  mse_loss_grad(ctx, p, t, g, scale);
  std::vector<double> want(pv.size());
  for (size_t i = 0; i < pv.size(); ++i)
    want[i] = 2.0 * scale * ((double)pv[i] - tv[i]);
  expect_close(host(g), want, 1e-6, 0);
}

TEST_F(KernelTest, SgdUpdate) {
  Tensor *w = random({4, 5}), *g = random({4, 5});
  auto wv = host(w), gv = host(g);
  sgd_update(ctx, w, g, 0.05f);
  std::vector<double> want(wv.size());
  for (size_t i = 0; i < wv.size(); ++i)
    want[i] = wv[i] - 0.05 * gv[i];
  expect_close(host(w), want, 1e-6, 1e-7);
}

TEST_F(KernelTest, AdamWUpdateOverThreeSteps) {
  Tensor *w = param(ctx, 0);
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
  auto w0 = host(w);
  std::vector<double> rw(w0.begin(), w0.end()), rm(w0.size(), 0.0),
      rv(w0.size(), 0.0);
  for (int step = 1; step <= 3; ++step) {
    internal::begin_step(ctx, step);
    Tensor *g = random({5, 7});
    auto gv = host(g);
    adamw_update(ctx, w, g, state(ctx, 0), state(ctx, 1), lr, b1, b2, eps, wd);
    for (size_t i = 0; i < rw.size(); ++i) {
      rm[i] = b1 * rm[i] + (1 - b1) * gv[i];
      rv[i] = b2 * rv[i] + (1 - b2) * gv[i] * gv[i];
      double mhat = rm[i] / (1 - std::pow((double)b1, step));
      double vhat = rv[i] / (1 - std::pow((double)b2, step));
      rw[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * rw[i]);
    }
    SCOPED_TRACE(testing::Message() << "step " << step);
    expect_close(host(w), rw, 1e-5, 1e-6);
  }
}

// The compiler fuses clipping into the update that reads the gradient:
// the same bits as clip_by_global_norm then adamw_update, whether the norm
// clips (factor < 1) or not, and the gradient is left as it was.
TEST_F(KernelTest, AdamWClippedEqualsClipThenAdamW) {
  const float lr = 0.01f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  for (float max_norm : {0.5f, 1e3f}) {
    SCOPED_TRACE(testing::Message() << "max_norm " << max_norm);
    Tensor *g = random({5, 7}, -1.0f, 1.0f);
    Tensor *sumsq = alloc(ctx, 0, 1, 1, 1, 1);
    internal::from_host(ctx, sumsq, {3.7f});
    auto gv = host(g);
    Tensor *w1 = random({5, 7}), *w2 = alloc(ctx, 2, 5, 7, 1, 1);
    internal::from_host(ctx, w2, host(w1));
    Tensor *m1 = random({5, 7}, 0.0f, 0.1f), *v1 = random({5, 7}, 0.0f, 0.1f);
    Tensor *m2 = alloc(ctx, 2, 5, 7, 1, 1), *v2 = alloc(ctx, 2, 5, 7, 1, 1);
    internal::from_host(ctx, m2, host(m1));
    internal::from_host(ctx, v2, host(v1));
    adamw_update_clipped(ctx, w2, g, m2, v2, sumsq, lr, b1, b2, eps, wd,
                         max_norm);
    EXPECT_EQ(host(g), gv);
    clip_by_global_norm(ctx, g, sumsq, max_norm);
    if (max_norm < 1.0f) {
      EXPECT_NE(host(g), gv);
    }
    adamw_update(ctx, w1, g, m1, v1, lr, b1, b2, eps, wd);
    for (auto [a, b] : {std::pair{w1, w2}, {m1, m2}, {v1, v2}}) {
      auto x = host(a), y = host(b);
      ASSERT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
    }
  }
}

TEST_F(KernelTest, AllReduceOnOneRankIsIdentity) {
  Tensor *t = random({3, 3});
  auto before = host(t);
  all_reduce_sum(ctx, t, 1);
  EXPECT_EQ(host(t), before);
  EXPECT_DEATH(all_reduce_sum(ctx, t, 2), "names axes that are not declared");
}

} // namespace

namespace {
/// Position of a float on the number line, in ulps (for distances).
int64_t float_order(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof(i));
  return i < 0 ? -(int64_t)(i & 0x7fffffff) : i;
}

/// The largest distance in ulps between fn and the correctly rounded ref
/// over every 61st float bit pattern in [lo, hi] (about 7e7 values).
template <class Fn, class Ref>
int64_t max_ulps(Fn fn, Ref ref, float lo, float hi, float *worst) {
  int64_t most = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 61) {
    uint32_t bits = (uint32_t)u;
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    if (!(x >= lo && x <= hi))
      continue;
    int64_t d = std::llabs(float_order(fn(x)) - float_order((float)ref(x)));
    if (d > most) {
      most = d;
      *worst = x;
    }
  }
  return most;
}
} // namespace

// exp_f32 and tanh_f32 replace libm's expf and tanhf in the kernels so that
// host loops vectorize; the exhaustive check (all 2^32 patterns, done once
// by hand) found at most 1 and 2 ulps.
TEST(VectorMath, ExpWithinOneUlp) {
  float worst = 0;
  EXPECT_LE(max_ulps(
                kernels::exp_f32, [](float x) { return std::exp((double)x); },
                -87.3f, 88.3f, &worst),
            1)
      << "at " << worst;
  EXPECT_EQ(kernels::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(kernels::exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(kernels::exp_f32(-100.0f), 0.0f);
  EXPECT_EQ(kernels::exp_f32(INFINITY), INFINITY);
  EXPECT_EQ(kernels::exp_f32(89.0f), INFINITY);
  EXPECT_TRUE(std::isnan(kernels::exp_f32(NAN)));
}

TEST(VectorMath, TanhWithinTwoUlps) {
  float worst = 0;
  EXPECT_LE(max_ulps(
                kernels::tanh_f32, [](float x) { return std::tanh((double)x); },
                -20.0f, 20.0f, &worst),
            2)
      << "at " << worst;
  EXPECT_EQ(kernels::tanh_f32(100.0f), 1.0f);
  EXPECT_EQ(kernels::tanh_f32(-INFINITY), -1.0f);
  EXPECT_TRUE(std::signbit(kernels::tanh_f32(-0.0f)));
  EXPECT_TRUE(std::isnan(kernels::tanh_f32(NAN)));
}

//===--- Host range() versions of the attention functors
//-------------------===//
// The host runs range(); the GPU runs operator() per index. Both must give
// the same bits (and so must the kept and recomputed paths, which the
// range versions compute differently): checked on shapes with head dims
// below, at and above sum8's 8 lanes and the 16-column blocks, with grouped
// kv heads.

namespace {

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float &x : v)
    x = dist(gen);
  return v;
}

template <class F> void by_index(const F &f, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    f(i);
}

void expect_same_bits(const std::vector<float> &a, const std::vector<float> &b,
                      const char *what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0)
        << what << " differs at " << i << ": " << a[i] << " vs " << b[i];
}

template <int R> void check_tiles(int64_t D) {
  SCOPED_TRACE("R " + std::to_string(R) + ", D " + std::to_string(D));
  const int64_t n = 41, ld = kernels::attn_ld(n);
  std::vector<float> rows = random_floats(n * D, 2),
                     xs = random_floats(R * D, 1);
  std::vector<float> xt(D * ld), got(R * ld);
  kernels::transpose_rows(rows.data(), D, n, D, xt.data(), ld);
  const float *x[R];
  float *out[R];
  for (int r = 0; r < R; ++r) {
    x[r] = xs.data() + r * D;
    out[r] = got.data() + r * ld;
  }
  kernels::dots_transposed_rows<R>(x, xt.data(), ld, D, n, out);
  std::vector<float> want(R * n), first(R * n);
  for (int r = 0; r < R; ++r)
    for (int64_t u = 0; u < n; ++u) {
      want[r * n + u] = kernels::dot(x[r], rows.data() + u * D, D);
      first[r * n + u] = got[r * ld + u];
    }
  expect_same_bits(first, want, "dots_transposed_rows");
  // Ranges as the attention tiles use them (growing ends, growing starts)
  // and ones that do not all overlap.
  int64_t ranges[3][2][R];
  for (int r = 0; r < R; ++r) {
    ranges[0][0][r] = 0, ranges[0][1][r] = 5 + r;
    ranges[1][0][r] = 3 + r, ranges[1][1][r] = n;
    ranges[2][0][r] = (r * 17) % 23, ranges[2][1][r] = n - (r * 11) % 13;
  }
  for (const auto &range : ranges) {
    std::vector<float> ws = random_floats(R * n, 3),
                       acc = random_floats(R * D, 4);
    std::vector<float> ref = acc;
    const float *w[R];
    float *o[R];
    for (int r = 0; r < R; ++r) {
      w[r] = ws.data() + r * n;
      o[r] = acc.data() + r * D;
    }
    kernels::weighted_rows_add_rows<R>(w, range[0], range[1], rows.data(), D, D,
                                       o);
    for (int r = 0; r < R; ++r)
      for (int64_t t = range[0][r]; t < range[1][r]; ++t)
        for (int64_t d = 0; d < D; ++d)
          ref[r * D + d] += w[r][t - range[0][r]] * rows[t * D + d];
    expect_same_bits(acc, ref, "weighted_rows_add_rows");
  }
}

TEST(HostRanges, TilesSumInTheIndexVersionsOrder) {
  static_assert(kernels::kTileRows == 6, "check every tile size");
  for (int64_t D : {1, 5, 8, 13, 16, 37, 64}) {
    check_tiles<1>(D);
    check_tiles<2>(D);
    check_tiles<3>(D);
    check_tiles<4>(D);
    check_tiles<5>(D);
    check_tiles<6>(D);
  }
}

/// An attention dropout of p = 0.3 whose problem sits at batch row 1 and
/// head 2 of a [4, 8, S, S] global tensor (a data- and tensor-parallel
/// rank's).
kernels::AttnDropout test_dropout() {
  return kernels::AttnDropout::make(0.3f, kernels::mix64(2024), 1, 4, 2, 8);
}

TEST(HostRanges, AttentionDropoutZeroesAboutP) {
  // The mask keeps 1 - p of the probabilities, scaled; a different head
  // offset draws a different mask.
  kernels::AttnDropout d = test_dropout(), other = d.at(0, 1);
  const int64_t S = 64;
  int64_t kept = 0, differ = 0, n = 0;
  for (int64_t t = 0; t < S; ++t)
    for (int64_t u = 0; u <= t; ++u, ++n) {
      float z = d.z(0, 0, S, t, u);
      ASSERT_TRUE(z == 0.0f || z == d.scale);
      kept += z != 0.0f;
      differ += z != other.z(0, 0, S, t, u);
    }
  EXPECT_NEAR((double)kept / n, 0.7, 0.03);
  EXPECT_GT(differ, n / 4);
}

TEST(HostRanges, AttentionRangesEqualTheIndexVersions) {
  struct Case {
    int64_t B, S, H, KV, D;
  };
  for (Case c : {Case{2, 7, 2, 2, 16}, Case{1, 19, 4, 2, 5},
                 Case{2, 33, 2, 1, 64}, Case{1, 17, 3, 3, 8}}) {
    kernels::AttnShape a{c.B,  c.S, c.H,
                         c.KV, c.D, 1.0f / std::sqrt((float)c.D)};
    const int64_t rows = c.B * c.H * c.S, W = a.width();
    std::vector<float> qkv = random_floats(c.B * c.S * W, 5);
    std::vector<float> dout = random_floats(c.B * c.S * c.H * c.D, 6);
    for (int variant = 0; variant < 4; ++variant) {
      const bool kept = variant & 1;
      const kernels::AttnDropout drop =
          variant & 2 ? test_dropout() : kernels::AttnDropout{};
      SCOPED_TRACE(::testing::Message() << (kept ? "kept" : "recomputed")
                                        << (drop.on ? ", dropout" : ""));
      // Forward.
      std::vector<float> o1(dout.size()), o2(dout.size());
      std::vector<float> k1(kept ? rows * c.S : 0), k2(k1.size());
      std::vector<float> s1(kept ? 2 * rows : 0), s2(s1.size());
      kernels::AttentionFn<> f1{qkv.data(), o1.data(), a,
                                kept ? k1.data() : nullptr,
                                kept ? s1.data() : nullptr};
      kernels::AttentionFn<> f2{qkv.data(), o2.data(), a,
                                kept ? k2.data() : nullptr,
                                kept ? s2.data() : nullptr};
      f1.drop = f2.drop = drop;
      by_index(f1, rows);
      f2.range(0, rows / 2);
      f2.range(rows / 2, rows);
      expect_same_bits(o1, o2, "attention out");
      expect_same_bits(k1, k2, "attention keep");
      expect_same_bits(s1, s2, "attention stats");
      // Backward: dq, then dk and dv from the row statistics.
      std::vector<float> g1(qkv.size()), g2(qkv.size());
      std::vector<float> r1(2 * rows), r2(2 * rows), d1(rows), d2(rows);
      const float *keep = kept ? k1.data() : nullptr;
      const float *stats = kept ? s1.data() : nullptr;
      kernels::AttentionGradQFn<> q1{qkv.data(), dout.data(), g1.data(),
                                     r1.data(),  d1.data(),   a,
                                     keep,       stats};
      kernels::AttentionGradQFn<> q2{qkv.data(), dout.data(), g2.data(),
                                     r2.data(),  d2.data(),   a,
                                     keep,       stats};
      q1.drop = q2.drop = drop;
      by_index(q1, rows);
      q2.range(0, rows / 3);
      q2.range(rows / 3, rows);
      expect_same_bits(r1, r2, "grad row stats");
      expect_same_bits(d1, d2, "grad delta");
      const int64_t keys = c.B * c.KV * c.S;
      kernels::AttentionGradKVFn<> kv1{
          qkv.data(), dout.data(), r1.data(), d1.data(), g1.data(), a, keep};
      kernels::AttentionGradKVFn<> kv2{
          qkv.data(), dout.data(), r2.data(), d2.data(), g2.data(), a, keep};
      kv1.drop = kv2.drop = drop;
      by_index(kv1, keys);
      kv2.range(0, keys / 2);
      kv2.range(keys / 2, keys);
      expect_same_bits(g1, g2, "dqkv");
    }
  }
}

using test::narrow;
using test::widen;

/// The 16-bit values `ref` rounds to, widened back (to compare bits as
/// floats).
template <class T> std::vector<float> rounded(const std::vector<float> &ref) {
  return widen(narrow<T>(ref));
}

/// Attention on 16-bit qkv, dout and outputs: the GPU's per-row code (sums
/// in registers) and the host's ranges (each head widened, run by the fp32
/// tiles) both give the fp32 attention of the widened values rounded once,
/// and its fp32 statistics.
template <class T> void check_attention16() {
  struct Case {
    int64_t B, S, H, KV, D;
  };
  for (Case c : {Case{2, 7, 2, 2, 16}, Case{1, 19, 4, 2, 5},
                 Case{2, 13, 2, 1, 64}, Case{1, 9, 3, 3, 8}}) {
    kernels::AttnShape a{c.B,  c.S, c.H,
                         c.KV, c.D, 1.0f / std::sqrt((float)c.D)};
    const int64_t rows = c.B * c.H * c.S, keys = c.B * c.KV * c.S;
    auto qkv = narrow<T>(random_floats(c.B * c.S * a.width(), 7));
    auto dout = narrow<T>(random_floats(c.B * c.S * c.H * c.D, 8));
    auto qkvw = widen(qkv), doutw = widen(dout);
    for (int variant = 0; variant < 4; ++variant) {
      const bool kept = variant & 1;
      const kernels::AttnDropout drop =
          variant & 2 ? test_dropout() : kernels::AttnDropout{};
      SCOPED_TRACE(::testing::Message()
                   << (kept ? "kept" : "recomputed")
                   << (drop.on ? ", dropout" : "") << " S " << c.S << " H "
                   << c.H << " KV " << c.KV << " D " << c.D);
      // The fp32 reference on the widened values.
      std::vector<float> o(dout.size()), k(kept ? rows * c.S : 0),
          s(kept ? 2 * rows : 0);
      by_index(kernels::AttentionFn<>{qkvw.data(), o.data(), a,
                                      kept ? k.data() : nullptr,
                                      kept ? s.data() : nullptr, drop},
               rows);
      std::vector<float> g(qkv.size()), r(2 * rows), d(rows);
      const float *keep = kept ? k.data() : nullptr;
      const float *stats = kept ? s.data() : nullptr;
      by_index(kernels::AttentionGradQFn<>{qkvw.data(), doutw.data(), g.data(),
                                           r.data(), d.data(), a, keep, stats,
                                           drop},
               rows);
      by_index(kernels::AttentionGradKVFn<>{qkvw.data(), doutw.data(), r.data(),
                                            d.data(), g.data(), a, keep, drop},
               keys);
      for (bool host : {false, true}) {
        SCOPED_TRACE(host ? "host ranges" : "per row");
        std::vector<T> o16(dout.size()), g16(qkv.size());
        std::vector<float> k16(k.size()), s16(s.size()), r16(r.size()),
            d16(d.size());
        kernels::AttentionFn<T> f{qkv.data(), o16.data(), a,
                                  kept ? k16.data() : nullptr,
                                  kept ? s16.data() : nullptr};
        kernels::AttentionGradQFn<T> q{qkv.data(),
                                       dout.data(),
                                       g16.data(),
                                       r16.data(),
                                       d16.data(),
                                       a,
                                       kept ? k16.data() : nullptr,
                                       kept ? s16.data() : nullptr};
        kernels::AttentionGradKVFn<T> kv{qkv.data(),
                                         dout.data(),
                                         r16.data(),
                                         d16.data(),
                                         g16.data(),
                                         a,
                                         kept ? k16.data() : nullptr};
        f.drop = q.drop = kv.drop = drop;
        if (host) { // cut mid-head
          f.range(0, rows / 3);
          f.range(rows / 3, rows);
          q.range(0, rows / 2 + 1);
          q.range(rows / 2 + 1, rows);
          kv.range(0, keys / 3);
          kv.range(keys / 3, keys);
        } else {
          by_index(f, rows);
          by_index(q, rows);
          by_index(kv, keys);
        }
        expect_same_bits(widen(o16), rounded<T>(o), "out");
        expect_same_bits(k16, k, "keep");
        expect_same_bits(s16, s, "stats");
        expect_same_bits(r16, r, "grad row stats");
        expect_same_bits(d16, d, "grad delta");
        expect_same_bits(widen(g16), rounded<T>(g), "dqkv");
      }
    }
  }
}

TEST(HostRanges, AttentionIn16BitsRoundsTheFp32Result) {
  check_attention16<kernels::bf16_t>();
  check_attention16<kernels::f16_t>();
}

} // namespace
