//===- pipeline.cpp - Pipeline parallelism: stages, stash, units, p2p -----===//
//
// The backend-independent half of pipeline parallelism (planrt.h, "Pipeline
// parallelism"): stage ownership, the per-coordinate schedule, units and the
// microbatches in flight, the stash and its allocations, and point-to-point
// messages. Messages to this rank itself go through a local queue; the
// others go to backend::p2p_send / p2p_recv. Both backends use the MPI
// helpers here (a communicator duplicated from MPI_COMM_WORLD, one
// non-overtaking channel per pair of ranks): the host backend sends the
// data through it (tag = dtype), the cuda backend a header (count, tag =
// dtype) before the NCCL transfer, so that both check the element count.
//===----------------------------------------------------------------------===//

#include "context.h"

#include "planrt/internal.h"
#include "planrt/workspace.h"
#include "trace.h"

#include "control.h"

#include "watchdog.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <list>
#include <vector>

namespace planrt {

namespace {

void check_ctx(Context *ctx, const char *op) {
  if (!ctx)
    fatal("%s: null context", op);
}

void check_axis(const Context *ctx, const char *op, int64_t axis) {
  if (axis < 0 || axis >= (int64_t)ctx->axis_sizes.size())
    fatal("%s: mesh axis %lld is not declared (%zu axes)", op, (long long)axis,
          ctx->axis_sizes.size());
}

/// This rank's coordinates (also before start: from the rank).
std::vector<int64_t> my_coords(const Context *ctx) {
  if (ctx->started)
    return ctx->coords;
  return rank_coords(ctx, ctx->rank);
}

void check_stage(const Context *ctx, const char *op, int64_t stage) {
  if (ctx->pipeline_axis < 0)
    fatal("%s: no pipeline is declared (call declare_pipeline first)", op);
  if (stage < -1 || stage >= ctx->pipeline_stages)
    fatal("%s: stage %lld out of range (%lld stages; -1 = every rank)", op,
          (long long)stage, (long long)ctx->pipeline_stages);
}

struct P2PState {
  MPI_Comm comm = MPI_COMM_NULL;
  struct Send {
    MPI_Request request = MPI_REQUEST_NULL;
    int dest = -1;
    std::vector<char> buffer;
  };
  std::list<Send> sends; // outstanding
};

P2PState *p2p_state(Context *ctx) { return (P2PState *)ctx->p2p; }

bool mpi_alive() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void check_mpi(int rc, const char *call) {
  if (rc != MPI_SUCCESS)
    fatal("%s failed (code %d)", call, rc);
}

void free_stash_alloc(Context *ctx,
                      std::map<char *, Context::StashAlloc>::iterator it) {
  if (ctx->stash_base)
    ctx->stash_pool.release(it->first - ctx->stash_base,
                            (int64_t)it->second.pool_bytes);
  else
    backend::free_bytes(ctx, it->first);
  ctx->stash_live_bytes -= (int64_t)it->second.bytes;
  ctx->stash_allocs.erase(it);
}

/// The alloc_stash allocation containing p (end()).
std::map<char *, Context::StashAlloc>::iterator find_alloc(Context *ctx,
                                                           const void *p) {
  auto &allocs = ctx->stash_allocs;
  if (allocs.empty() || !p)
    return allocs.end();
  auto it =
      allocs.upper_bound(const_cast<char *>(static_cast<const char *>(p)));
  if (it == allocs.begin())
    return allocs.end();
  --it;
  if ((const char *)p < it->first + it->second.bytes)
    return it;
  return allocs.end();
}

bool in_arena(const Context *ctx, const void *p) {
  if (ctx->plan_base && (const char *)p >= ctx->plan_base &&
      (const char *)p < ctx->plan_base + ctx->plan_capacity)
    return true; // a buffer of the memory plan: it dies with its unit
  for (const ArenaChunk &c : ctx->chunks)
    if ((const char *)p >= c.base && (const char *)p < c.base + c.size)
      return true;
  return false;
}

std::string slot_str(int64_t slot, int64_t mb) {
  return "slot " + std::to_string(slot) + " of microbatch " +
         std::to_string(mb);
}

} // namespace

//===--- Helpers of context.h ---------------------------------------------===//

int64_t pipeline_coord(const Context *ctx) {
  if (ctx->pipeline_axis < 0)
    return 0;
  return my_coords(ctx)[ctx->pipeline_axis];
}

int64_t stage_owner(const Context *ctx, int64_t stage) {
  if (stage < 0 || ctx->pipeline_axis < 0)
    return stage < 0 ? -1 : 0;
  return stage % ctx->axis_sizes[ctx->pipeline_axis];
}

int world_rank_with(const Context *ctx, int64_t axis, int64_t coord) {
  std::vector<int64_t> c = my_coords(ctx);
  c[axis] = coord;
  int64_t r = 0;
  for (size_t i = 0; i < c.size(); ++i)
    r = r * ctx->axis_sizes[i] + c[i];
  return (int)r;
}

void p2p_init(Context *ctx) {
  P2PState *s = new P2PState;
  ctx->p2p = s;
  if (ctx->use_mpi && ctx->world > 1)
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &s->comm), "MPI_Comm_dup");
}

void p2p_finalize(Context *ctx) {
  P2PState *s = p2p_state(ctx);
  if (!s)
    return;
  if (mpi_alive()) {
    for (auto &send : s->sends)
      MPI_Wait(&send.request, MPI_STATUS_IGNORE);
    if (s->comm != MPI_COMM_NULL)
      MPI_Comm_free(&s->comm);
  }
  delete s;
  ctx->p2p = nullptr;
  for (auto &kv : ctx->self_messages)
    for (auto &m : kv.second)
      backend::free_bytes(ctx, m.data);
  ctx->self_messages.clear();
  if (!ctx->stash_base)
    for (auto &kv : ctx->stash_allocs)
      backend::free_bytes(ctx, kv.first);
  ctx->stash_allocs.clear();
  ctx->stash.clear();
  ctx->stash_live_bytes = 0;
}

void p2p_progress(Context *ctx) {
  P2PState *s = p2p_state(ctx);
  if (!s)
    return;
  for (auto it = s->sends.begin(); it != s->sends.end();) {
    int done = 0;
    check_mpi(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    it = done ? s->sends.erase(it) : std::next(it);
  }
}

void p2p_mpi_isend(Context *ctx, int dest, int tag, const void *data,
                   size_t bytes) {
  P2PState *s = p2p_state(ctx);
  if (!s || s->comm == MPI_COMM_NULL)
    fatal("send: messages to another rank need MPI");
  if (bytes > (size_t)0x7fffffff)
    fatal("send: %zu bytes exceed MPI's count limit; send smaller tensors",
          bytes);
  s->sends.emplace_back();
  P2PState::Send &send = s->sends.back();
  send.dest = dest;
  send.buffer.assign((const char *)data, (const char *)data + bytes);
  check_mpi(MPI_Isend(send.buffer.data(), (int)bytes, MPI_BYTE, dest, tag,
                      s->comm, &send.request),
            "MPI_Isend");
}

void p2p_mpi_probe(Context *ctx, int src, size_t *bytes, int *tag) {
  P2PState *s = p2p_state(ctx);
  if (!s || s->comm == MPI_COMM_NULL)
    fatal("recv: messages from another rank need MPI");
  // Outstanding sends progress while this rank waits (MPI_Probe alone may
  // not drive them on every MPI): poll, under the watchdog.
  MPI_Status st;
  watchdog::Op what = watchdog::peer_op("recv", src, false);
  watchdog::wait_until(ctx, what, [&] {
    int flag = 0;
    check_mpi(MPI_Iprobe(src, MPI_ANY_TAG, s->comm, &flag, &st), "MPI_Iprobe");
    if (!flag)
      p2p_progress(ctx);
    return flag != 0;
  });
  int n = 0;
  MPI_Get_count(&st, MPI_BYTE, &n);
  *bytes = (size_t)n;
  *tag = st.MPI_TAG;
}

void p2p_mpi_recv(Context *ctx, int src, int tag, void *data, size_t bytes) {
  P2PState *s = p2p_state(ctx);
  watchdog::Op what = watchdog::peer_op("recv", src, false);
  watchdog::recv(ctx, data, (int)bytes, MPI_BYTE, src, tag, s->comm, what);
}

void check_p2p_message(Context *ctx, const Tensor *out, int64_t axis,
                       int64_t peer, int64_t count, int dtype) {
  if (count != out->numel())
    fatal("recv: the message from coordinate %lld on mesh axis %lld ('%s') "
          "has %lld elements but the receiving tensor %s has %lld (rank %d)",
          (long long)peer, (long long)axis,
          ctx->axis_names[(size_t)axis].c_str(), (long long)count,
          shape_str(out).c_str(), (long long)out->numel(), ctx->rank);
  if (dtype != out->dtype)
    fatal("recv: the message from coordinate %lld on mesh axis %lld ('%s') "
          "is %s but the receiving tensor %s is %s (rank %d)",
          (long long)peer, (long long)axis,
          ctx->axis_names[(size_t)axis].c_str(), dtype_name(dtype),
          shape_str(out).c_str(), dtype_name(out->dtype), ctx->rank);
}

void pipeline_end_step(Context *ctx, const char *when) {
  if (ctx->p2p) {
    backend::p2p_wait_all(ctx);
    P2PState *s = p2p_state(ctx);
    for (auto &send : s->sends)
      watchdog::wait_all(ctx, 1, &send.request,
                         watchdog::peer_op("send", send.dest, true));
    s->sends.clear();
  }
  if (ctx->unit_open)
    fatal("%s: the unit of stage %lld (phase %lld, microbatch %lld) was begun "
          "and not ended (unit_end)",
          when, (long long)ctx->unit_stage, (long long)ctx->unit_phase,
          (long long)ctx->unit_mb);
  for (auto &kv : ctx->in_flight)
    if (!kv.second.empty())
      fatal("%s: microbatch %lld of stage %lld is still in flight: its "
            "forward unit began and no unit with last = 1 ended",
            when, (long long)*kv.second.begin(), (long long)kv.first);
  if (!ctx->stash.empty()) {
    std::string left;
    int n = 0;
    for (auto &kv : ctx->stash) {
      if (n++ == 8) {
        left += ", ...";
        break;
      }
      if (!left.empty())
        left += ", ";
      left += slot_str(kv.first.first, kv.first.second) + " (" +
              std::to_string(kv.second.readers) + " reader(s) left)";
    }
    fatal("%s: the stash still holds %zu value(s): %s; every stash_put needs "
          "one stash_release per reader",
          when, ctx->stash.size(), left.c_str());
  }
  for (auto it = ctx->stash_allocs.begin(); it != ctx->stash_allocs.end();)
    free_stash_alloc(ctx, it++);
  ctx->stash_pool = BestFit(); // every step starts from an empty pool
  ctx->in_flight.clear();
}

namespace internal {
int64_t stash_live_bytes(const Context *ctx) { return ctx->stash_live_bytes; }
int64_t stash_allocations(const Context *ctx) {
  return (int64_t)ctx->stash_allocs.size();
}
std::vector<int64_t> pipeline_peaks(const Context *ctx) {
  std::vector<int64_t> v((size_t)std::max<int64_t>(ctx->pipeline_stages, 0), 0);
  for (auto &kv : ctx->in_flight_peak)
    if (kv.first >= 0 && kv.first < (int64_t)v.size())
      v[(size_t)kv.first] = kv.second;
  return v;
}
void end_step(Context *ctx) {
  check_no_pending(ctx, "end of step");
  pipeline_end_step(ctx, "end of step");
}
} // namespace internal

//===--- Program description ----------------------------------------------===//

void declare_pipeline(Context *ctx, int64_t axis, int64_t stages) {
  const char *op = "declare_pipeline";
  check_ctx(ctx, op);
  if (ctx->started)
    fatal("%s: called after the program started", op);
  if (ctx->pipeline_axis >= 0)
    fatal("%s: a pipeline is already declared (on axis %lld)", op,
          (long long)ctx->pipeline_axis);
  check_axis(ctx, op, axis);
  int64_t P = ctx->axis_sizes[(size_t)axis];
  if (stages < 1 || stages % P != 0)
    fatal("%s: %lld stages is not a positive multiple of the size %lld of "
          "axis '%s'",
          op, (long long)stages, (long long)P,
          ctx->axis_names[(size_t)axis].c_str());
  ctx->pipeline_axis = axis;
  ctx->pipeline_stages = stages;
  ctx->schedules.assign((size_t)P, {});
}

void set_param_stage(Context *ctx, int64_t param_index, int64_t stage) {
  const char *op = "set_param_stage";
  check_ctx(ctx, op);
  if (ctx->started)
    fatal("%s: called after the program started", op);
  if (param_index < 0 || param_index >= (int64_t)ctx->params.size())
    fatal("%s: parameter index %lld out of range (%zu parameters declared)", op,
          (long long)param_index, ctx->params.size());
  check_stage(ctx, op, stage);
  ctx->params[(size_t)param_index].stage = stage;
}

void set_state_stage(Context *ctx, int64_t state_index, int64_t stage) {
  const char *op = "set_state_stage";
  check_ctx(ctx, op);
  if (ctx->started)
    fatal("%s: called after the program started", op);
  if (state_index < 0 || state_index >= (int64_t)ctx->states.size())
    fatal("%s: state index %lld out of range (%zu state tensors declared)", op,
          (long long)state_index, ctx->states.size());
  check_stage(ctx, op, stage);
  ctx->states[(size_t)state_index].stage = stage;
}

int64_t owns_stage(Context *ctx, int64_t stage) {
  check_ctx(ctx, "owns_stage");
  if (stage < 0 || ctx->pipeline_axis < 0)
    return 1;
  if (stage >= ctx->pipeline_stages)
    fatal("owns_stage: stage %lld out of range (%lld stages)", (long long)stage,
          (long long)ctx->pipeline_stages);
  return stage_owner(ctx, stage) == pipeline_coord(ctx) ? 1 : 0;
}

int64_t mesh_coord(Context *ctx, int64_t axis) {
  check_ctx(ctx, "mesh_coord");
  check_axis(ctx, "mesh_coord", axis);
  return my_coords(ctx)[(size_t)axis];
}

void expect_pipeline_bytes(Context *ctx, int64_t coord, int64_t params,
                           int64_t grads, int64_t state) {
  const char *op = "expect_pipeline_bytes";
  check_ctx(ctx, op);
  if (ctx->pipeline_axis < 0)
    fatal("%s: no pipeline is declared (call declare_pipeline first, or "
          "expect_bytes)",
          op);
  int64_t P = ctx->axis_sizes[(size_t)ctx->pipeline_axis];
  if (coord != (int64_t)ctx->pipeline_expected.size() || coord >= P)
    fatal("%s: call it once per pipeline coordinate, in order (0..%lld); "
          "got coordinate %lld after %zu call(s)",
          op, (long long)(P - 1), (long long)coord,
          ctx->pipeline_expected.size());
  if (params < 0 || grads < 0 || state < 0)
    fatal("%s: byte counts must be >= 0, got params %lld, grads %lld, state "
          "%lld",
          op, (long long)params, (long long)grads, (long long)state);
  ctx->pipeline_expected.push_back({params, grads, state});
  if (coord == pipeline_coord(ctx))
    expect_bytes(ctx, params, grads, state);
}

void schedule_add(Context *ctx, int64_t coord, int64_t unit, int64_t mb) {
  const char *op = "schedule_add";
  check_ctx(ctx, op);
  if (ctx->pipeline_axis < 0)
    fatal("%s: no pipeline is declared (call declare_pipeline first)", op);
  if (coord < 0 || coord >= (int64_t)ctx->schedules.size())
    fatal("%s: pipeline coordinate %lld out of range (axis size %zu)", op,
          (long long)coord, ctx->schedules.size());
  ctx->schedules[(size_t)coord].push_back({unit, mb});
}

void schedule_table(Context *ctx, const int64_t *table, int64_t entries) {
  const char *op = "schedule_table";
  check_ctx(ctx, op);
  if (entries < 0 || (entries > 0 && !table))
    fatal("%s: expected a table of entries >= 0 triples, got %lld entries "
          "at %p",
          op, (long long)entries, (const void *)table);
  for (int64_t i = 0; i < entries; ++i)
    schedule_add(ctx, table[3 * i], table[3 * i + 1], table[3 * i + 2]);
}

namespace {
const std::vector<std::pair<int64_t, int64_t>> &my_schedule(Context *ctx,
                                                            const char *op) {
  check_ctx(ctx, op);
  if (ctx->pipeline_axis < 0)
    fatal("%s: no pipeline is declared", op);
  return ctx->schedules[(size_t)pipeline_coord(ctx)];
}
const std::pair<int64_t, int64_t> &schedule_entry(Context *ctx, const char *op,
                                                  int64_t i) {
  auto &s = my_schedule(ctx, op);
  if (i < 0 || i >= (int64_t)s.size())
    fatal("%s: entry %lld out of range (the schedule of pipeline coordinate "
          "%lld has %zu entries)",
          op, (long long)i, (long long)pipeline_coord(ctx), s.size());
  return s[(size_t)i];
}
} // namespace

int64_t schedule_length(Context *ctx) {
  return (int64_t)my_schedule(ctx, "schedule_length").size();
}
int64_t schedule_unit(Context *ctx, int64_t i) {
  return schedule_entry(ctx, "schedule_unit", i).first;
}
int64_t schedule_mb(Context *ctx, int64_t i) {
  return schedule_entry(ctx, "schedule_mb", i).second;
}

//===--- Units ------------------------------------------------------------===//

void unit_begin(Context *ctx, int64_t stage, int64_t phase, int64_t mb,
                int64_t last) {
  const char *op = "unit_begin";
  check_ctx(ctx, op);
  if (!ctx->started)
    fatal("%s: called before the program started", op);
  if (ctx->unit_open)
    fatal("%s: the unit of stage %lld (phase %lld, microbatch %lld) is still "
          "open; call unit_end first",
          op, (long long)ctx->unit_stage, (long long)ctx->unit_phase,
          (long long)ctx->unit_mb);
  if (stage < 0 || (ctx->pipeline_axis >= 0 && stage >= ctx->pipeline_stages))
    fatal("%s: stage %lld out of range (%lld stages)", op, (long long)stage,
          (long long)ctx->pipeline_stages);
  if (!owns_stage(ctx, stage))
    fatal("%s: stage %lld is not owned by this rank (pipeline coordinate "
          "%lld)",
          op, (long long)stage, (long long)pipeline_coord(ctx));
  if (phase < 0 || phase > 2)
    fatal("%s: phase must be 0 (forward), 1 (backward) or 2 (weight "
          "gradient), got %lld",
          op, (long long)phase);
  if (mb < 0)
    fatal("%s: microbatch must be >= 0, got %lld", op, (long long)mb);
  if (last != 0 && last != 1)
    fatal("%s: last must be 0 or 1, got %lld", op, (long long)last);
  p2p_progress(ctx);
  std::set<int64_t> &flying = ctx->in_flight[stage];
  if (phase == 0) {
    if (!flying.insert(mb).second)
      fatal("%s: forward of microbatch %lld on stage %lld begins while that "
            "microbatch is already in flight",
            op, (long long)mb, (long long)stage);
    int64_t &peak = ctx->in_flight_peak[stage];
    peak = std::max(peak, (int64_t)flying.size());
  } else if (last && !flying.count(mb)) {
    fatal("%s: the last backward phase of microbatch %lld on stage %lld "
          "begins but its forward did not",
          op, (long long)mb, (long long)stage);
  }
  ctx->unit_open = true;
  ctx->unit_stage = stage;
  ctx->unit_phase = phase;
  ctx->unit_mb = mb;
  ctx->unit_last = last;
  ctx->unit_serial++;
  ctx->unit_mark = arena_mark(ctx);
  if (ctx->trace)
    trace::unit_begin(ctx);
}

void unit_end(Context *ctx) {
  const char *op = "unit_end";
  check_ctx(ctx, op);
  if (!ctx->unit_open)
    fatal("%s: no unit is open (unit_begin)", op);
  if (ctx->unit_mark >= (int64_t)ctx->marks.size())
    fatal("%s: the unit's arena mark was released inside the unit", op);
  arena_release(ctx, ctx->unit_mark);
  ctx->unit_open = false;
  if (ctx->unit_last)
    ctx->in_flight[ctx->unit_stage].erase(ctx->unit_mb);
  // The unit's stash allocations that no entry refers to are freed.
  for (auto it = ctx->stash_allocs.begin(); it != ctx->stash_allocs.end();) {
    auto cur = it++;
    if (cur->second.unit != ctx->unit_serial)
      continue;
    cur->second.unit = -1;
    if (cur->second.refs == 0)
      free_stash_alloc(ctx, cur);
  }
  p2p_progress(ctx);
  if (ctx->trace)
    trace::unit_end(ctx);
}

//===--- The stash --------------------------------------------------------===//

Tensor *alloc_stash(Context *ctx, int64_t ndim, int64_t d0, int64_t d1,
                    int64_t d2, int64_t d3, int64_t dtype) {
  const char *op = "alloc_stash";
  check_ctx(ctx, op);
  if (!ctx->started)
    fatal("%s: called before the program started", op);
  int64_t d[4] = {d0, d1, d2, d3};
  if (ndim < 0 || ndim > 4)
    fatal("%s: rank must be 0..4, got %lld", op, (long long)ndim);
  for (int i = 0; i < 4; ++i)
    if (d[i] < 0 || (i >= ndim && d[i] != 1))
      fatal("%s: invalid dimension %d = %lld for a rank-%lld tensor", op, i,
            (long long)d[i], (long long)ndim);
  if (dtype < F32 || dtype > F16)
    fatal("%s: unknown dtype %lld", op, (long long)dtype);
  Tensor t;
  t.ndim = (int)ndim;
  t.dtype = (int)dtype;
  for (int i = 0; i < 4; ++i)
    t.shape[i] = i < ndim ? d[i] : 1;
  size_t bytes = tensor_bytes(&t);
  if (bytes == 0)
    bytes = sizeof(float); // a distinct address
  size_t pool_bytes = 0;
  if (ctx->stash_base) {
    // The memory plan's stash pool, with the allocator the compiler
    // simulated: nothing is allocated during the step.
    pool_bytes = (size_t)workspace::round((int64_t)bytes);
    int64_t off = ctx->stash_pool.allocate((int64_t)pool_bytes);
    if (off + (int64_t)pool_bytes > ctx->stash_capacity)
      fatal("%s: the stash needs more than the %lld B the memory plan gave "
            "this rank (the schedule and the plan disagree: a planc bug to "
            "report with the plan)",
            op, (long long)ctx->stash_capacity);
    if (ctx->plan_fn == 0)
      ctx->stash_high = std::max(ctx->stash_high, ctx->stash_pool.highWater());
    t.data = (float *)(ctx->stash_base + off);
  } else {
    t.data = (float *)backend::alloc_bytes(ctx, bytes);
  }
  Context::StashAlloc a;
  a.bytes = bytes;
  a.pool_bytes = pool_bytes;
  a.unit = ctx->unit_open ? ctx->unit_serial : -1;
  a.outside_unit = !ctx->unit_open;
  ctx->stash_allocs[(char *)t.data] = a;
  ctx->stash_live_bytes += (int64_t)bytes;
  ctx->stash_peak_bytes =
      std::max(ctx->stash_peak_bytes, ctx->stash_live_bytes);
  ctx->scratch.push_back(t);
  return &ctx->scratch.back();
}

void stash_put(Context *ctx, Tensor *t, int64_t slot, int64_t mb,
               int64_t readers) {
  const char *op = "stash_put";
  check_ctx(ctx, op);
  check_tensor(op, "t", t);
  if (readers < 1)
    fatal("%s: %s needs at least one reader, got %lld", op,
          slot_str(slot, mb).c_str(), (long long)readers);
  auto key = std::make_pair(slot, mb);
  if (ctx->stash.count(key))
    fatal("%s: %s was already put (and not released by all its readers)", op,
          slot_str(slot, mb).c_str());
  auto alloc = find_alloc(ctx, t->data);
  if (alloc == ctx->stash_allocs.end() && t->data && in_arena(ctx, t->data))
    fatal("%s: %s: the tensor %s is arena scratch, which the unit gives back "
          "when it ends; put an alloc_stash tensor (or a view of one)",
          op, slot_str(slot, mb).c_str(), shape_str(t).c_str());
  Context::StashEntry e;
  e.t = *t;
  e.readers = readers;
  if (alloc != ctx->stash_allocs.end()) {
    e.alloc = alloc->first;
    alloc->second.refs++;
  }
  ctx->stash[key] = e;
}

Tensor *stash_get(Context *ctx, int64_t slot, int64_t mb) {
  const char *op = "stash_get";
  check_ctx(ctx, op);
  auto it = ctx->stash.find(std::make_pair(slot, mb));
  if (it == ctx->stash.end())
    fatal("%s: nothing was put in %s (or all its readers released it)", op,
          slot_str(slot, mb).c_str());
  ctx->scratch.push_back(it->second.t);
  return &ctx->scratch.back();
}

void stash_release(Context *ctx, int64_t slot, int64_t mb) {
  const char *op = "stash_release";
  check_ctx(ctx, op);
  auto it = ctx->stash.find(std::make_pair(slot, mb));
  if (it == ctx->stash.end())
    fatal("%s: nothing was put in %s (or all its readers released it)", op,
          slot_str(slot, mb).c_str());
  if (--it->second.readers > 0)
    return;
  char *base = it->second.alloc;
  ctx->stash.erase(it);
  if (!base)
    return;
  auto a = ctx->stash_allocs.find(base);
  if (a == ctx->stash_allocs.end())
    return;
  if (--a->second.refs == 0 && a->second.unit < 0 && !a->second.outside_unit)
    free_stash_alloc(ctx, a);
}

//===--- Point to point ---------------------------------------------------===//

namespace {
void check_p2p(Context *ctx, const char *op, const Tensor *t, int64_t axis,
               int64_t peer) {
  check_ctx(ctx, op);
  if (!ctx->started)
    fatal("%s: called before the program started", op);
  check_tensor(op, "tensor", t);
  if (t->dtype < F32 || t->dtype > F16)
    fatal("%s: unknown dtype %d", op, t->dtype);
  check_axis(ctx, op, axis);
  int64_t size = ctx->axis_sizes[(size_t)axis];
  if (peer < 0 || peer >= size)
    fatal("%s: peer coordinate %lld out of range for mesh axis %lld ('%s', "
          "size %lld)",
          op, (long long)peer, (long long)axis,
          ctx->axis_names[(size_t)axis].c_str(), (long long)size);
}
} // namespace

void send(Context *ctx, const Tensor *t, int64_t axis, int64_t peer) {
  check_p2p(ctx, "send", t, axis, peer);
  trace::Scope ts(ctx, "send", "p2p");
  ts.axis = axis;
  ts.peer = peer;
  ts.bytes = (int64_t)tensor_bytes(t);
  p2p_progress(ctx);
  size_t bytes = tensor_bytes(t);
  if (peer == ctx->coords[(size_t)axis]) {
    Context::SelfMessage m;
    m.data = backend::alloc_bytes(ctx, bytes ? bytes : sizeof(float));
    backend::copy_bytes(ctx, m.data, t->data, bytes);
    m.count = t->numel();
    m.dtype = t->dtype;
    ctx->self_messages[axis].push_back(m);
    return;
  }
  backend::p2p_send(ctx, t, axis, peer, world_rank_with(ctx, axis, peer));
}

void recv(Context *ctx, Tensor *out, int64_t axis, int64_t peer) {
  check_p2p(ctx, "recv", out, axis, peer);
  trace::Scope ts(ctx, "recv", "p2p");
  ts.axis = axis;
  ts.peer = peer;
  ts.bytes = (int64_t)tensor_bytes(out);
  p2p_progress(ctx);
  if (peer == ctx->coords[(size_t)axis]) {
    auto &q = ctx->self_messages[axis];
    if (q.empty())
      fatal("recv: this rank receives from itself (coordinate %lld on mesh "
            "axis %lld) but sent itself nothing that was not received yet; "
            "it would wait forever",
            (long long)peer, (long long)axis);
    Context::SelfMessage m = q.front();
    check_p2p_message(ctx, out, axis, peer, m.count, m.dtype);
    q.pop_front();
    backend::copy_bytes(ctx, out->data, m.data, tensor_bytes(out));
    backend::free_bytes(ctx, m.data);
    return;
  }
  backend::p2p_recv(ctx, out, axis, peer, world_rank_with(ctx, axis, peer));
}

} // namespace planrt
