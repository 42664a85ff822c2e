//===- ring.cpp - Ring collectives on point-to-point MPI ------------------===//
//
// See ring.h. Block c of a member's buffer travels around the ring: in the
// reduce-scatter phase each member adds its own block c to the partial sum
// it receives and passes it on, G - 1 times, so that member c ends with
// block c's whole sum; in the all-gather phase the finished blocks go
// around once more.
//===----------------------------------------------------------------------===//

#include "ring.h"

#include "../context.h"

#include <algorithm>
#include <cstring>

namespace planrt {
namespace ring {
namespace {

// Its own tag; the communicators carry no other point-to-point traffic.
constexpr int kTag = 0x5249;

struct Ring {
  MPI_Comm comm;
  int size = 1, rank = 0;
  explicit Ring(MPI_Comm c) : comm(c) {
    MPI_Comm_size(c, &size);
    MPI_Comm_rank(c, &rank);
  }
  int next() const { return (rank + 1) % size; }
  int prev() const { return (rank + size - 1) % size; }
  /// Block index `k` steps before this member (mod size).
  int64_t back(int64_t k) const { return ((rank - k) % size + size) % size; }
};

void check(int rc, const char *call) {
  if (rc != MPI_SUCCESS)
    fatal("%s failed in a ring collective (code %d)", call, rc);
}

/// Sends `sn` floats to the next member while receiving `rn` from the
/// previous one, and waits for both.
void exchange(const Ring &r, const float *send, int64_t sn, float *recv,
              int64_t rn, const WaitFn &wait) {
  MPI_Request q[2];
  check(MPI_Irecv(recv, (int)rn, MPI_FLOAT, r.prev(), kTag, r.comm, &q[0]),
        "MPI_Irecv");
  check(MPI_Isend(send, (int)sn, MPI_FLOAT, r.next(), kTag, r.comm, &q[1]),
        "MPI_Isend");
  wait(2, q);
}

/// out[i] = received[i] + own[i]: the partial sum first, then this member's.
void add(float *out, const float *received, const float *own, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i)
    out[i] = received[i] + own[i];
}

} // namespace

void all_reduce(MPI_Comm comm, float *data, int64_t count, int64_t segment,
                std::vector<float> &scratch, const WaitFn &wait) {
  Ring r(comm);
  if (r.size == 1 || count == 0)
    return;
  const int64_t G = r.size;
  for (int64_t off = 0; off < count;) {
    int64_t n = std::min(count - off, G * segment);
    auto lo = [&](int64_t c) { return off + n * c / G; };
    auto len = [&](int64_t c) { return n * (c + 1) / G - n * c / G; };
    if ((int64_t)scratch.size() < (n + G - 1) / G)
      scratch.resize((size_t)((n + G - 1) / G));
    for (int64_t s = 0; s + 1 < G; ++s) { // reduce-scatter, in place
      int64_t sc = r.back(s + 1), rc = r.back(s + 2);
      exchange(r, data + lo(sc), len(sc), scratch.data(), len(rc), wait);
      add(data + lo(rc), scratch.data(), data + lo(rc), len(rc));
    }
    for (int64_t s = 0; s + 1 < G; ++s) { // all-gather of the sums
      int64_t sc = r.back(s), rc = r.back(s + 1);
      exchange(r, data + lo(sc), len(sc), data + lo(rc), len(rc), wait);
    }
    off += n;
  }
}

void reduce_scatter(MPI_Comm comm, const float *send, float *recv,
                    int64_t count, int64_t segment, std::vector<float> &scratch,
                    const WaitFn &wait) {
  Ring r(comm);
  if (count == 0)
    return;
  if (r.size == 1) {
    std::memcpy(recv, send, (size_t)count * sizeof(float));
    return;
  }
  const int64_t G = r.size;
  for (int64_t off = 0; off < count;) {
    int64_t n = std::min(count - off, segment);
    if ((int64_t)scratch.size() < 2 * n)
      scratch.resize((size_t)(2 * n));
    const float *partial = nullptr; // what the last step summed
    for (int64_t s = 0; s + 1 < G; ++s) {
      int64_t sc = r.back(s + 1), rc = r.back(s + 2);
      const float *out = s == 0 ? send + sc * count + off : partial;
      float *in = s + 2 == G ? recv + off : scratch.data() + (s % 2) * n;
      exchange(r, out, n, in, n, wait);
      add(in, in, send + rc * count + off, n);
      partial = in;
    }
    off += n;
  }
}

void all_gather(MPI_Comm comm, const float *send, float *recv, int64_t count,
                int64_t segment, const WaitFn &wait) {
  Ring r(comm);
  if (count == 0)
    return;
  float *mine = recv + r.rank * count;
  if (send != mine)
    std::memcpy(mine, send, (size_t)count * sizeof(float));
  const int64_t G = r.size;
  for (int64_t off = 0; off < count;) {
    int64_t n = std::min(count - off, segment);
    for (int64_t s = 0; s + 1 < G; ++s) {
      int64_t sc = r.back(s), rc = r.back(s + 1);
      exchange(r, recv + sc * count + off, n, recv + rc * count + off, n, wait);
    }
    off += n;
  }
}

} // namespace ring
} // namespace planrt
