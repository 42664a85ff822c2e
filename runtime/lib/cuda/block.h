//===- block.h - A GPU thread block's primitives, also on the host --------===//
//
// The block-level kernels of lib/cuda (attention_blocks.h,
// column_sums_blocks.h) are written once for both compilers: under nvcc a
// Lane is a CUDA thread, the barrier is __syncthreads and shuffles are warp
// shuffles; under a host compiler with OpenMP each GPU thread of a block is
// an OpenMP thread of one parallel region (test/runtime/cuda runs the blocks
// that way and compares them with the host functors), the barrier is an
// OpenMP barrier and a shuffle goes through memory. So the tests here check
// the kernels' indexing, masking and synchronization, not only their math.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_BLOCK_H
#define PLANRT_LIB_CUDA_BLOCK_H

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define PLANRT_BLOCK_FN __device__ __forceinline__
#define PLANRT_BLOCK_BARRIER() __syncthreads()
#define PLANRT_UNROLL _Pragma("unroll")
#else
#define PLANRT_UNROLL
#define PLANRT_BLOCK_FN inline
#define PLANRT_BLOCK_BARRIER() _Pragma("omp barrier")
#endif

namespace planrt {
namespace block {

/// Blocks are 2D, kTX threads wide (x fastest): a row of a block is half a
/// warp.
constexpr int kTX = 16;

/// One thread of a block: its index and coordinates, and (host only) the
/// buffer of the block's shuffles.
struct Lane {
  int tid, tx, ty;
  float *xbuf; // host: one float per thread of the block
};

#ifdef __CUDACC__
/// This CUDA thread's Lane (a 1D block of threads seen as kTX wide).
__device__ __forceinline__ Lane this_lane() {
  Lane l;
  l.tid = (int)threadIdx.x;
  l.tx = l.tid % kTX;
  l.ty = l.tid / kTX;
  l.xbuf = nullptr;
  return l;
}
#endif

/// `bytes` (16 or 32) from 16-byte aligned `src` to 16-byte aligned `dst`.
PLANRT_BLOCK_FN void copy16(void *dst, const void *src, int bytes) {
#ifdef __CUDACC__
  const uint4 *s = static_cast<const uint4 *>(src);
  uint4 *d = static_cast<uint4 *>(dst);
  PLANRT_UNROLL
  for (int k = 0; k < 2; ++k)
    if (16 * k < bytes)
      d[k] = s[k];
#else
  memcpy(dst, src, (size_t)bytes);
#endif
}

/// v of lane tid ^ m, for m < 16 (within the 16 lanes of a half warp).
PLANRT_BLOCK_FN float shuffle_xor(const Lane &l, float v, int m) {
#ifdef __CUDACC__
  (void)l;
  return __shfl_xor_sync(0xffffffffu, v, m);
#else
  l.xbuf[l.tid] = v;
  PLANRT_BLOCK_BARRIER();
  float r = l.xbuf[l.tid ^ m];
  PLANRT_BLOCK_BARRIER();
  return r;
#endif
}

/// The max and the sum of v over the 16 lanes tid & ~15 .. tid | 15.
PLANRT_BLOCK_FN float row_max16(const Lane &l, float v) {
  for (int m = 8; m > 0; m /= 2) {
    float o = shuffle_xor(l, v, m);
    v = o > v ? o : v;
  }
  return v;
}

PLANRT_BLOCK_FN float row_sum16(const Lane &l, float v) {
  for (int m = 8; m > 0; m /= 2)
    v += shuffle_xor(l, v, m);
  return v;
}

/// For a block of kThreads threads that all call it: the number of lanes
/// with a lower tid whose `flag` is set (a stream compaction's slot, in tid
/// order), and in `total` the number over the whole block. `counts` is
/// kThreads / 32 ints of shared memory. It ends with a barrier, so it may be
/// called again at once.
template <int kThreads>
PLANRT_BLOCK_FN int count_before(const Lane &l, bool flag, int *counts,
                                 int &total) {
  static_assert(kThreads % 32 == 0, "whole warps");
  int before = 0, all = 0;
#ifdef __CUDACC__
  const unsigned votes = __ballot_sync(0xffffffffu, flag);
  const int warp = l.tid / 32, lane = l.tid % 32;
  if (lane == 0)
    counts[warp] = __popc(votes);
  __syncthreads();
  before = __popc(votes & ((1u << lane) - 1u));
  for (int w = 0; w < kThreads / 32; ++w) {
    all += counts[w];
    before += w < warp ? counts[w] : 0;
  }
  __syncthreads();
#else
  (void)counts;
  l.xbuf[l.tid] = flag ? 1.0f : 0.0f;
  PLANRT_BLOCK_BARRIER();
  for (int t = 0; t < kThreads; ++t) {
    const int v = l.xbuf[t] != 0.0f;
    all += v;
    before += t < l.tid ? v : 0;
  }
  PLANRT_BLOCK_BARRIER();
#endif
  total = all;
  return before;
}

/// The segment holding `x` of `count` >= 1 segments starting at first[0]
/// <= first[1] < ... (the last t with first[t] <= x): which tensor a block
/// of a multi-tensor grid works on (optimizer_blocks.h, sums_blocks.h).
PLANRT_BLOCK_FN int segment_of(const int64_t *first, int count, int64_t x) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

} // namespace block
} // namespace planrt

#endif // PLANRT_LIB_CUDA_BLOCK_H
