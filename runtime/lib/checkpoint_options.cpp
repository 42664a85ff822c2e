//===- checkpoint_options.cpp - The checkpoint options --------------------===//
//
// --checkpoint-dir, --checkpoint-every, --keep, --fresh, --resume and
// --init-from: parsing them, their lines of --help, and the usage errors of
// conflicting ones (exit code 2). docs/checkpoints.md describes them.
//===----------------------------------------------------------------------===//

#include "checkpoint.h"

#include <string>

namespace planrt {
namespace internal {

//===--- Options ----------------------------------------------------------===//

bool parse_checkpoint_option(Context *ctx, CheckpointOptions &opts,
                             OptionArg &opt) {
  const std::string &arg = opt.name;
  std::string &value = opt.value;
  if (arg == "--resume") {
    opts.resume = true;
    // The directory is optional: the next argument if it is not an option.
    if (opt.take_optional()) {
      opts.resume_dir = value;
      if (value.empty())
        opt.error = "empty directory for --resume";
    }
    return true;
  }
  if (arg == "--fresh" && !opt.has_value) {
    opts.fresh = true;
    return true;
  }
  if (arg == "--init-from") {
    if (opt.take() && value.empty())
      opt.error = "empty path for --init-from";
    opts.init_from = value;
    return true;
  }
  if (arg == "--checkpoint-dir") {
    if (opt.take() && value.empty())
      opt.error = "empty path for --checkpoint-dir";
    ctx->checkpoint_dir = value;
    opts.dir_set = true;
    return true;
  }
  if (arg == "--checkpoint-every") {
    opt.take_int(0, ctx->checkpoint_every);
    opts.every_set = true;
    return true;
  }
  if (arg == "--keep") {
    opt.take_int(1, ctx->checkpoint_keep);
    opts.keep_set = true;
    return true;
  }
  return false;
}

std::string checkpoint_usage() {
  return "  --checkpoint-dir DIR\n"
         "                     write checkpoints to DIR/step-NNNNNN/ (default: "
         "the plan's\n"
         "                     train { checkpoint = \"DIR\" }); when DIR "
         "already holds a\n"
         "                     complete checkpoint, the run continues from "
         "the newest one\n"
         "                     (the same command starts and requeues a job)\n"
         "  --checkpoint-every N\n"
         "                     a checkpoint every N steps (0: only when "
         "stopped by\n"
         "                     SIGTERM or SIGUSR1; default: checkpoint_every)\n"
         "  --keep N           keep only the N newest complete checkpoints\n"
         "  --fresh            start at step 1 even if the checkpoint "
         "directory holds\n"
         "                     checkpoints; they are moved to "
         "DIR/superseded-<time>/\n"
         "  --resume [DIR]     continue from the newest complete checkpoint "
         "in DIR (default:\n"
         "                     the checkpoint directory) or from DIR itself "
         "if it holds a\n"
         "                     manifest.json; an error if there is none. "
         "--steps N is still\n"
         "                     the last step. Works across plans (dp, tp, pp, "
         "ZeRO): each\n"
         "                     rank reads the slices it needs\n"
         "  --init-from FILE   before step 1, load the parameters from FILE "
         "(safetensors, whole\n"
         "                     tensors by name: --save's names or Hugging "
         "Face GPT-2's, e.g.\n"
         "                     transformer.h.0.attn.c_attn.weight); not read "
         "when the run\n"
         "                     continues from a checkpoint\n"
         "SIGTERM or SIGUSR1 (Slurm before preemption) stops training after "
         "the current\n"
         "step, writes a checkpoint if a checkpoint directory is set, and "
         "exits with 0.\n";
}

std::string check_checkpoint_usage(const Context *ctx,
                                   const CheckpointOptions &opts, int64_t steps,
                                   bool dump_step0) {
  (void)steps;
  if (opts.resume && opts.fresh)
    return "--resume continues from a checkpoint and --fresh starts at step "
           "1; use one";
  if (opts.resume && !opts.init_from.empty())
    return "--resume and --init-from both set the starting weights; use one";
  if (opts.resume && dump_step0)
    return "--dump-step0 writes what step 1 observed but --resume starts "
           "after a checkpoint; drop one of them";
  if (opts.resume && opts.resume_dir.empty() && ctx->checkpoint_dir.empty())
    return "--resume without a directory needs a checkpoint directory: the "
           "plan's train { checkpoint = \"DIR\" } or --checkpoint-dir DIR; or "
           "give it: --resume DIR";
  if (opts.keep_set && ctx->checkpoint_dir.empty())
    return "--keep needs a checkpoint directory (train { checkpoint = "
           "\"DIR\" } or --checkpoint-dir DIR)";
  if (opts.every_set && ctx->checkpoint_dir.empty() &&
      ctx->checkpoint_every > 0)
    return "--checkpoint-every needs a checkpoint directory (train { "
           "checkpoint = \"DIR\" } or --checkpoint-dir DIR)";
  return "";
}

} // namespace internal
} // namespace planrt
