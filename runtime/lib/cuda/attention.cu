//===- attention.cu - Tiled causal attention: forward and backward --------===//
//
// The kernels of attention_blocks.h (read its essay first), one block per
// 64 rows: forward (grid: query tiles x B H), the backward's query side
// (query tiles x B H: rowstats, delta, dq) and key side (key tiles x B KV:
// dk, dv), in that order on the compute stream. Head dims 16, 32, 64 and 128
// are instantiated; others, and shapes whose tiles need more shared memory
// than the device gives a block (head dim 128 on sm_86/sm_89), run the
// per-row functors (kernels.h). Shared memory above 48 KB is asked for once
// per kernel (cudaFuncSetAttribute). bf16 and fp16 plans run the
// tensor-core tiles of attention_tc_blocks.h, with the same contract.
//
// recompute = none on the host keeps each row's exponentials (`keep`) for
// the backward; these kernels recompute them from the row statistics
// instead, tile by tile, as flash attention does: reading S x S floats back
// from memory costs more than the FMAs that remake them. So the forward
// writes only `stats`, and the backward reads `stats` (never `keep`).
// Attention dropout multiplies the values' weights (and, in the backward,
// dp) by the mask of kernels.h's AttnDropout, element by element, as the
// functors do.
//
// 16-bit attention without dropout goes to cuDNN's flash attention first
// (attention_cudnn.cpp), and comes here where cuDNN does not run it. Its
// kept statistics are (log-sum-exp, 1): the same probabilities
// exp(s - m) / l for the tiles' and the functors' backward.
//===----------------------------------------------------------------------===//

#include "../context.h"
#include "attention.h"
#include "attention_blocks.h"
#include "attention_cudnn.h"
#include "attention_tc_blocks.h"
#include "check.h"

#include <cuda_runtime.h>

#include <type_traits>

namespace planrt {
namespace cuda_attention {

namespace {

template <int D, class T>
__global__ void __launch_bounds__(attn::kThreads)
    forward_kernel(kernels::AttnShape a, const T *qkv, T *out, float *stats,
                   kernels::AttnDropout drop) {
  extern __shared__ float smem[];
  attn::forward_block<D>(block::this_lane(), smem, a, qkv, out, stats,
                         (int64_t)blockIdx.x, (int64_t)blockIdx.y * attn::kRows,
                         drop);
}

template <int D, class T>
__global__ void __launch_bounds__(attn::kThreads)
    grad_q_kernel(kernels::AttnShape a, const T *qkv, const T *dout, T *dqkv,
                  const float *stats, float *rowstats, float *delta,
                  kernels::AttnDropout drop) {
  extern __shared__ float smem[];
  attn::grad_q_block<D>(block::this_lane(), smem, a, qkv, dout, dqkv, stats,
                        rowstats, delta, (int64_t)blockIdx.x,
                        (int64_t)blockIdx.y * attn::kRows, drop);
}

template <int D, class T>
__global__ void __launch_bounds__(attn::kThreads)
    grad_kv_kernel(kernels::AttnShape a, const T *qkv, const T *dout, T *dqkv,
                   const float *rowstats, const float *delta,
                   kernels::AttnDropout drop) {
  extern __shared__ float smem[];
  attn::grad_kv_block<D>(block::this_lane(), smem, a, qkv, dout, dqkv, rowstats,
                         delta, (int64_t)blockIdx.x,
                         (int64_t)blockIdx.y * attn::kRows, drop);
}

// The 16-bit kernels (attention_tc_blocks.h: products on the tensor cores).
template <int D, class T>
__global__ void __launch_bounds__(attn::kThreads)
    forward_tc_kernel(kernels::AttnShape a, const T *qkv, T *out, float *stats,
                      kernels::AttnDropout drop) {
  extern __shared__ __align__(128) char tc_smem[];
  attn_tc::forward_block<D>(block::this_lane(), tc_smem, a, qkv, out, stats,
                            (int64_t)blockIdx.x,
                            (int64_t)blockIdx.y * attn::kRows, drop);
}

template <int D, class T>
__global__ void __launch_bounds__(attn::kThreads)
    grad_q_tc_kernel(kernels::AttnShape a, const T *qkv, const T *dout, T *dqkv,
                     const float *stats, float *rowstats, float *delta,
                     kernels::AttnDropout drop) {
  extern __shared__ __align__(128) char tc_smem[];
  attn_tc::grad_q_block<D>(block::this_lane(), tc_smem, a, qkv, dout, dqkv,
                           stats, rowstats, delta, (int64_t)blockIdx.x,
                           (int64_t)blockIdx.y * attn::kRows, drop);
}

template <int D, class T>
__global__ void __launch_bounds__(attn::kThreads)
    grad_kv_tc_kernel(kernels::AttnShape a, const T *qkv, const T *dout,
                      T *dqkv, const float *rowstats, const float *delta,
                      kernels::AttnDropout drop) {
  extern __shared__ __align__(128) char tc_smem[];
  attn_tc::grad_kv_block<D>(block::this_lane(), tc_smem, a, qkv, dout, dqkv,
                            rowstats, delta, (int64_t)blockIdx.x,
                            (int64_t)blockIdx.y * attn::kRows, drop);
}

/// stats[2 i] = lse[i], stats[2 i + 1] = 1: cuDNN's log-sum-exp as the
/// (max, sum) pairs the backward reads.
__global__ void pair_stats_kernel(const float *lse, float *stats,
                                  int64_t rows) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows;
       i += (int64_t)gridDim.x * blockDim.x) {
    stats[2 * i] = lse[i];
    stats[2 * i + 1] = 1.0f;
  }
}

/// Whether T's tiles run on the tensor cores (16-bit plans); cuDNN takes
/// those types first.
template <class T> constexpr bool kTensorCores = sizeof(T) == 2;
template <class T>
constexpr bool kBf16 = std::is_same<T, kernels::bf16_t>::value;

/// The tensor-core tiles copy 16 bytes at a time: operands come whole from
/// the arena (256-byte aligned), so a misaligned one is planrt's bug.
inline void check_aligned(const void *p, const char *what) {
  if (reinterpret_cast<uintptr_t>(p) % 16)
    fatal("attention (tensor cores): %s is not 16-byte aligned", what);
}

/// Whether cuDNN may take these operands: its frontend refuses, at
/// execution, a tensor that is not 16-byte aligned (head dims of multiples
/// of 8 keep the views into qkv aligned when qkv is).
inline bool cudnn_aligned(std::initializer_list<const void *> ps) {
  for (const void *p : ps)
    if (reinterpret_cast<uintptr_t>(p) % 16)
      return false;
  return true;
}

/// Raises `kernel`'s shared memory limit (once per kernel).
template <class K> void allow_smem(K kernel, size_t bytes, size_t &allowed) {
  cuda_check::allow_smem(kernel, bytes, allowed,
                         "cudaFuncSetAttribute (attention's shared memory)");
}

/// Blocks: x the row groups (B H or B KV, up to 2^31 - 1), y the tiles of
/// 64 rows (up to 65535: sequences up to 4M).
dim3 grid(int64_t rows, int64_t groups) {
  return dim3((unsigned)groups,
              (unsigned)((rows + attn::kRows - 1) / attn::kRows));
}

/// Whether all three kernels take head dim D on this device for shape `a`:
/// the same answer for the forward and both backward parts, since the
/// tiles keep no exponentials and the per-row functors read them.
template <int D, class T> bool fits(const kernels::AttnShape &a) {
  size_t most = (size_t)attn::grad_kv_floats<D>() * sizeof(float);
  if ((size_t)attn::grad_q_floats<D>() * sizeof(float) > most)
    most = (size_t)attn::grad_q_floats<D>() * sizeof(float);
  if (kTensorCores<T>) {
    most = attn_tc::forward_bytes<D>();
    if (attn_tc::grad_q_bytes<D>() > most)
      most = attn_tc::grad_q_bytes<D>();
    if (attn_tc::grad_kv_bytes<D>() > most)
      most = attn_tc::grad_kv_bytes<D>();
  }
  return most <= cuda_check::smem_optin() &&
         (a.S + attn::kRows - 1) / attn::kRows <= 65535 &&
         a.B * a.H <= 2147483647LL;
}

/// f(std::integral_constant<int, D>) for the head dims with kernels, when
/// they fit (false: nothing launched, the functors run).
template <class T, class F>
bool with_head_dim(const kernels::AttnShape &a, const F &f) {
  return attn::with_head_dim(a.D, [&](auto dim) {
    return fits<decltype(dim)::value, T>(a) && (f(dim), true);
  });
}

} // namespace

template <class T>
bool forward(cudaStream_t s, const kernels::AttnShape &a, const T *qkv, T *out,
             float *stats, const kernels::AttnDropout &drop, float *kept_lse,
             bool keeps) {
  if constexpr (kTensorCores<T>) {
    // A kept log-sum-exp asks for the forward with statistics, so that
    // grad_q's test (runs_forward with them) matches what ran here.
    const bool want_lse = stats != nullptr || kept_lse != nullptr;
    // cuDNN writes no kept exponentials, which the per-row backward would
    // read: an op that keeps them (recompute = none; planc keeps the
    // log-sum-exp instead on cuda) runs the tiles or the per-row functors.
    if (!keeps && cudnn_aligned({qkv, out, kept_lse}) &&
        cudnn::runs_forward(a, kBf16<T>, want_lse, drop.on)) {
      const int64_t rows = a.B * a.H * a.S;
      float *lse = kept_lse ? kept_lse
                   : stats  ? cudnn::lse_scratch(rows)
                            : nullptr;
      cudnn::forward(s, a, kBf16<T>, qkv, out, lse);
      if (stats) {
        int64_t blocks = (rows + 255) / 256;
        pair_stats_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0,
                            s>>>(lse, stats, rows);
        cuda_check::launch("attention's statistics (cuDNN's log-sum-exp)");
      }
      return true;
    }
  }
  return with_head_dim<T>(a, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    static size_t allowed = 0; // this (D, T)'s kernel
    if constexpr (kTensorCores<T>) {
      check_aligned(qkv, "qkv");
      size_t bytes = attn_tc::forward_bytes<D>();
      allow_smem(forward_tc_kernel<D, T>, bytes, allowed);
      forward_tc_kernel<D, T>
          <<<grid(a.S, a.B * a.H), attn::kThreads, bytes, s>>>(a, qkv, out,
                                                               stats, drop);
      cuda_check::launch("attention's forward (tensor cores)");
    } else {
      size_t bytes = attn::forward_floats<D>() * sizeof(float);
      allow_smem(forward_kernel<D, T>, bytes, allowed);
      forward_kernel<D, T><<<grid(a.S, a.B * a.H), attn::kThreads, bytes, s>>>(
          a, qkv, out, stats, drop);
      cuda_check::launch("attention's forward");
    }
  });
}

template <class T>
bool grad_q(cudaStream_t s, const kernels::AttnShape &a, const T *qkv,
            const T *dout, T *dqkv, const float *stats, float *rowstats,
            float *delta, const kernels::AttnDropout &drop, const T *fwd_out,
            const float *fwd_lse) {
  if constexpr (kTensorCores<T>) {
    // cuDNN's backward is whole: dk and dv too (grad_kv then has nothing
    // left to do). The kept output and log-sum-exp are there when the
    // forward ran on cuDNN with statistics (the test forward() made).
    // (grad_kv asks the same of qkv, dout and dqkv.)
    const bool aligned = cudnn_aligned({qkv, dout, dqkv});
    if (aligned && fwd_out && fwd_lse && cudnn_aligned({fwd_out, fwd_lse}) &&
        cudnn::runs_forward(a, kBf16<T>, true, drop.on) &&
        cudnn::backward_kept(s, a, kBf16<T>, drop.on, qkv, fwd_out, fwd_lse,
                             dout, dqkv))
      return true;
    if (aligned && cudnn::backward(s, a, kBf16<T>, drop.on, qkv, dout, dqkv))
      return true;
  }
  return with_head_dim<T>(a, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    static size_t allowed = 0; // this (D, T)'s kernel
    if constexpr (kTensorCores<T>) {
      check_aligned(qkv, "qkv");
      check_aligned(dout, "the output's gradient");
      size_t bytes = attn_tc::grad_q_bytes<D>();
      allow_smem(grad_q_tc_kernel<D, T>, bytes, allowed);
      grad_q_tc_kernel<D, T>
          <<<grid(a.S, a.B * a.H), attn::kThreads, bytes, s>>>(
              a, qkv, dout, dqkv, stats, rowstats, delta, drop);
      cuda_check::launch("attention's dq (tensor cores)");
    } else {
      size_t bytes = attn::grad_q_floats<D>() * sizeof(float);
      allow_smem(grad_q_kernel<D, T>, bytes, allowed);
      grad_q_kernel<D, T><<<grid(a.S, a.B * a.H), attn::kThreads, bytes, s>>>(
          a, qkv, dout, dqkv, stats, rowstats, delta, drop);
      cuda_check::launch("attention's dq");
    }
  });
}

template <class T>
bool grad_kv(cudaStream_t s, const kernels::AttnShape &a, const T *qkv,
             const T *dout, T *dqkv, const float *rowstats, const float *delta,
             const kernels::AttnDropout &drop) {
  if constexpr (kTensorCores<T>) {
    if (cudnn_aligned({qkv, dout, dqkv}) &&
        cudnn::runs_backward(a, kBf16<T>, drop.on))
      return true; // grad_q's cuDNN backward wrote dk and dv
  }
  return with_head_dim<T>(a, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    static size_t allowed = 0; // this (D, T)'s kernel
    if constexpr (kTensorCores<T>) {
      check_aligned(qkv, "qkv");
      check_aligned(dout, "the output's gradient");
      size_t bytes = attn_tc::grad_kv_bytes<D>();
      allow_smem(grad_kv_tc_kernel<D, T>, bytes, allowed);
      grad_kv_tc_kernel<D, T>
          <<<grid(a.S, a.B * a.KV), attn::kThreads, bytes, s>>>(
              a, qkv, dout, dqkv, rowstats, delta, drop);
      cuda_check::launch("attention's dk and dv (tensor cores)");
    } else {
      size_t bytes = attn::grad_kv_floats<D>() * sizeof(float);
      allow_smem(grad_kv_kernel<D, T>, bytes, allowed);
      grad_kv_kernel<D, T><<<grid(a.S, a.B * a.KV), attn::kThreads, bytes, s>>>(
          a, qkv, dout, dqkv, rowstats, delta, drop);
      cuda_check::launch("attention's dk and dv");
    }
  });
}

#define PLANRT_ATTENTION_TYPES(T)                                              \
  template bool forward<T>(cudaStream_t, const kernels::AttnShape &,           \
                           const T *, T *, float *,                            \
                           const kernels::AttnDropout &, float *, bool);       \
  template bool grad_q<T>(cudaStream_t, const kernels::AttnShape &, const T *, \
                          const T *, T *, const float *, float *, float *,     \
                          const kernels::AttnDropout &, const T *,             \
                          const float *);                                      \
  template bool grad_kv<T>(cudaStream_t, const kernels::AttnShape &,           \
                           const T *, const T *, T *, const float *,           \
                           const float *, const kernels::AttnDropout &);
PLANRT_ATTENTION_TYPES(float)
PLANRT_ATTENTION_TYPES(kernels::bf16_t)
PLANRT_ATTENTION_TYPES(kernels::f16_t)
#undef PLANRT_ATTENTION_TYPES

} // namespace cuda_attention
} // namespace planrt
