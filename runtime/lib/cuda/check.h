//===- check.h - CUDA errors of the kernel files, for people
//---------------===//
#ifndef PLANRT_LIB_CUDA_CHECK_H
#define PLANRT_LIB_CUDA_CHECK_H

#include "../context.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_check {

/// Fatal (every rank stops, naming the call) unless `e` is cudaSuccess.
inline void call(cudaError_t e, const char *what) {
  if (e != cudaSuccess)
    fatal("CUDA error %s (%s) in %s", cudaGetErrorName(e),
          cudaGetErrorString(e), what);
}

/// After a kernel launch: a launch error (bad configuration, too much
/// shared memory) names the kernel's work.
inline void launch(const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fatal("CUDA error %s (%s) in the launch of %s", cudaGetErrorName(e),
          cudaGetErrorString(e), what);
}

} // namespace cuda_check
} // namespace planrt

#endif // PLANRT_LIB_CUDA_CHECK_H
