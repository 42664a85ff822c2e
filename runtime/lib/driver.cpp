//===- driver.cpp - planrt::run: options, checks, the training loop -------===//

#include "checkpoint.h"
#include "context.h"
#include "options.h"
#include "planrt/dtype.h"
#include "planrt/internal.h"
#include "progress.h"
#include "trace.h"

#include "control.h"

#include "watchdog.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>

namespace planrt {

namespace {

/// The most tokens --generate samples in one run (documented in --help).
constexpr int64_t kMaxGenerate = 1000000;

int64_t mesh_ranks(const Context *ctx) {
  int64_t n = 1;
  for (int64_t s : ctx->axis_sizes)
    n *= s;
  return n;
}

std::string mesh_str(const Context *ctx) {
  if (ctx->axis_names.empty())
    return "no mesh axes";
  std::string s = "mesh ";
  for (size_t i = 0; i < ctx->axis_names.size(); ++i) {
    if (i)
      s += ", ";
    s += ctx->axis_names[i] + "=" + std::to_string(ctx->axis_sizes[i]);
  }
  return s;
}

/// Checks the description; fatal on anything the runtime cannot run.
void validate(Context *ctx) {
  int64_t naxes = (int64_t)ctx->axis_sizes.size();
  for (auto &p : ctx->params)
    internal::validate_layout(ctx, p, "parameter");
  for (auto &in : ctx->inputs) {
    if (in.batch_axis >= naxes)
      fatal("input '%s': batch axis %lld is not a declared mesh axis (%lld "
            "axes)",
            in.name.c_str(), (long long)in.batch_axis, (long long)naxes);
    if (in.inner_axis >= naxes)
      fatal("input '%s': inner batch axis %lld is not a declared mesh axis "
            "(%lld axes)",
            in.name.c_str(), (long long)in.inner_axis, (long long)naxes);
    if (in.seq_axis >= naxes)
      fatal("input '%s': sequence axis %lld is not a declared mesh axis "
            "(%lld axes)",
            in.name.c_str(), (long long)in.seq_axis, (long long)naxes);
  }
  if (ctx->inputs.empty())
    return; // nothing to generate (tests, or programs without data)
  if (ctx->data_kind < DataSynthetic || ctx->data_kind > DataCifar10)
    fatal("unsupported data_kind %lld (0 = synthetic regression, 1 = token "
          "shards, 2 = synthetic images and 3 = CIFAR-10 are implemented)",
          (long long)ctx->data_kind);
  static const char *const kKinds[] = {
      "data_kind 0 (synthetic regression)", "data_kind 1 (token shards)",
      "data_kind 2 (synthetic images)", "data_kind 3 (CIFAR-10)"};
  const char *kind = kKinds[ctx->data_kind];
  const InputDesc *x = nullptr, *y = nullptr;
  int nx = 0, ny = 0;
  for (auto &in : ctx->inputs) {
    if (in.role == RoleInput) {
      x = &in;
      ++nx;
    } else {
      y = &in;
      ++ny;
    }
  }
  if (nx != 1 || ny != 1)
    fatal("%s needs exactly one input and one label, got %d input(s) and %d "
          "label(s)",
          kind, nx, ny);
  bool images = internal::is_classifier(ctx);
  if (images ? (x->t.ndim < 2 || y->t.ndim != 1)
             : (x->t.ndim != 2 || y->t.ndim != 2))
    fatal("%s needs %s, got input '%s' %s and label '%s' %s", kind,
          images ? "an input [rows, ...] and a 1-D label [rows]"
                 : "a 2-D input and a 2-D label",
          x->name.c_str(), shape_str(&x->t).c_str(), y->name.c_str(),
          shape_str(&y->t).c_str());
  if (x->t.shape[0] != y->t.shape[0] || x->batch_axis != y->batch_axis ||
      x->inner_axis != y->inner_axis || x->chunks != y->chunks ||
      x->seq_axis != y->seq_axis)
    fatal("%s: input '%s' %s and label '%s' %s must have the same rows, "
          "batch axis and sequence axis",
          kind, x->name.c_str(), shape_str(&x->t).c_str(), y->name.c_str(),
          shape_str(&y->t).c_str());
  if (x->seq_axis >= 0 && ctx->data_kind != DataTokenShards)
    fatal("%s: input '%s' is split along its sequence (context "
          "parallelism), which only token shards support",
          kind, x->name.c_str());
  if (x->seq_axis >= 0 && x->t.shape[1] % 2 != 0)
    fatal("%s: input '%s' %s: a sequence split over an axis has two equal "
          "chunks per rank",
          kind, x->name.c_str(), shape_str(&x->t).c_str());
  int want_x = ctx->data_kind == DataTokenShards ? I32 : F32;
  int want_y = ctx->data_kind == DataSynthetic ? F32 : I32;
  for (auto [in, want] : {std::pair{x, want_x}, std::pair{y, want_y}})
    if (in->t.dtype != want)
      fatal("%s needs an %s %s; '%s' is %s (see set_input_dtype)", kind,
            want == F32 ? "f32" : "i32", in == x ? "input" : "label",
            in->name.c_str(), in->t.dtype == F32 ? "f32" : "i32");
  if (images && ctx->classes < 1)
    fatal("%s needs the number of classes (set_classes)", kind);
  if (ctx->data_kind == DataCifar10 &&
      (x->t.ndim != 4 || x->t.shape[1] != 3 || x->t.shape[2] != 32 ||
       x->t.shape[3] != 32))
    fatal("%s needs an input [rows, 3, 32, 32], got '%s' %s", kind,
          x->name.c_str(), shape_str(&x->t).c_str());
  if (ctx->data_kind == DataTokenShards && x->t.shape[1] != y->t.shape[1])
    fatal("%s: input '%s' %s and label '%s' %s must have the same shape "
          "[rows, sequence]",
          kind, x->name.c_str(), shape_str(&x->t).c_str(), y->name.c_str(),
          shape_str(&y->t).c_str());
  int64_t global_rows = x->t.shape[0] * batch_ranks(ctx, *x);
  if (ctx->global_batch > 0 && ctx->global_batch != global_rows)
    fatal("global batch %lld does not match input '%s': %lld local rows x %lld "
          "ranks on its batch axes",
          (long long)ctx->global_batch, x->name.c_str(),
          (long long)x->t.shape[0], (long long)(global_rows / x->t.shape[0]));
}

void allocate_tensor(Context *ctx, Tensor *t) {
  t->data = (float *)backend::alloc_bytes(
      ctx, (size_t)t->numel() * sizeof(float) + (t->numel() ? 0 : 4));
}

/// The end of --help: what the options do not say.
const char *kHelpFooter =
    "--save, --save-every, --save-init, --dump-step0 and checkpoint files are "
    "written to a temporary name in the same directory and renamed when "
    "complete: an error or a kill never leaves a partial file in their place. "
    "--log-json and --trace files are written as the run goes (flushed every "
    "step).\n"
    "SIGTERM or SIGUSR1 (Slurm before preemption) stops training after the "
    "current step, writes a checkpoint if a checkpoint directory is set, and "
    "exits with 0.\n"
    "Exit codes: 0 success (also after a stop by SIGTERM/SIGUSR1), 1 an error "
    "(output paths, checkpoints and --init-from are checked before step 1; a "
    "NaN or Inf loss or gradient norm stops every rank after that step), 2 a "
    "usage error, 3 the --timeout watchdog aborted the job.";

/// A number for "(default: X)" in --help: 300, 0.8, 65536.
std::string number_str(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

/// Problems with the options that would otherwise show only after training:
/// output paths that cannot be written, two outputs on one path, generation
/// options for a program that cannot generate, --prompt bytes outside the
/// vocabulary. No collective.
std::vector<std::string> check_run_options(
    const Context *ctx,
    const std::vector<std::pair<const char *, std::string>> &outputs,
    int64_t generate, const std::string &prompt, bool prompt_set,
    bool temperature_set) {
  std::vector<std::string> problems;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto &[option, path] = outputs[i];
    if (path.empty())
      continue;
    std::string why = internal::check_output_path(path);
    if (!why.empty())
      problems.push_back(std::string(option) + ": " + why);
    for (size_t j = 0; j < i; ++j)
      if (outputs[j].second == path)
        problems.push_back(std::string(option) + ": '" + path + "' is also " +
                           "the path of " + outputs[j].first + "; give them " +
                           "different paths");
  }
  if (generate == 0) {
    if (prompt_set)
      problems.push_back("--prompt is only used by --generate N; add "
                         "--generate or drop --prompt");
    if (temperature_set)
      problems.push_back("--temperature is only used by --generate N; add "
                         "--generate or drop --temperature");
    return problems;
  }
  const InputDesc *tokens = nullptr;
  for (const InputDesc &in : ctx->inputs)
    if (in.t.dtype == I32 && in.role == RoleInput)
      tokens = &in;
  if (!tokens || !ctx->forward) {
    problems.push_back(
        "--generate " + std::to_string(generate) + ": this program cannot " +
        "generate text: " +
        (tokens ? "it has no forward function"
                : "its model has no token (i32) input; generation needs a "
                  "language model such as examples/tiny-gpt.plan"));
    return problems;
  }
  int64_t vocab =
      ctx->token_vocab > 0 ? ctx->token_vocab : ctx->generation_classes;
  for (size_t i = 0; i < prompt.size() && vocab > 0; ++i) {
    unsigned char b = (unsigned char)prompt[i];
    if (b < vocab)
      continue;
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "--prompt: byte 0x%02x at offset %zu is token %d, outside "
                  "the model's vocabulary [0, %lld)",
                  b, i, (int)b, (long long)vocab);
    problems.push_back(std::string(buf) +
                       "; each byte of the prompt is one token: use " +
                       (vocab <= 128 ? "ASCII text" : "text in its range"));
    break;
  }
  return problems;
}

std::string launch_name(const char *argv0) {
  std::string s = argv0 ? argv0 : "program";
  if (s.find('/') == std::string::npos)
    s = "./" + s;
  return s;
}

/// How to start `ranks` ranks of this program: the host target runs under
/// mpirun; the cuda target also alone (one rank) or under any launcher of
/// docs/runtime.md.
std::string launch_command(int64_t ranks, const char *argv0) {
  std::string prog = launch_name(argv0), n = std::to_string(ranks);
  if (std::string(backend::name()) != "cuda")
    return "'mpirun -np " + n + " " + prog + "'";
  if (ranks == 1)
    return "'" + prog + "'";
  return "'torchrun --nproc-per-node " + n + " --no-python " + prog +
         "', 'srun -n " + n + " " + prog + "' or 'mpirun -np " + n + " " +
         prog + "'";
}

/// The "memory per rank" line (rank 0) and the check of the runtime's
/// parameter and state bytes against expect_bytes on every rank; false (after
/// every rank printed an error) if some rank differs.
bool memory_report(Context *ctx) {
  const Context::PlannedFn &plan = ctx->planned_fns[0];
  bool planned = plan.bytes >= 0;
  if (ctx->rank == 0) {
    std::printf("memory per rank: params %lld B, state %lld B, step arena "
                "peak %lld B (compiler: params %lld B, grads %lld B, state "
                "%lld B)\n",
                (long long)ctx->param_bytes, (long long)ctx->state_bytes,
                (long long)ctx->arena_peak, (long long)ctx->expected_params,
                (long long)ctx->expected_grads, (long long)ctx->expected_state);
    // Measured by the arena: the most live bytes of each kind at once, and
    // the arena's highest byte against the compiler's plan.
    if (planned) {
      std::printf("memory peaks per rank: gradients %lld B, activations %lld "
                  "B, workspace %lld B, all at once %lld B; step arena %lld "
                  "B (planned %lld B, %lld B without reuse)",
                  (long long)ctx->live_peak[1], (long long)ctx->live_peak[0],
                  (long long)ctx->live_peak[2], (long long)ctx->live_total_peak,
                  (long long)plan.high_water, (long long)plan.bytes,
                  (long long)plan.buffer_bytes);
      if (ctx->stash_planned >= 0)
        std::printf("; stash pool %lld B (planned %lld B)",
                    (long long)ctx->stash_high, (long long)ctx->stash_planned);
      std::printf("\n");
    }
    if (int64_t lib = backend::library_bytes(ctx))
      std::printf("memory outside the plan per rank: %lld B (the %s "
                  "backend's libraries: workspaces, the gradient norm's "
                  "partial sums, and attention's buffers "
                  "on cuDNN)\n",
                  (long long)lib, backend::name());
    std::string note = backend::library_note(ctx);
    if (!note.empty())
      std::printf("%s", note.c_str());
    std::fflush(stdout);
  }
  bool arena_bad = planned && plan.runs > 0 && plan.high_water != plan.bytes;
  if (arena_bad)
    std::fprintf(stderr,
                 "planrt: error: rank %d: the step reached %lld B of its "
                 "arena but the compiler planned %lld B (rank.arena_bytes); "
                 "a planc or planrt bug to report with the plan\n",
                 ctx->rank, (long long)plan.high_water, (long long)plan.bytes);
  bool stash_bad = ctx->stash_planned >= 0 && plan.runs > 0 &&
                   ctx->stash_high != ctx->stash_planned;
  if (stash_bad)
    std::fprintf(stderr,
                 "planrt: error: rank %d: the step's stash reached %lld B of "
                 "its pool but the compiler planned %lld B "
                 "(rank.stash_bytes); a planc or planrt bug to report with "
                 "the plan\n",
                 ctx->rank, (long long)ctx->stash_high,
                 (long long)ctx->stash_planned);
  arena_bad |= stash_bad;
  int bad = ctx->param_bytes != ctx->expected_params ||
            ctx->state_bytes != ctx->expected_state || arena_bad;
  int any = bad;
  if (ctx->use_mpi && ctx->world > 1)
    watchdog::allreduce(ctx, &bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD,
                        watchdog::group_op("the memory check", -1));
  if (bad && !arena_bad)
    std::fprintf(stderr,
                 "planrt: error: rank %d: the runtime allocated params %lld B "
                 "and state %lld B but the compiler computed params %lld B and "
                 "state %lld B (expect_bytes); the generated program and the "
                 "runtime disagree on the shapes, a planc or planrt bug to "
                 "report with the plan\n",
                 ctx->rank, (long long)ctx->param_bytes,
                 (long long)ctx->state_bytes, (long long)ctx->expected_params,
                 (long long)ctx->expected_state);
  else if (any)
    std::fprintf(stderr,
                 "planrt: error: rank %d: another rank's parameter or state "
                 "bytes differ from what the compiler computed (see its "
                 "message)\n",
                 ctx->rank);
  std::fflush(stderr);
  return !any;
}

/// The "pipeline: peak microbatches in flight per stage" line (rank 0): the
/// owners' peaks, the most over the data-parallel replicas. Collective.
void pipeline_report(Context *ctx) {
  // The peaks per stage, then the most stash memory one rank held.
  std::vector<int64_t> mine = internal::pipeline_peaks(ctx);
  mine.push_back(ctx->stash_peak_bytes);
  std::vector<int64_t> all = mine;
  if (ctx->use_mpi && ctx->world > 1)
    watchdog::allreduce(ctx, mine.data(), all.data(), (int)mine.size(),
                        MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD,
                        watchdog::group_op("the pipeline report", -1));
  if (ctx->rank != 0)
    return;
  std::string line = "pipeline: peak microbatches in flight per stage:";
  for (size_t i = 0; i + 1 < all.size(); ++i)
    line += " " + std::to_string(all[i]);
  line += "; stash peak " + std::to_string(all.back()) + " B";
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

} // namespace

/// Fatal unless `p`'s shard axes are declared and its segments split evenly
/// and sum to the global dimension (a code generator bug otherwise).
void internal::validate_layout(Context *ctx, const ParamDesc &p,
                               const char *what) {
  int64_t naxes = (int64_t)ctx->axis_sizes.size();
  for (int d = 0; d < 4; ++d) {
    for (int64_t ax : p.shard_axes[d])
      if (ax >= naxes)
        fatal("%s '%s': shard axis %lld is not a declared mesh axis "
              "(%lld axes)",
              what, p.name.c_str(), (long long)ax, (long long)naxes);
    if (p.segments[d].empty())
      continue;
    int64_t blocks = param_dim_blocks(ctx, p, d), sum = 0;
    for (size_t k = 0; k < p.segments[d].size(); ++k) {
      int64_t s = p.segments[d][k];
      if (s % blocks != 0)
        fatal("%s '%s': segment %zu of dimension %d has size %lld, "
              "which does not split evenly over the %lld blocks of the "
              "dimension's mesh axes",
              what, p.name.c_str(), k, d, (long long)s, (long long)blocks);
      sum += s;
    }
    if (sum != p.t.shape[d] * blocks)
      fatal("%s '%s': the segments of dimension %d sum to %lld but "
            "the global dimension is %lld (local %lld x %lld blocks)",
            what, p.name.c_str(), d, (long long)sum,
            (long long)(p.t.shape[d] * blocks), (long long)p.t.shape[d],
            (long long)blocks);
  }
}

/// Tokens of the global batch: global rows x the other dims of the first I32
/// input (0 if there is none).
const char *internal::batch_unit(const Context *ctx) {
  // A classifier's labels count samples (images), a language model's tokens.
  return is_classifier(ctx) ? "samples/s" : "tok/s";
}

bool internal::is_classifier(const Context *ctx) {
  return ctx->data_kind == DataSyntheticImages || ctx->data_kind == DataCifar10;
}

int64_t internal::global_batch_tokens(const Context *ctx) {
  for (auto &in : ctx->inputs) {
    if (in.t.dtype != I32)
      continue;
    int64_t n = in.t.numel();
    if (in.batch_axis < (int64_t)ctx->axis_sizes.size() &&
        in.inner_axis < (int64_t)ctx->axis_sizes.size())
      n *= batch_ranks(ctx, in);
    return n;
  }
  return 0;
}

/// Ranks that record observe() for --dump-step0: rank 0, and with a
/// pipeline every rank with coordinate 0 on the other axes (the stages'
/// owners; rank 0 collects their tensors before writing).
static bool observer(const Context *ctx) {
  if (ctx->rank == 0)
    return true;
  if (ctx->pipeline_axis < 0)
    return false;
  for (size_t a = 0; a < ctx->coords.size(); ++a)
    if ((int64_t)a != ctx->pipeline_axis && ctx->coords[a] != 0)
      return false;
  return true;
}

/// With a pipeline: the other observers send their tensors to rank 0, which
/// appends them in pipeline order (a name observed again keeps the later
/// stage's contents). Collective.
static void gather_observed(Context *ctx) {
  if (ctx->pipeline_axis < 0 || !ctx->use_mpi || ctx->world == 1 ||
      !observer(ctx))
    return;
  int64_t P = ctx->axis_sizes[(size_t)ctx->pipeline_axis];
  int64_t me = ctx->coords[(size_t)ctx->pipeline_axis];
  if (me != 0) { // serialize: name, shape, data per tensor
    std::vector<int64_t> buf;
    for (const ObservedTensor &o : ctx->observed) {
      buf.push_back((int64_t)o.name.size());
      buf.push_back((int64_t)o.shape.size());
      buf.push_back((int64_t)o.data.size());
      size_t at = buf.size();
      buf.resize(at + (o.name.size() + 7) / 8);
      std::memcpy(buf.data() + at, o.name.data(), o.name.size());
      buf.insert(buf.end(), o.shape.begin(), o.shape.end());
      at = buf.size();
      buf.resize(at + (o.data.size() * sizeof(float) + 7) / 8);
      std::memcpy(buf.data() + at, o.data.data(),
                  o.data.size() * sizeof(float));
    }
    int64_t n = (int64_t)buf.size();
    watchdog::Op to0 = watchdog::peer_op("--dump-step0", 0, true);
    watchdog::send(ctx, &n, 1, MPI_INT64_T, 0, 0, MPI_COMM_WORLD, to0);
    watchdog::send(ctx, buf.data(), (int)n, MPI_INT64_T, 0, 0, MPI_COMM_WORLD,
                   to0);
    ctx->observed.clear();
    return;
  }
  for (int64_t c = 1; c < P; ++c) {
    int src = world_rank_with(ctx, ctx->pipeline_axis, c);
    int64_t n = 0;
    watchdog::Op from = watchdog::peer_op("--dump-step0", src, false);
    watchdog::recv(ctx, &n, 1, MPI_INT64_T, src, 0, MPI_COMM_WORLD, from);
    std::vector<int64_t> buf((size_t)n);
    watchdog::recv(ctx, buf.data(), (int)n, MPI_INT64_T, src, 0, MPI_COMM_WORLD,
                   from);
    for (size_t at = 0; at < buf.size();) {
      ObservedTensor o;
      size_t name_len = (size_t)buf[at], ndim = (size_t)buf[at + 1],
             elems = (size_t)buf[at + 2];
      at += 3;
      o.name.assign((const char *)(buf.data() + at), name_len);
      at += (name_len + 7) / 8;
      o.shape.assign(buf.begin() + (long)at, buf.begin() + (long)(at + ndim));
      at += ndim;
      o.data.resize(elems);
      std::memcpy(o.data.data(), buf.data() + at, elems * sizeof(float));
      at += (elems * sizeof(float) + 7) / 8;
      auto same = std::find_if(
          ctx->observed.begin(), ctx->observed.end(),
          [&](const ObservedTensor &p) { return p.name == o.name; });
      if (same != ctx->observed.end())
        *same = std::move(o);
      else
        ctx->observed.push_back(std::move(o));
    }
  }
}

void report_loss(Context *ctx, const Tensor *loss) {
  if (!ctx)
    fatal("report_loss: null context");
  check_tensor("report_loss", "loss", loss);
  if (loss->numel() != 1)
    fatal("report_loss: loss must have one element, got %s",
          shape_str(loss).c_str());
  float v = 0.0f;
  backend::to_host(ctx, &v, loss->data, sizeof(float));
  ctx->last_loss = v;
  ctx->loss_reported = true;
}

void set_dynamic_loss_scale(Context *ctx) {
  if (!ctx)
    fatal("set_dynamic_loss_scale: null context");
  ctx->dynamic_loss_scale = true;
}

void loss_scale_check(Context *ctx) {
  if (!ctx)
    fatal("loss_scale_check: null context");
  if (!ctx->unscaled_sum)
    fatal("loss_scale_check: dynamic loss scaling was not set up before "
          "the program started (set_dynamic_loss_scale)");
  float sum = 0.0f;
  backend::to_host(ctx, &sum, ctx->unscaled_sum, sizeof(float));
  backend::zero_bytes(ctx, ctx->unscaled_sum, sizeof(float));
  int mine = std::isfinite(sum) ? 0 : 1, any = mine;
  if (ctx->use_mpi && ctx->world > 1)
    watchdog::allreduce(
        ctx, &mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD,
        watchdog::group_op("the loss scale's overflow check", -1));
  ctx->skip_step = any != 0;
}

void report_grad_norm(Context *ctx, const Tensor *sumsq) {
  if (!ctx)
    fatal("report_grad_norm: null context");
  check_tensor("report_grad_norm", "sumsq", sumsq);
  if (sumsq->numel() != 1 || sumsq->dtype != F32)
    fatal("report_grad_norm: sumsq must be one f32 element, got %s",
          shape_str(sumsq).c_str());
  float v = 0.0f;
  backend::to_host(ctx, &v, sumsq->data, sizeof(float));
  ctx->last_grad_norm = std::sqrt(v);
  ctx->grad_norm_reported = true;
}

void set_forward(Context *ctx, void (*forward)(Context *)) {
  if (!ctx)
    fatal("set_forward: null context");
  ctx->forward = forward;
}

void set_generation_classes(Context *ctx, int64_t classes) {
  if (!ctx)
    fatal("set_generation_classes: null context");
  if (classes < 1)
    fatal("set_generation_classes: classes must be >= 1, got %lld",
          (long long)classes);
  ctx->generation_classes = classes;
}

void observe(Context *ctx, const Tensor *t, const char *name) {
  if (!ctx)
    fatal("observe: null context");
  if (!ctx->capture.empty() && name && ctx->capture == name) {
    ctx->captured = internal::to_host(ctx, t);
    ctx->captured_shape.assign(t->shape, t->shape + t->ndim);
    return;
  }
  bool wanted =
      ctx->observe_eval || (!ctx->dump_step0_path.empty() && ctx->step == 1);
  if (!wanted || !observer(ctx))
    return;
  if (!name || !*name)
    fatal("observe: empty name");
  check_tensor("observe", name, t);
  ObservedTensor *o = nullptr;
  for (auto &prev : ctx->observed)
    if (prev.name == name)
      o = &prev;
  if (!o) {
    ctx->observed.emplace_back();
    o = &ctx->observed.back();
    o->name = name;
  }
  o->shape.assign(t->shape, t->shape + t->ndim);
  o->data = internal::to_host(ctx, t);
  // Token and class ids are dumped as f32 values (exact below 2^24).
  if (t->dtype == I32)
    for (float &v : o->data) {
      int32_t id;
      std::memcpy(&id, &v, sizeof(id));
      v = (float)id;
    }
}

float step_lr(Context *ctx, float base) {
  float lr = internal::scheduled_lr(ctx, base);
  if (!ctx->lr_reported) {
    ctx->last_lr = lr;
    ctx->lr_reported = true;
  }
  return lr;
}

namespace internal {

/// After rank 0 wrote (or failed to write) an output file: every rank learns
/// the outcome; on failure each prints one line naming the file and the
/// program exits with code 1 on every rank (nothing was overwritten: see
/// try_write_safetensors). Collective with several ranks.
static void exit_if_write_failed(Context *ctx, const char *option,
                                 const std::string &path, std::string error) {
  if (ctx->use_mpi && ctx->world > 1) {
    int n = (int)error.size();
    watchdog::Op op = watchdog::group_op(option, -1);
    watchdog::bcast(ctx, &n, 1, MPI_INT, 0, MPI_COMM_WORLD, op);
    error.resize((size_t)n);
    if (n > 0)
      watchdog::bcast(ctx, &error[0], n, MPI_CHAR, 0, MPI_COMM_WORLD, op);
  }
  if (error.empty())
    return;
  if (!ctx->use_mpi)
    fatal("%s: %s", option, error.c_str());
  if (ctx->rank == 0)
    std::fprintf(stderr, "%s: error: %s: %s\n", ctx->program.c_str(), option,
                 error.c_str());
  else
    std::fprintf(stderr,
                 "%s: error: rank %d: %s: rank 0 could not write '%s' (see "
                 "its message)\n",
                 ctx->program.c_str(), ctx->rank, option, path.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  MPI_Finalize();
  std::exit(1);
}

Context *create_context(const char *program_name, bool use_mpi) {
  Context *ctx = new Context;
  ctx->program = program_name ? program_name : "program";
  ctx->use_mpi = use_mpi;
  if (use_mpi) {
    int init = 0;
    MPI_Initialized(&init);
    if (!init)
      fatal("create_context: MPI is not initialized");
    MPI_Comm_rank(MPI_COMM_WORLD, &ctx->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ctx->world);
  }
  return ctx;
}

void destroy_context(Context *ctx) {
  if (!ctx)
    return;
  if (ctx->started) {
    p2p_finalize(ctx);
    arena_free_all(ctx);
    internal::free_plan_arena(ctx);
    for (auto &p : ctx->params) {
      backend::free_bytes(ctx, p.t.data);
      backend::free_bytes(ctx, p.copy.data);
    }
    for (auto &st : ctx->states)
      backend::free_bytes(ctx, st.t.data);
    for (auto &in : ctx->inputs)
      backend::free_bytes(ctx, in.t.data);
    if (ctx->unscaled_sum)
      backend::free_bytes(ctx, ctx->unscaled_sum);
    backend::finalize(ctx);
  }
  delete ctx;
}

} // namespace internal

std::vector<ParamDesc *> model_tensors(Context *ctx,
                                       std::deque<ParamDesc> &keep) {
  std::vector<ParamDesc *> out;
  for (ParamDesc &p : ctx->params)
    out.push_back(&p);
  for (StateDesc &st : ctx->states)
    if (st.buffer) {
      keep.push_back(state_as_param(st));
      out.push_back(&keep.back());
    }
  return out;
}

ParamDesc state_as_param(const StateDesc &st) {
  ParamDesc p;
  p.name = st.name;
  p.init_kind = st.init_kind;
  p.a = st.a;
  p.b = st.b;
  for (int d = 0; d < 4; ++d) {
    p.shard_axes[d] = st.shard_axes[d];
    p.segments[d] = st.segments[d];
  }
  p.stage = st.stage;
  p.t = st.t;
  return p;
}

namespace internal {

void start(Context *ctx) {
  if (ctx->started)
    fatal("start: the program was already started");
  validate(ctx);
  if (mesh_ranks(ctx) != ctx->world)
    fatal("this program needs %lld ranks (%s) but the world has %d",
          (long long)mesh_ranks(ctx), mesh_str(ctx).c_str(), ctx->world);
  ctx->coords = rank_coords(ctx, ctx->rank);
  if (!ctx->inputs.empty() &&
      ((ctx->data_kind == DataTokenShards && !ctx->tokens_open) ||
       (ctx->data_kind == DataCifar10 && ctx->cifar_files.empty()))) {
    // planrt::run opened them before any collective; tests come here.
    std::string error = open_training_data(ctx);
    if (!error.empty())
      fatal("%s", error.c_str());
  }
  backend::init(ctx);
  ctx->started = true;
  if (ctx->dynamic_loss_scale) {
    ctx->unscaled_sum = (float *)backend::alloc_bytes(ctx, sizeof(float));
    backend::zero_bytes(ctx, ctx->unscaled_sum, sizeof(float));
  }
  std::vector<float> host;
  p2p_init(ctx);
  int64_t my_pp = pipeline_coord(ctx);
  for (auto &p : ctx->params) {
    if (p.stage >= 0 && stage_owner(ctx, p.stage) != my_pp)
      continue; // another pipeline rank's stage: not allocated
    allocate_tensor(ctx, &p.t);
    int64_t n = p.t.numel();
    ctx->param_bytes += n * (int64_t)sizeof(float);
    host.resize((size_t)n);
    ParamLayout layout = param_layout(ctx, p, ctx->coords);
    uint64_t h = name_hash(p.name.c_str());
    // Each value is a hash of its index: any split over threads gives the
    // same bits (GPT-2 124M: ~6 s from launch to step 1 instead of ~10).
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < n; ++i)
      host[i] =
          init_value_hashed(ctx->seed, h, layout.global_flat(p.t.shape, i),
                            p.init_kind, p.a, p.b);
    backend::to_device(ctx, p.t.data, host.data(), (size_t)n * sizeof(float));
    if (p.copy.dtype != F32) { // rounded by the first param_copy()
      int dtype = p.copy.dtype;
      p.copy = p.t;
      p.copy.dtype = dtype;
      p.copy.data = (float *)backend::alloc_bytes(ctx, tensor_bytes(&p.copy));
      ctx->param_bytes += (int64_t)tensor_bytes(&p.copy);
    }
  }
  ctx->copies_stale = true;
  for (auto &st : ctx->states) {
    if (st.stage >= 0 && stage_owner(ctx, st.stage) != my_pp)
      continue;
    allocate_tensor(ctx, &st.t);
    int64_t n = st.t.numel();
    ctx->state_bytes += n * (int64_t)sizeof(float);
    if (!st.buffer) {
      backend::zero_bytes(ctx, st.t.data, (size_t)n * sizeof(float));
      continue;
    }
    // Model state starts like a parameter (running variance: ones).
    ParamDesc p = state_as_param(st);
    ParamLayout layout = param_layout(ctx, p, ctx->coords);
    host.resize((size_t)n);
    for (int64_t i = 0; i < n; ++i)
      host[i] = init_value(ctx->seed, st.name.c_str(),
                           layout.global_flat(st.t.shape, i), st.init_kind,
                           st.a, st.b);
    backend::to_device(ctx, st.t.data, host.data(), (size_t)n * sizeof(float));
  }
  for (auto &in : ctx->inputs) {
    allocate_tensor(ctx, &in.t);
    ctx->input_bytes += in.t.numel() * (int64_t)sizeof(float);
    backend::zero_bytes(ctx, in.t.data, (size_t)in.t.numel() * sizeof(float));
  }
  internal::allocate_plan_arena(ctx);
  backend::synchronize(ctx);
}

void refresh_param_copies(Context *ctx) {
  ctx->copies_stale = false;
  for (ParamDesc &p : ctx->params)
    if (p.copy.data && p.t.data)
      cast(ctx, &p.t, &p.copy);
}

void begin_step(Context *ctx, int64_t step) {
  if (!ctx->started)
    fatal("begin_step: the program was not started");
  check_no_pending(ctx, "begin_step");
  arena_reset(ctx);
  ctx->step = step;
  ctx->loss_reported = false;
  ctx->last_loss = std::numeric_limits<float>::quiet_NaN();
  ctx->grad_norm_reported = false;
  ctx->last_grad_norm = std::numeric_limits<float>::quiet_NaN();
  ctx->lr_reported = false;
  ctx->last_lr = std::numeric_limits<float>::quiet_NaN();
  ctx->skip_step = false;
  if (ctx->run_steps <= 0)
    ctx->run_steps = ctx->steps;
  if (ctx->inputs.empty())
    return;
  if (ctx->data_kind == DataTokenShards)
    fill_tokens(ctx, step);
  else if (ctx->data_kind == DataSyntheticImages)
    fill_synthetic_images(ctx, step);
  else if (ctx->data_kind == DataCifar10)
    internal::fill_cifar(ctx, step);
  else
    fill_synthetic(ctx, step);
}

float reported_loss(const Context *ctx) { return ctx->last_loss; }

float reported_grad_norm(const Context *ctx) { return ctx->last_grad_norm; }

/// After a step with dynamic loss scaling: an overflow halves the scale
/// (the step was skipped), 2000 clean steps in a row double it.
void update_loss_scale(Context *ctx) {
  if (!ctx->dynamic_loss_scale)
    return;
  if (ctx->skip_step) {
    ctx->loss_scale = std::max(ctx->loss_scale * 0.5f, 1e-30f);
    ctx->loss_scale_clean = 0;
    ++ctx->loss_scale_skipped;
  } else if (++ctx->loss_scale_clean >= 2000) {
    ctx->loss_scale = std::min(ctx->loss_scale * 2.0f, 1e30f);
    ctx->loss_scale_clean = 0;
  }
}

std::string step_line(const Context *ctx, int64_t step, int64_t steps,
                      double ms) {
  char buf[256];
  int n = std::snprintf(buf, sizeof(buf), "step %d/%d | loss %.9e", (int)step,
                        (int)steps, (double)ctx->last_loss);
  if (ctx->grad_norm_reported)
    n += std::snprintf(buf + n, sizeof(buf) - n, " | grad norm %.4e",
                       (double)ctx->last_grad_norm);
  n += std::snprintf(buf + n, sizeof(buf) - n, " | %.2f ms", ms);
  int64_t tokens = internal::global_batch_tokens(ctx);
  if (tokens > 0 || ctx->lr_schedule_set)
    n += std::snprintf(buf + n, sizeof(buf) - n, " | lr %.3e",
                       (double)ctx->last_lr);
  if (tokens > 0)
    n += std::snprintf(buf + n, sizeof(buf) - n, " | %.0f %s",
                       ms > 0 ? (double)tokens / (ms * 1e-3) : 0.0,
                       internal::batch_unit(ctx));
  if (ctx->last_accuracy >= 0)
    n += std::snprintf(buf + n, sizeof(buf) - n, " | acc %.4f",
                       (double)ctx->last_accuracy);
  // The scale this step ran with; a skipped step also counts the steps
  // skipped so far, itself included (update_loss_scale runs after).
  if (ctx->dynamic_loss_scale && ctx->skip_step)
    std::snprintf(buf + n, sizeof(buf) - n,
                  " | loss scale %g | skipped (gradient overflow; %lld so far)",
                  (double)ctx->loss_scale,
                  (long long)ctx->loss_scale_skipped + 1);
  else if (ctx->dynamic_loss_scale)
    std::snprintf(buf + n, sizeof(buf) - n, " | loss scale %g",
                  (double)ctx->loss_scale);
  return buf;
}

double scheduled_lr(int64_t kind, int64_t warmup_steps, double min_lr,
                    int64_t decay_steps, int64_t run_steps, double base,
                    int64_t step) {
  if (warmup_steps > 0 && step <= warmup_steps)
    return base * (double)step / (double)warmup_steps;
  if (kind != LrCosine)
    return base;
  int64_t decay = decay_steps > 0 ? decay_steps : run_steps;
  double p = (double)(step - warmup_steps) /
             (double)std::max<int64_t>(1, decay - warmup_steps);
  p = std::min(1.0, std::max(0.0, p));
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * p)) * (base - min_lr);
}

float scheduled_lr(const Context *ctx, float base) {
  if (!ctx->lr_schedule_set)
    return base;
  return (float)scheduled_lr(
      ctx->lr_kind, ctx->lr_warmup, ctx->lr_min, ctx->lr_decay,
      ctx->run_steps > 0 ? ctx->run_steps : ctx->steps, base, ctx->step);
}

/// The step's classification accuracy over the whole batch. Every rank
/// that computed the loss counted its rows (tensor-parallel ranks count the
/// same rows alike, other pipeline stages none), so the world's ratio is
/// the batch's.
static void reduce_accuracy(Context *ctx) {
  if (!internal::is_classifier(ctx))
    return;
  double v[2] = {ctx->acc_correct, ctx->acc_rows};
  if (ctx->use_mpi && ctx->world > 1) {
    double sum[2] = {0, 0};
    watchdog::allreduce(ctx, v, sum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD,
                        watchdog::group_op("accuracy", -1));
    v[0] = sum[0];
    v[1] = sum[1];
  }
  ctx->last_accuracy = v[1] > 0 ? (float)(v[0] / v[1]) : -1.0f;
}

void evaluate(Context *ctx, int64_t step);

std::vector<float> train(Context *ctx, void (*step)(Context *), int64_t steps,
                         bool quiet) {
  std::vector<float> losses;
  ctx->run_steps = steps; // the default decay_steps of the lr schedule
  for (int64_t s = ctx->first_step; s <= steps; ++s) {
    auto tb = std::chrono::steady_clock::now();
    begin_step(ctx, s);
    backend::synchronize(ctx);
    auto t0 = std::chrono::steady_clock::now();
    ctx->acc_correct = ctx->acc_rows = 0;
    step(ctx);
    end_step(ctx);
    backend::synchronize(ctx);
    reduce_accuracy(ctx);
    auto t1 = std::chrono::steady_clock::now();
    double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    losses.push_back(ctx->last_loss);
    ctx->final_step = s;
    ctx->final_loss = ctx->last_loss;
    if (ctx->trace) {
      trace::slice(ctx, "data", "data", tb, t0,
                   "\"step\":" + std::to_string(s));
      trace::slice(ctx, ("step " + std::to_string(s)).c_str(), "step", t0, t1,
                   "\"step\":" + std::to_string(s));
      trace::flush(ctx);
    }
    report_step(ctx, s, steps, ms, quiet); // progress.cpp
    watchdog::check_finite(ctx); // NaN / Inf: every rank exits with code 1
    internal::update_loss_scale(ctx);
    // --save-every: PATH with the step before its extension (collective
    // when parameters are sharded, so every rank calls it).
    if (ctx->save_every > 0 && s % ctx->save_every == 0) {
      std::string path = ctx->save_path;
      size_t dot = path.rfind('.');
      size_t slash = path.rfind('/');
      if (dot == std::string::npos ||
          (slash != std::string::npos && dot < slash))
        dot = path.size();
      char step_tag[32];
      std::snprintf(step_tag, sizeof(step_tag), "-step%06lld", (long long)s);
      save_safetensors(ctx, path.substr(0, dot) + step_tag + path.substr(dot),
                       "--save-every");
    }
    if (s == 1 && !ctx->dump_step0_path.empty()) {
      gather_observed(ctx);
      std::string error;
      size_t written = ctx->rank == 0
                           ? write_observed(ctx, ctx->dump_step0_path, &error)
                           : 1;
      exit_if_write_failed(ctx, "--dump-step0", ctx->dump_step0_path, error);
      if (ctx->rank == 0 && written == 0) {
        std::fprintf(stderr,
                     "planrt: warning: --dump-step0: the program observed "
                     "no tensor in step 1; '%s' is empty\n",
                     ctx->dump_step0_path.c_str());
        std::fflush(stderr);
      }
      ctx->observed.clear();
      ctx->observed.shrink_to_fit();
    }
    // --eval-every: after the step's checkpoint would be taken the model is
    // the same; evaluation changes no state, so a resumed run prints the
    // same evaluations.
    if (ctx->eval_every > 0 && s % ctx->eval_every == 0)
      evaluate(ctx, s);
    // Checkpoints, and a stop requested by SIGTERM / SIGUSR1 (collective).
    if (internal::after_step(ctx, s, steps))
      break;
  }
  return losses;
}

/// Runs the forward function (evaluation mode: batch norm with its running
/// statistics, no dropout) on --eval-batches held-out batches and prints
/// their mean loss and accuracy on rank 0. Collective. The training state
/// is left as it was: the parameters, the running statistics and the
/// reported loss of the step.
void evaluate(Context *ctx, int64_t step) {
  if (!ctx->forward)
    fatal("--eval-every: this program has no forward function");
  float loss = ctx->last_loss, accuracy = ctx->last_accuracy;
  bool reported = ctx->loss_reported;
  std::string dump = ctx->dump_step0_path; // step 1's tensors are not these
  ctx->dump_step0_path.clear();
  auto peaks = ctx->in_flight_peak; // evaluation's units are not counted
  double loss_sum = 0, acc[2] = {0, 0};
  for (int64_t k = 1; k <= ctx->eval_batches; ++k) {
    check_no_pending(ctx, "--eval-every");
    arena_reset(ctx);
    if (ctx->data_kind == DataCifar10)
      fill_cifar(ctx, k, /*eval=*/true);
    else
      fill_synthetic_images(ctx, k, /*eval=*/true);
    ctx->acc_correct = ctx->acc_rows = 0;
    ctx->loss_reported = false;
    // --dump-eval: the first held-out batch's inputs and logits, once.
    ctx->observe_eval = k == 1 && !ctx->dump_eval_path.empty();
    ctx->forward(ctx);
    ctx->in_flight.clear(); // forward units only: nothing to wait for
    pipeline_end_step(ctx, "--eval-every");
    backend::synchronize(ctx);
    if (ctx->observe_eval) {
      ctx->observe_eval = false;
      gather_observed(ctx);
      std::string error;
      if (ctx->rank == 0)
        write_observed(ctx, ctx->dump_eval_path, &error);
      exit_if_write_failed(ctx, "--dump-eval", ctx->dump_eval_path, error);
      ctx->observed.clear();
      ctx->dump_eval_path.clear();
    }
    if (!ctx->loss_reported)
      fatal("--eval-every: the forward function reported no loss");
    loss_sum += ctx->last_loss;
    acc[0] += ctx->acc_correct;
    acc[1] += ctx->acc_rows;
  }
  ctx->in_flight_peak = peaks;
  // Every rank that computed the loss counted its rows (as for the step's
  // accuracy), so the world's ratio is the held-out batches'.
  if (ctx->use_mpi && ctx->world > 1) {
    double sum[2] = {0, 0};
    watchdog::allreduce(ctx, acc, sum, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD,
                        watchdog::group_op("--eval-every", -1));
    acc[0] = sum[0];
    acc[1] = sum[1];
  }
  ctx->last_eval_loss = (float)(loss_sum / (double)ctx->eval_batches);
  ctx->last_eval_accuracy = acc[1] > 0 ? (float)(acc[0] / acc[1]) : -1.0f;
  report_eval(ctx, step, ctx->eval_batches * ctx->global_batch);
  ctx->last_loss = loss;
  ctx->loss_reported = reported;
  ctx->last_accuracy = accuracy;
  ctx->dump_step0_path = dump;
}

StepFn forward_fn(const Context *ctx) { return ctx->forward; }

void set_dump_step0(Context *ctx, const std::string &path) {
  ctx->dump_step0_path = path;
  ctx->observed.clear();
}

size_t write_observed(Context *ctx, const std::string &path,
                      std::string *error) {
  if (ctx->rank != 0)
    return 0;
  std::vector<NamedTensor> named;
  for (const ObservedTensor &o : ctx->observed)
    named.push_back(NamedTensor{o.name, o.shape, o.data.data()});
  if (error)
    *error = try_write_safetensors(path, named);
  else
    write_safetensors(path, named);
  return named.size();
}

std::vector<float> to_host(Context *ctx, const Tensor *t) {
  check_tensor("to_host", "tensor", t);
  std::vector<float> v((size_t)t->numel());
  if (v.empty())
    return v;
  if (t->dtype == BF16 || t->dtype == F16) {
    std::vector<uint16_t> h(v.size());
    backend::to_host(ctx, h.data(), t->data, h.size() * sizeof(uint16_t));
    for (size_t i = 0; i < h.size(); ++i)
      v[i] = t->dtype == BF16 ? float_from_bf16(h[i]) : float_from_f16(h[i]);
    return v;
  }
  backend::to_host(ctx, v.data(), t->data, v.size() * sizeof(float));
  return v;
}

std::vector<int32_t> to_host_ids(Context *ctx, const Tensor *t) {
  check_tensor("to_host_ids", "tensor", t);
  std::vector<int32_t> v((size_t)t->numel());
  if (!v.empty())
    backend::to_host(ctx, v.data(), t->data, v.size() * sizeof(int32_t));
  return v;
}

void from_host_ids(Context *ctx, Tensor *t, const std::vector<int32_t> &ids) {
  check_tensor("from_host_ids", "tensor", t);
  if (t->dtype != I32)
    fatal("from_host_ids: tensor %s is not i32", shape_str(t).c_str());
  if ((int64_t)ids.size() != t->numel())
    fatal("from_host_ids: %zu values for a tensor %s", ids.size(),
          shape_str(t).c_str());
  if (!ids.empty())
    backend::to_device(ctx, t->data, ids.data(), ids.size() * sizeof(int32_t));
}

void from_host(Context *ctx, Tensor *t, const std::vector<float> &values) {
  check_tensor("from_host", "tensor", t);
  if ((int64_t)values.size() != t->numel())
    fatal("from_host: %zu values for a tensor %s", values.size(),
          shape_str(t).c_str());
  if (values.empty())
    return;
  if (t->dtype == BF16 || t->dtype == F16) {
    std::vector<uint16_t> h(values.size());
    for (size_t i = 0; i < h.size(); ++i)
      h[i] = t->dtype == BF16 ? bf16_from_float(values[i])
                              : f16_from_float(values[i]);
    backend::to_device(ctx, t->data, h.data(), h.size() * sizeof(uint16_t));
    return;
  }
  backend::to_device(ctx, t->data, values.data(),
                     values.size() * sizeof(float));
}

/// Coordinates the ranks holding the copy of `p` that --save reads must
/// have on the axes that do not split it: 0, except on the pipeline axis
/// for a parameter of a stage, the stage's owner. -1: any (a splitting axis).
static std::vector<int64_t> holder_coords(const Context *ctx,
                                          const ParamDesc &p) {
  std::vector<int64_t> want(ctx->axis_sizes.size(), 0);
  int64_t mask = param_shard_mask(p);
  for (size_t a = 0; a < want.size(); ++a)
    if (mask & (int64_t(1) << a))
      want[a] = -1;
  if (p.stage >= 0 && ctx->pipeline_axis >= 0 && want[ctx->pipeline_axis] >= 0)
    want[ctx->pipeline_axis] = stage_owner(ctx, p.stage);
  return want;
}

static bool is_holder(const std::vector<int64_t> &coords,
                      const std::vector<int64_t> &want) {
  for (size_t a = 0; a < coords.size(); ++a)
    if (want[a] >= 0 && coords[a] != want[a])
      return false;
  return true;
}

/// Gathers parameter `p` over `comm`, the ranks that hold distinct blocks of
/// it (the holders, in world-rank order); returns the whole tensor on the
/// first holder (comm rank 0).
static std::vector<float> gather_param(Context *ctx, ParamDesc &p,
                                       MPI_Comm comm,
                                       const std::vector<int64_t> &want) {
  std::vector<float> local = to_host(ctx, &p.t);
  int64_t n = p.t.numel();
  int members = 1, me = 0;
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_size(comm, &members);
    MPI_Comm_rank(comm, &me);
  }
  std::vector<float> all;
  if (me == 0)
    all.resize((size_t)(n * members));
  if (members > 1) {
    if (n * members > 0x7fffffff)
      fatal("--save: parameter '%s' (%lld elements per rank) is too large to "
            "gather with MPI's int counts",
            p.name.c_str(), (long long)n);
    watchdog::gather(ctx, local.data(), (int)n, MPI_FLOAT, all.data(), 0, comm,
                     watchdog::group_op("--save (gathering a parameter)",
                                        param_shard_mask(p)));
  } else {
    all = local;
  }
  if (me != 0)
    return {};
  std::vector<float> full;
  size_t next = 0; // block of the next holder in `all`
  for (int64_t r = 0; r < ctx->world && next < (size_t)members; ++r) {
    std::vector<int64_t> coords = rank_coords(ctx, r);
    if (!is_holder(coords, want))
      continue;
    ParamLayout layout = param_layout(ctx, p, coords);
    if (full.empty())
      full.resize((size_t)(layout.global[0] * layout.global[1] *
                           layout.global[2] * layout.global[3]));
    const float *src = all.data() + next * (size_t)n;
    for (int64_t i = 0; i < n; ++i)
      full[layout.global_flat(p.t.shape, i)] = src[i];
    ++next;
  }
  return full;
}

void save_safetensors(Context *ctx, const std::string &path,
                      const char *option) {
  // The parameters, then the model state (batch norm's running
  // statistics) under its own names.
  std::deque<ParamDesc> buffers;
  std::vector<ParamDesc *> exported = model_tensors(ctx, buffers);
  std::vector<std::vector<float>> host;
  std::vector<NamedTensor> named;
  host.reserve(exported.size());
  bool multi = ctx->use_mpi && ctx->world > 1;
  // One communicator per set of holders (the splitting axes and the
  // coordinates wanted on the others): replicas hold the same blocks.
  std::map<std::vector<int64_t>, MPI_Comm> comms;
  for (ParamDesc *exp : exported) {
    ParamDesc &p = *exp;
    ParamLayout layout = param_layout(ctx, p, ctx->coords);
    std::vector<int64_t> want = holder_coords(ctx, p);
    bool holder = is_holder(ctx->coords, want);
    int64_t global_elems = layout.global[0] * layout.global[1] *
                           layout.global[2] * layout.global[3];
    std::vector<float> whole;
    int first = 0; // world rank of the first holder (it gets the tensor)
    for (int64_t r = 0; r < ctx->world; ++r)
      if (is_holder(rank_coords(ctx, r), want)) {
        first = (int)r;
        break;
      }
    if (param_shard_mask(p) != 0) {
      MPI_Comm comm = MPI_COMM_NULL;
      if (multi) {
        auto it = comms.find(want);
        if (it == comms.end()) {
          MPI_Comm_split(MPI_COMM_WORLD, holder ? 0 : MPI_UNDEFINED, ctx->rank,
                         &comm);
          it = comms.emplace(want, comm).first;
        }
        comm = it->second;
      }
      if (holder)
        whole = gather_param(ctx, p, comm, want);
    } else if (ctx->rank == first) {
      whole = to_host(ctx, &p.t);
    }
    if (first != 0 && multi) {
      // A stage's parameter held away from rank 0: the first holder sends.
      if (global_elems > 0x7fffffff)
        fatal("--save: parameter '%s' (%lld elements) is too large to send "
              "with MPI's int counts",
              p.name.c_str(), (long long)global_elems);
      if (ctx->rank == first)
        watchdog::send(ctx, whole.data(), (int)global_elems, MPI_FLOAT, 0, 0,
                       MPI_COMM_WORLD, watchdog::peer_op(option, 0, true));
      else if (ctx->rank == 0) {
        whole.resize((size_t)global_elems);
        watchdog::recv(ctx, whole.data(), (int)global_elems, MPI_FLOAT, first,
                       0, MPI_COMM_WORLD,
                       watchdog::peer_op(option, first, false));
      }
    }
    host.push_back(ctx->rank == 0 ? std::move(whole) : std::vector<float>());
    NamedTensor nt;
    nt.name = p.name;
    for (int d = 0; d < p.t.ndim; ++d)
      nt.shape.push_back(layout.global[d]);
    // Vocabulary padding is not exported: the leading rows are the tensor.
    if (p.export_rows > 0 && !nt.shape.empty() && p.export_rows < nt.shape[0])
      nt.shape[0] = p.export_rows;
    nt.data = ctx->rank == 0 ? host.back().data() : nullptr;
    named.push_back(nt);
  }
  for (auto &kv : comms)
    if (kv.second != MPI_COMM_NULL)
      MPI_Comm_free(&kv.second);
  // --save-dtype bf16: each tensor rounded to nearest even.
  std::vector<std::vector<uint16_t>> bf16;
  if (ctx->save_bf16 && ctx->rank == 0)
    for (NamedTensor &nt : named) {
      int64_t n = 1;
      for (int64_t d : nt.shape)
        n *= d;
      bf16.emplace_back((size_t)n);
      for (int64_t i = 0; i < n; ++i)
        bf16.back()[(size_t)i] = bf16_from_float(nt.data[i]);
      nt.bf16 = bf16.back().data();
    }
  std::string error;
  if (ctx->rank == 0)
    error = try_write_safetensors(path, named);
  exit_if_write_failed(ctx, option, path, error);
}

} // namespace internal

int run(int argc, char **argv, const char *program_name,
        void (*setup)(Context *), void (*step)(Context *)) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init)
    MPI_Init(&argc, &argv);
  const char *argv0 = argc > 0 ? argv[0] : program_name;
  Context *ctx = internal::create_context(program_name, /*use_mpi=*/true);
  setup(ctx);

  // Options (options.h), each declared once: --help lists them by group.
  // Every rank parses the same arguments and reports the same errors, with
  // no collective.
  int64_t steps = ctx->steps;
  std::string save_path, init_path, dump_path;
  int64_t save_every = 0;
  bool save_bf16 = false; // --save-dtype bf16
  int64_t eval_every = 0, eval_batches = 4;
  bool eval_batches_set = false;
  std::string eval_data, dump_eval_path;
  std::string prompt = "The ";
  int64_t generate = 0;
  float temperature = 0.8f;
  bool quiet = false, prompt_set = false, temperature_set = false;
  internal::ReportOptions report; // --log-json, --trace, ... (progress.cpp)
  internal::CheckpointOptions ckpt;
  using internal::add_int_option, internal::add_number_option,
      internal::add_path_option, internal::add_value_option,
      internal::invalid_value, internal::to_number;
  CLI::App app("", argv0);
  // No CLI11 help flag: it would act only after every value was checked.
  // Ours (-h, --help, below) acts where it comes on the command line.
  app.set_help_flag();
  app.formatter(internal::help_formatter());
  app.footer(kHelpFooter);

  const char *group = "Training";
  add_int_option(app, "--steps", "N",
                 "run N training steps instead of the compiled number", steps,
                 0, 1000000000LL)
      ->default_str(std::to_string(ctx->steps))
      ->group(group);
  add_number_option(app, "--timeout", "S",
                    "abort the job when a rank waits more than S seconds for "
                    "the others (a collective, a receive): one line names the "
                    "rank, the step, what it waited for and who is missing; "
                    "exit code 3; 0 = wait forever",
                    ctx->timeout_s, 0, 1e9, "seconds >= 0; 0 = no timeout")
      ->default_str(number_str(ctx->timeout_s))
      ->group(group);
  add_value_option(
      app, "--loss-scale", "S",
      std::string("initial loss scale of a plan with loss_scale = dynamic "
                  "(halved on an overflow, which skips the step, doubled "
                  "after 2000 clean steps)") +
          (ctx->dynamic_loss_scale ? "" : "; not this program's plan"),
      [ctx](const std::string &v) {
        double x = 0;
        if (!ctx->dynamic_loss_scale)
          return std::string("--loss-scale: this program has no dynamic loss "
                             "scaling (compile a plan with 'loss_scale = "
                             "dynamic')");
        if (!to_number(v, x) || !(x >= 1e-30 && x <= 1e30))
          return invalid_value(v, "--loss-scale", "a number in [1e-30, 1e30]");
        ctx->loss_scale = (float)x;
        return std::string();
      })
      ->default_str(ctx->dynamic_loss_scale ? number_str(ctx->loss_scale) : "")
      ->group(group);

  group = "Outputs";
  add_path_option(app, "--save", "PATH",
                  "after the last step, write all parameters to PATH "
                  "(safetensors)",
                  save_path)
      ->group(group);
  add_int_option(app, "--save-every", "N",
                 "also write them every N steps, to PATH with -stepNNNNNN "
                 "before its extension (needs --save)",
                 save_every, 1)
      ->group(group);
  add_path_option(app, "--save-init", "PATH",
                  "before step 1, write the initial parameters to PATH "
                  "(safetensors)",
                  init_path)
      ->group(group);
  add_value_option(app, "--save-dtype", "f32|bf16",
                   "element type of --save, --save-every and --save-init: f32 "
                   "(the trained values) or bf16 (rounded to nearest even, "
                   "half the bytes); checkpoints stay f32",
                   [&save_bf16](const std::string &v) {
                     if (v != "bf16" && v != "f32")
                       return invalid_value(v, "--save-dtype", "f32 or bf16");
                     save_bf16 = v == "bf16";
                     return std::string();
                   })
      ->default_str("f32")
      ->group(group);
  add_path_option(app, "--dump-step0", "PATH",
                  "after step 1, write the tensors the program observed in it "
                  "to PATH (safetensors): 'logits' (rank 0's rows of the "
                  "batch) and 'grad/<param>' (gradients before clipping); "
                  "whole tensors on one rank only: run it with one rank",
                  dump_path)
      ->group(group);

  internal::add_checkpoint_options(app, ctx, ckpt);

  group = "Evaluation";
  add_int_option(app, "--eval-every", "N",
                 "after every N-th step, evaluate the model (batch norm with "
                 "its running statistics, no dropout) on held-out batches and "
                 "print their loss and accuracy (image classifiers)",
                 eval_every, 1)
      ->group(group);
  add_int_option(app, "--eval-batches", "K",
                 "held-out batches per evaluation, each of the global batch "
                 "size",
                 eval_batches, 1, 1000000)
      ->each([&](const std::string &) { eval_batches_set = true; })
      ->default_str(std::to_string(eval_batches))
      ->group(group);
  add_path_option(app, "--eval-data", "PATTERN",
                  "CIFAR-10 files to evaluate on (a glob, e.g. "
                  "cifar/test_batch.bin); generated images evaluate on "
                  "samples training never draws",
                  eval_data, "pattern")
      ->group(group);
  add_path_option(app, "--dump-eval", "PATH",
                  "write the first evaluation's first batch to PATH "
                  "(safetensors): 'input/<x>', 'label/<y>' and 'logits' "
                  "(rank 0's rows)",
                  dump_eval_path)
      ->group(group);

  group = "Generation";
  add_value_option(
      app, "--generate", "N",
      "after training, sample N tokens (at most " +
          std::to_string(kMaxGenerate) +
          ") with the model's forward function and print them "
          "(byte-level models); progress goes to stderr",
      [&generate](const std::string &v) {
        double x = 0;
        if (!to_number(v, x) || x < 0 || x != std::floor(x) || x > kMaxGenerate)
          return invalid_value(v, "--generate",
                               "an integer from 0 to " +
                                   std::to_string(kMaxGenerate) +
                                   ", the most tokens one run samples: each "
                                   "token is one forward pass");
        generate = int64_t(x);
        return std::string();
      })
      ->group(group);
  add_value_option(app, "--prompt", "TEXT",
                   "the text generation starts from (one token per byte)",
                   [&](const std::string &v) {
                     prompt = v;
                     prompt_set = true;
                     return std::string();
                   })
      ->default_str("\"" + prompt + "\"")
      ->group(group);
  add_value_option(
      app, "--temperature", "T", "sampling temperature, 0 = greedy",
      [&](const std::string &v) {
        double x = 0;
        if (!to_number(v, x) || x < 0 || !(x <= 100))
          return invalid_value(v, "--temperature", "a number from 0 to 100");
        temperature = float(x);
        temperature_set = true;
        return std::string();
      })
      ->default_str(number_str(temperature))
      ->group(group);

  internal::add_flag_option(app, "--quiet",
                            "do not print one line per step (nor the "
                            "progress line)",
                            [&quiet] { quiet = true; })
      ->group("Reporting");
  internal::add_report_options(app, report);
  internal::add_flag_option(app, "-h,--help", "print this help and exit", [] {
    throw CLI::CallForHelp();
  })->group("Help");

  std::string error;
  internal::ParseResult parsed =
      internal::parse_options(app, argc, argv, error);
  if (parsed == internal::ParseResult::Help) {
    if (ctx->rank == 0) {
      std::printf("%s", app.help().c_str());
      std::printf("Runs the training plan '%s' compiled for %lld rank(s) "
                  "(%s): launch it with %s.\n",
                  program_name, (long long)mesh_ranks(ctx),
                  mesh_str(ctx).c_str(),
                  launch_command(mesh_ranks(ctx), argv0).c_str());
      std::fflush(stdout);
    }
    delete ctx;
    MPI_Finalize();
    return 0;
  }
  if (error.empty() && save_every > 0 && save_path.empty())
    error = "--save-every needs --save PATH to name the files";
  if (error.empty() && eval_every == 0 &&
      (eval_batches_set || !eval_data.empty() || !dump_eval_path.empty()))
    error = std::string(eval_batches_set     ? "--eval-batches"
                        : !eval_data.empty() ? "--eval-data"
                                             : "--dump-eval") +
            " needs --eval-every N (evaluate after every N steps)";
  if (error.empty() && !dump_eval_path.empty() && eval_every > steps)
    error = "--dump-eval writes what the first evaluation observed but the "
            "run evaluates first after step " +
            std::to_string(eval_every) + " of " + std::to_string(steps) +
            "; lower --eval-every";
  if (error.empty() && eval_every > 0 && !internal::is_classifier(ctx))
    error = "--eval-every evaluates image classifiers (generated images or "
            "CIFAR-10); this program trains on " +
            std::string(ctx->data_kind == DataTokenShards
                            ? "token shards"
                            : "generated regression data");
  if (error.empty() && eval_every > 0 && ctx->data_kind == DataCifar10 &&
      eval_data.empty())
    error = "evaluating a CIFAR-10 model needs --eval-data PATTERN, the "
            "held-out files (e.g. --eval-data 'cifar/test_batch.bin')";
  if (error.empty() && !eval_data.empty() && ctx->data_kind != DataCifar10)
    error = "--eval-data names CIFAR-10 files, but this program trains on "
            "generated images: it evaluates on generated samples that "
            "training never draws; drop --eval-data";
  if (error.empty())
    error =
        internal::check_checkpoint_usage(ctx, ckpt, steps, !dump_path.empty());
  if (error.empty() && !dump_path.empty() && steps < 1)
    error = "--dump-step0 writes what step 1 observed but the run has no "
            "step (--steps 0); run at least one step";
  if (!error.empty()) {
    // The error, then the usage line of --help and where the options are.
    std::string help = app.help();
    std::fprintf(stderr, "%s: error: %s\n%sRun '%s --help' for the options.\n",
                 program_name, error.c_str(),
                 help.substr(0, help.find('\n') + 1).c_str(), argv0);
    std::fflush(stderr);
    delete ctx;
    MPI_Finalize();
    return 2;
  }

  // World size check, before any collective.
  int64_t need = mesh_ranks(ctx);
  if (need != ctx->world) {
    std::fprintf(stderr,
                 "%s: error: this program was compiled for %lld rank%s (%s) "
                 "but was started with %d; launch it with %s\n",
                 program_name, (long long)need, need == 1 ? "" : "s",
                 mesh_str(ctx).c_str(), ctx->world,
                 launch_command(need, argv0).c_str());
    std::fflush(stderr);
    delete ctx;
    MPI_Finalize();
    return 1;
  }

  // What the options need, checked by every rank before any collective and
  // before step 1: one line per problem, exit code 1.
  std::vector<std::string> problems = check_run_options(
      ctx,
      {{"--save", save_path},
       {"--save-init", init_path},
       {"--dump-step0", dump_path},
       {"--dump-eval", dump_eval_path},
       {"--log-json", report.log_json},
       {"--trace", report.trace.empty()
                       ? report.trace
                       : trace::rank_path(report.trace, ctx->rank)}},
      generate, prompt, prompt_set, temperature_set);
  if (!problems.empty()) {
    for (const std::string &p : problems)
      std::fprintf(stderr, "%s: error: %s\n", program_name, p.c_str());
    std::fflush(stderr);
    delete ctx;
    MPI_Finalize();
    return 1;
  }

  // Training data files, checked by every rank before any collective.
  if (!ctx->inputs.empty() &&
      (ctx->data_kind == DataTokenShards || ctx->data_kind == DataCifar10)) {
    validate(ctx); // the description first (fatal: a code generator bug)
    std::string data_error = internal::open_training_data(ctx);
    if (!data_error.empty()) {
      std::fprintf(stderr, "planrt: error: %s\n", data_error.c_str());
      std::fflush(stderr);
      delete ctx;
      MPI_Finalize();
      return 1;
    }
  }

  // --eval-data: checked by every rank before any collective.
  if (!eval_data.empty()) {
    std::string data_error = internal::open_cifar_files(
        eval_data, ctx->cifar_eval_files, ctx->cifar_eval_records,
        "download CIFAR-10's binary version (test_batch.bin)");
    if (!data_error.empty()) {
      std::fprintf(stderr, "planrt: error: --eval-data: %s\n",
                   data_error.c_str());
      std::fflush(stderr);
      delete ctx;
      MPI_Finalize();
      return 1;
    }
  }
  ctx->eval_every = eval_every;
  ctx->eval_batches = eval_batches;
  ctx->dump_eval_path = dump_eval_path;

  // Checkpoint directory, --resume and --init-from: checked on every rank
  // before step 1 (collective; exits 1 on a problem), loaded after start.
  ckpt.dump_step0 = !dump_path.empty();
  ctx->run_steps = steps; // the lr schedule's default decay (checkpoints)
  internal::prepare_checkpoints(ctx, ckpt, steps);
  internal::start(ctx);
  if (!report.trace.empty()) { // collective: the ranks agree on a time base
    std::string trace_error = trace::open(ctx, report.trace);
    if (!trace_error.empty()) {
      std::fprintf(stderr, "%s: error: %s\n", program_name,
                   trace_error.c_str());
      std::fflush(stderr);
      internal::destroy_context(ctx);
      MPI_Finalize();
      return 1;
    }
  }
  internal::report_open(ctx, report);
  internal::load_checkpoints(ctx, ckpt);
  ctx->save_bf16 = save_bf16;
  if (!init_path.empty()) // collective when parameters are sharded
    internal::save_safetensors(ctx, init_path, "--save-init");
  ctx->save_every = save_every;
  ctx->save_path = save_path;
  internal::set_dump_step0(ctx, dump_path);
  internal::begin_training(ctx);
  internal::train(ctx, step, steps, quiet);
  internal::report_end_training(ctx);
  internal::end_training(ctx);
  if (ctx->stop_signal) { // stopped by SIGTERM / SIGUSR1 (after_step)
    internal::destroy_context(ctx);
    MPI_Finalize();
    return 0;
  }
  if (!save_path.empty()) // collective when parameters are sharded
    internal::save_safetensors(ctx, save_path, "--save");
  if (generate > 0) { // collective: every rank runs the forward function
    std::string text = internal::generate(ctx, prompt, generate, temperature);
    if (ctx->rank == 0) {
      std::printf("sample: %s", prompt.c_str());
      for (char c : text)
        std::putchar(c == '\n' || (c >= 32 && c < 127) ? c : '?');
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  if (ctx->pipeline_axis >= 0)
    pipeline_report(ctx);
  internal::report_summary(ctx, steps); // collective with --log-json
  if (ctx->expected_set && !memory_report(ctx)) {
    internal::destroy_context(ctx);
    MPI_Finalize();
    return 1;
  }
  if (ctx->rank == 0) { // the last trained step's loss, whatever followed
    std::printf("done: %d steps, final loss %.9e", (int)steps,
                (double)ctx->final_loss);
    if (ctx->first_step > steps && steps > 0)
      std::printf(" (of step %lld, from the checkpoint: nothing was left to "
                  "train)",
                  (long long)ctx->final_step);
    std::printf("\n");
    std::fflush(stdout);
  }
  internal::destroy_context(ctx);
  MPI_Finalize();
  return 0;
}

} // namespace planrt
