//===- elementwise.cu - Element-wise ops, eight elements a thread ---------===//
//
// The kernel of elementwise_blocks.h (its essay says why): a grid-stride
// loop over groups of 8 elements, 256 threads a block, a thread per group
// up to 65536 blocks (the loop covers the rest).
//===----------------------------------------------------------------------===//

#include "check.h"
#include "elementwise.h"
#include "elementwise_blocks.h"

namespace planrt {
namespace cuda_elementwise {

namespace {

template <class F>
__global__ void __launch_bounds__(elementwise::kThreads)
    groups_kernel(F f, int64_t n) {
  const int64_t threads = (int64_t)gridDim.x * blockDim.x;
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  elementwise::thread_work(f, t, threads, n);
}

} // namespace

template <class F> bool run(cudaStream_t s, int64_t n, const F &f) {
  static_assert(elementwise::Io<F>::kGroups, "a functor with groups");
  if (n <= 0)
    return true;
  if (!elementwise::Io<F>::aligned(f))
    return false;
  const int64_t groups = n / elementwise::kGroup;
  int64_t blocks = (groups + elementwise::kThreads - 1) / elementwise::kThreads;
  if (blocks < 1)
    blocks = 1; // the elements after the last group
  if (blocks > 65536)
    blocks = 65536; // the grid-stride loop covers the rest
  groups_kernel<<<(unsigned)blocks, elementwise::kThreads, 0, s>>>(f, n);
  cuda_check::launch("an element-wise op");
  return true;
}

// The functors with groups, for every storage type.
#define PLANRT_ELEMENTWISE_T(T)                                                \
  template bool run(cudaStream_t, int64_t, const kernels::AddFn<T> &);         \
  template bool run(cudaStream_t, int64_t, const kernels::SubFn<T> &);         \
  template bool run(cudaStream_t, int64_t, const kernels::MulFn<T> &);         \
  template bool run(cudaStream_t, int64_t, const kernels::ScaleFn<T> &);       \
  template bool run(cudaStream_t, int64_t, const kernels::BiasAddFn<T> &);     \
  PLANRT_ELEMENTWISE_MAP(kernels::Relu, T)                                     \
  PLANRT_ELEMENTWISE_MAP(kernels::GeluTanh, T)                                 \
  PLANRT_ELEMENTWISE_MAP(kernels::GeluErf, T)                                  \
  PLANRT_ELEMENTWISE_MAP(kernels::Silu, T)
#define PLANRT_ELEMENTWISE_MAP(A, T)                                           \
  template bool run(cudaStream_t, int64_t, const kernels::MapFn<A, T> &);      \
  template bool run(cudaStream_t, int64_t, const kernels::MapGradFn<A, T> &);

PLANRT_ELEMENTWISE_T(float)
PLANRT_ELEMENTWISE_T(kernels::bf16_t)
PLANRT_ELEMENTWISE_T(kernels::f16_t)
template bool run(cudaStream_t, int64_t, const kernels::CopyFn &);
template bool run(cudaStream_t, int64_t, const kernels::CastFn &);

#undef PLANRT_ELEMENTWISE_MAP
#undef PLANRT_ELEMENTWISE_T

} // namespace cuda_elementwise
} // namespace planrt
