//===- trace.h - --trace: a Chrome trace per rank of what ran ---*- C++ -*-===//
//
// Private to the runtime libraries (compiled into both backends; no MPI or
// CUDA headers here, ops_impl.inc includes it from the .cu file).
//
// With --trace FILE every rank writes FILE with ".rank<R>" inserted before
// its extension (trace.json -> trace.rank0.json): Chrome's JSON array format
// (one event per line; the closing "]" is written at the end of the run, and
// Chrome and Perfetto also load a file cut short by a crash without it).
// Events are "X" slices on pid = world rank, tid 0: every step, every
// pipeline unit (named like planc --emit=schedule: F3, B3, W3 = phase letter
// and microbatch), every collective and send/recv with its mesh axis and
// bytes, and the heavy compute ops. Non-blocking all-reduces are also async
// spans ("b"/"e") from their start to their wait. Timestamps are
// microseconds of wall-clock time: rank 0's system clock at a barrier after
// the trace was opened, advanced by each rank's monotonic clock (so the
// ranks agree to the barrier's precision even across machines).
//
// Off (no --trace), ctx->trace is null and every hook is one null test.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_TRACE_H
#define PLANRT_LIB_TRACE_H

#include "context.h"

#include <chrono>
#include <cstdint>
#include <string>

namespace planrt {
namespace trace {

using Clock = std::chrono::steady_clock;

/// FILE with ".rank<R>" before its extension ("t.json" -> "t.rank0.json",
/// "t" -> "t.rank0").
std::string rank_path(const std::string &path, int rank);
/// Opens this rank's file and synchronizes the clocks (collective with MPI:
/// every rank calls it). "" or why the file cannot be written.
std::string open(Context *ctx, const std::string &path);
/// Writes what is buffered (called at the end of each step).
void flush(Context *ctx);

/// Names of the mesh axes of `axis_mask` joined by "+" ("dp", "dp+tp").
std::string mask_name(const Context *ctx, int64_t axis_mask);

/// One "X" slice [t0, t1) with `args` (a JSON object's members, without
/// braces, may be empty).
void slice(Context *ctx, const char *name, const char *cat,
           Clock::time_point t0, Clock::time_point t1, const std::string &args);
/// Async span of a non-blocking collective on `slot`: begins now / ends now.
void async_begin(Context *ctx, int64_t slot, const std::string &args);
void async_end(Context *ctx, int64_t slot);

/// The open pipeline unit: unit_begin records its start, unit_end the slice.
void unit_begin(Context *ctx);
void unit_end(Context *ctx);

/// Times its lifetime as a slice when tracing is on. Set the fields that
/// apply; the slice's args name them (axis from axis_mask or axis, peer,
/// bytes, slot).
struct Scope {
  Context *ctx;
  const char *name;
  const char *cat;
  int64_t axis_mask = -1, axis = -1, peer = -1, bytes = -1, slot = -1;
  Clock::time_point t0;
  Scope(Context *ctx, const char *name, const char *cat)
      : ctx(ctx), name(name), cat(cat) {
    if (ctx->trace)
      t0 = Clock::now();
  }
  ~Scope() {
    if (ctx->trace)
      end();
  }
  Scope(const Scope &) = delete;
  Scope &operator=(const Scope &) = delete;
  void end();
  /// The args of this scope (JSON members), also used for async spans.
  std::string args() const;
};

} // namespace trace
} // namespace planrt

#endif // PLANRT_LIB_TRACE_H
