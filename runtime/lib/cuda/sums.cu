//===- sums.cu - Whole-tensor sums: chunk partials, then one sum ----------===//
//
// The kernels of sums_blocks.h (its essay says why): a block of 256 threads
// per chunk of 1024 floats, then one block for the partials.
//===----------------------------------------------------------------------===//

#include "check.h"
#include "sums.h"
#include "sums_blocks.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_sums {

namespace {

__global__ void __launch_bounds__(sums::kThreads)
    chunk_kernel(kernels::SumPartialFn f) {
  __shared__ float smem[sums::kFloats];
  sums::chunk_block(block::this_lane(), smem, f, (int64_t)blockIdx.x);
}

template <class F>
__global__ void __launch_bounds__(sums::kThreads) partials_kernel(F f) {
  __shared__ float smem[sums::kFloats];
  sums::partials_block(block::this_lane(), smem, f);
}

__global__ void __launch_bounds__(sums::kThreads)
    batch_chunk_kernel(const __grid_constant__ sums::SumsqBatch b) {
  __shared__ float smem[sums::kFloats];
  sums::batch_chunk_block(block::this_lane(), smem, b, (int64_t)blockIdx.x);
}

__global__ void __launch_bounds__(sums::kThreads)
    batch_partials_kernel(const __grid_constant__ sums::SumsqBatch b) {
  __shared__ float smem[sums::kFloats];
  sums::batch_partials_block(block::this_lane(), smem, b);
}

} // namespace

void chunks(cudaStream_t s, int64_t chunks, const kernels::SumPartialFn &f) {
  if (chunks <= 0)
    return;
  if (chunks > 2147483647LL)
    fatal("sum: %lld chunks exceed the grid", (long long)chunks);
  chunk_kernel<<<(unsigned)chunks, sums::kThreads, 0, s>>>(f);
  cuda_check::launch("a tensor's chunk sums");
}

void partials(cudaStream_t s, const kernels::AccumulateSumFn &f) {
  partials_kernel<<<1, sums::kThreads, 0, s>>>(f);
  cuda_check::launch("the sum of a tensor's chunk sums");
}

void partials(cudaStream_t s, const kernels::ScaledSumFn &f) {
  partials_kernel<<<1, sums::kThreads, 0, s>>>(f);
  cuda_check::launch("the sum of a tensor's chunk sums");
}

void sumsq_batch(cudaStream_t s, const sums::SumsqBatch &b) {
  if (b.count == 0)
    return;
  batch_chunk_kernel<<<(unsigned)b.first_chunk[b.count], sums::kThreads, 0,
                       s>>>(b);
  cuda_check::launch("the gradient norm's chunk sums");
  batch_partials_kernel<<<1, sums::kThreads, 0, s>>>(b);
  cuda_check::launch("the gradient norm's sums");
}

} // namespace cuda_sums
} // namespace planrt
