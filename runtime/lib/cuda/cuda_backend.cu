//===- cuda_backend.cu - CUDA backend: cudaMalloc, cuBLASLt, NCCL ---------===//
//
// One GPU per rank, chosen by the rank's index within its node. Kernels run the
// shared functors of planrt/kernels.h from a grid-stride __global__ kernel, or
// a family's own kernel under lib/cuda/ (overloads of detail::launch below:
// element-wise functors eight elements a thread, elementwise.cu;
// AdamW updates are queued and launched together; 16-bit attention goes to
// cuDNN first, attention_cudnn.cpp); GEMM is cuBLASLt (with the bias of
// matmul_bias in its epilogue; fp32
// accumulation, TF32 when the plan opts in); collectives are NCCL, with one
// communicator per axis mask split from a world communicator whose ncclUniqueId
// is broadcast over the control plane (planrt's TCP rendezvous, lib/net: the
// cuda target does not use MPI). Kernels and copies run on one compute stream;
// every NCCL call runs on one communication stream, ordered after the compute
// work issued before it by an event. Blocking collectives make the compute
// stream wait for them at once; all_reduce_sum_start records an event per slot
// that collective_wait makes the compute stream wait on, so the compute stream
// runs on meanwhile. One stream for all NCCL calls keeps them in program order
// on every rank (no cross-stream NCCL deadlock). Point to point (send/recv): a
// header (count, dtype) goes over the control plane first (lib/pipeline.cpp),
// so the receiver checks the count before the NCCL transfer. On the pipeline
// axis every ordered pair of coordinates (i -> j) has its own 2-rank
// communicator and stream (made at init), so the sends of one direction never
// wait behind the receives of the other: two ranks that both send and then
// receive do not deadlock. send copies the tensor into a stream-ordered buffer
// (cudaMallocAsync) freed after the transfer; recv orders the compute stream
// after the transfer. Other axes use the axis communicator on the communication
// stream (a send there is matched in NCCL's order and may wait for the peer's
// receive). Communicators are non-blocking (ncclConfig_t blocking = 0): every
// NCCL call that returns ncclInProgress is polled with ncclCommGetAsyncError,
// and every wait for a stream (cudaStreamSynchronize's uses) polls
// cudaStreamQuery and the communicators' async errors, both under the watchdog
// (lib/watchdog.h, --timeout): when it fires, the communicators are aborted
// (ncclCommAbort) before MPI_Abort.
// This file does not include mpi.h (see mpi_bcast_bytes in context.h).
//===----------------------------------------------------------------------===//

#include "../context.h"
#include "../watchdog.h"
#include "attention.h"
#include "attention_cp.h"
#include "attention_cudnn.h"
#include "classifier.h"
#include "column_sums.h"
#include "elementwise.h"
#include "elementwise_blocks.h"
#include "embedding.h"
#include "norms.h"
#include "optimizer.h"
#include "planrt/context_parallel.h"
#include "planrt/kernels.h"
#include "planrt/workspace.h"
#include "sums.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace planrt {

namespace {

void check_cuda(cudaError_t e, const char *what, const char *file, int line) {
  if (e != cudaSuccess)
    fatal("CUDA error %s (%s) in %s at %s:%d", cudaGetErrorName(e),
          cudaGetErrorString(e), what, file, line);
}

void check_cublas(cublasStatus_t s, const char *what, const char *file,
                  int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fatal("cuBLASLt error %s (%s) in %s at %s:%d", cublasLtGetStatusName(s),
          cublasLtGetStatusString(s), what, file, line);
}

void check_nccl(ncclResult_t r, const char *what, const char *file, int line) {
  if (r != ncclSuccess && r != ncclInProgress)
    fatal("NCCL error %d (%s) in %s at %s:%d", (int)r, ncclGetErrorString(r),
          what, file, line);
}

#define CUDA_CHECK(call) check_cuda((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) check_cublas((call), #call, __FILE__, __LINE__)
#define NCCL_CHECK(call) check_nccl((call), #call, __FILE__, __LINE__)

/// A cached cuBLASLt matmul: descriptors and the chosen algorithm (none:
/// cuBLASLt has no algorithm with this one's epilogue).
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
  bool found = false;
};

/// What a GEMM does besides the product, in cuBLASLt's epilogue: `kind`
/// (CUBLASLT_EPILOGUE_DEFAULT: nothing), its vector (a bias read, or a
/// bias gradient written: CUBLASLT_MATMUL_DESC_BIAS_POINTER) of type
/// `vector_type`, and its auxiliary matrix (GELU's pre-activation, written
/// by GELU_AUX_BIAS, read by DGELU), laid out like c.
struct Epilogue {
  cublasLtEpilogue_t kind = CUBLASLT_EPILOGUE_DEFAULT;
  const void *vector = nullptr;
  cudaDataType_t vector_type = CUDA_R_32F;
  const void *aux = nullptr;
  /// The C matrix of D = A B + beta C when it is not D (a residual, laid
  /// out like D; beta 1).
  const void *residual = nullptr;
};

// (ta, tb, m, n, k, lda, ldb, ldc, alignment of a, b, c, element type of a
// and b, of c, the epilogue, its vector's type and alignment, its auxiliary
// matrix's alignment, the input C's alignment, whether C is another
// buffer than D: an algorithm chosen for C = D need not run out of place)
using GemmKey =
    std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
               int, int, int, cudaDataType_t, cudaDataType_t, int,
               cudaDataType_t, int, int, int, bool>;

constexpr size_t kWorkspaceBytes =
    (size_t)workspace::outside::kCublasLtWorkspace;

struct CudaState {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void *workspace = nullptr;
  cudaStream_t comm_stream = nullptr; // every NCCL call
  cudaEvent_t ready = nullptr;        // compute work before a collective
  cudaEvent_t done = nullptr;         // end of a blocking collective
  std::map<int64_t, cudaEvent_t> slot_events; // slot -> end of its collective
  cudaEvent_t shifted = nullptr;              // end of the ring shifts started
  std::set<int64_t> started;                  // slots with a collective
  ncclComm_t world = nullptr;
  std::map<int64_t, ncclComm_t> comms; // axis mask -> communicator
  std::map<GemmKey, GemmPlan> gemms;
  /// Pipeline axis channels, by (sender, receiver) coordinate: rank 0 of
  /// `comm` is the sender.
  struct Channel {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
  };
  std::map<std::pair<int64_t, int64_t>, Channel> channels;
  std::set<cudaStream_t> p2p_streams; // with transfers since the last wait
  // The last communication issued since the last wait for the streams
  // (named in the watchdog's message; axis_mask -2: none).
  watchdog::Op last_comm = watchdog::group_op("the device's work", -2);
  /// GEMM shapes (plan cache entries) by (epilogue, whether cuBLASLt has an
  /// algorithm for it: else the op runs its parts as separate kernels).
  std::map<std::pair<int, bool>, int64_t> epilogues;
  /// AdamW updates queued since the last other use of the stream
  /// (lib/cuda/optimizer_blocks.h): launched together by flush_queues.
  optimizer::AdamWBatch updates;
  /// The gradient norm's sums of squares likewise (lib/cuda/sums_blocks.h),
  /// with their partials buffer (workspace::outside::kSumsqPartials). At
  /// most one of the two queues holds work.
  sums::SumsqBatch sumsq;
};

/// Launches what is queued (AdamW updates, or sums of squares).
void flush_queues(CudaState *s) {
  if (s->updates.count) {
    cuda_optimizer::adamw(s->stream, s->updates);
    s->updates.count = 0;
  }
  if (s->sumsq.count) {
    cuda_sums::sumsq_batch(s->stream, s->sumsq);
    s->sumsq.count = 0;
  }
}

/// The backend's state, with the queued work launched: everything that
/// puts work on a stream, copies or frees asks for it here, so the queued
/// work runs before whatever comes after it in the program (and a queue
/// holds only ops that follow each other).
CudaState *state(Context *ctx) {
  if (!ctx->backend)
    fatal("cuda backend used before it was initialized");
  auto *s = (CudaState *)ctx->backend;
  if (s->updates.count || s->sumsq.count)
    flush_queues(s);
  return s;
}

/// Every communicator of the context (the world one included).
std::vector<ncclComm_t> all_comms(CudaState *s) {
  std::vector<ncclComm_t> v;
  for (auto &kv : s->channels)
    if (kv.second.comm)
      v.push_back(kv.second.comm);
  for (auto &kv : s->comms)
    if (kv.second && kv.second != s->world)
      v.push_back(kv.second);
  if (s->world)
    v.push_back(s->world);
  return v;
}

/// Fatal if a communicator failed asynchronously (a peer's error, a network
/// failure); true while one still has an operation in progress.
bool comms_in_progress(CudaState *s) {
  bool busy = false;
  for (ncclComm_t c : all_comms(s)) {
    ncclResult_t r = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(c, &r);
    if (q != ncclSuccess)
      r = q;
    if (r == ncclInProgress)
      busy = true;
    else if (r != ncclSuccess)
      fatal("NCCL error %d (%s) reported asynchronously by a communicator",
            (int)r, ncclGetErrorString(r));
  }
  return busy;
}

/// The watchdog's abort hook: abort every communicator (NCCL kernels
/// waiting for a missing peer return).
void abort_comms(Context *ctx) {
  CudaState *s = (CudaState *)ctx->backend;
  if (!s)
    return;
  for (ncclComm_t c : all_comms(s))
    ncclCommAbort(c);
}

/// After an NCCL call on a non-blocking communicator: waits until `comm`
/// has no operation in progress (the call was enqueued).
void settle(Context *ctx, ncclComm_t comm, const watchdog::Op &op) {
  watchdog::wait_until(ctx, op, [&] {
    ncclResult_t r = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm, &r);
    if (q != ncclSuccess)
      r = q;
    if (r == ncclInProgress)
      return false;
    if (r != ncclSuccess)
      fatal("NCCL error %d (%s) in %s", (int)r, ncclGetErrorString(r), op.name);
    return true;
  });
}

/// ncclCommDestroy of a non-blocking communicator: ncclCommFinalize, polled
/// until its pending operations are done, then the destroy.
void destroy_comm(Context *ctx, ncclComm_t comm) {
  NCCL_CHECK(ncclCommFinalize(comm));
  settle(ctx, comm, watchdog::group_op("NCCL communicator finalize", -2));
  NCCL_CHECK(ncclCommDestroy(comm));
}

/// cudaStreamSynchronize under the watchdog: polls the stream and the
/// communicators' async errors.
void stream_wait(Context *ctx, CudaState *s, cudaStream_t stream) {
  watchdog::wait_until(ctx, s->last_comm, [&] {
    cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess)
      return true;
    if (e != cudaErrorNotReady)
      check_cuda(e, "cudaStreamQuery", __FILE__, __LINE__);
    comms_in_progress(s);
    return false;
  });
}

/// Records the communication just issued for the watchdog's message.
void note_comm(CudaState *s, const char *name, int64_t axis_mask, int peer,
               bool to_peer) {
  s->last_comm = peer >= 0 ? watchdog::peer_op(name, peer, to_peer)
                           : watchdog::group_op(name, axis_mask);
}

int pointer_alignment(const void *p) {
  uintptr_t v = (uintptr_t)p;
  int align = 256;
  while (align > 2 && v % align) // 16-bit elements may sit at 2 bytes
    align /= 2;
  return align;
}

} // namespace

namespace detail {
namespace {
ncclComm_t group_comm(Context *ctx, const char *op, int64_t axis_mask);
}
} // namespace detail

namespace backend {

const char *name() { return "cuda"; }

int64_t library_bytes(Context *) {
  return (int64_t)(kWorkspaceBytes + workspace::outside::kSumsqPartials +
                   cuda_attention::cudnn::bytes_held());
}

bool queue_sumsq(Context *ctx, const Tensor *g, Tensor *acc) {
  if (!ctx->backend)
    fatal("cuda backend used before it was initialized");
  auto *s = (CudaState *)ctx->backend;
  const int64_t n = g->numel();
  if (n <= 0 || !sums::queueable(n))
    return false;
  if (s->updates.count || !sums::fits(s->sumsq, n))
    flush_queues(s);
  sums::add(s->sumsq, g->data, n, acc->data);
  return true;
}
std::string library_note(Context *ctx) {
  std::string note;
  if (*cuda_attention::cudnn::status())
    note += std::string("attention: ") + cuda_attention::cudnn::status() + "\n";
  const CudaState *s = static_cast<const CudaState *>(ctx->backend);
  if (!s || s->epilogues.empty())
    return note;
  // Per epilogue: GEMM shapes that ran it, and that fell back to separate
  // kernels (cuBLASLt had no algorithm).
  std::map<int, std::pair<int64_t, int64_t>> by_kind;
  for (const auto &kv : s->epilogues)
    (kv.first.second ? by_kind[kv.first.first].first
                     : by_kind[kv.first.first].second) += kv.second;
  note += "gemm epilogues:";
  const char *sep = " ";
  for (const auto &kv : by_kind) {
    const char *name = kv.first == CUBLASLT_EPILOGUE_BIAS ? "bias"
                       : kv.first == CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                           ? "bias+gelu"
                       : kv.first == CUBLASLT_EPILOGUE_DGELU   ? "dgelu"
                       : kv.first == CUBLASLT_EPILOGUE_BGRADA  ? "bias grad"
                       : kv.first == CUBLASLT_EPILOGUE_DEFAULT ? "residual"
                                                               : "other";
    note += sep + std::string(name) + " " + std::to_string(kv.second.first) +
            " shape(s) in cuBLASLt's epilogue, " +
            std::to_string(kv.second.second) + " as separate kernels";
    sep = "; ";
  }
  note += "\n";
  return note;
}

void init(Context *ctx) {
  CudaState *s = new CudaState;
  ctx->backend = s;
  int count = 0;
  const cudaError_t found = cudaGetDeviceCount(&count);
  if (found == cudaErrorInsufficientDriver) {
    // No driver at all (a machine without a GPU) or one older than the
    // runtime this program was built with: say which, and what to do.
    int driver = 0;
    cudaDriverGetVersion(&driver);
    std::string has = driver == 0
                          ? "no NVIDIA driver is loaded here"
                          : "the NVIDIA driver here supports CUDA up to " +
                                std::to_string(driver / 1000) + "." +
                                std::to_string(driver % 1000 / 10);
    fatal("no usable GPU: %s, and this program was built with CUDA %d.%d, "
          "which needs a driver for CUDA %d or newer. Run it on a GPU node "
          "(nvidia-smi lists its GPUs and driver), or compile the plan for "
          "CPU ranks with planc --target=host",
          has.c_str(), CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10,
          CUDART_VERSION / 1000);
  }
  if (found == cudaErrorNoDevice || (found == cudaSuccess && count == 0)) {
    const char *visible = std::getenv("CUDA_VISIBLE_DEVICES");
    fatal("no CUDA device is visible%s%s%s; nvidia-smi lists the node's GPUs",
          visible ? " (CUDA_VISIBLE_DEVICES=" : "", visible ? visible : "",
          visible ? ")" : "");
  }
  CUDA_CHECK(found);
  int local = mpi_local_rank(ctx);
  if (local >= count)
    fatal("rank %d is rank %d on its node but only %d CUDA device(s) are "
          "visible; start at most one rank per GPU",
          ctx->rank, local, count);
  s->device = local;
  CUDA_CHECK(cudaSetDevice(s->device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s->comm_stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&s->ready, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
  CUBLAS_CHECK(cublasLtCreate(&s->lt));
  CUDA_CHECK(cudaMalloc(&s->workspace, kWorkspaceBytes));
  CUDA_CHECK(cudaMalloc(&s->sumsq.partials,
                        (size_t)workspace::outside::kSumsqPartials));
  watchdog::init(ctx);
  watchdog::set_abort_hook(ctx, abort_comms);
  if (ctx->use_mpi && ctx->world > 1) {
    ncclUniqueId id;
    if (ctx->rank == 0)
      NCCL_CHECK(ncclGetUniqueId(&id));
    mpi_bcast_bytes(ctx, &id, sizeof(id), 0);
    // Non-blocking: calls may return ncclInProgress; settle() polls them.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NCCL_CHECK(
        ncclCommInitRankConfig(&s->world, ctx->world, id, ctx->rank, &config));
    settle(ctx, s->world, watchdog::group_op("NCCL communicator creation", -1));
  }
  int64_t pp = ctx->pipeline_axis;
  if (s->world && pp >= 0) {
    // Collectives run inside units that only some ranks run: split the
    // communicator of every axis mask now, on every rank (not at first use).
    int64_t naxes = (int64_t)ctx->axis_sizes.size();
    for (int64_t mask = 1; mask < (int64_t(1) << naxes) && mask < 4096; ++mask)
      detail::group_comm(ctx, "declare_pipeline", mask);
  }
  if (s->world && pp >= 0 && ctx->axis_sizes[pp] > 1) {
    // Collective over the world: every rank splits for every ordered pair.
    int64_t P = ctx->axis_sizes[pp], me = ctx->coords[pp];
    int color = (int)group_color(ctx, int64_t(1) << pp);
    for (int64_t i = 0; i < P; ++i)
      for (int64_t j = 0; j < P; ++j) {
        if (i == j)
          continue;
        bool member = me == i || me == j;
        ncclComm_t comm = nullptr;
        NCCL_CHECK(ncclCommSplit(s->world, member ? color : NCCL_SPLIT_NOCOLOR,
                                 me == i ? 0 : 1, &comm, nullptr));
        settle(ctx, s->world,
               watchdog::group_op("NCCL communicator split", -1));
        if (!member)
          continue;
        settle(ctx, comm,
               watchdog::group_op("NCCL communicator split", int64_t(1) << pp));
        CudaState::Channel ch;
        ch.comm = comm;
        CUDA_CHECK(
            cudaStreamCreateWithFlags(&ch.stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&ch.done, cudaEventDisableTiming));
        s->channels[{i, j}] = ch;
      }
  }
}

void finalize(Context *ctx) {
  if (!ctx->backend)
    return;
  CudaState *s = state(ctx);
  stream_wait(ctx, s, s->stream);
  stream_wait(ctx, s, s->comm_stream);
  for (auto &kv : s->channels) {
    stream_wait(ctx, s, kv.second.stream);
    destroy_comm(ctx, kv.second.comm);
    kv.second.comm = nullptr;
    CUDA_CHECK(cudaEventDestroy(kv.second.done));
    CUDA_CHECK(cudaStreamDestroy(kv.second.stream));
  }
  for (auto &kv : s->slot_events)
    CUDA_CHECK(cudaEventDestroy(kv.second));
  CUDA_CHECK(cudaEventDestroy(s->ready));
  CUDA_CHECK(cudaEventDestroy(s->done));
  if (s->shifted)
    CUDA_CHECK(cudaEventDestroy(s->shifted));
  for (auto it = s->comms.begin(); it != s->comms.end();) {
    ncclComm_t c = it->second;
    it = s->comms.erase(it); // not aborted by the watchdog once destroyed
    if (c != s->world)
      destroy_comm(ctx, c);
  }
  if (s->world)
    destroy_comm(ctx, s->world);
  s->world = nullptr;
  for (auto &kv : s->gemms) {
    GemmPlan &p = kv.second;
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p.a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p.b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p.c));
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p.op));
  }
  CUDA_CHECK(cudaFree(s->workspace));
  CUDA_CHECK(cudaFree(s->sumsq.partials));
  CUBLAS_CHECK(cublasLtDestroy(s->lt));
  CUDA_CHECK(cudaStreamDestroy(s->comm_stream));
  CUDA_CHECK(cudaStreamDestroy(s->stream));
  watchdog::finalize(ctx);
  delete s;
  ctx->backend = nullptr;
}

void *alloc_bytes(Context *ctx, size_t bytes) {
  (void)state(ctx);
  void *p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
  if (e == cudaErrorMemoryAllocation) {
    size_t free_b = 0, total_b = 0;
    cudaGetLastError(); // clear the error
    cudaMemGetInfo(&free_b, &total_b);
    fatal("out of device memory allocating %zu bytes (%zu of %zu bytes free)",
          bytes, free_b, total_b);
  }
  CUDA_CHECK(e);
  return p;
}

void free_bytes(Context *ctx, void *p) {
  // A queued update may read the buffer: it runs first.
  if (ctx && ctx->backend)
    (void)state(ctx);
  if (p)
    CUDA_CHECK(cudaFree(p));
}

void zero_bytes(Context *ctx, void *p, size_t bytes) {
  if (bytes)
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, state(ctx)->stream));
}

void to_device(Context *ctx, void *dst, const void *src, size_t bytes) {
  if (!bytes)
    return;
  CudaState *s = state(ctx);
  CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s->stream));
  // The source may be a reused host buffer.
  stream_wait(ctx, s, s->stream);
}

void to_host(Context *ctx, void *dst, const void *src, size_t bytes) {
  if (!bytes)
    return;
  CudaState *s = state(ctx);
  CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s->stream));
  stream_wait(ctx, s, s->stream);
  s->last_comm = watchdog::group_op("the device's work", -2);
}

void synchronize(Context *ctx) {
  CudaState *s = state(ctx);
  stream_wait(ctx, s, s->stream);
  s->last_comm = watchdog::group_op("the device's work", -2);
}

void copy_bytes(Context *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes && dst != src)
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                               state(ctx)->stream));
}

} // namespace backend

namespace detail {

/// gemm16 reads 16-bit operands as they are and takes no workspace
/// (workspace.h native::cuda_matmul).
constexpr bool kGemm16InPlace = true;
/// Column sums (bias_grad, the norms' parameter gradients) take the
/// chunks' partials of workspace.h column_partials (two passes on the GPU).
constexpr bool kColumnPartials = true;

template <class F> __global__ void map_kernel(int64_t n, F f) {
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += stride)
    f(i);
}

/// Runs f(i) for i in [0, n): one GPU thread per invocation (the
/// functors of kernels.h as they are).
template <class F> void launch_rows(Context *ctx, int64_t n, const F &f) {
  if (n <= 0)
    return;
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65536)
    blocks = 65536; // grid-stride loop covers the rest
  map_kernel<<<(unsigned)blocks, threads, 0, state(ctx)->stream>>>(n, f);
  CUDA_CHECK(cudaGetLastError());
}

// The kernels the ops launch (lib/ops_impl.inc calls detail::launch with a
// functor of kernels.h): the functor's own GPU kernel where this backend has
// one (its family's file under lib/cuda/), else the functor one thread per
// invocation. One overload per functor with a kernel of its own; the
// element-wise ones (elementwise_blocks.h Io) share one.
template <class F>
std::enable_if_t<!elementwise::Io<F>::kGroups> launch(Context *ctx, int64_t n,
                                                      const F &f) {
  launch_rows(ctx, n, f);
}

/// Element-wise functors (lib/cuda/elementwise.cu): eight elements a
/// thread with 128-bit loads and stores where the pointers allow it, one
/// thread per element where they do not.
template <class F>
std::enable_if_t<elementwise::Io<F>::kGroups> launch(Context *ctx, int64_t n,
                                                     const F &f) {
  if (!cuda_elementwise::run(state(ctx)->stream, n, f))
    launch_rows(ctx, n, f);
}

/// Attention (lib/cuda/attention.cu) for the head dims it is built for.
/// Its tiles keep no exponentials: the forward writes only the row
/// statistics, and the backward reads those (never `keep`), consistently,
/// since all three parts take the tiled path for the same shapes
/// (attention.cu: fits). Attention dropout's mask is drawn by both.
template <class T>
void launch(Context *ctx, int64_t n, const kernels::AttentionFn<T> &f) {
  if (!cuda_attention::forward(state(ctx)->stream, f.a, f.qkv, f.out, f.stats,
                               f.drop, f.lse, f.keep != nullptr))
    launch_rows(ctx, n, f);
}
template <class T>
void launch(Context *ctx, int64_t n, const kernels::AttentionGradQFn<T> &f) {
  if (!cuda_attention::grad_q(state(ctx)->stream, f.a, f.qkv, f.dout, f.dqkv,
                              f.stats, f.rowstats, f.delta, f.drop, f.fwd_out,
                              f.lse))
    launch_rows(ctx, n, f);
}
template <class T>
void launch(Context *ctx, int64_t n, const kernels::AttentionGradKVFn<T> &f) {
  if (!cuda_attention::grad_kv(state(ctx)->stream, f.a, f.qkv, f.dout, f.dqkv,
                               f.rowstats, f.delta, f.drop))
    launch_rows(ctx, n, f);
}

/// Context parallelism's attention over a block of keys (all_gather's and
/// ring's; lib/cuda/attention_cp.cu): tiles for the head dims they are
/// built for, the block functors one thread per row otherwise.
template <class T>
void launch(Context *ctx, int64_t n, const kernels::AttentionBlockFn<T> &f) {
  if (!cuda_attention_cp::forward(state(ctx)->stream, f))
    launch_rows(ctx, n, f);
}
/// all_gather's whole attention and gradient on cuDNN where it runs them
/// (16-bit, no dropout; attention_cp.cu), the forward's log-sum-exps kept
/// in `lse` and read back with its output `fwd_out` where the plan keeps
/// them (null otherwise); false: the block functors run.
template <class T>
bool attention_cp_whole(Context *ctx, const kernels::AttnCp &c, const T *qkv,
                        const T *kv, T *out, float *lse) {
  return cuda_attention_cp::cudnn_forward(state(ctx)->stream, c, qkv, kv, out,
                                          lse);
}
template <class T>
bool attention_cp_grad_whole(Context *ctx, const kernels::AttnCp &c,
                             const T *qkv, const T *kv, const T *dout, T *dqkv,
                             float *dkv, const T *fwd_out, const float *lse) {
  return cuda_attention_cp::cudnn_backward(state(ctx)->stream, c, qkv, kv, dout,
                                           dqkv, dkv, fwd_out, lse);
}
/// ring's block on cuDNN where it runs it (16-bit, no dropout;
/// attention_cp.cu), in the block functors' contract, its output computed
/// in `part` before it is merged; false: they (or the tiles) run. The
/// backward reads the ring's output: the forward's where it was kept, else
/// the one the op writes into ring_output() where that is not null.
template <class T>
bool attention_ring_block(Context *ctx, const kernels::AttnCp &c,
                          const kernels::KvBlock &kb, const T *qkv,
                          const T *blk, T *part, float *acc, float *ml) {
  return cuda_attention_cp::cudnn_ring_forward(state(ctx)->stream, c, kb, qkv,
                                               blk, part, acc, ml);
}
template <class T>
bool attention_ring_block_grads(Context *ctx, const kernels::AttnCp &c,
                                const kernels::KvBlock &kb, const T *qkv,
                                const T *blk, const T *dout, const T *out,
                                const float *ml, float *dq, float *dkv,
                                T *dq16) {
  return cuda_attention_cp::cudnn_ring_backward(
      state(ctx)->stream, c, kb, qkv, blk, dout, out, ml, dq, dkv, dq16);
}
template <class T> T *ring_output(Context *, const kernels::AttnCp &c) {
  return cuda_attention_cp::cudnn_ring_output<T>(c);
}
template <class T>
void launch(Context *ctx, int64_t n,
            const kernels::AttentionBlockGradQFn<T> &f) {
  if (!cuda_attention_cp::grad_q(state(ctx)->stream, f))
    launch_rows(ctx, n, f);
}
template <class T>
void launch(Context *ctx, int64_t n,
            const kernels::AttentionBlockGradKVFn<T> &f) {
  if (!cuda_attention_cp::grad_kv(state(ctx)->stream, f))
    launch_rows(ctx, n, f);
}

/// The embedding's gradient (lib/cuda/embedding.cu): a block per range of
/// table rows and 256 columns, each element added in row order.
template <class T>
void launch(Context *ctx, int64_t, const kernels::EmbeddingGradColumnFn<T> &f) {
  cuda_embedding::grad(state(ctx)->stream, f);
}

/// AdamW (lib/cuda/optimizer.cu): queued, and launched with the updates that
/// follow it, kMaxTensors at a time, when anything else uses the stream.
inline void launch(Context *ctx, int64_t n, const kernels::AdamWFn &f) {
  if (!ctx->backend)
    fatal("cuda backend used before it was initialized");
  auto *s = (CudaState *)ctx->backend;
  if (n <= 0)
    return;
  if (s->sumsq.count) // queued before this update: they run first
    flush_queues(s);
  optimizer::add(s->updates, n, f);
  if (s->updates.count == optimizer::kMaxTensors)
    flush_queues(s);
}

/// Whole-tensor sums (lib/cuda/sums.cu): a block per chunk, one for the
/// partials.
inline void launch(Context *ctx, int64_t n, const kernels::SumPartialFn &f) {
  cuda_sums::chunks(state(ctx)->stream, n, f);
}
inline void launch(Context *ctx, int64_t, const kernels::AccumulateSumFn &f) {
  cuda_sums::partials(state(ctx)->stream, f);
}
inline void launch(Context *ctx, int64_t, const kernels::ScaledSumFn &f) {
  cuda_sums::partials(state(ctx)->stream, f);
}

/// Column sums (lib/cuda/column_sums.cu): blocks of 16 columns.
template <class T, class G>
void launch(Context *ctx, int64_t, const kernels::BiasGradFn<T, G> &f) {
  cuda_column_sums::bias_grad(state(ctx)->stream, f);
}
template <class T, class G>
void launch(Context *ctx, int64_t, const kernels::NormGradParamFn<T, G> &f) {
  cuda_column_sums::norm_grad_param(state(ctx)->stream, f);
}

/// Norms (lib/cuda/norms.cu): a half warp per row.
template <class T>
void launch(Context *ctx, int64_t n, const kernels::NormFn<T> &f) {
  cuda_norms::norm(state(ctx)->stream, n, f);
}
template <class T>
void launch(Context *ctx, int64_t n, const kernels::NormGradXFn<T> &f) {
  cuda_norms::grad_x(state(ctx)->stream, n, f);
}

/// Softmax cross-entropy (lib/cuda/classifier.cu): a block per row.
inline void launch(Context *ctx, int64_t n, const kernels::CrossEntropyFn &f) {
  cuda_classifier::forward(state(ctx)->stream, n, f);
}
template <class G>
void launch(Context *ctx, int64_t n, const kernels::CrossEntropyGradFn<G> &f) {
  cuda_classifier::grad(state(ctx)->stream, n, f);
}
template <class T>
void launch(Context *ctx, int64_t n,
            const kernels::CrossEntropyInPlaceFn<T> &f) {
  cuda_classifier::in_place(state(ctx)->stream, n, f);
}

namespace {
/// PLANRT_GEMM_EPILOGUES=off: no GEMM runs an epilogue; every fused op runs
/// its parts as separate kernels (to tell an epilogue's fault from the
/// rest's on a new GPU or cuBLASLt). Read once.
bool epilogues_on() {
  static const bool on = [] {
    const char *v = std::getenv("PLANRT_GEMM_EPILOGUES");
    if (!v || !*v || std::strcmp(v, "on") == 0)
      return true;
    if (std::strcmp(v, "off") == 0)
      return false;
    fatal("PLANRT_GEMM_EPILOGUES=%s: expected on (the default: bias, GELU and "
          "their gradients in cuBLASLt's epilogues where it has an algorithm) "
          "or off (separate kernels)",
          v);
  }();
  return on;
}

/// Row-major c[m,n] = op(a) op(b), a and b of element type `type`, c of
/// `c_type`, the products summed in fp32 (CUBLAS_COMPUTE_32F, fp32 alpha and
/// beta); fp32 operands of a `precision = tf32` plan on the tensor cores
/// (CUBLAS_COMPUTE_32F_FAST_TF32).
/// cuBLASLt is column-major: a row-major matrix is its transpose in
/// column-major, so we compute c^T[n,m] = op(b)^T op(a)^T with b as the
/// first operand ("A" to cuBLASLt). So in the epilogue a vector along
/// c's rows in cuBLASLt's terms runs along row-major c's columns: BIAS adds
/// bias[j] to c[i, j]; GELU_AUX_BIAS also writes the biased product to the
/// auxiliary matrix and its GELU (tanh form) to c; DGELU multiplies the
/// product by gelu'(aux); BGRADA writes the sum over k of b (the first
/// operand), i.e. db[j] = sum_r b[r, j] for b = dy [rows, n] of a weight
/// gradient x^T dy. The auxiliary matrix has c's layout (ld ldc).
/// False, having done nothing, when cuBLASLt has no algorithm for that
/// epilogue (the caller runs the ops itself). Without one it is always true.
bool gemm_lt(Context *ctx, cudaDataType_t type, cudaDataType_t c_type, bool ta,
             bool tb, int64_t m, int64_t n, int64_t k, const void *a,
             int64_t lda, const void *b, int64_t ldb, void *c, int64_t ldc,
             float beta, const Epilogue &ep = {}) {
  CudaState *s = state(ctx);
  // A residual as C is a fusion too: cuBLASLt may refuse it out of place.
  const bool fused = ep.kind != CUBLASLT_EPILOGUE_DEFAULT || ep.residual;
  if (fused && !epilogues_on())
    return false;
  // cuBLASLt's GELU epilogues need the auxiliary matrix's leading dimension
  // a multiple of 8.
  if (ep.aux && ldc % 8 != 0)
    return false;
  int al_a = pointer_alignment(a), al_b = pointer_alignment(b),
      al_c = pointer_alignment(c),
      al_vec = ep.vector ? pointer_alignment(ep.vector) : 0,
      al_aux = ep.aux ? pointer_alignment(ep.aux) : 0;
  // C: the residual, or c itself (beta 0, or 1 to accumulate).
  const void *c_in = ep.residual ? ep.residual : c;
  const int al_c_in = pointer_alignment(c_in);
  if (ep.residual)
    beta = 1.0f;
  GemmKey key{ta,
              tb,
              m,
              n,
              k,
              lda,
              ldb,
              ldc,
              al_a,
              al_b,
              al_c,
              type,
              c_type,
              (int)ep.kind,
              ep.vector_type,
              al_vec,
              al_aux,
              al_c_in,
              ep.residual != nullptr};
  auto it = s->gemms.find(key);
  if (it == s->gemms.end()) {
    GemmPlan p;
    const bool tf32 = type == CUDA_R_32F && ctx->compute_precision == "tf32";
    CUBLAS_CHECK(cublasLtMatmulDescCreate(
        &p.op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
        CUDA_R_32F));
    cublasOperation_t op_first = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_second = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
    if (fused) {
      CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep.kind, sizeof(ep.kind)));
      if (ep.vector) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ep.vector_type,
            sizeof(ep.vector_type)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.vector,
            sizeof(ep.vector)));
      }
      if (ep.aux) {
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux,
            sizeof(ep.aux)));
        // The auxiliary matrix has D's type: cuBLASLt's default, which
        // its documentation asks to leave unset outside FP8.
        int64_t aux_ld = ldc;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
            p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
            sizeof(aux_ld)));
      }
    }
    // First operand: b's storage, column-major [cols(b) x rows(b)].
    uint64_t b_rows = tb ? k : n, b_cols = tb ? n : k;
    // Second operand: a's storage, column-major [cols(a) x rows(a)].
    uint64_t a_rows = ta ? m : k, a_cols = ta ? k : m;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, b_rows, b_cols, ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, type, a_rows, a_cols, lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, c_type, n, m, ldc));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspaceBytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    uint32_t align_first = al_b, align_second = al_a,
             align_c = std::min(al_c, al_c_in);
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_first,
        sizeof(align_first)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_second,
        sizeof(align_second)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
        sizeof(align_c)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
        sizeof(align_c)));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    // An epilogue cuBLASLt cannot run is not an error (see above).
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
        s->lt, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    if (!fused)
      CUBLAS_CHECK(st);
    else if (st != CUBLAS_STATUS_SUCCESS)
      found = 0;
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0 && !fused)
      fatal("matmul: cuBLASLt has no algorithm for m=%lld n=%lld k=%lld "
            "(transpose a=%d, b=%d)",
            (long long)m, (long long)n, (long long)k, (int)ta, (int)tb);
    p.found = found > 0;
    if (p.found)
      p.algo = result.algo;
    if (fused)
      ++s->epilogues[{(int)ep.kind, p.found}];
    it = s->gemms.emplace(key, p).first;
  }
  GemmPlan &p = it->second;
  if (!p.found)
    return false;
  // The descriptor is cached; the pointers are this call's.
  if (ep.vector)
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                       &ep.vector, sizeof(ep.vector)));
  if (ep.aux)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
        p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux,
        sizeof(ep.aux)));
  // beta = 1 adds C: c itself (accumulate), or a residual.
  const float alpha = 1.0f;
  cublasStatus_t st =
      cublasLtMatmul(s->lt, p.op, &alpha, b, p.a, a, p.b, &beta, c_in, p.c, c,
                     p.c, &p.algo, s->workspace, kWorkspaceBytes, s->stream);
  // The heuristic's answer does not promise that the algorithm runs (a
  // pointer's alignment, an epilogue's combination): a fused GEMM refused
  // here, before any work, falls back to the separate ops for good.
  if (fused && (st == CUBLAS_STATUS_NOT_SUPPORTED ||
                st == CUBLAS_STATUS_INVALID_VALUE)) {
    p.found = false;
    --s->epilogues[{(int)ep.kind, true}];
    ++s->epilogues[{(int)ep.kind, false}];
    return false;
  }
  CUBLAS_CHECK(st);
  return true;
}

cudaDataType_t cuda_type(int dtype) {
  return dtype == BF16 ? CUDA_R_16BF : dtype == F16 ? CUDA_R_16F : CUDA_R_32F;
}
} // namespace

bool gemm_bias(Context *ctx, int dtype, bool ta, bool tb, int64_t m, int64_t n,
               int64_t k, const void *a, int64_t lda, const void *b,
               int64_t ldb, const void *bias, void *c, int64_t ldc,
               void *gelu = nullptr, const void *residual = nullptr) {
  if (gelu && !bias) // cuBLASLt's GELU epilogue here is GELU_AUX_BIAS
    return false;
  cudaDataType_t t = cuda_type(dtype);
  Epilogue ep;
  ep.vector = bias;
  ep.vector_type = t;
  ep.residual = residual;
  if (!gelu) {
    // No bias: only the residual, as C (the default epilogue).
    ep.kind = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    return gemm_lt(ctx, t, t, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, 0.0f,
                   ep);
  }
  // With the GELU, the epilogue's output D is the GELU and c (the
  // pre-activation) its auxiliary output.
  ep.kind = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  ep.aux = c;
  return gemm_lt(ctx, t, t, ta, tb, m, n, k, a, lda, b, ldb, gelu, ldc, 0.0f,
                 ep);
}

bool gemm_dgelu(Context *ctx, int dtype, bool ta, bool tb, int64_t m, int64_t n,
                int64_t k, const void *a, int64_t lda, const void *b,
                int64_t ldb, const void *pre, void *c, int64_t ldc) {
  cudaDataType_t t = cuda_type(dtype);
  Epilogue ep;
  ep.kind = CUBLASLT_EPILOGUE_DGELU;
  ep.aux = pre;
  return gemm_lt(ctx, t, t, ta, tb, m, n, k, a, lda, b, ldb, c, ldc, 0.0f, ep);
}

bool gemm_bgrad(Context *ctx, int dtype, int c_dtype, int db_dtype, bool ta,
                bool tb, int64_t m, int64_t n, int64_t k, const void *a,
                int64_t lda, const void *b, int64_t ldb, void *c, int64_t ldc,
                void *db, float beta) {
  // cuBLASLt writes the bias gradient in D's type.
  if (db_dtype != c_dtype)
    return false;
  Epilogue ep;
  ep.kind = CUBLASLT_EPILOGUE_BGRADA;
  ep.vector = db;
  ep.vector_type = cuda_type(db_dtype);
  return gemm_lt(ctx, cuda_type(dtype), cuda_type(c_dtype), ta, tb, m, n, k, a,
                 lda, b, ldb, c, ldc, beta, ep);
}

void gemm(Context *ctx, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
          const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
          int64_t ldc, float beta = 0.0f) {
  gemm_lt(ctx, CUDA_R_32F, CUDA_R_32F, ta, tb, m, n, k, a, lda, b, ldb, c, ldc,
          beta);
}

/// Native 16-bit GEMM: cuBLASLt reads bf16 (fp16) operands, accumulates in
/// fp32 and writes c in that type or in fp32, with no fp32 copies.
void gemm16(Context *ctx, int dtype, int c_dtype, bool ta, bool tb, int64_t m,
            int64_t n, int64_t k, const void *a, int64_t lda, const void *b,
            int64_t ldb, void *c, int64_t ldc, float beta = 0.0f) {
  cudaDataType_t type = dtype == BF16 ? CUDA_R_16BF : CUDA_R_16F;
  gemm_lt(ctx, type, c_dtype == F32 ? CUDA_R_32F : type, ta, tb, m, n, k, a,
          lda, b, ldb, c, ldc, beta);
}

namespace {
ncclComm_t group_comm(Context *ctx, const char *op, int64_t axis_mask) {
  CudaState *s = state(ctx);
  if (!s->world)
    fatal("%s: a group of %lld ranks needs MPI and NCCL", op,
          (long long)group_size(ctx, axis_mask));
  auto it = s->comms.find(axis_mask);
  if (it == s->comms.end()) {
    // key = world rank: members are ordered by their coordinates.
    ncclComm_t comm = s->world;
    if (group_size(ctx, axis_mask) != ctx->world) {
      NCCL_CHECK(ncclCommSplit(s->world, (int)group_color(ctx, axis_mask),
                               ctx->rank, &comm, nullptr));
      settle(ctx, s->world, watchdog::group_op("NCCL communicator split", -1));
      settle(ctx, comm, watchdog::group_op("NCCL communicator split", -1));
    }
    it = s->comms.emplace(axis_mask, comm).first;
  }
  return it->second;
}

/// Orders the communication stream after the compute work issued so far.
void begin_comm(CudaState *s) {
  CUDA_CHECK(cudaEventRecord(s->ready, s->stream));
  CUDA_CHECK(cudaStreamWaitEvent(s->comm_stream, s->ready, 0));
}

/// Orders later compute work after the collectives issued so far.
void end_comm(CudaState *s) {
  CUDA_CHECK(cudaEventRecord(s->done, s->comm_stream));
  CUDA_CHECK(cudaStreamWaitEvent(s->stream, s->done, 0));
}
} // namespace

void allreduce(Context *ctx, float *data, int64_t count, int64_t axis_mask,
               ReduceOp op) {
  CudaState *s = state(ctx);
  ncclComm_t comm = group_comm(ctx, "all_reduce", axis_mask);
  begin_comm(s);
  NCCL_CHECK(ncclAllReduce(data, data, (size_t)count, ncclFloat,
                           op == ReduceOp::Max ? ncclMax : ncclSum, comm,
                           s->comm_stream));
  const char *name = op == ReduceOp::Max ? "all_reduce_max" : "all_reduce_sum";
  note_comm(s, name, axis_mask, -1, false);
  settle(ctx, comm, s->last_comm);
  end_comm(s);
}

void allreduce_start(Context *ctx, float *data, int64_t count,
                     int64_t axis_mask, int64_t slot) {
  CudaState *s = state(ctx);
  ncclComm_t comm = group_comm(ctx, "all_reduce_sum_start", axis_mask);
  auto it = s->slot_events.find(slot);
  if (it == s->slot_events.end()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    it = s->slot_events.emplace(slot, e).first;
  }
  begin_comm(s);
  NCCL_CHECK(ncclAllReduce(data, data, (size_t)count, ncclFloat, ncclSum, comm,
                           s->comm_stream));
  note_comm(s, "all_reduce_sum_start", axis_mask, -1, false);
  settle(ctx, comm, s->last_comm);
  CUDA_CHECK(cudaEventRecord(it->second, s->comm_stream));
  s->started.insert(slot);
}

void collective_wait(Context *ctx, int64_t slot) {
  CudaState *s = state(ctx);
  if (!s->started.erase(slot))
    return; // nothing was started (a group of one rank)
  CUDA_CHECK(cudaStreamWaitEvent(s->stream, s->slot_events.at(slot), 0));
}

namespace {
/// NCCL's type for elements of a planrt dtype (F32, BF16, F16).
ncclDataType_t nccl_type(int dtype) {
  return dtype == BF16  ? ncclBfloat16
         : dtype == F16 ? ncclHalf
         : dtype == I32 ? ncclInt32
                        : ncclFloat;
}
} // namespace

void allgather(Context *ctx, const void *send, void *recv, int64_t count,
               int64_t axis, int dtype) {
  CudaState *s = state(ctx);
  ncclComm_t comm = group_comm(ctx, "all_gather", int64_t(1) << axis);
  begin_comm(s);
  NCCL_CHECK(ncclAllGather(send, recv, (size_t)count, nccl_type(dtype), comm,
                           s->comm_stream));
  note_comm(s, "all_gather", int64_t(1) << axis, -1, false);
  settle(ctx, comm, s->last_comm);
  end_comm(s);
}

void reduce_scatter(Context *ctx, const float *send, float *recv, int64_t count,
                    int64_t axis) {
  CudaState *s = state(ctx);
  ncclComm_t comm = group_comm(ctx, "reduce_scatter", int64_t(1) << axis);
  begin_comm(s);
  NCCL_CHECK(ncclReduceScatter(send, recv, (size_t)count, ncclFloat, ncclSum,
                               comm, s->comm_stream));
  note_comm(s, "reduce_scatter", int64_t(1) << axis, -1, false);
  settle(ctx, comm, s->last_comm);
  end_comm(s);
}

// The shift runs on the collective stream while the compute stream goes
// on (context parallelism's ring overlaps it with the block in hand); the
// wait orders later compute after every shift started.
void ring_shift_start(Context *ctx, const void *send, void *recv, int64_t count,
                      int64_t axis, int dtype) {
  CudaState *s = state(ctx);
  ncclComm_t comm = group_comm(ctx, "ring_shift", int64_t(1) << axis);
  int G = (int)ctx->axis_sizes[axis], g = (int)ctx->coords[axis];
  if (!s->shifted)
    CUDA_CHECK(cudaEventCreateWithFlags(&s->shifted, cudaEventDisableTiming));
  begin_comm(s);
  NCCL_CHECK(ncclGroupStart());
  NCCL_CHECK(ncclSend(send, (size_t)count, nccl_type(dtype), (g + 1) % G, comm,
                      s->comm_stream));
  NCCL_CHECK(ncclRecv(recv, (size_t)count, nccl_type(dtype), (g + G - 1) % G,
                      comm, s->comm_stream));
  NCCL_CHECK(ncclGroupEnd());
  note_comm(s, "ring_shift", int64_t(1) << axis, -1, false);
  settle(ctx, comm, s->last_comm);
  CUDA_CHECK(cudaEventRecord(s->shifted, s->comm_stream));
}

void ring_shift_wait(Context *ctx) {
  CudaState *s = state(ctx);
  if (s->shifted)
    CUDA_CHECK(cudaStreamWaitEvent(s->stream, s->shifted, 0));
}

void alltoall(Context *ctx, const void *send, void *recv, int64_t count,
              int64_t axis, int dtype) {
  CudaState *s = state(ctx);
  ncclComm_t comm = group_comm(ctx, "all_to_all", int64_t(1) << axis);
  int members = (int)ctx->axis_sizes[axis];
  begin_comm(s);
  // Grouped point-to-point: every pair exchanges one block.
  NCCL_CHECK(ncclGroupStart());
  const size_t block = (size_t)count * dtype_bytes(dtype);
  for (int k = 0; k < members; ++k) {
    NCCL_CHECK(ncclSend((const char *)send + k * block, (size_t)count,
                        nccl_type(dtype), k, comm, s->comm_stream));
    NCCL_CHECK(ncclRecv((char *)recv + k * block, (size_t)count,
                        nccl_type(dtype), k, comm, s->comm_stream));
  }
  NCCL_CHECK(ncclGroupEnd());
  note_comm(s, "all_to_all", int64_t(1) << axis, -1, false);
  settle(ctx, comm, s->last_comm);
  end_comm(s);
}

// Variable counts (expert parallelism's routed rows): grouped
// point-to-point, each pair exchanging what it has; a pair with nothing to
// move posts nothing (both sides know the counts).
void alltoallv(Context *ctx, const void *send, const int64_t *send_counts,
               void *recv, const int64_t *recv_counts, int64_t axis,
               int dtype) {
  CudaState *s = state(ctx);
  ncclComm_t comm = group_comm(ctx, "all_to_all_v", int64_t(1) << axis);
  int members = (int)ctx->axis_sizes[axis];
  const size_t eb = dtype_bytes(dtype);
  begin_comm(s);
  NCCL_CHECK(ncclGroupStart());
  size_t so = 0, ro = 0;
  for (int k = 0; k < members; ++k) {
    if (send_counts[k] > 0)
      NCCL_CHECK(ncclSend((const char *)send + so * eb, (size_t)send_counts[k],
                          nccl_type(dtype), k, comm, s->comm_stream));
    if (recv_counts[k] > 0)
      NCCL_CHECK(ncclRecv((char *)recv + ro * eb, (size_t)recv_counts[k],
                          nccl_type(dtype), k, comm, s->comm_stream));
    so += (size_t)send_counts[k];
    ro += (size_t)recv_counts[k];
  }
  NCCL_CHECK(ncclGroupEnd());
  note_comm(s, "all_to_all_v", int64_t(1) << axis, -1, false);
  settle(ctx, comm, s->last_comm);
  end_comm(s);
}

} // namespace detail

namespace {
/// The communicator, stream and peer's rank in it for a transfer between
/// this rank and `peer` on `axis` (`sending`: this rank sends).
struct Route {
  ncclComm_t comm;
  cudaStream_t stream;
  int peer_rank;
  cudaEvent_t done; // null: use CudaState::done
};

Route route(Context *ctx, const char *op, int64_t axis, int64_t peer,
            bool sending) {
  CudaState *s = state(ctx);
  if (axis == ctx->pipeline_axis) {
    int64_t me = ctx->coords[axis];
    auto key = sending ? std::make_pair(me, peer) : std::make_pair(peer, me);
    auto it = s->channels.find(key);
    if (it != s->channels.end())
      return {it->second.comm, it->second.stream, sending ? 1 : 0,
              it->second.done};
  }
  ncclComm_t comm = detail::group_comm(ctx, op, int64_t(1) << axis);
  return {comm, s->comm_stream, (int)peer, nullptr};
}

ncclDataType_t nccl_type(const Tensor *t) {
  switch (t->dtype) {
  case I32:
    return ncclInt32;
  case BF16:
    return ncclBfloat16;
  case F16:
    return ncclFloat16;
  default:
    return ncclFloat;
  }
}
} // namespace

namespace backend {

void p2p_send(Context *ctx, const Tensor *t, int64_t axis, int64_t peer,
              int world_peer) {
  CudaState *s = state(ctx);
  int64_t header = t->numel();
  p2p_mpi_isend(ctx, world_peer, t->dtype, &header, sizeof(header));
  if (header == 0)
    return;
  Route r = route(ctx, "send", axis, peer, /*sending=*/true);
  size_t bytes = tensor_bytes(t);
  void *buf = nullptr;
  CUDA_CHECK(cudaMallocAsync(&buf, bytes, s->stream));
  CUDA_CHECK(cudaMemcpyAsync(buf, t->data, bytes, cudaMemcpyDeviceToDevice,
                             s->stream));
  CUDA_CHECK(cudaEventRecord(s->ready, s->stream));
  CUDA_CHECK(cudaStreamWaitEvent(r.stream, s->ready, 0));
  NCCL_CHECK(ncclSend(buf, (size_t)header, nccl_type(t), r.peer_rank, r.comm,
                      r.stream));
  note_comm(s, "send", -1, world_peer, true);
  settle(ctx, r.comm, s->last_comm);
  // Stream-ordered: the buffer is reused only after the transfer.
  CUDA_CHECK(cudaFreeAsync(buf, r.stream));
  s->p2p_streams.insert(r.stream);
}

void p2p_recv(Context *ctx, Tensor *out, int64_t axis, int64_t peer,
              int world_peer) {
  CudaState *s = state(ctx);
  size_t bytes = 0;
  int tag = 0;
  p2p_mpi_probe(ctx, world_peer, &bytes, &tag);
  int64_t header = 0;
  if (bytes != sizeof(header))
    fatal("recv: a malformed message header (%zu bytes) from coordinate %lld "
          "on mesh axis %lld",
          bytes, (long long)peer, (long long)axis);
  p2p_mpi_recv(ctx, world_peer, tag, &header, sizeof(header));
  check_p2p_message(ctx, out, axis, peer, header, tag);
  if (header == 0)
    return;
  Route r = route(ctx, "recv", axis, peer, /*sending=*/false);
  // out may still be read or written by earlier compute work.
  CUDA_CHECK(cudaEventRecord(s->ready, s->stream));
  CUDA_CHECK(cudaStreamWaitEvent(r.stream, s->ready, 0));
  NCCL_CHECK(ncclRecv(out->data, (size_t)header, nccl_type(out), r.peer_rank,
                      r.comm, r.stream));
  note_comm(s, "recv", -1, world_peer, false);
  settle(ctx, r.comm, s->last_comm);
  cudaEvent_t done = r.done ? r.done : s->done;
  CUDA_CHECK(cudaEventRecord(done, r.stream));
  CUDA_CHECK(cudaStreamWaitEvent(s->stream, done, 0));
  s->p2p_streams.insert(r.stream);
}

void p2p_wait_all(Context *ctx) {
  CudaState *s = (CudaState *)ctx->backend;
  if (!s)
    return;
  for (cudaStream_t st : s->p2p_streams)
    stream_wait(ctx, s, st);
  s->p2p_streams.clear();
}

} // namespace backend
} // namespace planrt

#include "../ops_impl.inc"
