//===- classifier.cu - Softmax cross-entropy: loss and gradient -----------===//
//
// The kernels of classifier_blocks.h (its essay says how): a block of 256
// threads per row of logits, forward (the per-row loss) and backward (the
// logits' gradient, fp32 or 16-bit) side by side, and both in one kernel,
// the gradient written over the logits.
//===----------------------------------------------------------------------===//

#include "../context.h"
#include "check.h"
#include "classifier.h"
#include "classifier_blocks.h"

namespace planrt {
namespace cuda_classifier {

namespace {

__global__ void __launch_bounds__(classifier::kThreads)
    forward_kernel(kernels::CrossEntropyFn f) {
  __shared__ float smem[classifier::kThreads];
  classifier::forward_block(block::this_lane(), smem, f, (int64_t)blockIdx.x);
}

template <class G>
__global__ void __launch_bounds__(classifier::kThreads)
    grad_kernel(kernels::CrossEntropyGradFn<G> f) {
  __shared__ float smem[classifier::kThreads];
  classifier::grad_block(block::this_lane(), smem, f, (int64_t)blockIdx.x);
}

template <class T>
__global__ void __launch_bounds__(classifier::kThreads)
    in_place_kernel(kernels::CrossEntropyInPlaceFn<T> f) {
  __shared__ float smem[classifier::kThreads];
  classifier::in_place_block(block::this_lane(), smem, f, (int64_t)blockIdx.x);
}

template <class T>
__global__ void __launch_bounds__(classifier::kThreads)
    in_place_staged_kernel(kernels::CrossEntropyInPlaceFn<T> f) {
  __shared__ float smem[classifier::kThreads];
  extern __shared__ __align__(16) unsigned char staged[];
  classifier::in_place_staged_block(block::this_lane(), smem,
                                    reinterpret_cast<T *>(staged), f,
                                    (int64_t)blockIdx.x);
}

/// One block per row: rows past the grid's limit would need a loop.
void check_rows(int64_t rows) {
  if (rows > 2147483647LL)
    fatal("cross-entropy over %lld rows: more than a grid holds",
          (long long)rows);
}

} // namespace

void forward(cudaStream_t s, int64_t rows, const kernels::CrossEntropyFn &f) {
  if (rows <= 0)
    return;
  check_rows(rows);
  forward_kernel<<<(unsigned)rows, classifier::kThreads, 0, s>>>(f);
  cuda_check::launch("cross-entropy");
}

template <class G>
void grad(cudaStream_t s, int64_t rows,
          const kernels::CrossEntropyGradFn<G> &f) {
  if (rows <= 0)
    return;
  check_rows(rows);
  grad_kernel<G><<<(unsigned)rows, classifier::kThreads, 0, s>>>(f);
  cuda_check::launch("cross-entropy's gradient");
}

template <class T>
void in_place(cudaStream_t s, int64_t rows,
              const kernels::CrossEntropyInPlaceFn<T> &f) {
  if (rows <= 0)
    return;
  check_rows(rows);
  // The row in shared memory where two blocks of an SM fit (with the
  // reductions' floats): with one, nothing overlaps a block's phases (an
  // fp32 row of 50304 logits, 201 KB, stays unstaged).
  const size_t row_bytes = (size_t)f.C * sizeof(T);
  if (classifier::stageable(f.logits, f.C) &&
      2 * (row_bytes + sizeof(float) * classifier::kThreads) <=
          cuda_check::smem_optin()) {
    static size_t allowed = 0; // per T: the kernel's opted-in bytes
    cuda_check::allow_smem(
        in_place_staged_kernel<T>, row_bytes, allowed,
        "cudaFuncSetAttribute (the classifier's staged rows)");
    in_place_staged_kernel<T>
        <<<(unsigned)rows, classifier::kThreads, row_bytes, s>>>(f);
    cuda_check::launch("cross-entropy's loss and gradient in place (staged)");
    return;
  }
  in_place_kernel<T><<<(unsigned)rows, classifier::kThreads, 0, s>>>(f);
  cuda_check::launch("cross-entropy's loss and gradient in place");
}

template void in_place(cudaStream_t, int64_t,
                       const kernels::CrossEntropyInPlaceFn<float> &);
template void in_place(cudaStream_t, int64_t,
                       const kernels::CrossEntropyInPlaceFn<kernels::bf16_t> &);
template void in_place(cudaStream_t, int64_t,
                       const kernels::CrossEntropyInPlaceFn<kernels::f16_t> &);
template void grad(cudaStream_t, int64_t,
                   const kernels::CrossEntropyGradFn<float> &);
template void grad(cudaStream_t, int64_t,
                   const kernels::CrossEntropyGradFn<kernels::bf16_t> &);
template void grad(cudaStream_t, int64_t,
                   const kernels::CrossEntropyGradFn<kernels::f16_t> &);

} // namespace cuda_classifier
} // namespace planrt
