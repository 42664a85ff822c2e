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
// Formulas and rounding follow kernels::norm_row_stats, NormFn and
// NormGradXFn; only the order of each row's sums differs (lane partials,
// then a tree).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_NORMS_BLOCKS_H
#define PLANRT_LIB_CUDA_NORMS_BLOCKS_H

#include "block.h"
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

/// The statistics of row xr (kernels::norm_row_stats) on the 16 lanes of
/// its half warp; every lane must come, `live` or not (a row past the end:
/// its lanes add nothing).
template <class T>
PLANRT_BLOCK_FN void row_stats(const Lane &l, const T *xr, int64_t C,
                               bool centered, float eps, bool live, float &mu,
                               float &rs) {
  mu = 0.0f;
  if (centered) {
    float s = 0.0f;
    if (live)
      for (int64_t j = l.tx; j < C; j += kTX)
        s += ld(xr[j]);
    mu = row_sum16(l, s) / (float)C;
  }
  float v = 0.0f;
  if (live)
    for (int64_t j = l.tx; j < C; j += kTX) {
      float d = ld(xr[j]) - mu;
      v += d * d;
    }
  float var = row_sum16(l, v) / (float)C;
  rs = 1.0f / sqrtf(var + eps);
}

/// out = (x - mean) rstd gamma + beta for row r0 + ty.
template <class T>
PLANRT_BLOCK_FN void norm_block(const Lane &l, const kernels::NormFn<T> &f,
                                int64_t rows, int64_t r0) {
  const int64_t r = r0 + l.ty;
  const bool live = r < rows;
  const T *xr = f.x + (live ? r : 0) * f.C;
  float mu, rs;
  row_stats(l, xr, f.C, f.beta != nullptr, f.eps, live, mu, rs);
  if (!live)
    return;
  for (int64_t j = l.tx; j < f.C; j += kTX) {
    float y = (ld(xr[j]) - mu) * rs * ld(f.gamma[j]);
    st(f.out[r * f.C + j], f.beta ? y + ld(f.beta[j]) : y);
  }
}

/// dx of row r0 + ty (kernels::NormGradXFn), and the row's statistics.
template <class T>
PLANRT_BLOCK_FN void grad_x_block(const Lane &l,
                                  const kernels::NormGradXFn<T> &f,
                                  int64_t rows, int64_t r0) {
  const int64_t r = r0 + l.ty;
  const bool live = r < rows;
  const int64_t rr = live ? r : 0;
  const T *xr = f.x + rr * f.C, *dyr = f.dout + rr * f.C;
  float mu, rs;
  row_stats(l, xr, f.C, f.mean != nullptr, f.eps, live, mu, rs);
  if (live && l.tx == 0) {
    if (f.mean)
      f.mean[r] = mu;
    f.rstd[r] = rs;
  }
  float a = 0.0f, b = 0.0f;
  if (live)
    for (int64_t j = l.tx; j < f.C; j += kTX) {
      float gd = ld(f.gamma[j]) * ld(dyr[j]);
      a += gd;
      b += gd * (ld(xr[j]) - mu) * rs;
    }
  a = row_sum16(l, a);
  b = row_sum16(l, b);
  if (!live)
    return;
  a = f.mean ? a / (float)f.C : 0.0f;
  b /= (float)f.C;
  for (int64_t j = l.tx; j < f.C; j += kTX) {
    float xhat = (ld(xr[j]) - mu) * rs;
    float v = rs * (ld(f.gamma[j]) * ld(dyr[j]) - a - xhat * b);
    st(f.dx[r * f.C + j], f.plus ? v + ld(f.plus[r * f.C + j]) : v);
  }
}

} // namespace norms
} // namespace planrt

#endif // PLANRT_LIB_CUDA_NORMS_BLOCKS_H
