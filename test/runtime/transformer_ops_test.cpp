// Transformer ops of planrt.h on the host backend: forward ops against
// straightforward double-precision references, backward ops against central
// finite differences (in double) of a scalar function of those references.
#include "planrt/internal.h"
#include "planrt/planrt.h"

#include "context_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace planrt;

namespace {

using Vec = std::vector<double>;

class OpsTest : public test::ContextTest {
protected:
  OpsTest() : ContextTest("ops", 4321) {}

  Tensor *random_ids(std::vector<int64_t> shape, int32_t limit) {
    Tensor *t = make(shape);
    std::uniform_int_distribution<int32_t> dist(0, limit - 1);
    std::vector<int32_t> v((size_t)t->numel());
    for (auto &e : v)
      e = dist(rng);
    t->dtype = I32;
    internal::from_host_ids(ctx, t, v);
    return t;
  }
  Vec host(const Tensor *t) {
    auto v = internal::to_host(ctx, t);
    return Vec(v.begin(), v.end());
  }
};

void expect_close(const Vec &got, const Vec &want, double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i]))
        << "at index " << i;
}

/// max |got - want| / max |want| < tol.
void expect_grad(const Vec &got, const Vec &want, double tol = 1e-3) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(want[i]));
    double e = std::fabs(got[i] - want[i]);
    if (e > err) {
      err = e;
      worst = i;
    }
  }
  ASSERT_GT(scale, 0.0) << "reference gradient is zero";
  EXPECT_LT(err / scale, tol) << "worst index " << worst << ": got "
                              << got[worst] << ", want " << want[worst];
}

/// d/dx of sum(w * f(x)) by central differences in double.
Vec fd_grad(const std::function<Vec(const Vec &)> &f, Vec x, const Vec &w,
            double h = 1e-5) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double xi = x[i];
    x[i] = xi + h;
    Vec up = f(x);
    x[i] = xi - h;
    Vec down = f(x);
    x[i] = xi;
    double s = 0;
    for (size_t j = 0; j < w.size(); ++j)
      s += w[j] * (up[j] - down[j]);
    g[i] = s / (2 * h);
  }
  return g;
}

//===--- Double-precision references --------------------------------------===//

Vec softmax_ref(const Vec &x, int64_t c) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / c; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < c; ++j)
      m = std::max(m, x[r * c + j]);
    for (int64_t j = 0; j < c; ++j)
      s += std::exp(x[r * c + j] - m);
    for (int64_t j = 0; j < c; ++j)
      y[r * c + j] = std::exp(x[r * c + j] - m) / s;
  }
  return y;
}

Vec silu_ref(const Vec &x) {
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = x[i] / (1 + std::exp(-x[i]));
  return y;
}

/// LayerNorm (beta non-empty) or RMSNorm (beta empty) over rows of c.
Vec norm_ref(const Vec &x, const Vec &gamma, const Vec &beta, int64_t c,
             double eps) {
  Vec y(x.size());
  bool layer = !beta.empty();
  for (size_t r = 0; r < x.size() / c; ++r) {
    const double *xr = &x[r * c];
    double mu = 0, var = 0;
    if (layer) {
      for (int64_t j = 0; j < c; ++j)
        mu += xr[j];
      mu /= c;
    }
    for (int64_t j = 0; j < c; ++j)
      var += (xr[j] - mu) * (xr[j] - mu);
    var /= c;
    for (int64_t j = 0; j < c; ++j)
      y[r * c + j] = (xr[j] - mu) / std::sqrt(var + eps) * gamma[j] +
                     (layer ? beta[j] : 0.0);
  }
  return y;
}

/// Causal GQA attention on qkv [B, S, (H + 2 KV) D] -> [B, S, H D].
Vec attention_ref(const Vec &qkv, int64_t B, int64_t S, int64_t H, int64_t KV,
                  int64_t D) {
  int64_t W = (H + 2 * KV) * D;
  Vec out((size_t)(B * S * H * D));
  double sc = 1 / std::sqrt((double)D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      int64_t g = h / (H / KV);
      for (int64_t t = 0; t < S; ++t) {
        Vec s(t + 1);
        double m = -INFINITY, z = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double d = 0;
          for (int64_t i = 0; i < D; ++i)
            d += qkv[(b * S + t) * W + h * D + i] *
                 qkv[(b * S + u) * W + (H + g) * D + i];
          s[u] = d * sc;
          m = std::max(m, s[u]);
        }
        for (int64_t u = 0; u <= t; ++u)
          z += (s[u] = std::exp(s[u] - m));
        for (int64_t i = 0; i < D; ++i) {
          double o = 0;
          for (int64_t u = 0; u <= t; ++u)
            o += s[u] / z * qkv[(b * S + u) * W + (H + KV + g) * D + i];
          out[(b * S + t) * H * D + h * D + i] = o;
        }
      }
    }
  return out;
}

/// sum over rows of logsumexp(row) - row[target], times scale.
double cross_entropy_ref(const Vec &logits, const std::vector<int32_t> &tgt,
                         int64_t c, double scale) {
  double total = 0;
  for (size_t r = 0; r < tgt.size(); ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < c; ++j)
      m = std::max(m, logits[r * c + j]);
    for (int64_t j = 0; j < c; ++j)
      s += std::exp(logits[r * c + j] - m);
    double log_softmax_t = logits[r * c + tgt[r]] - m - std::log(s);
    total -= log_softmax_t;
  }
  return scale * total;
}

Vec matmul_ref(const Vec &a, const Vec &b, int64_t m, int64_t n, int64_t k,
               bool ta, bool tb) {
  Vec c((size_t)(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += (ta ? a[p * m + i] : a[i * k + p]) *
             (tb ? b[j * k + p] : b[p * n + j]);
      c[i * n + j] = s;
    }
  return c;
}

//===--- matmul on rank-3 operands ----------------------------------------===//

TEST_F(OpsTest, MatmulRank3Linear) {
  const int64_t B = 2, S = 3, K = 5, N = 4;
  Tensor *x = random({B, S, K}), *w = random({K, N}), *y = make({B, S, N});
  matmul(ctx, x, w, y, false, false);
  expect_close(host(y), matmul_ref(host(x), host(w), B * S, N, K, 0, 0), 1e-5,
               1e-6);
  // dX = dY @ W^T.
  Tensor *dy = random({B, S, N}), *dx = make({B, S, K});
  matmul(ctx, dy, w, dx, false, true);
  expect_close(host(dx), matmul_ref(host(dy), host(w), B * S, K, N, 0, 1), 1e-5,
               1e-6);
  // dW = X^T @ dY, contracting over B * S.
  Tensor *dw = make({K, N});
  matmul(ctx, x, dy, dw, true, false);
  expect_close(host(dw), matmul_ref(host(x), host(dy), K, N, B * S, 1, 0), 1e-5,
               1e-6);
  // Rank-3 output of a rank-3 x rank-2 product with transposed b.
  Tensor *wt = random({N, K}), *y2 = make({B, S, N});
  matmul(ctx, x, wt, y2, false, true);
  expect_close(host(y2), matmul_ref(host(x), host(wt), B * S, N, K, 0, 1), 1e-5,
               1e-6);
  // Mismatched contraction.
  Tensor *bad = random({K + 1, N});
  EXPECT_DEATH(matmul(ctx, x, bad, y, false, false),
               "planrt: error: matmul: shape mismatch");
}

//===--- Element-wise -----------------------------------------------------===//

TEST_F(OpsTest, MulSubScaleFill) {
  Tensor *a = random({3, 2, 5}), *b = random({3, 2, 5}), *o = make({3, 2, 5});
  Vec av = host(a), bv = host(b), want(av.size());
  mul(ctx, a, b, o);
  for (size_t i = 0; i < av.size(); ++i)
    want[i] = av[i] * bv[i];
  expect_close(host(o), want, 1e-7, 0);
  sub(ctx, a, b, o);
  for (size_t i = 0; i < av.size(); ++i)
    want[i] = av[i] - bv[i];
  expect_close(host(o), want, 1e-7, 0);
  scale(ctx, a, o, -2.5f);
  for (size_t i = 0; i < av.size(); ++i)
    want[i] = -2.5 * av[i];
  expect_close(host(o), want, 1e-7, 0);
  fill(ctx, o, 0.75f);
  expect_close(host(o), Vec(av.size(), 0.75), 0, 0);
  Tensor *t = ids({4}, {1, 2, 3, 4});
  fill(ctx, t, 7.0f);
  EXPECT_EQ(internal::to_host_ids(ctx, t), std::vector<int32_t>(4, 7));
  EXPECT_DEATH(mul(ctx, a, random({3, 5, 2}), o),
               "planrt: error: mul: .* different shapes");
}

TEST_F(OpsTest, ViewSharesData) {
  Tensor *a = random({2, 3, 4});
  Tensor *v = view(ctx, a, 2, 6, 4, 1, 1);
  EXPECT_EQ(v->data, a->data);
  EXPECT_EQ(v->ndim, 2);
  EXPECT_EQ(v->shape[0], 6);
  EXPECT_EQ(v->shape[1], 4);
  EXPECT_EQ(host(v), host(a));
  Tensor *i = ids({2, 3}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(view(ctx, i, 1, 6, 1, 1, 1)->dtype, I32);
  EXPECT_DEATH(view(ctx, a, 2, 5, 5, 1, 1),
               "planrt: error: view: cannot view \\[2, 3, 4\\]");
}

TEST_F(OpsTest, SiluAndGrad) {
  Tensor *x = random({3, 7}, -4.0f, 4.0f), *y = make({3, 7});
  silu(ctx, x, y);
  Vec xv = host(x);
  expect_close(host(y), silu_ref(xv), 1e-6, 1e-7);
  Tensor *w = random({3, 7}), *dx = make({3, 7});
  silu_grad(ctx, x, w, dx);
  expect_grad(host(dx), fd_grad(silu_ref, xv, host(w)));
  // Large magnitudes stay finite.
  Tensor *big = make({4});
  internal::from_host(ctx, big, {-200.0f, -90.0f, 90.0f, 200.0f});
  Tensor *yb = make({4});
  silu(ctx, big, yb);
  expect_close(host(yb), {0.0, 0.0, 90.0, 200.0}, 1e-6, 1e-6);
}

TEST_F(OpsTest, SoftmaxAndGrad) {
  const int64_t C = 6;
  Tensor *x = random({2, 3, C}, -3.0f, 3.0f), *y = make({2, 3, C});
  softmax(ctx, x, y);
  Vec xv = host(x);
  expect_close(host(y), softmax_ref(xv, C), 1e-6, 1e-7);
  Tensor *w = random({2, 3, C}), *dx = make({2, 3, C});
  softmax_grad(ctx, y, w, dx);
  expect_grad(host(dx), fd_grad([&](const Vec &v) { return softmax_ref(v, C); },
                                xv, host(w)));
  // Stable for large logits.
  Tensor *big = make({1, 3}), *yb = make({1, 3});
  internal::from_host(ctx, big, {1000.0f, 999.0f, -1000.0f});
  softmax(ctx, big, yb);
  expect_close(host(yb), softmax_ref({1000, 999, -1000}, 3), 1e-6, 1e-7);
}

//===--- Embeddings -------------------------------------------------------===//

TEST_F(OpsTest, EmbeddingAndGrad) {
  const int64_t B = 2, S = 4, V = 5, C = 3;
  // Repeated ids exercise the scatter-add.
  std::vector<int32_t> iv = {0, 3, 3, 1, 4, 3, 0, 2};
  Tensor *id = ids({B, S}, iv), *table = random({V, C});
  Tensor *out = make({B, S, C});
  embedding(ctx, id, table, out, -1);
  Vec tv = host(table), want((size_t)(B * S * C));
  for (int64_t r = 0; r < B * S; ++r)
    for (int64_t c = 0; c < C; ++c)
      want[r * C + c] = tv[iv[r] * C + c];
  expect_close(host(out), want, 0, 0);

  Tensor *w = random({B, S, C}), *dtable = random({V, C}); // overwritten
  embedding_grad(ctx, id, w, dtable, -1);
  auto f = [&](const Vec &t) {
    Vec o((size_t)(B * S * C));
    for (int64_t r = 0; r < B * S; ++r)
      for (int64_t c = 0; c < C; ++c)
        o[r * C + c] = t[iv[r] * C + c];
    return o;
  };
  expect_grad(host(dtable), fd_grad(f, tv, host(w)));

  // embedding_grad_add adds the same scatter to what the table holds (the
  // tied LM head's gradient): the result is start + the scatter above;
  // rows no id names keep start bit for bit.
  Tensor *acc = random({V, C});
  Vec start = host(acc), scatter = host(dtable);
  embedding_grad_add(ctx, id, w, acc, -1);
  Vec got = host(acc), sum((size_t)(V * C));
  for (size_t i = 0; i < sum.size(); ++i)
    sum[i] = start[i] + scatter[i];
  expect_close(got, sum, 1e-6f, 1e-6f);
  for (int64_t c = 0; c < C; ++c) // row 3 is named three times
    EXPECT_NE(got[3 * C + c], start[3 * C + c]);
  Tensor *untouched = random({V + 2, C});
  Vec before = host(untouched);
  embedding_grad_add(ctx, id, w, untouched, -1);
  Vec after = host(untouched);
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(after[5 * C + c], before[5 * C + c]);
    EXPECT_EQ(after[6 * C + c], before[6 * C + c]);
  }
  EXPECT_DEATH(embedding_grad_add(ctx, ids({B, S}, {0, 0, 9, 0, 0, 0, 0, 0}), w,
                                  acc, -1),
               "planrt: error: embedding_grad_add: token id 9 out of range");

  Tensor *bad = ids({B, S}, {0, 1, 2, 5, 0, 0, 0, 0});
  EXPECT_DEATH(embedding(ctx, bad, table, out, -1),
               "planrt: error: embedding: token id 5 out of range \\[0, 5\\)");
  EXPECT_DEATH(embedding_grad(ctx, ids({B, S}, {0, 0, -1, 0, 0, 0, 0, 0}), w,
                              dtable, -1),
               "planrt: error: embedding_grad: token id -1 out of range");
  Tensor *fids = random({B, S});
  EXPECT_DEATH(embedding(ctx, fids, table, out, -1),
               "planrt: error: embedding: ids \\[2, 4\\] must be i32, got f32");
  EXPECT_DEATH(embedding(ctx, id, table, make({B, S, C + 1}), -1),
               "planrt: error: embedding: out \\[2, 4, 4\\] must be ids");
}

TEST_F(OpsTest, PosEmbeddingAndGrad) {
  const int64_t B = 2, S = 3, T = 5, C = 4;
  Tensor *x = random({B, S, C}), *table = random({T, C}),
         *out = make({B, S, C});
  pos_embedding(ctx, x, table, out);
  Vec xv = host(x), tv = host(table), want(xv.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t c = 0; c < C; ++c)
        want[(b * S + s) * C + c] = xv[(b * S + s) * C + c] + tv[s * C + c];
  expect_close(host(out), want, 1e-7, 0);

  Tensor *w = random({B, S, C}), *dtable = random({T, C});
  pos_embedding_grad(ctx, w, dtable);
  auto f = [&](const Vec &t) {
    Vec o(xv.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t c = 0; c < C; ++c)
          o[(b * S + s) * C + c] = xv[(b * S + s) * C + c] + t[s * C + c];
    return o;
  };
  Vec fd = fd_grad(f, tv, host(w)), got = host(dtable);
  expect_grad(got, fd);
  for (int64_t i = S * C; i < T * C; ++i)
    EXPECT_EQ(got[i], 0.0) << "row >= S at " << i;
  EXPECT_DEATH(pos_embedding(ctx, random({B, 6, C}), table, make({B, 6, C})),
               "planrt: error: pos_embedding: .* S \\* 1 <= T");
}

//===--- Norms ------------------------------------------------------------===//

TEST_F(OpsTest, LayerNormAndGrad) {
  const int64_t B = 2, S = 3, C = 8;
  const float eps = 1e-5f;
  Tensor *x = random({B, S, C}, -2.0f, 2.0f), *gamma = random({C}),
         *beta = random({C}), *y = make({B, S, C});
  layernorm(ctx, x, gamma, beta, y, eps);
  Vec xv = host(x), gv = host(gamma), bv = host(beta);
  expect_close(host(y), norm_ref(xv, gv, bv, C, eps), 1e-5, 1e-5);

  Tensor *w = random({B, S, C}), *dx = make({B, S, C}), *dg = random({C}),
         *db = random({C});
  layernorm_grad(ctx, x, gamma, w, dx, dg, db, eps);
  Vec wv = host(w);
  expect_grad(host(dx),
              fd_grad([&](const Vec &v) { return norm_ref(v, gv, bv, C, eps); },
                      xv, wv));
  expect_grad(host(dg),
              fd_grad([&](const Vec &v) { return norm_ref(xv, v, bv, C, eps); },
                      gv, wv));
  expect_grad(host(db),
              fd_grad([&](const Vec &v) { return norm_ref(xv, gv, v, C, eps); },
                      bv, wv));
  EXPECT_DEATH(layernorm(ctx, x, random({C + 1}), beta, y, eps),
               "planrt: error: layernorm: gamma \\[9\\] must have 8 elements");
}

TEST_F(OpsTest, RmsNormAndGrad) {
  const int64_t B = 2, S = 4, C = 5;
  const float eps = 1e-6f;
  Tensor *x = random({B, S, C}, -2.0f, 2.0f), *gamma = random({C}),
         *y = make({B, S, C});
  rmsnorm(ctx, x, gamma, y, eps);
  Vec xv = host(x), gv = host(gamma);
  expect_close(host(y), norm_ref(xv, gv, {}, C, eps), 1e-5, 1e-6);

  Tensor *w = random({B, S, C}), *dx = make({B, S, C}), *dg = random({C});
  rmsnorm_grad(ctx, x, gamma, w, dx, dg, eps);
  Vec wv = host(w);
  expect_grad(host(dx),
              fd_grad([&](const Vec &v) { return norm_ref(v, gv, {}, C, eps); },
                      xv, wv));
  expect_grad(host(dg),
              fd_grad([&](const Vec &v) { return norm_ref(xv, v, {}, C, eps); },
                      gv, wv));
}

//===--- Attention --------------------------------------------------------===//

struct AttnCase {
  int64_t B, S, H, KV, D;
};

TEST_F(OpsTest, AttentionMatchesReference) {
  for (AttnCase c : {AttnCase{2, 5, 2, 2, 3}, AttnCase{2, 6, 4, 2, 4},
                     AttnCase{1, 7, 4, 1, 2}, AttnCase{3, 1, 2, 1, 5}}) {
    SCOPED_TRACE(testing::Message() << "H=" << c.H << " KV=" << c.KV
                                    << " S=" << c.S << " D=" << c.D);
    int64_t W = (c.H + 2 * c.KV) * c.D;
    Tensor *qkv = random({c.B, c.S, W}, -2.0f, 2.0f);
    Tensor *out = make({c.B, c.S, c.H * c.D});
    attention(ctx, qkv, out, c.H, c.KV);
    expect_close(host(out), attention_ref(host(qkv), c.B, c.S, c.H, c.KV, c.D),
                 1e-5, 1e-6);
  }
}

TEST_F(OpsTest, AttentionIsCausal) {
  const int64_t B = 2, S = 6, H = 4, KV = 2, D = 3, W = (H + 2 * KV) * D;
  Tensor *qkv = random({B, S, W}), *out = make({B, S, H * D});
  attention(ctx, qkv, out, H, KV);
  Vec before = host(out), q = host(qkv);
  for (int64_t t = 0; t + 1 < S; ++t) {
    // Change every position > t (queries, keys and values).
    std::vector<float> changed(q.begin(), q.end());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t u = t + 1; u < S; ++u)
        for (int64_t i = 0; i < W; ++i)
          changed[(b * S + u) * W + i] += 0.5f + 0.1f * (float)i;
    Tensor *q2 = make({B, S, W}), *o2 = make({B, S, H * D});
    internal::from_host(ctx, q2, changed);
    attention(ctx, q2, o2, H, KV);
    Vec after = host(o2);
    bool later_changed = false;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t u = 0; u < S; ++u)
        for (int64_t i = 0; i < H * D; ++i) {
          size_t k = (size_t)((b * S + u) * H * D + i);
          if (u <= t)
            ASSERT_EQ(after[k], before[k]) << "t=" << t << " u=" << u;
          else
            later_changed |= after[k] != before[k];
        }
    EXPECT_TRUE(later_changed);
  }
}

TEST_F(OpsTest, AttentionGradMatchesFiniteDifferences) {
  for (AttnCase c : {AttnCase{2, 4, 2, 2, 3}, AttnCase{2, 5, 2, 1, 3},
                     AttnCase{2, 3, 4, 2, 2}}) {
    SCOPED_TRACE(testing::Message() << "H=" << c.H << " KV=" << c.KV
                                    << " S=" << c.S << " D=" << c.D);
    int64_t W = (c.H + 2 * c.KV) * c.D;
    Tensor *qkv = random({c.B, c.S, W}, -1.5f, 1.5f);
    Tensor *w = random({c.B, c.S, c.H * c.D});
    Tensor *dqkv = random({c.B, c.S, W}); // overwritten
    attention_grad(ctx, qkv, w, dqkv, c.H, c.KV);
    expect_grad(host(dqkv), fd_grad(
                                [&](const Vec &v) {
                                  return attention_ref(v, c.B, c.S, c.H, c.KV,
                                                       c.D);
                                },
                                host(qkv), host(w)));
  }
}

// recompute = none keeps the exponentials and row statistics; the backward
// that reads them gives the same bits as the one that recomputes them, and
// so does the forward.
TEST_F(OpsTest, AttentionKeptEqualsRecomputedBitForBit) {
  for (AttnCase c : {AttnCase{2, 5, 2, 2, 3}, AttnCase{2, 6, 4, 2, 4},
                     AttnCase{1, 7, 4, 1, 2}}) {
    SCOPED_TRACE(testing::Message() << "H=" << c.H << " KV=" << c.KV
                                    << " S=" << c.S << " D=" << c.D);
    int64_t W = (c.H + 2 * c.KV) * c.D;
    Tensor *qkv = random({c.B, c.S, W}, -2.0f, 2.0f);
    Tensor *dout = random({c.B, c.S, c.H * c.D});
    Tensor *out = make({c.B, c.S, c.H * c.D}),
           *out2 = make({c.B, c.S, c.H * c.D});
    Tensor *keep = make({c.B, c.H, c.S, c.S}),
           *stats = make({c.B, c.H, c.S, 2});
    attention(ctx, qkv, out, c.H, c.KV);
    attention_keep(ctx, qkv, out2, keep, stats, c.H, c.KV);
    EXPECT_EQ(host(out), host(out2));
    Tensor *d1 = make({c.B, c.S, W}), *d2 = make({c.B, c.S, W});
    attention_grad(ctx, qkv, dout, d1, c.H, c.KV);
    attention_grad_kept(ctx, qkv, keep, stats, dout, d2, c.H, c.KV);
    EXPECT_EQ(host(d1), host(d2));
    // The kept values are the forward's softmax numerators: each row's e
    // sum to its statistic, and e / sum are probabilities.
    Vec e = host(keep), st = host(stats);
    for (int64_t row = 0; row < c.B * c.H * c.S; ++row) {
      int64_t t = row % c.S;
      double sum = 0;
      for (int64_t u = 0; u <= t; ++u)
        sum += e[row * c.S + u];
      EXPECT_NEAR(sum, st[2 * row + 1], 1e-5 * sum) << "row " << row;
    }
  }
  Tensor *qkv = random({2, 3, 12}), *out = make({2, 3, 6});
  EXPECT_DEATH(attention_keep(ctx, qkv, out, make({2, 2, 3, 2}),
                              make({2, 2, 3, 2}), 2, 1),
               "planrt: error: attention_keep: keep \\[2, 2, 3, 2\\] and "
               "stats \\[2, 2, 3, 2\\] must have 36 and 24 elements");
}

TEST_F(OpsTest, AttentionRejectsBadShapes) {
  Tensor *qkv = random({2, 3, 12}), *out = make({2, 3, 6});
  EXPECT_DEATH(attention(ctx, qkv, out, 3, 2),
               "planrt: error: attention: num_heads \\(3\\) must be a "
               "positive multiple of num_kv_heads \\(2\\)");
  EXPECT_DEATH(attention(ctx, random({2, 3, 13}), out, 2, 1),
               "planrt: error: attention: the last dim of qkv");
  EXPECT_DEATH(attention(ctx, qkv, make({2, 3, 5}), 2, 1),
               "planrt: error: attention: out \\[2, 3, 5\\] must be "
               "\\[2, 3, 6\\]");
}

//===--- Cross-entropy ----------------------------------------------------===//

TEST_F(OpsTest, CrossEntropyAndGrad) {
  const int64_t B = 2, S = 3, V = 7;
  std::vector<int32_t> tv = {0, 6, 3, 3, 1, 5};
  Tensor *logits = random({B, S, V}, -3.0f, 3.0f), *tgt = ids({B, S}, tv);
  Tensor *loss = make({});
  const float sc = 1.0f / (B * S);
  cross_entropy(ctx, logits, tgt, loss, sc);
  Vec lv = host(logits);
  expect_close(host(loss), {cross_entropy_ref(lv, tv, V, sc)}, 1e-5, 0);

  Tensor *dl = make({B, S, V});
  cross_entropy_grad(ctx, logits, tgt, dl, sc);
  expect_grad(host(dl), fd_grad(
                            [&](const Vec &v) {
                              return Vec{cross_entropy_ref(v, tv, V, sc)};
                            },
                            lv, {1.0}));

  // Stable for large logits.
  Tensor *big = make({1, 3}), *t1 = ids({1}, {2});
  internal::from_host(ctx, big, {500.0f, -500.0f, 499.0f});
  cross_entropy(ctx, big, t1, loss, 1.0f);
  expect_close(host(loss), {cross_entropy_ref({500, -500, 499}, {2}, 3, 1)},
               1e-6, 1e-6);

  EXPECT_DEATH(
      cross_entropy(ctx, logits, ids({B, S}, {0, 0, 7, 0, 0, 0}), loss, sc),
      "planrt: error: cross_entropy: target 7 out of range "
      "\\[0, 7\\)");
  EXPECT_DEATH(
      cross_entropy_grad(ctx, logits, ids({B, S}, {0, 0, 0, 0, -2, 0}), dl, sc),
      "planrt: error: cross_entropy_grad: target -2 out of range");
  EXPECT_DEATH(cross_entropy(ctx, logits, ids({B * S}, tv), loss, sc),
               "planrt: error: cross_entropy: targets \\[6\\] must have the "
               "shape of logits");
}

//===--- Gradient norms ---------------------------------------------------===//

TEST_F(OpsTest, SumsqClipAndReport) {
  // More than one reduction chunk in the first gradient.
  Tensor *g1 = random({1500}), *g2 = random({3, 4}), *acc = make({});
  fill(ctx, acc, 0.0f);
  sumsq_accumulate(ctx, g1, acc);
  sumsq_accumulate(ctx, g2, acc);
  Vec v1 = host(g1), v2 = host(g2);
  double ss = 0;
  for (double v : v1)
    ss += v * v;
  for (double v : v2)
    ss += v * v;
  expect_close(host(acc), {ss}, 1e-5, 0);

  report_grad_norm(ctx, acc);
  EXPECT_NEAR(internal::reported_grad_norm(ctx), std::sqrt(ss),
              1e-5 * std::sqrt(ss));
  std::string line = internal::step_line(ctx, 3, 10, 1.5);
  EXPECT_NE(line.find("| grad norm "), std::string::npos) << line;
  EXPECT_EQ(line.rfind("step 3/10 | loss ", 0), 0u) << line;

  // Clipping to half the norm scales by max_norm / (norm + 1e-6).
  double norm = std::sqrt(ss), max_norm = norm / 2;
  clip_by_global_norm(ctx, g2, acc, (float)max_norm);
  Vec want(v2.size());
  for (size_t i = 0; i < v2.size(); ++i)
    want[i] = v2[i] * max_norm / (norm + 1e-6);
  expect_close(host(g2), want, 1e-5, 0);
  // A norm below max_norm leaves the gradient unchanged.
  clip_by_global_norm(ctx, g1, acc, (float)(norm * 2));
  expect_close(host(g1), v1, 0, 0);

  // The next step forgets the reported norm.
  internal::begin_step(ctx, 2);
  EXPECT_TRUE(std::isnan(internal::reported_grad_norm(ctx)));
  EXPECT_EQ(internal::step_line(ctx, 2, 10, 1.0).find("grad norm"),
            std::string::npos);
}

} // namespace
