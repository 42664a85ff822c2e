//===- host_dots.h - Head-dim dots for the attention kernels' host ranges -===//
//
// The attention functors' host range() versions (kernels.h) work on a tile
// of R rows at once (R consecutive queries, or keys, of one head): the dots
// of each row with many others (q with every key, dout with every value)
// from a transposed copy of the others, and weighted sums of rows (p v,
// ds k, ...). Each loaded column or row then serves R accumulators, and the
// R independent add chains keep the vector units busy where one row's chain
// waited on each add. Every element is still summed in the order of the
// per-index versions (dot's sum8 order; a weighted sum in row order), so
// the host computes the GPU's bits (tested in kernels_test).
//
// The accumulators are GCC/Clang vectors of 8 floats: element-wise IEEE
// arithmetic (no FMA: the runtime builds with -ffp-contract=off), the same
// rounding as the scalar expressions on any ISA run_range is built for.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_HOST_DOTS_H
#define PLANRT_HOST_DOTS_H

#include <cstdint>
#include <type_traits>

namespace planrt {
namespace kernels {

/// Most rows of one tile; a range() runs tiles of 1..kTileRows rows.
constexpr int kTileRows = 6;

/// Columns per block of dots_transposed_rows; transposed copies are padded
/// to attn_ld(S) columns so whole blocks can be read from any start column.
constexpr int64_t kDotBlock = 16;
inline int64_t attn_ld(int64_t S) {
  return (S + kDotBlock - 1) / kDotBlock * kDotBlock + kDotBlock;
}

/// xt[d * ld + u] = rows[u * stride + d] for u < n, 0 for n <= u < ld.
inline void transpose_rows(const float *rows, int64_t stride, int64_t n,
                           int64_t D, float *xt, int64_t ld) {
  for (int64_t d = 0; d < D; ++d) {
    float *c = xt + d * ld;
    for (int64_t u = 0; u < n; ++u)
      c[u] = rows[u * stride + d];
    for (int64_t u = n; u < ld; ++u)
      c[u] = 0.0f;
  }
}

typedef float f32x8 __attribute__((vector_size(32)));
/// The same vector at any float's address (loads and stores of rows).
typedef float f32x8_mem __attribute__((vector_size(32), aligned(4), may_alias));
#define PLANRT_LOAD8(p) (*(const f32x8_mem *)(p))
#define PLANRT_STORE8(p, v) (*(f32x8_mem *)(p) = (v))

/// Calls f(std::integral_constant<int, min(n, N)>) for n >= 1: a tile of
/// a run-time row count with compile-time sized accumulators.
template <int N = kTileRows, class F>
inline void with_tile_rows(int64_t n, F &&f) {
  if constexpr (N == 1)
    f(std::integral_constant<int, 1>());
  else if (n >= N)
    f(std::integral_constant<int, N>());
  else
    with_tile_rows<N - 1>(n, f);
}

/// Splits indices [begin, end) of a space of heads of S rows each into tiles
/// of up to kTileRows consecutive rows of one head, in order, calling
/// f(first index, its row in the head, std::integral_constant<int, rows>).
template <class F>
inline void for_each_tile(int64_t begin, int64_t end, int64_t S, F &&f) {
  for (int64_t i = begin; i < end;) {
    int64_t t = i % S;
    int64_t n = end - i < S - t ? end - i : S - t; // rows left in this head
    n = n < kTileRows ? n : kTileRows;
    with_tile_rows(n, [&](auto rows) { f(i, t, rows); });
    i += n;
  }
}

/// out[r][u] = dot(x[r], column u of xt) for r < R, u < n, where column u
/// holds xt[d * ld + u], d < D. Works in whole blocks of kDotBlock
/// columns: reads and writes up to kDotBlock - 1 columns past n (each
/// out[r] holds n rounded up to a multiple of kDotBlock).
/// Each sum in sum8's order: lane l adds the terms d = l, l + 8, ... in
/// turn from 0, and the lanes are added pairwise as sum8 adds them.
template <int R>
inline void dots_transposed_rows(const float *const *x, const float *xt,
                                 int64_t ld, int64_t D, int64_t n,
                                 float *const *out) {
  static_assert(kDotBlock == 16, "a block is two vectors");
  for (int64_t u0 = 0; u0 < n; u0 += kDotBlock) {
    f32x8 lane[8][R][2];
    for (int l = 0; l < 8; ++l) {
      f32x8 acc[R][2];
      for (int r = 0; r < R; ++r)
        acc[r][0] = acc[r][1] = f32x8{};
      for (int64_t d = l; d < D; d += 8) {
        const float *c = xt + d * ld + u0;
        f32x8 c0 = PLANRT_LOAD8(c), c1 = PLANRT_LOAD8(c + 8);
        for (int r = 0; r < R; ++r) {
          const float xv = x[r][d];
          acc[r][0] += xv * c0;
          acc[r][1] += xv * c1;
        }
      }
      for (int r = 0; r < R; ++r) {
        lane[l][r][0] = acc[r][0];
        lane[l][r][1] = acc[r][1];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 2; ++v)
        PLANRT_STORE8(out[r] + u0 + 8 * v,
                      ((lane[0][r][v] + lane[4][r][v]) +
                       (lane[1][r][v] + lane[5][r][v])) +
                          ((lane[2][r][v] + lane[6][r][v]) +
                           (lane[3][r][v] + lane[7][r][v])));
  }
}

/// out[r][d] += sum over t in [lo[r], hi[r]) of w[r][t - lo[r]] *
/// rows[t * stride + d], for r < R and d < D, adding the terms in t order
/// (as a loop of out[d] += w[t] * row[d] does). Rows that every range holds
/// are read once for all R; the few at the ends serve the ranges that hold
/// them.
template <int R>
inline void weighted_rows_add_rows(const float *const *w, const int64_t *lo,
                                   const int64_t *hi, const float *rows,
                                   int64_t stride, int64_t D,
                                   float *const *out) {
  int64_t first = lo[0], last = hi[0], all_lo = lo[0], all_hi = hi[0];
  for (int r = 1; r < R; ++r) {
    first = lo[r] < first ? lo[r] : first;
    last = hi[r] > last ? hi[r] : last;
    all_lo = lo[r] > all_lo ? lo[r] : all_lo;
    all_hi = hi[r] < all_hi ? hi[r] : all_hi;
  }
  // [first, all_lo) and [all_end, last): some ranges; [all_lo, all_end): all.
  int64_t all_end = all_hi > all_lo ? all_hi : all_lo;
  int64_t d0 = 0;
  for (; d0 + 16 <= D; d0 += 16) {
    f32x8 acc[R][2];
    for (int r = 0; r < R; ++r) {
      acc[r][0] = PLANRT_LOAD8(out[r] + d0);
      acc[r][1] = PLANRT_LOAD8(out[r] + d0 + 8);
    }
    auto some = [&](int64_t t) {
      const float *row = rows + t * stride + d0;
      f32x8 c0 = PLANRT_LOAD8(row), c1 = PLANRT_LOAD8(row + 8);
      for (int r = 0; r < R; ++r)
        if (lo[r] <= t && t < hi[r]) {
          const float wv = w[r][t - lo[r]];
          acc[r][0] += wv * c0;
          acc[r][1] += wv * c1;
        }
    };
    for (int64_t t = first; t < all_lo; ++t)
      some(t);
    for (int64_t t = all_lo; t < all_end; ++t) {
      const float *row = rows + t * stride + d0;
      f32x8 c0 = PLANRT_LOAD8(row), c1 = PLANRT_LOAD8(row + 8);
      for (int r = 0; r < R; ++r) {
        const float wv = w[r][t - lo[r]];
        acc[r][0] += wv * c0;
        acc[r][1] += wv * c1;
      }
    }
    for (int64_t t = all_end; t < last; ++t)
      some(t);
    for (int r = 0; r < R; ++r) {
      PLANRT_STORE8(out[r] + d0, acc[r][0]);
      PLANRT_STORE8(out[r] + d0 + 8, acc[r][1]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int64_t d = d0; d < D; ++d) {
      float acc = out[r][d];
      for (int64_t t = lo[r]; t < hi[r]; ++t)
        acc += w[r][t - lo[r]] * rows[t * stride + d];
      out[r][d] = acc;
    }
}

} // namespace kernels
} // namespace planrt

#undef PLANRT_LOAD8
#undef PLANRT_STORE8

#endif // PLANRT_HOST_DOTS_H
