//===- attention.h - The cuda backend's tiled attention (attention.cu) ----===//
#ifndef PLANRT_LIB_CUDA_ATTENTION_H
#define PLANRT_LIB_CUDA_ATTENTION_H

#include "planrt/kernels.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_attention {

/// out = causal attention of qkv, and with `stats` each row's (max, sum of
/// exponentials), on stream `s`; false (nothing launched) for a head dim
/// without tiled kernels. `drop`: attention dropout's mask (all three
/// parts take the forward's).
/// With `lse` (attention_lse's [B H S] floats), a forward cuDNN runs
/// writes each row's log-sum-exp there too, for grad_q's `fwd_lse`.
/// `keeps`: the op keeps its exponentials for the backward (recompute =
/// none), which only the per-row functors write and read.
template <class T>
bool forward(cudaStream_t s, const kernels::AttnShape &a, const T *qkv, T *out,
             float *stats, const kernels::AttnDropout &drop,
             float *lse = nullptr, bool keeps = false);

/// The backward's query side: rowstats [2 B H S] (max, sum) and delta
/// [B H S] (sum p dp) per row, from `stats` (the forward's) or recomputed
/// when it is null, and dq into dqkv. False for an unsupported head dim.
/// With fwd_out and fwd_lse (attention_grad_lse: the forward's output and
/// the log-sum-exp forward() wrote), cuDNN's backward reads them instead of
/// running the forward again, where forward() ran on cuDNN.
template <class T>
bool grad_q(cudaStream_t s, const kernels::AttnShape &a, const T *qkv,
            const T *dout, T *dqkv, const float *stats, float *rowstats,
            float *delta, const kernels::AttnDropout &drop,
            const T *fwd_out = nullptr, const float *fwd_lse = nullptr);

/// The backward's key side: dk and dv into dqkv, from grad_q's rowstats and
/// delta. False for an unsupported head dim.
template <class T>
bool grad_kv(cudaStream_t s, const kernels::AttnShape &a, const T *qkv,
             const T *dout, T *dqkv, const float *rowstats, const float *delta,
             const kernels::AttnDropout &drop);

} // namespace cuda_attention
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ATTENTION_H
