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

/// A choice's expert: dropped choices (capacity) are written -(e + 1).
PLANRT_HD inline int32_t moe_expert(int32_t choice) {
  return choice < 0 ? -choice - 1 : choice;
}

/// The largest of a row's n logits and the sum of their exponentials from
/// it (a softmax's statistics: p[e] = expf(l[e] - m) / sum).
PLANRT_HD inline void moe_softmax_stats(const float *l, int64_t n, float &m,
                                        float &sum) {
  m = l[0];
  for (int64_t e = 1; e < n; ++e)
    m = l[e] > m ? l[e] : m;
  sum = 0.0f;
  for (int64_t e = 0; e < n; ++e)
    sum += expf(l[e] - m);
}

/// Token t's K experts with the largest scores, largest first (equal
/// scores: the lower index first); the score is the logit, or with `bias`
/// the softmax probability plus the expert's bias. K passes over the row;
/// K is small.
struct MoeTopkFn {
  const float *logits, *bias;
  int32_t *out;
  int64_t experts, k;
  PLANRT_HD float score(const float *l, int64_t e, float m, float sum) const {
    return bias ? expf(l[e] - m) / sum + bias[e] : l[e];
  }
  PLANRT_HD void operator()(int64_t t) const {
    const float *l = logits + t * experts;
    int32_t *o = out + t * k;
    float m = l[0], sum = 0.0f;
    if (bias)
      moe_softmax_stats(l, experts, m, sum);
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      float bestScore = 0.0f;
      for (int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int64_t p = 0; p < j; ++p)
          taken = taken || o[p] == e;
        if (taken)
          continue;
        float sc = score(l, e, m, sum);
        if (best < 0 || sc > bestScore) {
          best = e;
          bestScore = sc;
        }
      }
      o[j] = int32_t(best);
    }
  }
};

/// Capacity, per sequence q of `seq` tokens: walking its tokens in order
/// and each token's choices in order, an expert keeps at most `capacity`
/// of them; a choice beyond is written -(e + 1). `count` holds E ints per
/// sequence.
struct MoeCapacityFn {
  int32_t *choices, *count;
  int64_t seq, k, experts, capacity;
  PLANRT_HD void operator()(int64_t q) const {
    int32_t *c = count + q * experts;
    for (int64_t e = 0; e < experts; ++e)
      c[e] = 0;
    int32_t *ch = choices + q * seq * k;
    for (int64_t i = 0; i < seq * k; ++i) {
      int32_t e = ch[i];
      if (c[e] < capacity)
        ++c[e];
      else
        ch[i] = -e - 1;
    }
  }
};

/// The softmax over the chosen logits of token t into g[0..k), from the
/// largest of them (so the exponentials are at most 1).
PLANRT_HD inline void moe_chosen_softmax(const float *l, const int32_t *idx,
                                         int64_t k, float *g) {
  float m = l[moe_expert(idx[0])];
  for (int64_t j = 1; j < k; ++j) {
    float v = l[moe_expert(idx[j])];
    m = v > m ? v : m;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    g[j] = expf(l[moe_expert(idx[j])] - m);
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
      o[moe_expert(idx[j])] = g[j] * (dg[j] - dot);
  }
};

/// The grouping (one invocation): a stable counting sort of the n rows by
/// expert. Dropped rows (-(e + 1)) get slot -1 and no place; first[E] is
/// the number of kept rows, first[E + 1] the number of indices outside
/// [-E, E), which the op reports.
struct MoeGroupFn {
  const int32_t *experts;
  int32_t *slot, *row, *first;
  int64_t n, num_experts;
  // This rank's experts are [first_expert, first_expert + num_experts) of
  // all_experts (expert parallelism); choices of the others are left out
  // like dropped ones.
  int64_t first_expert, all_experts;
  /// The local expert of choice `x`, -1 for one left out, or -2 for an
  /// index that is no expert.
  PLANRT_HD int64_t local(int32_t x) const {
    if (x < -all_experts || x >= all_experts)
      return -2;
    int64_t e = int64_t(x) - first_expert;
    return x >= 0 && e >= 0 && e < num_experts ? e : -1;
  }
  PLANRT_HD void operator()(int64_t) const {
    for (int64_t e = 0; e <= num_experts + 1; ++e)
      first[e] = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t e = local(experts[i]);
      if (e >= 0)
        ++first[e + 1];
      else if (e == -2)
        ++first[num_experts + 1];
    }
    for (int64_t e = 0; e < num_experts; ++e)
      first[e + 1] += first[e];
    // first[e] runs as a cursor through expert e's places, then is shifted
    // back to where they start.
    for (int64_t i = 0; i < n; ++i) {
      int64_t e = local(experts[i]);
      if (e < 0) {
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

/// d logits of the per-sequence load-balancing loss (plan.moe_aux_grad),
/// one invocation per sequence q of `seq` tokens: its choices per expert
/// (dropped ones too) into count[q E + e], then for each token, through
/// the softmax, dP[e] = scale * count[e] with scale = coefficient /
/// sequences * E / (S K) / S.
struct MoeAuxGradFn {
  const float *logits;
  const int32_t *experts;
  int32_t *count;
  float *out;
  int64_t seq, k, num_experts;
  float scale;
  PLANRT_HD void operator()(int64_t q) const {
    int32_t *c = count + q * num_experts;
    for (int64_t e = 0; e < num_experts; ++e)
      c[e] = 0;
    const int32_t *ch = experts + q * seq * k;
    for (int64_t i = 0; i < seq * k; ++i)
      ++c[moe_expert(ch[i])];
    for (int64_t t = q * seq; t < (q + 1) * seq; ++t) {
      const float *l = logits + t * num_experts;
      float *o = out + t * num_experts;
      float m, sum;
      moe_softmax_stats(l, num_experts, m, sum);
      float dot = 0.0f;
      for (int64_t e = 0; e < num_experts; ++e)
        dot += expf(l[e] - m) / sum * (scale * float(c[e]));
      for (int64_t e = 0; e < num_experts; ++e) {
        float p = expf(l[e] - m) / sum;
        o[e] = p * (scale * float(c[e]) - dot);
      }
    }
  }
};

/// load[e] = how many of the n choices picked expert e (dropped or not).
struct MoeLoadFn {
  const int32_t *experts;
  float *load;
  int64_t n;
  PLANRT_HD void operator()(int64_t e) const {
    int64_t c = 0;
    for (int64_t i = 0; i < n; ++i)
      c += moe_expert(experts[i]) == e ? 1 : 0;
    load[e] = float(c);
  }
};

/// bias[e] += rate * sign(mean(load) - load[e]) (DeepSeek-V3).
struct MoeBiasUpdateFn {
  float *bias;
  const float *load;
  int64_t num_experts;
  float rate;
  PLANRT_HD void operator()(int64_t e) const {
    float sum = 0.0f;
    for (int64_t j = 0; j < num_experts; ++j)
      sum += load[j];
    float diff = sum / float(num_experts) - load[e];
    bias[e] += diff > 0.0f ? rate : diff < 0.0f ? -rate : 0.0f;
  }
};

//===--- Expert parallelism's routed exchange (all-to-all dispatcher) -----===//
//
// A group of G members (the ep axis) holds a tensor in blocks of `rows`
// rows, member m's block first at row m * rows; `choices` [G * rows, K] are
// the group's (gathered) choices. Row t is needed by member r when one of
// its choices is an expert of r's block of `per_rank` experts (dropped
// choices are not). routed_all_gather moves a row to the members that
// need it; routed_reduce_scatter moves a member's partial row back to the
// row's owner only where that member needed it (elsewhere its part is
// zero).

/// Whether group row `row` has a choice in member r's experts.
PLANRT_HD inline bool moe_needed(const int32_t *choices, int64_t k,
                                 int64_t per_rank, int64_t row, int64_t r) {
  for (int64_t j = 0; j < k; ++j) {
    int32_t c = choices[row * k + j];
    if (c >= 0 && c / per_rank == r)
      return true;
  }
  return false;
}

/// The routing of one exchange for member `member`. For every other
/// member r in order, the rows it sends to r: `send_rows` lists them
/// (all_gather: local rows of its block needed by r; reduce_scatter: rows
/// of r's block of the input that `member` needed), counts[r] how many.
/// For every other member s, counts[G + s] rows arrive from it, packed in
/// s's order: pos[s * rows + t] is row t's place among all rows received
/// (all_gather: row t of s's block, needed by `member`; reduce_scatter: row
/// t of member's own block, needed by s), -1 if none arrives; pos of the
/// member's own block is -1.
///
/// In three launches, over segments of kRouteChunk rows of one member's
/// block, sends first ((r, chunk) in order), then receipts ((s, chunk)):
/// count each segment's rows (MoeRouteCountFn), turn the counts into
/// offsets and the per-member counts (MoeRouteOffsetsFn, one invocation
/// over the 2 G chunks segments), and write each segment's rows
/// (MoeRouteFillFn). The lists are those of one walk in order.
constexpr int64_t kRouteChunk = workspace::kRouteChunk;
struct MoeRouting {
  const int32_t *choices;
  int64_t rows, k, group, member, per_rank;
  bool scatter;
  PLANRT_HD int64_t chunks() const {
    return (rows + kRouteChunk - 1) / kRouteChunk;
  }
  PLANRT_HD int64_t segments() const { return 2 * group * chunks(); }
  /// Whether row t of segment j's chunk moves (sent to, or received from,
  /// the segment's member).
  PLANRT_HD bool moves(int64_t j, int64_t t) const {
    int64_t n = chunks(), r = (j / n) % group;
    if (r == member)
      return false;
    bool send = j < group * n;
    // Sends: all_gather, the member's row needed by r; reduce_scatter, r's
    // row needed by the member. Receipts mirror them.
    int64_t owner = send == scatter ? r : member;
    int64_t needer = send == scatter ? member : r;
    return moe_needed(choices, k, per_rank, owner * rows + t, needer);
  }
  PLANRT_HD int64_t first(int64_t j) const {
    return (j % chunks()) * kRouteChunk;
  }
  PLANRT_HD int64_t last(int64_t j) const {
    int64_t e = first(j) + kRouteChunk;
    return e < rows ? e : rows;
  }
};

/// seg[j] = the rows of segment j that move.
struct MoeRouteCountFn {
  MoeRouting r;
  int64_t *seg;
  PLANRT_HD void operator()(int64_t j) const {
    int64_t n = 0;
    for (int64_t t = r.first(j); t < r.last(j); ++t)
      n += r.moves(j, t) ? 1 : 0;
    seg[j] = n;
  }
};

/// seg[j] = where segment j's rows start among the sent (or received)
/// rows; counts[r] and counts[G + s] the rows per member (one invocation).
struct MoeRouteOffsetsFn {
  MoeRouting r;
  int64_t *seg, *counts;
  PLANRT_HD void operator()(int64_t) const {
    int64_t n = r.chunks(), at[2] = {0, 0};
    for (int64_t m = 0; m < 2 * r.group; ++m)
      counts[m] = 0;
    for (int64_t j = 0; j < r.segments(); ++j) {
      int64_t side = j < r.group * n ? 0 : 1, c = seg[j];
      counts[side * r.group + (j / n) % r.group] += c;
      seg[j] = at[side];
      at[side] += c;
    }
  }
};

/// Segment j's rows into send_rows, or their places into pos.
struct MoeRouteFillFn {
  MoeRouting r;
  const int64_t *seg;
  int32_t *send_rows, *pos;
  PLANRT_HD void operator()(int64_t j) const {
    int64_t at = seg[j], m = (j / r.chunks()) % r.group;
    bool send = j < r.group * r.chunks();
    for (int64_t t = r.first(j); t < r.last(j); ++t) {
      bool moves = r.moves(j, t);
      if (send) {
        if (moves)
          send_rows[at++] = int32_t(r.scatter ? m * r.rows + t : t);
      } else {
        pos[m * r.rows + t] = moves ? int32_t(at++) : -1;
      }
    }
  }
};

/// The routed exchange's copies and sums work on pieces of kRoutedPiece
/// elements of a row (one index each: a row's piece p is row * pieces + p),
/// so that an index costs one division per piece rather than per element,
/// and a GPU thread moves a contiguous piece.
constexpr int64_t kRoutedPiece = 32;
PLANRT_HD inline int64_t routed_pieces(int64_t w) {
  return (w + kRoutedPiece - 1) / kRoutedPiece;
}

/// out row i = in row rows[i] (the rows sent, packed).
template <class T> struct MoeRoutedPackFn {
  const T *in;
  const int32_t *rows;
  T *out;
  int64_t w;
  PLANRT_HD void operator()(int64_t j) const {
    int64_t n = routed_pieces(w), i = j / n, c0 = (j % n) * kRoutedPiece;
    int64_t c1 = c0 + kRoutedPiece < w ? c0 + kRoutedPiece : w;
    const T *from = in + int64_t(rows[i]) * w;
    for (int64_t c = c0; c < c1; ++c)
      out[i * w + c] = from[c];
  }
};

/// routed_all_gather's result: the member's own block from `local`, the
/// rows received where they arrived, zero elsewhere (rows of the group).
template <class T> struct MoeRoutedGatherFn {
  const T *local, *recv;
  const int32_t *pos;
  T *out;
  int64_t w, rows, member;
  PLANRT_HD void operator()(int64_t j) const {
    int64_t n = routed_pieces(w), row = j / n, c0 = (j % n) * kRoutedPiece;
    int64_t c1 = c0 + kRoutedPiece < w ? c0 + kRoutedPiece : w;
    const T *from = nullptr;
    if (row / rows == member)
      from = local + (row - member * rows) * w;
    else if (pos[row] >= 0)
      from = recv + int64_t(pos[row]) * w;
    T *to = out + row * w;
    for (int64_t c = c0; c < c1; ++c)
      to[c] = from ? from[c] : T{};
  }
};

/// routed_reduce_scatter's result: row t of the member's block summed over
/// the group in member order (its own part from `in`, the others' from
/// what arrived; a member that sent nothing adds nothing).
struct MoeRoutedSumFn {
  const float *in, *recv;
  const int32_t *pos;
  float *out;
  int64_t w, rows, group, member;
  PLANRT_HD void operator()(int64_t j) const {
    int64_t n = routed_pieces(w), t = j / n, c0 = (j % n) * kRoutedPiece;
    int64_t c1 = c0 + kRoutedPiece < w ? c0 + kRoutedPiece : w;
    float *to = out + t * w;
    for (int64_t c = c0; c < c1; ++c)
      to[c] = 0.0f;
    for (int64_t m = 0; m < group; ++m) {
      const float *from = nullptr;
      if (m == member)
        from = in + (member * rows + t) * w;
      else if (pos[m * rows + t] >= 0)
        from = recv + int64_t(pos[m * rows + t]) * w;
      if (from)
        for (int64_t c = c0; c < c1; ++c)
          to[c] += from[c];
    }
  }
};

} // namespace kernels
} // namespace planrt

#endif
