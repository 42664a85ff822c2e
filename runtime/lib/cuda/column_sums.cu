//===- column_sums.cu - Parameter gradients summed over the rows ----------===//
//
// The kernels of column_sums_blocks.h (its essay says why): bias_grad and
// the norms' gamma/beta gradients, blocks of 256 threads per 16 columns:
// one pass when the rows fit in a chunk, else a grid of column tiles x
// chunks writing the op's partials and a second kernel adding them.
//===----------------------------------------------------------------------===//

#include "../context.h"
#include "check.h"
#include "column_sums.h"
#include "column_sums_blocks.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_column_sums {

namespace {

// blockIdx.y: the chunk, or (the one-pass and the adding kernels) none.
template <class T, class G>
__global__ void __launch_bounds__(colsum::kThreads)
    bias_grad_kernel(kernels::BiasGradFn<T, G> f, bool chunked) {
  __shared__ float smem[colsum::kFloats<1>];
  colsum::bias_grad_block(block::this_lane(), smem, f,
                          (int64_t)blockIdx.x * colsum::kTX,
                          chunked ? (int64_t)blockIdx.y : -1);
}

template <class T, class G>
__global__ void __launch_bounds__(colsum::kThreads)
    norm_grad_param_kernel(kernels::NormGradParamFn<T, G> f, bool chunked) {
  __shared__ float smem[colsum::kFloats<2>];
  colsum::norm_grad_param_block(block::this_lane(), smem, f,
                                (int64_t)blockIdx.x * colsum::kTX,
                                chunked ? (int64_t)blockIdx.y : -1);
}

unsigned blocks(int64_t columns) {
  return (unsigned)((columns + colsum::kTX - 1) / colsum::kTX);
}

/// kernel<<<...>>>(f, chunked) as one pass, or as the chunks' pass and the
/// adding pass when f has partials.
template <class K, class F>
void launch_sums(cudaStream_t s, K kernel, const F &f, int64_t rows,
                 int64_t columns, const char *what) {
  if (f.partials) {
    const int64_t chunks = colsum::chunks(rows);
    if (chunks > 65535)
      fatal("%s: %lld rows are more chunks than the grid holds", what,
            (long long)rows);
    kernel<<<dim3(blocks(columns), (unsigned)chunks), colsum::kThreads, 0, s>>>(
        f, true);
    cuda_check::launch(what);
  }
  kernel<<<blocks(columns), colsum::kThreads, 0, s>>>(f, false);
  cuda_check::launch(what);
}

} // namespace

template <class T, class G>
void bias_grad(cudaStream_t s, const kernels::BiasGradFn<T, G> &f) {
  if (f.n <= 0)
    return;
  launch_sums(s, bias_grad_kernel<T, G>, f, f.rows, f.n,
              "bias_grad's column sums");
}

template <class T, class G>
void norm_grad_param(cudaStream_t s, const kernels::NormGradParamFn<T, G> &f) {
  if (f.C <= 0)
    return;
  launch_sums(s, norm_grad_param_kernel<T, G>, f, f.rows, f.C,
              "the norm's parameter gradients");
}

using kernels::bf16_t;
using kernels::f16_t;
template void bias_grad(cudaStream_t,
                        const kernels::BiasGradFn<float, float> &);
template void bias_grad(cudaStream_t,
                        const kernels::BiasGradFn<bf16_t, float> &);
template void bias_grad(cudaStream_t,
                        const kernels::BiasGradFn<f16_t, float> &);
template void bias_grad(cudaStream_t,
                        const kernels::BiasGradFn<bf16_t, bf16_t> &);
template void bias_grad(cudaStream_t,
                        const kernels::BiasGradFn<f16_t, f16_t> &);
template void bias_grad(cudaStream_t,
                        const kernels::BiasGradFn<float, bf16_t> &);
template void bias_grad(cudaStream_t,
                        const kernels::BiasGradFn<float, f16_t> &);
template void bias_grad(cudaStream_t,
                        const kernels::BiasGradFn<bf16_t, f16_t> &);
template void bias_grad(cudaStream_t,
                        const kernels::BiasGradFn<f16_t, bf16_t> &);
template void norm_grad_param(cudaStream_t,
                              const kernels::NormGradParamFn<float> &);
template void norm_grad_param(cudaStream_t,
                              const kernels::NormGradParamFn<bf16_t> &);
template void norm_grad_param(cudaStream_t,
                              const kernels::NormGradParamFn<f16_t> &);
template void norm_grad_param(cudaStream_t,
                              const kernels::NormGradParamFn<bf16_t, float> &);
template void norm_grad_param(cudaStream_t,
                              const kernels::NormGradParamFn<f16_t, float> &);

} // namespace cuda_column_sums
} // namespace planrt
