//===- column_sums.h - The cuda backend's column sums (column_sums.cu) ----===//
#ifndef PLANRT_LIB_CUDA_COLUMN_SUMS_H
#define PLANRT_LIB_CUDA_COLUMN_SUMS_H

#include "planrt/kernels.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_column_sums {

/// What kernels::BiasGradFn computes for all its f.n columns, on stream s.
template <class T, class G>
void bias_grad(cudaStream_t s, const kernels::BiasGradFn<T, G> &f);
/// What kernels::NormGradParamFn computes for all its f.C columns.
template <class T, class G>
void norm_grad_param(cudaStream_t s, const kernels::NormGradParamFn<T, G> &f);

} // namespace cuda_column_sums
} // namespace planrt

#endif // PLANRT_LIB_CUDA_COLUMN_SUMS_H
