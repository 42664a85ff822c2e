//===- sums_blocks.h - Sums of a whole tensor, in a fixed order
//------------===//
//
// The gradient norm (for clipping and the log) and the loss's mean are sums
// of whole tensors: reduce_sum (ops_impl.inc) cuts a tensor into chunks of
// kReduceChunk (1024) floats, sums each chunk into a partial, then sums the
// partials. The functors of kernels.h give a chunk one thread, which walks
// its 1024 floats alone (a warp's 32 threads then read 32 rows 4 KB apart,
// one transaction each), and the partials one thread in all. Here:
//   chunk_block:    a block of 256 threads per chunk; thread i adds x[i],
//                   x[i + 256], ... (a warp reads 128 contiguous bytes), then
//                   a tree in shared memory (stride 128, 64, ..., 1);
//   partials_block: one block for all the partials, the same two steps.
// Fixed orders and no atomics: the same bits on every run (not the host's
// bits: sum8's order is another; the device suite compares to 1e-4).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_SUMS_BLOCKS_H
#define PLANRT_LIB_CUDA_SUMS_BLOCKS_H

#include "block.h"
#include "planrt/kernels.h"

namespace planrt {
namespace sums {

using block::Lane;

constexpr int kThreads = 256;
constexpr int kFloats = kThreads; // shared memory

/// The sum of every thread's `v` (all 256 threads call it), valid on thread
/// 0; smem is free again when it returns.
PLANRT_BLOCK_FN float block_sum(const Lane &l, float *smem, float v) {
  smem[l.tid] = v;
  PLANRT_BLOCK_BARRIER();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (l.tid < s)
      smem[l.tid] += smem[l.tid + s];
    PLANRT_BLOCK_BARRIER();
  }
  const float r = smem[0];
  PLANRT_BLOCK_BARRIER();
  return r;
}

/// f.partial[c] = the sum (of squares with f.square) of chunk c.
PLANRT_BLOCK_FN void chunk_block(const Lane &l, float *smem,
                                 const kernels::SumPartialFn &f, int64_t c) {
  const int64_t begin = c * kernels::kReduceChunk;
  const int64_t end =
      begin + kernels::kReduceChunk < f.n ? begin + kernels::kReduceChunk : f.n;
  float acc = 0.0f;
  for (int64_t i = begin + l.tid; i < end; i += kThreads) {
    const float x = f.v[i];
    acc = f.square ? fmaf(x, x, acc) : acc + x;
  }
  const float s = block_sum(l, smem, acc);
  if (l.tid == 0)
    f.partial[c] = s;
}

/// The sum of partial[0 .. count) (on thread 0).
PLANRT_BLOCK_FN float partials_sum(const Lane &l, float *smem,
                                   const float *partial, int64_t count) {
  float acc = 0.0f;
  for (int64_t i = l.tid; i < count; i += kThreads)
    acc += partial[i];
  return block_sum(l, smem, acc);
}

/// What AccumulateSumFn (out += sum) and ScaledSumFn (out = scale sum) do.
PLANRT_BLOCK_FN void partials_block(const Lane &l, float *smem,
                                    const kernels::AccumulateSumFn &f) {
  const float s = partials_sum(l, smem, f.partial, f.count);
  if (l.tid == 0)
    f.out[0] += s;
}
PLANRT_BLOCK_FN void partials_block(const Lane &l, float *smem,
                                    const kernels::ScaledSumFn &f) {
  const float s = partials_sum(l, smem, f.partial, f.count);
  if (l.tid == 0)
    f.out[0] = f.scale * s;
}

} // namespace sums
} // namespace planrt

#endif // PLANRT_LIB_CUDA_SUMS_BLOCKS_H
