//===- norms.cu - Layer and RMS norm: output and input gradient -----------===//
//
// The kernels of norms_blocks.h (its essay says how): 16 rows a block, a
// half warp a row, 8 elements a lane at a time where rows and buffers allow
// 128-bit accesses. The parameters' gradients are in column_sums.cu.
//===----------------------------------------------------------------------===//

#include "../context.h"
#include "check.h"
#include "norms.h"
#include "norms_blocks.h"

namespace planrt {
namespace cuda_norms {

namespace {

template <int W, class T>
__global__ void __launch_bounds__(norms::kThreads)
    norm_kernel(kernels::NormFn<T> f, int64_t rows) {
  norms::norm_block<W>(block::this_lane(), f, rows,
                       (int64_t)blockIdx.x * norms::kRowsPerBlock);
}
template <int W, class T>
__global__ void __launch_bounds__(norms::kThreads)
    grad_x_kernel(kernels::NormGradXFn<T> f, int64_t rows) {
  norms::grad_x_block<W>(block::this_lane(), f, rows,
                         (int64_t)blockIdx.x * norms::kRowsPerBlock);
}

unsigned blocks(int64_t rows) {
  return (unsigned)((rows + norms::kRowsPerBlock - 1) / norms::kRowsPerBlock);
}

} // namespace

template <class T>
void norm(cudaStream_t s, int64_t rows, const kernels::NormFn<T> &f) {
  if (rows <= 0)
    return;
  if (norms::grouped(f.C, f.x, f.gamma, f.beta, f.out))
    norm_kernel<norms::kGroup, T>
        <<<blocks(rows), norms::kThreads, 0, s>>>(f, rows);
  else
    norm_kernel<1, T><<<blocks(rows), norms::kThreads, 0, s>>>(f, rows);
  cuda_check::launch("the norm");
}
template <class T>
void grad_x(cudaStream_t s, int64_t rows, const kernels::NormGradXFn<T> &f) {
  if (rows <= 0)
    return;
  if (norms::grouped(f.C, f.x, f.gamma, f.dout, f.plus, f.dx))
    grad_x_kernel<norms::kGroup, T>
        <<<blocks(rows), norms::kThreads, 0, s>>>(f, rows);
  else
    grad_x_kernel<1, T><<<blocks(rows), norms::kThreads, 0, s>>>(f, rows);
  cuda_check::launch("the norm's input gradient");
}

#define PLANRT_NORM_TYPES(T)                                                   \
  template void norm(cudaStream_t, int64_t, const kernels::NormFn<T> &);       \
  template void grad_x(cudaStream_t, int64_t, const kernels::NormGradXFn<T> &);
PLANRT_NORM_TYPES(float)
PLANRT_NORM_TYPES(kernels::bf16_t)
PLANRT_NORM_TYPES(kernels::f16_t)
#undef PLANRT_NORM_TYPES

} // namespace cuda_norms
} // namespace planrt
