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

/// ring's block kb (rank kb.from.g's keys, their chunks o and 2 G - 1 - o)
/// for rank g's queries (chunks g and 2 G - 1 - g) as cuDNN problems over
/// the block's first keys: chunk g over chunk o unmasked where o < g, chunk
/// 2 G - 1 - g over the whole block unmasked where o > g (those are all the
/// keys before each; the other pairs see none), and at o = g each of the
/// rank's chunks causal over the keys up to its end. Without context
/// parallelism (G 1), the rank's rows over its own keys. Each log-sum-exp
/// is packed [B, H, rows]. None for an odd row count (no such split).
inline std::vector<CudnnChunk> cudnn_ring_chunks(const kernels::AttnCp &c,
                                                 const kernels::KvBlock &kb,
                                                 bool bf16) {
  const kernels::AttnShape &a = c.a;
  const int64_t L = a.S, W = a.width(), O = a.H * a.D, K = c.kvWidth();
  auto chunk = [&](int64_t row0, int64_t rows, int64_t keys, bool causal) {
    cuda_attention::cudnn::Sdpa p{a.B,   a.H,     a.KV,  a.D, rows,  keys,
                                  L * W, W,       L * K, K,   L * O, O,
                                  rows,  a.scale, bf16,  true};
    p.causal = causal;
    return CudnnChunk{row0, p};
  };
  const int64_t G = c.part.G, g = c.part.g, o = kb.from.g, half = L / 2;
  if (kb.rows != L || kb.from.G != G)
    return {};
  if (G <= 1)
    return {chunk(0, L, L, true)};
  if (L % 2 != 0)
    return {};
  if (o == g)
    return {chunk(0, half, half, true), chunk(half, half, L, true)};
  if (o < g)
    return {chunk(0, L, half, false)};
  return {chunk(half, half, L, false)};
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

/// ring's block kb on cuDNN (cudnn_ring_chunks), for 16-bit operands
/// without dropout; false where cuDNN does not run it: nothing launched,
/// the block functors (or tiles) run, whose contract this keeps. The
/// forward computes each chunk's output into its rows of `part` (laid out
/// like the output) and its log-sum-exp, and merges them into the running
/// statistics acc, ml (kernels::AttentionMergeFn). The backward reads the
/// ring's output `out` and the final statistics ml, and adds the block's
/// dq into the f32 dq and its dk, dv into the f32 dkv (the block's [B,
/// rows, 2 KV D]); `dq16`, laid out like qkv, takes cuDNN's 16-bit dq on
/// the way (the op's dqkv, written only after the ring).
template <class T>
bool cudnn_ring_forward(cudaStream_t s, const kernels::AttnCp &c,
                        const kernels::KvBlock &kb, const T *qkv, const T *blk,
                        T *part, float *acc, float *ml);
template <class T>
bool cudnn_ring_backward(cudaStream_t s, const kernels::AttnCp &c,
                         const kernels::KvBlock &kb, const T *qkv, const T *blk,
                         const T *dout, const T *out, const float *ml,
                         float *dq, float *dkv, T *dq16);
/// A buffer (outside the plan) for the ring's output, where the gradient
/// recomputes it: the part of its forward's blocks, then the output cuDNN's
/// backward of its blocks reads (with the statistics); null where cuDNN
/// would not run the first block's backward (the functors' contract needs
/// no output).
template <class T> T *cudnn_ring_output(const kernels::AttnCp &c);

} // namespace cuda_attention_cp
} // namespace planrt

#endif // PLANRT_LIB_CUDA_ATTENTION_CP_H
