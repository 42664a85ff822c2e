//===- attention_tc_blocks.h - 16-bit attention tiles on the tensor cores -===//
//
// The same flash scheme as attention_blocks.h (read its essay first: a block
// of 256 threads owns 64 rows and walks the other side in tiles of 64, the
// online softmax, the two backward passes, one owner for every sum), for
// bf16 and fp16 plans, with the products on the tensor cores (mma.h):
//   scores:   C[64 x 64] = A[64 x D] B[64 x D]^T into fp32 shared memory;
//             each of the 8 warps computes two of the 16 tiles of 16 x 16;
//   weighted: O[64 x D] += P[64 x 64] V[64 x D]; each warp owns D / 32
//             output tiles (at least one), kept in registers across the
//             walk where nothing rescales them (dq, dk, dv) and in shared
//             memory in the forward, whose online softmax rescales rows.
// The operand tiles stay 16-bit in shared memory (copied 16 bytes at a time,
// rows padded by 8 values so that fragment loads stay 32-byte aligned), and
// the probabilities p and the score gradients ds are rounded to the plan's
// 16-bit type before their product, as flash attention does; everything
// else (the row statistics, delta, the accumulators) is fp32. The per-thread
// softmax arithmetic is attention_blocks.h's, on the same thread layout: row
// ty + 16 i, column tx + 16 j.
//
// fp32 plans keep attention_blocks.h's fp32 FMAs (they are compared with the
// host to 1e-4). The host runs these blocks too (mma.h's emulation; the
// tests in test/runtime/cuda/blocks_test.cpp).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_ATTENTION_TC_BLOCKS_H
#define PLANRT_LIB_CUDA_ATTENTION_TC_BLOCKS_H

#include "attention_blocks.h"
#include "mma.h"

#include <cstdint>

namespace planrt {
namespace attn_tc {

using attn::kCJ;
using attn::kCols;
using attn::kRI;
using attn::kRows;
using attn::kThreads;
using attn::kTX;
using attn::kTY;
using block::Lane;
using block::row_max16;
using block::row_sum16;
using kernels::exp_f32;

constexpr int kWarps = kThreads / mma::kWarp;
static_assert(kRows == 4 * mma::kEdge && kCols == 4 * mma::kEdge && kWarps == 8,
              "the tile assignments below assume 64 x 64 tiles, 8 warps");

/// Row strides in shared memory: 16-bit [rows x D] tiles and the 16-bit
/// [64 x 64] p / ds tile (8 values of padding), fp32 scores (4 floats) and
/// fp32 [64 x D] accumulators.
template <int D> constexpr int kTS = D + 8;
constexpr int kPS = kCols + 8;
constexpr int kFS = kCols + 4;
template <int D> constexpr int kOS = D + 4;

/// Bytes of each region (all multiples of 32: the regions stay aligned).
template <int D> constexpr size_t kTileBytes = (size_t)kRows *kTS<D> * 2;
constexpr size_t kPBytes = (size_t)kRows * kPS * 2;
constexpr size_t kSBytes = (size_t)kRows * kFS * 4;
template <int D> constexpr size_t kOBytes = (size_t)kRows *kOS<D> * 4;

/// The output tiles of a [64 x D] product and how many each warp owns.
template <int D> constexpr int kOutTiles = (kRows / mma::kEdge) * (D / 16);
template <int D>
constexpr int kTilesPerWarp = (kOutTiles<D> + kWarps - 1) / kWarps;

/// Shared memory of each kernel.
template <int D> constexpr size_t forward_bytes() {
  return 3 * kTileBytes<D> + kPBytes + kSBytes + kOBytes<D>;
}
template <int D> constexpr size_t grad_q_bytes() {
  return 4 * kTileBytes<D> + kPBytes + 2 * kSBytes;
}
template <int D> constexpr size_t grad_kv_bytes() {
  return 4 * kTileBytes<D> + 2 * kPBytes + 2 * kSBytes + 3 * kCols * 4;
}
// The backward stages its [64 x D] results in the two score tiles.
static_assert(2 * kSBytes >= kOBytes<128>, "");

/// dst[r] = src row (row0 + r), 16-bit as stored, rows past `valid` zero.
template <int D, class T>
PLANRT_BLOCK_FN void load_tile(const Lane &l, T *dst, const T *src,
                               int64_t src_stride, int64_t row0,
                               int64_t valid) {
  constexpr int V = 8, per_row = D / V; // 8 values: 16 bytes
  for (int idx = l.tid; idx < kRows * per_row; idx += kThreads) {
    const int r = idx / per_row, c = (idx % per_row) * V;
#ifdef __CUDACC__
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < valid)
      v = *reinterpret_cast<const uint4 *>(src + (row0 + r) * src_stride + c);
    *reinterpret_cast<uint4 *>(dst + r * kTS<D> + c) = v;
#else
    for (int e = 0; e < V; ++e)
      dst[r * kTS<D> + c + e] =
          r < valid ? src[(row0 + r) * src_stride + c + e] : T{};
#endif
  }
}

/// C[64 x 64] (fp32, stride kFS) = A B^T for 16-bit [64 x D] tiles A and
/// B: warp w computes row tile w / 2, column tiles 2 (w % 2) and the next.
template <int D, class T>
PLANRT_BLOCK_FN void scores(const Lane &l, const T *A, const T *B, float *C) {
  const int w = mma::warp_of(l), r = w / 2, c = (w % 2) * 2;
  mma::Acc c0, c1;
  mma::zero(l, c0);
  mma::zero(l, c1);
  PLANRT_UNROLL
  for (int k = 0; k < D; k += mma::kEdge) {
    mma::A<T> a;
    mma::B<T, true> b0, b1;
    mma::load(l, a, A + r * mma::kEdge * kTS<D> + k, kTS<D>);
    mma::load(l, b0, B + c * mma::kEdge * kTS<D> + k, kTS<D>);
    mma::load(l, b1, B + (c + 1) * mma::kEdge * kTS<D> + k, kTS<D>);
    mma::mma(l, c0, a, b0);
    mma::mma(l, c1, a, b1);
  }
  mma::store(l, c0, C + r * mma::kEdge * kFS + c * mma::kEdge, kFS);
  mma::store(l, c1, C + r * mma::kEdge * kFS + (c + 1) * mma::kEdge, kFS);
}

/// acc[n] += (P V) tile w + 8 n (of this warp w): P [64 x 64] 16-bit
/// (stride kPS), V [64 x D] 16-bit (stride kTS<D>).
template <int D, class T>
PLANRT_BLOCK_FN void weighted(const Lane &l, const T *P, const T *V,
                              mma::Acc (&acc)[kTilesPerWarp<D>]) {
  const int w = mma::warp_of(l);
  PLANRT_UNROLL
  for (int n = 0; n < kTilesPerWarp<D>; ++n) {
    const int t = w + kWarps * n; // the same for the whole warp
    if (t >= kOutTiles<D>)
      break;
    const int r = t / (D / 16), c = t % (D / 16);
    PLANRT_UNROLL
    for (int k = 0; k < kCols; k += mma::kEdge) {
      mma::A<T> a;
      mma::B<T, false> b;
      mma::load(l, a, P + r * mma::kEdge * kPS + k, kPS);
      mma::load(l, b, V + k * kTS<D> + c * mma::kEdge, kTS<D>);
      mma::mma(l, acc[n], a, b);
    }
  }
}

/// The offset of output tile t in an fp32 [64 x D] matrix of stride kOS<D>.
template <int D> PLANRT_BLOCK_FN int tile_offset(int t) {
  return (t / (D / 16)) * mma::kEdge * kOS<D> + (t % (D / 16)) * mma::kEdge;
}
/// This warp's output tiles from (load) or to (store) such a matrix.
template <int D>
PLANRT_BLOCK_FN void
load_tiles(const Lane &l, mma::Acc (&acc)[kTilesPerWarp<D>], const float *O) {
  const int w = mma::warp_of(l);
  PLANRT_UNROLL
  for (int n = 0; n < kTilesPerWarp<D>; ++n)
    if (w + kWarps * n < kOutTiles<D>)
      mma::load(l, acc[n], O + tile_offset<D>(w + kWarps * n), kOS<D>);
}
template <int D>
PLANRT_BLOCK_FN void
store_tiles(const Lane &l, const mma::Acc (&acc)[kTilesPerWarp<D>], float *O) {
  const int w = mma::warp_of(l);
  PLANRT_UNROLL
  for (int n = 0; n < kTilesPerWarp<D>; ++n)
    if (w + kWarps * n < kOutTiles<D>)
      mma::store(l, acc[n], O + tile_offset<D>(w + kWarps * n), kOS<D>);
}
template <int D>
PLANRT_BLOCK_FN void zero_tiles(const Lane &l,
                                mma::Acc (&acc)[kTilesPerWarp<D>]) {
  PLANRT_UNROLL
  for (int n = 0; n < kTilesPerWarp<D>; ++n)
    mma::zero(l, acc[n]);
}

/// Row r of an fp32 [64 x D] staging matrix (stride kOS<D>) to the 16-bit
/// row `dst`, the thread's columns tx + 16 k.
template <int D, class T>
PLANRT_BLOCK_FN void store_row(const Lane &l, T *dst, const float *O, int r,
                               float scale) {
  for (int k = 0; k < D / kTX; ++k)
    kernels::st(dst[l.tx + kTX * k], O[r * kOS<D> + l.tx + kTX * k] * scale);
}

/// The scaled score of query t and key u read from an fp32 score tile,
/// -inf where the causal mask or the end of the sequence hides the pair.
PLANRT_BLOCK_FN float masked(const kernels::AttnShape &a, float s, int64_t t,
                             int64_t u) {
  return (u <= t && t < a.S) ? a.scale * s : -INFINITY;
}

/// The forward of query rows [q0, q0 + 64) of row group bh = b H + h: out,
/// and with `stats` (m, l) per row.
template <int D, class T>
PLANRT_BLOCK_FN void forward_block(const Lane &l, char *smem,
                                   const kernels::AttnShape &a, const T *qkv,
                                   T *out, float *stats, int64_t bh, int64_t q0,
                                   const kernels::AttnDropout &drop = {}) {
  const int64_t S = a.S, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  T *Qs = reinterpret_cast<T *>(smem), *Ks = Qs + kRows * kTS<D>,
    *Vs = Ks + kRows * kTS<D>, *Ps = Vs + kRows * kTS<D>;
  float *Ss = reinterpret_cast<float *>(Ps + kRows * kPS),
        *Os = Ss + kRows * kFS;
  const int64_t nq = S - q0 < kRows ? S - q0 : kRows;
  load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
  for (int idx = l.tid; idx < kRows * kOS<D>; idx += kThreads)
    Os[idx] = 0.0f;
  float m[kRI], lsum[kRI];
  for (int i = 0; i < kRI; ++i) {
    m[i] = -INFINITY;
    lsum[i] = 0.0f;
  }
  const int64_t last = q0 + nq - 1; // the last key any row here sees
  for (int64_t k0 = 0; k0 <= last; k0 += kCols) {
    const int64_t nk = S - k0 < kCols ? S - k0 : kCols;
    PLANRT_BLOCK_BARRIER();
    load_tile<D>(l, Ks, a.k(qkv, b, 0, g), a.width(), k0, nk);
    load_tile<D>(l, Vs, a.v(qkv, b, 0, g), a.width(), k0, nk);
    PLANRT_BLOCK_BARRIER();
    scores<D>(l, Qs, Ks, Ss);
    PLANRT_BLOCK_BARRIER();
    PLANRT_UNROLL
    for (int i = 0; i < kRI; ++i) {
      const int r = l.ty + kTY * i;
      const int64_t t = q0 + r;
      float s[kCJ];
      for (int j = 0; j < kCJ; ++j) {
        const int c = l.tx + kTX * j;
        s[j] = masked(a, Ss[r * kFS + c], t, k0 + c);
      }
      const float alpha = attn::online_softmax(l, s, m[i], lsum[i]);
      if (drop.on) // the values' weights only, not the normalizer
        for (int j = 0; j < kCJ; ++j)
          s[j] *= drop.z(b, h, S, t, k0 + l.tx + kTX * j);
      for (int j = 0; j < kCJ; ++j)
        kernels::st(Ps[r * kPS + l.tx + kTX * j], s[j]);
      for (int k = 0; k < D / kTX; ++k)
        Os[r * kOS<D> + l.tx + kTX * k] *= alpha;
    }
    PLANRT_BLOCK_BARRIER();
    mma::Acc o[kTilesPerWarp<D>];
    load_tiles<D>(l, o, Os);
    weighted<D>(l, Ps, Vs, o);
    store_tiles<D>(l, o, Os);
  }
  PLANRT_BLOCK_BARRIER();
  for (int i = 0; i < kRI; ++i) {
    const int r = l.ty + kTY * i;
    const int64_t t = q0 + r;
    if (t >= S)
      continue;
    store_row<D>(l, out + a.o(b, t, h), Os, r, 1.0f / lsum[i]);
    if (stats && l.tx == 0)
      attn::save_stats(stats, bh, S, t, m[i], lsum[i]);
  }
}

/// The backward's query side for rows [q0, q0 + 64) of row group bh:
/// rowstats (m, l) and delta per row, and dq.
template <int D, class T>
PLANRT_BLOCK_FN void
grad_q_block(const Lane &l, char *smem, const kernels::AttnShape &a,
             const T *qkv, const T *dout, T *dqkv, const float *stats,
             float *rowstats, float *delta, int64_t bh, int64_t q0,
             const kernels::AttnDropout &drop = {}) {
  const int64_t S = a.S, b = bh / a.H, h = bh % a.H, g = h / (a.H / a.KV);
  T *Qs = reinterpret_cast<T *>(smem), *Os = Qs + kRows * kTS<D>,
    *Ks = Os + kRows * kTS<D>, *Vs = Ks + kRows * kTS<D>,
    *Ps = Vs + kRows * kTS<D>;
  float *Ss = reinterpret_cast<float *>(Ps + kRows * kPS),
        *Dp = Ss + kRows * kFS;
  const int64_t nq = S - q0 < kRows ? S - q0 : kRows;
  load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
  load_tile<D>(l, Os, dout + a.o(b, 0, h), a.H * D, q0, nq);
  float m[kRI], lsum[kRI], pdp[kRI], lpart[kRI];
  for (int i = 0; i < kRI; ++i) {
    attn::load_stats(stats, bh, S, q0 + l.ty + kTY * i, m[i], lsum[i]);
    pdp[i] = 0.0f; // this lane's part until the end of the pass
    lpart[i] = 0.0f;
  }
  const int64_t last = q0 + nq - 1;
  // Scores and dp = dout . v of key tile k0 into Ss and Dp.
  auto tile = [&](int64_t k0) {
    const int64_t nk = S - k0 < kCols ? S - k0 : kCols;
    PLANRT_BLOCK_BARRIER();
    load_tile<D>(l, Ks, a.k(qkv, b, 0, g), a.width(), k0, nk);
    load_tile<D>(l, Vs, a.v(qkv, b, 0, g), a.width(), k0, nk);
    PLANRT_BLOCK_BARRIER();
    scores<D>(l, Qs, Ks, Ss);
    scores<D>(l, Os, Vs, Dp);
    PLANRT_BLOCK_BARRIER();
  };
  // Pass 1: (m, l) unless kept, and sum e dp, rescaled as m grows.
  for (int64_t k0 = 0; k0 <= last; k0 += kCols) {
    tile(k0);
    for (int i = 0; i < kRI; ++i) {
      const int r = l.ty + kTY * i;
      const int64_t t = q0 + r;
      float s[kCJ], dp[kCJ];
      for (int j = 0; j < kCJ; ++j) {
        const int c = l.tx + kTX * j;
        s[j] = masked(a, Ss[r * kFS + c], t, k0 + c);
        dp[j] = Dp[r * kFS + c];
        if (drop.on) // the dropped probabilities' gradient
          dp[j] *= drop.z(b, h, S, t, k0 + c);
      }
      attn::stats_pass(l, stats != nullptr, s, dp, m[i], lpart[i], pdp[i]);
    }
  }
  float dl[kRI];
  for (int i = 0; i < kRI; ++i) {
    const int64_t t = q0 + l.ty + kTY * i;
    dl[i] = attn::finish_stats(l, stats != nullptr, S, bh * S + t, t, m[i],
                               lsum[i], lpart[i], pdp[i], rowstats, delta);
  }
  // Pass 2: dq = scale sum p (dp - delta) k.
  mma::Acc dq[kTilesPerWarp<D>];
  zero_tiles<D>(l, dq);
  for (int64_t k0 = 0; k0 <= last; k0 += kCols) {
    tile(k0);
    for (int i = 0; i < kRI; ++i) {
      const int r = l.ty + kTY * i;
      const int64_t t = q0 + r;
      for (int j = 0; j < kCJ; ++j) {
        const int c = l.tx + kTX * j;
        const float s = masked(a, Ss[r * kFS + c], t, k0 + c);
        const float p = s == -INFINITY ? 0.0f : exp_f32(s - m[i]) / lsum[i];
        float dp = Dp[r * kFS + c];
        if (drop.on)
          dp *= drop.z(b, h, S, t, k0 + c);
        kernels::st(Ps[r * kPS + c], p * (dp - dl[i]) * a.scale);
      }
    }
    PLANRT_BLOCK_BARRIER();
    weighted<D>(l, Ps, Ks, dq);
  }
  PLANRT_BLOCK_BARRIER();
  store_tiles<D>(l, dq, Ss); // Ss and Dp: room for [64 x D] floats
  PLANRT_BLOCK_BARRIER();
  for (int i = 0; i < kRI; ++i) {
    const int r = l.ty + kTY * i;
    const int64_t t = q0 + r;
    if (t < S)
      store_row<D>(l, dqkv + (a.q(qkv, b, t, h) - qkv), Ss, r, 1.0f);
  }
}

/// The backward's key side for keys [u0, u0 + 64) of kv group bg = b KV +
/// g: dk and dv, summed over the group's query heads and the queries t >= u
/// (reads the rowstats and delta grad_q_block wrote).
template <int D, class T>
PLANRT_BLOCK_FN void
grad_kv_block(const Lane &l, char *smem, const kernels::AttnShape &a,
              const T *qkv, const T *dout, T *dqkv, const float *rowstats,
              const float *delta, int64_t bg, int64_t u0,
              const kernels::AttnDropout &drop = {}) {
  const int64_t S = a.S, b = bg / a.KV, g = bg % a.KV, rep = a.H / a.KV;
  T *Ks = reinterpret_cast<T *>(smem), *Vs = Ks + kRows * kTS<D>,
    *Qs = Vs + kRows * kTS<D>, *Os = Qs + kRows * kTS<D>,
    *Ps = Os + kRows * kTS<D>, *Ds = Ps + kRows * kPS;
  float *Ss = reinterpret_cast<float *>(Ds + kRows * kPS),
        *Dp = Ss + kRows * kFS, *Ms = Dp + kRows * kFS, *Ls = Ms + kCols,
        *Dl = Ls + kCols;
  const int64_t nk = S - u0 < kRows ? S - u0 : kRows;
  load_tile<D>(l, Ks, a.k(qkv, b, 0, g), a.width(), u0, nk);
  load_tile<D>(l, Vs, a.v(qkv, b, 0, g), a.width(), u0, nk);
  mma::Acc dk[kTilesPerWarp<D>], dv[kTilesPerWarp<D>];
  zero_tiles<D>(l, dk);
  zero_tiles<D>(l, dv);
  for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
    const int64_t bh = b * a.H + h;
    for (int64_t q0 = u0; q0 < S; q0 += kCols) {
      const int64_t nq = S - q0 < kCols ? S - q0 : kCols;
      PLANRT_BLOCK_BARRIER();
      load_tile<D>(l, Qs, a.q(qkv, b, 0, h), a.width(), q0, nq);
      load_tile<D>(l, Os, dout + a.o(b, 0, h), a.H * D, q0, nq);
      attn::load_row_stats(l, rowstats, delta, bh * S + q0, nq, Ms, Ls, Dl);
      PLANRT_BLOCK_BARRIER();
      scores<D>(l, Ks, Qs, Ss); // [key][query]
      scores<D>(l, Vs, Os, Dp);
      PLANRT_BLOCK_BARRIER();
      for (int i = 0; i < kRI; ++i) {
        const int r = l.ty + kTY * i;
        const int64_t u = u0 + r;
        for (int j = 0; j < kCJ; ++j) {
          const int c = l.tx + kTX * j;
          const int64_t t = q0 + c;
          const bool seen = u <= t && t < S && u < S;
          const float p =
              seen ? exp_f32(a.scale * Ss[r * kFS + c] - Ms[c]) / Ls[c] : 0.0f;
          // Dropout: ds from the masked dp, dv from the dropped p.
          const float z = drop.on && seen ? drop.z(b, h, S, t, u) : 1.0f;
          kernels::st(Ps[r * kPS + c], p * z);
          kernels::st(Ds[r * kPS + c],
                      p * (z * Dp[r * kFS + c] - Dl[c]) * a.scale);
        }
      }
      PLANRT_BLOCK_BARRIER();
      weighted<D>(l, Ps, Os, dv);
      weighted<D>(l, Ds, Qs, dk);
    }
  }
  // dk, then dv, through the score tiles (a named array each: selecting
  // one at run time would move the accumulators to local memory).
  auto write = [&](const mma::Acc(&acc)[kTilesPerWarp<D>], bool keys) {
    PLANRT_BLOCK_BARRIER();
    store_tiles<D>(l, acc, Ss);
    PLANRT_BLOCK_BARRIER();
    for (int i = 0; i < kRI; ++i) {
      const int r = l.ty + kTY * i;
      const int64_t u = u0 + r;
      if (u >= S)
        continue;
      const T *src = keys ? a.k(qkv, b, u, g) : a.v(qkv, b, u, g);
      store_row<D>(l, dqkv + (src - qkv), Ss, r, 1.0f);
    }
  };
  write(dk, true);
  write(dv, false);
}

} // namespace attn_tc
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ATTENTION_TC_BLOCKS_H
