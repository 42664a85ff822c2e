//===- check.h - CUDA errors of the kernel files, for people
//---------------===//
#ifndef PLANRT_LIB_CUDA_CHECK_H
#define PLANRT_LIB_CUDA_CHECK_H

#include "../context.h"

#include <cuda_runtime.h>

#include <cstddef>

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

/// The most dynamic shared memory a block of this device may opt into
/// (sm_80 and sm_90: 163 and 227 KB; sm_86 and sm_89: 99 KB).
inline size_t smem_optin() {
  static int limit = -1;
  if (limit < 0) {
    int device = 0;
    call(cudaGetDevice(&device), "cudaGetDevice");
    call(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                device),
         "cudaDeviceGetAttribute (shared memory per block)");
  }
  return (size_t)limit;
}

/// Raises `kernel`'s dynamic shared memory limit to `bytes` where
/// `allowed` (the kernel's own, starting at 0) is below it: a kernel asking
/// for more than 48 KB opts in first.
template <class K>
void allow_smem(K kernel, size_t bytes, size_t &allowed, const char *what) {
  if (bytes <= allowed)
    return;
  call(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)bytes),
       what);
  allowed = bytes;
}

} // namespace cuda_check
} // namespace planrt

#endif // PLANRT_LIB_CUDA_CHECK_H
