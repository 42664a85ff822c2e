//===- norms.h - The cuda backend's norm kernels (norms.cu) ---------------===//
#ifndef PLANRT_LIB_CUDA_NORMS_H
#define PLANRT_LIB_CUDA_NORMS_H

#include "planrt/kernels.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_norms {

/// What the functor computes for rows [0, rows), on stream s.
template <class T>
void norm(cudaStream_t s, int64_t rows, const kernels::NormFn<T> &f);
template <class T>
void grad_x(cudaStream_t s, int64_t rows, const kernels::NormGradXFn<T> &f);

} // namespace cuda_norms
} // namespace planrt

#endif // PLANRT_LIB_CUDA_NORMS_H
