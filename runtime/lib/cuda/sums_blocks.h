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
#include "planrt/workspace.h"

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

//===--- The gradient norm's sums, many tensors a launch ------------------===//
//
// The gradient norm sums the squares of every gradient into one scalar
// (sumsq_accumulate, once per parameter: 148 for GPT-2 124M, all in a row
// after the backward). Two launches each would be 296 launches of a few
// microseconds over mostly small tensors. The cuda backend queues them
// instead (as it queues AdamW's updates, cuda_backend.cu) and runs a batch
// as two kernels:
//   batch_chunk_block:    one block per chunk of every queued tensor (its
//                         tensor found by a binary search over first_chunk),
//                         chunk_block's arithmetic, into a buffer of the
//                         backend's (kBatchPartials floats, outside the plan);
//   batch_partials_block: one block that adds each tensor's partials as
//                         partials_block does and adds the sum to that
//                         tensor's accumulator, tensor after tensor, on
//                         thread 0: the order and the bits of one pair of
//                         launches per tensor.
// A tensor of more than kQueueChunks chunks is not queued: its own launches
// cost nothing next to its reads.

/// Tensors per batch (the batch travels as the kernels' parameter).
constexpr int kMaxSumsq = workspace::outside::kSumsqBatch;
/// The backend's partials buffer, in floats.
constexpr int64_t kBatchPartials = workspace::outside::kSumsqBatchChunks;
/// The most chunks a queued tensor has.
constexpr int64_t kQueueChunks = workspace::outside::kSumsqQueueChunks;

struct SumsqBatch {
  int count = 0;
  float *partials = nullptr; // kBatchPartials floats
  const float *v[kMaxSumsq];
  float *acc[kMaxSumsq];
  int64_t n[kMaxSumsq];
  /// Tensor t's chunks are [first_chunk[t], first_chunk[t + 1]).
  int64_t first_chunk[kMaxSumsq + 1];
};
static_assert(sizeof(SumsqBatch) <= 4096,
              "the batch must fit the 4 KB of a kernel's parameters");

/// Chunks of a tensor of n elements.
inline int64_t chunks_of(int64_t n) {
  return (n + kernels::kReduceChunk - 1) / kernels::kReduceChunk;
}

/// Whether a tensor of n > 0 elements is queued at all, and whether it
/// fits the batch as it is (else the batch runs first).
inline bool queueable(int64_t n) { return chunks_of(n) <= kQueueChunks; }
inline bool fits(const SumsqBatch &b, int64_t n) {
  return b.count < kMaxSumsq &&
         (b.count ? b.first_chunk[b.count] : 0) + chunks_of(n) <=
             kBatchPartials;
}

/// Appends acc += sum(v^2) over n > 0 elements to a batch it fits.
inline void add(SumsqBatch &b, const float *v, int64_t n, float *acc) {
  if (b.count == 0)
    b.first_chunk[0] = 0;
  b.v[b.count] = v;
  b.acc[b.count] = acc;
  b.n[b.count] = n;
  b.first_chunk[b.count + 1] = b.first_chunk[b.count] + chunks_of(n);
  ++b.count;
}

/// Block `bx` of the chunk grid (first_chunk[count] blocks).
PLANRT_BLOCK_FN void batch_chunk_block(const Lane &l, float *smem,
                                       const SumsqBatch &b, int64_t bx) {
  const int t = block::segment_of(b.first_chunk, b.count, bx);
  const kernels::SumPartialFn f{b.v[t], b.partials + b.first_chunk[t], b.n[t],
                                true};
  chunk_block(l, smem, f, bx - b.first_chunk[t]);
}

/// The one block after the chunks: each tensor's acc += its partials' sum.
PLANRT_BLOCK_FN void batch_partials_block(const Lane &l, float *smem,
                                          const SumsqBatch &b) {
  for (int t = 0; t < b.count; ++t) {
    const kernels::AccumulateSumFn f{b.partials + b.first_chunk[t], b.acc[t],
                                     b.first_chunk[t + 1] - b.first_chunk[t]};
    partials_block(l, smem, f);
  }
}

} // namespace sums
} // namespace planrt

#endif // PLANRT_LIB_CUDA_SUMS_BLOCKS_H
