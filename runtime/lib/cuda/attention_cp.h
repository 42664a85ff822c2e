//===- attention_cp.h - Context parallelism's attention tiles (cuda) ------===//
#ifndef PLANRT_LIB_CUDA_ATTENTION_CP_H
#define PLANRT_LIB_CUDA_ATTENTION_CP_H

#include "planrt/context_parallel.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_attention_cp {

/// The tiles of attention_cp_blocks.h for the block functors of
/// context_parallel.h, on stream `s`, with their contracts; false (nothing
/// launched) where no tile is built for the head dim or it does not fit
/// this device, and the functor runs instead.
template <class T>
bool forward(cudaStream_t s, const kernels::AttentionBlockFn<T> &f);
template <class T>
bool grad_q(cudaStream_t s, const kernels::AttentionBlockGradQFn<T> &f);
template <class T>
bool grad_kv(cudaStream_t s, const kernels::AttentionBlockGradKVFn<T> &f);

} // namespace cuda_attention_cp
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ATTENTION_CP_H
