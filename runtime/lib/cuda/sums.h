//===- sums.h - The cuda backend's whole-tensor sums (sums.cu) ------------===//
#ifndef PLANRT_LIB_CUDA_SUMS_H
#define PLANRT_LIB_CUDA_SUMS_H

#include "planrt/kernels.h"
#include "sums_blocks.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_sums {

/// What the functors compute for their whole index spaces (chunks chunks,
/// one sum), on stream s.
void chunks(cudaStream_t s, int64_t chunks, const kernels::SumPartialFn &f);
void partials(cudaStream_t s, const kernels::AccumulateSumFn &f);
void partials(cudaStream_t s, const kernels::ScaledSumFn &f);
/// A batch of queued sums of squares (sums_blocks.h): two launches.
void sumsq_batch(cudaStream_t s, const sums::SumsqBatch &b);

} // namespace cuda_sums
} // namespace planrt

#endif // PLANRT_LIB_CUDA_SUMS_H
