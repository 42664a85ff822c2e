//===- optimizer.h - The cuda backend's batched AdamW (optimizer.cu) ------===//
#ifndef PLANRT_LIB_CUDA_OPTIMIZER_H
#define PLANRT_LIB_CUDA_OPTIMIZER_H

#include "optimizer_blocks.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_optimizer {

/// Every update of the batch (optimizer_blocks.h), in one launch on s.
void adamw(cudaStream_t s, const optimizer::AdamWBatch &b);

} // namespace cuda_optimizer
} // namespace planrt

#endif // PLANRT_LIB_CUDA_OPTIMIZER_H
