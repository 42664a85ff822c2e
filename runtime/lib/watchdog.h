//===- watchdog.h - Timeouts on every wait for other ranks ----*- C++ -*-===//
//
// Private to the runtime libraries (lib/watchdog.cpp). A rank never waits
// forever for another: every wait for other ranks (a collective, a
// point-to-point receive, the end of a non-blocking collective, the runtime's
// own MPI collectives) is started non-blocking and polled with
// watchdog::wait_until against a deadline of --timeout seconds (default 300;
// 0 = no deadline) from the start of that wait. When the deadline passes the
// rank asks the other members of the group what they are doing (a query
// over a communicator of its own, answered by every rank from inside its own
// waits), prints one line
//   planrt: error: watchdog: rank R waited T s (--timeout T) in step S for
//   <what> over <group>; <who is missing>
// and aborts the job (abort hook of the backend, e.g. ncclCommAbort, then
// MPI_Abort with exit code kTimeoutExitCode).
//
// No MPI types here: the cuda backend (.cu) includes it too.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_WATCHDOG_H
#define PLANRT_LIB_WATCHDOG_H

#include <cstdint>
#include <string>

namespace planrt {

struct Context;

namespace watchdog {

/// Exit code of a job aborted by the watchdog (MPI_Abort's error code).
constexpr int kTimeoutExitCode = 3;
/// The default of --timeout, in seconds.
constexpr double kDefaultTimeout = 300;

/// What a rank waits for: `name` (a collective, "recv", or one of the
/// runtime's own steps such as "--save"; a string that outlives the wait),
/// over the group of the mesh axes in `axis_mask` (-1: every rank; -2: no
/// group, e.g. a wait for the device's own work), or from
/// world rank `peer` (>= 0; to it when `to_peer`; `axis` and `coord` say
/// which neighbour it is, found from the coordinates when -1).
struct Op {
  const char *name = "";
  int64_t axis_mask = -1;
  int peer = -1;
  bool to_peer = false;
  int64_t axis = -1, coord = -1;
};
inline Op group_op(const char *name, int64_t axis_mask) {
  Op op;
  op.name = name;
  op.axis_mask = axis_mask;
  return op;
}
inline Op peer_op(const char *name, int peer, bool to_peer) {
  Op op;
  op.name = name;
  op.peer = peer;
  op.to_peer = to_peer;
  return op;
}

/// Creates the watchdog of a started context (collective over the world:
/// duplicates MPI_COMM_WORLD for the queries). Called by backend::init.
void init(Context *ctx);
/// Frees it (backend::finalize).
void finalize(Context *ctx);
/// Called right before MPI_Abort when the watchdog fires (e.g. the cuda
/// backend's ncclCommAbort of its communicators).
void set_abort_hook(Context *ctx, void (*hook)(Context *));

/// One wait: construct it, then call tick() after every unsuccessful test
/// of what is awaited. tick() answers other ranks' queries, backs off
/// (yields, then sleeps briefly) as the wait grows, and when the deadline
/// passed prints the line and aborts the job (it does not return then).
class Wait {
public:
  Wait(Context *ctx, const Op &op);
  ~Wait();
  void tick() {
    if (++polls_ % 64 == 0)
      slow_tick();
  }

private:
  void slow_tick();
  Context *ctx_;
  Op op_;
  double start_;
  uint64_t polls_ = 0;
};

/// Polls `done()` (true once what is awaited completed) under a Wait.
template <class F> void wait_until(Context *ctx, const Op &op, F done) {
  if (done())
    return;
  Wait w(ctx, op);
  while (!done())
    w.tick();
}

/// "all_reduce_sum over mesh axes dp, tp (ranks 0, 1, 2, 3)" and the like.
std::string describe(const Context *ctx, const Op &op);

/// Seconds since an arbitrary epoch (steady clock).
double now();

/// After every training step (every rank; collective with several ranks):
/// if the step's reported loss or gradient norm is NaN or Inf on some rank,
/// the lowest such rank prints one line
///   planrt: error: step S: the loss is nan: training diverged; ...
/// naming the last good checkpoint (last_good_checkpoint), and every rank
/// exits with code 1.
void check_finite(Context *ctx);
/// The newest checkpoint known to hold finite parameters ("" if none was
/// written): the one place to wire a checkpoint API into the message.
std::string last_good_checkpoint(const Context *ctx);

#ifdef MPI_VERSION
// Blocking MPI operations made of a non-blocking start and a watched wait
// (include <mpi.h> before this header). Results are those of the blocking
// call; MPI errors are fatal, naming `call`.
void wait_all(Context *ctx, int n, MPI_Request *requests, const Op &op);
void allreduce(Context *ctx, const void *send, void *recv, int count,
               MPI_Datatype type, MPI_Op mpi_op, MPI_Comm comm, const Op &op);
void bcast(Context *ctx, void *data, int count, MPI_Datatype type, int root,
           MPI_Comm comm, const Op &op);
void reduce(Context *ctx, const void *send, void *recv, int count,
            MPI_Datatype type, MPI_Op mpi_op, int root, MPI_Comm comm,
            const Op &op);
void barrier(Context *ctx, MPI_Comm comm, const Op &op);
void gather(Context *ctx, const void *send, int count, MPI_Datatype type,
            void *recv, int root, MPI_Comm comm, const Op &op);
void send(Context *ctx, const void *data, int count, MPI_Datatype type,
          int dest, int tag, MPI_Comm comm, const Op &op);
void recv(Context *ctx, void *data, int count, MPI_Datatype type, int src,
          int tag, MPI_Comm comm, const Op &op);
/// MPI_Probe, polled: waits until a message from `src` (any tag) arrives.
void probe(Context *ctx, int src, MPI_Comm comm, MPI_Status *status,
           const Op &op);
#endif

} // namespace watchdog
} // namespace planrt

#endif // PLANRT_LIB_WATCHDOG_H
