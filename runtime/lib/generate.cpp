//===- generate.cpp - Sampling text with the compiled forward function ----===//
//
// After training, `--generate N` runs the forward function that planc emits
// (plan_forward) N times: every rank fills its rows of the token input with
// the current context (the same on every row), the forward pass runs (it is
// collective, so every rank takes part), rank 0 samples the next token from
// the logits of row 0 at the last filled position, and broadcasts it.
//===----------------------------------------------------------------------===//
#include "context.h"

#include "planrt/context_parallel.h"
#include "planrt/internal.h"

#include "control.h"

#include "watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace planrt {
namespace internal {

namespace {
/// Without a terminal, --generate reports its progress every this many
/// tokens on rank 0's stderr.
constexpr int64_t kProgressEvery = 256;

/// A uniform double in [0, 1) from a splitmix64 step of `state`.
double uniform(uint64_t &state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

int32_t sample(const float *logits, int64_t vocab, float temperature,
               uint64_t &rng) {
  int64_t best = std::max_element(logits, logits + vocab) - logits;
  if (temperature <= 0)
    return int32_t(best);
  std::vector<double> p(vocab);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v)
    sum += p[v] = std::exp(double(logits[v] - logits[best]) / temperature);
  double u = uniform(rng) * sum;
  for (int64_t v = 0; v < vocab; ++v)
    if ((u -= p[v]) <= 0)
      return int32_t(v);
  return int32_t(vocab - 1);
}
} // namespace

std::string generate(Context *ctx, const std::string &prompt, int64_t count,
                     float temperature) {
  InputDesc *tokens = nullptr, *labels = nullptr;
  for (InputDesc &in : ctx->inputs)
    if (in.t.dtype == I32)
      (in.role == RoleLabel ? labels : tokens) = &in;
  if (!ctx->forward || !tokens)
    fatal("--generate needs a model with token inputs and a forward "
          "function; this program has %s",
          ctx->forward ? "no token input" : "no forward function");
  // With context parallelism each rank holds two chunks of every sequence
  // (kernels::SeqPart): it feeds its positions of the context, and the rank
  // holding the last one samples.
  int64_t rows = tokens->t.shape[0], local = tokens->t.shape[1];
  kernels::SeqPart part;
  if (tokens->seq_axis >= 0)
    part = {ctx->coords[tokens->seq_axis], ctx->axis_sizes[tokens->seq_axis]};
  int64_t seq = local * part.G;
  // Bytes are token ids 0..255 (read unsigned: "é" is 0xc3 0xa9, not
  // negative ids); planrt::run checked them against the vocabulary.
  std::vector<int32_t> context;
  for (unsigned char c : prompt)
    context.push_back(int32_t(c));
  if (context.empty())
    context.push_back('\n');
  std::string out;
  auto peaks = ctx->in_flight_peak; // generation's forward units not counted
  uint64_t rng = uint64_t(ctx->seed) * 0x2545F4914F6CDD1DULL + 1;
  // Progress on rank 0's stderr: a line rewritten in place on a terminal
  // (at most 4 times a second), otherwise a line every kProgressEvery tokens.
  bool tty = ctx->rank == 0 && isatty(fileno(stderr));
  auto t0 = std::chrono::steady_clock::now(), shown = t0;
  auto progress = [&](int64_t done) {
    auto now = std::chrono::steady_clock::now();
    double s = std::chrono::duration<double>(now - t0).count();
    if (tty) {
      if (done < count && now - shown < std::chrono::milliseconds(250))
        return;
      shown = now;
      std::fprintf(stderr, "\rgenerating: %lld/%lld tokens, %.1f tok/s ",
                   (long long)done, (long long)count, s > 0 ? done / s : 0.0);
      if (done == count)
        std::fprintf(stderr, "\r\033[K");
    } else if (ctx->rank == 0 && done % kProgressEvery == 0 && done < count) {
      std::fprintf(stderr, "generate: %lld/%lld tokens, %.1f tok/s\n",
                   (long long)done, (long long)count, s > 0 ? done / s : 0.0);
    } else {
      return;
    }
    std::fflush(stderr);
  };
  for (int64_t k = 0; k < count; ++k) {
    // The last `seq` tokens of the context, left-aligned in every row; the
    // positions after them do not affect causal attention at `last`.
    int64_t n = std::min<int64_t>(seq, int64_t(context.size()));
    int64_t last = n - 1;
    std::vector<int32_t> whole(size_t(rows * seq), 0);
    for (int64_t r = 0; r < rows; ++r)
      std::copy(context.end() - n, context.end(), whole.begin() + r * seq);
    std::vector<int32_t> ids(size_t(rows * local));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < local; ++t)
        ids[size_t(r * local + t)] =
            whole[size_t(r * seq + part.position(t, local))];
    int64_t lastRow = part.local_row(last, local); // -1: another rank's
    arena_reset(ctx);
    from_host_ids(ctx, &tokens->t, ids);
    if (labels)
      from_host_ids(ctx, &labels->t, std::vector<int32_t>(ids.size(), 0));
    ctx->capture = "logits";
    ctx->captured_shape.clear();
    ctx->forward(ctx);
    ctx->capture.clear();
    ctx->in_flight.clear(); // forward units only: nothing to wait for
    pipeline_end_step(ctx, "--generate");
    int32_t next = 0;
    // The draw is the same whichever rank samples (the sampler may change
    // from token to token): every rank advances its generator alike.
    uint64_t draw = rng;
    if (temperature > 0)
      uniform(rng);
    // With a pipeline the logits are observed on the last stage's ranks,
    // with context parallelism the last position's on the ranks holding it:
    // the lowest rank that captured them samples.
    int sampler = 0;
    if ((ctx->pipeline_axis >= 0 || part.G > 1) && ctx->use_mpi &&
        ctx->world > 1) {
      int mine =
          ctx->captured_shape.empty() || lastRow < 0 ? ctx->world : ctx->rank;
      watchdog::allreduce(ctx, &mine, &sampler, 1, MPI_INT, MPI_MIN,
                          MPI_COMM_WORLD, watchdog::group_op("--generate", -1));
      if (sampler == ctx->world)
        sampler = 0; // nobody captured: rank 0 reports it below
    }
    if (ctx->rank == sampler) {
      if (ctx->captured_shape.size() != 3 || ctx->captured_shape[1] != local ||
          lastRow < 0)
        fatal("--generate: the forward function did not observe [rows, %lld, "
              "vocab] logits",
              (long long)local);
      int64_t vocab = ctx->captured_shape[2];
      int64_t classes = ctx->generation_classes > 0
                            ? std::min(ctx->generation_classes, vocab)
                            : vocab;
      next = sample(ctx->captured.data() + lastRow * vocab, classes,
                    temperature, draw);
    }
    if (ctx->use_mpi)
      watchdog::bcast(ctx, &next, 1, MPI_INT32_T, sampler, MPI_COMM_WORLD,
                      watchdog::group_op("--generate", -1));
    context.push_back(next);
    out.push_back(char(next));
    progress(k + 1);
  }
  ctx->in_flight_peak = peaks;
  return out;
}

} // namespace internal
} // namespace planrt
