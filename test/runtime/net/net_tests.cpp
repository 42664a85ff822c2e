//===- net_tests.cpp - The cuda target's control plane without MPI --------===//
//
// lib/net (tcp_mpi.cpp + tcp_transport.cpp) on its own: run_net_tests.sh
// starts this program as N ranks with torchrun-style variables, one
// scenario per run:
//   basic   point-to-point matching, collectives, communicators (any N)
//   big     200 MB each way between ranks 0 and 1 at once
//   die     rank N-2 exits after the first barrier; the others must fail
//   abort   rank 1 calls MPI_Abort(3); every rank must exit with 3
//   init    MPI_Init and MPI_Finalize only (rendezvous failures)
//   launch  prints what detect_launch() read from the environment
//   free-port  prints a free TCP port (for MASTER_PORT)
// A failed check aborts the job with exit code 10 after one line naming
// the rank and the line.
//===----------------------------------------------------------------------===//

#include "engine.h"
#include "tcp_mpi.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

int g_rank = 0;

[[noreturn]] void check_failed(const char *what, int line) {
  std::fprintf(stderr, "net_tests: rank %d: check failed at line %d: %s\n",
               g_rank, line, what);
  MPI_Abort(MPI_COMM_WORLD, 10);
}

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      check_failed(#cond, __LINE__);                                           \
  } while (0)

/// MPI_Init, and this rank's place in the world (g_rank for messages).
void start(int &rank, int &n) {
  MPI_Init(nullptr, nullptr);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  g_rank = rank;
}

void barrier(MPI_Comm c = MPI_COMM_WORLD) {
  MPI_Request r;
  MPI_Ibarrier(c, &r);
  MPI_Wait(&r, MPI_STATUS_IGNORE);
}

//===--- Point to point ---------------------------------------------------===//

void test_point_to_point(int rank, int n) {
  // Every rank sends K messages {source, k, dest} with tag k % 3 to every
  // rank, itself included, from one buffer it rewrites at once (eager).
  const int K = 20;
  for (int d = 0; d < n; ++d)
    for (int k = 0; k < K; ++k) {
      int msg[3] = {rank, k, d};
      MPI_Request r;
      MPI_Isend(msg, 3, MPI_INT, d, k % 3, MPI_COMM_WORLD, &r);
      std::memset(msg, 0xff, sizeof(msg));
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    }
  // Tag 2 from the last rank, by source and tag: ahead of its tags 0 and 1.
  int last = n - 1;
  for (int k = 2; k < K; k += 3) {
    int m[3];
    MPI_Status st;
    MPI_Recv(m, 3, MPI_INT, last, 2, MPI_COMM_WORLD, &st);
    CHECK(m[0] == last && m[1] == k && m[2] == rank);
    CHECK(st.MPI_SOURCE == last && st.MPI_TAG == 2);
  }
  // Tag 1 from any source, through Probe and Get_count: each sender's in
  // the order it sent them.
  std::vector<int> next1(n, 1);
  for (int i = 0; i < n * 7; ++i) {
    MPI_Status st;
    MPI_Probe(MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, &st);
    int count = -1;
    MPI_Get_count(&st, MPI_INT, &count);
    CHECK(count == 3 && st.MPI_TAG == 1);
    int m[3];
    MPI_Recv(m, count, MPI_INT, st.MPI_SOURCE, 1, MPI_COMM_WORLD, &st);
    CHECK(m[0] == st.MPI_SOURCE && m[1] == next1[m[0]] && m[2] == rank);
    next1[m[0]] += 3;
  }
  // The rest (tag 0 from all, tag 2 from the others) with both wildcards:
  // per sender, always its oldest message.
  std::vector<std::vector<int>> left(n);
  for (int s = 0; s < n; ++s)
    for (int k = 0; k < K; ++k)
      if (k % 3 == 0 || (k % 3 == 2 && s != last))
        left[s].push_back(k);
  size_t total = 0;
  for (auto &v : left)
    total += v.size();
  int flag = 0;
  MPI_Status st;
  while (!flag)
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
  CHECK(st.bytes == 3 * sizeof(int));
  for (size_t i = 0; i < total; ++i) {
    int m[3];
    MPI_Request r;
    MPI_Irecv(m, 3, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &r);
    MPI_Wait(&r, &st);
    int s = st.MPI_SOURCE;
    CHECK(s >= 0 && s < n && m[0] == s && !left[s].empty());
    CHECK(m[1] == left[s].front() && st.MPI_TAG == m[1] % 3);
    left[s].erase(left[s].begin());
  }
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
  CHECK(!flag);

  // Receives posted before the message exists (a ring), and an empty one.
  int from = (rank + n - 1) % n, to = (rank + 1) % n;
  int got = -1;
  MPI_Request r;
  MPI_Irecv(&got, 1, MPI_INT, from, 50, MPI_COMM_WORLD, &r);
  int flag2 = 1;
  MPI_Test(&r, &flag2, MPI_STATUS_IGNORE);
  CHECK(!flag2 || n == 1);
  barrier();
  int v = 1000 + rank;
  MPI_Request s;
  MPI_Isend(&v, 1, MPI_INT, to, 50, MPI_COMM_WORLD, &s);
  MPI_Wait(&r, MPI_STATUS_IGNORE);
  MPI_Wait(&s, MPI_STATUS_IGNORE);
  CHECK(got == 1000 + from);
  MPI_Isend(nullptr, 0, MPI_BYTE, to, 51, MPI_COMM_WORLD, &s);
  MPI_Request_free(&s);
  char none = 0;
  MPI_Recv(&none, 0, MPI_BYTE, from, 51, MPI_COMM_WORLD, &st);
  int count = -1;
  MPI_Get_count(&st, MPI_BYTE, &count);
  CHECK(count == 0 && st.MPI_SOURCE == from && st.MPI_TAG == 51);
}

//===--- Collectives ------------------------------------------------------===//

/// What the engine computes: members' values combined in rank order.
template <class T, class F> T in_rank_order(int n, F value, int op) {
  T acc = value(0);
  for (int i = 1; i < n; ++i) {
    T x = value(i);
    acc = op == MPI_SUM   ? T(acc + x)
          : op == MPI_MAX ? std::max(acc, x)
                          : std::min(acc, x);
  }
  return acc;
}

template <class T, class F>
void check_allreduce(int rank, int n, MPI_Datatype type, F value) {
  for (int op : {MPI_SUM, MPI_MAX, MPI_MIN}) {
    const int count = 5;
    T mine[count], out[count];
    for (int j = 0; j < count; ++j)
      mine[j] = value(rank, j);
    MPI_Request r;
    MPI_Iallreduce(mine, out, count, type, op, MPI_COMM_WORLD, &r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
    for (int j = 0; j < count; ++j) {
      T want = in_rank_order<T>(
          n, [&](int i) { return value(i, j); }, op);
      CHECK(std::memcmp(&out[j], &want, sizeof(T)) == 0); // same bits
    }
    // And the same bytes on every rank, as rank 0 sees them.
    std::vector<T> all((size_t)(count * n));
    MPI_Igather(out, count * (int)sizeof(T), MPI_BYTE, all.data(),
                count * (int)sizeof(T), MPI_BYTE, 0, MPI_COMM_WORLD, &r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
    if (rank == 0)
      for (int i = 0; i < n; ++i)
        CHECK(std::memcmp(&all[(size_t)(i * count)], out, sizeof(out)) == 0);
  }
}

void test_collectives(int rank, int n) {
  barrier();
  check_allreduce<int>(rank, n, MPI_INT,
                       [](int i, int j) { return (i * 7919 + j) % 13 - 6; });
  check_allreduce<float>(rank, n, MPI_FLOAT, [](int i, int j) {
    return 0.1f * (float)(i + 1) / (float)(j + 3) - 0.01f * (float)i;
  });
  check_allreduce<double>(rank, n, MPI_DOUBLE, [](int i, int j) {
    return 1.0 / (i + 3) + 1e-9 * j - 0.3 * (i % 2);
  });
  check_allreduce<int64_t>(rank, n, MPI_INT64_T, [](int i, int j) {
    return (int64_t)(i + 1) * 3000000000ll - j;
  });

  // A broadcast from the last rank (not 0 when there are several).
  int root = n - 1;
  std::vector<double> b(1000, rank == root ? 0.0 : -1.0);
  if (rank == root)
    for (size_t i = 0; i < b.size(); ++i)
      b[i] = 0.5 * (double)i + root;
  MPI_Request r;
  MPI_Ibcast(b.data(), (int)b.size(), MPI_DOUBLE, root, MPI_COMM_WORLD, &r);
  MPI_Wait(&r, MPI_STATUS_IGNORE);
  for (size_t i = 0; i < b.size(); ++i)
    CHECK(b[i] == 0.5 * (double)i + root);

  // A reduce to rank 1 (or 0): only the root's buffer changes.
  int red_root = n > 1 ? 1 : 0;
  int mine[2] = {rank + 1, -rank}, out[2] = {-7, -7};
  MPI_Ireduce(mine, out, 2, MPI_INT, MPI_SUM, red_root, MPI_COMM_WORLD, &r);
  MPI_Wait(&r, MPI_STATUS_IGNORE);
  if (rank == red_root)
    CHECK(out[0] == n * (n + 1) / 2 && out[1] == -n * (n - 1) / 2);
  else
    CHECK(out[0] == -7 && out[1] == -7);
  int max_out = 0;
  MPI_Ireduce(&rank, &max_out, 1, MPI_INT, MPI_MAX, red_root, MPI_COMM_WORLD,
              &r);
  MPI_Wait(&r, MPI_STATUS_IGNORE);
  if (rank == red_root)
    CHECK(max_out == n - 1);

  // A gather to the middle rank, in rank order.
  int g_root = n / 2;
  int part[2] = {rank, rank * 10};
  std::vector<int> all((size_t)(2 * n), -1);
  MPI_Igather(part, 2, MPI_INT, all.data(), 2, MPI_INT, g_root, MPI_COMM_WORLD,
              &r);
  MPI_Wait(&r, MPI_STATUS_IGNORE);
  if (rank == g_root)
    for (int i = 0; i < n; ++i)
      CHECK(all[(size_t)(2 * i)] == i && all[(size_t)(2 * i + 1)] == i * 10);

  // Three collectives in flight at once, completed in the reverse order,
  // with point-to-point messages in between on the same communicator.
  int sum_in = rank + 1, sum_out = 0;
  int64_t word = rank == 0 ? 0x0123456789abcdefll : 0;
  MPI_Request q[3];
  MPI_Iallreduce(&sum_in, &sum_out, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &q[0]);
  MPI_Ibcast(&word, 1, MPI_INT64_T, 0, MPI_COMM_WORLD, &q[1]);
  MPI_Ibarrier(MPI_COMM_WORLD, &q[2]);
  int tagged = rank * 3, back = -1;
  MPI_Request s;
  MPI_Isend(&tagged, 1, MPI_INT, (rank + 1) % n, 0, MPI_COMM_WORLD, &s);
  MPI_Recv(&back, 1, MPI_INT, (rank + n - 1) % n, 0, MPI_COMM_WORLD,
           MPI_STATUS_IGNORE);
  MPI_Wait(&s, MPI_STATUS_IGNORE);
  CHECK(back == ((rank + n - 1) % n) * 3);
  MPI_Wait(&q[2], MPI_STATUS_IGNORE);
  int flag = 0;
  while (!flag)
    MPI_Testall(2, q, &flag, MPI_STATUSES_IGNORE);
  CHECK(q[0] == MPI_REQUEST_NULL && q[1] == MPI_REQUEST_NULL);
  CHECK(sum_out == n * (n + 1) / 2 && word == 0x0123456789abcdefll);

  // Two all-reduces started in one order complete in either.
  double d1 = rank, d2 = -rank, o1 = 0, o2 = 0;
  MPI_Iallreduce(&d1, &o1, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &q[0]);
  MPI_Iallreduce(&d2, &o2, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD, &q[1]);
  MPI_Wait(&q[1], MPI_STATUS_IGNORE);
  MPI_Wait(&q[0], MPI_STATUS_IGNORE);
  CHECK(o1 == n - 1 && o2 == -(n - 1));

  // Every datatype moves its own width: a broadcast of exactly `count`
  // elements into a buffer with a guard after it (the driver broadcasts an
  // error text as MPI_CHAR into a string of that length).
  struct Width {
    MPI_Datatype type;
    size_t bytes;
  };
  for (Width w :
       {Width{MPI_BYTE, 1}, Width{MPI_CHAR, 1}, Width{MPI_INT, 4},
        Width{MPI_FLOAT, 4}, Width{MPI_DOUBLE, 8}, Width{MPI_UINT16_T, 2},
        Width{MPI_INT64_T, 8}, Width{MPI_INT32_T, 4}}) {
    const int count = 5;
    std::vector<unsigned char> buf(count * w.bytes + 8, 0xee);
    if (rank == 0)
      std::fill(buf.begin(), buf.begin() + count * w.bytes, 0x11);
    MPI_Request r;
    MPI_Ibcast(buf.data(), count, w.type, 0, MPI_COMM_WORLD, &r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
    for (size_t i = 0; i < buf.size(); ++i)
      CHECK(buf[i] == (i < count * w.bytes ? 0x11 : 0xee));
  }
}

//===--- Communicators ----------------------------------------------------===//

void test_communicators(int rank, int n) {
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  int size = 0, r = -1;
  MPI_Comm_size(dup, &size);
  MPI_Comm_rank(dup, &r);
  CHECK(size == n && r == rank);
  // The same tag on both: each receive gets its own communicator's message.
  int to = (rank + 1) % n, from = (rank + n - 1) % n;
  int on_world = 1, on_dup = 2, got = 0;
  MPI_Request s1, s2;
  MPI_Isend(&on_world, 1, MPI_INT, to, 5, MPI_COMM_WORLD, &s1);
  MPI_Isend(&on_dup, 1, MPI_INT, to, 5, dup, &s2);
  MPI_Recv(&got, 1, MPI_INT, from, 5, dup, MPI_STATUS_IGNORE);
  CHECK(got == 2);
  MPI_Recv(&got, 1, MPI_INT, from, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  CHECK(got == 1);
  MPI_Wait(&s1, MPI_STATUS_IGNORE);
  MPI_Wait(&s2, MPI_STATUS_IGNORE);
  // Collectives on both at once.
  int a = rank, b = 2 * rank, oa = 0, ob = 0;
  MPI_Request q[2];
  MPI_Iallreduce(&a, &oa, 1, MPI_INT, MPI_SUM, dup, &q[0]);
  MPI_Iallreduce(&b, &ob, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &q[1]);
  MPI_Wait(&q[1], MPI_STATUS_IGNORE);
  MPI_Wait(&q[0], MPI_STATUS_IGNORE);
  CHECK(oa == n * (n - 1) / 2 && ob == n * (n - 1));

  // Even and odd ranks, ordered by descending world rank (key = -rank).
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half);
  CHECK(half != MPI_COMM_NULL);
  std::vector<int> members;
  for (int i = n - 1; i >= 0; --i)
    if (i % 2 == rank % 2)
      members.push_back(i);
  MPI_Comm_size(half, &size);
  MPI_Comm_rank(half, &r);
  CHECK(size == (int)members.size() && members[(size_t)r] == rank);
  int sum = 0;
  MPI_Request q1;
  MPI_Iallreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, half, &q1);
  MPI_Wait(&q1, MPI_STATUS_IGNORE);
  int want = 0;
  for (int m : members)
    want += m;
  CHECK(sum == want);
  // Sources are ranks in `half`.
  int hto = (r + 1) % size, hfrom = (r + size - 1) % size, hv = rank, hgot = -1;
  MPI_Isend(&hv, 1, MPI_INT, hto, 8, half, &s1);
  MPI_Status st;
  MPI_Recv(&hgot, 1, MPI_INT, MPI_ANY_SOURCE, 8, half, &st);
  MPI_Wait(&s1, MPI_STATUS_IGNORE);
  CHECK(st.MPI_SOURCE == hfrom && hgot == members[(size_t)hfrom]);
  // A broadcast in `half` from its rank 0 (the highest world rank in it).
  int top = rank;
  MPI_Ibcast(&top, 1, MPI_INT, 0, half, &q1);
  MPI_Wait(&q1, MPI_STATUS_IGNORE);
  CHECK(top == members[0]);

  // Rank 0 outside (MPI_UNDEFINED): the others, in world order.
  MPI_Comm rest;
  MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? MPI_UNDEFINED : 7, rank, &rest);
  if (rank == 0) {
    CHECK(rest == MPI_COMM_NULL);
  } else {
    CHECK(rest != MPI_COMM_NULL);
    MPI_Comm_size(rest, &size);
    MPI_Comm_rank(rest, &r);
    CHECK(size == n - 1 && r == rank - 1);
    barrier(rest);
    MPI_Comm_free(&rest);
    CHECK(rest == MPI_COMM_NULL);
  }

  // One host: every rank shares it, in world order.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                      &node);
  MPI_Comm_size(node, &size);
  MPI_Comm_rank(node, &r);
  CHECK(size == n && r == rank);

  MPI_Comm_free(&node);
  MPI_Comm_free(&half);
  MPI_Comm_free(&dup);
  barrier();
}

//===--- Scenarios --------------------------------------------------------===//

int basic() {
  int rank = -1, n = 0;
  start(rank, n);
  test_point_to_point(rank, n);
  test_collectives(rank, n);
  test_communicators(rank, n);
  MPI_Finalize();
  std::printf("rank %d of %d: ok\n", rank, n);
  return 0;
}

uint32_t pattern(int rank, size_t i) {
  return (uint32_t)i * 2654435761u ^ (uint32_t)(rank + 1) * 0x9e3779b9u;
}

/// Ranks 0 and 1 send each other 200 MB at once, then receive.
int big() {
  int rank = -1, n = 0;
  start(rank, n);
  CHECK(n >= 2);
  if (rank < 2) {
    const size_t count = 50u << 20; // 200 MiB of int32
    std::vector<uint32_t> out(count), in(count, 0);
    for (size_t i = 0; i < count; ++i)
      out[i] = pattern(rank, i);
    int peer = 1 - rank;
    auto t0 = std::chrono::steady_clock::now();
    MPI_Request s;
    MPI_Isend(out.data(), (int)count, MPI_INT, peer, 9, MPI_COMM_WORLD, &s);
    MPI_Recv(in.data(), (int)count, MPI_INT, peer, 9, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    MPI_Wait(&s, MPI_STATUS_IGNORE);
    double sec =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    for (size_t i = 0; i < count; ++i)
      if (in[i] != pattern(peer, i))
        check_failed("in[i] == pattern(peer, i)", __LINE__);
    std::printf("rank %d: 200 MiB each way in %.2f s\n", rank, sec);
  }
  barrier();
  MPI_Finalize();
  return 0;
}

/// Rank n-2 exits after the first barrier, without a word; rank n-1 then
/// waits for a message from it, the others in a barrier.
int die() {
  int rank = -1, n = 0;
  start(rank, n);
  CHECK(n >= 3);
  barrier();
  if (rank == n - 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    _exit(9);
  }
  if (rank == n - 1) {
    int v;
    MPI_Recv(&v, 1, MPI_INT, n - 2, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    barrier();
  }
  std::fprintf(stderr, "net_tests: rank %d: the wait ended\n", rank);
  return 0;
}

/// Rank 1 aborts with code 3 while rank 0 waits for a message from it and
/// the others wait in a barrier.
int abort_scenario() {
  int rank = -1, n = 0;
  start(rank, n);
  CHECK(n >= 2);
  barrier();
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  if (rank == 0) {
    int v;
    MPI_Recv(&v, 1, MPI_INT, 1, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    barrier();
  }
  std::fprintf(stderr, "net_tests: rank %d: the wait ended\n", rank);
  return 0;
}

int init_only() {
  MPI_Init(nullptr, nullptr);
  MPI_Finalize();
  return 0;
}

int launch() {
  planrt_net::Launch l = planrt_net::detect_launch();
  std::printf("launcher=%s rank=%d size=%d local_rank=%d addr=%s port=%d\n",
              l.launcher.c_str(), l.rank, l.size, l.local_rank,
              l.master_addr.c_str(), l.master_port);
  return 0;
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, (sockaddr *)&a, sizeof(a)) != 0 ||
      getsockname(fd, (sockaddr *)&a, &len) != 0) {
    std::perror("net_tests: free-port");
    return 1;
  }
  std::printf("%d\n", ntohs(a.sin_port));
  close(fd);
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  std::string what = argc > 1 ? argv[1] : "";
  if (what == "basic")
    return basic();
  if (what == "big")
    return big();
  if (what == "die")
    return die();
  if (what == "abort")
    return abort_scenario();
  if (what == "init")
    return init_only();
  if (what == "launch")
    return launch();
  if (what == "free-port")
    return free_port();
  std::fprintf(stderr, "usage: %s basic|big|die|abort|init|launch|free-port\n",
               argv[0]);
  return 2;
}
