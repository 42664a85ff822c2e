//===- attention_cudnn.h - 16-bit attention on cuDNN (attention_cudnn.cpp)
//-===//
#ifndef PLANRT_LIB_CUDA_ATTENTION_CUDNN_H
#define PLANRT_LIB_CUDA_ATTENTION_CUDNN_H

#include "planrt/kernels.h"

#include <cuda_runtime.h>

#include <cstddef>

namespace planrt {
namespace cuda_attention {
namespace cudnn {

/// Causal attention of packed qkv (kernels::AttnShape's layout) into out on
/// stream `s`, on cuDNN's fused flash attention; with `lse` (B H S floats),
/// each row's log-sum-exp of its scaled scores. `bf16`: the operands are
/// bf16, else fp16. False when cuDNN does not run this problem (not loaded,
/// turned off, or no engine for the shape): nothing was launched.
bool forward(cudaStream_t s, const kernels::AttnShape &a, bool bf16,
             const void *qkv, void *out, float *lse);

/// Whether forward() runs this problem (with or without `lse`); never with
/// attention dropout (the tiles draw the host's mask). With
/// PLANRT_ATTENTION=cudnn, false is fatal instead.
bool runs_forward(const kernels::AttnShape &a, bool bf16, bool lse,
                  bool dropout);

/// A device buffer of `rows` floats held here, for forward()'s `lse`: the
/// same one the backward recomputes into (stream order keeps them apart).
float *lse_scratch(int64_t rows);

/// The whole backward: dq, dk and dv into dqkv (overwritten), from qkv and
/// dout. It runs the forward again into buffers of its own (cuDNN's
/// backward reads the output and its log-sum-exp, which the plan does not
/// keep). False when cuDNN does not run this problem: nothing launched.
bool backward(cudaStream_t s, const kernels::AttnShape &a, bool bf16,
              bool dropout, const void *qkv, const void *dout, void *dqkv);

/// The backward from the forward's output `out` and log-sum-exp `lse`
/// (what forward() wrote with `lse`), without running the forward again.
/// False when cuDNN does not run this problem: nothing launched.
bool backward_kept(cudaStream_t s, const kernels::AttnShape &a, bool bf16,
                   bool dropout, const void *qkv, const void *out,
                   const float *lse, const void *dout, void *dqkv);

/// Whether backward() ran (or would run) this problem: the key side of the
/// tiled backward asks, after backward() was called for the same problem.
bool runs_backward(const kernels::AttnShape &a, bool bf16, bool dropout);

/// Device bytes held for cuDNN (its workspace, the backward's recomputed
/// output and log-sum-exp), outside the planned memory.
size_t bytes_held();

/// One line on whether attention runs on cuDNN, and why not if it does
/// not; empty before the first 16-bit attention.
const char *status();

} // namespace cudnn
} // namespace cuda_attention
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ATTENTION_CUDNN_H
