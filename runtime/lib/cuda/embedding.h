//===- embedding.h - The cuda backend's embedding gradient (embedding.cu) -===//
#ifndef PLANRT_LIB_CUDA_EMBEDDING_H
#define PLANRT_LIB_CUDA_EMBEDDING_H

#include "planrt/kernels.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_embedding {

/// What kernels::EmbeddingGradColumnFn computes for all its f.C columns,
/// on stream s.
template <class T>
void grad(cudaStream_t s, const kernels::EmbeddingGradColumnFn<T> &f);

} // namespace cuda_embedding
} // namespace planrt

#endif // PLANRT_LIB_CUDA_EMBEDDING_H
