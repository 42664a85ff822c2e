//===- progress.cpp - Progress line, --log-json, MFU ----------------------===//
//
// See progress.h and docs/runtime.md.
//===----------------------------------------------------------------------===//

#include "progress.h"

#include "control.h"
#include "options.h"

#include "watchdog.h"
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace planrt {

using Clock = std::chrono::steady_clock;

struct Progress {
  bool interactive = false;  // the in-place line (rank 0)
  bool line_open = false;    // a progress line was printed without newline
  std::FILE *json = nullptr; // --log-json (rank 0)
  bool log_json = false;     // --log-json given (every rank: the summary)
  double peak = 0;           // FLOP/s of one device, 0: unknown
  std::string peak_source;
  Clock::time_point start, first_step_end, last_print;
  double step_seconds = 0; // sum of the step times
  double mfu_sum = 0;
  int64_t steps_done = 0;
};

void ProgressDeleter::operator()(Progress *p) const {
  if (!p)
    return;
  if (p->json)
    std::fclose(p->json);
  delete p;
}

namespace internal {

namespace {

/// A JSON number (%.9e: the digits of the step line's loss), null if not
/// finite.
std::string num(double v, const char *fmt = "%.9e") {
  if (!std::isfinite(v))
    return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string json_str(const std::string &s) { return internal::json_quote(s); }

/// "1:02:03" or "2:03".
std::string clock_str(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0)
    return "?";
  long long s = (long long)std::llround(seconds);
  char buf[48];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", s / 3600,
                  (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", s / 60, s % 60);
  return buf;
}

/// Whether rank 0's stdout is a terminal a person looks at. Open MPI gives
/// every rank a pseudo-terminal as stdout even when mpirun's own output goes
/// to a file or a pipe, so under Open MPI the launcher's stdout (our parent,
/// for the ranks mpirun starts on its own machine) must be a terminal too.
bool stdout_is_terminal() {
  if (!isatty(STDOUT_FILENO))
    return false;
  const char *term = std::getenv("TERM");
  if (term && std::strcmp(term, "dumb") == 0)
    return false;
  if (!std::getenv("OMPI_COMM_WORLD_SIZE"))
    return true;
  char link[64], target[256];
  std::snprintf(link, sizeof(link), "/proc/%d/fd/1", (int)getppid());
  ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0)
    return false;
  target[n] = 0;
  return std::strncmp(target, "/dev/pts/", 9) == 0 ||
         std::strncmp(target, "/dev/tty", 8) == 0;
}

int terminal_columns() {
  struct winsize w;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0)
    return w.ws_col;
  return 0;
}

} // namespace

void add_report_options(CLI::App &app, ReportOptions &o) {
  add_value_option(app, "--progress", "MODE",
                   "auto: one line updated in place when stdout is a "
                   "terminal, one line per step otherwise; always; never",
                   [&o](const std::string &v) {
                     if (v != "auto" && v != "always" && v != "never")
                       return invalid_value(v, "--progress",
                                            "auto, always or never");
                     o.progress = v;
                     return std::string();
                   })
      ->default_str(o.progress)
      ->group("Reporting");
  add_path_option(app, "--log-json", "PATH",
                  "write one JSON object per step to PATH (rank 0; step, "
                  "loss, lr, grad_norm, tokens_per_s, step_time_s, mfu, "
                  "elapsed_s) and a summary object at the end (memory per "
                  "rank by kind)",
                  o.log_json)
      ->group("Reporting");
  add_path_option(app, "--trace", "PATH",
                  "write a Chrome trace of what ran per rank to PATH with "
                  ".rankR before its extension (steps, pipeline units, "
                  "collectives, send/recv); merge them with "
                  "scripts/merge-traces.py",
                  o.trace)
      ->group("Reporting");
  add_value_option(app, "--peak-flops", "F",
                   "peak FLOP/s of one device for the MFU (also "
                   "PLANRT_PEAK_FLOPS; default: the plan's cluster GPU on "
                   "cuda, none on the host)",
                   [&o](const std::string &v) {
                     double x = 0;
                     if (!to_number(v, x) || !(x > 0) || !std::isfinite(x))
                       return invalid_value(
                           v, "--peak-flops",
                           "FLOP/s of one device, e.g. 19.5e12");
                     o.peak_flops = x;
                     return std::string();
                   })
      ->group("Reporting");
}

double gpu_peak_flops(const std::string &gpu, const std::string &precision) {
  // Dense (no sparsity) peaks of one GPU from NVIDIA's datasheets, SXM
  // parts: bf16 on tensor cores, fp32 without tensor cores (what cuBLASLt
  // with CUBLAS_COMPUTE_32F runs).
  struct Row {
    const char *gpu;
    double bf16, fp32, tf32;
  };
  static const Row table[] = {
      {"a100", 312e12, 19.5e12, 156e12}, {"a100_40gb", 312e12, 19.5e12, 156e12},
      {"h100", 989e12, 67e12, 494.7e12}, {"h200", 989e12, 67e12, 494.7e12},
      {"b200", 2250e12, 75e12, 1100e12}, {"l40s", 362e12, 91.6e12, 183e12},
  };
  std::string g = gpu;
  for (char &c : g)
    c = (char)std::tolower((unsigned char)c);
  for (const Row &r : table)
    if (g == r.gpu)
      return precision == "bf16"   ? r.bf16
             : precision == "tf32" ? r.tf32
                                   : r.fp32;
  return 0;
}

void report_open(Context *ctx, const ReportOptions &o) {
  auto p = std::make_unique<Progress>();
  if (o.peak_flops > 0) {
    p->peak = o.peak_flops;
    p->peak_source = "--peak-flops";
  } else if (const char *env = std::getenv("PLANRT_PEAK_FLOPS"); env && *env) {
    char *end = nullptr;
    double v = std::strtod(env, &end);
    if (*end || !(v > 0) || !std::isfinite(v))
      fatal("PLANRT_PEAK_FLOPS='%s' is not a positive number of FLOP/s "
            "(e.g. 19.5e12); fix or unset it",
            env);
    p->peak = v;
    p->peak_source = "PLANRT_PEAK_FLOPS";
  } else if (std::strcmp(backend::name(), "cuda") == 0 &&
             !ctx->cluster_gpu.empty()) {
    // A 16-bit plan's GEMMs run on the tensor cores (bf16 and fp16 have
    // the same dense peak), a tf32 plan's on them in TF32; an fp32 plan's
    // compute in fp32.
    const std::string &cp = ctx->compute_precision;
    const char *column = cp == "fp32" ? "fp32" : cp == "tf32" ? "tf32" : "bf16";
    p->peak = gpu_peak_flops(ctx->cluster_gpu, column);
    if (p->peak > 0)
      p->peak_source = "cluster gpu " + ctx->cluster_gpu + " (" + column + ")";
  }
  p->log_json = !o.log_json.empty();
  if (ctx->rank == 0) {
    p->interactive = o.progress == "always" ||
                     (o.progress == "auto" && stdout_is_terminal());
    if (p->log_json) {
      p->json = std::fopen(o.log_json.c_str(), "w");
      if (!p->json)
        fatal("--log-json: cannot write '%s': %s", o.log_json.c_str(),
              std::strerror(errno));
    }
  }
  p->start = p->last_print = Clock::now();
  ctx->progress.reset(p.release());
}

void report_step(Context *ctx, int64_t step, int64_t steps, double ms,
                 bool quiet) {
  Progress *p = ctx->progress.get();
  if (ctx->rank != 0)
    return;
  if (!p) { // internal::train without planrt::run: the plain lines
    if (!quiet) {
      std::printf("%s\n", step_line(ctx, step, steps, ms).c_str());
      std::fflush(stdout);
    }
    return;
  }
  Clock::time_point now = Clock::now();
  double elapsed = std::chrono::duration<double>(now - p->start).count();
  if (p->steps_done == 0)
    p->first_step_end = now;
  p->steps_done++;
  double seconds = ms * 1e-3;
  p->step_seconds += seconds;
  double mfu = p->peak > 0 && ctx->step_flops > 0 && seconds > 0
                   ? ctx->step_flops / seconds / p->peak
                   : std::nan("");
  if (std::isfinite(mfu))
    p->mfu_sum += mfu;
  int64_t tokens = global_batch_tokens(ctx);
  double tok_s =
      tokens > 0 && seconds > 0 ? (double)tokens / seconds : std::nan("");
  if (p->json) {
    std::string line =
        "{\"type\":\"step\",\"step\":" + std::to_string(step) +
        ",\"steps\":" + std::to_string(steps) +
        ",\"loss\":" + num(ctx->last_loss) +
        ",\"lr\":" + num(ctx->lr_reported ? ctx->last_lr : std::nan("")) +
        ",\"grad_norm\":" +
        num(ctx->grad_norm_reported ? ctx->last_grad_norm : std::nan("")) +
        ",\"tokens_per_s\":" + num(tok_s, "%.1f") +
        ",\"step_time_s\":" + num(seconds, "%.6f") +
        ",\"mfu\":" + num(mfu, "%.6f") +
        ",\"elapsed_s\":" + num(elapsed, "%.3f") + "}\n";
    std::fwrite(line.data(), 1, line.size(), p->json);
    std::fflush(p->json);
  }
  if (quiet)
    return;
  char mfu_buf[32];
  if (std::isfinite(mfu))
    std::snprintf(mfu_buf, sizeof(mfu_buf), "%.1f%%", 100 * mfu);
  else
    std::snprintf(mfu_buf, sizeof(mfu_buf), "n/a");
  if (!p->interactive) {
    std::string line = step_line(ctx, step, steps, ms);
    if (std::isfinite(mfu))
      line += std::string(" | MFU ") + mfu_buf;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    return;
  }
  // The in-place line, at most 10 times a second (and the last step).
  if (step != steps && step != 1 &&
      std::chrono::duration<double>(now - p->last_print).count() < 0.1)
    return;
  p->last_print = now;
  double per_step =
      p->steps_done >= 2
          ? std::chrono::duration<double>(now - p->first_step_end).count() /
                double(p->steps_done - 1)
          : elapsed;
  double eta = per_step * double(std::max<int64_t>(0, steps - step));
  char buf[512];
  int n =
      std::snprintf(buf, sizeof(buf), "step %lld/%lld | loss %.4e",
                    (long long)step, (long long)steps, (double)ctx->last_loss);
  if (ctx->lr_reported)
    n += std::snprintf(buf + n, sizeof(buf) - n, " | lr %.3e",
                       (double)ctx->last_lr);
  if (ctx->grad_norm_reported)
    n += std::snprintf(buf + n, sizeof(buf) - n, " | grad norm %.3e",
                       (double)ctx->last_grad_norm);
  if (std::isfinite(tok_s))
    n += std::snprintf(buf + n, sizeof(buf) - n, " | %.0f %s", tok_s,
                       internal::batch_unit(ctx));
  else
    n += std::snprintf(buf + n, sizeof(buf) - n, " | %.2f ms/step", ms);
  std::snprintf(buf + n, sizeof(buf) - n, " | MFU %s | elapsed %s | ETA %s",
                mfu_buf, clock_str(elapsed).c_str(), clock_str(eta).c_str());
  std::string line = buf;
  int cols = terminal_columns();
  if (cols > 1 && (int)line.size() > cols - 1)
    line.resize((size_t)cols - 1); // a wrapped line cannot be rewritten
  std::printf("\r%s\033[K", line.c_str());
  std::fflush(stdout);
  p->line_open = true;
}

void report_eval(Context *ctx, int64_t step, int64_t samples) {
  if (ctx->rank != 0)
    return;
  Progress *p = ctx->progress.get();
  float acc = ctx->last_eval_accuracy;
  if (p && p->json) {
    std::string line =
        "{\"type\":\"eval\",\"step\":" + std::to_string(step) +
        ",\"loss\":" + num(ctx->last_eval_loss) +
        ",\"accuracy\":" + num(acc >= 0 ? acc : std::nan(""), "%.6f") +
        ",\"samples\":" + std::to_string(samples) + "}\n";
    std::fwrite(line.data(), 1, line.size(), p->json);
    std::fflush(p->json);
  }
  if (p && p->line_open) { // the next step rewrites its line below this one
    std::printf("\r\033[K");
    p->line_open = false;
  }
  std::printf("eval after step %lld | loss %.9e | acc %.4f | %lld samples\n",
              (long long)step, (double)ctx->last_eval_loss, (double)acc,
              (long long)samples);
  std::fflush(stdout);
}

void report_end_training(Context *ctx) {
  Progress *p = ctx->progress.get();
  if (p && p->line_open) {
    std::printf("\n");
    std::fflush(stdout);
    p->line_open = false;
  }
}

void report_summary(Context *ctx, int64_t steps) {
  Progress *p = ctx->progress.get();
  if (!p || !p->log_json)
    return;
  // Memory by kind: rank 0's and the most of any rank.
  // With the compiler's memory plan, also the measured peaks by kind
  // (gradients, activations, workspace) and the planned arena.
  // device_peak_bytes: everything planrt holds on the device at once
  // (persistent tensors, the arena's and the stash pool's highest bytes).
  // library_bytes: what the backend's libraries hold besides (cuBLASLt's
  // workspace, cuDNN attention's buffers), outside the plan.
  int64_t mine[11] = {ctx->param_bytes,
                      ctx->state_bytes,
                      (int64_t)ctx->arena_peak,
                      ctx->stash_peak_bytes,
                      ctx->live_peak[1],
                      ctx->live_peak[0],
                      ctx->live_peak[2],
                      ctx->planned_fns[0].bytes,
                      ctx->stash_high,
                      ctx->param_bytes + ctx->state_bytes + ctx->input_bytes +
                          (int64_t)ctx->arena_peak + ctx->stash_high,
                      backend::library_bytes(ctx)};
  int64_t most[11];
  std::copy(mine, mine + 11, most);
  std::vector<int64_t> peaks;
  if (ctx->pipeline_axis >= 0)
    peaks = pipeline_peaks(ctx);
  std::vector<int64_t> peaks_most = peaks;
  if (ctx->use_mpi && ctx->world > 1) {
    watchdog::reduce(ctx, mine, most, 11, MPI_INT64_T, MPI_MAX, 0,
                     MPI_COMM_WORLD, watchdog::group_op("the summary", -1));
    if (!peaks.empty())
      watchdog::reduce(ctx, peaks.data(), peaks_most.data(), (int)peaks.size(),
                       MPI_INT64_T, MPI_MAX, 0, MPI_COMM_WORLD,
                       watchdog::group_op("the summary", -1));
  }
  if (ctx->rank != 0 || !p->json)
    return;
  auto memory = [](const int64_t *m) {
    return "{\"params_bytes\":" + std::to_string(m[0]) +
           ",\"optimizer_state_bytes\":" + std::to_string(m[1]) +
           ",\"step_arena_peak_bytes\":" + std::to_string(m[2]) +
           ",\"stash_peak_bytes\":" + std::to_string(m[3]) +
           (m[7] >= 0
                ? ",\"gradients_peak_bytes\":" + std::to_string(m[4]) +
                      ",\"activations_peak_bytes\":" + std::to_string(m[5]) +
                      ",\"workspace_peak_bytes\":" + std::to_string(m[6]) +
                      ",\"planned_arena_bytes\":" + std::to_string(m[7]) +
                      ",\"stash_pool_bytes\":" + std::to_string(m[8])
                : std::string()) +
           ",\"device_peak_bytes\":" + std::to_string(m[9]) +
           ",\"library_bytes\":" + std::to_string(m[10]) + "}";
  };
  double elapsed =
      std::chrono::duration<double>(Clock::now() - p->start).count();
  int64_t tokens = global_batch_tokens(ctx);
  std::string line =
      "{\"type\":\"summary\",\"steps\":" + std::to_string(steps) +
      ",\"final_loss\":" + num(ctx->final_loss) +
      ",\"elapsed_s\":" + num(elapsed, "%.3f") + ",\"mean_step_time_s\":" +
      num(p->steps_done ? p->step_seconds / p->steps_done : std::nan(""),
          "%.6f") +
      ",\"tokens_per_s\":" +
      num(tokens > 0 && p->step_seconds > 0
              ? double(tokens) * p->steps_done / p->step_seconds
              : std::nan(""),
          "%.1f") +
      ",\"mfu\":" +
      num(p->steps_done && p->peak > 0 && ctx->step_flops > 0
              ? ctx->step_flops * p->steps_done / p->step_seconds / p->peak
              : std::nan(""),
          "%.6f") +
      ",\"step_flops_per_rank\":" +
      num(ctx->step_flops > 0 ? ctx->step_flops : std::nan(""), "%.6e") +
      ",\"peak_flops\":" + num(p->peak > 0 ? p->peak : std::nan(""), "%.6e") +
      ",\"peak_flops_source\":" +
      (p->peak > 0 ? json_str(p->peak_source) : std::string("null")) +
      ",\"ranks\":" + std::to_string(ctx->world) +
      ",\"backend\":" + json_str(backend::name()) +
      ",\"memory\":{\"rank0\":" + memory(mine) +
      ",\"max_over_ranks\":" + memory(most) + ",\"compiler\":" +
      (ctx->expected_set
           ? "{\"params_bytes\":" + std::to_string(ctx->expected_params) +
                 ",\"grads_bytes\":" + std::to_string(ctx->expected_grads) +
                 ",\"optimizer_state_bytes\":" +
                 std::to_string(ctx->expected_state) + "}"
           : std::string("null")) +
      "}";
  if (!peaks_most.empty()) {
    line += ",\"pipeline_peak_in_flight\":[";
    for (size_t i = 0; i < peaks_most.size(); ++i)
      line += (i ? "," : "") + std::to_string(peaks_most[i]);
    line += "]";
  }
  line += "}\n";
  std::fwrite(line.data(), 1, line.size(), p->json);
  std::fflush(p->json);
}

} // namespace internal

void set_step_flops(Context *ctx, double flops) {
  if (!ctx)
    fatal("set_step_flops: null context");
  if (!(flops >= 0) || !std::isfinite(flops))
    fatal("set_step_flops: flops must be a finite number >= 0, got %g", flops);
  ctx->step_flops = flops;
}

void set_cluster_gpu(Context *ctx, const char *gpu) {
  if (!ctx)
    fatal("set_cluster_gpu: null context");
  ctx->cluster_gpu = gpu ? gpu : "";
}

void set_compute_precision(Context *ctx, const char *precision) {
  if (!ctx)
    fatal("set_compute_precision: null context");
  std::string p = precision ? precision : "";
  if (p != "fp32" && p != "tf32" && p != "bf16" && p != "fp16")
    fatal("set_compute_precision: '%s' is not fp32, tf32, bf16 or fp16",
          p.c_str());
  ctx->compute_precision = p;
}

} // namespace planrt
