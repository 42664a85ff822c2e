//===- elementwise.h - The cuda backend's element-wise ops (elementwise.cu)
//===//
#ifndef PLANRT_LIB_CUDA_ELEMENTWISE_H
#define PLANRT_LIB_CUDA_ELEMENTWISE_H

#include "planrt/kernels.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_elementwise {

/// f over [0, n) on stream s, eight elements a thread with 128-bit loads
/// and stores (elementwise_blocks.h); false, having launched nothing, when
/// f's pointers do not allow it (the caller runs f one thread per element).
/// For the functors elementwise::Io has groups for.
template <class F> bool run(cudaStream_t s, int64_t n, const F &f);

} // namespace cuda_elementwise
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ELEMENTWISE_H
