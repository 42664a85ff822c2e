//===- norms_blocks.h - Layer and RMS norm, 16 lanes per row --------------===//
//
// The norms' row work (statistics, the normalized output, the input's
// gradient) with a row to each half warp: 16 lanes read the row's elements
// 16 apart (adjacent lanes, adjacent elements), sum their parts and reduce
// them with shuffles; a block of 256 threads holds 16 rows. The per-row
// functors of kernels.h gave a row one thread that walked all of it. The
// parameters' gradients (sums over rows) are column_sums_blocks.h's.
// Formulas and rounding follow kernels::NormStatsFn, NormFn and NormGradXFn;
// only the order of each row's sums differs (lane partials, then a tree).
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

/// Row r = r0 + ty: mean (LayerNorm) and rstd.
template <class T>
PLANRT_BLOCK_FN void stats_block(const Lane &l,
                                 const kernels::NormStatsFn<T> &f, int64_t rows,
                                 int64_t r0) {
  const int64_t r = r0 + l.ty;
  const bool live = r < rows; // every lane reaches the shuffles
  const T *xr = f.x + (live ? r : 0) * f.C;
  float mu = 0.0f;
  if (f.mean) {
    float s = 0.0f;
    if (live)
      for (int64_t j = l.tx; j < f.C; j += kTX)
        s += ld(xr[j]);
    mu = row_sum16(l, s) / (float)f.C;
  }
  float v = 0.0f;
  if (live)
    for (int64_t j = l.tx; j < f.C; j += kTX) {
      float d = ld(xr[j]) - mu;
      v += d * d;
    }
  float var = row_sum16(l, v) / (float)f.C;
  if (live && l.tx == 0) {
    if (f.mean)
      f.mean[r] = mu;
    f.rstd[r] = 1.0f / sqrtf(var + f.eps);
  }
}

/// out = (x - mean) rstd gamma + beta for row r0 + ty.
template <class T>
PLANRT_BLOCK_FN void norm_block(const Lane &l, const kernels::NormFn<T> &f,
                                int64_t rows, int64_t r0) {
  const int64_t r = r0 + l.ty;
  if (r >= rows)
    return;
  const float mu = f.mean ? f.mean[r] : 0.0f, rs = f.rstd[r];
  for (int64_t j = l.tx; j < f.C; j += kTX) {
    float y = (ld(f.x[r * f.C + j]) - mu) * rs * ld(f.gamma[j]);
    st(f.out[r * f.C + j], f.beta ? y + ld(f.beta[j]) : y);
  }
}

/// dx of row r0 + ty (kernels::NormGradXFn).
template <class T>
PLANRT_BLOCK_FN void grad_x_block(const Lane &l,
                                  const kernels::NormGradXFn<T> &f,
                                  int64_t rows, int64_t r0) {
  const int64_t r = r0 + l.ty;
  const bool live = r < rows;
  const int64_t rr = live ? r : 0;
  const T *xr = f.x + rr * f.C, *dyr = f.dout + rr * f.C;
  const float mu = live && f.mean ? f.mean[rr] : 0.0f;
  const float rs = live ? f.rstd[rr] : 0.0f;
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
    st(f.dx[r * f.C + j], rs * (ld(f.gamma[j]) * ld(dyr[j]) - a - xhat * b));
  }
}

} // namespace norms
} // namespace planrt

#endif // PLANRT_LIB_CUDA_NORMS_BLOCKS_H
