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
//
// all_gather's 16-bit attention without dropout runs on cuDNN instead,
// whole (cudnn_forward, cudnn_backward): a rank's two chunks of queries
// are two ordinary causal attentions, each over the gathered keys up to
// its last position with the mask aligned to the last key (chunk j of c
// rows over (j + 1) c keys), so neither needs the running statistics. The
// backward reads each chunk's output and log-sum-exp where the plan kept
// them (rank.attention_cp `keeping`: the forward wrote them), else runs
// the chunk's forward again into buffers of its own; it writes dq in place and
// dk, dv of the chunk's keys into a 16-bit scratch, which a pass adds to
// the f32 dkv the reduce-scatter sums, in order (the chunks run one after
// the other; dq is deterministic where cuDNN's backward is, which
// attention_cudnn.cpp's status() says).
//
// ring's 16-bit blocks without dropout run on cuDNN one at a time
// (cudnn_ring_forward, cudnn_ring_backward), in the block functors'
// contract, so that the ring's loop, its shifts and the tiles stay as they
// are. Against a block, each of the rank's chunks sees all of it, part of
// it causally (its own block: the two chunks' causal calls) or none of
// it, so a block is one or two ordinary SDPA calls (cudnn_ring_chunks):
// the calls' outputs and log-sum-exps are merged into the running
// statistics (any maximum is one: acc and the normalizer are relative to
// it), a warp a row. The backward needs the ring's output and each row's
// final log-sum-exp: with them, a block's probabilities and delta are the
// whole attention's, so each call's backward gives the block's share of
// dq, dk and dv, added to the f32 sums the ring carries.
//===----------------------------------------------------------------------===//

#include "attention_cp.h"
#include "attention_cp_blocks.h"
#include "attention_cp_tc_blocks.h"
#include "attention_cudnn.h"
#include "check.h"
#include "elementwise_blocks.h"
#include "planrt/workspace.h"

#include <cstdint>
#include <type_traits>

namespace planrt {
namespace cuda_attention_cp {

namespace {

using kernels::AttnCp;
using kernels::KvBlock;
namespace cudnn = cuda_attention::cudnn;

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

namespace {

/// dkv (f32 [B, S, K]) += the 16-bit dk, dv of the first `keys` rows of
/// each sequence (the same layout).
template <class T>
__global__ void add_kv_grads_kernel(const T *part, float *dkv, int64_t B,
                                    int64_t S, int64_t keys, int64_t K) {
  const int64_t n = B * keys * K, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t col = i % K, t = (i / K) % keys, b = i / (K * keys);
    const int64_t at = (b * S + t) * K + col;
    dkv[at] += kernels::ld(part[at]);
  }
}

/// Grid-stride blocks of 256 threads for n items (at most 8192 blocks).
unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return (unsigned)(blocks < 8192 ? blocks : 8192);
}

/// dkv, the f32 [B, rows, 2 KV D] of all_gather's gathered keys (rows = S)
/// or of a ring's block, += the 16-bit dk, dv of its first `keys` rows.
template <class T>
void add_kv_grads(cudaStream_t s, const AttnCp &c, const T *part, float *dkv,
                  int64_t rows, int64_t keys) {
  const int64_t n = c.a.B * keys * c.kvWidth();
  if (n == 0)
    return;
  add_kv_grads_kernel<T>
      <<<blocks_for(n), 256, 0, s>>>(part, dkv, c.a.B, rows, keys, c.kvWidth());
  cuda_check::launch("context parallelism's dk, dv from cuDNN (their sum)");
}

/// The element-wise functors of context_parallel.h, one thread each.
template <class F> __global__ void each_kernel(int64_t n, F f) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    f(i);
}
template <class F>
void each(cudaStream_t s, int64_t n, const F &f, const char *what) {
  if (n == 0)
    return;
  each_kernel<F><<<blocks_for(n), 256, 0, s>>>(n, f);
  cuda_check::launch(what);
}

/// kernels::AttentionMergeFn a warp per row (8 rows a block): the lanes
/// weigh the row alike and update its acc 32 columns apart, then lane 0
/// stores its statistics, once every lane has read them.
template <class T>
__global__ void __launch_bounds__(256)
    merge_kernel(kernels::AttentionMergeFn<T> f, int64_t n) {
  const int lane = (int)(threadIdx.x % 32);
  const int64_t r = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
  if (r >= n)
    return;
  int64_t i;
  kernels::LseMerge w(0.0f, 0.0f, 0.0f);
  const bool any = f.row(r, &i, &w);
  __syncwarp();
  if (!any)
    return;
  for (int64_t d = lane; d < f.a.D; d += 32)
    f.element(i, w, d);
  if (lane == 0)
    f.store(i, w);
}

template <class T>
void merge(cudaStream_t s, const kernels::AttentionMergeFn<T> &f) {
  const int64_t n = f.a.B * f.a.H * f.rows;
  if (n == 0)
    return;
  merge_kernel<T><<<(unsigned)((n + 7) / 8), 256, 0, s>>>(f, n);
  cuda_check::launch("ring attention's block from cuDNN (merged)");
}

/// A chunk's q, k and v views and its rows of `out` (an output, or the
/// recomputed one).
template <class T>
cudnn::SdpaIo chunk_io(const AttnCp &c, const CudnnChunk &k, const T *qkv,
                       const T *kv, T *out) {
  cudnn::SdpaIo io;
  io.q = qkv + k.row0 * c.a.width();
  io.k = kv;
  io.v = kv + c.a.KV * c.a.D;
  io.o = out + k.row0 * c.a.H * c.a.D;
  return io;
}

/// Whether cuDNN runs every chunk: its forward (with the log-sum-exp where
/// `stats`), or with `backward` the forward with statistics and the
/// backward.
bool cudnn_runs(const std::vector<CudnnChunk> &cs, bool stats, bool backward,
                bool dropout) {
  for (const CudnnChunk &k : cs)
    if (!cudnn::runs(k.problem, stats, backward, dropout))
      return false;
  return true;
}

/// Whether every chunk's log-sum-exp in a buffer like `lse` (at
/// cudnn_cp_lse_at) starts on 16 bytes.
bool lse_aligned(const AttnCp &c, const std::vector<CudnnChunk> &cs,
                 const float *lse) {
  for (const CudnnChunk &k : cs)
    if (!aligned16(lse +
                   workspace::outside::cudnn_cp_lse_at(c.a.B, c.a.H, k.row0)))
      return false;
  return true;
}

} // namespace

template <class T>
bool cudnn_forward(cudaStream_t s, const AttnCp &c, const T *qkv, const T *kv,
                   T *out, float *lse) {
  if constexpr (!kSixteenBit<T>) {
    return false;
  } else {
    const std::vector<CudnnChunk> cs =
        cudnn_chunks(c, std::is_same<T, kernels::bf16_t>::value);
    if (!aligned16(qkv, kv, out))
      return false;
    // The plan's buffer for the log-sum-exps, where cuDNN writes them
    // (cudnn_backward reads them under the same test; kv is the gathered
    // keys' buffer again there, or another whole one: the arena aligns
    // both).
    if (lse &&
        !(lse_aligned(c, cs, lse) && cudnn_runs(cs, true, false, c.drop.on)))
      lse = nullptr;
    if (!lse && !cudnn_runs(cs, false, false, c.drop.on))
      return false;
    for (const CudnnChunk &k : cs) {
      cudnn::SdpaIo io = chunk_io(c, k, qkv, kv, out);
      if (lse)
        io.stats =
            lse + workspace::outside::cudnn_cp_lse_at(c.a.B, c.a.H, k.row0);
      cudnn::forward(s, k.problem, io);
    }
    return true;
  }
}

template <class T>
bool cudnn_backward(cudaStream_t s, const AttnCp &c, const T *qkv, const T *kv,
                    const T *dout, T *dqkv, float *dkv, const T *fwd_out,
                    const float *fwd_lse) {
  if constexpr (!kSixteenBit<T>) {
    return false;
  } else {
    const std::vector<CudnnChunk> cs =
        cudnn_chunks(c, std::is_same<T, kernels::bf16_t>::value);
    if (!aligned16(qkv, kv, dout, dqkv, dkv) ||
        !cudnn_runs(cs, true, true, c.drop.on))
      return false;
    const kernels::AttnShape &a = c.a;
    namespace out = workspace::outside;
    // The forward kept its output and log-sum-exps where it ran with them:
    // its test (cudnn_forward) holds for the same buffers, and the forward
    // with statistics is part of this one's.
    const bool kept =
        fwd_out && fwd_lse && aligned16(fwd_out) && lse_aligned(c, cs, fwd_lse);
    T *o = kept ? const_cast<T *>(fwd_out)
                : static_cast<T *>(cudnn::scratch(
                      cudnn::Scratch::Out,
                      (size_t)out::cudnn_recomputed(a.B, a.H, a.S, a.D)));
    float *lse = kept ? const_cast<float *>(fwd_lse)
                      : static_cast<float *>(cudnn::scratch(
                            cudnn::Scratch::Lse,
                            (size_t)out::cudnn_cp_lse(a.B, a.H, a.S)));
    T *part = static_cast<T *>(cudnn::scratch(
        cudnn::Scratch::Dkv, (size_t)out::cudnn_cp_dkv(a.B, c.S, a.KV, a.D)));
    cuda_check::call(
        cudaMemsetAsync(dkv, 0,
                        (size_t)(a.B * c.S * c.kvWidth()) * sizeof(float), s),
        "cudaMemsetAsync (context parallelism's dk, dv)");
    for (const CudnnChunk &k : cs) {
      cudnn::SdpaIo io = chunk_io(c, k, qkv, kv, o);
      io.stats = lse + out::cudnn_cp_lse_at(a.B, a.H, k.row0);
      if (!kept)
        cudnn::forward(s, k.problem, io);
      io.dout = dout + k.row0 * a.H * a.D;
      io.dq = dqkv + k.row0 * a.width();
      io.dk = part;
      io.dv = part + a.KV * a.D;
      cudnn::backward(s, k.problem, io);
      add_kv_grads(s, c, part, dkv, c.S, k.problem.sk);
    }
    return true;
  }
}

template <class T>
bool cudnn_ring_forward(cudaStream_t s, const AttnCp &c,
                        const kernels::KvBlock &kb, const T *qkv, const T *blk,
                        T *part, float *acc, float *ml) {
  if constexpr (!kSixteenBit<T>) {
    return false;
  } else {
    const std::vector<CudnnChunk> cs =
        cudnn_ring_chunks(c, kb, std::is_same<T, kernels::bf16_t>::value);
    if (cs.empty() || !aligned16(qkv, blk, part) ||
        !cudnn_runs(cs, true, false, c.drop.on))
      return false;
    const kernels::AttnShape &a = c.a;
    namespace out = workspace::outside;
    // Each chunk's output (in its own rows of part) and log-sum-exp, merged
    // before the next chunk overwrites the log-sum-exp (stream order).
    float *lse = static_cast<float *>(cudnn::scratch(
        cudnn::Scratch::Lse, (size_t)out::cudnn_lse(a.B, a.H, a.S)));
    for (const CudnnChunk &k : cs) {
      cudnn::SdpaIo io = chunk_io(c, k, qkv, blk, part);
      io.stats = lse;
      cudnn::forward(s, k.problem, io);
      merge(s, kernels::AttentionMergeFn<T>{part, lse, acc, ml, a, k.row0,
                                            k.problem.sq});
    }
    return true;
  }
}

template <class T>
bool cudnn_ring_backward(cudaStream_t s, const AttnCp &c,
                         const kernels::KvBlock &kb, const T *qkv, const T *blk,
                         const T *dout, const T *out, const float *ml,
                         float *dq, float *dkv, T *dq16) {
  if constexpr (!kSixteenBit<T>) {
    return false;
  } else {
    const std::vector<CudnnChunk> cs =
        cudnn_ring_chunks(c, kb, std::is_same<T, kernels::bf16_t>::value);
    if (cs.empty() || !out || !aligned16(qkv, blk, dout, out, dq16) ||
        !cudnn_runs(cs, true, true, c.drop.on))
      return false;
    const kernels::AttnShape &a = c.a;
    namespace ws = workspace::outside;
    float *lse = static_cast<float *>(cudnn::scratch(
        cudnn::Scratch::Lse, (size_t)ws::cudnn_lse(a.B, a.H, a.S)));
    T *part = static_cast<T *>(cudnn::scratch(
        cudnn::Scratch::Dkv, (size_t)ws::cudnn_cp_dkv(a.B, a.S, a.KV, a.D)));
    for (const CudnnChunk &k : cs) {
      const int64_t rows = k.problem.sq;
      // The final log-sum-exps of the chunk's rows: with the ring's output,
      // the block's probabilities and delta are the whole attention's.
      each(s, a.B * a.H * rows, kernels::RowLseFn{ml, lse, a, k.row0, rows},
           "ring attention's log-sum-exps for cuDNN");
      cudnn::SdpaIo io = chunk_io(c, k, qkv, blk, const_cast<T *>(out));
      io.stats = lse;
      io.dout = dout + k.row0 * a.H * a.D;
      io.dq = dq16 + k.row0 * a.width();
      io.dk = part;
      io.dv = part + a.KV * a.D;
      cudnn::backward(s, k.problem, io);
      each(s, a.B * a.H * rows * a.D,
           kernels::DqAddFn<T>{dq16, dq, a, k.row0, rows},
           "ring attention's dq from cuDNN (its sum)");
      add_kv_grads(s, c, part, dkv, kb.rows, k.problem.sk);
    }
    return true;
  }
}

template <class T> T *cudnn_ring_output(const AttnCp &c) {
  if constexpr (!kSixteenBit<T>) {
    return nullptr;
  } else {
    const kernels::AttnShape &a = c.a;
    const kernels::KvBlock first{a.S, {c.part.g, c.part.G}};
    const std::vector<CudnnChunk> cs =
        cudnn_ring_chunks(c, first, std::is_same<T, kernels::bf16_t>::value);
    if (cs.empty() || !cudnn_runs(cs, true, true, c.drop.on))
      return nullptr;
    return static_cast<T *>(cudnn::scratch(
        cudnn::Scratch::Out,
        (size_t)workspace::outside::cudnn_recomputed(a.B, a.H, a.S, a.D)));
  }
}

#define PLANRT_ATTENTION_CP_TYPES(T)                                           \
  template bool cudnn_forward<T>(cudaStream_t, const AttnCp &, const T *,      \
                                 const T *, T *, float *);                     \
  template bool cudnn_backward<T>(cudaStream_t, const AttnCp &, const T *,     \
                                  const T *, const T *, T *, float *,          \
                                  const T *, const float *);                   \
  template bool cudnn_ring_forward<T>(cudaStream_t, const AttnCp &,            \
                                      const kernels::KvBlock &, const T *,     \
                                      const T *, T *, float *, float *);       \
  template bool cudnn_ring_backward<T>(                                        \
      cudaStream_t, const AttnCp &, const kernels::KvBlock &, const T *,       \
      const T *, const T *, const T *, const float *, float *, float *, T *);  \
  template T *cudnn_ring_output<T>(const AttnCp &);                            \
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
