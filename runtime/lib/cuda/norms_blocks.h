//===- norms_blocks.h - Layer and RMS norm, 16 lanes per row --------------===//
//
// The norms' row work (the normalized output, the input's gradient) with a
// row to each half warp: 16 lanes read the row's elements 16 apart
// (adjacent lanes, adjacent elements), sum their parts and reduce them with
// shuffles; a block of 256 threads holds 16 rows. The per-row functors of
// kernels.h gave a row one thread that walked all of it. Each kernel
// computes its rows' statistics itself (a separate statistics kernel read
// every row from memory once more); the backward stores them for the
// parameters' gradients (sums over rows), which are column_sums_blocks.h's.
// The backward can add the residual stream's gradient to dx as it writes
// it (kernels::NormGradXFn's plus), which saves an add's three passes.
// Where a row is a multiple of 8 elements and every buffer 16-byte aligned
// (GPT-2's 768 columns: 6 groups a lane), a lane moves 8 consecutive
// elements at a time with 128-bit accesses (one for 16-bit types, two for
// fp32; elementwise_blocks.h's Group), not one 2- or 4-byte element: a
// half warp reads 256 contiguous bytes of a 16-bit row per instruction
// instead of 32, and issues an eighth of the loads. Otherwise (W = 1) a
// lane takes single elements 16 apart.
// Formulas and rounding follow kernels::norm_row_stats, NormFn and
// NormGradXFn; only the order of each row's sums differs (lane partials,
// then a tree).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_NORMS_BLOCKS_H
#define PLANRT_LIB_CUDA_NORMS_BLOCKS_H

#include "block.h"
#include "elementwise_blocks.h"
#include "planrt/kernels.h"

#include <cmath>

namespace planrt {
namespace norms {

using block::Lane;
using block::row_sum16;
using kernels::ld;
using kernels::st;

constexpr int kTX = block::kTX, kRowsPerBlock = 16,
              kThreads = kTX * kRowsPerBlock;
/// Elements a lane moves at a time on the 128-bit path.
constexpr int kGroup = elementwise::kGroup;

/// Whether rows of C elements take the 128-bit path: C a multiple of
/// kGroup and every buffer (null ones aside) 16-byte aligned, so that every
/// row's groups are too.
template <class... P> inline bool grouped(int64_t C, const P *...ps) {
  return C % kGroup == 0 && ((!ps || elementwise::aligned16(ps)) && ...);
}

/// W elements of p (W = 1, or kGroup from a 16-byte aligned p) as floats.
template <int W, class T> PLANRT_BLOCK_FN void load(const T *p, float (&v)[W]) {
  if constexpr (W == 1) {
    v[0] = ld(p[0]);
  } else {
    static_assert(W == kGroup, "single elements or a group");
    elementwise::Group<T> g;
    g.load(p);
    PLANRT_UNROLL
    for (int k = 0; k < W; ++k)
      v[k] = ld(g.v[k]);
  }
}
template <int W, class T>
PLANRT_BLOCK_FN void store(T *p, const float (&v)[W]) {
  if constexpr (W == 1) {
    st(p[0], v[0]);
  } else {
    elementwise::Group<T> g;
    PLANRT_UNROLL
    for (int k = 0; k < W; ++k)
      st(g.v[k], v[k]);
    g.store(p);
  }
}

/// The statistics of row xr (kernels::norm_row_stats) on the 16 lanes of
/// its half warp, W elements a lane at a time; every lane must come, `live`
/// or not (a row past the end: its lanes add nothing).
template <int W, class T>
PLANRT_BLOCK_FN void row_stats(const Lane &l, const T *xr, int64_t C,
                               bool centered, float eps, bool live, float &mu,
                               float &rs) {
  mu = 0.0f;
  float x[W];
  if (centered) {
    float s = 0.0f;
    if (live)
      for (int64_t j = l.tx * W; j < C; j += kTX * W) {
        load<W>(xr + j, x);
        PLANRT_UNROLL
        for (int k = 0; k < W; ++k)
          s += x[k];
      }
    mu = row_sum16(l, s) / (float)C;
  }
  float v = 0.0f;
  if (live)
    for (int64_t j = l.tx * W; j < C; j += kTX * W) {
      load<W>(xr + j, x);
      PLANRT_UNROLL
      for (int k = 0; k < W; ++k) {
        float d = x[k] - mu;
        v += d * d;
      }
    }
  float var = row_sum16(l, v) / (float)C;
  rs = 1.0f / sqrtf(var + eps);
}

/// out = (x - mean) rstd gamma + beta for row r0 + ty.
template <int W, class T>
PLANRT_BLOCK_FN void norm_block(const Lane &l, const kernels::NormFn<T> &f,
                                int64_t rows, int64_t r0) {
  const int64_t r = r0 + l.ty;
  const bool live = r < rows;
  const T *xr = f.x + (live ? r : 0) * f.C;
  float mu, rs;
  row_stats<W>(l, xr, f.C, f.beta != nullptr, f.eps, live, mu, rs);
  if (!live)
    return;
  for (int64_t j = l.tx * W; j < f.C; j += kTX * W) {
    float x[W], g[W], y[W];
    load<W>(xr + j, x);
    load<W>(f.gamma + j, g);
    PLANRT_UNROLL
    for (int k = 0; k < W; ++k)
      y[k] = (x[k] - mu) * rs * g[k];
    if (f.beta) {
      float b[W];
      load<W>(f.beta + j, b);
      PLANRT_UNROLL
      for (int k = 0; k < W; ++k)
        y[k] = y[k] + b[k];
    }
    store<W>(f.out + r * f.C + j, y);
  }
}

/// dx of row r0 + ty (kernels::NormGradXFn), and the row's statistics.
template <int W, class T>
PLANRT_BLOCK_FN void grad_x_block(const Lane &l,
                                  const kernels::NormGradXFn<T> &f,
                                  int64_t rows, int64_t r0) {
  const int64_t r = r0 + l.ty;
  const bool live = r < rows;
  const int64_t rr = live ? r : 0;
  const T *xr = f.x + rr * f.C, *dyr = f.dout + rr * f.C;
  float mu, rs;
  row_stats<W>(l, xr, f.C, f.mean != nullptr, f.eps, live, mu, rs);
  if (live && l.tx == 0) {
    if (f.mean)
      f.mean[r] = mu;
    f.rstd[r] = rs;
  }
  float a = 0.0f, b = 0.0f;
  if (live)
    for (int64_t j = l.tx * W; j < f.C; j += kTX * W) {
      float x[W], g[W], dy[W];
      load<W>(xr + j, x);
      load<W>(f.gamma + j, g);
      load<W>(dyr + j, dy);
      PLANRT_UNROLL
      for (int k = 0; k < W; ++k) {
        float gd = g[k] * dy[k];
        a += gd;
        b += gd * (x[k] - mu) * rs;
      }
    }
  a = row_sum16(l, a);
  b = row_sum16(l, b);
  if (!live)
    return;
  a = f.mean ? a / (float)f.C : 0.0f;
  b /= (float)f.C;
  for (int64_t j = l.tx * W; j < f.C; j += kTX * W) {
    float x[W], g[W], dy[W], v[W];
    load<W>(xr + j, x);
    load<W>(f.gamma + j, g);
    load<W>(dyr + j, dy);
    PLANRT_UNROLL
    for (int k = 0; k < W; ++k) {
      float xhat = (x[k] - mu) * rs;
      v[k] = rs * (g[k] * dy[k] - a - xhat * b);
    }
    if (f.plus) {
      float p[W];
      load<W>(f.plus + r * f.C + j, p);
      PLANRT_UNROLL
      for (int k = 0; k < W; ++k)
        v[k] = v[k] + p[k];
    }
    store<W>(f.dx + r * f.C + j, v);
  }
}

} // namespace norms
} // namespace planrt

#endif // PLANRT_LIB_CUDA_NORMS_BLOCKS_H
