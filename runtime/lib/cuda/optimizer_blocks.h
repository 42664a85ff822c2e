//===- optimizer_blocks.h - AdamW over many tensors in one launch ---------===//
//
// A step updates every parameter: GPT-2 124M has 148 of them, most of them
// small (a norm's 768 floats), and the generated program calls
// adamw_update(_clipped) once per parameter. One launch each is 148
// launches of a few microseconds, and a small tensor's launch fills a few
// blocks of an H100's 132 SMs: the update is launch-bound, not
// bandwidth-bound (llm.c and apex fuse it for this reason).
//
// So the cuda backend queues the updates (cuda_backend.cu: nothing runs on
// the stream between two queued updates, since anything else that touches
// the stream flushes the queue first) and launches up to kMaxTensors of them
// as one grid:
//   - tensor t gets blocks_for(n_t) blocks, [first_block[t],
//     first_block[t+1]) of the grid: a few elements per thread, capped so
//     that a large tensor's blocks stride over it;
//   - a block finds its tensor by a binary search over first_block (32
//     entries at most, once per block) and walks its tensor with a
//     grid-stride loop of its own blocks;
//   - each element gets exactly AdamWFn's operator() arithmetic (the clip
//     factor read once per thread), so the bits equal one launch per tensor;
//   - a parameter's 16-bit copy (plan-keep-param-copies) is written from
//     the updated value in registers: mixed precision's casts of the
//     weights before their GEMMs cost no pass of their own.
// The batch travels as the kernel's parameter (under 4 KB): no copy to the
// device, no buffer to keep alive.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_OPTIMIZER_BLOCKS_H
#define PLANRT_LIB_CUDA_OPTIMIZER_BLOCKS_H

#include "block.h"
#include "planrt/kernels.h"
#include "planrt/workspace.h"

namespace planrt {
namespace optimizer {

using block::Lane;

constexpr int kThreads = 256;
/// Tensors per launch: the batch stays a kernel parameter (4 KB at most).
constexpr int kMaxTensors = workspace::outside::kAdamWBatch;
/// Elements per thread before a tensor's blocks start striding.
constexpr int64_t kPerThread = 4;
/// Blocks per tensor at most (a large tensor's blocks stride over it).
constexpr int64_t kMaxBlocks = 1024;

struct AdamWBatch {
  int count = 0;
  int64_t n[kMaxTensors];
  /// Tensor t's blocks are [first_block[t], first_block[t + 1]).
  int64_t first_block[kMaxTensors + 1];
  kernels::AdamWFn f[kMaxTensors];
};
static_assert(sizeof(AdamWBatch) <= 4096,
              "the batch must fit the 4 KB of a kernel's parameters");

/// How many blocks a tensor of n elements gets.
inline int64_t blocks_for(int64_t n) {
  const int64_t per_block = kThreads * kPerThread;
  const int64_t b = (n + per_block - 1) / per_block;
  return b < kMaxBlocks ? b : kMaxBlocks;
}

/// Appends a tensor of n > 0 elements to a batch with room for it.
inline void add(AdamWBatch &b, int64_t n, const kernels::AdamWFn &f) {
  if (b.count == 0)
    b.first_block[0] = 0;
  b.n[b.count] = n;
  b.f[b.count] = f;
  b.first_block[b.count + 1] = b.first_block[b.count] + blocks_for(n);
  ++b.count;
}

/// The blocks of the batch's grid.
inline int64_t grid(const AdamWBatch &b) {
  return b.count ? b.first_block[b.count] : 0;
}

/// Block `bx` of the grid: the tensor whose blocks hold it, then that
/// tensor's elements bx', bx' + blocks, ... (times kThreads, plus tid).
PLANRT_BLOCK_FN void adamw_block(const Lane &l, const AdamWBatch &b,
                                 int64_t bx) {
  const int t = block::segment_of(b.first_block, b.count, bx);
  const kernels::AdamWFn f = b.f[t]; // in registers, not per element
  const int64_t n = b.n[t];
  const int64_t own = bx - b.first_block[t];
  const int64_t stride = (b.first_block[t + 1] - b.first_block[t]) * kThreads;
  const float clip = f.clip_factor();
  // The copy's kind once per block, not per element.
  auto walk = [&](auto kind) {
    constexpr int K = decltype(kind)::value;
    for (int64_t i = own * kThreads + l.tid; i < n; i += stride)
      f.template update_as<K>(i, clip < 1.0f ? f.g[i] * clip : f.g[i]);
  };
  switch (f.copy.kind()) {
  case 1:
    return walk(std::integral_constant<int, 1>());
  case 2:
    return walk(std::integral_constant<int, 2>());
  default:
    return walk(std::integral_constant<int, 0>());
  }
}

} // namespace optimizer
} // namespace planrt

#endif // PLANRT_LIB_CUDA_OPTIMIZER_BLOCKS_H
