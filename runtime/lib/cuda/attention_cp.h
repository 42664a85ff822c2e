//===- attention_cp.h - Context parallelism's attention tiles (cuda) ------===//
#ifndef PLANRT_LIB_CUDA_ATTENTION_CP_H
#define PLANRT_LIB_CUDA_ATTENTION_CP_H

#include "attention_cudnn.h"
#include "planrt/context_parallel.h"

#include <cuda_runtime.h>

#include <vector>

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

/// A rank's chunk of queries for cuDNN: rows [row0, row0 + problem.sq) of
/// its qkv (and out, dout, dqkv), over the gathered keys 0..problem.sk - 1.
struct CudnnChunk {
  int64_t row0;
  cuda_attention::cudnn::Sdpa problem;
};

/// all_gather's attention as cuDNN problems: the rank's first L/2 rows are
/// chunk g of the sequence's 2 G, its last L/2 chunk 2 G - 1 - g
/// (kernels::SeqPart); chunk j attends over the (j + 1) L/2 keys before its
/// end, causal with the mask aligned to the last key. Without context
/// parallelism (G 1), the rank's rows over its own keys. Each chunk's
/// log-sum-exp is packed [B, H, rows] (cuDNN before 9.26 reads no strided
/// one in its backward), at workspace::outside::cudnn_cp_lse_at(row0).
inline std::vector<CudnnChunk> cudnn_chunks(const kernels::AttnCp &c,
                                            bool bf16) {
  const kernels::AttnShape &a = c.a;
  const int64_t L = a.S, W = a.width(), O = a.H * a.D, K = c.kvWidth();
  auto chunk = [&](int64_t row0, int64_t rows, int64_t keys) {
    return CudnnChunk{row0,
                      {a.B, a.H, a.KV, a.D, rows, keys, L * W, W, c.S * K, K,
                       L * O, O, rows, a.scale, bf16, true}};
  };
  const int64_t G = c.part.G, g = c.part.g, half = L / 2;
  if (G <= 1)
    return {chunk(0, L, L)};
  return {chunk(0, half, (g + 1) * half),
          chunk(half, half, (2 * G - g) * half)};
}

/// all_gather's whole attention (attention_cp) and its gradient
/// (attention_cp_grad: dq into dqkv's query columns, the f32 partial dk, dv
/// into dkv, overwritten) on cuDNN, for 16-bit operands without dropout
/// (attention_cp.cu); false where cuDNN does not run them: nothing
/// launched, the block functors run. With `lse` (cudnn_cp_lse_floats), the
/// forward writes the chunks' log-sum-exps there where cuDNN runs it with
/// them; the backward given them and the forward's output `fwd_out` reads
/// them where that forward did, else runs the forward again.
template <class T>
bool cudnn_forward(cudaStream_t s, const kernels::AttnCp &c, const T *qkv,
                   const T *kv, T *out, float *lse = nullptr);
template <class T>
bool cudnn_backward(cudaStream_t s, const kernels::AttnCp &c, const T *qkv,
                    const T *kv, const T *dout, T *dqkv, float *dkv,
                    const T *fwd_out = nullptr, const float *fwd_lse = nullptr);

} // namespace cuda_attention_cp
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ATTENTION_CP_H
