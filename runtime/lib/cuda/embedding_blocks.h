//===- embedding_blocks.h - The embedding's gradient without atomics ------===//
//
// dtable[ids[r]] += dout[r] for every row r: many rows may add into one
// table row (a frequent token), so a thread per element needs atomics, whose
// order (hence the result's last bits) changes from run to run. The functor
// EmbeddingGradColumnFn orders the additions by giving each column one
// owner, which walks every row: C threads in all, too few for a GPU.
//
// Here the owners are finer: a block of 256 threads owns a range of
// kRangeRows table rows for 256 columns (thread tid: column c0 + tid). It
// reads the ids 256 at a time into shared memory and, for each row r in
// order whose id falls in its range, each thread adds dout[r][c] into its
// table element. Every table element has one writer that adds in row order
// (the functor's order: the same bits as the host), and a row of dout is
// read by one block per column tile. Each block reads all the ids (64 KB
// for 16 384 rows, from L2): the price of needing no workspace. Rows that
// all hold one token serialize on its block; that is the worst case.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CUDA_EMBEDDING_BLOCKS_H
#define PLANRT_LIB_CUDA_EMBEDDING_BLOCKS_H

#include "block.h"
#include "planrt/kernels.h"

#include <cstdint>

namespace planrt {
namespace embed {

using block::Lane;

constexpr int kThreads = 256;
constexpr int64_t kRangeRows = 512; // table rows a block owns
constexpr int kIds = kThreads;      // shared memory: ids staged per round

/// The table rows [l0, l0 + kRangeRows) of columns [c0, c0 + 256): the
/// additions of every row of dout whose id falls there, in row order. The
/// block with `flags` raises the functor's flag for a bad id (the last one
/// in row order, as the host's walk does).
template <class T>
PLANRT_BLOCK_FN void grad_block(const Lane &l, int32_t *ids,
                                const kernels::EmbeddingGradColumnFn<T> &f,
                                int64_t c0, int64_t l0, bool flags) {
  const int64_t c = c0 + l.tid;
  const int64_t l1 = l0 + kRangeRows;
  for (int64_t r0 = 0; r0 < f.rows; r0 += kIds) {
    const int n = f.rows - r0 < kIds ? (int)(f.rows - r0) : kIds;
    PLANRT_BLOCK_BARRIER();
    if (l.tid < n)
      ids[l.tid] = f.ids[r0 + l.tid];
    PLANRT_BLOCK_BARRIER();
    for (int k = 0; k < n; ++k) {
      const int32_t id = ids[k];
      if (!f.vocab.valid(id)) {
        if (flags && l.tid == 0)
          kernels::flag_bad_index(f.flag, id);
        continue;
      }
      const int64_t row = f.vocab.local(id); // -1: another rank's
      if (row < l0 || row >= l1 || c >= f.C)
        continue;
      f.dtable[row * f.C + c] += kernels::ld(f.dout[(r0 + k) * f.C + c]);
    }
  }
}

} // namespace embed
} // namespace planrt

#endif // PLANRT_LIB_CUDA_EMBEDDING_BLOCKS_H
