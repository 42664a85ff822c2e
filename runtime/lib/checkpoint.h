//===- checkpoint.h - Checkpoints, --resume, --init-from, stop signals ----===//
//
// A checkpoint is a directory DIR/step-NNNNNN/ holding one safetensors file
// per rank that holds a distinct block of some tensor (rank-RRRRR.safetensors:
// its local shards of parameters and optimizer state, as they are in
// memory) and manifest.json, written by rank 0 last, after every rank's file
// is on disk: a directory without a manifest is incomplete and ignored. The
// manifest gives every tensor's global shape and which global index ranges
// each file holds, so a run under another plan (other dp / tp / pp / ZeRO)
// reads the slices overlapping its own shards.
//
// Private to the runtime. planrt::run (driver.cpp) calls these; the format
// is described in docs/checkpoints.md, the code is in checkpoint_*.cpp
// (checkpoint_impl.h lists the pieces).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CHECKPOINT_H
#define PLANRT_LIB_CHECKPOINT_H

#include "context.h"

#include <string>

namespace CLI {
class App;
} // namespace CLI

namespace planrt {
namespace internal {

/// The checkpoint options of one run.
struct CheckpointOptions {
  bool resume = false;
  std::string resume_dir; // --resume DIR ("" = the plan's directory)
  std::string init_from;  // --init-from FILE
  bool dir_set = false, every_set = false, keep_set = false;
  bool fresh = false;      // --fresh: step 1 whatever the directory holds
  bool dump_step0 = false; // --dump-step0 is set (needs step 1)
  // Filled by prepare_checkpoints: the checkpoint the run continues from
  // (--resume, or found in the checkpoint directory: `automatic`), and
  // what a fresh start says about the directory.
  bool automatic = false;
  std::string resume_step_dir;
  int64_t resume_step = 0;
  int64_t incomplete = 0; // incomplete checkpoints seen at a fresh start
  int64_t superseded = 0; // --fresh: checkpoints moved aside, and where
  std::string superseded_dir;
};

/// Declares the checkpoint options (group "Checkpoints"), parsed into `opts`
/// and ctx's checkpoint_dir, checkpoint_every and checkpoint_keep, whose
/// values from the plan are the defaults.
void add_checkpoint_options(CLI::App &app, Context *ctx,
                            CheckpointOptions &opts);
/// Usage errors (exit code 2): conflicting options. "" if none.
std::string check_checkpoint_usage(const Context *ctx,
                                   const CheckpointOptions &opts, int64_t steps,
                                   bool dump_step0);

/// Before start() (after the world-size check): creates the checkpoint
/// directory, finds and checks the checkpoint the run continues from
/// (--resume DIR, or the newest complete one of the checkpoint directory
/// unless --fresh: manifest, names, global shapes, files and their sizes)
/// or the --init-from file (header, names, shapes). --fresh moves the
/// directory's checkpoints aside. Sets ctx->first_step. On a problem every
/// rank prints one line and the program exits with code 1 (collective).
void prepare_checkpoints(Context *ctx, CheckpointOptions &opts, int64_t steps);
/// After start(): reads the parameters and state of the checkpoint
/// (checksums verified) or the parameters of --init-from into this rank's
/// tensors, and prints the run's first line: where it starts and why.
/// Errors as for prepare_checkpoints (collective).
void load_checkpoints(Context *ctx, const CheckpointOptions &opts);

/// Training loop hooks. begin_training installs the SIGTERM / SIGUSR1
/// handlers (stop after the current step), end_training restores the
/// previous ones. after_step (collective, every step): writes a checkpoint
/// when one is due or a stop signal arrived on any rank; true = stop now
/// (ctx->stop_signal is set).
void begin_training(Context *ctx);
bool after_step(Context *ctx, int64_t step, int64_t steps);
void end_training(Context *ctx);

// write_checkpoint, crc32 and plan_hash: planrt/internal.h.

} // namespace internal
} // namespace planrt

#endif // PLANRT_LIB_CHECKPOINT_H
