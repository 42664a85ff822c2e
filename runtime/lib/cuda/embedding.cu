//===- embedding.cu - The embedding's gradient, in row order --------------===//
//
// The kernel of embedding_blocks.h (its essay says why): a block of 256
// threads per range of 32 table rows and 256 columns (grid: column tiles x
// row ranges), summing in 33 KB of shared memory.
//===----------------------------------------------------------------------===//

#include "check.h"
#include "embedding.h"
#include "embedding_blocks.h"

namespace planrt {
namespace cuda_embedding {

namespace {

template <class T>
__global__ void __launch_bounds__(embed::kThreads)
    grad_kernel(kernels::EmbeddingGradColumnFn<T> f) {
  __shared__ float smem[embed::kSmemFloats];
  embed::grad_block(block::this_lane(), smem, f,
                    (int64_t)blockIdx.x * embed::kThreads,
                    (int64_t)blockIdx.y * embed::kRangeRows,
                    blockIdx.x == 0 && blockIdx.y == 0);
}

} // namespace

template <class T>
void grad(cudaStream_t s, const kernels::EmbeddingGradColumnFn<T> &f) {
  if (f.C <= 0 || f.rows <= 0)
    return;
  const int64_t tiles = (f.C + embed::kThreads - 1) / embed::kThreads;
  const int64_t ranges =
      (f.vocab.V + embed::kRangeRows - 1) / embed::kRangeRows;
  if (tiles > 2147483647LL || ranges > 65535)
    fatal("embedding_grad: a table of %lld rows and %lld columns is more "
          "than the grid holds",
          (long long)f.vocab.V, (long long)f.C);
  dim3 grid((unsigned)tiles, (unsigned)(ranges > 0 ? ranges : 1));
  grad_kernel<T><<<grid, embed::kThreads, 0, s>>>(f);
  cuda_check::launch("embedding_grad's row-ordered sums");
}

template void grad(cudaStream_t, const kernels::EmbeddingGradColumnFn<float> &);
template void grad(cudaStream_t,
                   const kernels::EmbeddingGradColumnFn<kernels::bf16_t> &);
template void grad(cudaStream_t,
                   const kernels::EmbeddingGradColumnFn<kernels::f16_t> &);

} // namespace cuda_embedding
} // namespace planrt
