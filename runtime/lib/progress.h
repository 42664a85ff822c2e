//===- progress.h - What a run reports per step ------------------*- C++
//-*-===//
//
// Private to the runtime libraries. The step report of planrt::run (rank 0):
//   - on a terminal, one progress line rewritten in place (step/total, loss,
//     lr, grad norm, tokens/s, MFU, elapsed, ETA);
//   - otherwise the step line of step_line(), one per step, exactly as
//     before (with " | MFU x%" appended when a peak FLOP/s is known);
//   - with --log-json FILE, one JSON object per step and a summary object.
// MFU = step FLOPs per rank (set_step_flops) / step time / peak FLOP/s of
// one device (--peak-flops, PLANRT_PEAK_FLOPS, or on the cuda backend the
// fp32 peak of the plan's cluster GPU, set_cluster_gpu); see
// docs/runtime.md.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_PROGRESS_H
#define PLANRT_LIB_PROGRESS_H

#include "context.h"

#include <string>

namespace CLI {
class App;
} // namespace CLI

namespace planrt {
namespace internal {

/// The options of the step report, as given on the command line.
struct ReportOptions {
  std::string progress = "auto"; // --progress auto | always | never
  std::string log_json;          // --log-json FILE
  std::string trace;             // --trace FILE (lib/trace.cpp)
  double peak_flops = 0;         // --peak-flops F (0: not given)
};

/// Declares these options (group "Reporting"), parsed into `o`.
void add_report_options(CLI::App &app, ReportOptions &o);

/// Dense peak FLOP/s of one GPU of a kind of the plan's cluster section
/// ("a100", "a100_40gb", "h100", "h200", "b200", "l40s") for `precision`
/// ("fp32" or "bf16"); 0 for an unknown kind.
double gpu_peak_flops(const std::string &gpu, const std::string &precision);

/// Sets up the report on every rank (rank 0 opens --log-json; fatal if it
/// cannot: the path was checked before). Without it, report_step prints the
/// plain step lines.
void report_open(Context *ctx, const ReportOptions &o);
/// After step `step` of `steps` took `ms` (every rank calls it; rank 0
/// prints and logs).
void report_step(Context *ctx, int64_t step, int64_t steps, double ms,
                 bool quiet);
/// After the last step: ends the progress line.
void report_end_training(Context *ctx);
/// Rank 0: the line of an evaluation (--eval-every) from ctx->last_eval_loss
/// and last_eval_accuracy, after the in-place step line is cleared, and its
/// --log-json object.
void report_eval(Context *ctx, int64_t step, int64_t samples);
/// The --log-json summary object (collective when --log-json is on: every
/// rank calls it).
void report_summary(Context *ctx, int64_t steps);

} // namespace internal
} // namespace planrt

#endif // PLANRT_LIB_PROGRESS_H
