//===- context.cpp - Program description, arena, shared helpers -----------===//

#include "context.h"

#include "planrt/workspace.h"

#include <algorithm>

#include "control.h"

#include "watchdog.h"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace planrt {

static bool mpi_usable() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void fatal(const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "planrt: error: %s\n", buf);
  std::fflush(stderr);
  std::fflush(stdout);
  if (mpi_usable())
    MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

std::string shape_str(const Tensor *t) {
  std::string s = "[";
  for (int i = 0; i < t->ndim; ++i) {
    if (i)
      s += ", ";
    s += std::to_string(t->shape[i]);
  }
  return s + "]";
}

void check_tensor(const char *op, const char *what, const Tensor *t) {
  if (!t)
    fatal("%s: %s is a null tensor", op, what);
  if (t->ndim < 0 || t->ndim > 4)
    fatal("%s: %s has invalid rank %d", op, what, t->ndim);
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] < 0)
      fatal("%s: %s has a negative dimension %s", op, what,
            shape_str(t).c_str());
  if (!t->data && t->numel() > 0)
    fatal("%s: %s %s has no data", op, what, shape_str(t).c_str());
}

static void check_ctx(Context *ctx, const char *op) {
  if (!ctx)
    fatal("%s: null context", op);
}

static void check_dims(const char *op, const char *name, int64_t ndim,
                       const int64_t d[4]) {
  if (ndim < 0 || ndim > 4)
    fatal("%s '%s': rank must be 0..4, got %lld", op, name, (long long)ndim);
  for (int i = 0; i < 4; ++i) {
    if (d[i] < 1)
      fatal("%s '%s': dimension %d must be >= 1, got %lld", op, name, i,
            (long long)d[i]);
    if (i >= ndim && d[i] != 1)
      fatal("%s '%s': unused dimension %d must be 1, got %lld", op, name, i,
            (long long)d[i]);
  }
}

static Tensor make_shape(int64_t ndim, const int64_t d[4]) {
  Tensor t;
  t.ndim = (int)ndim;
  for (int i = 0; i < 4; ++i)
    t.shape[i] = i < ndim ? d[i] : 1;
  return t;
}

//===--- Program description ----------------------------------------------===//

void declare_mesh_axis(Context *ctx, const char *name, int64_t size) {
  check_ctx(ctx, "declare_mesh_axis");
  if (ctx->started)
    fatal("declare_mesh_axis: called after the program started");
  if (!name || !*name)
    fatal("declare_mesh_axis: empty axis name");
  if (size < 1)
    fatal("declare_mesh_axis '%s': size must be >= 1, got %lld", name,
          (long long)size);
  if (ctx->axis_names.size() >= 62)
    fatal("declare_mesh_axis: too many axes");
  for (auto &n : ctx->axis_names)
    if (n == name)
      fatal("declare_mesh_axis: axis '%s' declared twice", name);
  ctx->axis_names.push_back(name);
  ctx->axis_sizes.push_back(size);
}

void declare_param(Context *ctx, const char *name, int64_t ndim, int64_t d0,
                   int64_t d1, int64_t d2, int64_t d3, int64_t init_kind,
                   float a, float b) {
  check_ctx(ctx, "declare_param");
  if (ctx->started)
    fatal("declare_param: called after the program started");
  if (!name || !*name)
    fatal("declare_param: empty parameter name");
  int64_t d[4] = {d0, d1, d2, d3};
  check_dims("declare_param", name, ndim, d);
  if (init_kind < InitZeros || init_kind > InitUniform)
    fatal("declare_param '%s': unknown init kind %lld", name,
          (long long)init_kind);
  if (init_kind == InitNormal && !(b >= 0.0f))
    fatal("declare_param '%s': normal stddev must be >= 0, got %g", name,
          (double)b);
  if (init_kind == InitUniform && !(a <= b))
    fatal("declare_param '%s': uniform bounds must satisfy low <= high", name);
  ParamDesc p;
  p.name = name;
  p.init_kind = init_kind;
  p.a = a;
  p.b = b;
  p.t = make_shape(ndim, d);
  if (!ctx->param_names.insert(p.name).second)
    fatal("declare_param: parameter '%s' declared twice", name);
  ctx->params.push_back(std::move(p));
}

/// The checks of a declaration table (declare_params, declare_states).
static void check_table(Context *ctx, const char *op, const void *rows,
                        int64_t n) {
  check_ctx(ctx, op);
  if (n < 0 || (n > 0 && !rows))
    fatal("%s: invalid table (%lld rows)", op, (long long)n);
}

void declare_params(Context *ctx, const ParamDecl *rows, int64_t n) {
  check_table(ctx, "declare_params", rows, n);
  for (int64_t i = 0; i < n; ++i) {
    const ParamDecl &r = rows[i];
    declare_param(ctx, r.name, r.ndim, r.d0, r.d1, r.d2, r.d3, r.init_kind, r.a,
                  r.b);
  }
}

void declare_input(Context *ctx, const char *name, int64_t role, int64_t ndim,
                   int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                   int64_t batch_axis) {
  check_ctx(ctx, "declare_input");
  if (ctx->started)
    fatal("declare_input: called after the program started");
  if (!name || !*name)
    fatal("declare_input: empty input name");
  for (auto &in : ctx->inputs)
    if (in.name == name)
      fatal("declare_input: input '%s' declared twice", name);
  int64_t d[4] = {d0, d1, d2, d3};
  check_dims("declare_input", name, ndim, d);
  if (role != RoleInput && role != RoleLabel)
    fatal("declare_input '%s': unknown role %lld", name, (long long)role);
  if (batch_axis >= 0 && ndim < 1)
    fatal("declare_input '%s': a rank-0 input cannot be split over an axis",
          name);
  // batch_axis is checked against the axes in start(): axes may be declared
  // in any order relative to inputs.
  InputDesc in;
  in.name = name;
  in.role = role;
  in.batch_axis = batch_axis < 0 ? -1 : batch_axis;
  in.t = make_shape(ndim, d);
  ctx->inputs.push_back(std::move(in));
}

void set_training(Context *ctx, int64_t steps, int64_t seed,
                  int64_t global_batch, int64_t data_kind) {
  check_ctx(ctx, "set_training");
  if (steps < 0)
    fatal("set_training: steps must be >= 0, got %lld", (long long)steps);
  if (global_batch < 0)
    fatal("set_training: global batch must be >= 0, got %lld",
          (long long)global_batch);
  ctx->steps = steps;
  ctx->seed = seed;
  ctx->global_batch = global_batch;
  ctx->data_kind = data_kind;
}

void set_classes(Context *ctx, int64_t classes) {
  check_ctx(ctx, "set_classes");
  if (classes < 1)
    fatal("set_classes: classes must be >= 1, got %lld", (long long)classes);
  ctx->classes = classes;
}

/// Input `input_index` for setter `fn`, checked (declared, before start).
static InputDesc &declared_input(Context *ctx, const char *fn,
                                 int64_t input_index) {
  check_ctx(ctx, fn);
  if (ctx->started)
    fatal("%s: called after the program started", fn);
  if (input_index < 0 || input_index >= (int64_t)ctx->inputs.size())
    fatal("%s: input index %lld out of range (%zu inputs declared)", fn,
          (long long)input_index, ctx->inputs.size());
  return ctx->inputs[input_index];
}

void set_input_dtype(Context *ctx, int64_t input_index, int64_t dtype) {
  InputDesc &in = declared_input(ctx, "set_input_dtype", input_index);
  if (dtype != F32 && dtype != I32)
    fatal("set_input_dtype '%s': unknown dtype %lld (0 = f32, 1 = i32)",
          in.name.c_str(), (long long)dtype);
  in.t.dtype = (int)dtype;
}

void set_input_seq_axis(Context *ctx, int64_t input_index, int64_t axis) {
  InputDesc &in = declared_input(ctx, "set_input_seq_axis", input_index);
  if (in.t.ndim < 2 || axis < 0)
    fatal("set_input_seq_axis '%s': needs a [rows, sequence] input and a "
          "mesh axis, got %s and axis %lld",
          in.name.c_str(), shape_str(&in.t).c_str(), (long long)axis);
  in.seq_axis = axis;
}

void set_input_inner_axis(Context *ctx, int64_t input_index, int64_t axis,
                          int64_t chunks) {
  InputDesc &in = declared_input(ctx, "set_input_inner_axis", input_index);
  if (in.batch_axis < 0 || axis < 0 || axis == in.batch_axis)
    fatal("set_input_inner_axis '%s': needs an input split over a batch axis "
          "and another mesh axis, got batch axis %lld and axis %lld",
          in.name.c_str(), (long long)in.batch_axis, (long long)axis);
  if (chunks < 1 || in.t.shape[0] % chunks != 0)
    fatal("set_input_inner_axis '%s': %lld runs do not divide its %lld rows",
          in.name.c_str(), (long long)chunks, (long long)in.t.shape[0]);
  in.inner_axis = axis;
  in.chunks = chunks;
}

int64_t batch_ranks(const Context *ctx, const InputDesc &in) {
  int64_t n = 1;
  for (int64_t a : {in.batch_axis, in.inner_axis})
    if (a >= 0)
      n *= ctx->axis_sizes[a];
  return n;
}

int64_t batch_run_row0(const Context *ctx, const InputDesc &in, int64_t c) {
  auto coord = [&](int64_t a) {
    return a < 0 || ctx->coords.empty() ? 0 : ctx->coords[a];
  };
  auto size = [&](int64_t a) { return a < 0 ? 1 : ctx->axis_sizes[a]; };
  // Blocks of a run's length: the batch axis's blocks, each cut into the
  // runs, each of those split over the inner axis.
  int64_t block = (coord(in.batch_axis) * in.chunks + c) * size(in.inner_axis) +
                  coord(in.inner_axis);
  return block * (in.t.shape[0] / in.chunks);
}

void set_data_path(Context *ctx, const char *pattern) {
  check_ctx(ctx, "set_data_path");
  if (ctx->started)
    fatal("set_data_path: called after the program started");
  if (!pattern || !*pattern)
    fatal("set_data_path: empty pattern");
  ctx->data_path = pattern;
  ctx->data_path_set = true;
}

void set_token_vocab(Context *ctx, int64_t vocab) {
  check_ctx(ctx, "set_token_vocab");
  if (vocab < 1 || vocab > (int64_t(1) << 31))
    fatal("set_token_vocab: vocab must be in [1, 2^31], got %lld",
          (long long)vocab);
  ctx->token_vocab = vocab;
}

void set_lr_schedule(Context *ctx, int64_t kind, int64_t warmup_steps,
                     float min_lr, int64_t decay_steps) {
  check_ctx(ctx, "set_lr_schedule");
  if (kind != LrConstant && kind != LrCosine)
    fatal("set_lr_schedule: unknown kind %lld (0 = constant, 1 = cosine)",
          (long long)kind);
  if (warmup_steps < 0)
    fatal("set_lr_schedule: warmup steps must be >= 0, got %lld",
          (long long)warmup_steps);
  if (decay_steps < 0)
    fatal("set_lr_schedule: decay steps must be >= 0, got %lld",
          (long long)decay_steps);
  if (!std::isfinite(min_lr))
    fatal("set_lr_schedule: min_lr must be finite, got %g", (double)min_lr);
  ctx->lr_schedule_set = true;
  ctx->lr_kind = kind;
  ctx->lr_warmup = warmup_steps;
  ctx->lr_min = min_lr;
  ctx->lr_decay = decay_steps;
}

namespace {
ParamDesc &param_desc(Context *ctx, const char *op, int64_t param_index) {
  if (ctx->started)
    fatal("%s: called after the program started", op);
  if (param_index < 0 || param_index >= (int64_t)ctx->params.size())
    fatal("%s: parameter index %lld out of range (%zu parameters declared)", op,
          (long long)param_index, ctx->params.size());
  return ctx->params[param_index];
}
} // namespace

void shard_param(Context *ctx, int64_t param_index, int64_t dim,
                 int64_t mesh_axis) {
  check_ctx(ctx, "shard_param");
  ParamDesc &p = param_desc(ctx, "shard_param", param_index);
  if (dim < 0 || dim >= p.t.ndim)
    fatal("shard_param '%s': dimension %lld out of range for rank %d",
          p.name.c_str(), (long long)dim, p.t.ndim);
  if (mesh_axis < 0)
    fatal("shard_param '%s': invalid mesh axis %lld", p.name.c_str(),
          (long long)mesh_axis);
  for (int d = 0; d < 4; ++d)
    for (int64_t ax : p.shard_axes[d])
      if (ax == mesh_axis)
        fatal("shard_param '%s': axis %lld already splits dimension %d",
              p.name.c_str(), (long long)mesh_axis, d);
  // The axis itself is checked in start() (axes may be declared later).
  p.shard_axes[dim].push_back(mesh_axis);
}

void set_param_export_rows(Context *ctx, int64_t param_index, int64_t rows) {
  check_ctx(ctx, "set_param_export_rows");
  if (param_index < 0 || param_index >= (int64_t)ctx->params.size())
    fatal("set_param_export_rows: parameter index %lld out of range (%zu "
          "parameters declared)",
          (long long)param_index, ctx->params.size());
  if (rows < 1)
    fatal("set_param_export_rows '%s': rows must be >= 1, got %lld",
          ctx->params[param_index].name.c_str(), (long long)rows);
  ctx->params[param_index].export_rows = rows;
}

void set_param_segments(Context *ctx, int64_t param_index, int64_t dim,
                        int64_t s0, int64_t s1, int64_t s2) {
  const char *op = "set_param_segments";
  check_ctx(ctx, op);
  ParamDesc &p = param_desc(ctx, op, param_index);
  if (dim < 0 || dim >= p.t.ndim)
    fatal("%s '%s': dimension %lld out of range for rank %d", op,
          p.name.c_str(), (long long)dim, p.t.ndim);
  if (!p.segments[dim].empty())
    fatal("%s '%s': the segments of dimension %lld are already set", op,
          p.name.c_str(), (long long)dim);
  int64_t s[3] = {s0, s1, s2};
  std::vector<int64_t> segs;
  for (int k = 0; k < 3; ++k) {
    if (s[k] < 0)
      fatal("%s '%s': segment %d has negative size %lld", op, p.name.c_str(), k,
            (long long)s[k]);
    if (s[k] == 0) {
      for (int j = k + 1; j < 3; ++j)
        if (s[j] != 0)
          fatal("%s '%s': segment %d is 0, which ends the list, but segment "
                "%d is %lld",
                op, p.name.c_str(), k, j, (long long)s[j]);
      break;
    }
    segs.push_back(s[k]);
  }
  if (segs.empty())
    fatal("%s '%s': at least one segment size must be > 0", op, p.name.c_str());
  // Sizes are checked against the split in start() (axes may come later).
  p.segments[dim] = segs;
}

int64_t param_dim_blocks(const Context *ctx, const ParamDesc &p, int d) {
  int64_t n = 1;
  for (int64_t ax : p.shard_axes[d])
    n *= ctx->axis_sizes[ax];
  return n;
}

int64_t param_shard_mask(const ParamDesc &p) {
  int64_t mask = 0;
  for (int d = 0; d < 4; ++d)
    for (int64_t ax : p.shard_axes[d])
      mask |= int64_t(1) << ax;
  return mask;
}

ParamLayout param_layout(const Context *ctx, const ParamDesc &p,
                         const std::vector<int64_t> &coords) {
  ParamLayout l;
  for (int d = 0; d < 4; ++d) {
    int64_t blocks = param_dim_blocks(ctx, p, d), block = 0;
    for (int64_t ax : p.shard_axes[d]) // outer axis first: mixed radix
      block = block * ctx->axis_sizes[ax] + coords[ax];
    int64_t local = p.t.shape[d];
    l.global[d] = local * blocks;
    std::vector<int64_t> segs = p.segments[d];
    if (segs.empty())
      segs.push_back(l.global[d]);
    // The local dim is this rank's block of segment 0, then of segment 1...
    l.index[d].reserve((size_t)local);
    int64_t seg_start = 0;
    for (int64_t s : segs) {
      int64_t w = s / blocks;
      for (int64_t e = 0; e < w; ++e)
        l.index[d].push_back(seg_start + block * w + e);
      seg_start += s;
    }
  }
  return l;
}

std::vector<int64_t> rank_coords(const Context *ctx, int64_t rank) {
  std::vector<int64_t> c(ctx->axis_sizes.size(), 0);
  for (size_t i = c.size(); i-- > 0;) { // row-major, last axis fastest
    c[i] = rank % ctx->axis_sizes[i];
    rank /= ctx->axis_sizes[i];
  }
  return c;
}

void declare_state(Context *ctx, const char *name, int64_t ndim, int64_t d0,
                   int64_t d1, int64_t d2, int64_t d3) {
  check_ctx(ctx, "declare_state");
  if (ctx->started)
    fatal("declare_state: called after the program started");
  if (!name || !*name)
    fatal("declare_state: empty state name");
  int64_t d[4] = {d0, d1, d2, d3};
  check_dims("declare_state", name, ndim, d);
  StateDesc st;
  st.name = name;
  st.t = make_shape(ndim, d);
  if (!ctx->state_names.insert(st.name).second)
    fatal("declare_state: state '%s' declared twice", name);
  ctx->states.push_back(std::move(st));
}

void declare_states(Context *ctx, const StateDecl *rows, int64_t n) {
  check_table(ctx, "declare_states", rows, n);
  for (int64_t i = 0; i < n; ++i) {
    const StateDecl &r = rows[i];
    declare_state(ctx, r.name, r.ndim, r.d0, r.d1, r.d2, r.d3);
  }
}

Tensor *state(Context *ctx, int64_t index) {
  check_ctx(ctx, "state");
  if (index < 0 || index >= (int64_t)ctx->states.size())
    fatal("state: index %lld out of range (%zu state tensors declared)",
          (long long)index, ctx->states.size());
  if (!ctx->started)
    fatal("state: called before the program started");
  Tensor *t = &ctx->states[index].t;
  return t->data ? t : nullptr; // null: another pipeline rank's stage
}

void expect_bytes(Context *ctx, int64_t params, int64_t grads, int64_t state) {
  check_ctx(ctx, "expect_bytes");
  if (params < 0 || grads < 0 || state < 0)
    fatal("expect_bytes: byte counts must be >= 0, got params %lld, grads "
          "%lld, state %lld",
          (long long)params, (long long)grads, (long long)state);
  ctx->expected_set = true;
  ctx->expected_params = params;
  ctx->expected_grads = grads;
  ctx->expected_state = state;
}

void check_no_pending(Context *ctx, const char *when) {
  if (ctx->pending.empty())
    return;
  auto &first = *ctx->pending.begin();
  fatal("%s: %s on slot %lld was started and not waited for; call "
        "collective_wait(ctx, %lld) before the step ends",
        when, first.second.c_str(), (long long)first.first,
        (long long)first.first);
}

//===--- Buffers ----------------------------------------------------------===//

Tensor *param(Context *ctx, int64_t index) {
  check_ctx(ctx, "param");
  if (index < 0 || index >= (int64_t)ctx->params.size())
    fatal("param: index %lld out of range (%zu parameters declared)",
          (long long)index, ctx->params.size());
  if (!ctx->started)
    fatal("param: called before the program started");
  Tensor *t = &ctx->params[index].t;
  return t->data ? t : nullptr; // null: another pipeline rank's stage
}

void set_param_copy(Context *ctx, int64_t param_index, int64_t dtype) {
  const char *op = "set_param_copy";
  check_ctx(ctx, op);
  if (ctx->started)
    fatal("%s: called after the program started", op);
  if (param_index < 0 || param_index >= (int64_t)ctx->params.size())
    fatal("%s: parameter index %lld out of range (%zu parameters declared)", op,
          (long long)param_index, ctx->params.size());
  if (dtype != BF16 && dtype != F16)
    fatal("%s '%s': a copy is bf16 or f16, got %s", op,
          ctx->params[param_index].name.c_str(), dtype_name((int)dtype));
  ctx->params[param_index].copy.dtype = (int)dtype;
}

Tensor *param_copy(Context *ctx, int64_t index) {
  Tensor *p = param(ctx, index);
  Tensor &c = ctx->params[index].copy;
  if (c.dtype == F32)
    fatal("param_copy: parameter '%s' keeps no copy (set_param_copy)",
          ctx->params[index].name.c_str());
  if (!p)
    return nullptr;
  if (ctx->copies_stale)
    internal::refresh_param_copies(ctx);
  return &c;
}

Tensor *input(Context *ctx, int64_t index) {
  check_ctx(ctx, "input");
  if (index < 0 || index >= (int64_t)ctx->inputs.size())
    fatal("input: index %lld out of range (%zu inputs declared)",
          (long long)index, ctx->inputs.size());
  if (!ctx->started)
    fatal("input: called before the program started");
  return &ctx->inputs[index].t;
}

static constexpr size_t kArenaAlign = workspace::kAlign;
static constexpr size_t kMinChunk = size_t(1) << 20;

void *arena_alloc(Context *ctx, size_t bytes) {
  bytes = (bytes + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
  if (bytes == 0)
    bytes = kArenaAlign;
  // In a function planned by the compiler, an op's temporaries are in the
  // workspace the plan gave it.
  if (ctx->plan_fn >= 0)
    return internal::take_workspace(ctx, bytes);
  if (ctx->chunks.empty() ||
      ctx->chunk_offset + bytes > ctx->chunks.back().size) {
    size_t size = kMinChunk;
    if (!ctx->chunks.empty())
      size = 2 * ctx->chunks.back().size;
    if (size < bytes)
      size = bytes;
    ArenaChunk c;
    c.base = (char *)backend::alloc_bytes(ctx, size);
    c.size = size;
    ctx->chunks.push_back(c);
    ctx->chunk_offset = 0;
    size_t held = 0;
    for (auto &ch : ctx->chunks)
      held += ch.size;
    ctx->arena_capacity = std::max(ctx->arena_capacity, held);
  }
  void *p = ctx->chunks.back().base + ctx->chunk_offset;
  ctx->chunk_offset += bytes;
  ctx->arena_used += bytes;
  if (ctx->arena_used > ctx->arena_peak)
    ctx->arena_peak = ctx->arena_used;
  return p;
}

namespace internal {
int64_t arena_used(const Context *ctx) { return (int64_t)ctx->arena_used; }
} // namespace internal

void arena_reset(Context *ctx) {
  ctx->scratch.clear();
  ctx->marks.clear();
  size_t total = 0;
  for (auto &c : ctx->chunks)
    total += c.size;
  size_t want = std::max(total, ctx->arena_capacity);
  if (ctx->chunks.size() > 1 ||
      (!ctx->chunks.empty() && ctx->chunks[0].size < want)) {
    // The last step needed several chunks: replace them by one that holds
    // the most the arena ever held, so that later steps allocate nothing.
    for (auto &c : ctx->chunks)
      backend::free_bytes(ctx, c.base);
    ctx->chunks.clear();
    ArenaChunk c;
    c.base = (char *)backend::alloc_bytes(ctx, want);
    c.size = want;
    ctx->chunks.push_back(c);
  }
  ctx->chunk_offset = 0;
  ctx->arena_used = 0;
}

void set_microbatch(Context *ctx, int64_t mb) {
  check_ctx(ctx, "set_microbatch");
  if (mb < 0)
    fatal("set_microbatch: microbatch %lld is negative", (long long)mb);
  ctx->loop_mb = mb;
}

int64_t arena_mark(Context *ctx) {
  check_ctx(ctx, "arena_mark");
  ctx->marks.push_back({ctx->chunks.size(), ctx->chunk_offset,
                        ctx->scratch.size(), ctx->arena_used});
  return (int64_t)ctx->marks.size() - 1;
}

void arena_release(Context *ctx, int64_t mark) {
  check_ctx(ctx, "arena_release");
  if (mark < 0 || mark >= (int64_t)ctx->marks.size())
    fatal("arena_release: no mark %lld (%zu marks held)", (long long)mark,
          ctx->marks.size());
  Context::ArenaMark m = ctx->marks[mark];
  ctx->marks.resize(mark); // the mark and the ones after it are done
  ctx->scratch.resize(m.scratch);
  // Memory handed out since the mark is free again, chunks added since
  // included (the next step's reset makes one chunk as large as the most
  // ever held, so later steps allocate nothing).
  while (ctx->chunks.size() > m.chunks) {
    backend::free_bytes(ctx, ctx->chunks.back().base);
    ctx->chunks.pop_back();
  }
  ctx->chunk_offset = m.offset;
  ctx->arena_used = m.used;
}

void arena_free_all(Context *ctx) {
  ctx->scratch.clear();
  for (auto &c : ctx->chunks)
    backend::free_bytes(ctx, c.base);
  ctx->chunks.clear();
  ctx->chunk_offset = 0;
}

const char *dtype_name(int dtype) {
  switch (dtype) {
  case F32:
    return "f32";
  case I32:
    return "i32";
  case BF16:
    return "bf16";
  case F16:
    return "f16";
  }
  return "an unknown dtype";
}

static void check_dtype(const char *op, int64_t dtype) {
  if (dtype < F32 || dtype > F16)
    fatal("%s: unknown dtype %lld", op, (long long)dtype);
}

Tensor *alloc(Context *ctx, int64_t ndim, int64_t d0, int64_t d1, int64_t d2,
              int64_t d3, int64_t dtype) {
  check_ctx(ctx, "alloc");
  int64_t d[4] = {d0, d1, d2, d3};
  if (ndim < 0 || ndim > 4)
    fatal("alloc: rank must be 0..4, got %lld", (long long)ndim);
  for (int i = 0; i < 4; ++i)
    if (d[i] < 0 || (i >= ndim && d[i] != 1))
      fatal("alloc: invalid dimension %d = %lld for a rank-%lld tensor", i,
            (long long)d[i], (long long)ndim);
  check_dtype("alloc", dtype);
  Tensor t = make_shape(ndim, d);
  t.dtype = (int)dtype;
  t.data = (float *)arena_alloc(ctx, tensor_bytes(&t));
  ctx->scratch.push_back(t);
  return &ctx->scratch.back();
}

Tensor *alloc_on_stage(Context *ctx, int64_t stage, int64_t ndim, int64_t d0,
                       int64_t d1, int64_t d2, int64_t d3, int64_t dtype) {
  return owns_stage(ctx, stage) ? alloc(ctx, ndim, d0, d1, d2, d3, dtype)
                                : nullptr;
}

//===--- Mesh groups ------------------------------------------------------===//

void check_axis_mask(const Context *ctx, const char *op, int64_t axis_mask) {
  int64_t naxes = (int64_t)ctx->axis_sizes.size();
  if (axis_mask < 0 || (naxes < 63 && (axis_mask >> naxes) != 0))
    fatal("%s: axis mask %lld names axes that are not declared (%lld axes)", op,
          (long long)axis_mask, (long long)naxes);
}

int64_t group_size(const Context *ctx, int64_t axis_mask) {
  int64_t n = 1;
  for (size_t i = 0; i < ctx->axis_sizes.size(); ++i)
    if (axis_mask & (int64_t(1) << i))
      n *= ctx->axis_sizes[i];
  return n;
}

int64_t group_color(const Context *ctx, int64_t axis_mask) {
  // Row-major index of this rank's coordinates on the axes not in the mask.
  int64_t color = 0;
  for (size_t i = 0; i < ctx->axis_sizes.size(); ++i)
    if (!(axis_mask & (int64_t(1) << i)))
      color = color * ctx->axis_sizes[i] + ctx->coords[i];
  return color;
}

//===--- MPI helpers for the cuda backend ---------------------------------===//

void mpi_bcast_bytes(Context *ctx, void *data, size_t bytes, int root) {
  if (!ctx->use_mpi || ctx->world == 1)
    return;
  watchdog::bcast(ctx, data, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD,
                  watchdog::group_op("the broadcast of the NCCL id", -1));
}

int mpi_local_rank(Context *ctx) {
  if (!ctx->use_mpi)
    return 0;
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, ctx->rank,
                      MPI_INFO_NULL, &local);
  int r = 0;
  MPI_Comm_rank(local, &r);
  MPI_Comm_free(&local);
  return r;
}

} // namespace planrt
