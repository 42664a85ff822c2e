//===- moe_kernels.h - Mixture-of-experts kernel bodies -------------------===//
//
// Functors over one index each, like planrt/kernels.h: the host backend runs
// them in loops, the cuda backend in grid-stride kernels. fp32 (16-bit
// tensors are staged by the ops).
//
// The routed rows: token t's k-th choice is row i = t K + k. Rows are
// grouped by expert in row order (a stable counting sort): `slot[i]` is row
// i's place in the grouped order, `row[s]` the row at place s, and expert e
// owns places [first[e], first[e + 1]). Every output element is written by
// one invocation that reads in a fixed order, so the results do not depend
// on the number of threads or on the backend's scheduling.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_MOE_KERNELS_H
#define PLANRT_MOE_KERNELS_H

#include "planrt/kernels.h"

namespace planrt {
namespace kernels {

/// Token t's K experts with the largest logits, largest first (equal logits:
/// the lower index first). K passes over the row; K is small.
struct MoeTopkFn {
  const float *logits;
  int32_t *out;
  int64_t experts, k;
  PLANRT_HD void operator()(int64_t t) const {
    const float *l = logits + t * experts;
    int32_t *o = out + t * k;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int64_t p = 0; p < j; ++p)
          taken = taken || o[p] == e;
        if (!taken && (best < 0 || l[e] > l[best]))
          best = e;
      }
      o[j] = int32_t(best);
    }
  }
};

/// The softmax over the chosen logits of token t into g[0..k), from the
/// largest of them (so the exponentials are at most 1).
PLANRT_HD inline void moe_chosen_softmax(const float *l, const int32_t *idx,
                                         int64_t k, float *g) {
  float m = l[idx[0]];
  for (int64_t j = 1; j < k; ++j)
    m = l[idx[j]] > m ? l[idx[j]] : m;
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    g[j] = expf(l[idx[j]] - m);
    sum += g[j];
  }
  for (int64_t j = 0; j < k; ++j)
    g[j] /= sum;
}

/// The largest top_k the routing kernels take (they keep a token's gates
/// in registers).
constexpr int64_t kMoeMaxTopK = 32;

struct MoeGatesFn {
  const float *logits;
  const int32_t *experts;
  float *out;
  int64_t num_experts, k;
  PLANRT_HD void operator()(int64_t t) const {
    moe_chosen_softmax(logits + t * num_experts, experts + t * k, k,
                       out + t * k);
  }
};

/// d logits of the gates g = softmax(chosen logits): g_j (dg_j - sum g dg)
/// at the chosen experts, zero elsewhere.
struct MoeGatesGradFn {
  const float *logits;
  const int32_t *experts;
  const float *grad;
  float *out;
  int64_t num_experts, k;
  PLANRT_HD void operator()(int64_t t) const {
    const int32_t *idx = experts + t * k;
    const float *dg = grad + t * k;
    float g[kMoeMaxTopK];
    moe_chosen_softmax(logits + t * num_experts, idx, k, g);
    float dot = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      dot += g[j] * dg[j];
    float *o = out + t * num_experts;
    for (int64_t e = 0; e < num_experts; ++e)
      o[e] = 0.0f;
    for (int64_t j = 0; j < k; ++j)
      o[idx[j]] = g[j] * (dg[j] - dot);
  }
};

/// The grouping (one invocation): a stable counting sort of the n rows by
/// expert. Rows with an expert outside [0, E) get slot -1 and no place;
/// first[E] is then less than n, which the op reports.
struct MoeGroupFn {
  const int32_t *experts;
  int32_t *slot, *row, *first;
  int64_t n, num_experts;
  PLANRT_HD void operator()(int64_t) const {
    for (int64_t e = 0; e <= num_experts; ++e)
      first[e] = 0;
    for (int64_t i = 0; i < n; ++i)
      if (experts[i] >= 0 && experts[i] < num_experts)
        ++first[experts[i] + 1];
    for (int64_t e = 0; e < num_experts; ++e)
      first[e + 1] += first[e];
    // first[e] runs as a cursor through expert e's places, then is shifted
    // back to where they start.
    for (int64_t i = 0; i < n; ++i) {
      int32_t e = experts[i];
      if (e < 0 || e >= num_experts) {
        slot[i] = -1;
        continue;
      }
      slot[i] = first[e]++;
      row[slot[i]] = int32_t(i);
    }
    for (int64_t e = num_experts; e > 0; --e)
      first[e] = first[e - 1];
    first[0] = 0;
  }
};

/// xs[s, :] = x[row[s] / K, :]: the grouped rows' inputs (index: s d + c).
struct MoeGatherFn {
  const float *x;
  const int32_t *row;
  float *xs;
  int64_t d, k;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t s = i / d, c = i % d;
    xs[i] = x[(row[s] / k) * d + c];
  }
};

/// a = silu(a) * b in place (swiglu's hidden activation), or with `out`
/// into out.
struct MoeSwigluFn {
  float *a;
  const float *b;
  float *out;
  PLANRT_HD void operator()(int64_t i) const {
    (out ? out : a)[i] = Silu::value(a[i]) * b[i];
  }
};

/// b = gelu(b) (tanh form) in place, or with `out` into out.
struct MoeGeluFn {
  float *b;
  float *out;
  PLANRT_HD void operator()(int64_t i) const {
    (out ? out : b)[i] = GeluTanh::value(b[i]);
  }
};

/// swiglu's backward in place: from dh, a <- dh b silu'(a), b <- dh silu(a).
struct MoeSwigluGradFn {
  float *a, *b;
  const float *dh;
  PLANRT_HD void operator()(int64_t i) const {
    float av = a[i], bv = b[i], g = dh[i];
    a[i] = g * bv * Silu::deriv(av);
    b[i] = g * Silu::value(av);
  }
};

/// gelu's backward in place: b <- dh gelu'(b).
struct MoeGeluGradFn {
  float *b;
  const float *dh;
  PLANRT_HD void operator()(int64_t i) const {
    b[i] = dh[i] * GeluTanh::deriv(b[i]);
  }
};

/// out[t, c] = sum_k w[t, k] (ys[slot[t K + k], c] + ys2[...]) in k order
/// (w null: weights 1; ys2 null: none); index t d' + c.
struct MoeCombineFn {
  const float *ys, *ys2, *w;
  const int32_t *slot;
  float *out;
  int64_t d, k;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t t = i / d, c = i % d;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t s = slot[t * k + j];
      if (s < 0)
        continue;
      float v = ys[s * d + c];
      if (ys2)
        v += ys2[s * d + c];
      acc += (w ? w[t * k + j] : 1.0f) * v;
    }
    out[i] = acc;
  }
};

/// dgates[i] = dy[i / K, :] . ys[slot[i], :] (index: routed row i).
struct MoeGateGradFn {
  const float *dy, *ys;
  const int32_t *slot;
  float *dgates;
  int64_t d, k;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t s = slot[i];
    float acc = 0.0f;
    if (s >= 0)
      for (int64_t c = 0; c < d; ++c)
        acc += dy[(i / k) * d + c] * ys[s * d + c];
    dgates[i] = acc;
  }
};

/// dys[s, c] = gates[row[s]] dy[row[s] / K, c]: each grouped row's share of
/// the output gradient (index: s d + c).
struct MoeScatterGradFn {
  const float *dy, *gates;
  const int32_t *row;
  float *dys;
  int64_t d, k;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t s = i / d, c = i % d, r = row[s];
    dys[i] = gates[r] * dy[(r / k) * d + c];
  }
};

} // namespace kernels
} // namespace planrt

#endif
