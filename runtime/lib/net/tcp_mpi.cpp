//===- tcp_mpi.cpp - MPI's subset for the cuda target (lib/net) -----------===//
//
// See tcp_mpi.h for why and engine.h for the parts. Receives match in
// posting order, messages in arrival order per sender (a transport keeps one
// ordered stream per peer), as MPI requires. Sends are eager: the bytes are
// copied into the transport's queue and the request completes at once.
//
// Collectives are linear through the root (rank 0 for barrier and
// all-reduce): every member sends its part to the root, the root combines
// them in rank order (so sums do not depend on arrival order) and sends the
// result back. They carry the communicator's context with the high bit set
// and a per-communicator sequence number as the tag, so that collectives in
// flight at once never mix with each other or with user messages. These
// are control-plane messages (a few bytes to a few MB, between steps): the
// root's O(n) fan-in is not what a step's time depends on.
//===----------------------------------------------------------------------===//

#include "tcp_mpi.h"

#include "engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>

namespace planrt_net {

struct Comm {
  uint64_t context = 0;
  std::vector<int> members; // world ranks, by rank in this communicator
  int rank = 0;             // this process's rank in it
  int32_t next_seq = 0;     // collectives started on it
  uint64_t children = 0;    // communicators made from it
  int of_world(int world_rank) const {
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i] == world_rank)
        return (int)i;
    return -1;
  }
};

struct Request {
  enum Kind { Send, Recv, Collective } kind = Send;
  bool done = false;
  MPI_Status status;
  // Recv
  uint64_t context = 0;
  int source = MPI_ANY_SOURCE; // world rank, or any
  int tag = MPI_ANY_TAG;
  char *buf = nullptr;
  size_t capacity = 0;
  const Comm *comm = nullptr;
  // Collective
  int coll = 0; // CollKind
  Comm *ccomm = nullptr;
  int32_t seq = 0;
  int root = 0, type = 0, op = 0;
  size_t bytes = 0; // one member's part
  std::vector<char> mine;
  char *out = nullptr;
  std::vector<Request *> parts; // the root's receives, or a member's result
};

namespace {

enum CollKind { Barrier, Allreduce, Bcast, Reduce, Gather };

constexpr uint64_t kCollectiveBit = uint64_t(1) << 63;

struct Engine {
  bool initialized = false, finalized = false;
  Launch launch;
  Comm world;
  std::unique_ptr<Transport> transport;
  std::deque<Message> unexpected;
  std::list<Request *> posted; // receives not matched yet, in posting order
  // Collectives this process roots that are not complete: every progress()
  // advances them, as MPI progresses all outstanding operations, so a root
  // waiting on something else still fans out the results others wait for.
  std::list<Request *> rooted;
};

Engine &engine() {
  static Engine e;
  return e;
}

size_t type_size(MPI_Datatype t) { return (size_t)(t & 0xff); }

bool matches(const Header &h, uint64_t context, int source, int tag) {
  return h.context == context &&
         (source == MPI_ANY_SOURCE || h.source == source) &&
         (tag == MPI_ANY_TAG || h.tag == tag);
}

void complete_recv(Request *r, Message &m) {
  size_t n = std::min(r->capacity, (size_t)m.header.bytes);
  if (m.header.bytes > r->capacity) {
    std::fprintf(stderr,
                 "planrt: error: control plane: a message of %llu bytes "
                 "arrived for a receive of %zu (tag %d)\n",
                 (unsigned long long)m.header.bytes, r->capacity, m.header.tag);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (n)
    std::memcpy(r->buf, m.data.data(), n);
  r->status.MPI_SOURCE =
      r->comm ? r->comm->of_world(m.header.source) : m.header.source;
  r->status.MPI_TAG = m.header.tag;
  r->status.bytes = m.header.bytes;
  r->done = true;
}

bool advance(Request *r);

void progress(int timeout_ms = 0) {
  Engine &e = engine();
  if (e.transport)
    e.transport->poll(timeout_ms);
  for (auto it = e.rooted.begin(); it != e.rooted.end();)
    it = advance(*it) ? e.rooted.erase(it) : std::next(it);
}

void check_comm(MPI_Comm c, const char *call) {
  if (!c) {
    std::fprintf(stderr, "planrt: error: %s on MPI_COMM_NULL\n", call);
    MPI_Abort(MPI_COMM_WORLD, 1); // the other ranks learn why at once
  }
}

/// MPI's error for a rank outside the communicator (fatal, as planrt runs
/// MPI with MPI_ERRORS_ARE_FATAL).
void check_rank(const Comm *comm, int rank, const char *what) {
  if (rank >= 0 && rank < (int)comm->members.size())
    return;
  std::fprintf(stderr,
               "planrt: error: control plane: %s rank %d outside a "
               "communicator of %zu ranks\n",
               what, rank, comm->members.size());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

void send_message(const Comm *comm, uint64_t context, int dest_rank, int tag,
                  const void *data, size_t bytes) {
  Engine &e = engine();
  check_rank(comm, dest_rank, "send to");
  Header h;
  h.context = context;
  h.source = e.launch.rank;
  h.tag = tag;
  h.bytes = bytes;
  int dest = comm->members[(size_t)dest_rank];
  if (dest == e.launch.rank) {
    Message m;
    m.header = h;
    m.data.assign((const char *)data, (const char *)data + bytes);
    deliver(std::move(m));
    return;
  }
  e.transport->send(dest, h, data);
}

Request *post_recv(const Comm *comm, uint64_t context, int src_rank, int tag,
                   void *buf, size_t capacity) {
  Engine &e = engine();
  if (src_rank != MPI_ANY_SOURCE)
    check_rank(comm, src_rank, "receive from");
  Request *r = new Request;
  r->kind = Request::Recv;
  r->context = context;
  r->source = src_rank == MPI_ANY_SOURCE ? MPI_ANY_SOURCE
                                         : comm->members[(size_t)src_rank];
  r->tag = tag;
  r->buf = (char *)buf;
  r->capacity = capacity;
  r->comm = comm;
  for (auto it = e.unexpected.begin(); it != e.unexpected.end(); ++it)
    if (matches(it->header, context, r->source, tag)) {
      complete_recv(r, *it);
      e.unexpected.erase(it);
      return r;
    }
  e.posted.push_back(r);
  return r;
}

void reduce_into(char *acc, const char *x, size_t count, MPI_Datatype type,
                 MPI_Op op) {
  auto apply = [&](auto *a, const auto *b) {
    for (size_t i = 0; i < count; ++i) {
      if (op == MPI_SUM)
        a[i] += b[i];
      else if (op == MPI_MAX)
        a[i] = std::max(a[i], b[i]);
      else
        a[i] = std::min(a[i], b[i]);
    }
  };
  switch (type) {
  case MPI_INT:
  case MPI_INT32_T:
    apply((int32_t *)acc, (const int32_t *)x);
    break;
  case MPI_INT64_T:
    apply((int64_t *)acc, (const int64_t *)x);
    break;
  case MPI_FLOAT:
    apply((float *)acc, (const float *)x);
    break;
  case MPI_DOUBLE:
    apply((double *)acc, (const double *)x);
    break;
  case MPI_UINT16_T:
    apply((uint16_t *)acc, (const uint16_t *)x);
    break;
  case MPI_CHAR:
    apply((signed char *)acc, (const signed char *)x);
    break;
  default:
    apply((unsigned char *)acc, (const unsigned char *)x);
    break;
  }
}

/// Starts a collective: members send their part to the root, the root posts
/// a receive per member; members that get a result post its receive.
Request *start_collective(int coll, const void *send, void *out, size_t bytes,
                          MPI_Datatype type, MPI_Op op, int root, Comm *c) {
  Request *r = new Request;
  r->kind = Request::Collective;
  r->coll = coll;
  r->ccomm = c;
  r->seq = c->next_seq++;
  r->root = root;
  r->type = type;
  r->op = op;
  r->bytes = bytes;
  r->out = (char *)out;
  uint64_t ctx = c->context | kCollectiveBit;
  size_t n = c->members.size();
  if (coll == Bcast) {
    if (c->rank == root) {
      for (size_t i = 0; i < n; ++i)
        if ((int)i != root)
          send_message(c, ctx, (int)i, r->seq, out, bytes);
    } else {
      r->parts.push_back(post_recv(c, ctx, root, r->seq, out, bytes));
    }
    return r;
  }
  if (bytes)
    r->mine.assign((const char *)send, (const char *)send + bytes);
  bool result_to_all = coll == Barrier || coll == Allreduce;
  if (c->rank == root) {
    // One buffer per member, in rank order; the root's own part is `mine`.
    r->parts.resize(n, nullptr);
    r->status.bytes = 0;
    for (size_t i = 0; i < n; ++i)
      if ((int)i != root) {
        Request *p = new Request;
        p->mine.resize(bytes);
        Request *q = post_recv(c, ctx, (int)i, r->seq, p->mine.data(), bytes);
        p->parts.push_back(q);
        r->parts[i] = p;
      }
    engine().rooted.push_back(r);
  } else {
    send_message(c, ctx, root, r->seq, r->mine.data(), bytes);
    if (result_to_all) {
      size_t result = coll == Barrier ? 0 : bytes;
      r->parts.push_back(post_recv(c, ctx, root, r->seq, out, result));
    } else {
      r->done = true;
    }
  }
  return r;
}

/// Advances a collective; true when it is complete.
bool advance(Request *r) {
  if (r->done)
    return true;
  Comm *c = r->ccomm;
  if (r->coll == Bcast || c->rank != r->root) {
    for (Request *p : r->parts)
      if (!p->done)
        return false;
    r->done = true;
    return true;
  }
  for (Request *p : r->parts)
    if (p && !p->parts[0]->done)
      return false;
  // Every part is in: combine in rank order.
  size_t n = c->members.size();
  auto part = [&](size_t i) -> const char * {
    return (int)i == r->root ? r->mine.data() : r->parts[i]->mine.data();
  };
  if (r->coll == Gather) {
    for (size_t i = 0; i < n; ++i)
      if (r->bytes)
        std::memcpy(r->out + i * r->bytes, part(i), r->bytes);
  } else if (r->coll == Allreduce || r->coll == Reduce) {
    std::vector<char> acc(part(0), part(0) + r->bytes);
    size_t count = r->bytes / type_size(r->type);
    for (size_t i = 1; i < n; ++i)
      reduce_into(acc.data(), part(i), count, r->type, r->op);
    if (r->bytes)
      std::memcpy(r->out, acc.data(), r->bytes);
  }
  if (r->coll == Barrier || r->coll == Allreduce) {
    uint64_t ctx = c->context | kCollectiveBit;
    size_t result = r->coll == Barrier ? 0 : r->bytes;
    for (size_t i = 0; i < n; ++i)
      if ((int)i != r->root)
        send_message(c, ctx, (int)i, r->seq, r->out, result);
  }
  for (Request *p : r->parts)
    if (p) {
      delete p->parts[0];
      delete p;
    }
  r->parts.clear();
  r->done = true;
  return true;
}

bool test(Request *r) {
  if (r->kind == Request::Collective)
    return advance(r);
  return r->done;
}

void release(Request *r) {
  if (!r)
    return;
  engine().rooted.remove(r);
  if (r->kind == Request::Collective && r->coll != Bcast &&
      r->ccomm->rank == r->root) {
    for (Request *p : r->parts)
      if (p) {
        delete p->parts[0];
        delete p;
      }
  } else {
    for (Request *p : r->parts)
      delete p;
  }
  delete r;
}

/// Blocks until `r` completes.
void wait(Request *r) {
  while (!test(r))
    progress(1);
}

/// All members' `bytes` bytes, in rank order, on every member (blocking).
std::vector<char> allgather(Comm *c, const void *mine, size_t bytes) {
  std::vector<char> all(bytes * c->members.size());
  Request *g = start_collective(Gather, mine, all.data(), bytes, MPI_BYTE,
                                MPI_SUM, 0, c);
  wait(g);
  release(g);
  Request *b = start_collective(Bcast, nullptr, all.data(), all.size(),
                                MPI_BYTE, MPI_SUM, 0, c);
  wait(b);
  release(b);
  return all;
}

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

/// The members of `c` whose color equals this member's, ordered by
/// (key, rank), as a new communicator; null for MPI_UNDEFINED.
Comm *split(Comm *c, int color, int key) {
  int32_t mine[2] = {color, key};
  std::vector<char> all = allgather(c, mine, sizeof(mine));
  uint64_t child = c->children++;
  if (color == MPI_UNDEFINED)
    return nullptr;
  std::vector<std::pair<int, int>> order; // (key, rank in c)
  for (size_t i = 0; i < c->members.size(); ++i) {
    int32_t ck[2];
    std::memcpy(ck, all.data() + i * sizeof(ck), sizeof(ck));
    if (ck[0] == color)
      order.push_back({ck[1], (int)i});
  }
  std::sort(order.begin(), order.end());
  Comm *out = new Comm;
  out->context =
      mix(mix(c->context, child), (uint64_t)(uint32_t)color) & ~kCollectiveBit;
  for (auto &kr : order) {
    if (kr.second == c->rank)
      out->rank = (int)out->members.size();
    out->members.push_back(c->members[(size_t)kr.second]);
  }
  return out;
}

bool ready(const char *call) {
  Engine &e = engine();
  if (!e.initialized || e.finalized) {
    std::fprintf(stderr, "planrt: error: %s called %s\n", call,
                 e.finalized ? "after MPI_Finalize" : "before MPI_Init");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return true;
}

} // namespace

Comm *world() { return &engine().world; }

void deliver(Message &&m) {
  Engine &e = engine();
  for (auto it = e.posted.begin(); it != e.posted.end(); ++it) {
    Request *r = *it;
    if (matches(m.header, r->context, r->source, r->tag)) {
      e.posted.erase(it);
      complete_recv(r, m);
      return;
    }
  }
  e.unexpected.push_back(std::move(m));
}

} // namespace planrt_net

using namespace planrt_net;

int MPI_Init(int *, char ***) {
  Engine &e = engine();
  if (e.initialized)
    return MPI_SUCCESS;
  e.launch = detect_launch();
  e.world.context = 1;
  e.world.rank = e.launch.rank;
  for (int i = 0; i < e.launch.size; ++i)
    e.world.members.push_back(i);
  if (e.launch.size > 1)
    e.transport = connect(e.launch);
  e.initialized = true;
  return MPI_SUCCESS;
}

int MPI_Initialized(int *flag) {
  *flag = engine().initialized ? 1 : 0;
  return MPI_SUCCESS;
}

int MPI_Finalized(int *flag) {
  *flag = engine().finalized ? 1 : 0;
  return MPI_SUCCESS;
}

int MPI_Finalize() {
  Engine &e = engine();
  if (!e.initialized || e.finalized)
    return MPI_SUCCESS;
  if (e.transport)
    e.transport->close();
  e.transport.reset();
  e.finalized = true;
  return MPI_SUCCESS;
}

int MPI_Abort(MPI_Comm, int code) {
  Engine &e = engine();
  std::fflush(stdout);
  std::fflush(stderr);
  if (e.transport)
    e.transport->abort_all(code);
  std::_Exit(code);
}

int MPI_Comm_rank(MPI_Comm comm, int *rank) {
  check_comm(comm, "MPI_Comm_rank");
  *rank = comm->rank;
  return MPI_SUCCESS;
}

int MPI_Comm_size(MPI_Comm comm, int *size) {
  check_comm(comm, "MPI_Comm_size");
  *size = (int)comm->members.size();
  return MPI_SUCCESS;
}

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *out) {
  ready("MPI_Comm_dup");
  check_comm(comm, "MPI_Comm_dup");
  *out = split(comm, 0, comm->rank);
  return MPI_SUCCESS;
}

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *out) {
  ready("MPI_Comm_split");
  check_comm(comm, "MPI_Comm_split");
  *out = split(comm, color, key);
  return MPI_SUCCESS;
}

int MPI_Comm_split_type(MPI_Comm comm, int, int key, MPI_Info, MPI_Comm *out) {
  ready("MPI_Comm_split_type");
  check_comm(comm, "MPI_Comm_split_type");
  // The members on this host: the color is the lowest rank with our name.
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  std::vector<char> all = allgather(comm, name, sizeof(name));
  int color = comm->rank;
  for (size_t i = 0; i < comm->members.size(); ++i)
    if (std::strncmp(all.data() + i * sizeof(name), name, sizeof(name)) == 0) {
      color = (int)i;
      break;
    }
  *out = split(comm, color, key);
  return MPI_SUCCESS;
}

int MPI_Comm_free(MPI_Comm *comm) {
  if (*comm && *comm != world())
    delete *comm;
  *comm = MPI_COMM_NULL;
  return MPI_SUCCESS;
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag,
              MPI_Comm comm, MPI_Request *request) {
  ready("MPI_Isend");
  check_comm(comm, "MPI_Isend");
  send_message(comm, comm->context, dest, tag, buf,
               (size_t)count * type_size(type));
  Request *r = new Request;
  r->done = true;
  *request = r;
  return MPI_SUCCESS;
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int src, int tag,
              MPI_Comm comm, MPI_Request *request) {
  ready("MPI_Irecv");
  check_comm(comm, "MPI_Irecv");
  *request = post_recv(comm, comm->context, src, tag, buf,
                       (size_t)count * type_size(type));
  return MPI_SUCCESS;
}

int MPI_Recv(void *buf, int count, MPI_Datatype type, int src, int tag,
             MPI_Comm comm, MPI_Status *status) {
  MPI_Request r;
  MPI_Irecv(buf, count, type, src, tag, comm, &r);
  return MPI_Wait(&r, status);
}

int MPI_Iprobe(int src, int tag, MPI_Comm comm, int *flag, MPI_Status *status) {
  ready("MPI_Iprobe");
  check_comm(comm, "MPI_Iprobe");
  progress();
  Engine &e = engine();
  int source =
      src == MPI_ANY_SOURCE ? MPI_ANY_SOURCE : comm->members[(size_t)src];
  for (const Message &m : e.unexpected)
    if (matches(m.header, comm->context, source, tag)) {
      *flag = 1;
      if (status) {
        status->MPI_SOURCE = comm->of_world(m.header.source);
        status->MPI_TAG = m.header.tag;
        status->bytes = m.header.bytes;
      }
      return MPI_SUCCESS;
    }
  *flag = 0;
  return MPI_SUCCESS;
}

int MPI_Probe(int src, int tag, MPI_Comm comm, MPI_Status *status) {
  int flag = 0;
  for (;;) {
    MPI_Iprobe(src, tag, comm, &flag, status);
    if (flag)
      return MPI_SUCCESS;
    progress(1);
  }
}

int MPI_Get_count(const MPI_Status *status, MPI_Datatype type, int *count) {
  *count = (int)(status->bytes / type_size(type));
  return MPI_SUCCESS;
}

int MPI_Test(MPI_Request *request, int *flag, MPI_Status *status) {
  if (!*request) {
    *flag = 1;
    return MPI_SUCCESS;
  }
  progress();
  *flag = test(*request) ? 1 : 0;
  if (*flag) {
    if (status)
      *status = (*request)->status;
    release(*request);
    *request = MPI_REQUEST_NULL;
  }
  return MPI_SUCCESS;
}

int MPI_Testall(int n, MPI_Request *requests, int *flag, MPI_Status *) {
  progress();
  for (int i = 0; i < n; ++i)
    if (requests[i] && !test(requests[i])) {
      *flag = 0;
      return MPI_SUCCESS;
    }
  for (int i = 0; i < n; ++i) {
    release(requests[i]);
    requests[i] = MPI_REQUEST_NULL;
  }
  *flag = 1;
  return MPI_SUCCESS;
}

int MPI_Wait(MPI_Request *request, MPI_Status *status) {
  if (!*request)
    return MPI_SUCCESS;
  wait(*request);
  if (status)
    *status = (*request)->status;
  release(*request);
  *request = MPI_REQUEST_NULL;
  return MPI_SUCCESS;
}

int MPI_Request_free(MPI_Request *request) {
  // planrt frees only completed sends this way (the watchdog's replies at
  // shutdown; an eager send is complete when it returns). A receive or a
  // collective still in flight would leave posted receives pointing at
  // freed memory and, for a root, members waiting forever: refused.
  Request *r = *request;
  if (r && !test(r)) {
    std::fprintf(stderr, "planrt: error: control plane: MPI_Request_free of "
                         "a receive or collective still in flight\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  release(r);
  *request = MPI_REQUEST_NULL;
  return MPI_SUCCESS;
}

int MPI_Ibarrier(MPI_Comm comm, MPI_Request *request) {
  ready("MPI_Ibarrier");
  check_comm(comm, "MPI_Ibarrier");
  *request = start_collective(Barrier, nullptr, nullptr, 0, MPI_BYTE, MPI_SUM,
                              0, comm);
  return MPI_SUCCESS;
}

int MPI_Iallreduce(const void *send, void *recv, int count, MPI_Datatype type,
                   MPI_Op op, MPI_Comm comm, MPI_Request *request) {
  ready("MPI_Iallreduce");
  check_comm(comm, "MPI_Iallreduce");
  *request =
      start_collective(Allreduce, send, recv, (size_t)count * type_size(type),
                       type, op, 0, comm);
  return MPI_SUCCESS;
}

int MPI_Ibcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
               MPI_Request *request) {
  ready("MPI_Ibcast");
  check_comm(comm, "MPI_Ibcast");
  *request =
      start_collective(Bcast, nullptr, buf, (size_t)count * type_size(type),
                       type, MPI_SUM, root, comm);
  return MPI_SUCCESS;
}

int MPI_Ireduce(const void *send, void *recv, int count, MPI_Datatype type,
                MPI_Op op, int root, MPI_Comm comm, MPI_Request *request) {
  ready("MPI_Ireduce");
  check_comm(comm, "MPI_Ireduce");
  *request =
      start_collective(Reduce, send, recv, (size_t)count * type_size(type),
                       type, op, root, comm);
  return MPI_SUCCESS;
}

int MPI_Igather(const void *send, int send_count, MPI_Datatype send_type,
                void *recv, int, MPI_Datatype, int root, MPI_Comm comm,
                MPI_Request *request) {
  ready("MPI_Igather");
  check_comm(comm, "MPI_Igather");
  *request = start_collective(Gather, send, recv,
                              (size_t)send_count * type_size(send_type),
                              send_type, MPI_SUM, root, comm);
  return MPI_SUCCESS;
}
