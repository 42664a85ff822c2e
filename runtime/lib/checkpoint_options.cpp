//===- checkpoint_options.cpp - The checkpoint options --------------------===//
//
// --checkpoint-dir, --checkpoint-every, --keep, --fresh, --resume and
// --init-from: their declarations (options.h) and the usage errors of
// conflicting ones (exit code 2). docs/checkpoints.md describes them.
//===----------------------------------------------------------------------===//

#include "checkpoint.h"
#include "options.h"

#include <string>

namespace planrt {
namespace internal {

//===--- Options ----------------------------------------------------------===//

void add_checkpoint_options(CLI::App &app, Context *ctx,
                            CheckpointOptions &opts) {
  const char *group = "Checkpoints";
  add_value_option(app, "--checkpoint-dir", "DIR",
                   "write checkpoints to DIR/step-NNNNNN/; when DIR already "
                   "holds a complete checkpoint, the run continues from the "
                   "newest one (the same command starts and requeues a job)",
                   [ctx, &opts](const std::string &v) {
                     ctx->checkpoint_dir = v;
                     opts.dir_set = true;
                     return v.empty() ? "empty path for --checkpoint-dir"
                                      : std::string();
                   })
      ->default_str(ctx->checkpoint_dir.empty()
                        ? "none; a plan sets one with train { checkpoint = "
                          "\"DIR\" }"
                        : "'" + ctx->checkpoint_dir + "', the plan's")
      ->group(group);
  add_int_option(app, "--checkpoint-every", "N",
                 "a checkpoint every N steps (0: only when stopped by "
                 "SIGTERM or SIGUSR1)",
                 ctx->checkpoint_every, 0)
      ->default_str(std::to_string(ctx->checkpoint_every) +
                    ", the plan's checkpoint_every")
      ->each([&opts](const std::string &) { opts.every_set = true; })
      ->group(group);
  add_int_option(app, "--keep", "N",
                 "keep only the N newest complete checkpoints",
                 ctx->checkpoint_keep, 1)
      ->each([&opts](const std::string &) { opts.keep_set = true; })
      ->group(group);
  add_flag_option(app, "--fresh",
                  "start at step 1 even if the checkpoint directory holds "
                  "checkpoints; they are moved to DIR/superseded-<time>/",
                  [&opts] { opts.fresh = true; })
      ->group(group);
  add_optional_value_option(
      app, "--resume", "DIR",
      "continue from the newest complete checkpoint in DIR (default: the "
      "checkpoint directory) or from DIR itself if it holds a "
      "manifest.json; an error if there is none. --steps N is still the "
      "last step. Works across plans (dp, tp, pp, ZeRO): each rank reads the "
      "slices it needs",
      [&opts](const std::string *dir) {
        opts.resume = true;
        if (!dir)
          return std::string();
        opts.resume_dir = *dir;
        return dir->empty() ? "empty directory for --resume" : std::string();
      })
      ->group(group);
  add_path_option(app, "--init-from", "FILE",
                  "before step 1, load the parameters from FILE "
                  "(safetensors, whole tensors by name: --save's names or "
                  "Hugging Face GPT-2's, e.g. "
                  "transformer.h.0.attn.c_attn.weight); not read when the "
                  "run continues from a checkpoint",
                  opts.init_from)
      ->group(group);
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
