//===- mma.h - A warp's 16 x 16 x 16 tensor-core product, also on the host ===//
//
// The block kernels' tensor-core step (attention_tc_blocks.h), written once
// for both compilers like block.h: under nvcc a warp loads 16 x 16 tiles of
// 16-bit values from shared memory into WMMA fragments and multiplies them on
// the tensor cores into an fp32 accumulator (sm_80 and later); under a host
// compiler the 32 OpenMP threads of a "warp" each own 8 of the accumulator's
// 256 floats (lane L: row-major elements 8 L .. 8 L + 7) and compute them with
// fp32 FMAs, so test/runtime/cuda checks the tiles' indexing and barriers on
// the host. The GPU's fragment layout is opaque: block code touches an
// accumulator only through zero, load and store (shared memory, row-major).
//
// A host fragment keeps a pointer into shared memory where the GPU copies
// into registers: block code reads a fragment before any barrier lets
// another thread overwrite its tile, which both models then agree on.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_MMA_H
#define PLANRT_LIB_CUDA_MMA_H

#include "block.h"
#include "planrt/kernels.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>
#endif

namespace planrt {
namespace mma {

constexpr int kEdge = 16; // the fragments' edge: 16 x 16 x 16 products
constexpr int kWarp = 32;

/// The warp of a block's thread.
PLANRT_BLOCK_FN int warp_of(const block::Lane &l) { return l.tid / kWarp; }

#ifdef __CUDACC__
namespace wm = nvcuda::wmma;
/// The WMMA element type of a planrt 16-bit type (the same bits).
template <class T> struct elem;
template <> struct elem<kernels::bf16_t> { using type = __nv_bfloat16; };
template <> struct elem<kernels::f16_t> { using type = __half; };

struct Acc {
  wm::fragment<wm::accumulator, kEdge, kEdge, kEdge, float> f;
};
/// A: a 16 x 16 tile of the left operand, row-major.
template <class T> struct A {
  wm::fragment<wm::matrix_a, kEdge, kEdge, kEdge, typename elem<T>::type,
               wm::row_major>
      f;
};
/// B: the right operand's tile, row-major (B[k][n] at k ld + n) or, from the
/// rows of a matrix used transposed, column-major (B[k][n] at n ld + k).
template <class T, bool Cols> struct B {
  wm::fragment<
      wm::matrix_b, kEdge, kEdge, kEdge, typename elem<T>::type,
      typename std::conditional<Cols, wm::col_major, wm::row_major>::type>
      f;
};

PLANRT_BLOCK_FN void zero(const block::Lane &, Acc &c) {
  wm::fill_fragment(c.f, 0.0f);
}
/// c = the 16 x 16 floats at p (row stride ld, a multiple of 4; p 32-byte
/// aligned).
PLANRT_BLOCK_FN void load(const block::Lane &, Acc &c, const float *p, int ld) {
  wm::load_matrix_sync(c.f, p, (unsigned)ld, wm::mem_row_major);
}
PLANRT_BLOCK_FN void store(const block::Lane &, const Acc &c, float *p,
                           int ld) {
  wm::store_matrix_sync(p, c.f, (unsigned)ld, wm::mem_row_major);
}
/// Loads of 16-bit tiles (ld a multiple of 8, p 32-byte aligned).
template <class T>
PLANRT_BLOCK_FN void load(const block::Lane &, A<T> &a, const T *p, int ld) {
  wm::load_matrix_sync(a.f, reinterpret_cast<const typename elem<T>::type *>(p),
                       (unsigned)ld);
}
template <class T, bool Cols>
PLANRT_BLOCK_FN void load(const block::Lane &, B<T, Cols> &b, const T *p,
                          int ld) {
  wm::load_matrix_sync(b.f, reinterpret_cast<const typename elem<T>::type *>(p),
                       (unsigned)ld);
}
/// c += a b.
template <class T, bool Cols>
PLANRT_BLOCK_FN void mma(const block::Lane &, Acc &c, const A<T> &a,
                         const B<T, Cols> &b) {
  wm::mma_sync(c.f, a.f, b.f, c.f);
}
#else
struct Acc {
  float v[kEdge * kEdge / kWarp];
};
template <class T> struct A {
  const T *p;
  int ld;
};
template <class T, bool Cols> struct B {
  const T *p;
  int ld;
};
constexpr int kPerLane = kEdge * kEdge / kWarp;

inline void zero(const block::Lane &, Acc &c) {
  for (float &x : c.v)
    x = 0.0f;
}
inline void load(const block::Lane &l, Acc &c, const float *p, int ld) {
  for (int i = 0; i < kPerLane; ++i) {
    int e = (l.tid % kWarp) * kPerLane + i;
    c.v[i] = p[(e / kEdge) * ld + e % kEdge];
  }
}
inline void store(const block::Lane &l, const Acc &c, float *p, int ld) {
  for (int i = 0; i < kPerLane; ++i) {
    int e = (l.tid % kWarp) * kPerLane + i;
    p[(e / kEdge) * ld + e % kEdge] = c.v[i];
  }
}
template <class T>
inline void load(const block::Lane &, A<T> &a, const T *p, int ld) {
  a.p = p;
  a.ld = ld;
}
template <class T, bool Cols>
inline void load(const block::Lane &, B<T, Cols> &b, const T *p, int ld) {
  b.p = p;
  b.ld = ld;
}
template <class T, bool Cols>
inline void mma(const block::Lane &l, Acc &c, const A<T> &a,
                const B<T, Cols> &b) {
  for (int i = 0; i < kPerLane; ++i) {
    int e = (l.tid % kWarp) * kPerLane + i, r = e / kEdge, n = e % kEdge;
    float s = c.v[i];
    for (int k = 0; k < kEdge; ++k)
      s = fmaf(kernels::ld(a.p[r * a.ld + k]),
               kernels::ld(Cols ? b.p[n * b.ld + k] : b.p[k * b.ld + n]), s);
    c.v[i] = s;
  }
}
#endif

} // namespace mma
} // namespace planrt

#endif // PLANRT_LIB_CUDA_MMA_H
