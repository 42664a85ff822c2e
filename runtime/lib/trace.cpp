//===- trace.cpp - --trace: a Chrome trace per rank of what ran -----------===//
//
// See trace.h. Events are formatted as they happen into a stdio buffer and
// written out at the end of every step, so the file of a run that hangs or
// is killed holds every finished step.
//===----------------------------------------------------------------------===//

#include "trace.h"

#include "control.h"

#include "watchdog.h"

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>

namespace planrt {
namespace trace {

struct Trace {
  std::FILE *file = nullptr;
  std::string path;
  bool first = true;         // no event written yet (no comma before it)
  int64_t epoch_ns = 0;      // wall-clock time of `base`
  Clock::time_point base;    // the barrier after open
  Clock::time_point unit_t0; // start of the open pipeline unit
  std::map<int64_t, std::string> async_args; // busy slots
  int pid = 0;
};

void TraceDeleter::operator()(Trace *t) const {
  if (!t)
    return;
  if (t->file) {
    std::fputs("\n]\n", t->file);
    std::fclose(t->file);
  }
  delete t;
}

std::string rank_path(const std::string &path, int rank) {
  size_t slash = path.rfind('/');
  size_t dot = path.rfind('.');
  std::string tag = ".rank" + std::to_string(rank);
  // A dot that starts the file name (".trace") is not an extension.
  size_t name = slash == std::string::npos ? 0 : slash + 1;
  if (dot == std::string::npos || dot <= name)
    return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

namespace {

std::string json_str(const std::string &s) { return internal::json_quote(s); }

/// Wall-clock nanoseconds of `t`.
int64_t wall_ns(const Trace &tr, Clock::time_point t) {
  return tr.epoch_ns +
         std::chrono::duration_cast<std::chrono::nanoseconds>(t - tr.base)
             .count();
}

/// Microseconds with 3 decimals, exact for any epoch time.
std::string micros(int64_t ns) {
  char buf[48];
  if (ns < 0) // a time before the barrier (cannot happen for slices we time)
    std::snprintf(buf, sizeof(buf), "-%" PRId64 ".%03" PRId64, (-ns) / 1000,
                  (-ns) % 1000);
  else
    std::snprintf(buf, sizeof(buf), "%" PRId64 ".%03" PRId64, ns / 1000,
                  ns % 1000);
  return buf;
}

void emit(Trace &tr, const std::string &event) {
  if (!tr.first)
    std::fputs(",\n", tr.file);
  tr.first = false;
  std::fputs(event.c_str(), tr.file);
}

std::string coords_label(const Context *ctx) {
  std::string s;
  for (size_t a = 0; a < ctx->axis_names.size() && a < ctx->coords.size();
       ++a) {
    if (a)
      s += ", ";
    s += ctx->axis_names[a] + "=" + std::to_string(ctx->coords[a]);
  }
  return s;
}

} // namespace

std::string open(Context *ctx, const std::string &path) {
  auto tr = std::make_unique<Trace>();
  tr->path = rank_path(path, ctx->rank);
  tr->pid = ctx->rank;
  tr->file = std::fopen(tr->path.c_str(), "w");
  std::string error;
  if (!tr->file)
    error = "--trace: cannot write '" + tr->path + "': " + std::strerror(errno);
  else
    std::setvbuf(tr->file, nullptr, _IOFBF, 1 << 20);
  int bad = !error.empty(), any = bad;
  bool multi = ctx->use_mpi && ctx->world > 1;
  if (multi)
    watchdog::allreduce(ctx, &bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD,
                        watchdog::group_op("--trace", -1));
  if (any) {
    if (tr->file) {
      std::fclose(tr->file);
      std::remove(tr->path.c_str());
    }
    return bad ? error
               : "--trace: another rank could not write its trace file (see "
                 "its message)";
  }
  // One time base for every rank: rank 0's wall clock as all ranks leave
  // the barrier.
  if (multi)
    watchdog::barrier(ctx, MPI_COMM_WORLD, watchdog::group_op("--trace", -1));
  tr->base = Clock::now();
  tr->epoch_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  if (multi)
    watchdog::bcast(ctx, &tr->epoch_ns, 1, MPI_INT64_T, 0, MPI_COMM_WORLD,
                    watchdog::group_op("--trace", -1));

  std::fputs("[\n", tr->file);
  std::string pid = std::to_string(tr->pid);
  std::string label = coords_label(ctx);
  std::string name = "rank " + pid + (label.empty() ? "" : " (" + label + ")");
  emit(*tr, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid +
                ",\"args\":{\"name\":" + json_str(name) + "}}");
  emit(*tr, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + pid +
                ",\"args\":{\"sort_index\":" + pid + "}}");
  emit(*tr, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid +
                ",\"tid\":0,\"args\":{\"name\":" +
                json_str(ctx->program + " rank " + pid) + "}}");
  // Where the time base came from, for tools (merge-traces.py).
  emit(*tr, "{\"name\":\"planrt_trace\",\"ph\":\"M\",\"pid\":" + pid +
                ",\"args\":{\"rank\":" + pid + ",\"world\":" +
                std::to_string(ctx->world) + ",\"pipeline_coord\":" +
                std::to_string(ctx->pipeline_axis >= 0
                                   ? ctx->coords[(size_t)ctx->pipeline_axis]
                                   : 0) +
                ",\"coords\":" + json_str(label) +
                ",\"program\":" + json_str(ctx->program) +
                ",\"epoch_us\":" + micros(tr->epoch_ns) + "}}");
  std::fflush(tr->file);
  ctx->trace.reset(tr.release());
  return "";
}

void flush(Context *ctx) {
  if (ctx->trace)
    std::fflush(ctx->trace->file);
}

std::string mask_name(const Context *ctx, int64_t axis_mask) {
  std::string s;
  for (size_t a = 0; a < ctx->axis_names.size(); ++a)
    if (axis_mask & (int64_t(1) << a))
      s += (s.empty() ? "" : "+") + ctx->axis_names[a];
  return s;
}

void slice(Context *ctx, const char *name, const char *cat,
           Clock::time_point t0, Clock::time_point t1,
           const std::string &args) {
  Trace &tr = *ctx->trace;
  int64_t a = wall_ns(tr, t0), b = wall_ns(tr, t1);
  emit(tr, std::string("{\"name\":") + json_str(name) + ",\"cat\":\"" + cat +
               "\",\"ph\":\"X\",\"pid\":" + std::to_string(tr.pid) +
               ",\"tid\":0,\"ts\":" + micros(a) + ",\"dur\":" +
               micros(b > a ? b - a : 0) + ",\"args\":{" + args + "}}");
}

void async_begin(Context *ctx, int64_t slot, const std::string &args) {
  Trace &tr = *ctx->trace;
  tr.async_args[slot] = args;
  emit(tr, "{\"name\":\"all_reduce_sum (slot " + std::to_string(slot) +
               ")\",\"cat\":\"collective_async\",\"ph\":\"b\",\"id\":" +
               std::to_string(slot) + ",\"pid\":" + std::to_string(tr.pid) +
               ",\"tid\":0,\"ts\":" + micros(wall_ns(tr, Clock::now())) +
               ",\"args\":{" + args + "}}");
}

void async_end(Context *ctx, int64_t slot) {
  Trace &tr = *ctx->trace;
  auto it = tr.async_args.find(slot);
  if (it == tr.async_args.end())
    return; // a slot whose start did not communicate (a group of one)
  tr.async_args.erase(it);
  emit(tr, "{\"name\":\"all_reduce_sum (slot " + std::to_string(slot) +
               ")\",\"cat\":\"collective_async\",\"ph\":\"e\",\"id\":" +
               std::to_string(slot) + ",\"pid\":" + std::to_string(tr.pid) +
               ",\"tid\":0,\"ts\":" + micros(wall_ns(tr, Clock::now())) + "}");
}

void unit_begin(Context *ctx) { ctx->trace->unit_t0 = Clock::now(); }

void unit_end(Context *ctx) {
  static const char *letters[] = {"F", "B", "W"};
  static const char *cats[] = {"forward", "backward", "weight_grad"};
  int64_t ph =
      ctx->unit_phase >= 0 && ctx->unit_phase <= 2 ? ctx->unit_phase : 0;
  std::string name = letters[ph] + std::to_string(ctx->unit_mb);
  slice(ctx, name.c_str(), cats[ph], ctx->trace->unit_t0, Clock::now(),
        "\"stage\":" + std::to_string(ctx->unit_stage) + ",\"microbatch\":" +
            std::to_string(ctx->unit_mb) + ",\"phase\":\"" + cats[ph] +
            "\",\"last\":" + std::to_string(ctx->unit_last) +
            ",\"step\":" + std::to_string(ctx->step));
}

std::string Scope::args() const {
  std::string s;
  auto add = [&](const std::string &m) { s += (s.empty() ? "" : ",") + m; };
  if (axis_mask >= 0) {
    add("\"axis\":" + json_str(mask_name(ctx, axis_mask)));
    add("\"ranks\":" + std::to_string(group_size(ctx, axis_mask)));
  } else if (axis >= 0 && axis < (int64_t)ctx->axis_names.size()) {
    add("\"axis\":" + json_str(ctx->axis_names[(size_t)axis]));
    add("\"ranks\":" + std::to_string(ctx->axis_sizes[(size_t)axis]));
  }
  if (peer >= 0)
    add("\"peer\":" + std::to_string(peer));
  if (bytes >= 0)
    add("\"bytes\":" + std::to_string(bytes));
  if (slot >= 0)
    add("\"slot\":" + std::to_string(slot));
  return s;
}

void Scope::end() { slice(ctx, name, cat, t0, Clock::now(), args()); }

} // namespace trace
} // namespace planrt
