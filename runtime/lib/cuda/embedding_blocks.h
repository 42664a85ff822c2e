//===- embedding_blocks.h - The embedding's gradient without atomics ------===//
//
// dtable[ids[r]] += dout[r] for every row r: many rows may add into one
// table row (a frequent token), so a thread per element needs atomics, whose
// order (hence the result's last bits) changes from run to run. The functor
// EmbeddingGradColumnFn orders the additions by giving each column one
// owner, which walks every row: C threads in all, too few for a GPU.
//
// Here the owners are finer: a block of 256 threads owns a range of
// kRangeRows table rows for 256 columns (thread tid: column c0 + tid), and
// sums into those rows in shared memory. It reads the ids 256 at a time
// (the next round's while this one runs), each thread turning one into its
// local row or a mark (another range, a bad id). A block-wide count of the
// hits (block::count_before: a ballot per warp) gives each hit its slot in
// row order; a round without hits, nearly every round of nearly every block
// (a range is 32 of 50 304 rows), ends there. Then every thread walks the
// round's hits in order, adding dout[r][c] into its column of the row's
// sum. Every table element has one writer that adds in row order, starting
// from the table's value (read at the row's first hit): the functor's
// order, so the same bits as the host. Rows no id hits are neither read nor
// written.
//
// The walk issues the loads of kBatch hits before it adds any of them: a
// frequent token's block (GPT-2's data: a few tokens take a tenth of the
// rows) would otherwise wait for one load per row, in series. Every block
// reads all the ids (64 KB for 16 384 rows, from L2): the price of needing
// no workspace. An earlier version walked all 256 marks of every round in
// every thread, hits or not: 16 384 shared-memory reads per thread in each
// of the 4 716 blocks of GPT-2's table, where the sums take a few hundred.
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
constexpr int64_t kRangeRows = 32; // table rows a block owns (a bit mask)
constexpr int kIds = kThreads;     // ids staged per round
constexpr int kBatch = 16;         // loads in flight per walk step
/// Shared memory, in floats: the range's sums [kRangeRows][kThreads], then
/// (int32) the round's hits (their rows in the round, their local rows) and
/// the per-warp counts of block::count_before.
constexpr int kSmemFloats =
    (int)kRangeRows * kThreads + 2 * kIds + kThreads / 32;

/// Marks of a staged id that adds nothing here.
constexpr int32_t kElsewhere = -1; // another range or another rank's row
constexpr int32_t kBadId = -2;     // outside the vocabulary: the flag

/// The table rows [l0, l0 + kRangeRows) of columns [c0, c0 + 256): the
/// additions of every row of dout whose id falls there, in row order. The
/// block with `flags` raises the functor's flag for a bad id (the last one
/// in row order, as the host's walk does).
template <class T>
PLANRT_BLOCK_FN void grad_block(const Lane &l, float *smem,
                                const kernels::EmbeddingGradColumnFn<T> &f,
                                int64_t c0, int64_t l0, bool flags) {
  static_assert(kIds == kThreads, "one staged id per thread");
  float *sum = smem; // [kRangeRows][kThreads]
  int32_t *hit_row = reinterpret_cast<int32_t *>(smem + kRangeRows * kThreads);
  int32_t *hit_at = hit_row + kIds;
  int *counts = hit_at + kIds;
  const int64_t c = c0 + l.tid;
  const bool mine = c < f.C;
  uint32_t touched = 0; // rows of the range hit so far (the same everywhere)
  int32_t next = l.tid < f.rows ? f.ids[l.tid] : 0;
  for (int64_t r0 = 0; r0 < f.rows; r0 += kIds) {
    const bool staged = r0 + l.tid < f.rows;
    const int32_t id = next;
    if (r0 + kIds + l.tid < f.rows)
      next = f.ids[r0 + kIds + l.tid];
    int32_t mark = kElsewhere;
    if (staged) {
      mark = kBadId;
      if (f.vocab.valid(id)) {
        const int64_t row = f.vocab.local(id); // -1: another rank's
        mark = row >= l0 && row < l0 + kRangeRows ? (int32_t)(row - l0)
                                                  : kElsewhere;
      }
    }
    if (flags) { // the last bad id of the round, in row order
      int bad = 0;
      const int slot =
          block::count_before<kThreads>(l, mark == kBadId, counts, bad);
      if (mark == kBadId && slot == bad - 1)
        kernels::flag_bad_index(f.flag, id);
    }
    int hits = 0;
    const int slot = block::count_before<kThreads>(l, mark >= 0, counts, hits);
    if (hits == 0) // the same in every thread: no barrier skipped unevenly
      continue;
    if (mark >= 0) {
      hit_row[slot] = l.tid;
      hit_at[slot] = mark;
    }
    PLANRT_BLOCK_BARRIER();
    for (int k0 = 0; k0 < hits; k0 += kBatch) {
      float v[kBatch];
      int32_t at[kBatch];
      PLANRT_UNROLL
      for (int b = 0; b < kBatch; ++b) {
        at[b] = k0 + b < hits ? hit_at[k0 + b] : kElsewhere;
        v[b] = at[b] >= 0 && mine
                   ? kernels::ld(f.dout[(r0 + hit_row[k0 + b]) * f.C + c])
                   : 0.0f;
      }
      PLANRT_UNROLL
      for (int b = 0; b < kBatch; ++b) {
        if (at[b] < 0)
          continue;
        const uint32_t bit = 1u << at[b];
        float *s = sum + at[b] * kThreads + l.tid;
        if (!(touched & bit)) {
          touched |= bit;
          if (mine)
            *s = f.dtable[(l0 + at[b]) * f.C + c];
        }
        if (mine)
          *s += v[b];
      }
    }
    PLANRT_BLOCK_BARRIER(); // the hits are read before the next round's
  }
  if (!mine)
    return;
  for (int i = 0; i < (int)kRangeRows; ++i)
    if (touched & (1u << i))
      f.dtable[(l0 + i) * f.C + c] = sum[i * kThreads + l.tid];
}

} // namespace embed
} // namespace planrt

#endif // PLANRT_LIB_CUDA_EMBEDDING_BLOCKS_H
