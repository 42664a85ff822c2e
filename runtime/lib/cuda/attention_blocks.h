//===- attention_blocks.h - Causal attention in tiles, one block each -----===//
//
// Attention on the GPU without an S x S matrix in memory (the flash
// attention scheme): a block of 256 threads owns 64 rows (queries in the
// forward and dq pass, keys in the dk/dv pass) and walks the other side in
// tiles of 64, each tile staged in shared memory as fp32. Two block-level
// products do all the arithmetic:
//   dots:     C[64 x 64] = A[64 x D] B[64 x D]^T  (scores q.k, dout.v)
//   weighted: O[64 x D] += P[64 x 64] V[64 x D]    (p v, ds k, p dout, ds q)
// Thread (ty, tx) of the 16 x 16 block holds rows ty + 16 i (i < 4) and, of
// a 64 x 64 tile, columns tx + 16 j (j < 4), or of a 64 x D result columns
// tx + 16 k (k < D / 16): strided, so that a warp's 16 lanes read 16
// different rows of a tile padded to D + 1 floats (16 banks, no conflict)
// and the two rows of the warp's other half-lanes are broadcasts. A row's
// max and sums are reduced over its 16 lanes with xor shuffles.
//
// Forward: the online softmax of one pass over the keys (row max m and
// normalizer l rescaled as m grows), then out = o / l and stats (m, l), the
// same statistics the host functors keep. Backward: per query tile, a pass
// for (m, l) (unless the forward's stats are given) and delta = sum p dp
// (dp = dout.v), then a pass for dq = scale sum p (dp - delta) k; per key
// tile, dv = sum p dout and dk = scale sum p (dp - delta) q over the query
// heads of its group and the queries that see it. Every sum has one owner:
// no atomics, the same bits on every run. The products are fp32 FMAs on
// the SIMT cores: fp32 plans run these tiles, bf16 and fp16 plans the
// tensor-core tiles of attention_tc_blocks.h (same scheme, WMMA products).
//
// The same code runs on the host under OpenMP, a thread per GPU thread
// (block.h; test/runtime/cuda/attention_blocks_test compares it there with
// the host functors; the device suite compares the GPU with the host).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_ATTENTION_BLOCKS_H
#define PLANRT_LIB_CUDA_ATTENTION_BLOCKS_H

#include "block.h"
#include "planrt/kernels.h"

#include <cmath>
#include <type_traits>

namespace planrt {
namespace attn {

using kernels::exp_f32;
using kernels::ld;
using kernels::st;

constexpr int kRows = 64; // a block's rows
constexpr int kCols = 64; // a tile of the other side
constexpr int kTX = block::kTX, kTY = 16, kThreads = kTX * kTY;
constexpr int kRI = kRows / kTY; // rows per thread
constexpr int kCJ = kCols / kTX; // tile columns per thread

/// Head dims with tiled kernels (others run the per-row functors); planc's
/// cost model reads the same rule.
constexpr bool supported_head_dim(int64_t d) {
  return workspace::outside::tiled_attention(d);
}

/// f(std::integral_constant<int, D>) for head dim d when it has tiles
/// (each tile family's kernels are instantiated per D), returning what f
/// returns; false for the other head dims.
template <class F> bool with_head_dim(int64_t d, const F &f) {
  static_assert(workspace::outside::tiled_attention(16) &&
                    workspace::outside::tiled_attention(32) &&
                    workspace::outside::tiled_attention(64) &&
                    workspace::outside::tiled_attention(128),
                "the cases below are the tiled head dims");
  switch (d) {
  case 16:
    return f(std::integral_constant<int, 16>());
  case 32:
    return f(std::integral_constant<int, 32>());
  case 64:
    return f(std::integral_constant<int, 64>());
  case 128:
    return f(std::integral_constant<int, 128>());
  default:
    return false;
  }
}

using block::Lane;
using block::row_max16;
using block::row_sum16;

/// Shared-memory row stride of a [rows x D] tile (one float of padding).
template <int D> constexpr int kStride = D + 1;
constexpr int kPStride = kCols + 1;

/// dst[r][d] = src row (row0 + r) widened, rows past `valid` zero.
template <int D, class T>
PLANRT_BLOCK_FN void load_tile(const Lane &l, float *dst, const T *src,
                               int64_t src_stride, int64_t row0,
                               int64_t valid) {
  for (int idx = l.tid; idx < kRows * D; idx += kThreads) {
    int r = idx / D, d = idx % D;
    dst[r * kStride<D> + d] =
        r < valid ? ld(src[(row0 + r) * src_stride + d]) : 0.0f;
  }
}

/// c[i][j] = A[ty + 16 i] . B[tx + 16 j] over D.
template <int D>
PLANRT_BLOCK_FN void dots(const Lane &l, const float *A, const float *B,
                          float (&c)[kRI][kCJ]) {
  for (int i = 0; i < kRI; ++i)
    for (int j = 0; j < kCJ; ++j)
      c[i][j] = 0.0f;
  for (int d = 0; d < D; ++d) {
    float a[kRI], b[kCJ];
    for (int i = 0; i < kRI; ++i)
      a[i] = A[(l.ty + kTY * i) * kStride<D> + d];
    for (int j = 0; j < kCJ; ++j)
      b[j] = B[(l.tx + kTX * j) * kStride<D> + d];
    for (int i = 0; i < kRI; ++i)
      for (int j = 0; j < kCJ; ++j)
        c[i][j] = fmaf(a[i], b[j], c[i][j]);
  }
}

/// o[i][k] += sum_c P[ty + 16 i][c] V[c][tx + 16 k].
template <int D>
PLANRT_BLOCK_FN void weighted(const Lane &l, const float *P, const float *V,
                              float (&o)[kRI][D / kTX]) {
  for (int c = 0; c < kCols; ++c) {
    float p[kRI];
    for (int i = 0; i < kRI; ++i)
      p[i] = P[(l.ty + kTY * i) * kPStride + c];
    for (int k = 0; k < D / kTX; ++k) {
      float v = V[c * kStride<D> + l.tx + kTX * k];
      for (int i = 0; i < kRI; ++i)
        o[i][k] = fmaf(p[i], v, o[i][k]);
    }
  }
}

/// P[ty + 16 i][tx + 16 j] = v[i][j].
PLANRT_BLOCK_FN void store_p(const Lane &l, float *P,
                             const float (&v)[kRI][kCJ]) {
  for (int i = 0; i < kRI; ++i)
    for (int j = 0; j < kCJ; ++j)
      P[(l.ty + kTY * i) * kPStride + l.tx + kTX * j] = v[i][j];
}

/// The key tile [k0, k0 + 64) of kv head (b, g) into Ks and Vs (after the
/// previous tile's last use), and s = the scaled scores of the block's
/// queries [q0, q0 + 64) (in Qs) against it, -inf where the causal mask or
/// the end of the sequence hides a pair.
template <int D, class T>
PLANRT_BLOCK_FN void key_tile(const Lane &l, const kernels::AttnShape &a,
                              const T *qkv, int64_t b, int64_t g, int64_t q0,
                              int64_t k0, const float *Qs, float *Ks, float *Vs,
                              float (&s)[kRI][kCJ]) {
  const int64_t S = a.S, nk = S - k0 < kCols ? S - k0 : kCols;
  PLANRT_BLOCK_BARRIER();
  load_tile<D>(l, Ks, a.k(qkv, b, 0, g), a.width(), k0, nk);
  load_tile<D>(l, Vs, a.v(qkv, b, 0, g), a.width(), k0, nk);
  PLANRT_BLOCK_BARRIER();
  dots<D>(l, Qs, Ks, s);
  for (int i = 0; i < kRI; ++i) {
    const int64_t t = q0 + l.ty + kTY * i;
    for (int j = 0; j < kCJ; ++j) {
      const int64_t u = k0 + l.tx + kTX * j;
      s[i][j] = (u <= t && t < S) ? a.scale * s[i][j] : -INFINITY;
    }
  }
}

/// The kept statistics (m, l) of query row t of row group bh, as the
/// forward saves them for the backward (recompute = none): both tile
/// families write and read this layout.
PLANRT_BLOCK_FN void save_stats(float *stats, int64_t bh, int64_t S, int64_t t,
                                float m, float lsum) {
  stats[2 * (bh * S + t)] = m;
  stats[2 * (bh * S + t) + 1] = lsum;
}
/// The same row's (m, l) for the backward: (-inf, 0) when none are kept or
/// the row is past the sequence (its pass computes them).
PLANRT_BLOCK_FN void load_stats(const float *stats, int64_t bh, int64_t S,
                                int64_t t, float &m, float &lsum) {
  const bool valid = stats && t < S;
  m = valid ? stats[2 * (bh * S + t)] : -INFINITY;
  lsum = valid ? stats[2 * (bh * S + t) + 1] : 0.0f;
}

/// The row arithmetic both tile families share (this file's fp32 tiles and
/// attention_tc_blocks.h's), for one row of a thread over one tile of
/// kCJ of its columns.
///
/// The forward's online softmax: s becomes exp(s - m') (0 where masked), m
/// and lsum move to the new max m'; returns alpha, the factor that rescales
/// what was summed before (the output row).
PLANRT_BLOCK_FN float online_softmax(const Lane &l, float (&s)[kCJ], float &m,
                                     float &lsum) {
  float mt = -INFINITY;
  for (int j = 0; j < kCJ; ++j)
    mt = s[j] > mt ? s[j] : mt;
  mt = row_max16(l, mt);
  const float mn = mt > m ? mt : m;
  const float alpha = m == -INFINITY ? 0.0f : exp_f32(m - mn);
  float ls = 0.0f;
  for (int j = 0; j < kCJ; ++j) {
    s[j] = s[j] == -INFINITY ? 0.0f : exp_f32(s[j] - mn);
    ls += s[j];
  }
  lsum = lsum * alpha + row_sum16(l, ls);
  m = mn;
  return alpha;
}

/// The backward's first pass over one key tile: this lane's parts of the
/// normalizer (lpart) and of sum e dp (pdp), rescaled as the row max m grows
/// unless the forward's statistics fixed m (`kept`).
PLANRT_BLOCK_FN void stats_pass(const Lane &l, bool kept, const float (&s)[kCJ],
                                const float (&dp)[kCJ], float &m, float &lpart,
                                float &pdp) {
  float mt = -INFINITY;
  for (int j = 0; j < kCJ; ++j)
    mt = s[j] > mt ? s[j] : mt;
  float mn = m;
  if (!kept) {
    mt = row_max16(l, mt);
    mn = mt > m ? mt : m;
    const float alpha = m == -INFINITY ? 0.0f : exp_f32(m - mn);
    lpart *= alpha;
    pdp *= alpha;
    m = mn;
  }
  for (int j = 0; j < kCJ; ++j) {
    const float e = s[j] == -INFINITY ? 0.0f : exp_f32(s[j] - mn);
    lpart += e;
    pdp = fmaf(e, dp[j], pdp);
  }
}

/// After the first pass: the row's normalizer (unless kept) and delta = sum
/// p dp, written with the row max to rowstats and delta by lane tx 0.
PLANRT_BLOCK_FN float finish_stats(const Lane &l, bool kept, int64_t S,
                                   int64_t row, int64_t t, float m, float &lsum,
                                   float lpart, float pdp, float *rowstats,
                                   float *delta) {
  const float lt = row_sum16(l, lpart);
  if (!kept)
    lsum = lt;
  const float p = row_sum16(l, pdp);
  const float dl = t < S ? p / lsum : 0.0f;
  if (t < S && l.tx == 0) {
    rowstats[2 * row] = m;
    rowstats[2 * row + 1] = lsum;
    delta[row] = dl;
  }
  return dl;
}

/// Attention dropout in the backward: dp = dout . v of query t = q0 + ty +
/// 16 i and key u = k0 + tx + 16 j through the forward's mask (the
/// gradient of the dropped probabilities).
PLANRT_BLOCK_FN void mask_dp(const Lane &l, const kernels::AttnDropout &drop,
                             int64_t b, int64_t h, int64_t S, int64_t q0,
                             int64_t k0, float (&dp)[kRI][kCJ]) {
  if (!drop.on)
    return;
  for (int i = 0; i < kRI; ++i)
    for (int j = 0; j < kCJ; ++j)
      dp[i][j] *= drop.z(b, h, S, q0 + l.ty + kTY * i, k0 + l.tx + kTX * j);
}

/// The key side's view of a query tile's rows row0 .. row0 + 63 (nq of
/// them before the end): their (m, l) from `stats` and delta into Ms, Ls
/// and Dl, harmless values (0, 1, 0) past the end. Every tile family's
/// grad_kv reads its query tiles' statistics this way.
PLANRT_BLOCK_FN void load_row_stats(const Lane &l, const float *stats,
                                    const float *delta, int64_t row0,
                                    int64_t nq, float *Ms, float *Ls,
                                    float *Dl) {
  for (int j = l.tid; j < kCols; j += kThreads) {
    const int64_t row = row0 + j;
    Ms[j] = j < nq ? stats[2 * row] : 0.0f;
    Ls[j] = j < nq ? stats[2 * row + 1] : 1.0f;
    Dl[j] = j < nq ? delta[row] : 0.0f;
  }
}

/// Floats of shared memory each kernel takes.
template <int D> constexpr int forward_floats() {
  return 3 * kRows * kStride<D> + kRows * kPStride;
}
template <int D> constexpr int grad_q_floats() {
  return 4 * kRows * kStride<D> + kRows * kPStride;
}
template <int D> constexpr int grad_kv_floats() {
  return 4 * kRows * kStride<D> + kRows * kPStride + 3 * kCols;
}

/// The forward of query rows [q0, q0 + 64) of row group bh = b H + h: out,
/// and with `stats` (m, l) per row.
template <int D, class T>
PLANRT_BLOCK_FN void forward_block(const Lane &l, float *smem,
                                   const kernels::AttnShape &a, const T *qkv,
                                   T *out, float *stats, int64_t bh, int64_t q0,
                                   const kernels::AttnDropout &drop = {}) {
  const int64_t S = a.S, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  float *Qs = smem, *Ks = Qs + kRows * kStride<D>,
        *Vs = Ks + kRows * kStride<D>, *Ps = Vs + kRows * kStride<D>;
  const int64_t nq = S - q0 < kRows ? S - q0 : kRows;
  load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
  float m[kRI], lsum[kRI], o[kRI][D / kTX];
  for (int i = 0; i < kRI; ++i) {
    m[i] = -INFINITY;
    lsum[i] = 0.0f;
    for (int k = 0; k < D / kTX; ++k)
      o[i][k] = 0.0f;
  }
  const int64_t last = q0 + nq - 1; // the last key any row here sees
  for (int64_t k0 = 0; k0 <= last; k0 += kCols) {
    float s[kRI][kCJ];
    key_tile<D>(l, a, qkv, b, g, q0, k0, Qs, Ks, Vs, s);
    for (int i = 0; i < kRI; ++i) {
      const float alpha = online_softmax(l, s[i], m[i], lsum[i]);
      for (int k = 0; k < D / kTX; ++k)
        o[i][k] *= alpha;
      if (drop.on) // the values' weights only, not the normalizer
        for (int j = 0; j < kCJ; ++j)
          s[i][j] *= drop.z(b, h, S, q0 + l.ty + kTY * i, k0 + l.tx + kTX * j);
    }
    store_p(l, Ps, s);
    PLANRT_BLOCK_BARRIER();
    weighted<D>(l, Ps, Vs, o);
  }
  for (int i = 0; i < kRI; ++i) {
    const int64_t t = q0 + l.ty + kTY * i;
    if (t >= S)
      continue;
    const float inv = 1.0f / lsum[i];
    T *row = out + a.o(b, t, h);
    for (int k = 0; k < D / kTX; ++k)
      st(row[l.tx + kTX * k], o[i][k] * inv);
    if (stats && l.tx == 0)
      save_stats(stats, bh, S, t, m[i], lsum[i]);
  }
}

/// The backward's query side for rows [q0, q0 + 64) of row group bh:
/// rowstats (m, l) and delta per row, and dq.
template <int D, class T>
PLANRT_BLOCK_FN void
grad_q_block(const Lane &l, float *smem, const kernels::AttnShape &a,
             const T *qkv, const T *dout, T *dqkv, const float *stats,
             float *rowstats, float *delta, int64_t bh, int64_t q0,
             const kernels::AttnDropout &drop = {}) {
  const int64_t S = a.S, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  float *Qs = smem, *Os = Qs + kRows * kStride<D>,
        *Ks = Os + kRows * kStride<D>, *Vs = Ks + kRows * kStride<D>,
        *Ps = Vs + kRows * kStride<D>;
  const int64_t nq = S - q0 < kRows ? S - q0 : kRows;
  load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
  load_tile<D>(l, Os, dout + a.o(b, 0, h), a.H * D, q0, nq);
  float m[kRI], lsum[kRI], pdp[kRI];
  for (int i = 0; i < kRI; ++i) {
    load_stats(stats, bh, S, q0 + l.ty + kTY * i, m[i], lsum[i]);
    pdp[i] = 0.0f; // this lane's part until the end of the pass
  }
  const int64_t last = q0 + nq - 1;
  // Pass 1: (m, l) unless kept, and sum e dp, rescaled as m grows.
  float lpart[kRI] = {};
  for (int64_t k0 = 0; k0 <= last; k0 += kCols) {
    float s[kRI][kCJ], dp[kRI][kCJ];
    key_tile<D>(l, a, qkv, b, g, q0, k0, Qs, Ks, Vs, s);
    dots<D>(l, Os, Vs, dp);
    mask_dp(l, drop, b, h, S, q0, k0, dp);
    for (int i = 0; i < kRI; ++i)
      stats_pass(l, stats != nullptr, s[i], dp[i], m[i], lpart[i], pdp[i]);
  }
  float dl[kRI];
  for (int i = 0; i < kRI; ++i) {
    const int64_t t = q0 + l.ty + kTY * i;
    dl[i] = finish_stats(l, stats != nullptr, S, bh * S + t, t, m[i], lsum[i],
                         lpart[i], pdp[i], rowstats, delta);
  }
  // Pass 2: dq = scale sum p (dp - delta) k.
  float dq[kRI][D / kTX];
  for (int i = 0; i < kRI; ++i)
    for (int k = 0; k < D / kTX; ++k)
      dq[i][k] = 0.0f;
  for (int64_t k0 = 0; k0 <= last; k0 += kCols) {
    float s[kRI][kCJ], dp[kRI][kCJ];
    key_tile<D>(l, a, qkv, b, g, q0, k0, Qs, Ks, Vs, s);
    dots<D>(l, Os, Vs, dp);
    mask_dp(l, drop, b, h, S, q0, k0, dp);
    for (int i = 0; i < kRI; ++i)
      for (int j = 0; j < kCJ; ++j) {
        float p =
            s[i][j] == -INFINITY ? 0.0f : exp_f32(s[i][j] - m[i]) / lsum[i];
        s[i][j] = p * (dp[i][j] - dl[i]) * a.scale;
      }
    store_p(l, Ps, s);
    PLANRT_BLOCK_BARRIER();
    weighted<D>(l, Ps, Ks, dq);
  }
  for (int i = 0; i < kRI; ++i) {
    const int64_t t = q0 + l.ty + kTY * i;
    if (t >= S)
      continue;
    T *row = dqkv + (a.q(qkv, b, t, h) - qkv);
    for (int k = 0; k < D / kTX; ++k)
      st(row[l.tx + kTX * k], dq[i][k]);
  }
}

/// The backward's key side for keys [u0, u0 + 64) of kv group bg = b KV +
/// g: dk and dv, summed over the group's query heads and the queries t >= u
/// (reads the rowstats and delta grad_q_block wrote).
template <int D, class T>
PLANRT_BLOCK_FN void
grad_kv_block(const Lane &l, float *smem, const kernels::AttnShape &a,
              const T *qkv, const T *dout, T *dqkv, const float *rowstats,
              const float *delta, int64_t bg, int64_t u0,
              const kernels::AttnDropout &drop = {}) {
  const int64_t S = a.S, b = bg / a.KV, g = bg % a.KV, rep = a.H / a.KV;
  float *Ks = smem, *Vs = Ks + kRows * kStride<D>,
        *Qs = Vs + kRows * kStride<D>, *Os = Qs + kRows * kStride<D>,
        *Ps = Os + kRows * kStride<D>, *Ms = Ps + kRows * kPStride,
        *Ls = Ms + kCols, *Dl = Ls + kCols;
  const int64_t nk = S - u0 < kRows ? S - u0 : kRows;
  load_tile<D>(l, Ks, a.k(qkv, b, 0, g), a.width(), u0, nk);
  load_tile<D>(l, Vs, a.v(qkv, b, 0, g), a.width(), u0, nk);
  float dk[kRI][D / kTX], dv[kRI][D / kTX];
  for (int i = 0; i < kRI; ++i)
    for (int k = 0; k < D / kTX; ++k) {
      dk[i][k] = 0.0f;
      dv[i][k] = 0.0f;
    }
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
    const int64_t bh = b * a.H + h;
    for (int64_t q0 = u0; q0 < S; q0 += kCols) {
      const int64_t nq = S - q0 < kCols ? S - q0 : kCols;
      PLANRT_BLOCK_BARRIER();
      load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
      load_tile<D>(l, Os, dout + a.o(b, 0, h), a.H * D, q0, nq);
      load_row_stats(l, rowstats, delta, bh * S + q0, nq, Ms, Ls, Dl);
      PLANRT_BLOCK_BARRIER();
      float s[kRI][kCJ], dp[kRI][kCJ];
      dots<D>(l, Ks, Qs, s); // [key][query]
      dots<D>(l, Vs, Os, dp);
      for (int i = 0; i < kRI; ++i) {
        const int64_t u = u0 + l.ty + kTY * i;
        for (int j = 0; j < kCJ; ++j) {
          const int jj = l.tx + kTX * j;
          const int64_t t = q0 + jj;
          const bool seen = u <= t && t < S && u < S;
          float p = seen ? exp_f32(a.scale * s[i][j] - Ms[jj]) / Ls[jj] : 0.0f;
          // Dropout: ds from the masked dp, dv from the dropped p.
          const float z = drop.on && seen ? drop.z(b, h, S, t, u) : 1.0f;
          s[i][j] = p * z;
          dp[i][j] = p * (z * dp[i][j] - Dl[jj]) * a.scale;
        }
      }
      store_p(l, Ps, s);
      PLANRT_BLOCK_BARRIER();
      weighted<D>(l, Ps, Os, dv);
      PLANRT_BLOCK_BARRIER();
      store_p(l, Ps, dp);
      PLANRT_BLOCK_BARRIER();
      weighted<D>(l, Ps, Qs, dk);
    }
  }
  for (int i = 0; i < kRI; ++i) {
    const int64_t u = u0 + l.ty + kTY * i;
    if (u >= S)
      continue;
    T *krow = dqkv + (a.k(qkv, b, u, g) - qkv);
    T *vrow = dqkv + (a.v(qkv, b, u, g) - qkv);
    for (int k = 0; k < D / kTX; ++k) {
      st(krow[l.tx + kTX * k], dk[i][k]);
      st(vrow[l.tx + kTX * k], dv[i][k]);
    }
  }
}

} // namespace attn
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ATTENTION_BLOCKS_H
