//===- internal.h - Test and tooling hooks of the runtime -----------------===//
//
// Not used by generated programs. Lets tests build a Context without going
// through planrt::run (for example a standalone single-rank host Context
// without MPI), drive steps, and reach the deterministic generators.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_INTERNAL_H
#define PLANRT_INTERNAL_H

#include "planrt/planrt.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace planrt {
namespace internal {

/// Tokens of the global batch: global rows x the other dims of the first I32
/// input (0 if there is none).
/// The files matching a glob pattern, sorted by name (bytes, not the
/// locale); an error message ("" on success) names the pattern, the
/// directory it is relative to and `hint` when nothing matches.
std::string glob_files(const std::string &pattern,
                       std::vector<std::string> &paths, const char *hint);

/// Opens the data_kind 3 (CIFAR-10) files of set_data_path: checks each
/// file's size; "" or an error message naming the file.
std::string open_cifar(Context *ctx);
/// Checks the CIFAR-10 files matching `pattern` into `files` (path, records)
/// and their total `records`; "" or an error message (`hint` when nothing
/// matches).
std::string
open_cifar_files(const std::string &pattern,
                 std::vector<std::pair<std::string, int64_t>> &files,
                 int64_t &records, const char *hint);
/// Reads this rank's rows of `step` into the input and label (host staging,
/// then the device); fatal on a read error or an out-of-range class.
/// `eval`: batch `step` of the evaluation files (--eval-data) instead.
void fill_cifar(Context *ctx, int64_t step, bool eval = false);

/// Whether the program trains a classifier on images (data kinds 2, 3).
bool is_classifier(const Context *ctx);
/// The unit of the step line's rate: "tok/s", or "samples/s" for a
/// classifier of generated images.
const char *batch_unit(const Context *ctx);
int64_t global_batch_tokens(const Context *ctx);

/// s as a JSON string literal (quotes, escapes), for the files the runtime
/// writes (safetensors headers, checkpoint manifests, --log-json, --trace).
std::string json_quote(const std::string &s);

/// A fresh Context. With `use_mpi` false it is a standalone rank 0 of a
/// 1-rank world and never calls MPI; with `use_mpi` true MPI must already be
/// initialized and the Context spans MPI_COMM_WORLD.
Context *create_context(const char *program_name, bool use_mpi);
void destroy_context(Context *ctx);

/// Validates the description (declared with the planrt:: calls), checks the
/// world size (fatal on mismatch), initializes the backend and creates and
/// initializes parameters and input buffers. Also works with no inputs and
/// no set_training (then the data is not generated).
void start(Context *ctx);
/// Resets the scratch arena, sets the step number and fills the inputs.
void begin_step(Context *ctx, int64_t step);
/// Runs `steps` steps like planrt::run (prints step lines on rank 0 unless
/// `quiet`) and returns the reported loss of every step.
std::vector<float> train(Context *ctx, void (*step)(Context *), int64_t steps,
                         bool quiet);
/// What train() does after each step: fatal if a non-blocking collective
/// is pending; waits for outstanding sends; fatal if a unit is open, a
/// microbatch still in flight or the stash not empty; frees the stash memory.
void end_step(Context *ctx);
/// Bytes of the step's scratch arena taken so far (scratch tensors and ops'
/// temporaries, outside a memory plan).
int64_t arena_used(const Context *ctx);
/// Bytes of alloc_stash memory held now, and the number of allocations.
int64_t stash_live_bytes(const Context *ctx);
int64_t stash_allocations(const Context *ctx);
/// This rank's peak of microbatches in flight per stage (0 for the stages it
/// does not own), stage 0 first.
std::vector<int64_t> pipeline_peaks(const Context *ctx);
/// Loss given to report_loss during the current step (NaN if none).
float reported_loss(const Context *ctx);
/// Gradient norm given to report_grad_norm during the current step (NaN if
/// none).
float reported_grad_norm(const Context *ctx);
/// The line printed for a step:
/// "step S/N | loss L[ | grad norm G] | T ms[ | lr R[ | K tok/s]]"
/// (see report_grad_norm in planrt.h).
std::string step_line(const Context *ctx, int64_t step, int64_t steps,
                      double ms);
/// Copies a tensor to host memory.
std::vector<float> to_host(Context *ctx, const Tensor *t);
/// Copies host values into a tensor (sizes must match).
void from_host(Context *ctx, Tensor *t, const std::vector<float> &values);
/// The same for int32 tensors (from_host_ids requires dtype I32).
std::vector<int32_t> to_host_ids(Context *ctx, const Tensor *t);
void from_host_ids(Context *ctx, Tensor *t, const std::vector<int32_t> &ids);
/// Writes all parameters as safetensors (what --save does). Call it on
/// every rank: sharded parameters are gathered to rank 0, which writes
/// atomically (try_write_safetensors). If that fails, every rank prints one
/// line ("<program>: error: <option>: cannot write 'PATH': <reason>") and
/// the program exits with code 1 (fatal without MPI).
void save_safetensors(Context *ctx, const std::string &path,
                      const char *option = "--save");
/// What --dump-step0 PATH does: from now on observe() records on rank 0
/// during step 1, and train() writes the recorded tensors to `path` after
/// step 1 (an empty path turns it off again).
void set_dump_step0(Context *ctx, const std::string &path);
/// Writes the tensors recorded by observe() to `path` on rank 0 (what
/// train() does after step 1 with set_dump_step0) and returns their number.
/// With `error`, a write error is returned there (see try_write_safetensors)
/// instead of being fatal.
size_t write_observed(Context *ctx, const std::string &path,
                      std::string *error = nullptr);

/// The function given to set_forward (null if none).
using StepFn = void (*)(Context *);
StepFn forward_fn(const Context *ctx);
/// Samples `count` tokens after `prompt` with the forward function (see
/// generate.cpp); every rank calls it; returns the sampled bytes.
std::string generate(Context *ctx, const std::string &prompt, int64_t count,
                     float temperature);

/// Deterministic generators.
uint64_t name_hash(const char *name);
float init_value(int64_t seed, const char *param_name, int64_t global_index,
                 int64_t init_kind, float a, float b);
/// init_value with name_hash(param_name) computed once by the caller.
float init_value_hashed(int64_t seed, uint64_t param_name_hash,
                        int64_t global_index, int64_t init_kind, float a,
                        float b);
/// Rows [row0, row0 + rows) of synthetic input `input_index` at `step`.
void synthetic_inputs(int64_t seed, int64_t step, int64_t input_index,
                      int64_t row0, int64_t rows, int64_t cols, float *out);
/// Teacher labels y[rows][out_cols] for input rows x[rows][in_cols].
void synthetic_labels(int64_t seed, const float *x, int64_t rows,
                      int64_t in_cols, int64_t out_cols, float *y);

/// Learning rate at `step` (from 1) for base lr `base` under a schedule
/// (see set_lr_schedule); `decay_steps` 0 means `run_steps`.
double scheduled_lr(int64_t kind, int64_t warmup_steps, double min_lr,
                    int64_t decay_steps, int64_t run_steps, double base,
                    int64_t step);
/// The same with the Context's schedule and current step.
float scheduled_lr(const Context *ctx, float base);

/// Token shards (data_kind 1). Errors are returned as a message
/// "<file or pattern>: <what>; <how to fix>" (empty on success); planrt::run
/// prints it as "planrt: error: <message>" on every rank.
struct TokenShard {
  std::string path;
  int64_t first = 0;  // index of its first token in the stream
  int64_t tokens = 0; // tokens claimed by (and present in) the file
};
struct TokenShards {
  std::string pattern;
  std::vector<TokenShard> files; // sorted by name
  int64_t total = 0;             // tokens in the stream
};
constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int64_t kShardHeaderInts = 256;
/// Checks one shard file's header and size; sets `tokens`.
std::string check_token_shard(const std::string &path, int64_t &tokens);
/// Globs `pattern` (sorted by name) and checks every file.
std::string open_token_shards(const std::string &pattern, TokenShards &out);
/// stream[start, start + count) as int32.
std::string read_tokens(const TokenShards &shards, int64_t start, int64_t count,
                        int32_t *out);
/// Position in the stream of global row 0 at `step` (from 1).
int64_t token_step_position(int64_t total, int64_t global_batch, int64_t seq,
                            int64_t step);
/// Rows [row0, row0 + rows) of the batch of `step`: inputs and labels
/// [rows][seq]. Reads rows * seq + 1 tokens (the windows of these rows).
std::string token_batch(const TokenShards &shards, int64_t step,
                        int64_t global_batch, int64_t seq, int64_t row0,
                        int64_t rows, int32_t *inputs, int32_t *labels);
/// What run checks before any collective for data_kind 1: the data path is
/// set, the shards are valid and hold at least global_batch * S + 1 tokens.
/// Opens the shards into the Context. Empty for other data kinds.
std::string open_training_data(Context *ctx);

/// Checkpoints (lib/checkpoint_*.cpp, docs/checkpoints.md). write_checkpoint
/// writes DIR/step-NNNNNN/ for `step` into the directory of set_checkpoint
/// (every rank calls it; on an error every rank prints one line and the
/// program exits 1) and returns that directory. crc32 is zlib's (the
/// manifest's checksum of each file); plan_hash hashes the declarations.
std::string write_checkpoint(Context *ctx, int64_t step);
uint32_t crc32(uint32_t crc, const void *data, size_t bytes);
std::string plan_hash(const Context *ctx);

/// Safetensors serialization of named fp32 tensors (shapes as dims lists);
/// with `bf16` set, that bfloat16 copy is written instead (dtype BF16).
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float *data;
  const uint16_t *bf16 = nullptr;
};
/// Writes `path` atomically: a temporary file in the same directory
/// (".NAME.tmp-XXXXXX", removed on error and on SIGINT, SIGTERM, SIGHUP and
/// SIGXFSZ), fsync, then rename over `path`; an existing non-regular target
/// (/dev/null) is written in place. Returns "" or "cannot write 'PATH':
/// <reason>..."; on error nothing that was on disk is changed.
/// `metadata` (optional) becomes the header's "__metadata__" object of
/// string values.
std::string try_write_safetensors(
    const std::string &path, const std::vector<NamedTensor> &tensors,
    const std::vector<std::pair<std::string, std::string>> &metadata = {});
/// A safetensors file is the 8-byte header length, the header (JSON, padded
/// with spaces to a multiple of 8) and the tensors' data in order:
/// safetensors_header returns the first two, safetensors_parts all of it as
/// pieces for try_write_file (pointing into `header` and the tensors).
std::string safetensors_header(
    const std::vector<NamedTensor> &tensors,
    const std::vector<std::pair<std::string, std::string>> &metadata = {});
struct FilePart {
  const void *data;
  size_t bytes;
};
std::vector<FilePart>
safetensors_parts(const std::string &header,
                  const std::vector<NamedTensor> &tensors);
/// The atomic write behind try_write_safetensors, for any content: the
/// parts in order to a temporary file in the same directory, fsync, rename
/// over `path`, fsync of the directory. The temporary is removed on error
/// and on SIGINT, SIGTERM, SIGHUP and SIGXFSZ where their action is the
/// default one (a signal the program handles, such as SIGTERM while
/// training, lets the write complete). Returns "" or the error (as
/// try_write_safetensors).
std::string try_write_file(const std::string &path,
                           const std::vector<FilePart> &parts);
/// The same, fatal on error.
void write_safetensors(const std::string &path,
                       const std::vector<NamedTensor> &tensors);
/// Whether an output file can be written at `path` (checked before training):
/// "" or why not (a directory, a missing or unwritable parent directory).
std::string check_output_path(const std::string &path);

} // namespace internal
} // namespace planrt

#endif // PLANRT_INTERNAL_H
