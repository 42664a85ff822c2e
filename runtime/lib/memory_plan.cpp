//===- memory_plan.cpp - The arena of the compiler's memory plan ----------===//
//
// planc's plan-memory pass gives every buffer and every op's temporaries of
// a step an offset in one arena per rank. This file holds that arena: it is
// allocated once at start (as large as the plan says this rank's pipeline
// coordinate needs), no device memory is allocated during a step (only
// host bookkeeping: the live-buffer map, tensor headers), and the plan is
// checked as it runs:
// - a buffer placed over bytes of a live one is fatal (a planner bug would
//   otherwise corrupt values silently);
// - an op must take exactly the temporaries planrt/workspace.h gives it;
// - every buffer is released before its function returns;
// - the highest byte a step reaches must equal the compiler's arena size
//   (checked with the parameter bytes at the end of the run).
// Live bytes are counted by kind (activations, parameter gradients,
// workspace) for the memory report; that count is measured here, not
// taken from the plan.
//===----------------------------------------------------------------------===//
#include "context.h"

#include "planrt/workspace.h"

#include <cstdlib>
#include <limits>

namespace planrt {

namespace {
const char *kKindNames[3] = {"activation", "gradient", "workspace"};

void check_plan(Context *ctx, const char *op) {
  if (!ctx)
    fatal("%s: null context", op);
  if (ctx->plan_fn < 0)
    fatal("%s: called outside a planned function (arena_begin .. arena_end)",
          op);
}

void note_high_water(Context *ctx, int64_t end) {
  Context::PlannedFn &f = ctx->planned_fns[ctx->plan_fn];
  if (end > f.high_water)
    f.high_water = end;
  if (ctx->plan_fn == 0 && end > (int64_t)ctx->arena_peak)
    ctx->arena_peak = (size_t)end; // the step's arena peak is the plan's
  if (end > (int64_t)ctx->plan_capacity)
    fatal("memory plan: bytes [.., %lld) are past the end of the arena (%zu "
          "B planned for this rank); a planc bug to report with the plan",
          (long long)end, ctx->plan_capacity);
}

void count_live(Context *ctx, int kind, int64_t delta) {
  ctx->live_bytes[kind] += delta;
  ctx->live_total += delta;
  if (ctx->plan_fn != 0)
    return; // the peaks are the training step's
  if (ctx->live_bytes[kind] > ctx->live_peak[kind])
    ctx->live_peak[kind] = ctx->live_bytes[kind];
  if (ctx->live_total > ctx->live_total_peak)
    ctx->live_total_peak = ctx->live_total;
}

/// Fatal if [offset, offset + bytes) overlaps a live buffer.
void check_free(Context *ctx, const char *op, int64_t offset, int64_t bytes) {
  auto next = ctx->live.lower_bound(offset);
  auto clash = ctx->live.end();
  if (next != ctx->live.end() && next->first < offset + bytes)
    clash = next;
  else if (next != ctx->live.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.bytes > offset)
      clash = prev;
  }
  if (clash != ctx->live.end())
    fatal("%s: bytes [%lld, %lld) of the arena overlap the live %s buffer at "
          "[%lld, %lld); the memory plan is wrong (a planc bug to report "
          "with the plan)",
          op, (long long)offset, (long long)(offset + bytes),
          kKindNames[clash->second.kind], (long long)clash->first,
          (long long)(clash->first + clash->second.bytes));
}

/// Checks that the open workspace was used exactly, then closes it.
void close_workspace(Context *ctx) {
  if (ctx->ws_offset < 0)
    return;
  if (ctx->ws_used != ctx->ws_bytes)
    fatal("memory plan: an op took %lld B of temporaries where the plan "
          "gave it %lld B (planrt/workspace.h and the op disagree: a planc "
          "or planrt bug)",
          (long long)ctx->ws_used, (long long)ctx->ws_bytes);
  count_live(ctx, 2, -ctx->ws_used);
  ctx->ws_offset = -1;
  ctx->ws_bytes = ctx->ws_used = 0;
}

void poison(Context *ctx, int64_t offset, int64_t bytes) {
  if (!ctx->poison || bytes < 4)
    return;
  Tensor t;
  t.ndim = 1;
  t.shape[0] = bytes / 4;
  t.data = (float *)(ctx->plan_base + offset);
  fill(ctx, &t, std::numeric_limits<float>::quiet_NaN());
}
} // namespace

void plan_arena(Context *ctx, int64_t function, int64_t coord, int64_t bytes,
                int64_t buffer_bytes) {
  if (!ctx)
    fatal("plan_arena: null context");
  if (ctx->started)
    fatal("plan_arena: call it from plan_setup, before the program starts");
  if (function < 0 || function > 1 || coord < 0 || bytes < 0 ||
      buffer_bytes < 0 || bytes % workspace::kAlign)
    fatal("plan_arena: invalid arguments (function %lld, coordinate %lld, "
          "%lld B, %lld B)",
          (long long)function, (long long)coord, (long long)bytes,
          (long long)buffer_bytes);
  ctx->plan_entries.push_back({function, coord, bytes, buffer_bytes});
}

void plan_stash(Context *ctx, int64_t coord, int64_t bytes) {
  if (!ctx)
    fatal("plan_stash: null context");
  if (ctx->started)
    fatal("plan_stash: call it from plan_setup, before the program starts");
  if (coord < 0 || bytes < 0 || bytes % workspace::kAlign)
    fatal("plan_stash: invalid arguments (coordinate %lld, %lld B)",
          (long long)coord, (long long)bytes);
  ctx->stash_entries.push_back({coord, bytes});
}

namespace internal {
void allocate_plan_arena(Context *ctx) {
  for (const auto &e : ctx->stash_entries)
    if (e[0] == pipeline_coord(ctx) && e[1] > 0) {
      ctx->stash_planned = e[1];
      ctx->stash_capacity = e[1];
      ctx->stash_base = (char *)backend::alloc_bytes(ctx, (size_t)e[1]);
    }
  int64_t coord = pipeline_coord(ctx), most = 0;
  for (const auto &e : ctx->plan_entries) {
    if (e[1] != coord)
      continue;
    ctx->planned_fns[e[0]].bytes = e[2];
    ctx->planned_fns[e[0]].buffer_bytes = e[3];
    most = std::max(most, e[2]);
  }
  if (ctx->plan_entries.empty())
    return;
  ctx->plan_capacity = (size_t)most;
  ctx->plan_base = (char *)backend::alloc_bytes(
      ctx, most > 0 ? (size_t)most : workspace::kAlign);
  const char *p = std::getenv("PLANRT_POISON");
  ctx->poison = p && *p && std::string(p) != "0";
}

void free_plan_arena(Context *ctx) {
  if (ctx->stash_base)
    backend::free_bytes(ctx, ctx->stash_base);
  ctx->stash_base = nullptr;
  if (ctx->plan_base)
    backend::free_bytes(ctx, ctx->plan_base);
  ctx->plan_base = nullptr;
  ctx->plan_capacity = 0;
}
} // namespace internal

void arena_begin(Context *ctx, int64_t function) {
  if (!ctx)
    fatal("arena_begin: null context");
  if (function < 0 || function > 1 || ctx->planned_fns[function].bytes < 0)
    fatal("arena_begin: function %lld has no memory plan for this rank "
          "(plan_arena)",
          (long long)function);
  if (ctx->plan_fn >= 0)
    fatal("arena_begin: function %lld is still running",
          (long long)ctx->plan_fn);
  ctx->plan_fn = function;
  ++ctx->planned_fns[function].runs;
}

void arena_end(Context *ctx) {
  check_plan(ctx, "arena_end");
  close_workspace(ctx);
  if (!ctx->live.empty()) {
    auto &b = *ctx->live.begin();
    fatal("arena_end: %zu buffers were never released, e.g. the %s buffer "
          "at [%lld, %lld) (a planc bug)",
          ctx->live.size(), kKindNames[b.second.kind], (long long)b.first,
          (long long)(b.first + b.second.bytes));
  }
  ctx->plan_fn = -1;
}

Tensor *alloc_at(Context *ctx, int64_t offset, int64_t kind, int64_t ndim,
                 int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                 int64_t dtype) {
  check_plan(ctx, "alloc_at");
  close_workspace(ctx);
  int64_t d[4] = {d0, d1, d2, d3};
  if (ndim < 0 || ndim > 4 || kind < 0 || kind > 1 || offset < 0 ||
      offset % workspace::kAlign || dtype < F32 || dtype > F16)
    fatal("alloc_at: invalid arguments (offset %lld, kind %lld, rank %lld, "
          "dtype %lld)",
          (long long)offset, (long long)kind, (long long)ndim,
          (long long)dtype);
  Tensor t;
  t.dtype = (int)dtype;
  t.ndim = (int)ndim;
  for (int i = 0; i < 4; ++i) {
    if (d[i] < 0 || (i >= ndim && d[i] != 1))
      fatal("alloc_at: invalid dimension %d = %lld for a rank-%lld tensor", i,
            (long long)d[i], (long long)ndim);
    t.shape[i] = d[i];
  }
  int64_t bytes = workspace::round((int64_t)tensor_bytes(&t));
  check_free(ctx, "alloc_at", offset, bytes);
  note_high_water(ctx, offset + bytes);
  ctx->live[offset] = {bytes, (int)kind};
  count_live(ctx, (int)kind, bytes);
  t.data = (float *)(ctx->plan_base + offset);
  ctx->scratch.push_back(t);
  return &ctx->scratch.back();
}

Tensor *alloc_at_on_stage(Context *ctx, int64_t stage, int64_t offset,
                          int64_t kind, int64_t ndim, int64_t d0, int64_t d1,
                          int64_t d2, int64_t d3, int64_t dtype) {
  return owns_stage(ctx, stage)
             ? alloc_at(ctx, offset, kind, ndim, d0, d1, d2, d3, dtype)
             : nullptr;
}

void dealloc(Context *ctx, Tensor *t) {
  check_plan(ctx, "dealloc");
  if (!t)
    return;
  close_workspace(ctx);
  int64_t offset = (char *)t->data - ctx->plan_base;
  auto it = ctx->live.find(offset);
  if (offset < 0 || offset >= (int64_t)ctx->plan_capacity ||
      it == ctx->live.end())
    fatal("dealloc: the tensor is not a live buffer of the memory plan");
  poison(ctx, offset, it->second.bytes);
  count_live(ctx, it->second.kind, -it->second.bytes);
  ctx->live.erase(it);
}

void op_workspace(Context *ctx, int64_t offset, int64_t bytes) {
  check_plan(ctx, "op_workspace");
  close_workspace(ctx);
  if (offset < 0 || bytes <= 0 || offset % workspace::kAlign ||
      bytes % workspace::kAlign)
    fatal("op_workspace: invalid arguments (offset %lld, %lld B)",
          (long long)offset, (long long)bytes);
  check_free(ctx, "op_workspace", offset, bytes);
  note_high_water(ctx, offset + bytes);
  ctx->ws_offset = offset;
  ctx->ws_bytes = bytes;
  ctx->ws_used = 0;
}

namespace internal {
void *take_workspace(Context *ctx, size_t bytes) {
  if (ctx->ws_offset < 0)
    fatal("memory plan: an op took %zu B of temporaries the plan did not "
          "give it (planrt/workspace.h and the op disagree: a planc or "
          "planrt bug)",
          bytes);
  if (ctx->ws_used + (int64_t)bytes > ctx->ws_bytes)
    fatal("memory plan: an op took more than the %lld B of temporaries the "
          "plan gave it (planrt/workspace.h and the op disagree: a planc or "
          "planrt bug)",
          (long long)ctx->ws_bytes);
  void *p = ctx->plan_base + ctx->ws_offset + ctx->ws_used;
  ctx->ws_used += (int64_t)bytes;
  count_live(ctx, 2, (int64_t)bytes);
  return p;
}

void forgo_workspace(Context *ctx) {
  if (ctx->ws_offset < 0)
    return;
  count_live(ctx, 2, ctx->ws_bytes - ctx->ws_used);
  ctx->ws_used = ctx->ws_bytes;
}
} // namespace internal

} // namespace planrt
