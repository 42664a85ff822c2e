//===- attention_cp_blocks.h - Context parallelism's attention in tiles ---===//
//
// Context parallelism by all_gather or ring (context_parallel.h) attends
// with this rank's queries to a block of keys and values at other
// positions: all_gather's one block of every position, ring's one rank's
// block per step. The reference functors (AttentionBlockFn and its two
// gradients) do that one thread per query (or key) row; these are their
// tiles, the scheme of attention_blocks.h (read its essay first) with the
// same block products, softmax and tile sizes, and three differences:
//
// - Positions. A query row's position is c.part.position(t) and a key's
//   kb.position(u); the causal mask compares those. Both grow with the row
//   (a rank's two chunks are in order, the later one past the earlier), so
//   a query tile still stops at the first key tile past its last query, and
//   a key tile skips the query tiles before its first key.
// - Running statistics. The forward carries each row's (max, normalizer)
//   and unnormalized weighted sum from block to block in ml and acc (f32,
//   the functors' layout): a tile starts from them and writes them back;
//   the division is AttentionFinishFn's, after the last block. A row that
//   sees no key of the block keeps its state untouched.
// - Accumulated gradients. dq (f32 [B H L, D]) and the block's dkv (f32,
//   [B, rows, 2 KV D]) are sums over the blocks of the ring (or, for dkv,
//   over the ranks by the reduce-scatter): the tiles add to them. Every row
//   has one owner block, so there are no atomics and the bits do not vary.
//
// The products are fp32 on the SIMT cores (16-bit qkv widened on load):
// fp32 plans run these, bf16 and fp16 plans attention_cp_tc_blocks.h's
// tensor-core tiles (same scheme). The same code runs on the host under
// OpenMP (block.h; test/runtime/cuda/blocks_test compares it with the
// functors there, and the device suite on a GPU).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_ATTENTION_CP_BLOCKS_H
#define PLANRT_LIB_CUDA_ATTENTION_CP_BLOCKS_H

#include "attention_blocks.h"
#include "planrt/context_parallel.h"

namespace planrt {
namespace attn_cp {

using attn::kCJ;
using attn::kCols;
using attn::kRI;
using attn::kRows;
using attn::kStride;
using attn::kThreads;
using attn::kTX;
using attn::kTY;
using attn::Lane;
using kernels::AttnCp;
using kernels::KvBlock;

/// Shared memory of each kernel: attention_blocks.h's forward_floats,
/// grad_q_floats and grad_kv_floats (the same regions).

/// The positions of the query rows q0 + lane + 16 i (lane: the thread's ty
/// for tile rows, tx for tile columns), -1 past the end: no key is seen
/// there.
template <int N>
PLANRT_BLOCK_FN void query_positions(const AttnCp &c, int64_t q0, int lane,
                                     int64_t (&pq)[N]) {
  PLANRT_UNROLL
  for (int i = 0; i < N; ++i) {
    const int64_t t = q0 + lane + kTX * i; // kTX == kTY
    pq[i] = t < c.a.S ? c.part.position(t, c.a.S) : -1;
  }
}
/// The positions of the block's keys k0 + lane + 16 j, INT64_MAX past its
/// end: no query sees them.
template <int N>
PLANRT_BLOCK_FN void key_positions(const KvBlock &kb, int64_t k0, int lane,
                                   int64_t (&pk)[N]) {
  PLANRT_UNROLL
  for (int j = 0; j < N; ++j) {
    const int64_t u = k0 + lane + kTX * j;
    pk[j] = u < kb.rows ? kb.position(u) : INT64_MAX;
  }
}
static_assert(kTX == kTY && kRI == kCJ,
              "one position helper serves rows and columns");

/// The key tile [k0, k0 + 64) of the block's kv head (b, g) into Ks and Vs
/// (after the previous tile's last use), s = the scaled scores of the
/// queries in Qs (at positions pq) against it, -inf where the causal mask
/// (by position) or an end hides a pair, and pk the keys' positions.
template <int D, class T>
PLANRT_BLOCK_FN void key_tile(const Lane &l, const AttnCp &c, const KvBlock &kb,
                              const T *blk, int64_t b, int64_t g,
                              const int64_t (&pq)[kRI], int64_t k0,
                              const float *Qs, float *Ks, float *Vs,
                              float (&s)[kRI][kCJ], int64_t (&pk)[kCJ]) {
  const int64_t nk = kb.rows - k0 < kCols ? kb.rows - k0 : kCols;
  PLANRT_BLOCK_BARRIER();
  attn::load_tile<D>(l, Ks, kb.k(c, blk, b, 0, g), c.kvWidth(), k0, nk);
  attn::load_tile<D>(l, Vs, kb.v(c, blk, b, 0, g), c.kvWidth(), k0, nk);
  PLANRT_BLOCK_BARRIER();
  attn::dots<D>(l, Qs, Ks, s);
  key_positions(kb, k0, l.tx, pk);
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    PLANRT_UNROLL
    for (int j = 0; j < kCJ; ++j)
      s[i][j] = pk[j] <= pq[i] ? c.a.scale * s[i][j] : -INFINITY;
  }
}

/// The running (m, l) of this thread's query rows q0 + ty + 16 i of row
/// group bh from ml: a normalizer of 0 means no key seen yet (m is then
/// -inf, whatever ml holds), as past the end.
PLANRT_BLOCK_FN void load_running_stats(const Lane &l, const AttnCp &c,
                                        const float *ml, int64_t bh, int64_t q0,
                                        float (&m)[kRI], float (&lsum)[kRI]) {
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    const int64_t t = q0 + l.ty + kTY * i, row = bh * c.a.S + t;
    lsum[i] = t < c.a.S ? ml[2 * row + 1] : 0.0f;
    m[i] = lsum[i] > 0.0f ? ml[2 * row] : -INFINITY;
  }
}
/// The rows' final (m, l) and delta for the backward (harmless values past
/// the end).
PLANRT_BLOCK_FN void load_final_stats(const Lane &l, const AttnCp &c,
                                      const float *ml, const float *delta,
                                      int64_t bh, int64_t q0, float (&m)[kRI],
                                      float (&lsum)[kRI], float (&dl)[kRI]) {
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    const int64_t t = q0 + l.ty + kTY * i, row = bh * c.a.S + t;
    m[i] = t < c.a.S ? ml[2 * row] : 0.0f;
    lsum[i] = t < c.a.S ? ml[2 * row + 1] : 1.0f;
    dl[i] = t < c.a.S ? delta[row] : 0.0f;
  }
}

/// Whether the key tile at k0 has a key some query up to position `last`
/// sees (keys are in position order).
PLANRT_BLOCK_FN bool tile_seen(const KvBlock &kb, int64_t k0, int64_t last) {
  return k0 < kb.rows && kb.position(k0) <= last;
}

/// The dropout mask of the query and key at positions pt and pu.
PLANRT_BLOCK_FN float keep_mask(const AttnCp &c, int64_t b, int64_t h,
                                int64_t pt, int64_t pu) {
  return c.drop.z(b, h, c.S, pt, pu);
}

/// Forward over one block for query rows [q0, q0 + 64) of row group bh = b
/// H + h: their running statistics (ml) and weighted sums (acc) merged with
/// the block's visible keys (AttentionBlockFn's contract).
template <int D, class T>
PLANRT_BLOCK_FN void forward_block(const Lane &l, float *smem, const AttnCp &c,
                                   const KvBlock &kb, const T *qkv,
                                   const T *blk, float *acc, float *ml,
                                   int64_t bh, int64_t q0) {
  const kernels::AttnShape &a = c.a;
  const int64_t L = a.S, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  float *Qs = smem, *Ks = Qs + kRows * kStride<D>,
        *Vs = Ks + kRows * kStride<D>, *Ps = Vs + kRows * kStride<D>;
  const int64_t nq = L - q0 < kRows ? L - q0 : kRows;
  attn::load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
  float m[kRI], lsum[kRI], o[kRI][D / kTX];
  load_running_stats(l, c, ml, bh, q0, m, lsum);
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    const int64_t t = q0 + l.ty + kTY * i, row = bh * L + t;
    PLANRT_UNROLL
    for (int k = 0; k < D / kTX; ++k)
      o[i][k] = t < L ? acc[row * D + l.tx + kTX * k] : 0.0f;
  }
  int64_t pq[kRI], pk[kCJ];
  query_positions(c, q0, l.ty, pq);
  const int64_t last = c.part.position(q0 + nq - 1, L);
  for (int64_t k0 = 0; tile_seen(kb, k0, last); k0 += kCols) {
    float s[kRI][kCJ];
    key_tile<D>(l, c, kb, blk, b, g, pq, k0, Qs, Ks, Vs, s, pk);
    PLANRT_UNROLL
    for (int i = 0; i < kRI; ++i) {
      const float alpha = attn::online_softmax(l, s[i], m[i], lsum[i]);
      PLANRT_UNROLL
      for (int k = 0; k < D / kTX; ++k)
        o[i][k] *= alpha;
      if (c.drop.on) { // the values' weights only, not the normalizer
        PLANRT_UNROLL
        for (int j = 0; j < kCJ; ++j)
          if (s[i][j] != 0.0f)
            s[i][j] *= keep_mask(c, b, h, pq[i], pk[j]);
      }
    }
    attn::store_p(l, Ps, s);
    PLANRT_BLOCK_BARRIER();
    attn::weighted<D>(l, Ps, Vs, o);
  }
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    const int64_t t = q0 + l.ty + kTY * i, row = bh * L + t;
    if (t >= L || m[i] == -INFINITY) // past the end, or saw no key yet
      continue;
    PLANRT_UNROLL
    for (int k = 0; k < D / kTX; ++k)
      acc[row * D + l.tx + kTX * k] = o[i][k];
    if (l.tx == 0) {
      ml[2 * row] = m[i];
      ml[2 * row + 1] = lsum[i];
    }
  }
}

/// The backward's query side over one block for rows [q0, q0 + 64) of row
/// group bh: dq += scale sum p (dp - delta) k over the block's visible keys,
/// from the rows' final statistics (AttentionBlockGradQFn's contract).
template <int D, class T>
PLANRT_BLOCK_FN void
grad_q_block(const Lane &l, float *smem, const AttnCp &c, const KvBlock &kb,
             const T *qkv, const T *blk, const T *dout, const float *ml,
             const float *delta, float *dq, int64_t bh, int64_t q0) {
  const kernels::AttnShape &a = c.a;
  const int64_t L = a.S, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  float *Qs = smem, *Os = Qs + kRows * kStride<D>,
        *Ks = Os + kRows * kStride<D>, *Vs = Ks + kRows * kStride<D>,
        *Ps = Vs + kRows * kStride<D>;
  const int64_t nq = L - q0 < kRows ? L - q0 : kRows;
  attn::load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
  attn::load_tile<D>(l, Os, dout + a.o(b, 0, h), a.H * D, q0, nq);
  float m[kRI], lsum[kRI], dl[kRI], acc[kRI][D / kTX];
  load_final_stats(l, c, ml, delta, bh, q0, m, lsum, dl);
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    PLANRT_UNROLL
    for (int k = 0; k < D / kTX; ++k)
      acc[i][k] = 0.0f;
  }
  int64_t pq[kRI], pk[kCJ];
  query_positions(c, q0, l.ty, pq);
  const int64_t last = c.part.position(q0 + nq - 1, L);
  for (int64_t k0 = 0; tile_seen(kb, k0, last); k0 += kCols) {
    float s[kRI][kCJ], dp[kRI][kCJ];
    key_tile<D>(l, c, kb, blk, b, g, pq, k0, Qs, Ks, Vs, s, pk);
    attn::dots<D>(l, Os, Vs, dp);
    PLANRT_UNROLL
    for (int i = 0; i < kRI; ++i) {
      PLANRT_UNROLL
      for (int j = 0; j < kCJ; ++j) {
        if (s[i][j] == -INFINITY) {
          s[i][j] = 0.0f;
          continue;
        }
        const float p = kernels::exp_f32(s[i][j] - m[i]) / lsum[i];
        const float z = c.drop.on ? keep_mask(c, b, h, pq[i], pk[j]) : 1.0f;
        s[i][j] = p * (z * dp[i][j] - dl[i]) * a.scale;
      }
    }
    attn::store_p(l, Ps, s);
    PLANRT_BLOCK_BARRIER();
    attn::weighted<D>(l, Ps, Ks, acc);
  }
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    const int64_t t = q0 + l.ty + kTY * i;
    if (t >= L)
      continue;
    float *row = dq + (bh * L + t) * D;
    PLANRT_UNROLL
    for (int k = 0; k < D / kTX; ++k)
      row[l.tx + kTX * k] += acc[i][k];
  }
}

/// The backward's key side over one block for its keys [u0, u0 + 64) of kv
/// group bg = b KV + g: the block's dk and dv (in dkv) += this rank's
/// queries' share, over the group's query heads and the queries at or past
/// each key's position (AttentionBlockGradKVFn's contract).
template <int D, class T>
PLANRT_BLOCK_FN void
grad_kv_block(const Lane &l, float *smem, const AttnCp &c, const KvBlock &kb,
              const T *qkv, const T *blk, const T *dout, const float *ml,
              const float *delta, float *dkv, int64_t bg, int64_t u0) {
  const kernels::AttnShape &a = c.a;
  const int64_t L = a.S, b = bg / a.KV, g = bg % a.KV, rep = a.H / a.KV;
  float *Ks = smem, *Vs = Ks + kRows * kStride<D>,
        *Qs = Vs + kRows * kStride<D>, *Os = Qs + kRows * kStride<D>,
        *Ps = Os + kRows * kStride<D>, *Ms = Ps + kRows * attn::kPStride,
        *Ls = Ms + kCols, *Dl = Ls + kCols;
  const int64_t nk = kb.rows - u0 < kRows ? kb.rows - u0 : kRows;
  attn::load_tile<D>(l, Ks, kb.k(c, blk, b, 0, g), c.kvWidth(), u0, nk);
  attn::load_tile<D>(l, Vs, kb.v(c, blk, b, 0, g), c.kvWidth(), u0, nk);
  float dk[kRI][D / kTX], dv[kRI][D / kTX];
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    PLANRT_UNROLL
    for (int k = 0; k < D / kTX; ++k) {
      dk[i][k] = 0.0f;
      dv[i][k] = 0.0f;
    }
  }
  int64_t pk[kRI], pq[kCJ]; // rows: keys; columns: queries
  key_positions(kb, u0, l.ty, pk);
  const int64_t first = kb.position(u0); // the tile's earliest key
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
    const int64_t bh = b * a.H + h;
    for (int64_t q0 = 0; q0 < L; q0 += kCols) {
      const int64_t nq = L - q0 < kCols ? L - q0 : kCols;
      if (c.part.position(q0 + nq - 1, L) < first)
        continue; // every query here is before every key
      PLANRT_BLOCK_BARRIER();
      attn::load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
      attn::load_tile<D>(l, Os, dout + a.o(b, 0, h), a.H * D, q0, nq);
      attn::load_row_stats(l, ml, delta, bh * L + q0, nq, Ms, Ls, Dl);
      PLANRT_BLOCK_BARRIER();
      float s[kRI][kCJ], dp[kRI][kCJ];
      attn::dots<D>(l, Ks, Qs, s); // [key][query]
      attn::dots<D>(l, Vs, Os, dp);
      query_positions(c, q0, l.tx, pq);
      PLANRT_UNROLL
      for (int i = 0; i < kRI; ++i) {
        PLANRT_UNROLL
        for (int j = 0; j < kCJ; ++j) {
          const int jj = l.tx + kTX * j;
          const bool seen = pk[i] <= pq[j];
          const float p =
              seen ? kernels::exp_f32(a.scale * s[i][j] - Ms[jj]) / Ls[jj]
                   : 0.0f;
          // Dropout: ds from the masked dp, dv from the dropped p.
          const float z =
              c.drop.on && seen ? keep_mask(c, b, h, pq[j], pk[i]) : 1.0f;
          s[i][j] = p * z;
          dp[i][j] = p * (z * dp[i][j] - Dl[jj]) * a.scale;
        }
      }
      attn::store_p(l, Ps, s);
      PLANRT_BLOCK_BARRIER();
      attn::weighted<D>(l, Ps, Os, dv);
      PLANRT_BLOCK_BARRIER();
      attn::store_p(l, Ps, dp);
      PLANRT_BLOCK_BARRIER();
      attn::weighted<D>(l, Ps, Qs, dk);
    }
  }
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    const int64_t u = u0 + l.ty + kTY * i;
    if (u >= kb.rows)
      continue;
    float *row = dkv + (b * kb.rows + u) * c.kvWidth();
    PLANRT_UNROLL
    for (int k = 0; k < D / kTX; ++k) {
      row[g * D + l.tx + kTX * k] += dk[i][k];
      row[(a.KV + g) * D + l.tx + kTX * k] += dv[i][k];
    }
  }
}

} // namespace attn_cp
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ATTENTION_CP_BLOCKS_H
