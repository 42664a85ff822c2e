//===- host_backend.cpp - Host backend: malloc, oneDNN, MPI ---------------===//
//
// Each MPI rank plays one GPU. Kernels run the shared functors of
// planrt/kernels.h in loops split over the rank's threads (OpenMP); GEMM is
// oneDNN's dnnl_sgemm on the same threads; collectives run on one MPI
// communicator per axis mask (MPI_Comm_split, cached), each waited for under
// the watchdog (lib/watchdog.h: --timeout): large sums and gathers as rings
// of point-to-point messages (ring.h), small ones and the rest as MPI's
// non-blocking collectives.
//===----------------------------------------------------------------------===//

#include "../context.h"
#include "planrt/context_parallel.h"
#include "planrt/kernels.h"
#include "ring.h"

#include <malloc.h>
#include <mpi.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include "../watchdog.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <type_traits>
#include <utility>
#include <vector>

namespace planrt {

namespace {
/// A ring all-reduce started on a slot, run by its wait (ring.h).
struct DeferredSum {
  float *data;
  int64_t count, axis_mask;
};
struct HostState {
  std::map<int64_t, MPI_Comm> comms;                    // axis mask -> comm
  std::map<int64_t, std::vector<MPI_Request>> requests; // slot -> requests
  std::map<int64_t, int64_t> request_masks;             // slot -> axis mask
  std::map<int64_t, DeferredSum> deferred;              // slot -> ring sum
  std::vector<float> ring_scratch; // received blocks, reused
  std::vector<MPI_Request> shifts; // ring_shift_start's, until the wait
  int64_t shift_axis = -1;
};
HostState *state(Context *ctx) { return (HostState *)ctx->backend; }
} // namespace

namespace detail {
namespace {
MPI_Comm group_comm(Context *ctx, const char *op, int64_t axis_mask);
}
} // namespace detail

namespace {
/// With a pipeline, collectives run inside units that only some ranks run,
/// so communicators cannot be split (over the world) at first use: make
/// the one of every axis mask now, on every rank.
void precreate_comms(Context *ctx) {
  if (ctx->pipeline_axis < 0 || !ctx->use_mpi || ctx->world == 1)
    return;
  int64_t naxes = (int64_t)ctx->axis_sizes.size();
  for (int64_t mask = 1; mask < (int64_t(1) << naxes) && mask < 4096; ++mask)
    detail::group_comm(ctx, "declare_pipeline", mask);
}
} // namespace

/// Slurm's task count on this node: SLURM_STEP_TASKS_PER_NODE ("2(x3),1":
/// per node of the step, runs compressed) at index SLURM_NODEID; 0 if unset.
static int slurm_node_tasks() {
  const char *list = std::getenv("SLURM_STEP_TASKS_PER_NODE");
  const char *id = std::getenv("SLURM_NODEID");
  if (!list || !id)
    return 0;
  long node = std::strtol(id, nullptr, 10), at = 0;
  for (const char *p = list; *p;) {
    char *end = nullptr;
    long tasks = std::strtol(p, &end, 10), times = 1;
    if (end == p)
      return 0;
    p = end;
    if (std::strncmp(p, "(x", 2) == 0) {
      times = std::strtol(p + 2, &end, 10);
      p = *end == ')' ? end + 1 : end;
    }
    if (node < at + times)
      return (int)tasks;
    at += times;
    if (*p == ',')
      ++p;
  }
  return 0;
}

/// The ranks on this node, from the launcher: mpirun (Open MPI, MPICH),
/// torchrun-style and srun (which sets no OMPI_COMM_WORLD_LOCAL_SIZE: its
/// ranks each took every core). Not a collective: a context may start on
/// some ranks only (tests).
static int node_ranks() {
  for (const char *var :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"})
    if (const char *v = std::getenv(var))
      if (int n = std::atoi(v); n > 0)
        return n;
  return std::max(1, slurm_node_tasks());
}

/// The threads of one rank (docs/runtime.md): PLANRT_NUM_THREADS, else
/// OMP_NUM_THREADS, else the cores this process may run on divided among
/// the ranks of this node, at least 1. mpirun binds each rank to one core
/// by default (1 thread); `--bind-to none` leaves the node's cores to share.
static int host_threads() {
  for (const char *var : {"PLANRT_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const char *v = std::getenv(var)) {
      char *end = nullptr;
      long n = std::strtol(v, &end, 10);
      if (end == v || *end || n < 1 || n > 4096)
        fatal("%s must be an integer in [1, 4096], got '%s'", var, v);
      return (int)n;
    }
  cpu_set_t set;
  int cores =
      sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  return std::max(1, cores / node_ranks());
}

namespace backend {

const char *name() { return "host"; }

int64_t library_bytes(Context *) { return 0; }
bool queue_sumsq(Context *, const Tensor *, Tensor *) { return false; }
std::string library_note(Context *) { return std::string(); }

void init(Context *ctx) {
  ctx->backend = new HostState;
  // Keep freed memory of up to 32 MiB blocks in the heap (see kPiece).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  int threads = host_threads();
  omp_set_num_threads(threads);
  // The stop signals (SIGTERM, SIGUSR1) are for the main thread, never for
  // a worker inside a GEMM: a signal frame pushed on a worker's stack in
  // the middle of oneDNN's JIT kernels corrupted the heap (about 1 stop in
  // 10). The workers are created here and keep the mask.
#pragma omp parallel num_threads(threads)
  {
    if (omp_get_thread_num() != 0) {
      sigset_t stop;
      sigemptyset(&stop);
      sigaddset(&stop, SIGTERM);
      sigaddset(&stop, SIGUSR1);
      pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    }
  }
  watchdog::init(ctx);
  precreate_comms(ctx);
}

void finalize(Context *ctx) {
  HostState *s = state(ctx);
  if (!s)
    return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) {
    // Only a context torn down mid-step can have collectives in flight.
    for (auto &kv : s->requests)
      MPI_Waitall((int)kv.second.size(), kv.second.data(), MPI_STATUSES_IGNORE);
    for (auto &kv : s->comms)
      MPI_Comm_free(&kv.second);
  }
  watchdog::finalize(ctx);
  delete s;
  ctx->backend = nullptr;
}

void *alloc_bytes(Context *, size_t bytes) {
  // 256-byte alignment, like cudaMalloc (the arena relies on it).
  size_t size = (bytes + 255) / 256 * 256;
  if (size == 0)
    size = 256;
  void *p = std::aligned_alloc(256, size);
  if (!p)
    fatal("out of host memory allocating %zu bytes", bytes);
  return p;
}

void free_bytes(Context *, void *p) { std::free(p); }

void zero_bytes(Context *, void *p, size_t bytes) {
  if (bytes)
    std::memset(p, 0, bytes);
}

void to_device(Context *, void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src)
    std::memcpy(dst, src, bytes);
}

void to_host(Context *, void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src)
    std::memcpy(dst, src, bytes);
}

void synchronize(Context *) {}

void copy_bytes(Context *, void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src)
    std::memcpy(dst, src, bytes);
}

// The data goes over the p2p communicator of lib/pipeline.cpp, tag = dtype:
// MPI keeps the messages of one pair of ranks in order.
void p2p_send(Context *ctx, const Tensor *t, int64_t, int64_t, int world_peer) {
  p2p_mpi_isend(ctx, world_peer, t->dtype, t->data, tensor_bytes(t));
}

void p2p_recv(Context *ctx, Tensor *out, int64_t axis, int64_t peer,
              int world_peer) {
  size_t bytes = 0;
  int tag = 0;
  p2p_mpi_probe(ctx, world_peer, &bytes, &tag);
  check_p2p_message(ctx, out, axis, peer,
                    (int64_t)(bytes / (size_t)dtype_bytes(tag)), tag);
  p2p_mpi_recv(ctx, world_peer, tag, out->data, bytes);
}

void p2p_wait_all(Context *) {} // the MPI sends: pipeline_end_step

} // namespace backend

namespace detail {

/// gemm16 widens its operands in exactly the bytes staging would take
/// (workspace.h native::cuda_matmul is the cuda rule, not this one).
constexpr bool kGemm16InPlace = false;
/// Column sums (bias_grad, the norms' parameter gradients) take the
/// chunks' partials of workspace.h column_partials: not on the host.
constexpr bool kColumnPartials = false;

/// all_gather's attention as one library call: none on the host (the
/// block functors are the reference; cuda runs cuDNN there).
template <class T>
bool attention_cp_whole(Context *, const kernels::AttnCp &, const T *,
                        const T *, T *, float *) {
  return false;
}
template <class T>
bool attention_cp_grad_whole(Context *, const kernels::AttnCp &, const T *,
                             const T *, const T *, T *, float *, const T *,
                             const float *) {
  return false;
}
/// ring's blocks by a library: none on the host (cuda: cuDNN), so no
/// output for their backward either.
template <class T>
bool attention_ring_block(Context *, const kernels::AttnCp &,
                          const kernels::KvBlock &, const T *, const T *, T *,
                          float *, float *) {
  return false;
}
template <class T>
bool attention_ring_block_grads(Context *, const kernels::AttnCp &,
                                const kernels::KvBlock &, const T *, const T *,
                                const T *, const T *, const float *, float *,
                                float *, T *) {
  return false;
}
template <class T> T *ring_output(Context *, const kernels::AttnCp &) {
  return nullptr;
}

/// Below this many invocations a kernel runs on the calling thread (a
/// parallel region costs a few microseconds): element-wise and cheap
/// functors (kernels.h) from 4096 on, functors with a loop inside (rows,
/// columns, chunks) from 16 on.
constexpr int64_t kParallelMinCheap = 4096;
constexpr int64_t kParallelMinLoop = 16;

template <class F, class = void> struct HasRange : std::false_type {};
template <class F>
struct HasRange<F, std::void_t<decltype(std::declval<const F &>().range(
                       int64_t(), int64_t()))>> : std::true_type {};
template <class F, class = void> struct IsElementwise : std::false_type {};
template <class F>
struct IsElementwise<F, std::enable_if_t<F::kElementwise>> : std::true_type {};
template <class F, class = void> struct IsCheap : std::false_type {};
template <class F>
struct IsCheap<F, std::enable_if_t<F::kCheap>> : std::true_type {};

/// Runs invocations [begin, end) of `fn` on this thread: its own range loop
/// if it has one, one vector loop if it is element-wise (kernels.h), else
/// one invocation after the other. Compiled twice, everything it calls
/// inlined (flatten): for AVX2 (x86-64-v3, 8 floats per vector) and for the
/// baseline (SSE2), picked when the program starts by the CPU it runs on.
/// The library is built with -ffp-contract=off, so both give the same bits.
template <class F>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default"), flatten))
#endif
void run_range(const F &fn, int64_t begin, int64_t end) {
  if constexpr (HasRange<F>::value) {
    fn.range(begin, end);
  } else if constexpr (IsElementwise<F>::value) {
    const F f = fn; // a local copy: its fields stay in registers
    PLANRT_SIMD
    for (int64_t i = begin; i < end; ++i)
      f(i);
  } else {
    for (int64_t i = begin; i < end; ++i)
      fn(i);
  }
}

/// Each invocation writes its own outputs and sums in a fixed order, so how
/// the index range is split over threads changes no bit of the result.
template <class F> void launch(Context *, int64_t n, const F &f) {
  constexpr int64_t min = IsElementwise<F>::value || IsCheap<F>::value
                              ? kParallelMinCheap
                              : kParallelMinLoop;
  if (n < min || omp_get_max_threads() == 1) {
    run_range(f, 0, n);
    return;
  }
#pragma omp parallel
  {
    int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    run_range(f, n * t / nt, n * (t + 1) / nt);
  }
}

void gemm(Context *, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
          const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
          int64_t ldc, float beta = 0.0f) {
  // oneDNN picks its kernels by the CPU's ISA at run time (AVX2, AVX-512)
  // and runs them on this rank's OpenMP threads, the kernels' pool.
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f,
                                a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success)
    fatal("matmul: dnnl_sgemm failed (status %d) for %lld x %lld x %lld",
          (int)st, (long long)m, (long long)n, (long long)k);
}

/// a and b widened to fp32 (exactly), one fp32 GEMM, c rounded to nearest
/// even: a GPU's arithmetic (16-bit loads, fp32 sums, one rounding), in
/// copies taken from the op's workspace (the memory plan reserves them).
void gemm16(Context *ctx, int dtype, int c_dtype, bool ta, bool tb, int64_t m,
            int64_t n, int64_t k, const void *a, int64_t lda, const void *b,
            int64_t ldb, void *c, int64_t ldc, float beta = 0.0f) {
  const int64_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
  auto widen = [&](const void *x, int64_t count) {
    float *w = (float *)arena_alloc(ctx, (size_t)count * sizeof(float));
    launch(ctx, count, kernels::CastFn{x, w, dtype, kernels::CastF32});
    return w;
  };
  const float *a32 = widen(a, na), *b32 = widen(b, nb);
  if (c_dtype == F32) {
    gemm(ctx, ta, tb, m, n, k, a32, lda, b32, ldb, (float *)c, ldc, beta);
    return;
  }
  float *c32 = (float *)arena_alloc(ctx, (size_t)nc * sizeof(float));
  if (beta != 0.0f) // accumulating: the fp32 sum starts from c, widened
    launch(ctx, nc, kernels::CastFn{c, c32, dtype, kernels::CastF32});
  gemm(ctx, ta, tb, m, n, k, a32, lda, b32, ldb, c32, ldc, beta);
  launch(ctx, nc, kernels::CastFn{c32, c, kernels::CastF32, dtype});
}

/// No epilogues on the host: matmul_bias runs the GEMM, then bias_add (and
/// matmul_bias_add the add)
/// (oneDNN's sgemm has no bias, and the 16-bit product is rounded before
/// the add, as the two ops round it); matmul_dgelu and matmul_bias_grad
/// run their two ops likewise.
bool gemm_bias(Context *, int, bool, bool, int64_t, int64_t, int64_t,
               const void *, int64_t, const void *, int64_t, const void *,
               void *, int64_t, void * = nullptr, const void * = nullptr) {
  return false;
}
bool gemm_dgelu(Context *, int, bool, bool, int64_t, int64_t, int64_t,
                const void *, int64_t, const void *, int64_t, const void *,
                void *, int64_t) {
  return false;
}
bool gemm_bgrad(Context *, int, int, int, bool, bool, int64_t, int64_t, int64_t,
                const void *, int64_t, const void *, int64_t, void *, int64_t,
                void *, float) {
  return false;
}

namespace {
MPI_Comm group_comm(Context *ctx, const char *op, int64_t axis_mask) {
  if (!ctx->use_mpi)
    fatal("%s: a group of %lld ranks needs MPI", op,
          (long long)group_size(ctx, axis_mask));
  HostState *s = state(ctx);
  auto it = s->comms.find(axis_mask);
  if (it == s->comms.end()) {
    // key = world rank: members are ordered by their coordinates.
    MPI_Comm comm;
    int rc = MPI_Comm_split(MPI_COMM_WORLD, (int)group_color(ctx, axis_mask),
                            ctx->rank, &comm);
    if (rc != MPI_SUCCESS)
      fatal("MPI_Comm_split failed (code %d)", rc);
    it = s->comms.emplace(axis_mask, comm).first;
  }
  return it->second;
}

void check_mpi(int rc, const char *call) {
  if (rc != MPI_SUCCESS)
    fatal("%s failed (code %d)", call, rc);
}

/// Per-member block counts of the block collectives are MPI ints.
int block_count(const char *op, int64_t count) {
  if (count > INT_MAX)
    fatal("%s: %lld elements per rank exceed MPI's count limit (%d) on the "
          "host backend; split the tensor into smaller pieces",
          op, (long long)count, INT_MAX);
  return (int)count;
}

// Messages go in pieces of at most 16 MiB: the rings' segments, and the
// all-reduces left to MPI (maxima, small sums) since MPI counts are int.
// Open MPI's non-blocking all-reduce takes a temporary buffer of the
// message's size; under malloc's mmap threshold (set in init) it is reused
// from the heap instead of being mapped and zeroed by the kernel anew on
// every call (that cost 2 ranks x 1 thread ~9% of a GPT-2 124M step when
// gradient sums still went to MPI).
constexpr int64_t kPiece = int64_t(1) << 22;

/// From this many floats (256 KiB) on, sums and gathers run as rings
/// (ring.h); below, MPI's tree algorithms take fewer messages.
constexpr int64_t kRingMin = int64_t(1) << 16;

/// Waits for a collective over mesh axis `axis` under the watchdog.
void wait_one(Context *ctx, MPI_Request *r, const char *name, int64_t axis) {
  watchdog::wait_all(ctx, 1, r, watchdog::group_op(name, int64_t(1) << axis));
}

/// The watchdog-polled wait of a ring's messages.
ring::WaitFn ring_wait(Context *ctx, const char *name, int64_t axis_mask) {
  return [ctx, name, axis_mask](int n, MPI_Request *r) {
    watchdog::wait_all(ctx, n, r, watchdog::group_op(name, axis_mask));
  };
}
} // namespace

void allreduce(Context *ctx, float *data, int64_t count, int64_t axis_mask,
               ReduceOp op) {
  const char *name = op == ReduceOp::Max ? "all_reduce_max" : "all_reduce_sum";
  MPI_Comm comm = group_comm(ctx, name, axis_mask);
  if (op == ReduceOp::Sum && count >= kRingMin) {
    ring::all_reduce(comm, data, count, kPiece, state(ctx)->ring_scratch,
                     ring_wait(ctx, name, axis_mask));
    return;
  }
  std::vector<MPI_Request> reqs;
  for (int64_t off = 0; off < count; off += kPiece) {
    int n = (int)(count - off < kPiece ? count - off : kPiece);
    reqs.emplace_back();
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data + off, n, MPI_FLOAT,
                             op == ReduceOp::Max ? MPI_MAX : MPI_SUM, comm,
                             &reqs.back()),
              "MPI_Iallreduce");
  }
  watchdog::wait_all(ctx, (int)reqs.size(), reqs.data(),
                     watchdog::group_op(name, axis_mask));
}

// A large sum runs as a ring at its wait: MPI progresses messages only
// inside MPI calls, and a rank makes none between the start and the wait,
// so a ring (or Open MPI's non-blocking all-reduce) started here would move
// no data before the wait anyway.
void allreduce_start(Context *ctx, float *data, int64_t count,
                     int64_t axis_mask, int64_t slot) {
  MPI_Comm comm = group_comm(ctx, "all_reduce_sum_start", axis_mask);
  if (count >= kRingMin) {
    state(ctx)->deferred[slot] = DeferredSum{data, count, axis_mask};
    return;
  }
  std::vector<MPI_Request> &reqs = state(ctx)->requests[slot];
  state(ctx)->request_masks[slot] = axis_mask;
  for (int64_t off = 0; off < count; off += kPiece) {
    int n = (int)(count - off < kPiece ? count - off : kPiece);
    reqs.emplace_back();
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data + off, n, MPI_FLOAT, MPI_SUM,
                             comm, &reqs.back()),
              "MPI_Iallreduce");
  }
}

void collective_wait(Context *ctx, int64_t slot) {
  HostState *s = state(ctx);
  const char *name = "collective_wait (all_reduce_sum_start)";
  auto d = s->deferred.find(slot);
  if (d != s->deferred.end()) {
    DeferredSum sum = d->second;
    s->deferred.erase(d);
    ring::all_reduce(group_comm(ctx, name, sum.axis_mask), sum.data, sum.count,
                     kPiece, s->ring_scratch,
                     ring_wait(ctx, name, sum.axis_mask));
    return;
  }
  auto it = s->requests.find(slot);
  if (it == s->requests.end())
    return; // nothing was started (a group of one rank)
  watchdog::wait_all(ctx, (int)it->second.size(), it->second.data(),
                     watchdog::group_op(name, s->request_masks[slot]));
  s->requests.erase(it);
  s->request_masks.erase(slot);
}

namespace {
/// The MPI type that moves values of dtype as they are (16-bit floats as
/// 2-byte integers, a mixture of experts' choices as i32).
MPI_Datatype moved_type(int dtype) {
  return dtype == F32 ? MPI_FLOAT : dtype == I32 ? MPI_INT32_T : MPI_UINT16_T;
}
} // namespace

void allgather(Context *ctx, const void *send, void *recv, int64_t count,
               int64_t axis, int dtype) {
  MPI_Comm comm = group_comm(ctx, "all_gather", int64_t(1) << axis);
  if (dtype == F32 && count * group_size(ctx, int64_t(1) << axis) >= kRingMin) {
    ring::all_gather(comm, (const float *)send, (float *)recv, count, kPiece,
                     ring_wait(ctx, "all_gather", int64_t(1) << axis));
    return;
  }
  int n = block_count("all_gather", count);
  int g;
  MPI_Comm_rank(comm, &g);
  // 16-bit values move as they are.
  MPI_Datatype type = moved_type(dtype);
  // MPI takes a send buffer inside the receive buffer only as MPI_IN_PLACE.
  const void *from =
      send == (const char *)recv + (int64_t)g * count * dtype_bytes(dtype)
          ? MPI_IN_PLACE
          : send;
  MPI_Request r;
  check_mpi(MPI_Iallgather(from, n, type, recv, n, type, comm, &r),
            "MPI_Iallgather");
  wait_one(ctx, &r, "all_gather", axis);
}

void reduce_scatter(Context *ctx, const float *send, float *recv, int64_t count,
                    int64_t axis) {
  MPI_Comm comm = group_comm(ctx, "reduce_scatter", int64_t(1) << axis);
  if (count * group_size(ctx, int64_t(1) << axis) >= kRingMin) {
    ring::reduce_scatter(comm, send, recv, count, kPiece,
                         state(ctx)->ring_scratch,
                         ring_wait(ctx, "reduce_scatter", int64_t(1) << axis));
    return;
  }
  int n = block_count("reduce_scatter", count);
  MPI_Request r;
  check_mpi(
      MPI_Ireduce_scatter_block(send, recv, n, MPI_FLOAT, MPI_SUM, comm, &r),
      "MPI_Ireduce_scatter_block");
  wait_one(ctx, &r, "reduce_scatter", axis);
}

void ring_shift_start(Context *ctx, const void *send, void *recv, int64_t count,
                      int64_t axis, int dtype) {
  MPI_Comm comm = group_comm(ctx, "ring_shift", int64_t(1) << axis);
  int g, G;
  MPI_Comm_rank(comm, &g);
  MPI_Comm_size(comm, &G);
  int n = block_count("ring_shift", count);
  MPI_Datatype type = moved_type(dtype);
  HostState *s = state(ctx);
  s->shift_axis = axis;
  // Point-to-point on the group's communicator: matched apart from its
  // collectives. Started in order, received in order (MPI keeps it).
  s->shifts.emplace_back();
  check_mpi(
      MPI_Irecv(recv, n, type, (g + G - 1) % G, 1, comm, &s->shifts.back()),
      "MPI_Irecv");
  s->shifts.emplace_back();
  check_mpi(MPI_Isend(send, n, type, (g + 1) % G, 1, comm, &s->shifts.back()),
            "MPI_Isend");
}

void ring_shift_wait(Context *ctx) {
  HostState *s = state(ctx);
  if (s->shifts.empty())
    return;
  watchdog::wait_all(
      ctx, (int)s->shifts.size(), s->shifts.data(),
      watchdog::group_op("ring_shift", int64_t(1) << s->shift_axis));
  s->shifts.clear();
}

void alltoall(Context *ctx, const void *send, void *recv, int64_t count,
              int64_t axis, int dtype) {
  MPI_Comm comm = group_comm(ctx, "all_to_all", int64_t(1) << axis);
  int n = block_count("all_to_all", count);
  MPI_Datatype type = moved_type(dtype);
  MPI_Request r;
  check_mpi(MPI_Ialltoall(send, n, type, recv, n, type, comm, &r),
            "MPI_Ialltoall");
  wait_one(ctx, &r, "all_to_all", axis);
}

// Point-to-point, one message per pair that has rows to move, polled by
// the watchdog like the rings' (a non-blocking MPI_Ialltoallv progresses
// only inside MPI calls, which cost a routed exchange on host ranks several
// times its transfer). Its own tag: the group's other point-to-point
// traffic (rings, ring shifts) is matched apart.
void alltoallv(Context *ctx, const void *send, const int64_t *send_counts,
               void *recv, const int64_t *recv_counts, int64_t axis,
               int dtype) {
  constexpr int kTag = 0x4132;
  const char *name = "all_to_all_v";
  MPI_Comm comm = group_comm(ctx, name, int64_t(1) << axis);
  int G = (int)ctx->axis_sizes[axis];
  MPI_Datatype type = moved_type(dtype);
  const int64_t eb = dtype_bytes(dtype);
  std::vector<MPI_Request> reqs;
  int64_t so = 0, ro = 0;
  for (int k = 0; k < G; ++k) {
    if (recv_counts[k] > 0) {
      reqs.emplace_back();
      check_mpi(MPI_Irecv((char *)recv + ro * eb,
                          block_count(name, recv_counts[k]), type, k, kTag,
                          comm, &reqs.back()),
                "MPI_Irecv");
    }
    ro += recv_counts[k];
  }
  for (int k = 0; k < G; ++k) {
    if (send_counts[k] > 0) {
      reqs.emplace_back();
      check_mpi(MPI_Isend((const char *)send + so * eb,
                          block_count(name, send_counts[k]), type, k, kTag,
                          comm, &reqs.back()),
                "MPI_Isend");
    }
    so += send_counts[k];
  }
  if (!reqs.empty())
    watchdog::wait_all(ctx, (int)reqs.size(), reqs.data(),
                       watchdog::group_op(name, int64_t(1) << axis));
}

} // namespace detail
} // namespace planrt

#include "../ops_impl.inc"
