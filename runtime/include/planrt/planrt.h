//===- planrt.h - The API that generated programs call ---------*- C++ -*-===//
//
// Generated programs (planc's host and cuda targets) call only what is
// declared here. The same declarations are implemented by two backends:
//   - host: each MPI rank plays one GPU; tensors live in host memory, GEMM is
//     oneDNN, collectives are MPI.
//   - cuda: tensors live in device memory, GEMM is cuBLASLt, collectives are
//     NCCL (the ncclUniqueId is broadcast over MPI).
// Which backend a program gets is decided at link time (libplanrt_host.a or
// libplanrt_cuda.a); the generated source is the same.
//
// Calling convention used by codegen: every call takes the Context first, then
// the op's tensor operands in order, then the attributes that the op's
// RuntimeCallOpInterface lists (dialects/rank/RankOps.td).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_PLANRT_H
#define PLANRT_PLANRT_H

#include <cstdint>

namespace planrt {

struct Context;

/// Element types of a Tensor (values of `Tensor::dtype`). F32 and I32 take 4
/// bytes, BF16 and F16 (mixed precision's 16-bit storage, planrt/dtype.h) 2.
enum DType : int { F32 = 0, I32 = 1, BF16 = 2, F16 = 3 };

/// Bytes per element of a DType.
inline int64_t dtype_bytes(int64_t dtype) {
  return dtype == BF16 || dtype == F16 ? 2 : 4;
}

/// A dense tensor of rank 0..4, row-major. `data` points to host memory
/// on the host backend and to device memory on the cuda backend. Elements are
/// fp32 (`dtype` F32), int32 (`dtype` I32, e.g. token ids; the same storage
/// read through ids()) or 16-bit floats (BF16, F16: `data` points to
/// uint16_t storage). Every op computes in fp32: it reads 16-bit operands
/// as fp32 and rounds its 16-bit results to nearest even, as GPU kernels do
/// (docs/design.md, "Mixed precision").
struct Tensor {
  float *data = nullptr;
  int ndim = 0;
  int64_t shape[4] = {1, 1, 1, 1};
  int dtype = F32;
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i)
      n *= shape[i];
    return n;
  }
  int32_t *ids() const { return reinterpret_cast<int32_t *>(data); }
};

/// Parameter initializers (values of `init_kind`).
enum InitKind : int {
  InitZeros = 0,
  InitOnes = 1,
  InitNormal = 2,
  InitUniform = 3
};
/// Roles of a per-step input (values of `role`).
enum InputRole : int { RoleInput = 0, RoleLabel = 1 };

//===--- Program description: called from the generated plan_setup() -----===//

/// Appends a mesh axis. Axes are declared outermost first; the last declared
/// axis varies fastest across consecutive ranks (it stays within a node).
void declare_mesh_axis(Context *ctx, const char *name, int64_t size);

/// Declares parameter number N (N = order of declaration, from 0). `ndim` and
/// `d0..d3` give the local shape (unused trailing dims are 1). Initialization
/// depends only on (seed, parameter name, global element index), so every
/// parallel plan starts from the same weights. For `InitNormal` a = mean,
/// b = stddev; for `InitUniform` a = low, b = high; ignored otherwise.
void declare_param(Context *ctx, const char *name, int64_t ndim, int64_t d0,
                   int64_t d1, int64_t d2, int64_t d3, int64_t init_kind,
                   float a, float b);
/// One parameter's declare_param arguments, as a row of a static table.
struct ParamDecl {
  const char *name;
  int64_t ndim, d0, d1, d2, d3, init_kind;
  float a, b;
};
/// declare_param for each of the n rows, in order (the generated plan_setup
/// declares its parameters from one table: a statement each would be
/// 120k statements for a 10000-layer GPT).
void declare_params(Context *ctx, const ParamDecl *rows, int64_t n);

/// Declares per-step input number N. `d0..d3` is the local shape; if
/// `batch_axis` >= 0, dimension 0 (the batch) is split over that mesh axis
/// (index into the declared axes) and this rank holds rows
/// [coord * d0, (coord + 1) * d0) of the global batch.
void declare_input(Context *ctx, const char *name, int64_t role, int64_t ndim,
                   int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                   int64_t batch_axis);

/// Sets the element type of per-step input `input_index` (a DType: 0 = F32,
/// the default; 1 = I32, token ids). Call it right after declare_input.
void set_input_dtype(Context *ctx, int64_t input_index, int64_t dtype);

/// Expert parallelism: dimension 0 of per-step input `input_index` is split
/// over its batch axis and, within each block of it, over mesh axis `axis`
/// too. The rank's rows are `chunks` equal runs (its microbatches; 1
/// without), and run c is global block `(coord * chunks + c) * size(axis) +
/// coord(axis)` of the run's length.
void set_input_inner_axis(Context *ctx, int64_t input_index, int64_t axis,
                          int64_t chunks);

/// Context parallelism: dimension 1 (the sequence) of per-step input
/// `input_index` is split over mesh axis `axis` (G ranks): the sequence is
/// cut into 2 G chunks and the rank with coordinate g holds chunks g and
/// 2 G - 1 - g, in that order (see rope). Token shards only.
void set_input_seq_axis(Context *ctx, int64_t input_index, int64_t axis);

/// Kinds of training data (values of `data_kind`).
enum DataKind : int {
  DataSynthetic = 0,
  DataTokenShards = 1,
  DataSyntheticImages = 2,
  DataCifar10 = 3
};

/// Training loop settings. `data_kind`:
///  0 = synthetic regression: each input element is uniform in [-1, 1) from
///      (seed, step, global row, column); each label row is a fixed nonlinear
///      "teacher" function of its input row (the teacher depends only on the
///      seed), so the data is the same for any plan. Inputs must be F32.
///  1 = token shards (see set_data_path): exactly one input and one label,
///      both I32 with the same local shape [rows, S] and the same batch axis.
///      The token stream is the concatenation of the shard files in sorted
///      name order. At step s (from 1) global row g of the batch takes the
///      window w = stream[pos + g*S, pos + g*S + S + 1): input row = w[0, S),
///      label row = w[1, S + 1). With P = global_batch * S, R = min(S,
///      tokens - 1 - P) tokens kept as room, E = floor((tokens - 1 - R) / P)
///      steps per epoch, e = floor((s - 1) / E) and k = (s - 1) mod E:
///      pos = (e * 7) mod (R + 1) + k * P. So pos advances by P per step, and
///      each epoch starts a few tokens further in, so that a small text is
///      not cut into the same windows every epoch. Each rank reads only the
///      windows of its own rows, so the data is the same for any split of
///      the batch.
///  2 = synthetic classification (images): one F32 input [rows, ...] (e.g.
///      NCHW) and one I32 label [rows]. Row g of step s has class
///      k = hash(seed, s, g) mod classes (set_classes) and the
///      input is class k's pattern, shifted by a random phase, plus uniform
///      noise in [-0.5, 0.5): for NCHW, each class is two oriented gratings
///      with its own frequencies and channel weights (a function of the seed
///      only), so a convolutional network can learn the classes. The data is
///      the same for any plan.
void set_training(Context *ctx, int64_t steps, int64_t seed,
                  int64_t global_batch, int64_t data_kind);
///  3 = CIFAR-10 binary batches (set_data_path: a glob pattern of files of
///      3073-byte records, a class byte then 32x32 red, green and blue
///      planes): input F32 [rows, 3, 32, 32], label I32 [rows]. The records
///      of the files (sorted by name) form one sequence of R records; step s
///      row g reads record ((s - 1) * B + g) mod R (B the global batch), so
///      every plan reads the same images. Pixels p become (p / 255 - mean)
///      / std with the CIFAR-10 channel statistics (mean 0.4914, 0.4822,
///      0.4465; std 0.2470, 0.2435, 0.2616).
/// The number of classes of a classifier (data kinds 2 and 3: its width).
void set_classes(Context *ctx, int64_t classes);

/// For data_kind 1: a glob pattern (relative to the current directory) of
/// the token shard files. A shard is a header of 256 little-endian int32
/// (header[0] = 20240520, header[1] = 1 (version), header[2] = number of
/// tokens) followed by that many little-endian uint16 tokens (the format of
/// llm.c; tools/plan-tokenize writes it). planrt::run checks every matching
/// file before any collective; on a problem every rank prints
/// "planrt: error: <file or pattern>: <what>; <how to fix>" and run returns 1.
void set_data_path(Context *ctx, const char *pattern);

/// Learning-rate schedule (values of `kind`).
enum LrScheduleKind : int { LrConstant = 0, LrCosine = 1 };

/// Sets the schedule applied to the `lr` attribute of sgd_update and
/// adamw_update (that attribute is the BASE lr L). At step s (from 1), with
/// W = warmup_steps and D = decay_steps (0 = the number of steps of the run,
/// i.e. --steps when given):
///   s <= W:          lr = L * s / W                  (linear warmup, W > 0)
///   otherwise, kind 0 (constant):  lr = L
///              kind 1 (cosine):    p  = min(1, (s - W) / max(1, D - W))
///                                  lr = min_lr + 0.5 * (1 + cos(pi * p))
///                                              * (L - min_lr)
/// so the cosine schedule reaches min_lr at step D and stays there. Without a
/// call the lr is constant (L at every step).
void set_lr_schedule(Context *ctx, int64_t kind, int64_t warmup_steps,
                     float min_lr, int64_t decay_steps);

/// Checkpoints (the train section's `checkpoint = "DIR"` and
/// `checkpoint_every = N`): every N steps (0: only when SIGTERM or SIGUSR1
/// stops the run) all ranks write DIR/step-NNNNNN/ (each rank its shards of
/// the parameters and optimizer state, rank 0 then manifest.json). The
/// directory is relative to the current directory; --checkpoint-dir and
/// --checkpoint-every override both. See docs/checkpoints.md.
void set_checkpoint(Context *ctx, const char *dir, int64_t every);

/// Registers the generated forward function: the model alone (no backward,
/// no update), computing the logits of the current inputs; --generate calls
/// it and samples from the observed "logits".
void set_forward(Context *ctx, void (*forward)(Context *));
/// Generation samples among the first `classes` logits only (a vocabulary
/// padded so that tp divides it: the padding is never sampled).
void set_generation_classes(Context *ctx, int64_t classes);
/// The vocabulary of the token input: ids in [0, vocab) (the embedding's
/// rows, padding excluded). With it, every batch read from token shards is
/// checked (an id outside names its file, its position in it, the step and
/// the rank) and --prompt bytes are checked before training.
void set_token_vocab(Context *ctx, int64_t vocab);

/// Addition to the original API (optional; for tensor-parallel plans):
/// declares that dimension `dim` of parameter `param_index` is split over
/// mesh axis `mesh_axis`. The declared shape stays the local shard; the global
/// dimension is local * (product of the sizes of the dim's axes). May be
/// called several times for one dim, outer axis first: the dim is then split
/// into P = size(a0) * size(a1) * ... blocks and this rank holds block
/// coord[a0] * size(a1) + coord[a1] (mixed radix, in call order). An axis
/// may split only one dim, once. Initialization then uses global element
/// indices (every plan starts from the same weights) and --save gathers and
/// writes the whole tensor. Call it from plan_setup after declare_param.
void shard_param(Context *ctx, int64_t param_index, int64_t dim,
                 int64_t mesh_axis);

/// Exports (--save, --save-every, --save-init) only the first `rows` rows of
/// parameter `param_index` (dimension 0): an embedding table padded so that
/// tp divides it is saved with its real vocabulary, the same tensor as an
/// unpadded plan's.
void set_param_export_rows(Context *ctx, int64_t param_index, int64_t rows);

/// Keeps parameter `param_index` also as a 16-bit copy (dtype BF16 or F16):
/// param_copy() returns it, rounded to nearest even from the parameter, and
/// the *_copy optimizer updates write it with the parameter. Mixed
/// precision's casts of the fp32 weights then happen once per step, in the
/// update, instead of before every use (plan-keep-param-copies). The copy
/// is derived: checkpoints and --save do not hold it. Call it from
/// plan_setup.
void set_param_copy(Context *ctx, int64_t param_index, int64_t dtype);

/// Declares that global dimension `dim` of parameter `param_index` is the
/// concatenation of segments of global sizes s0, s1, s2 (a 0 ends the list
/// and every later size must be 0 too; s0 > 0), e.g. a packed [q | k | v]
/// weight split by heads: H*Dh, KV*Dh, KV*Dh. Each segment is split evenly
/// over the dim's axes (shard_param): with P blocks and this rank's block b,
/// the local dim holds elements [b*s0/P, (b+1)*s0/P) of segment 0, then the
/// same block of segment 1, then of segment 2. The declared (local) size must
/// be s0/P + s1/P + s2/P. Checked when the program starts (fatal): every
/// segment divisible by P and the sizes summing to the global dimension
/// (local * P). Without shard_param on that dim P = 1 and the segments only
/// have to sum to the dim. Call once per dim, from plan_setup.
void set_param_segments(Context *ctx, int64_t param_index, int64_t dim,
                        int64_t s0, int64_t s1, int64_t s2);

/// Declares persistent optimizer-state tensor number N (N = order of
/// declaration, from 0, separate from the parameters' numbering), e.g. the
/// AdamW moments of a parameter or of its ZeRO shard. `ndim` and `d0..d3`
/// give the local shape (unused trailing dims are 1); the tensor is F32,
/// zero at the start of the run, and kept across steps (written to
/// checkpoints, not to --save). Names must be distinct. Call it from
/// plan_setup.
void declare_state(Context *ctx, const char *name, int64_t ndim, int64_t d0,
                   int64_t d1, int64_t d2, int64_t d3);
/// One state tensor's declare_state arguments, as a row of a static table.
struct StateDecl {
  const char *name;
  int64_t ndim, d0, d1, d2, d3;
};
/// declare_state for each of the n rows, in order.
void declare_states(Context *ctx, const StateDecl *rows, int64_t n);
/// shard_param and set_param_segments for state tensor `state_index`: where
/// this rank's shard sits in the global tensor (e.g. the AdamW moments of a
/// tensor-parallel weight, or a ZeRO shard over dp). Only checkpoints use
/// it: each rank writes its shard and a run under another plan reads the
/// slices it needs. Without calls the state is whole on every rank that
/// holds it. Same rules and checks as for parameters; call from plan_setup.
void shard_state(Context *ctx, int64_t state_index, int64_t dim,
                 int64_t mesh_axis);
/// State tensor `state_index` is model state, not optimizer state (batch
/// norm's running statistics): it starts as a parameter of init kind
/// `init_kind` with a, b would (declare_param) instead of at zero, and is
/// exported with the parameters (--save, --save-every, --save-init, by
/// global tensor under its name) and read by --init-from. Like all state it
/// is kept across steps and written to checkpoints. Call from plan_setup.
void set_state_buffer(Context *ctx, int64_t state_index, int64_t init_kind,
                      float a, float b);
void set_state_segments(Context *ctx, int64_t state_index, int64_t dim,
                        int64_t s0, int64_t s1, int64_t s2);

/// Records the bytes the compiler computed for this rank (the same on every
/// rank's call; with a pipeline, expect_pipeline_bytes instead): `params`
/// for parameters, `grads` for gradients (reported only) and `state` for the
/// tensors of declare_state. The runtime counts params = 4 * sum of the
/// local element counts of the parameters this rank holds and state = 4 *
/// sum of the element counts of the state tensors it holds, and tracks the step
/// arena's peak (the most bytes alloc/view scratch and the ops' temporaries
/// took in one step, each allocation rounded up to 256). When expect_bytes was
/// called, at the end of planrt::run rank 0 prints, before the "done" line,
///   memory per rank: params P B, state S B, step arena peak A B
///   (compiler: params P' B, grads G' B, state S' B)
/// (one line, rank 0's numbers), and if any rank's params or state differ
/// from the compiler's, every rank prints "planrt: error: rank R: ..." and
/// run returns 1 without the "done" line. Call it from plan_setup.
void expect_bytes(Context *ctx, int64_t params, int64_t grads, int64_t state);

/// Model FLOPs of one training step per rank: planc sums the FLOPs of the
/// plan-level ops of the step (forward, backward and optimizer, on global
/// shapes: 2 M N K per matmul, 4 B S^2 (H D) per causal attention and twice
/// that for its gradient, one per result element for the other ops) and
/// divides by the number of ranks. MFU = this / step time / peak FLOP/s of
/// one device (see docs/runtime.md). Call it from plan_setup.
void set_step_flops(Context *ctx, double flops);
/// The GPU of the plan's cluster section ("a100", "a100_40gb", "h100",
/// "h200", "b200", "l40s"): on the cuda backend its dense fp32 peak is the
/// device peak of the MFU unless --peak-flops or PLANRT_PEAK_FLOPS give one
/// (ignored on the host backend). Call it from plan_setup.
void set_cluster_gpu(Context *ctx, const char *gpu);
/// The plan's precision ("fp32", "tf32", "bf16" or "fp16"; fp32 unless
/// called): a 16-bit plan's MFU is against the GPU's dense bf16 (tensor
/// core) peak, a tf32 plan's against its TF32 peak, an fp32 plan's against
/// its fp32 peak. With "tf32" the cuda backend's fp32 GEMMs run on TF32
/// tensor cores (the host computes fp32). Call it from plan_setup.
void set_compute_precision(Context *ctx, const char *precision);

//===--- Step body: called from the generated plan_step() -----------------===//

/// Parameter / per-step input buffers by declaration index (persistent).
/// param() is nullptr for a parameter of a pipeline stage this rank does not
/// own (set_param_stage).
Tensor *param(Context *ctx, int64_t index);
/// The 16-bit copy of parameter `index` (set_param_copy), equal to the
/// parameter rounded; nullptr where param() is.
Tensor *param_copy(Context *ctx, int64_t index);
Tensor *input(Context *ctx, int64_t index);
/// Optimizer-state tensor by declaration index (declare_state; persistent);
/// nullptr for a stage this rank does not own (set_state_stage).
Tensor *state(Context *ctx, int64_t index);
/// Scratch tensor valid until the end of the current step (arena-allocated;
/// the arena is reset before every step). Contents are undefined.
/// `dtype` is a DType (F32 unless given).
Tensor *alloc(Context *ctx, int64_t ndim, int64_t d0, int64_t d1, int64_t d2,
              int64_t d3, int64_t dtype = F32);

//===--- The compiler's memory plan (plan-memory) -------------------------===//
//
// A compiled program's buffers live in one arena per rank at offsets planc
// chose (docs/design.md, "The memory plan"): the arena is allocated once at
// start, no device memory is allocated during a step, and the runtime
// checks the plan as it runs: no two live buffers share bytes, every op
// takes exactly the temporaries planrt/workspace.h promises, every buffer is
// released before its function returns, and the highest byte a step reaches
// equals the compiler's arena size (the "memory per rank" check, exit code
// 1).

/// Function `function` (0: plan_step, 1: plan_forward) on pipeline
/// coordinate `coord` (0 without a pipeline) reaches `bytes` of the arena;
/// its buffers would take `buffer_bytes` without reuse. Call it from
/// plan_setup, once per function and coordinate.
void plan_arena(Context *ctx, int64_t function, int64_t coord, int64_t bytes,
                int64_t buffer_bytes);
/// The pipeline stash of pipeline coordinate `coord` needs a pool of
/// `bytes` (plan-memory simulates the schedule's stash allocations and frees
/// with the allocator planrt runs on them, planrt/best_fit.h). With it,
/// alloc_stash allocates no device memory during a step, and a step that
/// reaches another size than planned fails the memory check. Call it from
/// plan_setup.
void plan_stash(Context *ctx, int64_t coord, int64_t bytes);
/// Start and end of a planned function's body. arena_end checks that every
/// buffer was released and records the highest byte reached.
void arena_begin(Context *ctx, int64_t function);
void arena_end(Context *ctx);
/// The buffer at `offset` of the arena (kind 0: activations and their
/// gradients, 1: parameter gradients) with elements of `dtype` (a DType).
/// Fatal if its bytes overlap a live buffer. Contents are undefined.
Tensor *alloc_at(Context *ctx, int64_t offset, int64_t kind, int64_t ndim,
                 int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                 int64_t dtype = F32);
/// alloc_at on the ranks that own pipeline stage `stage`, nullptr elsewhere.
Tensor *alloc_at_on_stage(Context *ctx, int64_t stage, int64_t offset,
                          int64_t kind, int64_t ndim, int64_t d0, int64_t d1,
                          int64_t d2, int64_t d3, int64_t dtype = F32);
/// Ends the life of an alloc_at buffer (null: nothing). With PLANRT_POISON=1
/// in the environment its bytes are filled with NaN, so that a read after
/// the end of its planned life shows in the results.
void dealloc(Context *ctx, Tensor *t);
/// The next op's temporaries: `bytes` at `offset` of the arena. The op must
/// take exactly that (checked at the next planned call).
void op_workspace(Context *ctx, int64_t offset, int64_t bytes);

/// alloc() on the ranks that own pipeline stage `stage` (owns_stage), nullptr
/// on the others: a buffer of one stage's code outside the pipeline's units.
Tensor *alloc_on_stage(Context *ctx, int64_t stage, int64_t ndim, int64_t d0,
                       int64_t d1, int64_t d2, int64_t d3, int64_t dtype = F32);

/// A tensor header sharing src's data (and dtype) with another shape of the
/// same element count; unused trailing dims are 1. The header is valid until
/// the end of the current step, like alloc(). view, subview and rows of a
/// null source (a stage this rank does not hold) are null.
Tensor *view(Context *ctx, Tensor *src, int64_t ndim, int64_t d0, int64_t d1,
             int64_t d2, int64_t d3);
/// A view of src's elements [offset, offset + numel) with the given shape
/// (unused trailing dims are 1): gradients that are reduced together live
/// side by side in one bucket. Valid until the end of the step.
Tensor *subview(Context *ctx, Tensor *src, int64_t offset, int64_t ndim,
                int64_t d0, int64_t d1, int64_t d2, int64_t d3);
/// A view of block `index` of `count` equal blocks of src along dimension 0
/// (microbatch `index` of the rows this rank holds); valid until the end of
/// the current step, like view().
Tensor *rows(Context *ctx, Tensor *src, int64_t index, int64_t count);
/// This rank's block along dimension 0 of src over mesh axis `axis` (a
/// view): rows(src, g, G) with g the rank's coordinate on the axis and G its
/// size. Null for a null src (a stage this rank does not hold).
Tensor *shard_view(Context *ctx, Tensor *src, int64_t axis);
/// Scratch memory taken after arena_mark() is given back by
/// arena_release(mark) (with the tensor headers made since): the body of a
/// microbatch loop runs in the memory of one microbatch. Marks nest; a
/// release also drops the marks taken after it.
int64_t arena_mark(Context *ctx);
void arena_release(Context *ctx, int64_t mark);
/// The microbatch a microbatch loop's iteration works on (its index from 0);
/// ops whose global element indices depend on it (dropout) read it. A
/// pipeline unit's microbatch is unit_begin's.
void set_microbatch(Context *ctx, int64_t mb);
/// Every element of t = value (converted to int32 for an I32 tensor).
void fill(Context *ctx, Tensor *t, float value);
/// out = in converted to out's dtype (F32, BF16 or F16; the same shape),
/// rounding to nearest even: mixed precision's casts (plan.cast).
void cast(Context *ctx, const Tensor *in, Tensor *out);

/// c = op(a) @ op(b); op(x) = x^T when the flag is set. Operands of rank > 2
/// are viewed as 2-D [rows, last dim] (rows = product of the leading dims),
/// so [B,S,K] @ [K,N] -> [B,S,N] is a linear layer and X^T @ dY with X
/// [B,S,K], dY [B,S,N] (transpose_a) contracts over B*S into [K,N].
void matmul(Context *ctx, const Tensor *a, const Tensor *b, Tensor *c,
            bool transpose_a, bool transpose_b);
/// c = op(a) @ op(b) + bias (bias [N] of c's type, added to every row): a
/// linear layer whose product only feeds its bias add (planc's
/// plan-fuse-epilogues, cuda target). On cuda the bias is added in the
/// GEMM's epilogue (cuBLASLt) when a, b, bias and c share one type; else,
/// and on the host, it is matmul then bias_add, with their results.
void matmul_bias(Context *ctx, const Tensor *a, const Tensor *b,
                 const Tensor *bias, Tensor *c, bool transpose_a,
                 bool transpose_b);
/// c = residual + op(a) @ op(b), residual of c's type and shape (not c): an
/// unbiased projection that only feeds the residual stream's add
/// (plan-fuse-epilogues, cuda target: cuBLASLt's C with beta = 1; where it
/// has no algorithm, and on the host, matmul then add).
void matmul_add(Context *ctx, const Tensor *a, const Tensor *b,
                const Tensor *residual, Tensor *c, bool transpose_a,
                bool transpose_b);
/// c = residual + (op(a) @ op(b) + bias), residual of c's type and shape
/// (not c): a linear layer's biased product that only feeds the residual
/// stream's add (plan-fuse-epilogues, cuda target). On cuda the residual is
/// the GEMM's C matrix (beta = 1) with the bias in its epilogue, c rounded
/// once; else, and on the host, matmul_bias then add, with their results.
void matmul_bias_add(Context *ctx, const Tensor *a, const Tensor *b,
                     const Tensor *bias, const Tensor *residual, Tensor *c,
                     bool transpose_a, bool transpose_b);
/// pre = op(a) @ op(b) + bias, out = gelu(pre) (tanh form): matmul_bias
/// followed by gelu (plan-fuse-epilogues, cuda target). On cuda both come
/// from the GEMM's epilogue (cuBLASLt's GELU_AUX_BIAS) when all five tensors
/// share one type; else, and on the host, it is matmul_bias then gelu.
void matmul_bias_gelu(Context *ctx, const Tensor *a, const Tensor *b,
                      const Tensor *bias, Tensor *pre, Tensor *out,
                      bool transpose_a, bool transpose_b);
/// dpre = (op(a) @ op(b)) * gelu'(pre) (tanh form): the GEMM of GELU's
/// output gradient followed by gelu_grad (plan-fuse-epilogues, cuda
/// target). On cuda the derivative is applied in the GEMM's epilogue
/// (cuBLASLt's DGELU, reading pre) when all five tensors share one type;
/// else, and on the host, it is matmul then gelu_grad, with their results.
void matmul_dgelu(Context *ctx, const Tensor *a, const Tensor *b,
                  const Tensor *pre, Tensor *dpre, bool transpose_a,
                  bool transpose_b);
/// c = op(a) @ op(b) and db = bias_grad(b): a linear layer's weight
/// gradient x^T dy and its bias gradient (plan-fuse-epilogues, cuda
/// target). On cuda db comes from the GEMM's epilogue (cuBLASLt's BGRADA,
/// which sums the rows of b as it reads them) when b is not transposed and
/// cuBLASLt has an algorithm; else, and on the host, it is matmul then
/// bias_grad, with their results.
void matmul_bias_grad(Context *ctx, const Tensor *a, const Tensor *b, Tensor *c,
                      Tensor *db, bool transpose_a, bool transpose_b);
/// The same with c += op(a) @ op(b) (beta 1: a weight gradient summed over
/// microbatches); db is written, not added to.
void matmul_bias_grad_accumulate(Context *ctx, const Tensor *a, const Tensor *b,
                                 Tensor *c, Tensor *db, bool transpose_a,
                                 bool transpose_b);
/// c += op(a) @ op(b), the sum in fp32 (a weight gradient accumulated over
/// microbatches by its GEMM, as Megatron's gradient-accumulation fusion).
void matmul_accumulate(Context *ctx, const Tensor *a, const Tensor *b,
                       Tensor *c, bool transpose_a, bool transpose_b);
/// out[r, j] = x[r, j] + b[j]   (x viewed as [numel / n, n], n = b.numel()).
void bias_add(Context *ctx, const Tensor *x, const Tensor *b, Tensor *out);
/// db[j] = sum_r dy[r, j].
void bias_grad(Context *ctx, const Tensor *dy, Tensor *db);
/// out = a + b (same shapes).
void add(Context *ctx, const Tensor *a, const Tensor *b, Tensor *out);
void relu(Context *ctx, const Tensor *x, Tensor *out);
/// dx = dy * (x > 0).
void relu_grad(Context *ctx, const Tensor *x, const Tensor *dy, Tensor *dx);
/// GELU, tanh approximation (GPT-2's form).
void gelu(Context *ctx, const Tensor *x, Tensor *out);
void gelu_grad(Context *ctx, const Tensor *x, const Tensor *dy, Tensor *dx);
/// GELU, exact form x * Phi(x) (erf), and its input gradient.
void gelu_exact(Context *ctx, const Tensor *x, Tensor *out);
void gelu_exact_grad(Context *ctx, const Tensor *x, const Tensor *dy,
                     Tensor *dx);
/// out (rank-0) = scale * sum((pred - target)^2). With scale = 1/global_numel
/// and a later all-reduce this is the global mean squared error.
void mse_loss(Context *ctx, const Tensor *pred, const Tensor *target,
              Tensor *out, float scale);
/// dpred = 2 * scale * (pred - target).
void mse_loss_grad(Context *ctx, const Tensor *pred, const Tensor *target,
                   Tensor *dpred, float scale);
/// w -= lr * g.
void sgd_update(Context *ctx, Tensor *w, const Tensor *g, float lr);
/// sgd_update that also rounds the updated w into `copy` (bf16 or f16, w's
/// shape: the parameter's set_param_copy copy), as cast() would, in the same
/// pass over w.
void sgd_update_copy(Context *ctx, Tensor *w, const Tensor *g, Tensor *copy,
                     float lr);
/// AdamW with decoupled weight decay and bias correction. The moments are
/// tensors the program owns (state(ctx, i) of declare_state, zero before the
/// first step), each of w's shape:
///   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
///   w -= lr * ((m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
///              + weight_decay * w)
/// with t the step number (from 1) and lr the scheduled lr.
void adamw_update(Context *ctx, Tensor *w, const Tensor *g, Tensor *m,
                  Tensor *v, float lr, float beta1, float beta2, float eps,
                  float weight_decay);
/// adamw_update with g first clipped as clip_by_global_norm(g, sumsq,
/// max_norm) clips it (the same factor and rounding), without writing g:
/// the same parameters and moments as the two calls, one pass over g.
void adamw_update_clipped(Context *ctx, Tensor *w, const Tensor *g, Tensor *m,
                          Tensor *v, const Tensor *sumsq, float lr, float beta1,
                          float beta2, float eps, float weight_decay,
                          float max_norm);
/// adamw_update(_clipped) that also rounds the updated w into `copy` (as
/// sgd_update_copy does).
void adamw_update_copy(Context *ctx, Tensor *w, const Tensor *g, Tensor *m,
                       Tensor *v, Tensor *copy, float lr, float beta1,
                       float beta2, float eps, float weight_decay);
void adamw_update_clipped_copy(Context *ctx, Tensor *w, const Tensor *g,
                               Tensor *m, Tensor *v, const Tensor *sumsq,
                               Tensor *copy, float lr, float beta1, float beta2,
                               float eps, float weight_decay, float max_norm);

//===--- Collectives ------------------------------------------------------===//
//
// A group is the set of ranks that differ only in the mesh axes selected by
// `axis_mask` (bit i = i-th declared axis) or in the one mesh axis `axis`
// (the index of a declared axis). Every member of a group must make the same
// calls in the same order. With `axis`, G is the axis size and g this rank's
// coordinate on it; a dimension split over the axis is cut into G equal
// blocks and block b lives on the rank with g = b. Tensors are F32 and
// row-major; in and out must not overlap. Shapes are checked (fatal with both
// shapes). With a group of one rank the ops are local copies.

/// In-place sum over the group of `axis_mask`.
void all_reduce_sum(Context *ctx, Tensor *t, int64_t axis_mask);
/// In-place maximum over the group of `axis_mask`.
void all_reduce_max(Context *ctx, Tensor *t, int64_t axis_mask);

/// Non-blocking all_reduce_sum (to overlap gradient all-reduces with the
/// backward pass): starts the in-place sum of t over the group of
/// `axis_mask` on `slot` (0..1023, chosen by the compiler) and returns; t
/// must stay allocated and must be neither read nor written until
/// collective_wait(ctx, slot) returns, after which it holds the sum. Starting
/// on a slot whose collective was not waited for, waiting on a slot with
/// nothing started, or a step that ends (or a begin_step) with a slot still
/// busy is a fatal error naming the slot. Members of the group must start
/// their collectives in the same order.
void all_reduce_sum_start(Context *ctx, Tensor *t, int64_t axis_mask,
                          int64_t slot);
/// Waits for the collective started on `slot` (see all_reduce_sum_start)
/// and frees the slot. On the cuda backend the wait is asynchronous: later
/// work of the step is ordered after the collective.
void collective_wait(Context *ctx, int64_t slot);

/// out = the concatenation along `dim` of the members' `in`, in order of g:
/// out.shape[dim] = G * in.shape[dim], the other dims equal.
void all_gather(Context *ctx, const Tensor *in, Tensor *out, int64_t dim,
                int64_t axis);
/// out = block g along `dim` of the sum over the group of `in`:
/// out.shape[dim] = in.shape[dim] / G (which must divide), the others equal.
void reduce_scatter(Context *ctx, const Tensor *in, Tensor *out, int64_t dim,
                    int64_t axis);
/// Local, no communication: out = block g of `in` along `dim`, with
/// out.shape[dim] = in.shape[dim] / G.
void shard_slice(Context *ctx, const Tensor *in, Tensor *out, int64_t dim,
                 int64_t axis);
/// `in` is this rank's block g of a tensor X split along gather_dim; out is
/// block g of X split along split_dim instead: out.shape[gather_dim] =
/// G * in.shape[gather_dim], out.shape[split_dim] = in.shape[split_dim] / G,
/// the others equal. gather_dim != split_dim.
void all_to_all(Context *ctx, const Tensor *in, Tensor *out, int64_t gather_dim,
                int64_t split_dim, int64_t axis);
/// Expert parallelism's all-to-all dispatcher (the gathers and
/// reduce-scatters over ep of a mixture of experts' operands and partial
/// outputs, restricted to the rows that matter). `experts` holds the
/// group's choices [G * rows, K] (the same on every member), and member r
/// holds experts [r * experts_per_rank, (r + 1) * experts_per_rank); a row
/// is needed by the members that hold one of its (not dropped) choices.
/// routed_all_gather: out = all_gather(in) along dimension 0, except that
/// a row of another member's block arrives only if this member needs it
/// (the others are zero). routed_reduce_scatter: out = reduce_scatter(in)
/// along dimension 0, where member r's rows that r does not need are taken
/// as zero (not sent); the sum runs in member order.
void routed_all_gather(Context *ctx, const Tensor *in, const Tensor *experts,
                       Tensor *out, int64_t experts_per_rank, int64_t axis);
void routed_reduce_scatter(Context *ctx, const Tensor *in,
                           const Tensor *experts, Tensor *out,
                           int64_t experts_per_rank, int64_t axis);
/// Records this step's loss (rank-0 tensor, already reduced) for logging.
void report_loss(Context *ctx, const Tensor *loss);

// Below, "rows" is the product of all but the last dimension and C is the last
// dimension. Every output is overwritten (nothing accumulates) except
// sumsq_accumulate's `acc`.

/// out = a * b, out = a - b (same shapes); out = factor * x.
void mul(Context *ctx, const Tensor *a, const Tensor *b, Tensor *out);
void sub(Context *ctx, const Tensor *a, const Tensor *b, Tensor *out);
void scale(Context *ctx, const Tensor *x, Tensor *out, float factor);

//===--- Dynamic loss scaling (loss_scale = dynamic) ----------------------===//
//
// The scale S starts at 65536 (--loss-scale S to choose another). At the end
// of a step whose unscaled gradients overflowed on any rank, S halves and the
// step is skipped: its clipping and optimizer updates do nothing (AdamW's
// bias correction counts applied steps only); after 2000 clean steps in a
// row S doubles, as PyTorch's GradScaler does. The step line shows S and,
// on a skipped step, the steps skipped so far; checkpoints keep S and the
// counters.

/// Turns dynamic loss scaling on (from plan_setup).
void set_dynamic_loss_scale(Context *ctx);
/// out = S * x, or x / S with `inverse`; with `inverse`, notes whether any
/// element of out is not finite (an overflow on this rank).
void loss_scale(Context *ctx, const Tensor *x, Tensor *out, bool inverse);
/// Collective over all ranks, before the step's first update: whether any
/// rank noted an overflow this step; if so the step is skipped everywhere.
void loss_scale_check(Context *ctx);
/// out = x (same shapes). planc copies a parameter or optimizer state whose
/// new value was computed elsewhere (e.g. gathered after a ZeRO update) back
/// into its persistent buffer.
void copy(Context *ctx, const Tensor *x, Tensor *out);
/// SiLU: x * sigmoid(x); dx = dy * d silu(x) / dx.
void silu(Context *ctx, const Tensor *x, Tensor *out);
void silu_grad(Context *ctx, const Tensor *x, const Tensor *dy, Tensor *dx);
/// Softmax over the last dimension (max-subtracted). softmax_grad takes the
/// softmax output y: dx = y * (dy - sum(y * dy)) per row.
void softmax(Context *ctx, const Tensor *x, Tensor *out);
void softmax_grad(Context *ctx, const Tensor *y, const Tensor *dy, Tensor *dx);

/// out[..., :] = table[ids[...], :]; ids I32 of any rank <= 3, table [V, C],
/// out = ids shape + [C]. An id outside [0, V) is a fatal error.
/// Vocab-parallel form: with `vocab_axis` a mesh axis of size G and this
/// rank's coordinate g on it, the local table [Vl, C] holds global rows
/// [g*Vl, (g+1)*Vl): an id in that range reads row id - g*Vl, any other id
/// gives a zero row (an all_reduce_sum over the axis completes the lookup),
/// and an id outside [0, G*Vl) is a fatal error. vocab_axis = -1: the table
/// is whole (V = Vl, g = 0, G = 1).
void embedding(Context *ctx, const Tensor *ids, const Tensor *table,
               Tensor *out, int64_t vocab_axis);
/// dtable = 0, then dtable[ids[r], :] += dout[r, :] for every row r; with
/// `vocab_axis` (as in embedding) only the rows of ids this rank owns, at
/// local row id - g*Vl; ids outside [0, G*Vl) are fatal.
void embedding_grad(Context *ctx, const Tensor *ids, const Tensor *dout,
                    Tensor *dtable, int64_t vocab_axis);
/// embedding_grad without zeroing dtable: dtable[ids[r], :] += dout[r, :]
/// on what dtable holds (a tied embedding's gradient added into the other
/// use's).
void embedding_grad_add(Context *ctx, const Tensor *ids, const Tensor *dout,
                        Tensor *dtable, int64_t vocab_axis);
/// x, out [B,S,C], table [T,C] with S <= T: out[b,s,:] = x[b,s,:] + table[s,:].
/// With `seq_axis` >= 0, local row s is at its position as for rope.
void pos_embedding(Context *ctx, const Tensor *x, const Tensor *table,
                   Tensor *out, int64_t seq_axis = -1);
/// dtable[s,:] = sum_b dout[b,s,:] for s < S; rows s >= S are zero. With
/// `seq_axis` >= 0: the rows of this rank's positions, the others zero.
void pos_embedding_grad(Context *ctx, const Tensor *dout, Tensor *dtable,
                        int64_t seq_axis = -1);

/// LayerNorm over the last dim (biased variance): gamma, beta [C].
void layernorm(Context *ctx, const Tensor *x, const Tensor *gamma,
               const Tensor *beta, Tensor *out, float eps);
/// Recomputes the row statistics from x. dgamma, dbeta [C] are sums over rows.
void layernorm_grad(Context *ctx, const Tensor *x, const Tensor *gamma,
                    const Tensor *dout, Tensor *dx, Tensor *dgamma,
                    Tensor *dbeta, float eps);
/// RMSNorm: out = x * rsqrt(mean(x^2) + eps) * gamma, gamma [C].
void rmsnorm(Context *ctx, const Tensor *x, const Tensor *gamma, Tensor *out,
             float eps);
void rmsnorm_grad(Context *ctx, const Tensor *x, const Tensor *gamma,
                  const Tensor *dout, Tensor *dx, Tensor *dgamma, float eps);
/// The same with dx = plus + the norm's input gradient, rounded once: the
/// residual stream's gradient added where the norm's kernel writes dx
/// (plan-fuse-epilogues, cuda target). plus has dx's type and shape.
void layernorm_grad_add(Context *ctx, const Tensor *x, const Tensor *gamma,
                        const Tensor *dout, const Tensor *plus, Tensor *dx,
                        Tensor *dgamma, Tensor *dbeta, float eps);
void rmsnorm_grad_add(Context *ctx, const Tensor *x, const Tensor *gamma,
                      const Tensor *dout, const Tensor *plus, Tensor *dx,
                      Tensor *dgamma, float eps);

/// Causal grouped-query self-attention. qkv [B, S, (H + 2 KV) * D] holds the
/// H query heads, then the KV key heads, then the KV value heads along the
/// last dim; out [B, S, H * D]. Query head h uses kv head h / (H / KV); scores
/// are scaled by 1/sqrt(D) and position t attends to positions 0..t.
/// Rotary position embedding of packed qkv [B, S, (H + 2 KV) Dh] (this
/// rank's heads; Dh even): query and key heads rotated by their sequence
/// position (Llama's rotate-half convention, base `theta`), value heads
/// copied; `inverse` rotates back (the gradient). out has qkv's shape and
/// must be another buffer.
/// With `seq_axis` >= 0 (context parallelism) the rows are this rank's
/// part of a sequence split over that axis: two chunks, at the positions
/// of kernels::SeqPart (rank g of G holds chunks g and 2 G - 1 - g).
void rope(Context *ctx, const Tensor *qkv, Tensor *out, int64_t num_heads,
          int64_t num_kv_heads, double theta, bool inverse,
          int64_t seq_axis = -1);
/// Context parallelism by all-to-all (Ulysses) over `axis` (G ranks).
/// seq_to_heads: in [B, L, W], this rank's L = S / G positions (as for
/// rope's seq_axis), W = q_width, then two segments of kv_width when
/// kv_width > 0 (packed q/k/v); out [B, S, W / G]: every position, in
/// order, of block g of each segment (whole heads). heads_to_seq is its
/// inverse (in [B, S, W / G], out [B, L, W]; the widths describe out).
void seq_to_heads(Context *ctx, const Tensor *in, Tensor *out, int64_t q_width,
                  int64_t kv_width, int64_t axis);
void heads_to_seq(Context *ctx, const Tensor *in, Tensor *out, int64_t q_width,
                  int64_t kv_width, int64_t axis);
/// Context parallelism by all-gather over `axis` (G ranks). kv_gather:
/// kv [B, L G, 2 kv_width] = every position's keys and values (the columns
/// after q_width of each rank's qkv [B, L, q_width + 2 kv_width]), in
/// position order. attention_cp: causal attention of this rank's queries
/// (qkv's rows, at their positions) over kv; out as for attention.
/// attention_cp_grad: dqkv's query columns (its other columns are left for
/// kv_reduce_scatter), and dkv (f32, kv's shape): the keys' and values'
/// gradients from this rank's queries. kv_reduce_scatter: the sum of every
/// rank's dkv, this rank's positions of it, into dqkv's key and value
/// columns.
void kv_gather(Context *ctx, const Tensor *qkv, Tensor *kv, int64_t q_width,
               int64_t kv_width, int64_t axis);
void attention_cp(Context *ctx, const Tensor *qkv, const Tensor *kv,
                  Tensor *out, int64_t num_heads, int64_t num_kv_heads,
                  int64_t axis, float dropout = 0.0f, int64_t dropout_uid = 0,
                  int64_t batch_axes = 0, int64_t microbatches = 0,
                  int64_t mb_inner_axes = 0, int64_t head_axes = 0,
                  int64_t head_inner_axes = 0);
void attention_cp_grad(Context *ctx, const Tensor *qkv, const Tensor *kv,
                       const Tensor *dout, Tensor *dqkv, Tensor *dkv,
                       int64_t num_heads, int64_t num_kv_heads, int64_t axis,
                       float dropout = 0.0f, int64_t dropout_uid = 0,
                       int64_t batch_axes = 0, int64_t microbatches = 0,
                       int64_t mb_inner_axes = 0, int64_t head_axes = 0,
                       int64_t head_inner_axes = 0);
/// attention_cp that also writes, where cuDNN runs it (cuda, 16-bit, no
/// dropout), its chunks' log-sum-exps to lse (f32, workspace.h
/// outside::cudnn_cp_lse_floats); attention_cp_grad that reads them and
/// attention_cp_lse's output fwd_out where they were written, instead of
/// running the forward again (planc's plan-keep-attention pairs them).
/// Elsewhere lse is not written, and the gradient recomputes.
void attention_cp_lse(Context *ctx, const Tensor *qkv, const Tensor *kv,
                      Tensor *out, Tensor *lse, int64_t num_heads,
                      int64_t num_kv_heads, int64_t axis, float dropout = 0.0f,
                      int64_t dropout_uid = 0, int64_t batch_axes = 0,
                      int64_t microbatches = 0, int64_t mb_inner_axes = 0,
                      int64_t head_axes = 0, int64_t head_inner_axes = 0);
void attention_cp_grad_lse(Context *ctx, const Tensor *qkv, const Tensor *kv,
                           const Tensor *dout, Tensor *dqkv, Tensor *dkv,
                           const Tensor *fwd_out, const Tensor *lse,
                           int64_t num_heads, int64_t num_kv_heads,
                           int64_t axis, float dropout = 0.0f,
                           int64_t dropout_uid = 0, int64_t batch_axes = 0,
                           int64_t microbatches = 0, int64_t mb_inner_axes = 0,
                           int64_t head_axes = 0, int64_t head_inner_axes = 0);
void kv_reduce_scatter(Context *ctx, const Tensor *dkv, Tensor *dqkv,
                       int64_t q_width, int64_t kv_width, int64_t axis);
/// Context parallelism by ring over `axis`: attention of this rank's
/// queries (qkv's rows, as for attention_cp) over every rank's keys and
/// values, which go round the ring one rank's block per step, each shifted
/// on while the one in hand is computed (online softmax). The gradient runs
/// the ring twice (the rows' statistics again, then the gradients, the
/// keys' and values' travelling with their block back to its owner), once
/// from attention_ring_lse's kept output and log-sum-exps (below); dqkv
/// (shape of qkv) is overwritten.
void attention_ring(Context *ctx, const Tensor *qkv, Tensor *out,
                    int64_t num_heads, int64_t num_kv_heads, int64_t axis,
                    float dropout = 0.0f, int64_t dropout_uid = 0,
                    int64_t batch_axes = 0, int64_t microbatches = 0,
                    int64_t mb_inner_axes = 0, int64_t head_axes = 0,
                    int64_t head_inner_axes = 0);
void attention_ring_grad(Context *ctx, const Tensor *qkv, const Tensor *dout,
                         Tensor *dqkv, int64_t num_heads, int64_t num_kv_heads,
                         int64_t axis, float dropout = 0.0f,
                         int64_t dropout_uid = 0, int64_t batch_axes = 0,
                         int64_t microbatches = 0, int64_t mb_inner_axes = 0,
                         int64_t head_axes = 0, int64_t head_inner_axes = 0);
/// attention_ring that also writes each query row's log-sum-exp after the
/// ring to lse (f32 [B, H, L]); attention_ring_grad that takes the rows'
/// statistics from it and delta from attention_ring_lse's output fwd_out,
/// so that it runs no forward ring (planc's plan-keep-attention pairs
/// them, on every backend).
void attention_ring_lse(Context *ctx, const Tensor *qkv, Tensor *out,
                        Tensor *lse, int64_t num_heads, int64_t num_kv_heads,
                        int64_t axis, float dropout = 0.0f,
                        int64_t dropout_uid = 0, int64_t batch_axes = 0,
                        int64_t microbatches = 0, int64_t mb_inner_axes = 0,
                        int64_t head_axes = 0, int64_t head_inner_axes = 0);
void attention_ring_grad_lse(Context *ctx, const Tensor *qkv,
                             const Tensor *dout, Tensor *dqkv,
                             const Tensor *fwd_out, const Tensor *lse,
                             int64_t num_heads, int64_t num_kv_heads,
                             int64_t axis, float dropout = 0.0f,
                             int64_t dropout_uid = 0, int64_t batch_axes = 0,
                             int64_t microbatches = 0,
                             int64_t mb_inner_axes = 0, int64_t head_axes = 0,
                             int64_t head_inner_axes = 0);
/// With dropout = p > 0 (attention(..., dropout = p)), each probability is
/// zeroed with probability p and the others scaled by 1 / (1 - p) before
/// they weight the values; the mask hashes (seed, step, dropout_uid, the
/// probability's index in the global [B, H, S, S] tensor) as dropout()'s
/// does, the batch rows placed by batch_axes, microbatches and
/// mb_inner_axes (dropout's d0_axes, microbatches, mb_inner_axes) and the
/// heads by head_axes and, within those, head_inner_axes (context
/// parallelism's head split; axis masks). The backward draws the same
/// mask, as do the context-parallel attentions above, on the global
/// positions.
void attention(Context *ctx, const Tensor *qkv, Tensor *out, int64_t num_heads,
               int64_t num_kv_heads, float dropout = 0.0f,
               int64_t dropout_uid = 0, int64_t batch_axes = 0,
               int64_t microbatches = 0, int64_t mb_inner_axes = 0,
               int64_t head_axes = 0, int64_t head_inner_axes = 0);
/// Recomputes the probabilities; dqkv (shape of qkv) is overwritten.
void attention_grad(Context *ctx, const Tensor *qkv, const Tensor *dout,
                    Tensor *dqkv, int64_t num_heads, int64_t num_kv_heads,
                    float dropout = 0.0f, int64_t dropout_uid = 0,
                    int64_t batch_axes = 0, int64_t microbatches = 0,
                    int64_t mb_inner_axes = 0, int64_t head_axes = 0,
                    int64_t head_inner_axes = 0);
/// attention that also writes, where the cuda backend runs it on cuDNN,
/// each row's log-sum-exp to lse ([B, H, S] f32), for attention_grad_lse
/// (planc's plan-keep-attention, cuda target); elsewhere it is attention
/// and lse is not written.
void attention_lse(Context *ctx, const Tensor *qkv, Tensor *out, Tensor *lse,
                   int64_t num_heads, int64_t num_kv_heads,
                   float dropout = 0.0f, int64_t dropout_uid = 0,
                   int64_t batch_axes = 0, int64_t microbatches = 0,
                   int64_t mb_inner_axes = 0, int64_t head_axes = 0,
                   int64_t head_inner_axes = 0);
/// attention_grad that reads attention_lse's output fwd_out and lse where
/// the forward ran on cuDNN (cuDNN's backward then does not run the forward
/// again); elsewhere it is attention_grad, with its results.
void attention_grad_lse(Context *ctx, const Tensor *qkv, const Tensor *fwd_out,
                        const Tensor *lse, const Tensor *dout, Tensor *dqkv,
                        int64_t num_heads, int64_t num_kv_heads,
                        float dropout = 0.0f, int64_t dropout_uid = 0,
                        int64_t batch_axes = 0, int64_t microbatches = 0,
                        int64_t mb_inner_axes = 0, int64_t head_axes = 0,
                        int64_t head_inner_axes = 0);
/// attention that also keeps, for recompute = none, the exponentials e =
/// exp(scale q.k - m) of every query row [B, H, S, S] (keys after the query
/// are not written) and each row's (m, sum e) [B, H, S, 2];
/// attention_grad_kept reads them instead of recomputing them. The same
/// values as the recomputation: the results are the same bits.
void attention_keep(Context *ctx, const Tensor *qkv, Tensor *out, Tensor *keep,
                    Tensor *stats, int64_t num_heads, int64_t num_kv_heads,
                    float dropout = 0.0f, int64_t dropout_uid = 0,
                    int64_t batch_axes = 0, int64_t microbatches = 0,
                    int64_t mb_inner_axes = 0, int64_t head_axes = 0,
                    int64_t head_inner_axes = 0);
void attention_grad_kept(Context *ctx, const Tensor *qkv, const Tensor *keep,
                         const Tensor *stats, const Tensor *dout, Tensor *dqkv,
                         int64_t num_heads, int64_t num_kv_heads,
                         float dropout = 0.0f, int64_t dropout_uid = 0,
                         int64_t batch_axes = 0, int64_t microbatches = 0,
                         int64_t mb_inner_axes = 0, int64_t head_axes = 0,
                         int64_t head_inner_axes = 0);

/// out (rank 0) = scale * sum over rows of (logsumexp(logits[r]) -
/// logits[r, targets[r]]); targets I32 with the shape of logits minus its last
/// dim. A target outside [0, C) is a fatal error.
void cross_entropy(Context *ctx, const Tensor *logits, const Tensor *targets,
                   Tensor *out, float scale, int64_t valid_classes = 0);
/// dlogits = scale * (softmax(logits[r]) - onehot(targets[r])).
/// With valid_classes > 0 only classes [0, valid_classes) take part (the
/// rest is vocabulary padding: excluded from the softmax, zero gradient, and
/// a target there is an error); 0 means every class. The same holds for
/// ce_local_stats and ce_grad_from_stats, in global class indices.
void cross_entropy_grad(Context *ctx, const Tensor *logits,
                        const Tensor *targets, Tensor *dlogits, float scale,
                        int64_t valid_classes = 0);

/// cross_entropy and cross_entropy_grad of the same logits in one pass,
/// the gradient written over the logits (f32, bf16 or f16, read as their
/// fp32 values): out = scale * the loss, logits = grad_scale * (softmax -
/// onehot). The bits of the two ops on the widened logits, the gradient
/// rounded once to the logits' type. What plan-fuse-epilogues makes of the
/// LM head's loss on the cuda target; not for a classifier, whose accuracy
/// reads the logits (a fatal error).
void cross_entropy_in_place(Context *ctx, Tensor *logits, const Tensor *targets,
                            Tensor *out, float scale, float grad_scale,
                            int64_t valid_classes = 0);

/// Cross-entropy over a vocabulary split over a mesh axis, as local kernels
/// between collectives that the compiler inserts. logits [..., C] hold this
/// rank's C columns of the vocabulary (global columns [g*C, (g+1)*C) with g
/// this rank's coordinate on `vocab_axis`; vocab_axis -1: the whole
/// vocabulary, g = 0); targets as for cross_entropy, global ids. rowmax has
/// `rows` elements (any shape, e.g. [rows] or logits' shape without its last
/// dim); stats is [..., 2] with 2 * rows elements. The sequence
///   row_max(logits, m);            all_reduce_max(m, vocab axis mask);
///   ce_local_stats(logits, targets, m, st, axis);
///                                  all_reduce_sum(st, vocab axis mask);
///   ce_loss_from_stats(st, m, loss, scale);
///   ce_grad_from_stats(logits, targets, m, st, dlogits, scale, axis);
/// gives cross_entropy's loss and this rank's columns of
/// cross_entropy_grad's dlogits (the same arithmetic; bit for bit with one
/// rank and vocab_axis -1).
///
/// out[r] = max_j x[r, j] over the last dim (which must not be empty).
void row_max(Context *ctx, const Tensor *x, Tensor *out);
/// stats[r, 0] = sum_j exp(logits[r, j] - rowmax[r]); stats[r, 1] =
/// logits[r, t - g*C] if this rank owns target t = targets[r] (g*C <= t <
/// (g+1)*C), else 0. A target outside [0, G*C) is a fatal error.
void ce_local_stats(Context *ctx, const Tensor *logits, const Tensor *targets,
                    const Tensor *rowmax, Tensor *stats, int64_t vocab_axis,
                    int64_t valid_classes = 0);
/// out (rank 0) = scale * sum_r (rowmax[r] + log(stats[r, 0]) - stats[r, 1]).
void ce_loss_from_stats(Context *ctx, const Tensor *stats, const Tensor *rowmax,
                        Tensor *out, float scale);
/// dlogits[r, j] = scale * (exp(logits[r, j] - rowmax[r]) / stats[r, 0] -
/// [j == t - g*C]) with the one-hot term only for an owned target.
void ce_grad_from_stats(Context *ctx, const Tensor *logits,
                        const Tensor *targets, const Tensor *rowmax,
                        const Tensor *stats, Tensor *dlogits, float scale,
                        int64_t vocab_axis, int64_t valid_classes = 0);

/// acc (rank 0) += sum(g^2). Zero acc first (fill) and call it once per
/// gradient; all-reduce acc over the ranks that hold different shards. A
/// gradient whole over some of those axes (replicated_axes, an axis mask)
/// adds only on the rank whose coordinate is 0 on each of them.
void sumsq_accumulate(Context *ctx, const Tensor *g, Tensor *acc,
                      int64_t replicated_axes = 0);
/// g *= min(1, max_norm / (sqrt(sumsq) + 1e-6)); sumsq is a rank-0 tensor.
void clip_by_global_norm(Context *ctx, Tensor *g, const Tensor *sumsq,
                         float max_norm);

//===--- Convolutional networks (NCHW; lib/conv_impl.inc) -----------------===//

/// y = conv2d(x, w) without bias: x [N, C, H, W], w [O, C / groups, KH, KW],
/// y [N, O, HO, WO] with HO = (H + 2 padding_h - dilation_h (KH - 1) - 1) /
/// stride_h + 1 (likewise WO). Zero padding; cross-correlation like
/// PyTorch's Conv2d. Scratch: C*KH*KW*N*HO*WO + O*N*HO*WO floats.
void conv2d(Context *ctx, const Tensor *x, const Tensor *w, Tensor *y,
            int64_t dilation_h, int64_t dilation_w, int64_t groups,
            int64_t padding_h, int64_t padding_w, int64_t stride_h,
            int64_t stride_w);
/// dx and dw of conv2d from dy (dw sums over the batch).
void conv2d_grad(Context *ctx, const Tensor *x, const Tensor *w,
                 const Tensor *dy, Tensor *dx, Tensor *dw, int64_t dilation_h,
                 int64_t dilation_w, int64_t groups, int64_t padding_h,
                 int64_t padding_w, int64_t stride_h, int64_t stride_w);
/// Max ("max") or average ("avg", dividing by KH*KW, padding included)
/// pooling; y [N, C, HO, WO], HO = (H + 2 padding_h - KH) / stride_h + 1.
void pool2d(Context *ctx, const Tensor *x, Tensor *y, int64_t kernel_h,
            int64_t kernel_w, const char *kind, int64_t padding_h,
            int64_t padding_w, int64_t stride_h, int64_t stride_w);
/// dx of pool2d; a max window's gradient goes to its first maximum.
void pool2d_grad(Context *ctx, const Tensor *x, const Tensor *dy, Tensor *dx,
                 int64_t kernel_h, int64_t kernel_w, const char *kind,
                 int64_t padding_h, int64_t padding_w, int64_t stride_h,
                 int64_t stride_w);
/// out[n, c, ...] = x[n, c, ...] + bias[c].
void channel_bias_add(Context *ctx, const Tensor *x, const Tensor *bias,
                      Tensor *out);
/// db[c] = sum of dy[n, c, ...] over everything but c.
void channel_bias_grad(Context *ctx, const Tensor *dy, Tensor *db);

//===--- Mixture of experts (lib/moe_impl.inc) ----------------------------===//
//
// Tokens are the leading dimensions ([T..., *] viewed as [T, *]); the
// experts' weights are whole: up and gate [E, d, h], down [E, h, d'].

/// out [T, K] (i32): each token's top_k experts by logit (logits [T, E]),
/// largest first, equal logits to the lower index. With a `capacity` (0:
/// none), out is [..., S, K] and each sequence of S tokens gives an expert
/// at most that many choices, in token order; the others are written
/// -(e + 1) (dropped: their output is zero).
void moe_topk(Context *ctx, const Tensor *logits, Tensor *out, int64_t capacity,
              int64_t top_k);
/// moe_topk choosing by softmax probability plus bias[e] (f32 [E]).
void moe_topk_biased(Context *ctx, const Tensor *logits, const Tensor *bias,
                     Tensor *out, int64_t capacity, int64_t top_k);
/// out (logits' shape): d logits of the per-sequence load-balancing loss
/// coefficient / sequences * sum over this rank's sequences of E sum_e
/// f[e] P[e] (f: the sequence's share of choices per expert, P: its mean
/// probability per expert).
void moe_aux_grad(Context *ctx, const Tensor *logits, const Tensor *experts,
                  Tensor *out, double coefficient, int64_t sequences);
/// out [E] (f32): choices per expert (dropped ones too).
void moe_load(Context *ctx, const Tensor *experts, Tensor *out);
/// bias[e] += rate * sign(mean(load) - load[e]), in place.
void moe_bias_update(Context *ctx, Tensor *bias, const Tensor *load,
                     float rate);
/// out [T, K] (f32): the softmax of the chosen experts' logits.
void moe_gates(Context *ctx, const Tensor *logits, const Tensor *experts,
               Tensor *out);
/// out [T, E]: d logits of moe_gates from its gradient `grad` [T, K].
void moe_gates_grad(Context *ctx, const Tensor *logits, const Tensor *experts,
                    const Tensor *grad, Tensor *out);
/// out [T, d'] = sum_k gates[t, k] f_e(x[t]), e = experts[t, k]: the rows
/// grouped by expert in token order, one GEMM per expert and weight;
/// f_e(x) = gelu(x up[e]) down[e] (tanh gelu), or with the swiglu variant
/// (silu(x gate[e]) * (x up[e])) down[e]. With `expert_axis` >= 0 the
/// weights are this rank's block of experts along that mesh axis, and only
/// the choices of those experts are summed (the rest: other ranks' parts).
void moe_experts(Context *ctx, const Tensor *x, const Tensor *experts,
                 const Tensor *gates, const Tensor *up, const Tensor *down,
                 Tensor *out, int64_t expert_axis);
void moe_experts_swiglu(Context *ctx, const Tensor *x, const Tensor *experts,
                        const Tensor *gates, const Tensor *gate,
                        const Tensor *up, const Tensor *down, Tensor *out,
                        int64_t expert_axis);
/// The gradients of moe_experts from `grad` [T, d'] (the hidden activations
/// recomputed): dx, dgates and the weights' (summed over this rank's rows).
void moe_experts_grad(Context *ctx, const Tensor *x, const Tensor *experts,
                      const Tensor *gates, const Tensor *grad, const Tensor *up,
                      const Tensor *down, Tensor *dx, Tensor *dgates,
                      Tensor *dup, Tensor *ddown, int64_t expert_axis);
/// recompute = none: the forward keeps its grouping and activations in
/// `kept` (f32, workspace.h moe_kept_floats), which the backward reads
/// (and overwrites) instead of recomputing the forward.
void moe_experts_keep(Context *ctx, const Tensor *x, const Tensor *experts,
                      const Tensor *gates, const Tensor *up, const Tensor *down,
                      Tensor *out, Tensor *kept, int64_t expert_axis);
void moe_experts_swiglu_keep(Context *ctx, const Tensor *x,
                             const Tensor *experts, const Tensor *gates,
                             const Tensor *gate, const Tensor *up,
                             const Tensor *down, Tensor *out, Tensor *kept,
                             int64_t expert_axis);
void moe_experts_grad_kept(Context *ctx, const Tensor *experts,
                           const Tensor *gates, const Tensor *grad,
                           const Tensor *up, const Tensor *down, Tensor *kept,
                           Tensor *dx, Tensor *dgates, Tensor *dup,
                           Tensor *ddown, int64_t expert_axis);
void moe_experts_swiglu_grad_kept(Context *ctx, const Tensor *experts,
                                  const Tensor *gates, const Tensor *grad,
                                  const Tensor *gate, const Tensor *up,
                                  const Tensor *down, Tensor *kept, Tensor *dx,
                                  Tensor *dgates, Tensor *dgate, Tensor *dup,
                                  Tensor *ddown, int64_t expert_axis);
void moe_experts_swiglu_grad(Context *ctx, const Tensor *x,
                             const Tensor *experts, const Tensor *gates,
                             const Tensor *grad, const Tensor *gate,
                             const Tensor *up, const Tensor *down, Tensor *dx,
                             Tensor *dgates, Tensor *dgate, Tensor *dup,
                             Tensor *ddown, int64_t expert_axis);
/// Batch norm in training mode over x [N, C, ...]: per channel, the mean
/// and biased variance over N and the rest, summed over the ranks of the
/// mesh axes in `batch_axes` (an axis mask; 0: this rank's batch is the
/// whole batch), so the statistics are the global batch's.
void batch_norm(Context *ctx, const Tensor *x, const Tensor *gamma,
                const Tensor *beta, Tensor *out, int64_t batch_axes, float eps);
/// dx, dgamma, dbeta of batch_norm (dgamma and dbeta whole over the group).
void batch_norm_grad(Context *ctx, const Tensor *x, const Tensor *gamma,
                     const Tensor *dy, Tensor *dx, Tensor *dgamma,
                     Tensor *dbeta, int64_t batch_axes, float eps);
/// Batch norm for evaluation: out = gamma[c] (x - running_mean[c]) /
/// sqrt(running_var[c] + eps) + beta[c]; no statistic crosses samples.
void batch_norm_infer(Context *ctx, const Tensor *x, const Tensor *gamma,
                      const Tensor *beta, const Tensor *running_mean,
                      const Tensor *running_var, Tensor *out, float eps);
/// sum[c] and sum_sq[c]: x [N, C, ...] and its squares summed over N and the
/// rest (this rank's rows; the program all-reduces them like gradients).
void batch_norm_moments(Context *ctx, const Tensor *x, Tensor *sum,
                        Tensor *sum_sq);
/// Batch norm's running statistics after a step (PyTorch's rule), in place,
/// from the whole batch's sums over `count` values per channel: with mean =
/// sum / count and the unbiased var = (sum_sq - sum * mean) / (count - 1),
/// running_mean = (1 - momentum) running_mean + momentum mean, likewise
/// running_var with var. count >= 2, momentum in [0, 1].
void running_stats_update(Context *ctx, Tensor *running_mean,
                          Tensor *running_var, const Tensor *sum,
                          const Tensor *sum_sq, int64_t count, float momentum);
/// Group norm over x [N, C, ...]: per sample, the C channels in `groups`
/// consecutive groups, each normalized with its mean and biased variance,
/// then out = gamma[c] xhat + beta[c].
void group_norm(Context *ctx, const Tensor *x, const Tensor *gamma,
                const Tensor *beta, Tensor *out, float eps, int64_t groups);
/// dx, dgamma, dbeta of group_norm (dgamma, dbeta: this rank's samples).
void group_norm_grad(Context *ctx, const Tensor *x, const Tensor *gamma,
                     const Tensor *dy, Tensor *dx, Tensor *dgamma,
                     Tensor *dbeta, float eps, int64_t groups);
/// Inverted dropout: out = x / (1 - p) where the element is kept, else 0.
/// An element is kept when hash(seed, step, uid, its index in the global
/// tensor) >= p * 2^32, so every plan draws the same mask. The global index
/// comes from this rank's coordinates: dimension d is split over the mesh
/// axes of mask d{d}_axes (in mesh order) and, for d = 0 when
/// `microbatches` > 0, into that many microbatches (blocks of this rank's
/// rows; the current one from set_microbatch or unit_begin), the axes of
/// `mb_inner_axes` (a subset of d0_axes) splitting each microbatch.
void dropout(Context *ctx, const Tensor *x, Tensor *out, int64_t d0_axes,
             int64_t d1_axes, int64_t d2_axes, int64_t d3_axes,
             int64_t mb_inner_axes, int64_t microbatches, float p, int64_t uid);
/// Records sqrt(sumsq) (rank-0 tensor, already reduced) for the step line,
/// which then reads "step S/N | loss L | grad norm G | T ms".
///
/// The full step line (rank 0, one per step) is
///   step S/N | loss L[ | grad norm G] | T ms[ | lr R[ | K tok/s]]
/// "grad norm" appears when report_grad_norm was called in the step. When the
/// program has an I32 input, "| lr R | K tok/s" is appended: R is the
/// scheduled lr of the step's first sgd_update/adamw_update call, K the
/// tokens of the global batch (global rows x the other dims of the first I32
/// input) per second of step wall time. Without I32 inputs, "| lr R" is
/// appended only when set_lr_schedule was called. planrt::run appends
/// " | MFU x%" when a device peak is known (set_step_flops) and, when stdout
/// is a terminal, prints a progress line rewritten in place instead.
void report_grad_norm(Context *ctx, const Tensor *sumsq);

/// Offers tensor `t` under `name` for checking against a reference
/// implementation. A no-op unless the program runs with --dump-step0 PATH;
/// then, during step 1 only, rank 0 copies t's current contents to host
/// memory (device -> host on the cuda backend), and after step 1 it writes
/// every tensor observed in that step to PATH as safetensors: F32, shaped
/// like the local tensor, in the order first observed (a name observed twice
/// keeps the later contents). t must be F32. planc emits
///   observe(ctx, logits, "logits")           right after the loss op: the
///       loss's prediction, i.e. rank 0's rows of the global batch when the
///       batch is split over ranks;
///   observe(ctx, grad, "grad/<param name>")  for every parameter gradient
///       once it is whole (after its data-parallel all-reduce) and before
///       clipping: the gradient of the global mean loss.
/// With a pipeline (declare_pipeline) the ranks with coordinate 0 on every
/// other axis record too (each stage's owner), and after step 1 they send
/// their tensors to rank 0, which writes its own then theirs in pipeline
/// order (a name recorded on several of them keeps the later coordinate's).
void observe(Context *ctx, const Tensor *t, const char *name);

//===--- Pipeline parallelism ---------------------------------------------===//
//
// Mesh axis `axis` (declare_pipeline) carries a pipeline of S stages, S a
// multiple of its size P: the rank with coordinate c on it owns the stages s
// with s % P == c (P < S: interleaved, several stages per rank). The step
// runs this rank's schedule, a list of units (unit_begin .. unit_end): the
// forward (phase 0) or a backward phase of one stage for one microbatch.
// Activations travel between stages with send/recv; values a unit computes
// for a later unit of the same rank live in the stash. Without
// declare_pipeline every rank owns every stage.

/// Declares the pipeline: mesh axis `axis` (index of a declared axis, size
/// P) carries it and the model is cut into `stages` stages (a positive
/// multiple of P; fatal otherwise); this rank, with coordinate c on the
/// axis, owns the stages s with s % P == c. Call it once from plan_setup,
/// after the mesh axes and before set_param_stage / set_state_stage /
/// expect_pipeline_bytes / schedule_add (fatal if called twice or after the
/// program started).
void declare_pipeline(Context *ctx, int64_t axis, int64_t stages);
/// Parameter `param_index` (declare_param order) belongs to `stage` (-1, the
/// default: every pipeline rank holds it; fatal outside [-1, stages) or
/// without declare_pipeline). On a rank that does not own the stage it is
/// not allocated nor initialized (param() returns nullptr there) and it is
/// not counted in the memory check. --save / --save-every / --save-init
/// still write every parameter whole: the first rank (in world order) that
/// owns the stage and has coordinate 0 on the other axes that do not split
/// the parameter gathers it (as without a pipeline) and sends it to rank 0,
/// so the file has the same bytes a single-rank run writes. Initialization
/// depends only on (seed, name, global index), as for every parameter.
/// Call it from plan_setup.
void set_param_stage(Context *ctx, int64_t param_index, int64_t stage);
/// The same for optimizer-state tensor `state_index` (declare_state order):
/// on a rank that does not own the stage it is not allocated (state()
/// returns nullptr) nor counted in the memory check.
void set_state_stage(Context *ctx, int64_t state_index, int64_t stage);
/// 1 if this rank owns `stage`, else 0; 1 for stage -1 and when no pipeline
/// is declared. Fatal for a stage >= the number of stages.
int64_t owns_stage(Context *ctx, int64_t stage);
/// This rank's coordinate on mesh axis `axis` (fatal if not declared).
int64_t mesh_coord(Context *ctx, int64_t axis);
/// expect_bytes for the ranks whose pipeline coordinate is `coord`: with a
/// pipeline, plan_setup calls it once per coordinate, 0 to P - 1 in order
/// (fatal otherwise), instead of expect_bytes; each rank takes the call with
/// its own coordinate as its expect_bytes (the memory line shows rank 0's,
/// and every rank checks its own; see expect_bytes).
void expect_pipeline_bytes(Context *ctx, int64_t coord, int64_t params,
                           int64_t grads, int64_t state);

/// Point to point. `peer` is a coordinate on mesh axis `axis`; the other
/// rank is the one with that coordinate and every other coordinate equal to
/// this rank's (peer == this rank's coordinate: a message to itself, kept in
/// a local queue). send copies t into a send buffer and returns at once:
/// t may be reused immediately. Outstanding sends complete in the background
/// (tested on every later send, recv, unit_begin and unit_end) and are
/// waited for at the end of the step. recv blocks until the next message
/// from the peer on that axis arrives and writes it into `out`: messages
/// between two ranks arrive in the order they were sent (host: one MPI
/// communicator, the dtype as tag; cuda: a header over MPI, then NCCL on a
/// communicator and stream of their own per direction between two
/// coordinates of the pipeline axis, so two ranks that both send and then
/// receive do not deadlock; on other axes the transfer is in NCCL's order
/// on the axis communicator). Tensors are F32 or I32. Fatal: a message
/// whose element count differs from out's (naming both counts, the peer and
/// the axis) or whose dtype differs; a peer outside the axis; a recv from
/// itself with nothing sent to itself.
void send(Context *ctx, const Tensor *t, int64_t axis, int64_t peer);
void recv(Context *ctx, Tensor *out, int64_t axis, int64_t peer);

/// The stash: values one unit computes for a microbatch and later units of
/// the same rank read (a stage's activations from its forward until its
/// backward). alloc_stash returns a tensor (contents undefined; the header
/// is arena scratch, valid until the unit ends) whose memory is heap
/// (device) memory that outlives the unit. stash_put records t as value
/// `slot` of microbatch `mb`, to be read by `readers` (>= 1) later units: t
/// is an alloc_stash tensor, a view/subview/rows of one, or persistent
/// memory such as a parameter (arena scratch is fatal: the unit gives it
/// back); only the header is copied, so t's header may be arena scratch.
/// Putting a (slot, mb) again before all its readers released it is fatal.
/// stash_get returns a copy of the recorded header (valid until the unit,
/// or outside units the step, ends; fatal naming slot and mb if nothing is
/// recorded). Each reader calls stash_release once; after the last release
/// the entry is gone. An alloc_stash allocation is freed as soon as no
/// stash entry points into it (reference counts per allocation: the one
/// containing t->data) and the unit that allocated it has ended; one
/// allocated outside any unit, at the end of the step. At the end of the
/// step the stash must be empty (fatal naming the slots and microbatches
/// left); what is left of the stash memory is then freed.
Tensor *alloc_stash(Context *ctx, int64_t ndim, int64_t d0, int64_t d1,
                    int64_t d2, int64_t d3, int64_t dtype = F32);
void stash_put(Context *ctx, Tensor *t, int64_t slot, int64_t mb,
               int64_t readers);
Tensor *stash_get(Context *ctx, int64_t slot, int64_t mb);
void stash_release(Context *ctx, int64_t slot, int64_t mb);

/// The schedule: plan_setup calls schedule_add(coord, unit, mb) for each
/// entry of the order of pipeline rank `coord` (0 <= coord < P, fatal
/// otherwise or without declare_pipeline); every rank records all of them
/// and uses its own coordinate's. In the step, schedule_length() is the
/// number of this rank's entries and schedule_unit(i) / schedule_mb(i) the
/// i-th one's values (0 <= i < length, fatal otherwise). `unit` is the
/// compiler's own number (the runtime does not interpret it).
void schedule_add(Context *ctx, int64_t coord, int64_t unit, int64_t mb);
/// schedule_add for each (coord, unit, mb) triple of `table`, in order
/// (`entries` triples; fatal if entries < 0 or the table is null with
/// entries > 0). Generated programs pass their schedule as one static table:
/// a large pipeline has tens of thousands of entries.
void schedule_table(Context *ctx, const int64_t *table, int64_t entries);
int64_t schedule_length(Context *ctx);
int64_t schedule_unit(Context *ctx, int64_t i);
int64_t schedule_mb(Context *ctx, int64_t i);

/// Brackets one unit of the schedule: `phase` 0 = forward, 1 = backward
/// (input gradient, with the weight gradient unless split), 2 = weight
/// gradient, of `stage` (owned by this rank, fatal otherwise) for
/// microbatch `mb` (>= 0). Units do not nest (fatal). Scratch (alloc, view,
/// stash_get, ...) taken inside is given back at unit_end (an arena_mark at
/// unit_begin, released at unit_end). The runtime counts the microbatches in
/// flight per stage: +1 when a forward unit begins (fatal if that
/// microbatch is already in flight on the stage), -1 when a unit with
/// last = 1 (the stage's last backward phase for that microbatch, fatal if
/// its forward did not begin) ends, and keeps the peak per stage over the
/// run. A unit still open or a microbatch still in flight at the end of the
/// step is fatal. When a pipeline is declared, at the end of planrt::run
/// rank 0 prints, before the memory line and the "done" line, one line
///   pipeline: peak microbatches in flight per stage: 4 3 2 1; stash peak S B
/// (stage 0 first; each value from the ranks owning the stage, the maximum
/// over the data-parallel replicas; forward units run by --generate do not
/// count; S: the most alloc_stash bytes one rank held at once).
void unit_begin(Context *ctx, int64_t stage, int64_t phase, int64_t mb,
                int64_t last);
void unit_end(Context *ctx);

//===--- Entry point: called from the generated main() --------------------===//

/// Initializes MPI (and CUDA/NCCL on the cuda backend), calls `setup` to
/// record the program description, checks that the MPI world size equals the
/// product of the mesh axes (otherwise every rank prints an error naming both
/// sizes and how to launch, and run returns 1 without any collective), creates
/// and initializes parameters (only those of the stages this rank owns, see
/// set_param_stage), then runs `steps` training steps calling `step`
/// and printing one line per step on rank 0; at the end rank 0 prints the
/// "pipeline:" line if declare_pipeline was called (see unit_begin), the
/// "memory per rank" line if expect_bytes was called (a mismatch fails the
/// run, see expect_bytes) and then "done: N steps, final loss L". Command-line
/// options of the generated program are parsed here (see --help):
///   --steps N          run N steps instead of the compiled number
///   --save PATH        after the last step, write all parameters (gathered
///                      to rank 0) to PATH as safetensors
///   --save-every N     also every N steps, to PATH with -stepNNNNNN before
///                      its extension
///   --save-init PATH   the same before step 1: the initial parameters
///                      (saved tensors are whole: sharded and segmented
///                      parameters are gathered from the ranks that hold
///                      distinct blocks)
///   --dump-step0 PATH  write the tensors observed in step 1 (see observe)
///   --resume [DIR], --checkpoint-dir DIR, --checkpoint-every N, --keep N,
///   --init-from FILE   checkpoints and initial weights (docs/checkpoints.md)
///   --log-json PATH    one JSON object per step and a summary (rank 0)
///   --trace PATH       a Chrome trace per rank (PATH with .rankR)
///   --peak-flops F     device peak FLOP/s for the MFU (set_step_flops)
///   --progress auto|always|never   the in-place line on a terminal
///   --timeout S        the watchdog (default 300 s, 0 = none): a rank that
///                      waits more than S seconds for others (a collective,
///                      a recv, collective_wait) prints one line naming
///                      itself, the step, what it waited for over which
///                      group, and the members that did not arrive, and
///                      aborts the job (exit code 3)
///   --quiet, --help
/// (docs/runtime.md describes them, the files and the exit codes).
/// After every step, a NaN or Inf loss (report_loss) or gradient norm
/// (report_grad_norm) on any rank stops the run: the lowest such rank prints
/// "planrt: error: step S: the loss is inf on rank R: training diverged; ..."
/// and every rank exits with code 1 (one small all-reduce per step).
int run(int argc, char **argv, const char *program_name,
        void (*setup)(Context *), void (*step)(Context *));

} // namespace planrt

#endif // PLANRT_PLANRT_H
