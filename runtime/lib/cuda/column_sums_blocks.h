//===- column_sums_blocks.h - Sums down the columns of a matrix -----------===//
//
// A parameter's gradient is often a sum over every row of the batch: the
// bias's (bias_grad: sum of dy), the norms' gamma and beta (sum of dy (x -
// mean) rstd, and of dy). The per-column functors of kernels.h give such a
// sum one thread, which walks all rows: C threads in all, a few of the GPU's
// multiprocessors busy. Here a block of 16 x 16 threads owns 16 columns;
// its 16 rows of threads walk the rows 16 apart (a half warp reads 16
// adjacent columns of one row: 64 contiguous bytes), and the 16 partial sums
// of a column are added in shared memory in a fixed tree order. No atomics
// and no workspace: the same bits on every run, the plan's workspace
// untouched.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_COLUMN_SUMS_BLOCKS_H
#define PLANRT_LIB_CUDA_COLUMN_SUMS_BLOCKS_H

#include "block.h"
#include "planrt/kernels.h"

namespace planrt {
namespace colsum {

using block::Lane;
using kernels::ld;
using kernels::st;

constexpr int kTX = block::kTX, kTY = 16, kThreads = kTX * kTY;
/// Shared memory floats for N sums per column.
template <int N> constexpr int kFloats = N *kThreads;

/// For the columns j0 + tx of one block: acc[n] = sum over rows r of the
/// terms term(r, j, acc) adds, then out(j, acc) on one lane per column.
template <int N, class Term, class Out>
PLANRT_BLOCK_FN void column_sums(const Lane &l, float *smem, int64_t rows,
                                 int64_t C, int64_t j0, const Term &term,
                                 const Out &out) {
  const int64_t j = j0 + l.tx;
  float acc[N];
  for (int n = 0; n < N; ++n)
    acc[n] = 0.0f;
  if (j < C)
    for (int64_t r = l.ty; r < rows; r += kTY)
      term(r, j, acc);
  for (int n = 0; n < N; ++n)
    smem[n * kThreads + l.ty * kTX + l.tx] = acc[n];
  PLANRT_BLOCK_BARRIER();
  for (int s = kTY / 2; s > 0; s /= 2) {
    if (l.ty < s)
      for (int n = 0; n < N; ++n)
        smem[n * kThreads + l.ty * kTX + l.tx] +=
            smem[n * kThreads + (l.ty + s) * kTX + l.tx];
    PLANRT_BLOCK_BARRIER();
  }
  if (l.ty == 0 && j < C) {
    for (int n = 0; n < N; ++n)
      acc[n] = smem[n * kThreads + l.tx];
    out(j, acc);
  }
}

/// db[j] = sum_r dy[r, j] (kernels::BiasGradFn's sums).
template <class T, class G>
PLANRT_BLOCK_FN void bias_grad_block(const Lane &l, float *smem,
                                     const kernels::BiasGradFn<T, G> &f,
                                     int64_t j0) {
  column_sums<1>(
      l, smem, f.rows, f.n, j0,
      [&](int64_t r, int64_t j, float(&acc)[1]) {
        acc[0] += ld(f.dy[r * f.n + j]);
      },
      [&](int64_t j, const float(&acc)[1]) { st(f.db[j], acc[0]); });
}

/// dgamma[j] = sum_r dy (x - mean) rstd, dbeta[j] = sum_r dy
/// (kernels::NormGradParamFn's sums; no mean for RMS norm, no dbeta).
template <class T>
PLANRT_BLOCK_FN void norm_grad_param_block(const Lane &l, float *smem,
                                           const kernels::NormGradParamFn<T> &f,
                                           int64_t j0) {
  column_sums<2>(
      l, smem, f.rows, f.C, j0,
      [&](int64_t r, int64_t j, float(&acc)[2]) {
        const float mu = f.mean ? f.mean[r] : 0.0f;
        const float dy = ld(f.dout[r * f.C + j]);
        acc[0] += dy * (ld(f.x[r * f.C + j]) - mu) * f.rstd[r];
        acc[1] += dy;
      },
      [&](int64_t j, const float(&acc)[2]) {
        st(f.dgamma[j], acc[0]);
        if (f.dbeta)
          st(f.dbeta[j], acc[1]);
      });
}

} // namespace colsum
} // namespace planrt

#endif // PLANRT_LIB_CUDA_COLUMN_SUMS_BLOCKS_H
