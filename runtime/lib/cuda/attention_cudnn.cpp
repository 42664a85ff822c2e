//===- attention_cudnn.cpp - 16-bit causal attention on cuDNN's SDPA ------===//
//
// bf16 and fp16 attention without dropout runs on cuDNN's fused flash
// attention (its "SDPA" graphs), built through cuDNN's header-only C++
// frontend. On an H100 that is the fastest attention there is short of
// writing FlashAttention-3 again; planrt's own tiles (attention_tc_blocks.h)
// stay for fp32, for attention dropout (their mask is the host functors'
// hash of the global index, which cuDNN's Philox generator cannot draw), for
// head dims cuDNN does not take, and wherever cuDNN is absent.
//
// Loading. The program does not link cuDNN: the frontend's dynamic loading
// finds libcudnn.so.9 with dlopen on the first 16-bit attention (in a CUDA
// install or the nvidia-cudnn wheel, on LD_LIBRARY_PATH, or the file
// PLANRT_CUDNN_LIBRARY names), so a node without cuDNN still starts and runs
// the tiles. PLANRT_ATTENTION=tiles turns cuDNN off; PLANRT_ATTENTION=cudnn
// makes a problem cuDNN cannot run fatal (a benchmark that must not measure the
// tiles by accident).
//
// Graphs. One graph per problem shape (B, S, H, KV, D, type) and kind:
// the forward without statistics (training's forward keeps none), the
// forward with each row's log-sum-exp, and the backward. Each is built
// once, with the engine cuDNN's heuristics rank first; a shape no engine
// supports is remembered and runs the tiles, forward and backward alike.
// The operands are read in place from the packed qkv [B, S, (H + 2 KV) D]
// (strided [B, H, S, D] views), and dq, dk, dv written in place into dqkv.
//
// The backward needs the forward's output and log-sum-exp. A training
// step's attention keeps them (planc's plan-keep-attention: attention_lse
// writes the log-sum-exp into the plan's buffer, and attention_grad_lse
// reads it with the forward's output: backward_kept). Where they are not
// kept (an attention_grad of another origin) the backward runs the forward
// again into buffers of its own: a sixth of attention's work. Those
// buffers and cuDNN's workspace are the only device memory
// outside the plan (bytes_held(), printed with the memory report; planc
// --report bounds them with planrt/workspace.h's outside, so a graph whose
// workspace is more than that bound runs the tiles). The
// backward asks cuDNN for its deterministic algorithm (no atomics in dq)
// when its workspace stays linear in the sequence: cuDNN 9.25 and later
// order dq's sums on Hopper; older ones keep an S x S dP matrix per head
// (400 MB for GPT-2 at B 16, tens of GB at long context), which the plan
// never holds, so there the fastest algorithm runs and status() says so.
//
// Checks without a GPU. validate() puts a problem's graphs through the
// frontend's own rules for a given compute capability (dims, strides,
// masks, the loaded cuDNN's version limits) with no device: the tests run
// it over every problem the device suite will hand cuDNN, so that a graph
// cuDNN would refuse for its shape shows before a GPU session. Whether an
// engine then runs it is the device's to say.
//===----------------------------------------------------------------------===//

#include "attention_cudnn.h"

#include "../context.h"
#include "check.h"
#include "planrt/workspace.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace planrt {
namespace cuda_attention {
namespace cudnn {
namespace {

enum class Mode { Auto, Cudnn, Tiles };

/// PLANRT_ATTENTION, read once.
Mode mode() {
  static const Mode m = [] {
    const char *v = std::getenv("PLANRT_ATTENTION");
    if (!v || !*v || std::strcmp(v, "auto") == 0)
      return Mode::Auto;
    if (std::strcmp(v, "tiles") == 0)
      return Mode::Tiles;
    if (std::strcmp(v, "cudnn") == 0)
      return Mode::Cudnn;
    fatal("PLANRT_ATTENTION=%s: expected auto (cuDNN where it runs, else "
          "planrt's tiles), cudnn (fatal where cuDNN cannot run) or tiles",
          v);
  }();
  return m;
}

const char *const kTurnedOff =
    "16-bit attention runs planrt's tiles (PLANRT_ATTENTION=tiles)";

} // namespace
} // namespace cudnn
} // namespace cuda_attention
} // namespace planrt

#ifdef PLANRT_CUDNN_FRONTEND

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

#include <array>
#include <dlfcn.h>
#include <exception>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace cudnn_frontend {
// The frontend's symbols come from this handle (dynamic loading).
void *cudnn_dlhandle = nullptr;
} // namespace cudnn_frontend

namespace planrt {
namespace cuda_attention {
namespace cudnn {

namespace {

namespace fe = cudnn_frontend;

enum class Kind { Forward, ForwardStats, Backward };

// The graphs' tensors, by uid.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

/// Everything a graph depends on: the problem's dims, strides, mask, type
/// and kind.
using Key = std::tuple<std::array<int64_t, 13>, bool, bool, bool, Kind>;

Key key_of(const Sdpa &p, Kind k) {
  return {{p.B, p.H, p.KV, p.D, p.sq, p.sk, p.q_batch, p.q_row, p.kv_batch,
           p.kv_row, p.o_batch, p.o_row, p.stats_head},
          p.bf16,
          p.bottom_right,
          p.causal,
          k};
}

struct Graph {
  std::shared_ptr<fe::graph::Graph> graph; // null: cuDNN does not run it
  int64_t workspace = 0;
};

/// A device buffer that only grows (cudaFree waits for the device first).
struct Buffer {
  void *p = nullptr;
  size_t bytes = 0;
  void *at_least(size_t need, const char *what) {
    if (need > bytes) {
      if (p)
        cuda_check::call(cudaFree(p), what);
      p = nullptr;
      bytes = 0;
      cudaError_t e = cudaMalloc(&p, need);
      if (e != cudaSuccess)
        fatal("attention on cuDNN: cudaMalloc of %zu B for %s failed (%s); "
              "the device is full outside the planned memory: run with "
              "PLANRT_ATTENTION=tiles, which needs none",
              need, what, cudaGetErrorString(e));
      bytes = need;
    }
    return p;
  }
};

struct State {
  enum { Untried, On, Off } load = Untried;
  bool required = false; // PLANRT_ATTENTION=cudnn
  std::string status;
  cudnnHandle_t handle = nullptr;
  std::map<Key, Graph> graphs;
  Buffer workspace, out, lse, dkv;
  bool nondeterministic = false; // some backward has no deterministic engine
};

State &state() {
  static State s;
  return s;
}

std::string shape_text(const Sdpa &p) {
  std::string t = std::string(p.bf16 ? "bf16" : "fp16") + " B " +
                  std::to_string(p.B) + " S " + std::to_string(p.sq);
  if (p.sk != p.sq || !p.causal)
    t += " over " + std::to_string(p.sk) +
         (p.causal ? " keys" : " keys, unmasked");
  return t + " H " + std::to_string(p.H) + " KV " + std::to_string(p.KV) +
         " D " + std::to_string(p.D);
}

/// Opens libcudnn.so.9 (or PLANRT_CUDNN_LIBRARY) for the frontend, once;
/// "" or why cuDNN cannot run. Needs no GPU.
const std::string &open_library() {
  static const std::string why = [] {
    // The frontend's few CUDA runtime calls go through a libcudart it opens
    // itself: the one of this program's CUDA major (user's choice first).
    std::string cudart =
        "libcudart.so." + std::to_string(CUDART_VERSION / 1000);
    setenv("CUDNN_FRONTEND_CUDART_LIB_NAME", cudart.c_str(), 0);
    // A deterministic backward without the S x S dP workspace: the ordered
    // dq sums of cuDNN >= 9.25 on Hopper (the user's setting first).
    setenv("CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT", "0", 0);
    const char *lib = std::getenv("PLANRT_CUDNN_LIBRARY");
    if (!lib || !*lib)
      lib = "libcudnn.so.9";
    dlerror();
    fe::cudnn_dlhandle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!fe::cudnn_dlhandle) {
      const char *e = dlerror();
      return std::string("cuDNN 9 was not found (") + (e ? e : lib) +
             "); put libcudnn.so.9 on LD_LIBRARY_PATH or name it in "
             "PLANRT_CUDNN_LIBRARY";
    }
    try {
      size_t v = fe::detail::get_backend_version();
      if (v < 90000)
        return "cuDNN " + std::to_string(v) +
               " is older than 9.0, which its flash attention needs";
    } catch (const std::exception &e) {
      return std::string("loading cuDNN failed: ") + e.what();
    }
    return std::string();
  }();
  return why;
}

/// Loads cuDNN once (false: attention runs the tiles).
bool load() {
  State &s = state();
  if (s.load != State::Untried)
    return s.load == State::On;
  s.load = State::Off;
  if (mode() == Mode::Tiles) {
    s.status = kTurnedOff;
    return false;
  }
  s.required = mode() == Mode::Cudnn;
  auto off = [&](const std::string &why) {
    s.status = "16-bit attention runs planrt's tiles: " + why;
    if (s.required)
      fatal("PLANRT_ATTENTION=cudnn, but %s", why.c_str());
    return false;
  };
  if (!open_library().empty())
    return off(open_library());
  try {
    cudnnStatus_t st = fe::detail::create_handle(&s.handle);
    if (st != CUDNN_STATUS_SUCCESS)
      return off("cudnnCreate failed (status " + std::to_string((int)st) + ")");
    s.status = "16-bit attention runs cuDNN " +
               std::to_string(fe::detail::get_backend_version()) +
               "'s flash attention (built against " +
               std::to_string(CUDNN_VERSION) + ")";
  } catch (const std::exception &e) {
    return off(std::string("loading cuDNN failed: ") + e.what());
  }
  s.load = State::On;
  return true;
}

std::shared_ptr<fe::graph::Tensor_attributes>
tensor(fe::graph::Graph &g, const char *name, Uid uid,
       std::vector<int64_t> dims, std::vector<int64_t> strides) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(std::move(dims))
                      .set_stride(std::move(strides)));
}

/// The graph of kind `k` for problem `p`, defined (not validated), for a
/// GPU of compute capability `sm_version` (0: this device's). The nodes
/// copy the graph's context when they are added: the version comes first.
std::shared_ptr<fe::graph::Graph>
define(const Sdpa &p, Kind k, bool deterministic, int sm_version = 0) {
  auto g = std::make_shared<fe::graph::Graph>();
  if (sm_version > 0)
    g->set_sm_version(sm_version);
  g->set_io_data_type(p.bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t B = p.B, H = p.H, KV = p.KV, D = p.D;
  // Every operand is a strided [B, heads, rows, D] view, heads D apart.
  const std::vector<int64_t> qs = {p.q_batch, D, p.q_row, 1},
                             kvs = {p.kv_batch, D, p.kv_row, 1},
                             os = {p.o_batch, D, p.o_row, 1},
                             ss = {H * p.stats_head, p.stats_head, 1, 1};
  auto q = tensor(*g, "q", kQ, {B, H, p.sq, D}, qs);
  auto kt = tensor(*g, "k", kK, {B, KV, p.sk, D}, kvs);
  auto v = tensor(*g, "v", kV, {B, KV, p.sk, D}, kvs);
  // Causal: query row i sees keys up to i, or up to i + sk - sq aligned to
  // the last key (a later chunk's queries over every key before them).
  // Unmasked: every key (a ring's block of earlier positions).
  const auto align = p.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                    : fe::DiagonalAlignment_t::TOP_LEFT;
  if (k != Kind::Backward) {
    // COMPOSITE, the forward the device suite checks: the frontend would
    // pick its UNIFIED op where the cuDNN headers built against are 9.21
    // or newer (these are 9.19), a path no GPU run here has compared.
    auto opts =
        fe::graph::SDPA_attributes()
            .set_name("attention")
            .set_implementation(fe::AttentionImplementation_t::COMPOSITE)
            .set_generate_stats(k == Kind::ForwardStats)
            .set_attn_scale(p.scale);
    if (p.causal)
      opts.set_diagonal_alignment(align).set_diagonal_band_right_bound(0);
    auto [o, stats] = g->sdpa(q, kt, v, opts);
    o->set_output(true).set_uid(kO).set_dim({B, H, p.sq, D}).set_stride(os);
    if (k == Kind::ForwardStats)
      stats->set_output(true)
          .set_uid(kStats)
          .set_data_type(fe::DataType_t::FLOAT)
          .set_dim({B, H, p.sq, 1})
          .set_stride(ss);
  } else {
    auto o = tensor(*g, "o", kO, {B, H, p.sq, D}, os);
    auto dout = tensor(*g, "dout", kDO, {B, H, p.sq, D}, os);
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim({B, H, p.sq, 1})
                               .set_stride(ss)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("attention_grad")
                    .set_attn_scale(p.scale)
                    .set_deterministic_algorithm(deterministic);
    if (p.causal)
      opts.set_diagonal_alignment(align).set_diagonal_band_right_bound(0);
    auto [dq, dk, dv] = g->sdpa_backward(q, kt, v, o, dout, stats, opts);
    dq->set_output(true).set_uid(kDQ).set_dim({B, H, p.sq, D}).set_stride(qs);
    dk->set_output(true).set_uid(kDK).set_dim({B, KV, p.sk, D}).set_stride(kvs);
    dv->set_output(true).set_uid(kDV).set_dim({B, KV, p.sk, D}).set_stride(kvs);
  }
  return g;
}

/// The graph of kind `k` for problem `p` (built at first use); null when
/// no engine runs it, with the reason in `why`.
std::shared_ptr<fe::graph::Graph> build(const Sdpa &p, Kind k,
                                        bool deterministic, int64_t budget,
                                        int64_t &workspace, std::string &why) {
  State &s = state();
  std::shared_ptr<fe::graph::Graph> g = define(p, k, deterministic);
  auto ok = [&](fe::error_t e, const char *step) {
    if (e.is_good())
      return true;
    why = std::string(step) + ": " + e.get_message();
    return false;
  };
  if (!ok(g->validate(), "validate") ||
      !ok(g->build_operation_graph(s.handle), "build_operation_graph") ||
      !ok(g->create_execution_plans(
              {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}),
          "create_execution_plans"))
    return nullptr;
  // Engines whose workspace is over the budget planc counts are passed
  // over, so that the first that builds is one that may run. The filter
  // sees the engine's own workspace; the backward's total adds the
  // frontend's fp32 dq accumulator and row sums (4 B H sq (D + 1) bytes).
  g->deselect_workspace_greater_than(
      k == Kind::Backward ? budget - 4 * p.B * p.H * p.sq * (p.D + 1) : budget);
  if (!ok(g->check_support(s.handle), "check_support") ||
      !ok(g->build_plans(s.handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE),
          "build_plans") ||
      !ok(g->get_workspace_size(workspace), "get_workspace_size"))
    return nullptr;
  return g;
}

/// The graph of kind k, built at first use; null: the tiles run it.
const Graph &graph(const Sdpa &p, Kind k) {
  State &s = state();
  Key key = key_of(p, k);
  auto it = s.graphs.find(key);
  if (it != s.graphs.end())
    return it->second;
  Graph made;
  std::string why;
  // 64 MiB, and for the backward (linear in its queries) the fp32 dq
  // accumulator and row sums flash attention's backward keeps, twice over:
  // what planc --report counts outside the plan.
  const int64_t budget = workspace::outside::cudnn_workspace_budget(
      p.B, p.H, p.sq, p.D, k == Kind::Backward);
  try {
    made.graph = build(p, k, true, budget, made.workspace, why);
    if (k == Kind::Backward && (!made.graph || made.workspace > budget)) {
      // No deterministic engine within the budget: the fastest one, said
      // in status().
      std::string why_any;
      made.graph = build(p, k, false, budget, made.workspace, why_any);
      if (made.graph)
        s.nondeterministic = true;
      else if (why.empty())
        why = why_any;
    }
    if (made.graph && made.workspace > budget) {
      why = "its workspace, " + std::to_string(made.workspace) +
            " B, is more than planc counts for it (" + std::to_string(budget) +
            " B)";
      made.graph = nullptr;
    }
  } catch (const std::exception &e) {
    made.graph = nullptr;
    why = e.what();
  }
  if (!made.graph) {
    const char *what = k == Kind::Backward ? "backward" : "forward";
    if (s.required)
      fatal("PLANRT_ATTENTION=cudnn, but cuDNN has no %s engine for "
            "attention of %s: %s",
            what, shape_text(p).c_str(), why.c_str());
    s.status += "; the tiles run " + shape_text(p) + " (cuDNN's " + what +
                ": " + why + ")";
  }
  return s.graphs.emplace(key, std::move(made)).first->second;
}

/// Whether cuDNN may run this problem at all (before any graph); with
/// PLANRT_ATTENTION=cudnn, a problem it may not run is fatal.
bool candidate(const Sdpa &p, bool dropout) {
  // 16-byte aligned operand views: head dims in multiples of 8 elements.
  const char *why =
      dropout ? "attention dropout draws planrt's own mask, which cuDNN "
                "cannot draw"
      : !workspace::outside::cudnn_attention(true, false, p.D)
          ? "cuDNN's flash attention takes head dims that are multiples of "
            "8, up to 256"
      : p.sq <= 0 || p.sk <= 0 ? "the sequence is empty"
                               : nullptr;
  if (!why)
    return load();
  if (mode() == Mode::Cudnn)
    fatal("PLANRT_ATTENTION=cudnn, but cuDNN cannot run attention of %s: %s",
          shape_text(p).c_str(), why);
  State &s = state();
  if (!load())
    return false;
  std::string line = "; the tiles run " + shape_text(p) + " (" + why + ")";
  if (s.status.find(line) == std::string::npos)
    s.status += line;
  return false;
}

void execute(cudaStream_t stream, const Graph &g,
             std::unordered_map<int64_t, void *> pack, const char *what) {
  State &s = state();
  void *ws = g.workspace > 0 ? s.workspace.at_least((size_t)g.workspace,
                                                    "cuDNN's workspace")
                             : nullptr;
  cudnnStatus_t st = fe::detail::set_stream(s.handle, stream);
  if (st != CUDNN_STATUS_SUCCESS)
    fatal("attention on cuDNN: cudnnSetStream failed (status %d)", (int)st);
  fe::error_t e;
  try {
    e = g.graph->execute(s.handle, pack, ws);
  } catch (const std::exception &x) {
    fatal("attention on cuDNN: %s failed: %s", what, x.what());
  }
  if (!e.is_good())
    fatal("attention on cuDNN: %s failed: %s", what, e.get_message().c_str());
}

void *mut(const void *p) { return const_cast<void *>(p); }

} // namespace

bool runs(const Sdpa &p, bool stats, bool backward, bool dropout) {
  if (!candidate(p, dropout))
    return false;
  if (backward)
    return graph(p, Kind::ForwardStats).graph && graph(p, Kind::Backward).graph;
  return graph(p, stats ? Kind::ForwardStats : Kind::Forward).graph != nullptr;
}

void forward(cudaStream_t s, const Sdpa &p, const SdpaIo &io) {
  const Graph &g = graph(p, io.stats ? Kind::ForwardStats : Kind::Forward);
  std::unordered_map<int64_t, void *> pack = {
      {kQ, mut(io.q)}, {kK, mut(io.k)}, {kV, mut(io.v)}, {kO, io.o}};
  if (io.stats)
    pack[kStats] = io.stats;
  execute(s, g, std::move(pack), "the forward");
}

void backward(cudaStream_t s, const Sdpa &p, const SdpaIo &io) {
  std::unordered_map<int64_t, void *> pack = {
      {kQ, mut(io.q)}, {kK, mut(io.k)},    {kV, mut(io.v)},
      {kO, io.o},      {kStats, io.stats}, {kDO, mut(io.dout)},
      {kDQ, io.dq},    {kDK, io.dk},       {kDV, io.dv}};
  execute(s, graph(p, Kind::Backward), std::move(pack), "the backward");
}

std::string validate(const Sdpa &p, bool backward, int sm_version) {
  if (!open_library().empty())
    return open_library();
  struct Part {
    Kind kind;
    bool deterministic;
    const char *what;
  };
  std::vector<Part> parts = {
      {Kind::Forward, false, "the forward"},
      {Kind::ForwardStats, false, "the forward with statistics"}};
  if (backward) {
    parts.push_back({Kind::Backward, true, "the deterministic backward"});
    parts.push_back({Kind::Backward, false, "the backward"});
  }
  for (const Part &part : parts) {
    try {
      std::shared_ptr<fe::graph::Graph> g =
          define(p, part.kind, part.deterministic, sm_version);
      fe::error_t e = g->validate();
      if (!e.is_good())
        return std::string(part.what) + " of " + shape_text(p) + ": " +
               e.get_message();
    } catch (const std::exception &e) {
      return std::string(part.what) + " of " + shape_text(p) + ": " + e.what();
    }
  }
  return "";
}

size_t library_version() {
  return open_library().empty() ? fe::detail::get_backend_version() : 0;
}

void *scratch(Scratch which, size_t bytes) {
  State &s = state();
  switch (which) {
  case Scratch::Out:
    return s.out.at_least(bytes, "the backward's recomputed attention output");
  case Scratch::Lse:
    return s.lse.at_least(bytes, "attention's log-sum-exp");
  case Scratch::Dkv:
    return s.dkv.at_least(bytes, "context parallelism's key and value "
                                 "gradients from cuDNN");
  }
  return nullptr;
}

size_t bytes_held() {
  const State &s = state();
  return s.workspace.bytes + s.out.bytes + s.lse.bytes + s.dkv.bytes;
}

const char *status() {
  State &s = state();
  static std::string line;
  line = s.status;
  if (s.nondeterministic)
    line += "; some backward had no deterministic engine (dq by atomics)";
  return line.c_str();
}

} // namespace cudnn
} // namespace cuda_attention
} // namespace planrt

#else // !PLANRT_CUDNN_FRONTEND

// Built without cuDNN's frontend (scripts/setup.sh fetches it from PyPI):
// 16-bit attention runs planrt's tiles.
namespace planrt {
namespace cuda_attention {
namespace cudnn {

namespace {
std::string status_line;
[[noreturn]] void never(const char *what) {
  fatal("attention on cuDNN: %s called in a planrt built without cuDNN's "
        "frontend, where runs() is always false",
        what);
}
} // namespace

bool runs(const Sdpa &, bool, bool, bool) {
  if (mode() == Mode::Cudnn)
    fatal("PLANRT_ATTENTION=cudnn, but this planrt was built without cuDNN's "
          "frontend (scripts/setup.sh fetches it; rebuild libplanrt_cuda)");
  status_line = mode() == Mode::Tiles
                    ? kTurnedOff
                    : "16-bit attention runs planrt's tiles: this planrt was "
                      "built without cuDNN's frontend";
  return false;
}
void forward(cudaStream_t, const Sdpa &, const SdpaIo &) { never("forward"); }
void backward(cudaStream_t, const Sdpa &, const SdpaIo &) { never("backward"); }
void *scratch(Scratch, size_t) { never("scratch"); }
std::string validate(const Sdpa &, bool, int) {
  return "this planrt was built without cuDNN's frontend";
}
size_t library_version() { return 0; }
size_t bytes_held() { return 0; }
const char *status() { return status_line.c_str(); }

} // namespace cudnn
} // namespace cuda_attention
} // namespace planrt

#endif

// One GPU's attention over the packed qkv [B, S, (H + 2 KV) D] (attention.cu).
namespace planrt {
namespace cuda_attention {
namespace cudnn {

Sdpa Sdpa::whole(const kernels::AttnShape &a, bool bf16) {
  const int64_t W = a.width(), O = a.H * a.D;
  return {a.B,     a.H, a.KV,    a.D, a.S, a.S,     a.S * W, W,
          a.S * W, W,   a.S * O, O,   a.S, a.scale, bf16,    false};
}

namespace {
/// q, k and v: column ranges of the packed rows (2-byte elements).
SdpaIo packed(const kernels::AttnShape &a, const void *qkv) {
  const char *base = static_cast<const char *>(qkv);
  SdpaIo io;
  io.q = base;
  io.k = base + 2 * a.H * a.D;
  io.v = base + 2 * (a.H + a.KV) * a.D;
  return io;
}
void *column(void *p, int64_t elements) {
  return static_cast<char *>(p) + 2 * elements;
}
} // namespace

bool forward(cudaStream_t s, const kernels::AttnShape &a, bool bf16,
             const void *qkv, void *out, float *lse) {
  const Sdpa p = Sdpa::whole(a, bf16);
  if (!runs(p, lse != nullptr, false, false))
    return false;
  SdpaIo io = packed(a, qkv);
  io.o = out;
  io.stats = lse;
  forward(s, p, io);
  return true;
}

bool runs_forward(const kernels::AttnShape &a, bool bf16, bool lse,
                  bool dropout) {
  return runs(Sdpa::whole(a, bf16), lse, false, dropout);
}

float *lse_scratch(int64_t rows) {
  return static_cast<float *>(
      scratch(Scratch::Lse, (size_t)rows * sizeof(float)));
}

bool runs_backward(const kernels::AttnShape &a, bool bf16, bool dropout) {
  return runs(Sdpa::whole(a, bf16), true, true, dropout);
}

bool backward_kept(cudaStream_t s, const kernels::AttnShape &a, bool bf16,
                   bool dropout, const void *qkv, const void *out,
                   const float *lse, const void *dout, void *dqkv) {
  if (!runs_backward(a, bf16, dropout))
    return false;
  SdpaIo io = packed(a, qkv);
  io.o = const_cast<void *>(out);
  io.stats = const_cast<float *>(lse);
  io.dout = dout;
  io.dq = dqkv;
  io.dk = column(dqkv, a.H * a.D);
  io.dv = column(dqkv, (a.H + a.KV) * a.D);
  backward(s, Sdpa::whole(a, bf16), io);
  return true;
}

bool backward(cudaStream_t s, const kernels::AttnShape &a, bool bf16,
              bool dropout, const void *qkv, const void *dout, void *dqkv) {
  if (!runs_backward(a, bf16, dropout))
    return false;
  void *out =
      scratch(Scratch::Out,
              (size_t)workspace::outside::cudnn_recomputed(a.B, a.H, a.S, a.D));
  float *lse = lse_scratch(a.B * a.H * a.S);
  forward(s, a, bf16, qkv, out, lse);
  return backward_kept(s, a, bf16, dropout, qkv, out, lse, dout, dqkv);
}

} // namespace cudnn
} // namespace cuda_attention
} // namespace planrt
