//===- attention_cp.cu - Context parallelism's attention in tiles ---------===//
//
// The kernels of attention_cp_blocks.h (read its essay first), one block per
// 64 rows, for all_gather's and ring's attention over a block of keys and
// values: forward (grid: B H x query tiles), the backward's query side (B H
// x query tiles: dq) and key side (B KV x the block's key tiles: dk, dv).
// Head dims 16, 32, 64 and 128, where the tiles' shared memory fits the
// device; other shapes run the block functors one thread per row, as
// before. All three parts decide alone: each keeps the functors' contract
// (the same ml, acc, dq and dkv), so mixing them is correct.
//===----------------------------------------------------------------------===//

#include "attention_cp.h"
#include "attention_cp_blocks.h"
#include "check.h"

namespace planrt {
namespace cuda_attention_cp {

namespace {

using kernels::AttnCp;
using kernels::KvBlock;

template <int D, class T>
__global__ void __launch_bounds__(attn::kThreads)
    forward_kernel(AttnCp c, KvBlock kb, const T *qkv, const T *blk, float *acc,
                   float *ml) {
  extern __shared__ float smem[];
  attn_cp::forward_block<D>(block::this_lane(), smem, c, kb, qkv, blk, acc, ml,
                            (int64_t)blockIdx.x,
                            (int64_t)blockIdx.y * attn::kRows);
}

template <int D, class T>
__global__ void __launch_bounds__(attn::kThreads)
    grad_q_kernel(AttnCp c, KvBlock kb, const T *qkv, const T *blk,
                  const T *dout, const float *ml, const float *delta,
                  float *dq) {
  extern __shared__ float smem[];
  attn_cp::grad_q_block<D>(block::this_lane(), smem, c, kb, qkv, blk, dout, ml,
                           delta, dq, (int64_t)blockIdx.x,
                           (int64_t)blockIdx.y * attn::kRows);
}

template <int D, class T>
__global__ void __launch_bounds__(attn::kThreads)
    grad_kv_kernel(AttnCp c, KvBlock kb, const T *qkv, const T *blk,
                   const T *dout, const float *ml, const float *delta,
                   float *dkv) {
  extern __shared__ float smem[];
  attn_cp::grad_kv_block<D>(block::this_lane(), smem, c, kb, qkv, blk, dout, ml,
                            delta, dkv, (int64_t)blockIdx.x,
                            (int64_t)blockIdx.y * attn::kRows);
}

/// Blocks: x the row groups (up to 2^31 - 1), y the tiles of 64 rows (up to
/// 65535).
bool gridable(int64_t rows, int64_t groups) {
  return (rows + attn::kRows - 1) / attn::kRows <= 65535 &&
         groups <= 2147483647LL;
}
dim3 grid(int64_t rows, int64_t groups) {
  return dim3((unsigned)groups,
              (unsigned)((rows + attn::kRows - 1) / attn::kRows));
}

/// f(std::integral_constant<int, D>, shared bytes) for the head dims with
/// tiles whose `floats` of shared memory fit this device; false otherwise.
template <class Floats, class F>
bool with_head_dim(int64_t D, const Floats &floats, const F &f) {
  auto run = [&](auto dim) {
    const size_t bytes = (size_t)floats(dim) * sizeof(float);
    if (bytes > cuda_check::smem_optin())
      return false;
    f(dim, bytes);
    return true;
  };
  switch (D) {
  case 16:
    return run(std::integral_constant<int, 16>());
  case 32:
    return run(std::integral_constant<int, 32>());
  case 64:
    return run(std::integral_constant<int, 64>());
  case 128:
    return run(std::integral_constant<int, 128>());
  default:
    return false;
  }
}

/// Raises a kernel's shared memory limit (once per kernel).
template <class K> void allow_smem(K kernel, size_t bytes, size_t &allowed) {
  cuda_check::allow_smem(
      kernel, bytes, allowed,
      "cudaFuncSetAttribute (context parallelism's attention)");
}

} // namespace

template <class T>
bool forward(cudaStream_t s, const kernels::AttentionBlockFn<T> &f) {
  const kernels::AttnShape &a = f.c.a;
  if (!gridable(a.S, a.B * a.H))
    return false;
  return with_head_dim(
      a.D,
      [](auto dim) { return attn_cp::forward_floats<decltype(dim)::value>(); },
      [&](auto dim, size_t bytes) {
        constexpr int D = decltype(dim)::value;
        static size_t allowed = 0; // this (D, T)'s kernel
        allow_smem(forward_kernel<D, T>, bytes, allowed);
        forward_kernel<D, T>
            <<<grid(a.S, a.B * a.H), attn::kThreads, bytes, s>>>(
                f.c, f.kb, f.qkv, f.blk, f.acc, f.ml);
        cuda_check::launch("context parallelism's attention (a block's keys)");
      });
}

template <class T>
bool grad_q(cudaStream_t s, const kernels::AttentionBlockGradQFn<T> &f) {
  const kernels::AttnShape &a = f.c.a;
  if (!gridable(a.S, a.B * a.H))
    return false;
  return with_head_dim(
      a.D,
      [](auto dim) { return attn_cp::grad_q_floats<decltype(dim)::value>(); },
      [&](auto dim, size_t bytes) {
        constexpr int D = decltype(dim)::value;
        static size_t allowed = 0;
        allow_smem(grad_q_kernel<D, T>, bytes, allowed);
        grad_q_kernel<D, T><<<grid(a.S, a.B * a.H), attn::kThreads, bytes, s>>>(
            f.c, f.kb, f.qkv, f.blk, f.dout, f.ml, f.delta, f.dq);
        cuda_check::launch("context parallelism's attention dq (a block)");
      });
}

template <class T>
bool grad_kv(cudaStream_t s, const kernels::AttentionBlockGradKVFn<T> &f) {
  const kernels::AttnShape &a = f.c.a;
  if (!gridable(f.kb.rows, a.B * a.KV))
    return false;
  return with_head_dim(
      a.D,
      [](auto dim) { return attn_cp::grad_kv_floats<decltype(dim)::value>(); },
      [&](auto dim, size_t bytes) {
        constexpr int D = decltype(dim)::value;
        static size_t allowed = 0;
        allow_smem(grad_kv_kernel<D, T>, bytes, allowed);
        grad_kv_kernel<D, T>
            <<<grid(f.kb.rows, a.B * a.KV), attn::kThreads, bytes, s>>>(
                f.c, f.kb, f.qkv, f.blk, f.dout, f.ml, f.delta, f.dkv);
        cuda_check::launch("context parallelism's attention dk, dv (a block)");
      });
}

#define PLANRT_ATTENTION_CP_TYPES(T)                                           \
  template bool forward<T>(cudaStream_t,                                       \
                           const kernels::AttentionBlockFn<T> &);              \
  template bool grad_q<T>(cudaStream_t,                                        \
                          const kernels::AttentionBlockGradQFn<T> &);          \
  template bool grad_kv<T>(cudaStream_t,                                       \
                           const kernels::AttentionBlockGradKVFn<T> &);
PLANRT_ATTENTION_CP_TYPES(float)
PLANRT_ATTENTION_CP_TYPES(kernels::bf16_t)
PLANRT_ATTENTION_CP_TYPES(kernels::f16_t)
#undef PLANRT_ATTENTION_CP_TYPES

} // namespace cuda_attention_cp
} // namespace planrt
