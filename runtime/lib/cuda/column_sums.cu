//===- column_sums.cu - Parameter gradients summed over the rows ----------===//
//
// The kernels of column_sums_blocks.h (its essay says why): bias_grad and
// the norms' gamma/beta gradients, one block of 256 threads per 16 columns.
//===----------------------------------------------------------------------===//

#include "../context.h"
#include "check.h"
#include "column_sums.h"
#include "column_sums_blocks.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_column_sums {

namespace {

template <class T, class G>
__global__ void __launch_bounds__(colsum::kThreads)
    bias_grad_kernel(kernels::BiasGradFn<T, G> f) {
  __shared__ float smem[colsum::kFloats<1>];
  colsum::bias_grad_block(block::this_lane(), smem, f,
                          (int64_t)blockIdx.x * colsum::kTX);
}

template <class T>
__global__ void __launch_bounds__(colsum::kThreads)
    norm_grad_param_kernel(kernels::NormGradParamFn<T> f) {
  __shared__ float smem[colsum::kFloats<2>];
  colsum::norm_grad_param_block(block::this_lane(), smem, f,
                                (int64_t)blockIdx.x * colsum::kTX);
}

unsigned blocks(int64_t columns) {
  return (unsigned)((columns + colsum::kTX - 1) / colsum::kTX);
}

} // namespace

template <class T, class G>
void bias_grad(cudaStream_t s, const kernels::BiasGradFn<T, G> &f) {
  if (f.n <= 0)
    return;
  bias_grad_kernel<T, G><<<blocks(f.n), colsum::kThreads, 0, s>>>(f);
  cuda_check::launch("bias_grad's column sums");
}

template <class T>
void norm_grad_param(cudaStream_t s, const kernels::NormGradParamFn<T> &f) {
  if (f.C <= 0)
    return;
  norm_grad_param_kernel<T><<<blocks(f.C), colsum::kThreads, 0, s>>>(f);
  cuda_check::launch("the norm's parameter gradients");
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

} // namespace cuda_column_sums
} // namespace planrt
