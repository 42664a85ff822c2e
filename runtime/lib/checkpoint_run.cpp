//===- checkpoint_run.cpp - Writing checkpoints; the run's hooks ----------===//
//
// What planrt::run (driver.cpp) calls: prepare_checkpoints and
// load_checkpoints before step 1 (which checkpoint the run continues from,
// or --init-from), after_step (a checkpoint when one is due or a stop
// signal arrived on any rank), and the SIGTERM / SIGUSR1 handlers around
// the training loop; write_checkpoint's order of writes makes a checkpoint
// appear only when complete. Every problem stops every rank (agree_or_exit).
//===----------------------------------------------------------------------===//

#include "checkpoint_impl.h"

#include "control.h"

#include "watchdog.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace planrt {

//===--- Description calls ------------------------------------------------===//

void set_checkpoint(Context *ctx, const char *dir, int64_t every) {
  if (!ctx)
    fatal("set_checkpoint: null context");
  if (!dir || !*dir)
    fatal("set_checkpoint: empty directory");
  if (every < 0)
    fatal("set_checkpoint: every must be >= 0 (0: only on SIGTERM / "
          "SIGUSR1), got %lld",
          (long long)every);
  ctx->checkpoint_dir = dir;
  ctx->checkpoint_every = every;
}

namespace internal {
namespace ckpt {

bool multi(const Context *ctx) { return ctx->use_mpi && ctx->world > 1; }

/// Every rank passes its error ("" if none). If any rank has one, each
/// prints one line (its own error, or that another rank failed) and the
/// program exits with code 1. Collective.
void agree_or_exit(Context *ctx, const std::string &error, const char *what) {
  int bad = error.empty() ? 0 : 1, any = bad;
  if (multi(ctx))
    watchdog::allreduce(ctx, &bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD,
                        watchdog::group_op("the checkpoint checks", -1));
  if (!any)
    return;
  std::string who =
      multi(ctx) ? "rank " + std::to_string(ctx->rank) + ": " : std::string();
  if (bad)
    std::fprintf(stderr, "planrt: error: %s%s\n", who.c_str(), error.c_str());
  else
    std::fprintf(stderr,
                 "planrt: error: %s%s failed on another rank (see its "
                 "message)\n",
                 who.c_str(), what);
  std::fflush(stderr);
  std::fflush(stdout);
  if (ctx->use_mpi)
    MPI_Finalize();
  std::exit(1);
}

} // namespace ckpt

using namespace ckpt;

namespace {

const char *signal_name(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

//===--- Stop signals -----------------------------------------------------===//

volatile sig_atomic_t g_stop_signal = 0;
struct sigaction g_prev_term, g_prev_usr1;
bool g_handlers_installed = false;

void on_stop_signal(int sig) { g_stop_signal = sig; }

Manifest g_manifest; // the checkpoint --resume reads (prepare -> load)
InitFile g_init;     // the --init-from file (prepare -> load)

/// Whether every rank sees the same (min == max); collective.
bool same_on_every_rank(Context *ctx, int64_t v) {
  int64_t lo = v, hi = v;
  if (multi(ctx)) {
    watchdog::allreduce(ctx, &v, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD,
                        watchdog::group_op("the checkpoint checks", -1));
    watchdog::allreduce(ctx, &v, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD,
                        watchdog::group_op("the checkpoint checks", -1));
  }
  return lo == hi;
}

} // namespace

/// Rank 0's outcome of a step of writing checkpoint `step` reaches every
/// rank: the others' `error` names what rank 0 could not `do`. Collective.
static void share_rank0_error(Context *ctx, std::string &error, int64_t step,
                              const std::string &what) {
  if (!multi(ctx))
    return;
  int bad = error.empty() ? 0 : 1;
  watchdog::bcast(ctx, &bad, 1, MPI_INT, 0, MPI_COMM_WORLD,
                  watchdog::group_op("a checkpoint", -1));
  if (bad && ctx->rank != 0)
    error = "checkpoint of step " + std::to_string(step) +
            ": rank 0 could not " + what + " (see its message)";
}

//===--- Writing ----------------------------------------------------------===//

std::string write_checkpoint(Context *ctx, int64_t step) {
  auto t0 = std::chrono::steady_clock::now();
  std::string root = strip_slashes(ctx->checkpoint_dir);
  std::string dir = join(root, step_dir_name(step));
  // Rank 0 makes the directory and removes an old manifest: from here until
  // the new manifest is renamed into place the checkpoint is incomplete.
  std::string error;
  if (ctx->rank == 0) {
    error = make_dirs(dir);
    std::string manifest = join(dir, "manifest.json");
    if (error.empty() && ::unlink(manifest.c_str()) != 0 && errno != ENOENT)
      error =
          "cannot remove the old '" + manifest + "': " + std::strerror(errno);
    if (error.empty()) {
      fsync_dir(dir);
      fsync_dir(root);
    }
    if (!error.empty())
      error = "checkpoint of step " + std::to_string(step) + ": " + error;
  }
  share_rank0_error(ctx, error, step, "prepare '" + dir + "'");
  agree_or_exit(ctx, error, "writing the checkpoint");

  // This rank's blocks: host copies in the file's order.
  std::vector<TensorRef> refs = tensor_refs(ctx);
  std::vector<std::vector<float>> host;
  std::vector<NamedTensor> named;
  host.reserve(refs.size());
  for (const TensorRef &r : refs) {
    if (!r.t->data || !writes(ctx, r, ctx->coords))
      continue;
    host.push_back(to_host(ctx, r.t));
    named.push_back(NamedTensor{
        r.key(), std::vector<int64_t>(r.t->shape, r.t->shape + r.t->ndim),
        host.back().data()});
  }
  FileInfo mine;
  if (!named.empty()) {
    std::vector<std::pair<std::string, std::string>> meta = {
        {"format", "planrt-checkpoint-shard"},
        {"step", std::to_string(step)},
        {"rank", std::to_string(ctx->rank)},
        {"plan_hash", plan_hash(ctx)}};
    std::string header = safetensors_header(named, meta);
    std::vector<FilePart> parts = safetensors_parts(header, named);
    uint32_t crc = 0;
    for (const FilePart &part : parts) {
      crc = crc32(crc, part.data, part.bytes);
      mine.bytes += (int64_t)part.bytes;
    }
    mine.crc = crc;
    mine.wrote = 1;
    std::string path = join(dir, rank_file_name(ctx->rank));
    error = try_write_file(path, parts);
    if (!error.empty())
      error = "checkpoint of step " + std::to_string(step) + ": " + error;
  }
  agree_or_exit(ctx, error, "writing the checkpoint");

  // Every file is on disk: rank 0 writes the manifest, the checkpoint is
  // complete once it is renamed into place.
  std::vector<FileInfo> files((size_t)ctx->world);
  if (multi(ctx))
    watchdog::gather(ctx, &mine, 3, MPI_INT64_T, files.data(), 0,
                     MPI_COMM_WORLD, watchdog::group_op("a checkpoint", -1));
  else
    files[0] = mine;
  if (ctx->rank == 0) {
    std::string text = manifest_json(ctx, step, files);
    error = try_write_file(join(dir, "manifest.json"),
                           {FilePart{text.data(), text.size()}});
    if (!error.empty())
      error = "checkpoint of step " + std::to_string(step) + ": " + error;
    else if (ctx->checkpoint_keep > 0)
      prune(ctx, root);
  }
  share_rank0_error(ctx, error, step,
                    "write '" + join(dir, "manifest.json") + "'");
  agree_or_exit(ctx, error, "writing the checkpoint");
  if (ctx->rank == 0) {
    int64_t bytes = 0, count = 0;
    for (const FileInfo &f : files) {
      bytes += f.bytes;
      count += f.wrote;
    }
    double ms = std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
    std::printf(
        "checkpoint: step %lld written to %s/ (%lld shard files, %lld B, "
        "%.0f ms)\n",
        (long long)step, dir.c_str(), (long long)count, (long long)bytes, ms);
    std::fflush(stdout);
  }
  return dir;
}

//===--- Before step 1 ----------------------------------------------------===//

void prepare_checkpoints(Context *ctx, CheckpointOptions &opts, int64_t steps) {
  check_layouts(ctx);
  std::string error;
  std::string root = strip_slashes(ctx->checkpoint_dir);
  // The directory checkpoints go to: created now, so that a run learns at
  // once, not at its first checkpoint, that it cannot write there.
  if (!ctx->checkpoint_dir.empty() && steps > 0) {
    error = make_dirs(root);
    if (error.empty() && ::access(root.c_str(), W_OK | X_OK) != 0)
      error = "the directory '" + root + "' is not writable (" +
              std::strerror(errno) + ")";
    if (!error.empty())
      error = "checkpoint directory: " + error;
    if (error.empty() && opts.fresh && ctx->rank == 0)
      error = supersede(root, opts);
  }
  agree_or_exit(ctx, error, "preparing the checkpoint directory");
  // Without --resume or --fresh, a complete checkpoint in the directory
  // means this is the same job started again (requeued, resubmitted): it
  // continues from the newest one (--init-from gave its step-1 weights).
  if (!opts.resume && !opts.fresh && !ctx->checkpoint_dir.empty() &&
      steps > 0) {
    std::map<int64_t, bool> all = list_checkpoints(root);
    int64_t newest = 0;
    for (auto &kv : all)
      if (kv.second)
        newest = kv.first;
      else
        ++opts.incomplete;
    if (!same_on_every_rank(ctx, newest))
      error = "the ranks see different checkpoints in '" + root +
              "'; the checkpoint directory must be one directory shared by "
              "every node";
    agree_or_exit(ctx, error, "checking the checkpoint directory");
    if (newest > 0) {
      opts.resume = opts.automatic = true;
      opts.incomplete = 0;
      if (opts.dump_step0)
        error = "--dump-step0 writes what step 1 observed, but '" + root +
                "' holds the checkpoint of step " + std::to_string(newest) +
                " and the run would continue from it; add --fresh to start "
                "at step 1";
    }
  }
  if (error.empty() && opts.resume) {
    std::string from = opts.automatic || opts.resume_dir.empty()
                           ? root
                           : strip_slashes(opts.resume_dir);
    error = find_checkpoint(from, opts.resume_step_dir);
    if (error.empty())
      error = read_manifest(opts.resume_step_dir, g_manifest);
    if (error.empty())
      error = check_resume(ctx, opts.resume_step_dir, g_manifest, steps);
    if (!error.empty() && opts.automatic)
      error += " (the run continues from the newest checkpoint of its "
               "checkpoint directory; --fresh starts at step 1 instead)";
  }
  if (error.empty() && !opts.init_from.empty() && !opts.resume)
    error = check_init_from(ctx, opts.init_from, g_init);
  agree_or_exit(ctx, error, "checking the checkpoint options");
  if (!opts.resume)
    return;
  // Every rank must have picked the same checkpoint.
  int64_t step = g_manifest.step;
  if (!same_on_every_rank(ctx, step))
    error = "--resume: the ranks found different newest checkpoints; is "
            "the checkpoint directory shared by all nodes?";
  agree_or_exit(ctx, error, "checking the checkpoint options");
  opts.resume_step = step;
  ctx->first_step = step + 1;
  ctx->final_step = step;
  const Json *tr = g_manifest.training;
  const Json *loss = member(tr, "loss");
  if (loss && loss->is_number())
    ctx->final_loss = (float)loss->get<double>();
}

void load_checkpoints(Context *ctx, const CheckpointOptions &opts) {
  std::string error;
  auto t0 = std::chrono::steady_clock::now();
  if (opts.resume)
    error = load_resume(ctx, opts.resume_step_dir, g_manifest);
  else if (!opts.init_from.empty())
    error = load_init_from(ctx, opts.init_from, g_init);
  agree_or_exit(ctx, error, opts.resume ? "--resume" : "--init-from");
  if (ctx->use_mpi)
    backend::synchronize(ctx);
  if (ctx->rank != 0)
    return;
  double ms = std::chrono::duration<double, std::milli>(
                  std::chrono::steady_clock::now() - t0)
                  .count();
  std::string root = strip_slashes(ctx->checkpoint_dir);
  if (!opts.resume && !root.empty()) { // a fresh start, and why
    std::printf("start: step 1");
    if (opts.superseded_dir.size())
      std::printf(" (--fresh): the checkpoints of %s/ moved to %s/",
                  root.c_str(), opts.superseded_dir.c_str());
    else if (opts.fresh)
      std::printf(" (--fresh): no checkpoint in %s/", root.c_str());
    else if (opts.incomplete)
      std::printf("; no complete checkpoint in %s/ (%lld incomplete: a run "
                  "stopped while writing them)",
                  root.c_str(), (long long)opts.incomplete);
    else
      std::printf("; no checkpoint in %s/ yet", root.c_str());
    std::printf("\n");
  }
  if (!opts.resume) {
    if (!opts.init_from.empty()) {
      std::printf("init-from: %zu parameters loaded from %s",
                  g_init.found.size(), opts.init_from.c_str());
      if (g_init.ignored > 0)
        std::printf(" (%lld other tensors ignored)", (long long)g_init.ignored);
      std::printf("\n");
    }
    std::fflush(stdout);
    return;
  }
  std::string mesh;
  for (size_t a = 0; a < ctx->axis_names.size(); ++a)
    mesh += (a ? ", " : "") + ctx->axis_names[a] + "=" +
            std::to_string(ctx->axis_sizes[a]);
  if (mesh.empty())
    mesh = "one rank";
  std::printf("resume: step %lld from %s/ (%.0f ms)",
              (long long)opts.resume_step, opts.resume_step_dir.c_str(), ms);
  if (opts.automatic)
    std::printf(", the newest checkpoint of %s/%s", root.c_str(),
                opts.init_from.empty() ? "" : " (--init-from not read)");
  if (g_manifest.plan_hash != plan_hash(ctx))
    std::printf("; written under another plan (mesh %s; this run: %s), "
                "read by global slices",
                g_manifest.mesh.c_str(), mesh.c_str());
  std::printf("\n");
  std::fflush(stdout);
  // What makes the continuation differ from an uninterrupted run.
  const Json *tr = g_manifest.training;
  int64_t v = 0;
  if (get_int(member(tr, "seed"), v) && v != ctx->seed)
    std::fprintf(stderr,
                 "planrt: warning: resuming: the checkpoint was "
                 "trained with seed %lld, this program uses %lld: the data "
                 "from here on differs\n",
                 (long long)v, (long long)ctx->seed);
  if (get_int(member(tr, "global_batch"), v) && v != ctx->global_batch)
    std::fprintf(stderr,
                 "planrt: warning: resuming: the checkpoint was "
                 "trained with a global batch of %lld, this program uses "
                 "%lld\n",
                 (long long)v, (long long)ctx->global_batch);
  const Json *data = member(tr, "data");
  if (data && ctx->tokens_open && get_int(member(data, "tokens"), v) &&
      v != ctx->tokens.total)
    std::fprintf(stderr,
                 "planrt: warning: resuming: the checkpoint was "
                 "trained on %lld tokens, the data files now hold %lld: the "
                 "batches from here on differ\n",
                 (long long)v, (long long)ctx->tokens.total);
  const Json *lr = member(tr, "lr_schedule");
  const std::string *kind = string_of(member(lr, "kind"));
  if (kind && *kind == "cosine" && ctx->lr_schedule_set &&
      ctx->lr_kind == LrCosine && ctx->lr_decay <= 0 &&
      get_int(member(lr, "decay_steps"), v) && v != ctx->run_steps)
    std::fprintf(stderr,
                 "planrt: warning: resuming: the cosine schedule "
                 "decayed over %lld steps (the --steps of that run) and now "
                 "decays over %lld; set decay_steps in the plan to keep it\n",
                 (long long)v, (long long)ctx->run_steps);
  std::fflush(stderr);
}

//===--- Training loop hooks ----------------------------------------------===//

void begin_training(Context *ctx) {
  (void)ctx;
  g_stop_signal = 0;
  // The handler runs on a stack of its own: the main thread runs GEMM
  // kernels too, and a signal frame must not land where they keep data.
  static char altstack[64 * 1024];
  stack_t ss;
  std::memset(&ss, 0, sizeof(ss));
  ss.ss_sp = altstack;
  ss.ss_size = sizeof(altstack);
  sigaltstack(&ss, nullptr);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_ONSTACK;
  sigaction(SIGTERM, &sa, &g_prev_term);
  sigaction(SIGUSR1, &sa, &g_prev_usr1);
  g_handlers_installed = true;
}

void end_training(Context *ctx) {
  (void)ctx;
  if (!g_handlers_installed)
    return;
  sigaction(SIGTERM, &g_prev_term, nullptr);
  sigaction(SIGUSR1, &g_prev_usr1, nullptr);
  g_handlers_installed = false;
}

bool after_step(Context *ctx, int64_t step, int64_t steps) {
  int mine = g_handlers_installed ? (int)g_stop_signal : 0, any = mine;
  if (multi(ctx))
    watchdog::allreduce(ctx, &mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD,
                        watchdog::group_op("the stop-signal check", -1));
  bool due = !ctx->checkpoint_dir.empty() && ctx->checkpoint_every > 0 &&
             step % ctx->checkpoint_every == 0;
  if (!any) {
    if (due)
      write_checkpoint(ctx, step);
    return false;
  }
  ctx->stop_signal = any;
  if (!ctx->checkpoint_dir.empty()) {
    std::string dir = write_checkpoint(ctx, step);
    if (ctx->rank == 0)
      std::printf("stopped by %s after step %lld/%lld; checkpoint %s/: "
                  "the same command continues from it\n",
                  signal_name(any), (long long)step, (long long)steps,
                  dir.c_str());
  } else if (ctx->rank == 0) {
    std::printf("stopped by %s after step %lld/%lld\n", signal_name(any),
                (long long)step, (long long)steps);
    std::fprintf(stderr,
                 "planrt: warning: stopped by %s after step %lld without a "
                 "checkpoint: no checkpoint directory is set (train { "
                 "checkpoint = \"DIR\" } or --checkpoint-dir DIR)\n",
                 signal_name(any), (long long)step);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  return true;
}

} // namespace internal
} // namespace planrt
