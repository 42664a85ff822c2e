//===- context.h - The runtime Context and the backend interface ----------===//
//
// Private to the runtime libraries. Common code (driver, program description,
// init, data, safetensors) lives in lib/*.cpp and is compiled into both
// libraries; each backend implements the functions of `planrt::backend` and
// the ops of planrt.h (via lib/ops_impl.inc).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CONTEXT_H
#define PLANRT_LIB_CONTEXT_H

#include "planrt/best_fit.h"
#include "planrt/internal.h"
#include "planrt/planrt.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

namespace planrt {

struct ParamDesc {
  std::string name;
  int64_t export_rows = 0; // 0: all rows (set_param_export_rows)
  int64_t init_kind = InitZeros;
  float a = 0.0f, b = 0.0f;
  // Mesh axes splitting each dim, outermost first (shard_param): the block
  // index along the dim is mixed-radix over these axes' coordinates.
  std::vector<int64_t> shard_axes[4];
  // Global sizes of the segments of each dim (set_param_segments); empty =
  // one segment, the whole dim. Each segment is split over shard_axes[d].
  std::vector<int64_t> segments[4];
  int64_t stage = -1; // pipeline stage (set_param_stage); -1: every rank
  Tensor t; // the parameter (device memory once started; null if unowned)
  // A 16-bit copy kept beside it (set_param_copy; dtype F32: none): the
  // optimizer update writes both, planrt's other writes mark it stale.
  Tensor copy;
};

namespace internal {
/// Fatal unless the shard axes and segments of `p` (a parameter's or a state
/// tensor's layout; `what` names the kind in the message) are consistent.
void validate_layout(Context *ctx, const ParamDesc &p, const char *what);

/// The memory plan's arena (memory_plan.cpp): allocated by start() for this
/// rank's pipeline coordinate, freed with the context.
void allocate_plan_arena(Context *ctx);
void free_plan_arena(Context *ctx);
/// Rounds every kept 16-bit copy (set_param_copy) of this rank's parameters
/// from its parameter again, and clears copies_stale.
void refresh_param_copies(Context *ctx);
/// An op's temporaries inside a planned function: from the workspace the
/// plan gave the op (fatal beyond it).
void *take_workspace(Context *ctx, size_t bytes);
/// An op that has nothing to do on this rank (a replica's term of a sum
/// counted on another rank) leaves the workspace the plan gave it unused.
void forgo_workspace(Context *ctx);
} // namespace internal

/// A persistent optimizer-state tensor (declare_state).
struct StateDesc {
  std::string name;
  int64_t stage = -1; // pipeline stage (set_state_stage); -1: every rank
  // Layout in the global tensor (shard_state, set_state_segments), as for
  // parameters; checkpoints use it to write and read shards.
  std::vector<int64_t> shard_axes[4];
  std::vector<int64_t> segments[4];
  Tensor t; // zeroed at start (null data if the stage is unowned)
  // Model state (set_state_buffer): initialized like a parameter and
  // exported with the parameters.
  bool buffer = false;
  int64_t init_kind = 0;
  float a = 0.0f, b = 0.0f;
};

struct InputDesc {
  std::string name;
  int64_t role = RoleInput;
  int64_t batch_axis = -1;
  // Expert parallelism: the batch is split over batch_axis and, within each
  // of its blocks, over this axis too (set_input_inner_axis); the rank's
  // rows are `chunks` runs (microbatches), each split so.
  int64_t inner_axis = -1;
  int64_t chunks = 1;
  int64_t seq_axis = -1;      // context parallelism: dimension 1's axis
  Tensor t;                   // device buffer, refilled every step
  std::vector<float> staging; // host staging buffer
};

/// A tensor recorded by observe() (host copy).
struct ObservedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct ArenaChunk {
  char *base = nullptr;
  size_t size = 0;
};

/// The state of --trace (lib/trace.cpp) and of the step report: progress
/// line, --log-json, MFU (lib/progress.cpp); deleted with the Context.
namespace trace {
struct Trace;
struct TraceDeleter {
  void operator()(Trace *t) const;
};
} // namespace trace
struct Progress;
struct ProgressDeleter {
  void operator()(Progress *p) const;
};

struct Context {
  std::string program;
  std::vector<std::string> axis_names;
  std::vector<int64_t> axis_sizes;
  std::deque<ParamDesc> params;
  std::deque<StateDesc> states;
  // Parameters' 16-bit copies no longer equal their parameters (start,
  // --resume, --init-from wrote those): param_copy rounds them again.
  bool copies_stale = false;
  // The names declared so far: a duplicate is found without a walk over
  // every earlier declaration (a 10000-layer GPT declares 120k parameters).
  std::unordered_set<std::string> param_names, state_names;
  std::deque<InputDesc> inputs;
  int64_t steps = 1, seed = 0, global_batch = 0, data_kind = 0;
  std::string data_path; // set_data_path (data_kind 1)
  bool data_path_set = false;
  internal::TokenShards tokens; // data_kind 1, opened before start
  bool tokens_open = false;
  std::vector<int32_t> token_inputs, token_labels; // host staging

  // Learning-rate schedule (set_lr_schedule).
  bool lr_schedule_set = false;
  int64_t lr_kind = LrConstant, lr_warmup = 0, lr_decay = 0;
  float lr_min = 0.0f;
  int64_t run_steps = 0; // steps of the current run (default decay_steps)
  float last_lr = 0.0f;  // scheduled lr of the step's first update
  bool lr_reported = false;

  bool use_mpi = false;
  int rank = 0, world = 1;
  std::vector<int64_t> coords; // this rank's coordinate on every mesh axis
  bool started = false;

  int64_t step = 0; // current step number, from 1
  float last_loss = 0.0f;
  bool loss_reported = false;
  float last_grad_norm = 0.0f; // from report_grad_norm
  // Dynamic loss scaling (planrt.h): the scale, clean steps in a row, steps
  // skipped so far, and whether every rank skips this step's updates.
  // `unscaled_sum` (device memory, from start) accumulates the sums of the
  // step's unscaled gradients: not finite after an overflow. It is read
  // once per step, by loss_scale_check, not once per gradient.
  bool dynamic_loss_scale = false;
  float loss_scale = 65536.0f;
  int64_t loss_scale_clean = 0;
  int64_t loss_scale_skipped = 0;
  bool skip_step = false;
  float *unscaled_sum = nullptr;
  bool grad_norm_reported = false;

  void (*forward)(Context *) = nullptr; // set_forward
  int64_t generation_classes = 0; // 0: every logit (set_generation_classes)
  int64_t token_vocab = 0;        // 0: unknown (set_token_vocab)

  // --dump-step0: observe() records on rank 0 during step 1.
  // Generation: observe() copies the tensor named `capture` here.
  std::string capture;
  std::vector<float> captured;
  std::vector<int64_t> captured_shape;
  int64_t save_every = 0; // --save-every (with save_path)
  std::string save_path;
  bool save_bf16 = false; // --save-dtype bf16 (parameters exported rounded)
  std::string dump_step0_path;
  std::vector<ObservedTensor> observed;

  // Scratch arena: chunks of device memory; consolidated into one chunk at
  // the next reset when a step needed more than one.
  std::vector<ArenaChunk> chunks;
  size_t chunk_offset = 0; // used bytes of chunks.back()
  std::deque<Tensor> scratch;
  struct ArenaMark {
    size_t chunks, offset, scratch, used;
  };
  std::vector<ArenaMark> marks; // arena_mark / arena_release
  size_t arena_capacity = 0;    // the most chunk bytes ever held at once
  size_t arena_used = 0;        // bytes handed out by the arena in this step
  size_t arena_peak = 0;        // the most of any step

  // The compiler's memory plan (plan_arena): one arena at plan_base for
  // the planned functions; what each may reach on this rank and what it
  // reached; the live buffers by offset; live bytes and their peaks by kind
  // (activations, gradients, workspace) over training steps.
  std::vector<std::array<int64_t, 4>> plan_entries; // fn, coord, bytes, buffers
  std::vector<std::array<int64_t, 2>> stash_entries; // coord, bytes
  char *plan_base = nullptr;
  size_t plan_capacity = 0;
  struct PlannedFn {
    int64_t bytes = -1, buffer_bytes = 0, high_water = 0, runs = 0;
  };
  PlannedFn planned_fns[2];
  int64_t plan_fn = -1; // the planned function running, -1: none
  struct LiveBuffer {
    int64_t bytes;
    int kind;
  };
  std::map<int64_t, LiveBuffer> live;
  int64_t live_bytes[3] = {0, 0, 0}, live_peak[3] = {0, 0, 0};
  int64_t live_total = 0, live_total_peak = 0;
  // The workspace of the op being called (workspace()): offset (-1: none),
  // bytes given, bytes taken.
  int64_t ws_offset = -1, ws_bytes = 0, ws_used = 0;
  bool poison = false; // PLANRT_POISON=1: released bytes become NaN

  // Memory accounting (expect_bytes): what the runtime allocated for
  // parameters and declared state, and what the compiler computed.
  int64_t param_bytes = 0, state_bytes = 0, input_bytes = 0;
  bool expected_set = false;
  int64_t expected_params = 0, expected_grads = 0, expected_state = 0;

  // Non-blocking collectives started and not yet waited for: slot -> what
  // was started (for error messages).
  std::map<int64_t, std::string> pending;

  // Pipeline parallelism (declare_pipeline; lib/pipeline.cpp).
  int64_t pipeline_axis = -1; // -1: no pipeline
  int64_t pipeline_stages = 0;
  // expect_pipeline_bytes, by pipeline coordinate: params, grads, state.
  std::vector<std::array<int64_t, 3>> pipeline_expected;
  // The schedule of every pipeline coordinate: (unit, mb) pairs.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> schedules;
  // The unit in progress (unit_begin .. unit_end).
  bool unit_open = false;
  int64_t unit_stage = 0, unit_phase = 0, unit_mb = 0, unit_last = 0;
  int64_t loop_mb = 0;     // set_microbatch: the microbatch loop's iteration
  int64_t unit_mark = 0;   // arena mark taken at unit_begin
  int64_t unit_serial = 0; // counts units; the open one's number
  // Microbatches in flight per stage (F begun, last backward not ended) and
  // the peak of their number over the run.
  std::map<int64_t, std::set<int64_t>> in_flight;
  std::map<int64_t, int64_t> in_flight_peak;
  // The stash: (slot, mb) -> entry; alloc_stash allocations by base address.
  struct StashEntry {
    Tensor t;
    int64_t readers = 0;   // releases still expected
    char *alloc = nullptr; // the alloc_stash allocation holding t (or null)
  };
  std::map<std::pair<int64_t, int64_t>, StashEntry> stash;
  struct StashAlloc {
    size_t bytes = 0;      // the tensor's (what `stash peak` counts)
    size_t pool_bytes = 0; // taken from the stash pool (rounded), or 0
    int64_t refs = 0;      // stash entries that point into it
    int64_t unit = -1;     // serial of the unit that allocated it while it is
                           // open; -1 once that unit ended
    bool outside_unit = false; // allocated outside any unit: freed at the
                               // end of the step
  };
  std::map<char *, StashAlloc> stash_allocs;
  int64_t stash_live_bytes = 0, stash_peak_bytes = 0;
  // The stash pool of the memory plan (plan_stash): alloc_stash takes its
  // bytes from one allocation with the allocator the compiler simulated
  // (planrt/best_fit.h); the highest byte the steps reached and the plan.
  char *stash_base = nullptr;
  int64_t stash_capacity = 0, stash_planned = -1, stash_high = 0;
  BestFit stash_pool;
  // Messages a rank sent to itself (peer == own coordinate), per axis.
  struct SelfMessage {
    void *data = nullptr;
    int64_t count = 0;
    int dtype = F32;
  };
  std::map<int64_t, std::deque<SelfMessage>> self_messages;
  void *p2p = nullptr; // MPI state of send/recv (lib/pipeline.cpp)

  std::vector<double> teacher; // [out][in] teacher matrix for data_kind 0
  int64_t teacher_in = 0, teacher_out = 0;
  int64_t classes = 0; // set_classes (data kinds 2 and 3)
  // data_kind 3: the CIFAR-10 files (sorted) and their record counts.
  std::vector<std::pair<std::string, int64_t>> cifar_files;
  int64_t cifar_records = 0;
  // The evaluation files (--eval-data), alike.
  std::vector<std::pair<std::string, int64_t>> cifar_eval_files;
  int64_t cifar_eval_records = 0;
  // Classification accuracy of the step (data_kind 2): rows whose argmax is
  // the target, and rows counted, on this rank; then over the world.
  double acc_correct = 0, acc_rows = 0;
  float last_accuracy = -1.0f; // < 0: not measured
  // --eval-every N (0: never) and --eval-batches K: the held-out batches
  // the forward function evaluates after every N-th step.
  int64_t eval_every = 0, eval_batches = 4;
  float last_eval_loss = 0.0f, last_eval_accuracy = -1.0f;
  std::string dump_eval_path; // --dump-eval (cleared once written)
  bool observe_eval = false;  // observe() records for --dump-eval

  void *backend = nullptr; // backend state

  // Checkpoints (lib/checkpoint_*.cpp): set_checkpoint and the options.
  std::string checkpoint_dir;   // "" = none
  int64_t checkpoint_every = 0; // 0: only on SIGTERM / SIGUSR1
  int64_t checkpoint_keep = 0;  // --keep N (0: keep every checkpoint)
  int64_t first_step = 1;       // a resumed run starts after its checkpoint
  // The last trained step and its loss, for the closing line and the
  // summary: a step of this run, or the checkpoint's when the run resumed at
  // its last step (generation and evaluation do not change them).
  int64_t final_step = 0;
  float final_loss = std::numeric_limits<float>::quiet_NaN();
  int stop_signal = 0; // the signal that stopped training (0: none)
  // Model FLOPs of one training step per rank (set_step_flops; 0: unknown)
  // and the GPU of the plan's cluster section (set_cluster_gpu).
  double step_flops = 0;
  std::string cluster_gpu;
  // The plan's precision (set_compute_precision): which peak the MFU uses.
  std::string compute_precision = "fp32";
  // Null unless --trace / the step report was set up (planrt::run).
  std::unique_ptr<trace::Trace, trace::TraceDeleter> trace;
  std::unique_ptr<Progress, ProgressDeleter> progress;

  // The watchdog (lib/watchdog.h): --timeout in seconds (0: none) and its
  // state (created by backend::init).
  double timeout_s = 300;
  void *watchdog = nullptr;
};

/// Prints "planrt: error: <message>" to stderr and aborts all ranks
/// (MPI_Abort(1), or exit(1) without MPI).
[[noreturn]] void fatal(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

std::string shape_str(const Tensor *t);
/// Bytes of t's elements (its dtype's width times its element count).
inline size_t tensor_bytes(const Tensor *t) {
  return (size_t)t->numel() * (size_t)dtype_bytes(t->dtype);
}
/// "f32", "i32", "bf16", "f16".
const char *dtype_name(int dtype);
/// Checks that `t` is a usable tensor argument of op `op`.
void check_tensor(const char *op, const char *what, const Tensor *t);
/// Scratch memory from the step arena (256-byte aligned).
void *arena_alloc(Context *ctx, size_t bytes);
/// Frees scratch tensors; consolidates the arena chunks into one.
void arena_reset(Context *ctx);
void arena_free_all(Context *ctx);
/// Generates this rank's rows of the data_kind 0 input/label for `step`.
void fill_synthetic(Context *ctx, int64_t step);
/// The input and label of a program with one of each (data kinds 0, 2, 3),
/// and this rank's rows of the global batch.
struct DataPair {
  InputDesc *x = nullptr, *y = nullptr;
  int64_t x_index = 0; // the input's index among ctx->inputs
  int64_t rows = 0;    // local rows
  int64_t global_rows = 0;
  // The local rows are `runs` runs of run_rows rows each, the k-th of them
  // starting at global row run_row0[k] (one run but with expert parallelism
  // and microbatches).
  int64_t run_rows = 0;
  std::vector<int64_t> run_row0;
  /// The global index of local row r.
  int64_t global(int64_t r) const {
    return run_row0[(size_t)(r / run_rows)] + r % run_rows;
  }
};
DataPair data_pair(Context *ctx);
/// Copies the staging buffers of `d` (filled for a step) to the device.
void upload_staging(Context *ctx, const DataPair &d);
/// Generates this rank's rows of the data_kind 2 images and classes.
/// `eval`: batch `step` of the held-out samples (another stream of the same
/// classes) instead of the training batch of that step.
void fill_synthetic_images(Context *ctx, int64_t step, bool eval = false);
/// Reads this rank's rows of the data_kind 1 input/label for `step` (fatal on
/// a read error: the files were checked before the run).
void fill_tokens(Context *ctx, int64_t step);
/// Scheduled lr for an optimizer update with base lr `base`; records the
/// first one of the step for the step line.
float step_lr(Context *ctx, float base);
/// Ranks in the group of `axis_mask`, and this rank's group color.
int64_t group_size(const Context *ctx, int64_t axis_mask);
int64_t group_color(const Context *ctx, int64_t axis_mask);
/// Checks the mask against the declared axes.
void check_axis_mask(const Context *ctx, const char *op, int64_t axis_mask);

/// Where a parameter's local elements sit in the whole tensor on the rank
/// with coordinates `coords`: global shape and, for every dim, the global
/// index of each local index (shard_param blocks, set_param_segments).
struct ParamLayout {
  int64_t global[4];
  std::vector<int64_t> index[4];
  /// Global row-major index of local row-major element `i`.
  int64_t global_flat(const int64_t *local, int64_t i) const {
    int64_t idx[4];
    for (int d = 3; d >= 0; --d) {
      idx[d] = i % local[d];
      i /= local[d];
    }
    int64_t g = 0;
    for (int d = 0; d < 4; ++d)
      g = g * global[d] + index[d][idx[d]];
    return g;
  }
};
ParamLayout param_layout(const Context *ctx, const ParamDesc &p,
                         const std::vector<int64_t> &coords);
/// Number of blocks dim `d` of `p` is split into (product of its axes).
int64_t param_dim_blocks(const Context *ctx, const ParamDesc &p, int d);
/// Bit mask of the mesh axes that split some dim of `p` (0 = replicated).
int64_t param_shard_mask(const ParamDesc &p);
/// A state tensor described as a parameter (its name, layout, stage, init
/// and tensor, sharing the data): what --save, --init-from and the start
/// need for model state (set_state_buffer).
ParamDesc state_as_param(const StateDesc &st);
/// What --save exports and --init-from loads: the parameters, then the
/// model state (batch norm's running statistics) described as parameters
/// (`keep` owns those descriptions, which share the state's tensors).
std::vector<ParamDesc *> model_tensors(Context *ctx,
                                       std::deque<ParamDesc> &keep);
/// Row-major coordinates of world rank `rank` on the declared axes.
std::vector<int64_t> rank_coords(const Context *ctx, int64_t rank);
/// The ranks the global batch of `in` is split over (its batch axis and
/// its inner axis), and the global index of the first row of this rank's
/// run `c` (of in.chunks runs of equal length).
int64_t batch_ranks(const Context *ctx, const InputDesc &in);
int64_t batch_run_row0(const Context *ctx, const InputDesc &in, int64_t c);

/// Non-blocking collective slots: the range check, and the check that none
/// is pending at a step boundary (`when` names the boundary).
constexpr int64_t kMaxCollectiveSlots = 1024;
void check_no_pending(Context *ctx, const char *when);

/// Reductions of the all-reduce collectives.
enum class ReduceOp { Sum, Max };

/// MPI helpers usable from .cu files (which do not include mpi.h).
void mpi_bcast_bytes(Context *ctx, void *data, size_t bytes, int root);
int mpi_local_rank(Context *ctx);

//===--- Pipeline helpers (lib/pipeline.cpp) ------------------------------===//

/// This rank's coordinate on the pipeline axis (0 without a pipeline).
int64_t pipeline_coord(const Context *ctx);
/// Pipeline coordinate owning `stage` (-1: every rank, returns -1).
int64_t stage_owner(const Context *ctx, int64_t stage);
/// World rank of the rank whose coordinates are this rank's with `axis` set
/// to `coord`.
int world_rank_with(const Context *ctx, int64_t axis, int64_t coord);
/// Called by start() after backend::init (collective): send/recv state.
void p2p_init(Context *ctx);
/// Frees it (waits for outstanding sends when MPI is still usable).
void p2p_finalize(Context *ctx);
/// Tests outstanding sends, frees the finished ones' buffers.
void p2p_progress(Context *ctx);
/// Sends `bytes` bytes (copied now) to world rank `dest` over the p2p
/// communicator with tag `tag`, asynchronously (host backend: the data;
/// cuda backend: a header).
void p2p_mpi_isend(Context *ctx, int dest, int tag, const void *data,
                   size_t bytes);
/// Blocks until a message from world rank `src` is available; returns its
/// size in bytes and its tag. p2p_mpi_recv then receives it.
void p2p_mpi_probe(Context *ctx, int src, size_t *bytes, int *tag);
void p2p_mpi_recv(Context *ctx, int src, int tag, void *data, size_t bytes);
/// The end of a step: waits for outstanding sends, checks that no unit is
/// open, no microbatch in flight and the stash empty (fatal otherwise, `when`
/// names the boundary); frees the stash allocations.
void pipeline_end_step(Context *ctx, const char *when);

namespace backend {
/// Called once after the world-size check: device selection, communicators.
void init(Context *ctx);
void finalize(Context *ctx);
void *alloc_bytes(Context *ctx, size_t bytes); // fatal on failure
void free_bytes(Context *ctx, void *p);
void zero_bytes(Context *ctx, void *p, size_t bytes);
void to_device(Context *ctx, void *dst, const void *src, size_t bytes);
void to_host(Context *ctx, void *dst, const void *src, size_t bytes);
void synchronize(Context *ctx);
const char *name();
/// Device bytes the backend's libraries hold outside the planned memory
/// (cuda: cuBLASLt's workspace, cuDNN attention's buffers); 0 on the host.
int64_t library_bytes(Context *ctx);
/// What the backend chose at run time that a user should know, as whole
/// lines (cuda: which attention ran the 16-bit plan and why, and which
/// GEMMs took their bias and GELU in the epilogue), or empty.
std::string library_note(Context *ctx);
/// acc (one f32) += sum(g^2), queued to run with the sums that follow it
/// (cuda: the gradient norm's 148 sums of GPT-2 as two launches); false if
/// the backend does not queue it (then the op runs it).
bool queue_sumsq(Context *ctx, const Tensor *g, Tensor *acc);
/// Device-to-device copy (ordered after the work issued so far).
void copy_bytes(Context *ctx, void *dst, const void *src, size_t bytes);
/// Point to point to the rank with coordinate `peer` on `axis` (world rank
/// `world_peer`), never this rank: send starts sending t (copied) and
/// returns; recv fills out with the next message from the peer after
/// checking it with check_p2p_message.
void p2p_send(Context *ctx, const Tensor *t, int64_t axis, int64_t peer,
              int world_peer);
void p2p_recv(Context *ctx, Tensor *out, int64_t axis, int64_t peer,
              int world_peer);
/// Waits for every send started (end of step).
void p2p_wait_all(Context *ctx);
} // namespace backend

/// Fatal unless a message of `count` elements of `dtype` fits recv's `out`.
void check_p2p_message(Context *ctx, const Tensor *out, int64_t axis,
                       int64_t peer, int64_t count, int dtype);

} // namespace planrt

#endif // PLANRT_LIB_CONTEXT_H
