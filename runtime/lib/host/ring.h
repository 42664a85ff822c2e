//===- ring.h - Ring collectives on point-to-point MPI --------*- C++ -*-===//
//
// Private to the host backend. Sum all-reduce, reduce-scatter and
// all-gather of floats as rings of non-blocking sends and receives between
// neighbours (member r sends to r + 1 and receives from r - 1), the
// algorithm NCCL runs on GPUs: every member moves (G - 1) / G of the data
// per phase and does 1 / G of the additions, so the work is balanced.
// Open MPI's non-blocking all-reduce reduces in place on a binomial tree
// (one member adds everything, then sends it all back), and its
// non-blocking reduce-scatter reduces to one member and scatters; on
// GPT-2 124M over 2 ranks the ring halves the time of the gradient
// all-reduce (bench/RESULTS.md).
//
// The sum of block c adds the members' values in ring order starting after
// member c: ((x[c+1] + x[c+2]) + ...) + x[c], whatever the timing, so the
// result is the same on every member and in every run. Large messages go
// in segments of at most `segment` floats per block, so the scratch stays
// bounded and MPI counts fit in an int.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_HOST_RING_H
#define PLANRT_LIB_HOST_RING_H

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace planrt {
namespace ring {

/// Waits for `n` requests (the backend's watchdog-polled wait).
using WaitFn = std::function<void(int n, MPI_Request *requests)>;

/// data[0, count) = the sum of every member's data, in place.
void all_reduce(MPI_Comm comm, float *data, int64_t count, int64_t segment,
                std::vector<float> &scratch, const WaitFn &wait);

/// recv[0, count) = block g (this member's rank in comm) of the sum of the
/// members' send[0, G * count). `send` is not written.
void reduce_scatter(MPI_Comm comm, const float *send, float *recv,
                    int64_t count, int64_t segment, std::vector<float> &scratch,
                    const WaitFn &wait);

/// recv[k * count, (k + 1) * count) = send of member k; `send` may be
/// recv + g * count (in place).
void all_gather(MPI_Comm comm, const float *send, float *recv, int64_t count,
                int64_t segment, const WaitFn &wait);

} // namespace ring
} // namespace planrt

#endif
