//===- context_parallel.h - Context parallelism's kernels ------*- C++ -*-===//
//
// Context parallelism (parallel { cp = G }) splits each sequence over G
// ranks: cut into 2 G chunks, rank g holds chunks g and 2 G - 1 - g
// (kernels::SeqPart), so that causal attention costs every rank the same.
// Everything per token runs on those rows as it is; attention needs the
// other ranks' keys and values, exchanged one of two ways:
//
// - all_to_all (DeepSpeed Ulysses): the packed q/k/v is traded, sequence
//   for heads (PackHeadsFn / UnpackSeqFn), ordinary causal attention runs
//   over every position of 1/G of the heads, and the output goes back
//   (PackSeqFn / UnpackHeadsFn). Needs G to divide the key/value heads.
// - all_gather (Megatron-Core's, torchtitan's): each rank gathers every
//   position's keys and values in position order (PackKvFn /
//   UnpackKvFn) and attends with its own queries, causal by global
//   position: one block of keys (AttentionBlockFn). The backward computes
//   dq for its queries and each key's and value's gradient from its queries
//   only (AttentionBlockGradQFn, AttentionBlockGradKVFn): partial sums that
//   a reduce-scatter adds up and returns to the keys' owners (PackDkvFn,
//   UnpackDkvFn).
// - ring (ring attention): the keys and values go around the ring of the G
//   ranks, one rank's block per step, each shifted on while the block in
//   hand is computed; every query row keeps a running maximum, normalizer
//   and weighted sum (online softmax, the same block functors as
//   all_gather's, one block per step) and divides at the end. The backward
//   runs the ring twice: once to recompute each row's statistics and
//   output (for delta = dout . out), once for the gradients, the keys' and
//   values' gradients travelling with their block and returning to its
//   owner after a last shift. Where the forward kept its output and each
//   row's log-sum-exp (attention_ring_lse), the statistics are (the
//   log-sum-exp, 1) and delta comes from the output: one ring.
//
// The all_gather and ring functors are plain loops over a row's keys (or a
// key's queries), in fp32 with 16-bit tensors read and written as they are:
// the reference. The cuda backend runs them as tiles
// (runtime/lib/cuda/attention_cp_blocks.h) for the head dims those are
// built for, and 16-bit attention without dropout on cuDNN
// (runtime/lib/cuda/attention_cp.cu): all_gather's whole, ring's a block
// at a time in the functors' contract (AttentionMergeFn below). Every
// functor runs on both backends.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_CONTEXT_PARALLEL_H
#define PLANRT_CONTEXT_PARALLEL_H

#include "planrt/kernels.h"

namespace planrt {
namespace kernels {

//===--- Context parallelism by all-to-all (Ulysses) ----------------------===//
//
// The sequence-split side is [B, L, W] per rank (L = S / G rows at the
// positions SeqPart gives); W is q_width, then two segments of kv_width when
// kv_width > 0 (packed q/k/v). The head-split side is [B, S, W / G]: every
// position, in order, of block k of each segment (whole heads). Member k of
// the all-to-all gets block k; messages are [B, L, W / G] per member.

struct HeadBlocks {
  int64_t B, L, q_width, kv_width, G;
  PLANRT_HD int64_t W() const { return q_width + 2 * kv_width; }
  PLANRT_HD int64_t Wg() const { return W() / G; }
  /// The column of the full width that is column c of member k's block.
  PLANRT_HD int64_t column(int64_t k, int64_t c) const {
    int64_t q = q_width / G, kv = kv_width / G;
    if (c < q)
      return k * q + c;
    c -= q;
    int64_t seg = c / (kv > 0 ? kv : 1);
    return q_width + seg * kv_width + k * kv + (c - seg * kv);
  }
  /// Inverse of column(): the member and its block's column for `col`.
  PLANRT_HD void block(int64_t col, int64_t *k, int64_t *c) const {
    int64_t q = q_width / G, kv = kv_width / G;
    if (col < q_width) {
      *k = col / q;
      *c = col % q;
      return;
    }
    col -= q_width;
    int64_t seg = col / kv_width, r = col % kv_width;
    *k = r / kv;
    *c = q + seg * kv + r % kv;
  }
};

/// seq_to_heads, step 1: the message for member k, [k][B][L][Wg], from this
/// rank's rows.
template <class T = float> struct PackHeadsFn {
  static constexpr bool kElementwise = true;
  const T *in;
  T *send;
  HeadBlocks h;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t Wg = h.Wg(), c = i % Wg, row = (i / Wg) % (h.B * h.L),
            k = i / (Wg * h.B * h.L);
    send[i] = in[row * h.W() + h.column(k, c)];
  }
};

/// seq_to_heads, step 2: out [B, S, Wg] in position order from the messages
/// [j][B][L][Wg] of every member j.
template <class T = float> struct UnpackSeqFn {
  static constexpr bool kElementwise = true;
  const T *recv;
  T *out;
  HeadBlocks h;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t Wg = h.Wg(), S = h.L * h.G, c = i % Wg, p = (i / Wg) % S,
            b = i / (Wg * S), j, t;
    SeqPart{0, h.G}.owner(p, h.L, &j, &t);
    out[i] = recv[((j * h.B + b) * h.L + t) * Wg + c];
  }
};

/// heads_to_seq, step 1: the message for member j, [j][B][L][Wg]: the rows
/// of its positions, from in [B, S, Wg].
template <class T = float> struct PackSeqFn {
  static constexpr bool kElementwise = true;
  const T *in;
  T *send;
  HeadBlocks h;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t Wg = h.Wg(), S = h.L * h.G, c = i % Wg, t = (i / Wg) % h.L,
            b = (i / (Wg * h.L)) % h.B, j = i / (Wg * h.L * h.B);
    int64_t p = SeqPart{j, h.G}.position(t, h.L);
    send[i] = in[(b * S + p) * Wg + c];
  }
};

/// heads_to_seq, step 2: out [B, L, W] from member k's blocks [k][B][L][Wg].
template <class T = float> struct UnpackHeadsFn {
  static constexpr bool kElementwise = true;
  const T *recv;
  T *out;
  HeadBlocks h;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t W = h.W(), col = i % W, row = i / W, k, c;
    h.block(col, &k, &c);
    out[i] = recv[(k * h.B * h.L + row) * h.Wg() + c];
  }
};

//===--- Context parallelism by all-gather --------------------------------===//
//
// qkv is this rank's [B, L, W] (its L = S / G positions, SeqPart), W = (H +
// 2 KV) D as for attention; kv is every position's keys then values in
// position order, [B, S, 2 KV D]. Query row t (position p = position(t))
// attends to keys 0..p.

struct AttnCp {
  AttnShape a; // a.S = L, this rank's rows
  int64_t S;   // every position
  SeqPart part;
  AttnDropout drop = {}; // on the global positions (S of them)
  PLANRT_HD int64_t kvWidth() const { return 2 * a.KV * a.D; }
};

/// kv_gather, step 1: this rank's keys and values [B, L, 2 KV D] (the
/// columns after the query heads of its qkv rows).
template <class T = float> struct PackKvFn {
  static constexpr bool kElementwise = true;
  const T *qkv;
  T *send;
  int64_t W, q_width, kv2; // kv2 = 2 kv_width
  PLANRT_HD void operator()(int64_t i) const {
    send[i] = qkv[(i / kv2) * W + q_width + i % kv2];
  }
};

/// kv_gather, step 2: kv [B, S, kv2] in position order from every member
/// j's [B, L, kv2] (gathered as [j][B][L][kv2]).
template <class T = float> struct UnpackKvFn {
  static constexpr bool kElementwise = true;
  const T *recv;
  T *kv;
  int64_t B, L, kv2, G;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t S = L * G, c = i % kv2, p = (i / kv2) % S, b = i / (kv2 * S), j, t;
    SeqPart{0, G}.owner(p, L, &j, &t);
    kv[i] = recv[((j * B + b) * L + t) * kv2 + c];
  }
};

/// kv_reduce_scatter, step 1: dkv [B, S, kv2] as the blocks of every member
/// j, [j][B][L][kv2]: the rows of j's positions, in j's order.
struct PackDkvFn {
  static constexpr bool kElementwise = true;
  const float *dkv;
  float *send;
  int64_t B, L, kv2, G;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t S = L * G, c = i % kv2, t = (i / kv2) % L, b = (i / (kv2 * L)) % B,
            j = i / (kv2 * L * B);
    int64_t p = SeqPart{j, G}.position(t, L);
    send[i] = dkv[(b * S + p) * kv2 + c];
  }
};

/// kv_reduce_scatter, step 2: the summed block [B, L, kv2] into the key
/// and value columns of dqkv [B, L, W].
template <class T = float> struct UnpackDkvFn {
  static constexpr bool kElementwise = true;
  const float *sum;
  T *dqkv;
  int64_t W, q_width, kv2;
  PLANRT_HD void operator()(int64_t i) const {
    st(dqkv[(i / kv2) * W + q_width + i % kv2], sum[i]);
  }
};

//===--- Attention over blocks of keys and values
//--------------------------===//
//
// all_gather and ring attend with this rank's queries to blocks of keys and
// values [B, rows, 2 KV D] whose row u is at position from.position(u,
// rows): all_gather's one block of every position (identity positions),
// ring's blocks of one rank each (that rank's positions). Running
// statistics per query row i (index space B H L): acc [B H L, D] (f32) and
// ml [B H L, 2] = (maximum, normalizer), starting at (-, 0).

struct KvBlock {
  int64_t rows;
  SeqPart from; // {0, 1}: positions 0..rows-1 in order
  PLANRT_HD int64_t position(int64_t u) const { return from.position(u, rows); }
  template <class T>
  PLANRT_HD const T *k(const AttnCp &c, const T *blk, int64_t b, int64_t u,
                       int64_t g) const {
    return blk + (b * rows + u) * c.kvWidth() + g * c.a.D;
  }
  template <class T>
  PLANRT_HD const T *v(const AttnCp &c, const T *blk, int64_t b, int64_t u,
                       int64_t g) const {
    return blk + (b * rows + u) * c.kvWidth() + (c.a.KV + g) * c.a.D;
  }
};

/// A query row of the index space B H L: its batch, head, kv head, local
/// row and position.
struct CpRow {
  int64_t b, h, g, t, p;
  PLANRT_HD CpRow(const AttnCp &c, int64_t i)
      : b(i / (c.a.S * c.a.H)), h((i / c.a.S) % c.a.H), g(h / (c.a.H / c.a.KV)),
        t(i % c.a.S), p(c.part.position(t, c.a.S)) {}
};

/// Forward, one block: row i's scores against the block's keys at
/// positions <= the row's, merged into its running statistics.
template <class T = float> struct AttentionBlockFn {
  const T *qkv, *blk;
  float *acc, *ml;
  AttnCp c;
  KvBlock kb;
  PLANRT_HD void operator()(int64_t i) const {
    const AttnShape &a = c.a;
    CpRow r(c, i);
    const int64_t D = a.D;
    const T *q = a.q(qkv, r.b, r.t, r.h);
    bool any = false;
    float bm = 0.0f;
    for (int64_t u = 0; u < kb.rows; ++u) {
      if (kb.position(u) > r.p)
        continue;
      float s = a.scale * dot(q, kb.k(c, blk, r.b, u, r.g), D);
      bm = !any || s > bm ? s : bm;
      any = true;
    }
    if (!any)
      return;
    float m = ml[2 * i], l = ml[2 * i + 1];
    float mn = l > 0.0f && m > bm ? m : bm;
    float keep = l > 0.0f ? exp_f32(m - mn) : 0.0f;
    float *o = acc + i * D;
    for (int64_t d = 0; d < D; ++d)
      o[d] *= keep;
    l *= keep;
    for (int64_t u = 0; u < kb.rows; ++u) {
      if (kb.position(u) > r.p)
        continue;
      float e = exp_f32(a.scale * dot(q, kb.k(c, blk, r.b, u, r.g), D) - mn);
      l += e;
      if (c.drop.on) // the values' weights only
        e *= c.drop.z(r.b, r.h, c.S, r.p, kb.position(u));
      const T *v = kb.v(c, blk, r.b, u, r.g);
      for (int64_t d = 0; d < D; ++d)
        o[d] += e * ld(v[d]);
    }
    ml[2 * i] = mn;
    ml[2 * i + 1] = l;
  }
};

/// The forward's end: out = acc / normalizer, and with `delta`, delta =
/// dout . out (the backward's first ring).
template <class T = float> struct AttentionFinishFn {
  const float *acc, *ml;
  T *out;
  const T *dout = nullptr;
  float *delta = nullptr;
  AttnShape a;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t t = i % a.S, h = (i / a.S) % a.H, b = i / (a.S * a.H);
    float inv = 1.0f / ml[2 * i + 1], dl = 0.0f;
    for (int64_t d = 0; d < a.D; ++d) {
      float o = acc[i * a.D + d] * inv;
      if (out)
        st(out[a.o(b, t, h) + d], o);
      if (dout)
        dl += ld(dout[a.o(b, t, h) + d]) * o;
    }
    if (delta)
      delta[i] = dl;
  }
};

//===--- A block's attention from a library (cuDNN) -----------------------===//
//
// The cuda backend may run a ring's block as a library's attention over
// rows [row0, row0 + rows) of the rank's queries: its normalized output
// `part` (laid out like out) and each row's log-sum-exp (packed [B, H,
// rows]). These fold them into the running statistics above, and give the
// library's backward what it reads: each row's final log-sum-exp; its dq
// (16 bits, in dqkv's query columns) is added to the f32 dq.

/// Row (b, h, row0 + t) of B H rows: its index in B H L.
PLANRT_HD inline int64_t cp_row_index(const AttnShape &a, int64_t row0,
                                      int64_t rows, int64_t r) {
  int64_t t = row0 + r % rows, bh = r / rows;
  return bh * a.S + t;
}

/// Running statistics (m, l) merged with a part whose log-sum-exp is
/// `lse`: the new (m, l), and the weights of the old sum and of the part.
struct LseMerge {
  float m, l, keep, w;
  PLANRT_HD LseMerge(float m0, float l0, float lse) {
    m = l0 > 0.0f && m0 > lse ? m0 : lse;
    keep = l0 > 0.0f ? exp_f32(m0 - m) : 0.0f;
    w = exp_f32(lse - m);
    l = l0 * keep + w;
  }
};

/// acc, ml of rows [row0, row0 + rows) merged with a part of the block
/// (see above); index space B H rows. A row whose part saw no key (lse
/// -inf) keeps its statistics. The cuda backend runs a warp a row: row()
/// weighs, element() updates acc[d], store() the statistics.
template <class T = float> struct AttentionMergeFn {
  const T *part;
  const float *lse;
  float *acc, *ml;
  AttnShape a;
  int64_t row0, rows;
  PLANRT_HD bool row(int64_t r, int64_t *i, LseMerge *w) const {
    *i = cp_row_index(a, row0, rows, r);
    if (!(lse[r] > -INFINITY))
      return false;
    *w = LseMerge(ml[2 * *i], ml[2 * *i + 1], lse[r]);
    return true;
  }
  PLANRT_HD void element(int64_t i, const LseMerge &w, int64_t d) const {
    int64_t t = i % a.S, h = (i / a.S) % a.H, b = i / (a.S * a.H);
    float *o = acc + i * a.D + d;
    *o = *o * w.keep + w.w * ld(part[a.o(b, t, h) + d]);
  }
  PLANRT_HD void store(int64_t i, const LseMerge &w) const {
    ml[2 * i] = w.m;
    ml[2 * i + 1] = w.l;
  }
  PLANRT_HD void operator()(int64_t r) const {
    int64_t i;
    LseMerge w(0.0f, 0.0f, 0.0f);
    if (!row(r, &i, &w))
      return;
    for (int64_t d = 0; d < a.D; ++d)
      element(i, w, d);
    store(i, w);
  }
};

/// lse (packed [B, H, rows]) = each row's log-sum-exp, m + log l, of rows
/// [row0, row0 + rows); index space B H rows.
struct RowLseFn {
  static constexpr bool kElementwise = true;
  const float *ml;
  float *lse;
  AttnShape a;
  int64_t row0, rows;
  PLANRT_HD void operator()(int64_t r) const {
    int64_t i = cp_row_index(a, row0, rows, r);
    lse[r] = ml[2 * i] + logf(ml[2 * i + 1]);
  }
};

/// A ring's rows' statistics from their kept log-sum-exps (f32 [B H L]):
/// m = the log-sum-exp with a normalizer of 1 weighs every key as the
/// ring's statistics do; index space B H L (a row's two statistics each:
/// not element-wise).
struct MlFromLseFn {
  const float *lse;
  float *ml;
  PLANRT_HD void operator()(int64_t i) const {
    ml[2 * i] = lse[i];
    ml[2 * i + 1] = 1.0f;
  }
};

/// delta = dout . out for each row of B H L (from a kept output, as
/// AttentionFinishFn gives it from the statistics).
template <class T = float> struct RowDotFn {
  const T *dout, *out;
  float *delta;
  AttnShape a;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t t = i % a.S, h = (i / a.S) % a.H, b = i / (a.S * a.H);
    const int64_t at = a.o(b, t, h);
    float dl = 0.0f;
    for (int64_t d = 0; d < a.D; ++d)
      dl += ld(dout[at + d]) * ld(out[at + d]);
    delta[i] = dl;
  }
};

/// dq (f32 [B H L, D]) += the 16-bit dq of rows [row0, row0 + rows) in the
/// query columns of `part` (laid out like qkv); index space B H rows D.
template <class T = float> struct DqAddFn {
  static constexpr bool kElementwise = true;
  const T *part;
  float *dq;
  AttnShape a;
  int64_t row0, rows;
  PLANRT_HD void operator()(int64_t e) const {
    int64_t d = e % a.D, r = e / a.D, i = cp_row_index(a, row0, rows, r);
    int64_t t = i % a.S, h = (i / a.S) % a.H, b = i / (a.S * a.H);
    dq[i * a.D + d] += ld(part[(b * a.S + t) * a.width() + h * a.D + d]);
  }
};

/// Backward, one block, queries; index space B H L: dq (f32, [B H L, D])
/// += scale sum_u p (dout . v - delta) k over the block's keys at
/// positions <= the row's, p = exp(score - m) / normalizer.
template <class T = float> struct AttentionBlockGradQFn {
  const T *qkv, *blk, *dout;
  const float *ml, *delta;
  float *dq;
  AttnCp c;
  KvBlock kb;
  PLANRT_HD void operator()(int64_t i) const {
    const AttnShape &a = c.a;
    CpRow r(c, i);
    const int64_t D = a.D;
    const T *q = a.q(qkv, r.b, r.t, r.h);
    const T *dy = dout + a.o(r.b, r.t, r.h);
    float *dqi = dq + i * D;
    for (int64_t u = 0; u < kb.rows; ++u) {
      if (kb.position(u) > r.p)
        continue;
      const T *k = kb.k(c, blk, r.b, u, r.g);
      float pr = exp_f32(a.scale * dot(q, k, D) - ml[2 * i]) / ml[2 * i + 1];
      float dp = dot(dy, kb.v(c, blk, r.b, u, r.g), D);
      if (c.drop.on) // the dropped probabilities' gradient
        dp *= c.drop.z(r.b, r.h, c.S, r.p, kb.position(u));
      float ds = pr * (dp - delta[i]) * a.scale;
      for (int64_t d = 0; d < D; ++d)
        dqi[d] += ds * ld(k[d]);
    }
  }
};

/// Backward, one block, keys; index space B KV rows (the block's key row u
/// of kv head g): dkv (f32, the block's [B, rows, 2 KV D]) += this rank's
/// queries' share, dk = scale sum ds q and dv = sum p dout, over the query
/// rows at positions >= u's of g's query heads.
template <class T = float> struct AttentionBlockGradKVFn {
  const T *qkv, *blk, *dout;
  const float *ml, *delta;
  float *dkv;
  AttnCp c;
  KvBlock kb;
  PLANRT_HD void operator()(int64_t i) const {
    const AttnShape &a = c.a;
    int64_t u = i % kb.rows, g = (i / kb.rows) % a.KV, b = i / (kb.rows * a.KV);
    int64_t D = a.D, group = a.H / a.KV, pu = kb.position(u);
    const T *k = kb.k(c, blk, b, u, g), *v = kb.v(c, blk, b, u, g);
    float *row = dkv + (b * kb.rows + u) * c.kvWidth();
    for (int64_t h = g * group; h < (g + 1) * group; ++h)
      for (int64_t t = 0; t < a.S; ++t) {
        if (c.part.position(t, a.S) < pu)
          continue;
        int64_t r = (b * a.H + h) * a.S + t;
        const T *q = a.q(qkv, b, t, h);
        const T *dy = dout + a.o(b, t, h);
        float pr = exp_f32(a.scale * dot(q, k, D) - ml[2 * r]) / ml[2 * r + 1];
        // Dropout: ds from the masked dp, dv from the dropped p.
        float z =
            c.drop.on ? c.drop.z(b, h, c.S, c.part.position(t, a.S), pu) : 1.0f;
        float ds = pr * (z * dot(dy, v, D) - delta[r]) * a.scale;
        pr *= z;
        for (int64_t d = 0; d < D; ++d) {
          row[(a.KV + g) * D + d] += pr * ld(dy[d]);
          row[g * D + d] += ds * ld(q[d]);
        }
      }
  }
};

/// The backward's end, queries: dq (f32 [B H L, D]) into dqkv's query
/// columns; index space B H L D.
template <class T = float> struct DqIntoQkvFn {
  static constexpr bool kElementwise = true;
  const float *dq;
  T *dqkv;
  AttnShape a;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t d = i % a.D, r = i / a.D, t = r % a.S, h = (r / a.S) % a.H,
            b = r / (a.S * a.H);
    st(dqkv[(b * a.S + t) * a.width() + h * a.D + d], dq[i]);
  }
};

} // namespace kernels
} // namespace planrt

#endif // PLANRT_CONTEXT_PARALLEL_H
