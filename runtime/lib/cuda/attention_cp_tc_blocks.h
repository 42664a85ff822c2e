//===- attention_cp_tc_blocks.h - cp's 16-bit attention on tensor cores ---===//
//
// Context parallelism's tiles (attention_cp_blocks.h: positions from the
// sequence's split, running statistics carried between blocks, gradients
// added to) with attention_tc_blocks.h's products on the tensor cores, for
// bf16 and fp16 plans: the 16-bit operand tiles, the fp32 score tiles, p
// and ds rounded to the plan's type before their product, as one GPU's
// 16-bit tiles do. The running weighted sums (acc) are fp32 in memory and in
// the forward's fp32 staging tile; dq and dkv are added to in fp32.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_ATTENTION_CP_TC_BLOCKS_H
#define PLANRT_LIB_CUDA_ATTENTION_CP_TC_BLOCKS_H

#include "attention_cp_blocks.h"
#include "attention_tc_blocks.h"

namespace planrt {
namespace attn_cp_tc {

using attn::kCJ;
using attn::kCols;
using attn::kRI;
using attn::kRows;
using attn::kThreads;
using attn::kTX;
using attn::kTY;
using attn_tc::kFS;
using attn_tc::kOS;
using attn_tc::kPS;
using attn_tc::kTilesPerWarp;
using attn_tc::kTS;
using block::Lane;
using kernels::AttnCp;
using kernels::KvBlock;

/// Shared memory of each kernel: attention_tc_blocks.h's forward_bytes,
/// grad_q_bytes and grad_kv_bytes (the same regions).

/// The scaled score of the query at position pq and the key at pk read
/// from an fp32 score tile: -inf where the causal mask or an end hides the
/// pair (attn_cp's query_positions and key_positions mark the ends).
PLANRT_BLOCK_FN float masked(const AttnCp &c, float s, int64_t pq, int64_t pk) {
  return pk <= pq ? c.a.scale * s : -INFINITY;
}

/// The key tile at k0 of the block's kv head (b, g) into Ks and Vs (after
/// the previous tile's last use), the scores of the queries in Qs against
/// it into Ss and, with Os (dout's tile), dout . v into Dp; pk the keys'
/// positions.
template <int D, class T>
PLANRT_BLOCK_FN void key_tile(const Lane &l, const AttnCp &c, const KvBlock &kb,
                              const T *blk, int64_t b, int64_t g, int64_t k0,
                              const T *Qs, T *Ks, T *Vs, float *Ss, const T *Os,
                              float *Dp, int64_t (&pk)[kCJ]) {
  const int64_t nk = kb.rows - k0 < kCols ? kb.rows - k0 : kCols;
  PLANRT_BLOCK_BARRIER();
  attn_tc::load_tile<D>(l, Ks, kb.k(c, blk, b, 0, g), c.kvWidth(), k0, nk);
  attn_tc::load_tile<D>(l, Vs, kb.v(c, blk, b, 0, g), c.kvWidth(), k0, nk);
  PLANRT_BLOCK_BARRIER();
  attn_tc::scores<D>(l, Qs, Ks, Ss);
  if (Os) // the same for the whole block
    attn_tc::scores<D>(l, Os, Vs, Dp);
  attn_cp::key_positions(kb, k0, l.tx, pk);
  PLANRT_BLOCK_BARRIER();
}

/// Forward over one block for query rows [q0, q0 + 64) of row group bh = b
/// H + h: AttentionBlockFn's contract (attention_cp_blocks.h forward_block).
template <int D, class T>
PLANRT_BLOCK_FN void forward_block(const Lane &l, char *smem, const AttnCp &c,
                                   const KvBlock &kb, const T *qkv,
                                   const T *blk, float *acc, float *ml,
                                   int64_t bh, int64_t q0) {
  const kernels::AttnShape &a = c.a;
  const int64_t L = a.S, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  T *Qs = reinterpret_cast<T *>(smem), *Ks = Qs + kRows * kTS<D>,
    *Vs = Ks + kRows * kTS<D>, *Ps = Vs + kRows * kTS<D>;
  float *Ss = reinterpret_cast<float *>(Ps + kRows * kPS),
        *Os = Ss + kRows * kFS;
  const int64_t nq = L - q0 < kRows ? L - q0 : kRows;
  attn_tc::load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
  // The rows' running sums into the staging tile (0 past the end).
  for (int idx = l.tid; idx < kRows * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    Os[r * kOS<D> + d] = r < nq ? acc[(bh * L + q0 + r) * D + d] : 0.0f;
  }
  float m[kRI], lsum[kRI];
  attn_cp::load_running_stats(l, c, ml, bh, q0, m, lsum);
  const int64_t last = c.part.position(q0 + nq - 1, L);
  int64_t pq[kRI], pk[kCJ];
  attn_cp::query_positions(c, q0, l.ty, pq);
  for (int64_t k0 = 0; attn_cp::tile_seen(kb, k0, last); k0 += kCols) {
    key_tile<D>(l, c, kb, blk, b, g, k0, Qs, Ks, Vs, Ss, (const T *)nullptr,
                nullptr, pk);
    PLANRT_UNROLL
    for (int i = 0; i < kRI; ++i) {
      const int r = l.ty + kTY * i;
      float s[kCJ];
      PLANRT_UNROLL
      for (int j = 0; j < kCJ; ++j)
        s[j] = masked(c, Ss[r * kFS + l.tx + kTX * j], pq[i], pk[j]);
      const float alpha = attn::online_softmax(l, s, m[i], lsum[i]);
      if (c.drop.on) { // the values' weights only, not the normalizer
        PLANRT_UNROLL
        for (int j = 0; j < kCJ; ++j)
          if (s[j] != 0.0f)
            s[j] *= attn_cp::keep_mask(c, b, h, pq[i], pk[j]);
      }
      PLANRT_UNROLL
      for (int j = 0; j < kCJ; ++j)
        kernels::st(Ps[r * kPS + l.tx + kTX * j], s[j]);
      PLANRT_UNROLL
      for (int k = 0; k < D / kTX; ++k)
        Os[r * kOS<D> + l.tx + kTX * k] *= alpha;
    }
    PLANRT_BLOCK_BARRIER();
    mma::Acc o[kTilesPerWarp<D>];
    attn_tc::load_tiles<D>(l, o, Os);
    attn_tc::weighted<D>(l, Ps, Vs, o);
    attn_tc::store_tiles<D>(l, o, Os);
  }
  PLANRT_BLOCK_BARRIER();
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    const int r = l.ty + kTY * i;
    const int64_t t = q0 + r, row = bh * L + t;
    if (t >= L || m[i] == -INFINITY) // past the end, or saw no key yet
      continue;
    PLANRT_UNROLL
    for (int k = 0; k < D / kTX; ++k)
      acc[row * D + l.tx + kTX * k] = Os[r * kOS<D> + l.tx + kTX * k];
    if (l.tx == 0) {
      ml[2 * row] = m[i];
      ml[2 * row + 1] = lsum[i];
    }
  }
}

/// Rows [q0, q0 + 64) of an fp32 [64 x D] staging tile (stride kOS<D>) added
/// to the fp32 rows dst + (bh L + t) D, those before the end.
template <int D>
PLANRT_BLOCK_FN void add_rows(const Lane &l, float *dst, const float *O,
                              int64_t base, int64_t n) {
  PLANRT_UNROLL
  for (int i = 0; i < kRI; ++i) {
    const int r = l.ty + kTY * i;
    if (r >= n)
      continue;
    float *row = dst + (base + r) * D;
    PLANRT_UNROLL
    for (int k = 0; k < D / kTX; ++k)
      row[l.tx + kTX * k] += O[r * kOS<D> + l.tx + kTX * k];
  }
}

/// The backward's query side over one block for rows [q0, q0 + 64) of row
/// group bh: AttentionBlockGradQFn's contract.
template <int D, class T>
PLANRT_BLOCK_FN void
grad_q_block(const Lane &l, char *smem, const AttnCp &c, const KvBlock &kb,
             const T *qkv, const T *blk, const T *dout, const float *ml,
             const float *delta, float *dq, int64_t bh, int64_t q0) {
  const kernels::AttnShape &a = c.a;
  const int64_t L = a.S, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  T *Qs = reinterpret_cast<T *>(smem), *Os = Qs + kRows * kTS<D>,
    *Ks = Os + kRows * kTS<D>, *Vs = Ks + kRows * kTS<D>,
    *Ps = Vs + kRows * kTS<D>;
  float *Ss = reinterpret_cast<float *>(Ps + kRows * kPS),
        *Dp = Ss + kRows * kFS;
  const int64_t nq = L - q0 < kRows ? L - q0 : kRows;
  attn_tc::load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
  attn_tc::load_tile<D>(l, Os, dout + a.o(b, 0, h), a.H * D, q0, nq);
  float m[kRI], lsum[kRI], dl[kRI];
  attn_cp::load_final_stats(l, c, ml, delta, bh, q0, m, lsum, dl);
  mma::Acc acc[kTilesPerWarp<D>];
  attn_tc::zero_tiles<D>(l, acc);
  int64_t pq[kRI], pk[kCJ];
  attn_cp::query_positions(c, q0, l.ty, pq);
  const int64_t last = c.part.position(q0 + nq - 1, L);
  for (int64_t k0 = 0; attn_cp::tile_seen(kb, k0, last); k0 += kCols) {
    key_tile<D>(l, c, kb, blk, b, g, k0, Qs, Ks, Vs, Ss, Os, Dp, pk);
    PLANRT_UNROLL
    for (int i = 0; i < kRI; ++i) {
      const int r = l.ty + kTY * i;
      PLANRT_UNROLL
      for (int j = 0; j < kCJ; ++j) {
        const int cc = l.tx + kTX * j;
        const float s = masked(c, Ss[r * kFS + cc], pq[i], pk[j]);
        float ds = 0.0f;
        if (s != -INFINITY) {
          const float p = kernels::exp_f32(s - m[i]) / lsum[i];
          const float z =
              c.drop.on ? attn_cp::keep_mask(c, b, h, pq[i], pk[j]) : 1.0f;
          ds = p * (z * Dp[r * kFS + cc] - dl[i]) * a.scale;
        }
        kernels::st(Ps[r * kPS + cc], ds);
      }
    }
    PLANRT_BLOCK_BARRIER();
    attn_tc::weighted<D>(l, Ps, Ks, acc);
  }
  PLANRT_BLOCK_BARRIER();
  attn_tc::store_tiles<D>(l, acc, Ss); // Ss and Dp: room for [64 x D] floats
  PLANRT_BLOCK_BARRIER();
  add_rows<D>(l, dq, Ss, bh * L + q0, nq);
}

/// The backward's key side over one block for its keys [u0, u0 + 64) of kv
/// group bg = b KV + g: AttentionBlockGradKVFn's contract.
template <int D, class T>
PLANRT_BLOCK_FN void
grad_kv_block(const Lane &l, char *smem, const AttnCp &c, const KvBlock &kb,
              const T *qkv, const T *blk, const T *dout, const float *ml,
              const float *delta, float *dkv, int64_t bg, int64_t u0) {
  const kernels::AttnShape &a = c.a;
  const int64_t L = a.S, b = bg / a.KV, g = bg % a.KV, rep = a.H / a.KV;
  T *Ks = reinterpret_cast<T *>(smem), *Vs = Ks + kRows * kTS<D>,
    *Qs = Vs + kRows * kTS<D>, *Os = Qs + kRows * kTS<D>,
    *Ps = Os + kRows * kTS<D>, *Ds = Ps + kRows * kPS;
  float *Ss = reinterpret_cast<float *>(Ds + kRows * kPS),
        *Dp = Ss + kRows * kFS, *Ms = Dp + kRows * kFS, *Ls = Ms + kCols,
        *Dl = Ls + kCols;
  const int64_t nk = kb.rows - u0 < kRows ? kb.rows - u0 : kRows;
  attn_tc::load_tile<D>(l, Ks, kb.k(c, blk, b, 0, g), c.kvWidth(), u0, nk);
  attn_tc::load_tile<D>(l, Vs, kb.v(c, blk, b, 0, g), c.kvWidth(), u0, nk);
  mma::Acc dk[kTilesPerWarp<D>], dv[kTilesPerWarp<D>];
  attn_tc::zero_tiles<D>(l, dk);
  attn_tc::zero_tiles<D>(l, dv);
  int64_t pk[kRI], pq[kCJ]; // rows: keys; columns: queries
  attn_cp::key_positions(kb, u0, l.ty, pk);
  const int64_t first = kb.position(u0); // the tile's earliest key
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
    const int64_t bh = b * a.H + h;
    for (int64_t q0 = 0; q0 < L; q0 += kCols) {
      const int64_t nq = L - q0 < kCols ? L - q0 : kCols;
      if (c.part.position(q0 + nq - 1, L) < first)
        continue; // every query here is before every key
      PLANRT_BLOCK_BARRIER();
      attn_tc::load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
      attn_tc::load_tile<D>(l, Os, dout + a.o(b, 0, h), a.H * D, q0, nq);
      attn::load_row_stats(l, ml, delta, bh * L + q0, nq, Ms, Ls, Dl);
      PLANRT_BLOCK_BARRIER();
      attn_tc::scores<D>(l, Ks, Qs, Ss); // [key][query]
      attn_tc::scores<D>(l, Vs, Os, Dp);
      attn_cp::query_positions(c, q0, l.tx, pq);
      PLANRT_BLOCK_BARRIER();
      PLANRT_UNROLL
      for (int i = 0; i < kRI; ++i) {
        const int r = l.ty + kTY * i;
        PLANRT_UNROLL
        for (int j = 0; j < kCJ; ++j) {
          const int cc = l.tx + kTX * j;
          const bool seen = pk[i] <= pq[j];
          const float p =
              seen ? kernels::exp_f32(a.scale * Ss[r * kFS + cc] - Ms[cc]) /
                         Ls[cc]
                   : 0.0f;
          // Dropout: ds from the masked dp, dv from the dropped p.
          const float z = c.drop.on && seen
                              ? attn_cp::keep_mask(c, b, h, pq[j], pk[i])
                              : 1.0f;
          kernels::st(Ps[r * kPS + cc], p * z);
          kernels::st(Ds[r * kPS + cc],
                      p * (z * Dp[r * kFS + cc] - Dl[cc]) * a.scale);
        }
      }
      PLANRT_BLOCK_BARRIER();
      attn_tc::weighted<D>(l, Ps, Os, dv);
      attn_tc::weighted<D>(l, Ds, Qs, dk);
    }
  }
  // dk, then dv, through the score tiles (a named array each: selecting
  // one at run time would move the accumulators to local memory), added to
  // the block's rows of dkv.
  auto write = [&](const mma::Acc(&acc)[kTilesPerWarp<D>], int64_t col) {
    PLANRT_BLOCK_BARRIER();
    attn_tc::store_tiles<D>(l, acc, Ss);
    PLANRT_BLOCK_BARRIER();
    PLANRT_UNROLL
    for (int i = 0; i < kRI; ++i) {
      const int r = l.ty + kTY * i;
      const int64_t u = u0 + r;
      if (u >= kb.rows)
        continue;
      float *row = dkv + (b * kb.rows + u) * c.kvWidth() + col;
      PLANRT_UNROLL
      for (int k = 0; k < D / kTX; ++k)
        row[l.tx + kTX * k] += Ss[r * kOS<D> + l.tx + kTX * k];
    }
  };
  write(dk, g * D);
  write(dv, (a.KV + g) * D);
}

} // namespace attn_cp_tc
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ATTENTION_CP_TC_BLOCKS_H
