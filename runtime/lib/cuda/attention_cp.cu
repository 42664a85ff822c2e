//===- attention_cp.cu - Context parallelism's attention in tiles ---------===//
//
// The kernels of attention_cp_blocks.h (read its essay first), one block per
// 64 rows, for all_gather's and ring's attention over a block of keys and
// values: forward (grid: B H x query tiles), the backward's query side (B H
// x query tiles: dq) and key side (B KV x the block's key tiles: dk, dv).
// bf16 and fp16 plans take the tensor-core tiles of
// attention_cp_tc_blocks.h (operands 16-byte aligned, as the arena gives
// them), fp32 plans the fp32 ones. Head dims 16, 32, 64 and 128, where the
// tiles' shared memory fits the device; other shapes run the block
// functors one thread per row. All three parts decide alone: each keeps
// the functors' contract (the same ml, acc, dq and dkv), so mixing them is
// correct.
//===----------------------------------------------------------------------===//

#include "attention_cp.h"
#include "attention_cp_blocks.h"
#include "attention_cp_tc_blocks.h"
#include "check.h"
#include "elementwise_blocks.h"

#include <cstdint>
#include <type_traits>

namespace planrt {
namespace cuda_attention_cp {

namespace {

using kernels::AttnCp;
using kernels::KvBlock;

// TC: the tensor-core tiles (attention_cp_tc_blocks.h), for 16-bit T.
template <int D, class T, bool TC>
__global__ void __launch_bounds__(attn::kThreads)
    forward_kernel(AttnCp c, KvBlock kb, const T *qkv, const T *blk, float *acc,
                   float *ml) {
  extern __shared__ __align__(128) char smem[];
  const int64_t bh = blockIdx.x, q0 = (int64_t)blockIdx.y * attn::kRows;
  if constexpr (TC)
    attn_cp_tc::forward_block<D>(block::this_lane(), smem, c, kb, qkv, blk, acc,
                                 ml, bh, q0);
  else
    attn_cp::forward_block<D>(block::this_lane(), (float *)smem, c, kb, qkv,
                              blk, acc, ml, bh, q0);
}

template <int D, class T, bool TC>
__global__ void __launch_bounds__(attn::kThreads)
    grad_q_kernel(AttnCp c, KvBlock kb, const T *qkv, const T *blk,
                  const T *dout, const float *ml, const float *delta,
                  float *dq) {
  extern __shared__ __align__(128) char smem[];
  const int64_t bh = blockIdx.x, q0 = (int64_t)blockIdx.y * attn::kRows;
  if constexpr (TC)
    attn_cp_tc::grad_q_block<D>(block::this_lane(), smem, c, kb, qkv, blk, dout,
                                ml, delta, dq, bh, q0);
  else
    attn_cp::grad_q_block<D>(block::this_lane(), (float *)smem, c, kb, qkv, blk,
                             dout, ml, delta, dq, bh, q0);
}

template <int D, class T, bool TC>
__global__ void __launch_bounds__(attn::kThreads)
    grad_kv_kernel(AttnCp c, KvBlock kb, const T *qkv, const T *blk,
                   const T *dout, const float *ml, const float *delta,
                   float *dkv) {
  extern __shared__ __align__(128) char smem[];
  const int64_t bg = blockIdx.x, u0 = (int64_t)blockIdx.y * attn::kRows;
  if constexpr (TC)
    attn_cp_tc::grad_kv_block<D>(block::this_lane(), smem, c, kb, qkv, blk,
                                 dout, ml, delta, dkv, bg, u0);
  else
    attn_cp::grad_kv_block<D>(block::this_lane(), (float *)smem, c, kb, qkv,
                              blk, dout, ml, delta, dkv, bg, u0);
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

/// Whether T's blocks may take the tensor cores (16-bit plans).
template <class T> constexpr bool kSixteenBit = sizeof(T) == 2;

/// The tensor-core tiles copy 16 bytes at a time: operands come whole from
/// the arena (256-byte aligned), so a misaligned one takes the fp32 tiles.
template <class... P> bool aligned16(const P *...ps) {
  return (elementwise::aligned16(ps) && ...);
}

/// f(std::integral_constant<int, D>, std::bool_constant<TC>, shared bytes)
/// for the head dims with tiles: the tensor-core tiles where `tc` (16-bit T
/// only) and they fit the device's shared memory, else the fp32 ones where
/// those fit; false (nothing launched) otherwise.
template <class T, class Bytes, class F>
bool with_tiles(int64_t D, bool tc, const Bytes &bytes, const F &f) {
  auto run = [&](auto dim) {
    auto go = [&](auto with_tc) {
      const size_t n = bytes(dim, with_tc);
      if (n > cuda_check::smem_optin())
        return false;
      f(dim, with_tc, n);
      return true;
    };
    if constexpr (kSixteenBit<T>)
      if (tc && go(std::true_type()))
        return true;
    return go(std::false_type());
  };
  return attn::with_head_dim(D, run);
}

/// Raises a kernel's shared memory limit (once per kernel).
template <class K> void allow_smem(K kernel, size_t bytes, size_t &allowed) {
  cuda_check::allow_smem(
      kernel, bytes, allowed,
      "cudaFuncSetAttribute (context parallelism's attention)");
}

/// "... (tensor cores)" for the launch's error message.
const char *what(bool tc, const char *simt, const char *tensor) {
  return tc ? tensor : simt;
}

} // namespace

template <class T>
bool forward(cudaStream_t s, const kernels::AttentionBlockFn<T> &f) {
  const kernels::AttnShape &a = f.c.a;
  if (a.S == 0 || a.B * a.H == 0)
    return true; // nothing to do (a grid of 0 blocks is an error)
  if (!gridable(a.S, a.B * a.H))
    return false;
  auto bytes = [](auto dim, auto tc) -> size_t {
    constexpr int D = decltype(dim)::value;
    return decltype(tc)::value ? attn_tc::forward_bytes<D>()
                               : attn::forward_floats<D>() * sizeof(float);
  };
  return with_tiles<T>(
      a.D, aligned16(f.qkv, f.blk), bytes, [&](auto dim, auto tc, size_t n) {
        constexpr int D = decltype(dim)::value;
        constexpr bool TC = decltype(tc)::value;
        static size_t allowed = 0; // this (D, T, TC)'s kernel
        allow_smem(forward_kernel<D, T, TC>, n, allowed);
        forward_kernel<D, T, TC>
            <<<grid(a.S, a.B * a.H), attn::kThreads, n, s>>>(
                f.c, f.kb, f.qkv, f.blk, f.acc, f.ml);
        cuda_check::launch(
            what(TC, "context parallelism's attention (a block's keys)",
                 "context parallelism's attention (a block's keys; tensor "
                 "cores)"));
      });
}

template <class T>
bool grad_q(cudaStream_t s, const kernels::AttentionBlockGradQFn<T> &f) {
  const kernels::AttnShape &a = f.c.a;
  if (a.S == 0 || a.B * a.H == 0)
    return true; // nothing to do (a grid of 0 blocks is an error)
  if (!gridable(a.S, a.B * a.H))
    return false;
  auto bytes = [](auto dim, auto tc) -> size_t {
    constexpr int D = decltype(dim)::value;
    return decltype(tc)::value ? attn_tc::grad_q_bytes<D>()
                               : attn::grad_q_floats<D>() * sizeof(float);
  };
  return with_tiles<T>(
      a.D, aligned16(f.qkv, f.blk, f.dout), bytes,
      [&](auto dim, auto tc, size_t n) {
        constexpr int D = decltype(dim)::value;
        constexpr bool TC = decltype(tc)::value;
        static size_t allowed = 0;
        allow_smem(grad_q_kernel<D, T, TC>, n, allowed);
        grad_q_kernel<D, T, TC><<<grid(a.S, a.B * a.H), attn::kThreads, n, s>>>(
            f.c, f.kb, f.qkv, f.blk, f.dout, f.ml, f.delta, f.dq);
        cuda_check::launch(
            what(TC, "context parallelism's attention dq (a block)",
                 "context parallelism's attention dq (a block; tensor cores)"));
      });
}

template <class T>
bool grad_kv(cudaStream_t s, const kernels::AttentionBlockGradKVFn<T> &f) {
  const kernels::AttnShape &a = f.c.a;
  if (f.kb.rows == 0 || a.B * a.KV == 0)
    return true;
  if (!gridable(f.kb.rows, a.B * a.KV))
    return false;
  auto bytes = [](auto dim, auto tc) -> size_t {
    constexpr int D = decltype(dim)::value;
    return decltype(tc)::value ? attn_tc::grad_kv_bytes<D>()
                               : attn::grad_kv_floats<D>() * sizeof(float);
  };
  return with_tiles<T>(
      a.D, aligned16(f.qkv, f.blk, f.dout), bytes,
      [&](auto dim, auto tc, size_t n) {
        constexpr int D = decltype(dim)::value;
        constexpr bool TC = decltype(tc)::value;
        static size_t allowed = 0;
        allow_smem(grad_kv_kernel<D, T, TC>, n, allowed);
        grad_kv_kernel<D, T, TC>
            <<<grid(f.kb.rows, a.B * a.KV), attn::kThreads, n, s>>>(
                f.c, f.kb, f.qkv, f.blk, f.dout, f.ml, f.delta, f.dkv);
        cuda_check::launch(what(
            TC, "context parallelism's attention dk, dv (a block)",
            "context parallelism's attention dk, dv (a block; tensor cores)"));
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
