//===- classifier.h - The cuda backend's cross-entropy (classifier.cu) ----===//
#ifndef PLANRT_LIB_CUDA_CLASSIFIER_H
#define PLANRT_LIB_CUDA_CLASSIFIER_H

#include "planrt/kernels.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_classifier {

/// What the functor computes for rows [0, rows), on stream s.
void forward(cudaStream_t s, int64_t rows, const kernels::CrossEntropyFn &f);
template <class G>
void grad(cudaStream_t s, int64_t rows,
          const kernels::CrossEntropyGradFn<G> &f);
template <class T>
void in_place(cudaStream_t s, int64_t rows,
              const kernels::CrossEntropyInPlaceFn<T> &f);

} // namespace cuda_classifier
} // namespace planrt

#endif // PLANRT_LIB_CUDA_CLASSIFIER_H
