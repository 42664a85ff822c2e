//===- column_sums_blocks.h - Sums down the columns of a matrix -----------===//
//
// A parameter's gradient is often a sum over every row of the batch: the
// bias's (bias_grad: sum of dy), the norms' gamma and beta (sum of dy (x -
// mean) rstd, and of dy). The per-column functors of kernels.h give such a
// sum one thread, which walks all rows: C threads in all, a few of the GPU's
// multiprocessors busy. Here a block of 16 x 16 threads owns 16 columns of
// a range of rows; its 16 rows of threads walk the rows 16 apart (a half
// warp reads 16 adjacent columns of one row), and the 16 partial sums of a
// column are added in shared memory in a fixed tree order.
//
// One block per 16 columns was still too few blocks: GPT-2's 768 columns
// make 48 of an H100's 132 multiprocessors busy, each walking 16 384 rows
// (a norm's parameter gradients took 240 us, at 200 GB/s). So a sum over
// more than kColumnChunkRows rows runs in two passes: blocks of 16 columns
// x 256 rows write their chunk's sums into the op's workspace (planned:
// workspace.h column_partials), and one block per 16 columns adds the
// chunks' sums in chunk order, the same column_sums over "rows" that are
// now chunks. No atomics: the same bits on every run.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_COLUMN_SUMS_BLOCKS_H
#define PLANRT_LIB_CUDA_COLUMN_SUMS_BLOCKS_H

#include "block.h"
#include "planrt/kernels.h"
#include "planrt/workspace.h"

namespace planrt {
namespace colsum {

using block::Lane;
using kernels::ld;
using kernels::st;

constexpr int kTX = block::kTX, kTY = 16, kThreads = kTX * kTY;
/// Shared memory floats for N sums per column.
template <int N> constexpr int kFloats = N *kThreads;

/// For the columns j0 + tx of one block: acc[n] = sum over rows r in [r0,
/// r1) of the terms term(r, j, acc) adds, then out(j, acc) on one lane per
/// column.
template <int N, class Term, class Out>
PLANRT_BLOCK_FN void column_sums(const Lane &l, float *smem, int64_t r0,
                                 int64_t r1, int64_t C, int64_t j0,
                                 const Term &term, const Out &out) {
  const int64_t j = j0 + l.tx;
  float acc[N];
  for (int n = 0; n < N; ++n)
    acc[n] = 0.0f;
  if (j < C)
    for (int64_t r = r0 + l.ty; r < r1; r += kTY)
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

/// Chunks of kColumnChunkRows rows in `rows` rows.
PLANRT_HD inline int64_t chunks(int64_t rows) {
  return (rows + workspace::kColumnChunkRows - 1) / workspace::kColumnChunkRows;
}

/// A column sum of N sums per column over `rows` rows, in one pass (a block
/// per 16 columns: chunk is -1) or in two (partials non-null): the block
/// of `chunk` writes its chunk's sums (partials [chunks][N][C]), then a
/// block per 16 columns (chunk -1) adds them in chunk order. out(j, acc)
/// stores a column's N sums.
template <int N, class Term, class Out>
PLANRT_BLOCK_FN void
chunked_sums(const Lane &l, float *smem, int64_t rows, int64_t C, int64_t j0,
             int64_t chunk, float *partials, const Term &term, const Out &out) {
  if (!partials) {
    column_sums<N>(l, smem, 0, rows, C, j0, term, out);
    return;
  }
  if (chunk >= 0) {
    const int64_t r0 = chunk * workspace::kColumnChunkRows;
    const int64_t r1 = r0 + workspace::kColumnChunkRows < rows
                           ? r0 + workspace::kColumnChunkRows
                           : rows;
    column_sums<N>(l, smem, r0, r1, C, j0, term,
                   [&](int64_t j, const float(&acc)[N]) {
                     for (int n = 0; n < N; ++n)
                       partials[(chunk * N + n) * C + j] = acc[n];
                   });
    return;
  }
  column_sums<N>(
      l, smem, 0, chunks(rows), C, j0,
      [&](int64_t k, int64_t j, float(&acc)[N]) {
        for (int n = 0; n < N; ++n)
          acc[n] += partials[(k * N + n) * C + j];
      },
      out);
}

/// db[j] = sum_r dy[r, j] (kernels::BiasGradFn's sums), for `chunk` as
/// chunked_sums takes it.
template <class T, class G>
PLANRT_BLOCK_FN void bias_grad_block(const Lane &l, float *smem,
                                     const kernels::BiasGradFn<T, G> &f,
                                     int64_t j0, int64_t chunk = -1) {
  chunked_sums<1>(
      l, smem, f.rows, f.n, j0, chunk, f.partials,
      [&](int64_t r, int64_t j, float(&acc)[1]) {
        acc[0] += ld(f.dy[r * f.n + j]);
      },
      [&](int64_t j, const float(&acc)[1]) { st(f.db[j], acc[0]); });
}

/// dgamma[j] = sum_r dy (x - mean) rstd, dbeta[j] = sum_r dy
/// (kernels::NormGradParamFn's sums; no mean for RMS norm, no dbeta). The
/// partials hold one sum per column for RMS norm, two for LayerNorm, as
/// workspace::column_partials plans them.
template <class T, class G>
PLANRT_BLOCK_FN void
norm_grad_param_block(const Lane &l, float *smem,
                      const kernels::NormGradParamFn<T, G> &f, int64_t j0,
                      int64_t chunk = -1) {
  auto dgamma = [&](int64_t r, int64_t j) {
    const float mu = f.mean ? f.mean[r] : 0.0f;
    return ld(f.dout[r * f.C + j]) * (ld(f.x[r * f.C + j]) - mu) * f.rstd[r];
  };
  if (!f.dbeta) {
    chunked_sums<1>(
        l, smem, f.rows, f.C, j0, chunk, f.partials,
        [&](int64_t r, int64_t j, float(&acc)[1]) { acc[0] += dgamma(r, j); },
        [&](int64_t j, const float(&acc)[1]) { st(f.dgamma[j], acc[0]); });
    return;
  }
  chunked_sums<2>(
      l, smem, f.rows, f.C, j0, chunk, f.partials,
      [&](int64_t r, int64_t j, float(&acc)[2]) {
        acc[0] += dgamma(r, j);
        acc[1] += ld(f.dout[r * f.C + j]);
      },
      [&](int64_t j, const float(&acc)[2]) {
        st(f.dgamma[j], acc[0]);
        st(f.dbeta[j], acc[1]);
      });
}

} // namespace colsum
} // namespace planrt

#endif // PLANRT_LIB_CUDA_COLUMN_SUMS_BLOCKS_H
