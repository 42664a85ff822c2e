//===- workspace.h - The temporaries of planrt's ops, in bytes -*- C++ -*-===//
//
// Some ops need scratch memory of their own while they run (per-row
// statistics, partial sums, im2col columns, a collective's staging buffer).
// The compiler plans that memory like every other buffer of the step, so it
// must know the exact bytes each op takes: these functions are that
// contract, included by the compiler (the rank dialect's workspace
// interface) and by the runtime. The runtime checks on every call that an
// op took exactly what the plan gave it, so a formula that drifts from its
// op fails the tests instead of corrupting memory.
//
// Every temporary is rounded up to kAlign bytes (at least one element), as
// the runtime's arena hands them out. No dependencies: plain C++.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_WORKSPACE_H
#define PLANRT_WORKSPACE_H

#include <cstdint>

namespace planrt {
namespace workspace {

/// Alignment (and rounding) of every buffer of the arena.
constexpr int64_t kAlign = 256;
/// Elements summed by one partial of a chunked reduction (kernels.h uses it).
constexpr int64_t kReduceChunk = 1024;

/// n bytes as the arena hands them out: rounded up to kAlign, at least kAlign.
constexpr int64_t round(int64_t bytes) {
  return bytes <= 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
}
/// n fp32 temporaries (at least one).
constexpr int64_t floats(int64_t n) { return round((n > 0 ? n : 1) * 4); }
/// The fp32 copy an op works on for one 16-bit tensor of n elements
/// (mixed precision: ops stage bf16/f16 operands through fp32, ops_impl.inc).
/// It comes before the op's own temporaries.
constexpr int64_t staging(int64_t n) { return floats(n); }
/// The two-int error flag of ops that check indices.
constexpr int64_t flag() { return round(8); }
/// The partial sums of a chunked reduction of n elements.
constexpr int64_t reduce_sum(int64_t n) {
  return floats((n + kReduceChunk - 1) / kReduceChunk);
}

//===--- 16-bit tensors read and written in place -------------------------===//
//
// An op given a bf16 or f16 tensor takes the fp32 copies above (staging)
// unless its kernels read and write its 16-bit tensors as they are (fp32
// arithmetic, each stored value rounded once: the bits of staging). Which
// ops do, for which element types, is decided here from the tensors'
// dtypes (planrt::DType numbers: F32 0, BF16 2, F16 3), by the runtime when
// an op runs and by the compiler when it plans the op's workspace.
namespace native {
constexpr int kF32 = 0;
constexpr bool is16(int dtype) { return dtype == 2 || dtype == 3; }
/// Element-wise and row-wise ops (add, mul, sub, bias_add, activations and
/// their gradients, pos_embedding, embedding's table and output, layer and
/// RMS norms) and the collectives that move values
/// without adding them (all_gather, all_to_all, shard_slice: 16-bit values
/// travel as 2 bytes): every float tensor of one type.
constexpr bool uniform(int) { return true; }
template <class... D> constexpr bool uniform(int first, int second, D... rest) {
  return first == second && uniform(second, rest...);
}
/// bias_grad and pos_embedding_grad: the gradient in the input's type, or
/// in f32 (plan-fuse-casts: a gradient whose only use widens it).
constexpr bool column_sum(int in, int grad) {
  return grad == in || grad == kF32;
}
/// layernorm_grad and rmsnorm_grad (dbeta -1: none): x, gamma, dout and dx
/// of one type, the parameters' gradients in that type or in f32
/// (plan-fuse-casts: gradients whose only uses widen them).
constexpr bool norm_grad(int x, int gamma, int dout, int dx, int dgamma,
                         int dbeta) {
  return uniform(x, gamma, dout, dx) && column_sum(x, dgamma) &&
         (dbeta == -1 || dbeta == dgamma);
}
/// embedding_grad(_add): into an f32 table. A 16-bit table is staged: its
/// rows' additions are summed in the fp32 copy and rounded once.
constexpr bool embedding_grad(int dout, int dtable) {
  return (dout == kF32 || is16(dout)) && dtable == kF32;
}
/// The largest head dim of an attention on 16-bit tensors in place (a GPU
/// thread keeps a row's sums in registers).
constexpr int64_t kAttnMaxHeadDim = 256;
/// attention(_keep): qkv and out of one type, the kept exponentials and
/// statistics f32 (kept: their common dtype, -1 when the op keeps none, -2
/// when they differ), a head dim up to kAttnMaxHeadDim.
constexpr bool attention(int qkv, int out, int kept, int64_t head_dim) {
  return qkv == out && (kept == -1 || kept == kF32) &&
         head_dim <= kAttnMaxHeadDim;
}
/// attention_grad(_kept): qkv, dout and dqkv of one type, as above.
constexpr bool attention_grad(int qkv, int dout, int dqkv, int kept,
                              int64_t head_dim) {
  return dqkv == qkv && attention(qkv, dout, kept, head_dim);
}
/// kv_reduce_scatter: the keys' and values' partial gradients are f32 (any
/// dqkv type).
constexpr bool kv_reduce_scatter(int dkv) { return dkv == kF32; }
/// cross_entropy_grad and ce_grad_from_stats: f32 logits, dlogits in f32
/// or 16 bits (plan-fuse-casts: the loss gradient narrowed for the backward
/// GEMMs is written narrow).
constexpr bool loss_grad(int logits, int dlogits) {
  return logits == kF32 && (dlogits == kF32 || is16(dlogits));
}
/// matmul on cuda: cuBLASLt reads a and b of one 16-bit type and writes c
/// in that type or in f32. (The host's 16-bit GEMM widens its operands in
/// exactly the staging bytes.)
constexpr bool cuda_matmul(int a, int b, int c) {
  return is16(a) && b == a && (c == a || c == kF32);
}
} // namespace native

//===--- Per op (arguments: the sizes the op sees) ------------------------===//

/// mse_loss over n elements.
constexpr int64_t mse_loss(int64_t n) { return reduce_sum(n); }
/// sumsq_accumulate over n elements.
constexpr int64_t sumsq_accumulate(int64_t n) { return reduce_sum(n); }
/// loss_scale over n elements: with `inverse`, the partial sums it adds to
/// the step's sum of unscaled gradients.
constexpr int64_t loss_scale(int64_t n, bool inverse) {
  return inverse ? reduce_sum(n) : 0;
}
/// embedding / embedding_grad / cross_entropy_grad / ce_local_stats /
/// ce_grad_from_stats: the index flag, when there is anything to check.
constexpr int64_t index_check(int64_t elements) {
  return elements > 0 ? flag() : 0;
}
/// Rows summed by one block of a column sum on cuda (lib/cuda/column_sums).
constexpr int64_t kColumnChunkRows = 256;
/// bias_grad and the norms' parameter gradients on cuda: the n column sums
/// of each chunk of kColumnChunkRows rows, which a second pass adds in chunk
/// order (the GPU's columns are too few to fill it otherwise); none when the
/// rows fit in one chunk. The host takes none: each of its threads sums its
/// columns over all rows.
constexpr int64_t column_partials(int64_t rows, int64_t columns, int64_t n) {
  const int64_t chunks = (rows + kColumnChunkRows - 1) / kColumnChunkRows;
  return chunks <= 1 || columns <= 0 ? 0 : floats(chunks * columns * n);
}
/// bias_grad over `rows` rows of `columns`, on cuda or on the host.
constexpr int64_t bias_grad(int64_t rows, int64_t columns, bool cuda) {
  return cuda ? column_partials(rows, columns, 1) : 0;
}
/// layernorm_grad / rmsnorm_grad: the rows' statistics, which the input
/// gradient's kernel computes and the parameters' sums read (on cuda, also
/// those sums' partials). The forward norms keep their statistics in
/// registers: no temporaries.
constexpr int64_t norm_grad(bool layer, int64_t rows, int64_t c,
                            bool cuda = false) {
  return c == 0 ? 0
                : (layer ? floats(rows) : 0) + floats(rows) +
                      (cuda ? column_partials(rows, c, layer ? 2 : 1) : 0);
}
/// attention_grad / attention_grad_kept: (max, normalizer) and delta per
/// (batch, head, position) row.
constexpr int64_t attention_grad(int64_t qkv_elements, int64_t bhs_rows) {
  return qkv_elements == 0 ? 0 : floats(2 * bhs_rows) + floats(bhs_rows);
}
/// kv_gather: this rank's keys and values packed (local elements) and
/// every rank's gathered (G times as many).
constexpr int64_t kv_gather(int64_t local, int64_t group, int64_t elem_bytes) {
  return local == 0
             ? 0
             : round(local * elem_bytes) + round(local * group * elem_bytes);
}
/// kv_reduce_scatter: the partial gradients ordered by owner (G times the
/// local elements) and their sum (f32).
constexpr int64_t kv_reduce_scatter(int64_t local, int64_t group) {
  return local == 0 ? 0 : floats(local * group) + floats(local);
}
/// attention_cp (all_gather): the rows' running sums [rows, head_dim] and
/// (max, sum); its gradient also delta per row and dq [rows, head_dim].
constexpr int64_t attention_cp(int64_t rows, int64_t head_dim) {
  return rows == 0 ? 0 : floats(rows * head_dim) + floats(2 * rows);
}
constexpr int64_t attention_cp_grad(int64_t rows, int64_t head_dim) {
  return rows == 0 ? 0
                   : attention_cp(rows, head_dim) + floats(rows) +
                         floats(rows * head_dim);
}
/// attention_ring: two blocks of keys and values (elements each, of
/// elem_bytes) and attention_cp's; its gradient two f32 blocks of their
/// gradients too, and attention_cp_grad's.
constexpr int64_t attention_ring(int64_t block, int64_t rows, int64_t head_dim,
                                 int64_t elem_bytes) {
  return block == 0
             ? 0
             : 2 * round(block * elem_bytes) + attention_cp(rows, head_dim);
}
constexpr int64_t attention_ring_grad(int64_t block, int64_t rows,
                                      int64_t head_dim, int64_t elem_bytes) {
  return block == 0 ? 0
                    : 2 * round(block * elem_bytes) + 2 * floats(block) +
                          attention_cp_grad(rows, head_dim);
}
/// cross_entropy over `rows` rows; a classifier also counts correct rows.
constexpr int64_t cross_entropy(int64_t rows, bool classifier) {
  int64_t b = floats(rows) + flag() + reduce_sum(rows);
  if (classifier && rows > 0)
    b += floats(rows) + floats(1) + reduce_sum(rows);
  return b;
}
/// ce_loss_from_stats over `rows` rows; a classifier also counts correct
/// rows.
constexpr int64_t ce_loss_from_stats(int64_t rows, bool classifier) {
  int64_t b = floats(rows) + reduce_sum(rows);
  if (classifier && rows > 0)
    b += floats(rows) + floats(1) + reduce_sum(rows);
  return b;
}
/// all_gather: staging of the gathered blocks unless they land contiguous
/// (outer: the product of the dimensions before the gathered one; group: the
/// axis size; elem_bytes: 4, or 2 for 16-bit tensors moved as they are).
constexpr int64_t all_gather(int64_t in_elements, int64_t out_elements,
                             int64_t outer, int64_t group, int64_t elem_bytes) {
  return in_elements == 0 || group == 1 || outer == 1
             ? 0
             : round(out_elements * elem_bytes);
}
/// reduce_scatter: the blocks reordered before the sum unless contiguous.
constexpr int64_t reduce_scatter(int64_t in_elements, int64_t outer,
                                 int64_t group) {
  return in_elements == 0 || group == 1 || outer == 1 ? 0 : floats(in_elements);
}
/// all_to_all: staging of the sent blocks (split_outer != 1) and of the
/// received ones (gather_outer != 1, outer of the output).
constexpr int64_t all_to_all(int64_t elements, int64_t split_outer,
                             int64_t gather_outer, int64_t group,
                             int64_t elem_bytes) {
  return elements == 0 || group == 1
             ? 0
             : (split_outer != 1 ? round(elements * elem_bytes) : 0) +
                   (gather_outer != 1 ? round(elements * elem_bytes) : 0);
}
/// seq_to_heads / heads_to_seq (context parallelism's all-to-all): the
/// blocks packed for sending and those received, each the whole tensor.
constexpr int64_t seq_heads(int64_t elements, int64_t group,
                            int64_t elem_bytes) {
  return elements == 0 || group == 1 ? 0 : 2 * round(elements * elem_bytes);
}
/// conv2d / conv2d_grad: im2col columns [krows, cols] and the output (or
/// output gradient) moved to [O, cols].
constexpr int64_t conv2d(int64_t krows, int64_t cols, int64_t out_channels) {
  return cols == 0 || out_channels == 0
             ? 0
             : floats(krows * cols) + floats(out_channels * cols);
}
/// The sample-ordered sums of batch norm: rows of w values per sample,
/// gathered over a batch split in `group` parts.
constexpr int64_t bn_sum_samples(int64_t n, int64_t w, int64_t group) {
  return group > 1 ? floats(group * n * w) : 0;
}
/// batch_norm over x [n, c, ...] with the batch split over `group` ranks.
constexpr int64_t batch_norm(int64_t n, int64_t c, int64_t group) {
  return c == 0
             ? 0
             : 2 * floats(c) + floats(n * c) + 2 * bn_sum_samples(n, c, group);
}
/// batch_norm_grad.
constexpr int64_t batch_norm_grad(int64_t n, int64_t c, int64_t group) {
  return c == 0 ? 0
                : 2 * floats(c) + floats(2 * c) + floats(n * c) +
                      2 * bn_sum_samples(n, c, group) + floats(n * 2 * c) +
                      bn_sum_samples(n, 2 * c, group);
}
/// group_norm over n samples and g groups.
constexpr int64_t group_norm(int64_t elements, int64_t n, int64_t g) {
  return elements == 0 ? 0 : 2 * floats(n * g);
}
/// group_norm_grad.
constexpr int64_t group_norm_grad(int64_t c, int64_t n, int64_t g) {
  return c == 0 ? 0 : 2 * floats(n * g);
}

//===--- Mixture of experts (lib/moe_impl.inc) ----------------------------===//
//
// n = tokens * top_k routed rows, grouped by expert: each row's slot and
// each slot's row (i32), the experts' first slots (E + 1), the rows' inputs
// [n, d], the hidden activations [n, h] (two with a gate), and the experts'
// outputs [n, d'].

/// The grouping of n routed rows over E experts (their first places, the
/// kept rows and the invalid indices).
constexpr int64_t moe_groups(int64_t n, int64_t experts) {
  return 2 * floats(n) + floats(experts + 2);
}
/// moe_topk(_biased) with a capacity, and moe_aux_grad: a count per
/// (sequence, expert).
constexpr int64_t moe_sequence_counts(int64_t sequences, int64_t experts) {
  return sequences == 0 ? 0 : floats(sequences * experts);
}
/// moe_experts / moe_experts_swiglu.
constexpr int64_t moe_experts(int64_t n, int64_t experts, int64_t d, int64_t h,
                              int64_t d_out, bool gated) {
  return n == 0 ? 0
                : moe_groups(n, experts) + floats(n * d) +
                      (gated ? 2 : 1) * floats(n * h) + floats(n * d_out);
}
/// moe_experts_grad / moe_experts_swiglu_grad: the forward's, the hidden
/// activations once more (their gradient overwrites them), and the rows'
/// input gradients [n, d].
constexpr int64_t moe_experts_grad(int64_t n, int64_t experts, int64_t d,
                                   int64_t h, int64_t d_out, bool gated) {
  return n == 0 ? 0
                : moe_experts(n, experts, d, h, d_out, gated) + floats(n * h) +
                      floats(n * d);
}

/// What recompute = none keeps of the experts' forward for their backward
/// (moe_experts*_keep -> moe_experts*_grad_kept), one f32 buffer of
/// segments, each rounded up to kMoeKeptAlign floats: the grouping (n + n +
/// E + 2 ints), the rows' inputs [n, d], the hidden pre-activations [n, h]
/// (two with a gate) and the experts' outputs [n, d'].
constexpr int64_t kMoeKeptAlign = 64;
constexpr int64_t moe_kept_segment(int64_t floats) {
  return (floats + kMoeKeptAlign - 1) / kMoeKeptAlign * kMoeKeptAlign;
}
constexpr int64_t moe_kept_floats(int64_t n, int64_t experts, int64_t d,
                                  int64_t h, int64_t d_out, bool gated) {
  return moe_kept_segment(n) * 2 + moe_kept_segment(experts + 2) +
         moe_kept_segment(n * d) + (gated ? 2 : 1) * moe_kept_segment(n * h) +
         moe_kept_segment(n * d_out);
}
/// moe_experts*_keep: the hidden activation (its inputs are kept).
constexpr int64_t moe_experts_keep(int64_t n, int64_t h) {
  return n == 0 ? 0 : floats(n * h);
}
/// moe_experts*_grad_kept: the hidden activation again and the rows' input
/// gradients (the kept buffer takes the other gradients in place).
constexpr int64_t moe_experts_grad_kept(int64_t n, int64_t d, int64_t h) {
  return n == 0 ? 0 : floats(n * h) + floats(n * d);
}

/// routed_all_gather / routed_reduce_scatter (expert parallelism's
/// all-to-all dispatcher) over a group of `group` members with blocks of
/// `rows` rows of `width` elements: the routing (the rows sent to the
/// others, each row's place among those received, 2 G counts, and an
/// offset per segment of kRouteChunk rows of a member's block, sent and
/// received), then the rows sent and those received, packed, each at most
/// every other member's block (elem_bytes: 2 for 16-bit rows moved as they
/// are, else 4; routed_reduce_scatter sums in fp32).
constexpr int64_t kRouteChunk = 1024;
constexpr int64_t routed_exchange(int64_t rows, int64_t width, int64_t group,
                                  int64_t elem_bytes) {
  return rows * width == 0 || group == 1
             ? 0
             : round((group - 1) * rows * 4) + round(group * rows * 4) +
                   round(2 * group * 8) +
                   round(2 * group * ((rows + kRouteChunk - 1) / kRouteChunk) *
                         8) +
                   2 * round((group - 1) * rows * width * elem_bytes);
}

//===--- Device memory outside the plan (cuda) ----------------------------===//
//
// The cuda backend holds device memory the plan does not lay out:
// cuBLASLt's workspace and the gradient norm's batched partial sums,
// allocated once, and for 16-bit attention on cuDNN
// (runtime/lib/cuda/attention_cudnn.cpp) the backward's recomputed output
// and log-sum-exp and cuDNN's workspace, each grown to the largest
// attention that needs it. The runtime measures what they hold
// (library_bytes); planc --report adds the most they may hold to the plan's
// peak before it says whether a plan fits.
namespace outside {
/// cuBLASLt's workspace, in bytes.
constexpr int64_t kCublasLtWorkspace = int64_t(32) << 20;
/// The partial sums of the gradient norm's batched sums of squares
/// (runtime/lib/cuda/sums_blocks.h), in bytes.
constexpr int64_t kSumsqPartials = int64_t(256) << 10;
/// Work the cuda backend queues and launches in batches (the cost model
/// charges one launch per batch): AdamW updates that follow each other, up
/// to kAdamWBatch a launch (runtime/lib/cuda/optimizer_blocks.h), and sums
/// of squares of tensors of at most kSumsqQueueChunks chunks of
/// kReduceChunk, up to kSumsqBatch a launch whose chunks fit the partials
/// (runtime/lib/cuda/sums_blocks.h).
constexpr int kAdamWBatch = 32;
constexpr int kSumsqBatch = 64;
constexpr int64_t kSumsqBatchChunks = kSumsqPartials / 4;
constexpr int64_t kSumsqQueueChunks = kSumsqBatchChunks / 8;
/// Whether cuDNN may run an attention: 16-bit, no dropout (planrt draws its
/// own mask), head dims cuDNN's flash attention takes.
constexpr bool cudnn_attention(bool sixteen_bit, bool dropout,
                               int64_t head_dim) {
  return sixteen_bit && !dropout && head_dim > 0 && head_dim % 8 == 0 &&
         head_dim <= 256;
}
/// Whether planrt's cuda attention tiles are built for a head dim
/// (runtime/lib/cuda/attention_blocks.h and the tiles that share its
/// scheme); others run the per-row functors, one GPU thread per row.
constexpr bool tiled_attention(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}
/// The largest cuDNN workspace planrt accepts for an attention of B x H x S
/// rows of head dim D: 64 MiB for a forward, and for the backward also
/// twice the fp32 dq accumulator and row sums of flash attention's backward
/// (linear in S). A graph that wants more runs planrt's tiles.
constexpr int64_t cudnn_workspace_budget(int64_t B, int64_t H, int64_t S,
                                         int64_t D, bool backward) {
  return (int64_t(64) << 20) + (backward ? 2 * B * H * S * (D + 1) * 4 : 0);
}
/// The backward's recomputed output (16 bits) and log-sum-exp (f32).
constexpr int64_t cudnn_recomputed(int64_t B, int64_t H, int64_t S, int64_t D) {
  return B * H * S * D * 2;
}
constexpr int64_t cudnn_lse(int64_t B, int64_t H, int64_t S) {
  return B * H * S * 4;
}
/// Context parallelism's all_gather on cuDNN: its two chunks' log-sum-exps
/// (of L / 2 rows each, or one of L rows without cp), each packed [B, H,
/// rows] (cuDNN before 9.26 takes no strided one into its backward), the
/// second at a 16-byte boundary: where chunk `row0`'s starts, in floats,
/// and the floats of the whole. The forward keeps them in the plan's buffer
/// of that size (rank.attention_cp `keeping`), or the backward recomputes
/// them into one outside the plan (cudnn_cp_lse bytes).
constexpr int64_t cudnn_cp_lse_at(int64_t B, int64_t H, int64_t row0) {
  return (B * H * row0 + 3) / 4 * 4;
}
constexpr int64_t cudnn_cp_lse_floats(int64_t B, int64_t H, int64_t L) {
  return cudnn_cp_lse_at(B, H, L / 2) + B * H * (L - L / 2);
}
constexpr int64_t cudnn_cp_lse(int64_t B, int64_t H, int64_t L) {
  return cudnn_cp_lse_floats(B, H, L) * 4;
}
/// Context parallelism's all_gather backward on cuDNN: a chunk's 16-bit dk
/// and dv over the gathered keys [B, S, 2 KV D], before they are added up.
constexpr int64_t cudnn_cp_dkv(int64_t B, int64_t S, int64_t KV, int64_t D) {
  return B * S * 2 * KV * D * 2;
}
} // namespace outside

} // namespace workspace
} // namespace planrt

#endif
