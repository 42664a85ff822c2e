//===- host_backend.cpp - Host backend: malloc, OpenBLAS, MPI -------------===//
//
// Each MPI rank plays one GPU. Kernels run the shared functors of
// planrt/kernels.h in plain loops; GEMM is cblas_sgemm; all-reduce is
// MPI_Allreduce on one communicator per axis mask (MPI_Comm_split, cached).
//===----------------------------------------------------------------------===//

#include "../context.h"
#include "planrt/kernels.h"

#include <cblas.h>
#include <mpi.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

namespace planrt {

namespace {
struct HostState {
  std::map<int64_t, MPI_Comm> comms; // axis mask -> communicator
};
HostState *state(Context *ctx) { return (HostState *)ctx->backend; }
} // namespace

namespace backend {

const char *name() { return "host"; }

void init(Context *ctx) {
  ctx->backend = new HostState;
  // One rank plays one device: keep OpenBLAS single-threaded unless the user
  // asked otherwise (ranks would oversubscribe the cores).
  if (!std::getenv("OPENBLAS_NUM_THREADS"))
    openblas_set_num_threads(1);
}

void finalize(Context *ctx) {
  HostState *s = state(ctx);
  if (!s)
    return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin)
    for (auto &kv : s->comms)
      MPI_Comm_free(&kv.second);
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

} // namespace backend

namespace detail {

/// embedding_grad walks the rows in order per column: deterministic.
constexpr bool kAtomicScatter = false;

template <class F> void launch(Context *, int64_t n, const F &f) {
  for (int64_t i = 0; i < n; ++i)
    f(i);
}

void gemm(Context *, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
          const float *a, int64_t lda, const float *b, int64_t ldb, float *c,
          int64_t ldc) {
  const int64_t kMax = 0x7fffffff;
  if (m > kMax || n > kMax || k > kMax || lda > kMax || ldb > kMax)
    fatal("matmul: dimensions too large for BLAS (%lld x %lld x %lld)",
          (long long)m, (long long)n, (long long)k);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a,
              (int)lda, b, (int)ldb, 0.0f, c, (int)ldc);
}

void allreduce_sum(Context *ctx, float *data, int64_t count,
                   int64_t axis_mask) {
  if (!ctx->use_mpi)
    fatal("all_reduce_sum: a group of %lld ranks needs MPI",
          (long long)group_size(ctx, axis_mask));
  HostState *s = state(ctx);
  auto it = s->comms.find(axis_mask);
  if (it == s->comms.end()) {
    MPI_Comm comm;
    int rc = MPI_Comm_split(MPI_COMM_WORLD, (int)group_color(ctx, axis_mask),
                            ctx->rank, &comm);
    if (rc != MPI_SUCCESS)
      fatal("MPI_Comm_split failed (code %d)", rc);
    it = s->comms.emplace(axis_mask, comm).first;
  }
  // MPI counts are int: reduce in pieces.
  const int64_t kPiece = int64_t(1) << 30;
  for (int64_t off = 0; off < count; off += kPiece) {
    int n = (int)(count - off < kPiece ? count - off : kPiece);
    int rc = MPI_Allreduce(MPI_IN_PLACE, data + off, n, MPI_FLOAT, MPI_SUM,
                           it->second);
    if (rc != MPI_SUCCESS)
      fatal("MPI_Allreduce failed (code %d)", rc);
  }
}

} // namespace detail
} // namespace planrt

#include "../ops_impl.inc"
