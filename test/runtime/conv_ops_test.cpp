// Convolutional-network ops of planrt.h (lib/conv_impl.inc) on the host
// backend: conv2d and its gradients against a direct double-precision
// convolution (every option at once), pooling on hand-made inputs (the max's
// first-maximum rule, padding), the per-channel bias, batch and group norm
// against their definitions, and the argument checks.
#include "planrt/internal.h"
#include "planrt/planrt.h"

#include "context_fixture.h"

#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

using namespace planrt;

namespace {

class ConvOpsTest : public test::ContextTest {
protected:
  ConvOpsTest() : ContextTest("conv_ops", 99) {}
  std::vector<float> host(const Tensor *t) { return internal::to_host(ctx, t); }
  Tensor *with(std::vector<int64_t> shape, std::vector<float> v) {
    Tensor *t = make(shape);
    internal::from_host(ctx, t, v);
    return t;
  }
};

/// Channel ch's mean and the sum of squared deviations of x [n, c, inner]
/// (the sum divided by n inner is the biased variance).
std::pair<double, double> channel_moments(const std::vector<float> &x,
                                          int64_t n, int64_t c, int64_t inner,
                                          int64_t ch) {
  double m = 0, ss = 0;
  for (int64_t s = 0; s < n; ++s)
    for (int64_t k = 0; k < inner; ++k)
      m += x[(s * c + ch) * inner + k];
  m /= n * inner;
  for (int64_t s = 0; s < n; ++s)
    for (int64_t k = 0; k < inner; ++k)
      ss += std::pow(x[(s * c + ch) * inner + k] - m, 2);
  return {m, ss};
}

struct Geo {
  int64_t n = 2, c = 4, h = 7, w = 6, o = 6, kh = 3, kw = 2;
  int64_t sh = 2, sw = 1, ph = 1, pw = 2, dh = 2, dw = 1, groups = 2;
  int64_t ho() const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t wo() const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
};

/// y[n, o, i, j] by the definition, in double.
std::vector<double> conv_ref(const Geo &g, const std::vector<float> &x,
                             const std::vector<float> &w) {
  int64_t cg = g.c / g.groups, og = g.o / g.groups;
  std::vector<double> y((size_t)(g.n * g.o * g.ho() * g.wo()), 0.0);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.o; ++o)
      for (int64_t i = 0; i < g.ho(); ++i)
        for (int64_t j = 0; j < g.wo(); ++j) {
          double acc = 0;
          for (int64_t k = 0; k < cg; ++k)
            for (int64_t a = 0; a < g.kh; ++a)
              for (int64_t b = 0; b < g.kw; ++b) {
                int64_t ih = i * g.sh - g.ph + a * g.dh;
                int64_t iw = j * g.sw - g.pw + b * g.dw;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w)
                  continue;
                int64_t c = (o / og) * cg + k;
                acc += (double)x[((n * g.c + c) * g.h + ih) * g.w + iw] *
                       w[((o * cg + k) * g.kh + a) * g.kw + b];
              }
          y[((n * g.o + o) * g.ho() + i) * g.wo() + j] = acc;
        }
  return y;
}

void expect_close(const std::vector<float> &got,
                  const std::vector<double> &want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::fabs(want[i])))
        << "at index " << i;
}

TEST_F(ConvOpsTest, Conv2dMatchesTheDefinitionWithEveryOption) {
  Geo g;
  Tensor *x = random({g.n, g.c, g.h, g.w});
  Tensor *w = random({g.o, g.c / g.groups, g.kh, g.kw});
  Tensor *y = make({g.n, g.o, g.ho(), g.wo()});
  conv2d(ctx, x, w, y, g.dh, g.dw, g.groups, g.ph, g.pw, g.sh, g.sw);
  expect_close(host(y), conv_ref(g, host(x), host(w)), 1e-5);
}

// The gradients are the adjoints of the convolution: <dy, conv(x, w)> is
// linear in x and in w, so finite differences are exact up to rounding.
TEST_F(ConvOpsTest, Conv2dGradIsTheAdjoint) {
  Geo g;
  Tensor *x = random({g.n, g.c, g.h, g.w});
  Tensor *w = random({g.o, g.c / g.groups, g.kh, g.kw});
  Tensor *dy = random({g.n, g.o, g.ho(), g.wo()});
  Tensor *dx = make({g.n, g.c, g.h, g.w});
  Tensor *dw = make({g.o, g.c / g.groups, g.kh, g.kw});
  conv2d_grad(ctx, x, w, dy, dx, dw, g.dh, g.dw, g.groups, g.ph, g.pw, g.sh,
              g.sw);
  std::vector<float> hx = host(x), hw = host(w), hdy = host(dy);
  auto dot = [&](const std::vector<float> &xs, const std::vector<float> &ws) {
    std::vector<double> y = conv_ref(g, xs, ws);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i)
      s += y[i] * hdy[i];
    return s;
  };
  std::vector<float> gx = host(dx), gw = host(dw);
  for (size_t i = 0; i < hx.size(); i += 7) {
    std::vector<float> e(hx.size(), 0.0f);
    e[i] = 1.0f;
    EXPECT_NEAR(gx[i], dot(e, hw), 1e-5) << "dx at " << i;
  }
  for (size_t i = 0; i < hw.size(); i += 3) {
    std::vector<float> e(hw.size(), 0.0f);
    e[i] = 1.0f;
    EXPECT_NEAR(gw[i], dot(hx, e), 1e-4) << "dw at " << i;
  }
}

TEST_F(ConvOpsTest, MaxPoolTakesTheFirstMaximumAndSkipsPadding) {
  // One 3x3 channel with ties; kernel 2, stride 1, padding 1: 4x4 windows.
  Tensor *x = with({1, 1, 3, 3}, {-1, -1, -2, -3, -1, -4, -5, -6, -7});
  Tensor *y = make({1, 1, 4, 4});
  pool2d(ctx, x, y, 2, 2, "max", 1, 1, 1, 1);
  std::vector<float> want = {-1, -1, -1, -2, -1, -1, -1, -2,
                             -3, -1, -1, -4, -5, -5, -6, -7};
  EXPECT_EQ(host(y), want);
  // The gradient of each window goes to its first maximum only.
  Tensor *dy = with({1, 1, 4, 4}, std::vector<float>(16, 1.0f));
  Tensor *dx = make({1, 1, 3, 3});
  pool2d_grad(ctx, x, dy, dx, 2, 2, "max", 1, 1, 1, 1);
  std::vector<float> got = host(dx);
  EXPECT_EQ(got, (std::vector<float>{4, 2, 2, 1, 2, 1, 2, 1, 1}));
}

TEST_F(ConvOpsTest, AvgPoolDividesByTheWholeWindow) {
  Tensor *x = with({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor *y = make({1, 1, 2, 2});
  pool2d(ctx, x, y, 2, 2, "avg", 1, 1, 2, 2); // padding counts
  EXPECT_EQ(host(y), (std::vector<float>{0.25f, 0.5f, 0.75f, 1.0f}));
  Tensor *dy = with({1, 1, 2, 2}, {4, 8, 12, 16});
  Tensor *dx = make({1, 1, 2, 2});
  pool2d_grad(ctx, x, dy, dx, 2, 2, "avg", 1, 1, 2, 2);
  EXPECT_EQ(host(dx), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(ConvOpsTest, ChannelBiasAndItsGradient) {
  Tensor *x = with({2, 2, 1, 2}, {0, 1, 2, 3, 4, 5, 6, 7});
  Tensor *b = with({2}, {10, 20});
  Tensor *y = make({2, 2, 1, 2});
  channel_bias_add(ctx, x, b, y);
  EXPECT_EQ(host(y), (std::vector<float>{10, 11, 22, 23, 14, 15, 26, 27}));
  Tensor *db = make({2});
  channel_bias_grad(ctx, x, db);
  EXPECT_EQ(host(db), (std::vector<float>{0 + 1 + 4 + 5, 2 + 3 + 6 + 7}));
}

TEST_F(ConvOpsTest, BatchAndGroupNormFollowTheirDefinitions) {
  const int64_t n = 3, c = 4, inner = 5;
  Tensor *x = random({n, c, 1, inner}, -2.0f, 3.0f);
  Tensor *gamma = random({c}, 0.5f, 1.5f), *beta = random({c});
  Tensor *y = make({n, c, 1, inner});
  std::vector<float> hx = host(x), hg = host(gamma), hb = host(beta);
  // Batch norm: per channel over n and inner.
  batch_norm(ctx, x, gamma, beta, y, /*batch_axes=*/0, 1e-5f);
  std::vector<double> want(hx.size());
  for (int64_t ch = 0; ch < c; ++ch) {
    auto [m, ss] = channel_moments(hx, n, c, inner, ch);
    double v = ss / double(n * inner);
    for (int64_t s = 0; s < n; ++s)
      for (int64_t k = 0; k < inner; ++k) {
        size_t i = (s * c + ch) * inner + k;
        want[i] = hg[ch] * (hx[i] - m) / std::sqrt(v + 1e-5) + hb[ch];
      }
  }
  expect_close(host(y), want, 1e-5);
  // Group norm, 2 groups of 2 channels: per sample and group.
  group_norm(ctx, x, gamma, beta, y, 1e-5f, 2);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t grp = 0; grp < 2; ++grp) {
      size_t base = (s * c + grp * 2) * inner, cnt = 2 * inner;
      double m = 0, v = 0;
      for (size_t k = 0; k < cnt; ++k)
        m += hx[base + k];
      m /= cnt;
      for (size_t k = 0; k < cnt; ++k)
        v += std::pow(hx[base + k] - m, 2);
      v /= cnt;
      for (size_t k = 0; k < cnt; ++k) {
        int64_t ch = grp * 2 + k / inner;
        want[base + k] =
            hg[ch] * (hx[base + k] - m) / std::sqrt(v + 1e-5) + hb[ch];
      }
    }
  expect_close(host(y), want, 1e-5);
}

// Batch norm's running statistics (PyTorch's rule: the batch mean and the
// unbiased variance mixed in with weight momentum) from the sums of
// batch_norm_moments, and evaluation with them.
TEST_F(ConvOpsTest, RunningStatisticsAndEvaluationFollowTheirDefinitions) {
  const int64_t n = 3, c = 4, inner = 5;
  Tensor *x = random({n, c, 1, inner}, -2.0f, 3.0f);
  Tensor *gamma = random({c}, 0.5f, 1.5f), *beta = random({c});
  Tensor *mean = random({c}), *var = random({c}, 0.5f, 2.0f);
  Tensor *sum = make({c}), *sum_sq = make({c}), *y = make({n, c, 1, inner});
  std::vector<float> hx = host(x), hg = host(gamma), hb = host(beta);
  std::vector<float> hm = host(mean), hv = host(var);
  batch_norm_moments(ctx, x, sum, sum_sq);
  running_stats_update(ctx, mean, var, sum, sum_sq, n * inner, 0.3f);
  std::vector<double> want_mean(c), want_var(c), want_y(hx.size());
  for (int64_t ch = 0; ch < c; ++ch) {
    auto [m, ss] = channel_moments(hx, n, c, inner, ch);
    double v = ss / double(n * inner - 1); // unbiased
    want_mean[ch] = 0.7 * hm[ch] + 0.3 * m;
    want_var[ch] = 0.7 * hv[ch] + 0.3 * v;
  }
  expect_close(host(mean), want_mean, 1e-6);
  expect_close(host(var), want_var, 1e-6);
  std::vector<float> rm = host(mean), rv = host(var);
  batch_norm_infer(ctx, x, gamma, beta, mean, var, y, 1e-5f);
  for (size_t i = 0; i < hx.size(); ++i) {
    int64_t ch = (i / inner) % c;
    want_y[i] = hg[ch] * (hx[i] - rm[ch]) / std::sqrt(rv[ch] + 1e-5) + hb[ch];
  }
  expect_close(host(y), want_y, 1e-5);
  EXPECT_DEATH(running_stats_update(ctx, mean, var, sum, sum_sq, 1, 0.1f),
               "running_stats_update: count must be >= 2");
  EXPECT_DEATH(running_stats_update(ctx, mean, var, sum, sum_sq, 8, 1.5f),
               "running_stats_update: momentum must be in \\[0, 1\\], got 1.5");
  Tensor *g3 = random({3});
  EXPECT_DEATH(batch_norm_infer(ctx, x, gamma, beta, g3, var, y, 1e-5f),
               "batch_norm_infer: running_mean \\[3\\] must have 4 elements");
}

// The host backend splits each kernel's index range over the rank's threads
// (PLANRT_NUM_THREADS): every output is still computed by one invocation in
// a fixed order, so the bits do not depend on the thread count.
TEST_F(ConvOpsTest, AnyThreadCountGivesTheSameBits) {
  Geo g;
  g.n = 8; // enough work for the parallel path (4096 invocations and more)
  Tensor *x = random({g.n, g.c, g.h, g.w});
  Tensor *w = random({g.o, g.c / g.groups, g.kh, g.kw});
  Tensor *dy = random({g.n, g.o, g.ho(), g.wo()});
  Tensor *gamma = random({g.c}), *beta = random({g.c});
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    Tensor *y = make({g.n, g.o, g.ho(), g.wo()});
    Tensor *dx = make({g.n, g.c, g.h, g.w});
    Tensor *dw = make({g.o, g.c / g.groups, g.kh, g.kw});
    Tensor *bn = make({g.n, g.c, g.h, g.w});
    Tensor *p = make({g.n, g.c, 4, 3});
    conv2d(ctx, x, w, y, g.dh, g.dw, g.groups, g.ph, g.pw, g.sh, g.sw);
    conv2d_grad(ctx, x, w, dy, dx, dw, g.dh, g.dw, g.groups, g.ph, g.pw, g.sh,
                g.sw);
    batch_norm(ctx, x, gamma, beta, bn, 0, 1e-5f);
    pool2d(ctx, x, p, 2, 2, "max", 1, 0, 2, 2);
    std::vector<float> all;
    for (Tensor *t : {y, dx, dw, bn, p}) {
      std::vector<float> v = host(t);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  std::vector<float> one = run(1), three = run(3);
  omp_set_num_threads(1);
  ASSERT_EQ(one.size(), three.size());
  EXPECT_EQ(0,
            std::memcmp(one.data(), three.data(), one.size() * sizeof(float)));
}

TEST_F(ConvOpsTest, DropoutKeepsOneMinusPScaled) {
  const int64_t n = 1 << 16;
  Tensor *x = random({n}, 0.5f, 1.5f);
  Tensor *y = make({n}), *again = make({n}), *other = make({n});
  dropout(ctx, x, y, 0, 0, 0, 0, 0, 0, 0.25f, 7);
  dropout(ctx, x, again, 0, 0, 0, 0, 0, 0, 0.25f, 7);
  dropout(ctx, x, other, 0, 0, 0, 0, 0, 0, 0.25f, 8);
  std::vector<float> hx = host(x), hy = host(y), ha = host(again),
                     ho = host(other);
  int64_t kept = 0, same = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (hy[i] != 0.0f) {
      ++kept;
      ASSERT_EQ(hy[i], hx[i] * (1.0f / 0.75f)) << i;
    }
    same += (hy[i] != 0.0f) == (ho[i] != 0.0f);
  }
  EXPECT_NEAR((double)kept / n, 0.75, 0.01);
  EXPECT_EQ(hy, ha);                          // one uid, one mask
  EXPECT_NEAR((double)same / n, 0.625, 0.01); // another uid: independent
  Tensor *z = make({n});
  dropout(ctx, x, z, 0, 0, 0, 0, 0, 0, 0.0f, 7);
  EXPECT_EQ(host(z), hx); // p = 0 keeps everything unscaled
  EXPECT_DEATH(dropout(ctx, x, z, 0, 0, 0, 0, 0, 0, 1.0f, 7),
               "dropout: p must be in \\[0, 1\\), got 1");
}

TEST_F(ConvOpsTest, RejectsBadArguments) {
  Tensor *x = random({2, 4, 5, 5}), *w = random({6, 2, 3, 3});
  Tensor *y = make({2, 6, 3, 3}), *flat = random({2, 4});
  EXPECT_DEATH(conv2d(ctx, flat, w, y, 1, 1, 2, 0, 0, 1, 1),
               "conv2d: input must be NCHW \\(rank 4\\), got \\[2, 4\\]");
  EXPECT_DEATH(conv2d(ctx, x, w, y, 1, 1, 1, 0, 0, 1, 1),
               "conv2d: filter \\[6, 2, 3, 3\\] does not match input \\[2, "
               "4, 5, 5\\] with 1 groups");
  EXPECT_DEATH(conv2d(ctx, x, w, y, 1, 1, 2, 1, 1, 1, 1),
               "conv2d: output \\[2, 6, 3, 3\\] must be \\[2, 6, 5, 5\\]");
  EXPECT_DEATH(conv2d(ctx, x, w, y, 1, 1, 2, 0, 0, 0, 1),
               "conv2d: stride must be >= 1, got \\[0, 1\\]");
  EXPECT_DEATH(pool2d(ctx, x, y, 2, 2, "min", 0, 0, 2, 2),
               "pool2d: kind must be \"max\" or \"avg\", got \"min\"");
  EXPECT_DEATH(pool2d(ctx, x, y, 2, 2, "max", 2, 0, 2, 2),
               "pool2d: padding must be at most half the kernel");
  Tensor *g3 = random({3});
  EXPECT_DEATH(batch_norm(ctx, x, g3, g3, x, 0, 1e-5f),
               "batch_norm: gamma \\[3\\] must have 4 elements");
  EXPECT_DEATH(group_norm(ctx, x, g3, g3, x, 1e-5f, 3),
               "group_norm: groups \\(3\\) must divide the channels");
}

} // namespace
