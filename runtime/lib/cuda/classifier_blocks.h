//===- classifier_blocks.h - Softmax cross-entropy, a block per row -------===//
//
// The classifier's loss and its gradient read rows of C logits (50257 for
// GPT-2: 200 KB of fp32 a row). The per-row functors of kernels.h gave a row
// one thread, which read it five times from its own address stream. Here a
// row belongs to a block of 256 threads: each thread walks the row 256 apart
// (the block reads contiguous memory), and the row's max and sum of
// exponentials are reduced in shared memory in a fixed tree order (the same
// bits every run). The loss reads the row twice (max, then sum); the
// gradient three times (max, sum, write), each value computed as
// kernels::CrossEntropyGradFn computes it and rounded once.
//
// The LM head's loss on the cuda target runs both in one block per row
// (in_place_block, plan-fuse-epilogues): the loss from the row's max and
// sum, then the gradient written over the logits, which the GEMM wrote in
// 16 bits. For GPT-2 (B 16, T 1024) that is one 1.6 GB buffer read three
// times and written once, where fp32 logits and a separate gradient were a
// 3.3 GB buffer written by the GEMM, read twice by the loss and three times
// by the gradient, and a second 1.6 GB buffer.
//
// Where the row fits in half the shared memory a block may have (50304 bf16
// logits are 98 KB; an H100 block may opt into 227 KB), so that two blocks
// share an SM and overlap their phases, in_place_staged_block reads it
// from memory once, with 16-byte loads (its max taken on the way), takes
// the sum of exponentials from the copy, and writes the gradient from the
// copy with 16-byte stores: the row crosses the memory bus twice instead of
// four times. The arithmetic and its order are in_place_block's, so the
// two give the same bits (test/runtime/cuda).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_CLASSIFIER_BLOCKS_H
#define PLANRT_LIB_CUDA_CLASSIFIER_BLOCKS_H

#include "block.h"
#include "planrt/kernels.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace planrt {
namespace classifier {

using block::Lane;
using kernels::exp_f32;
using kernels::ld;
using kernels::st;

constexpr int kThreads = 256;

/// The max (or sum) of every thread's v, on every thread; smem holds
/// kThreads floats.
template <bool Max>
PLANRT_BLOCK_FN float block_reduce(const Lane &l, float *smem, float v) {
  smem[l.tid] = v;
  PLANRT_BLOCK_BARRIER();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (l.tid < s) {
      float o = smem[l.tid + s];
      smem[l.tid] = Max ? (o > smem[l.tid] ? o : smem[l.tid]) : smem[l.tid] + o;
    }
    PLANRT_BLOCK_BARRIER();
  }
  float r = smem[0];
  PLANRT_BLOCK_BARRIER(); // smem is free again
  return r;
}

/// Row r's max and sum of exp(x - max) over its first `valid` logits (of
/// storage type T, read as their fp32 values).
template <class T>
PLANRT_BLOCK_FN void row_stats(const Lane &l, float *smem, const T *xr,
                               int64_t valid, float &m, float &sum) {
  float v = -INFINITY;
  for (int64_t j = l.tid; j < valid; j += kThreads)
    v = ld(xr[j]) > v ? ld(xr[j]) : v;
  m = block_reduce<true>(l, smem, v);
  float s = 0.0f;
  for (int64_t j = l.tid; j < valid; j += kThreads)
    s += exp_f32(ld(xr[j]) - m);
  sum = block_reduce<false>(l, smem, s);
}

/// loss[r] (kernels::CrossEntropyFn) for row r.
PLANRT_BLOCK_FN void forward_block(const Lane &l, float *smem,
                                   const kernels::CrossEntropyFn &f,
                                   int64_t r) {
  const int32_t t = f.targets[r];
  if (t < 0 || t >= f.valid) { // uniform over the block
    if (l.tid == 0) {
      kernels::flag_bad_index(f.flag, t);
      f.loss[r] = 0.0f;
    }
    return;
  }
  const float *xr = f.logits + r * f.C;
  float m, sum;
  row_stats(l, smem, xr, f.valid, m, sum);
  if (l.tid == 0)
    f.loss[r] = m + logf(sum) - xr[t];
}

/// dlogits of row r (kernels::CrossEntropyGradFn).
template <class G>
PLANRT_BLOCK_FN void grad_block(const Lane &l, float *smem,
                                const kernels::CrossEntropyGradFn<G> &f,
                                int64_t r) {
  const int32_t t = f.targets[r];
  const float *xr = f.logits + r * f.C;
  G *d = f.dlogits + r * f.C;
  for (int64_t j = f.valid + l.tid; j < f.C; j += kThreads)
    st(d[j], 0.0f);
  if (t < 0 || t >= f.valid) {
    if (l.tid == 0)
      kernels::flag_bad_index(f.flag, t);
    for (int64_t j = l.tid; j < f.valid; j += kThreads)
      st(d[j], 0.0f);
    return;
  }
  float m, sum;
  row_stats(l, smem, xr, f.valid, m, sum);
  const float inv = f.scale / sum;
  for (int64_t j = l.tid; j < f.valid; j += kThreads) {
    float v = exp_f32(xr[j] - m) * inv;
    if constexpr (std::is_same<G, float>::value)
      d[j] = j == t ? v - f.scale : v; // fp32: e * inv, then d[t] -= scale
    else
      st(d[j], j == t ? v - f.scale : v);
  }
}

/// loss[r] and the gradient over row r of the logits
/// (kernels::CrossEntropyInPlaceFn): every thread reads the target's logit
/// before the row's statistics, whose barriers come before any write.
template <class T>
PLANRT_BLOCK_FN void in_place_block(const Lane &l, float *smem,
                                    const kernels::CrossEntropyInPlaceFn<T> &f,
                                    int64_t r) {
  const int32_t t = f.targets[r];
  T *xr = f.logits + r * f.C;
  for (int64_t j = f.valid + l.tid; j < f.C; j += kThreads)
    st(xr[j], 0.0f);
  if (t < 0 || t >= f.valid) { // uniform over the block
    if (l.tid == 0) {
      kernels::flag_bad_index(f.flag, t);
      f.loss[r] = 0.0f;
    }
    for (int64_t j = l.tid; j < f.valid; j += kThreads)
      st(xr[j], 0.0f);
    return;
  }
  const float xt = ld(xr[t]);
  float m, sum;
  row_stats(l, smem, xr, f.valid, m, sum);
  if (l.tid == 0)
    f.loss[r] = m + logf(sum) - xt;
  const float inv = f.scale / sum;
  for (int64_t j = l.tid; j < f.valid; j += kThreads) {
    float v = exp_f32(ld(xr[j]) - m) * inv;
    st(xr[j], j == t ? v - f.scale : v);
  }
}

/// Whether in_place_staged_block can take rows of C logits of T at
/// `logits`: whole 16-byte groups, 16-byte aligned (the arena's buffers
/// are). Shared memory is the caller's to check.
template <class T> inline bool stageable(const T *logits, int64_t C) {
  return (C * (int64_t)sizeof(T)) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(logits) % 16 == 0;
}

/// in_place_block with row r staged in `row` (shared memory, C elements,
/// 16-byte aligned): one read of the row from memory and one write.
template <class T>
PLANRT_BLOCK_FN void
in_place_staged_block(const Lane &l, float *smem, T *row,
                      const kernels::CrossEntropyInPlaceFn<T> &f, int64_t r) {
  const int32_t t = f.targets[r];
  if (t < 0 || t >= f.valid) { // a zero row: nothing to stage
    in_place_block(l, smem, f, r);
    return;
  }
  constexpr int E = 16 / (int)sizeof(T); // elements per 16-byte group
  constexpr int U = 4;                   // groups in flight per thread
  T *xr = f.logits + r * f.C;
  const int64_t groups = f.C / E;
  float v = -INFINITY;
  for (int64_t g0 = l.tid; g0 < groups; g0 += U * kThreads) {
    alignas(16) T e[U][E];
    PLANRT_UNROLL
    for (int u = 0; u < U; ++u)
      if (g0 + u * kThreads < groups)
        block::copy16(e[u], xr + (g0 + u * kThreads) * E, 16);
    PLANRT_UNROLL
    for (int u = 0; u < U; ++u) {
      const int64_t g = g0 + u * kThreads;
      if (g >= groups)
        break;
      block::copy16(row + g * E, e[u], 16);
      PLANRT_UNROLL
      for (int k = 0; k < E; ++k)
        if (g * E + k < f.valid)
          v = ld(e[u][k]) > v ? ld(e[u][k]) : v;
    }
  }
  // The barriers of the reductions also publish the staged row.
  const float m = block_reduce<true>(l, smem, v);
  float s = 0.0f;
  for (int64_t j = l.tid; j < f.valid; j += kThreads)
    s += exp_f32(ld(row[j]) - m);
  const float sum = block_reduce<false>(l, smem, s);
  if (l.tid == 0)
    f.loss[r] = m + logf(sum) - ld(row[t]);
  const float inv = f.scale / sum;
  for (int64_t g = l.tid; g < groups; g += kThreads) {
    alignas(16) T e[E];
    block::copy16(e, row + g * E, 16);
    PLANRT_UNROLL
    for (int k = 0; k < E; ++k) {
      const int64_t j = g * E + k;
      float d = 0.0f;
      if (j < f.valid) {
        d = exp_f32(ld(e[k]) - m) * inv;
        d = j == t ? d - f.scale : d;
      }
      st(e[k], d);
    }
    block::copy16(xr + g * E, e, 16);
  }
}

} // namespace classifier
} // namespace planrt

#endif // PLANRT_LIB_CUDA_CLASSIFIER_BLOCKS_H
