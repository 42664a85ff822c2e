//===- watchdog.cpp - Timeouts on every wait for other ranks
//---------------===//
//
// See watchdog.h. Who is missing: when a wait expires, the rank sends a
// query to every other member of the group it waited on (over a
// communicator duplicated from MPI_COMM_WORLD at start) and gives them a
// grace period of min(1 s, --timeout) to answer. Ranks answer queries from
// inside their own waits (Wait::slow_tick and the grace period), with their
// step and what they wait for; a member that does not answer is stopped,
// dead, or busy outside the runtime's waits (a long kernel, a deadlock in
// user code). Nothing is exchanged while no wait expires: a wait costs one
// clock read and a sched_yield per 64 polls until it has lasted 10 ms.
//===----------------------------------------------------------------------===//

#include "control.h"

#include "watchdog.h"

#include "context.h"

#include <dirent.h>
#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <list>
#include <vector>

namespace planrt {
namespace watchdog {

namespace {

constexpr int kQueryTag = 1, kReplyTag = 2;

/// What a rank answers to a query.
struct Reply {
  int64_t step = 0;
  double waited = 0; // seconds in the current wait
  int64_t axis_mask = -1, axis = -1, coord = -1;
  int32_t peer = -1;
  int32_t to_peer = 0;
  int32_t waiting = 0;
  char name[64] = {0};
};

struct State {
  MPI_Comm comm = MPI_COMM_NULL;
  void (*hook)(Context *) = nullptr;
  bool waiting = false;                             // inside a Wait
  Op op;                                            // the current wait's
  double since = 0;                                 // its start (now())
  std::list<std::pair<MPI_Request, Reply>> replies; // answers being sent
};

State *state(const Context *ctx) { return (State *)ctx->watchdog; }

bool mpi_usable() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void check(int rc, const char *call) {
  if (rc != MPI_SUCCESS)
    fatal("%s failed (code %d)", call, rc);
}

Reply my_reply(const Context *ctx, const State *s) {
  Reply r;
  r.step = ctx->step;
  r.waiting = s->waiting ? 1 : 0;
  if (s->waiting) {
    r.waited = now() - s->since;
    r.axis_mask = s->op.axis_mask;
    r.axis = s->op.axis;
    r.coord = s->op.coord;
    r.peer = s->op.peer;
    r.to_peer = s->op.to_peer ? 1 : 0;
    std::snprintf(r.name, sizeof(r.name), "%s", s->op.name);
  }
  return r;
}

/// Answers the queries that arrived; completes the answers sent.
void serve(Context *ctx, State *s) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    check(MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, s->comm, &flag, &st),
          "MPI_Iprobe");
    if (!flag)
      break;
    int q = 0;
    check(MPI_Recv(&q, 1, MPI_INT, st.MPI_SOURCE, kQueryTag, s->comm,
                   MPI_STATUS_IGNORE),
          "MPI_Recv");
    s->replies.emplace_back();
    auto &r = s->replies.back();
    r.second = my_reply(ctx, s);
    check(MPI_Isend(&r.second, (int)sizeof(Reply), MPI_BYTE, st.MPI_SOURCE,
                    kReplyTag, s->comm, &r.first),
          "MPI_Isend");
  }
  for (auto it = s->replies.begin(); it != s->replies.end();) {
    int done = 0;
    check(MPI_Test(&it->first, &done, MPI_STATUS_IGNORE), "MPI_Test");
    it = done ? s->replies.erase(it) : std::next(it);
  }
}

void sleep_us(long us) {
  timespec ts{us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, nullptr);
}

/// "0-3" / "0, 2, 5": world ranks, consecutive runs shortened; at most 16.
std::string rank_list(const std::vector<int> &ranks) {
  std::string s;
  size_t shown = 0;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    if (!s.empty())
      s += ", ";
    if (++shown > 16) {
      s += "...";
      break;
    }
    s += std::to_string(ranks[i]);
    if (j > i)
      s += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

std::string ranks_word(const std::vector<int> &ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rank_list(ranks);
}

/// World ranks of the group of `mask` that this rank belongs to.
std::vector<int> group_members(const Context *ctx, int64_t mask) {
  std::vector<int> members;
  for (int r = 0; r < ctx->world; ++r) {
    if (mask < 0) {
      members.push_back(r);
      continue;
    }
    std::vector<int64_t> c = rank_coords(ctx, r);
    bool same = true;
    for (size_t a = 0; a < c.size() && same; ++a)
      if (!(mask & (int64_t(1) << a)) && c[a] != ctx->coords[a])
        same = false;
    if (same)
      members.push_back(r);
  }
  return members;
}

std::string describe_fields(const Context *ctx, const char *name, int64_t mask,
                            int peer, bool to_peer, int64_t axis,
                            int64_t coord) {
  std::string s = name;
  if (peer >= 0) {
    s += std::string(to_peer ? " to" : " from") + " rank " +
         std::to_string(peer);
    if (axis < 0 && ctx->started && peer < ctx->world &&
        ctx->coords.size() == ctx->axis_sizes.size()) {
      // The neighbour's axis: the one coordinate that differs.
      std::vector<int64_t> c = rank_coords(ctx, peer);
      int differ = 0;
      for (size_t a = 0; a < c.size(); ++a)
        if (c[a] != ctx->coords[a]) {
          ++differ;
          axis = (int64_t)a;
          coord = c[a];
        }
      if (differ != 1)
        axis = -1;
    }
    if (axis >= 0 && axis < (int64_t)ctx->axis_names.size())
      s += " (coordinate " + std::to_string(coord) + " on mesh axis '" +
           ctx->axis_names[(size_t)axis] + "')";
    return s;
  }
  if (mask < -1) // no group: the device's own work
    return s;
  if (mask < 0)
    return s + " over every rank (" + ranks_word(group_members(ctx, -1)) + ")";
  std::string axes;
  int n = 0;
  for (size_t a = 0; a < ctx->axis_names.size(); ++a)
    if (mask & (int64_t(1) << a)) {
      axes += (n++ ? ", " : "") + ctx->axis_names[a];
    }
  s += std::string(" over mesh ") + (n == 1 ? "axis " : "axes ") + axes;
  if (ctx->started && ctx->coords.size() == ctx->axis_sizes.size())
    s += " (" + ranks_word(group_members(ctx, mask)) + ")";
  return s;
}

[[noreturn]] void expire(Context *ctx, State *s, const Op &op, double waited) {
  std::vector<int> members;
  if (op.peer >= 0)
    members.push_back(op.peer);
  else if (op.axis_mask >= -1)
    for (int r : group_members(ctx, op.axis_mask))
      if (r != ctx->rank)
        members.push_back(r);
  // Ask the other members what they do; give them min(1 s, timeout).
  int query = ctx->rank;
  std::vector<MPI_Request> sends(members.size()), recvs(members.size());
  std::vector<Reply> answers(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    MPI_Isend(&query, 1, MPI_INT, members[i], kQueryTag, s->comm, &sends[i]);
    MPI_Irecv(&answers[i], (int)sizeof(Reply), MPI_BYTE, members[i], kReplyTag,
              s->comm, &recvs[i]);
  }
  std::vector<int> got(members.size(), 0);
  double grace = std::min(1.0, ctx->timeout_s), until = now() + grace;
  for (;;) {
    serve(ctx, s);
    bool all = true;
    for (size_t i = 0; i < members.size(); ++i) {
      if (!got[i])
        MPI_Test(&recvs[i], &got[i], MPI_STATUS_IGNORE);
      all = all && got[i];
    }
    if (all || now() >= until)
      break;
    sleep_us(1000);
  }
  // Classify them.
  std::vector<int> silent, same;
  std::string elsewhere, late;
  for (size_t i = 0; i < members.size(); ++i) {
    if (!got[i]) {
      silent.push_back(members[i]);
      continue;
    }
    Reply &a = answers[i];
    a.name[sizeof(a.name) - 1] = 0;
    if (op.peer < 0 && a.step == ctx->step && a.axis_mask == op.axis_mask &&
        a.peer < 0 && std::strcmp(a.name, op.name) == 0) {
      // A member that joined long after this rank was missing until then
      // (e.g. resumed after a stop).
      if (a.waited < waited - 1.0) {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "; rank %d joined it only %.1f s ago",
                      members[i], a.waited);
        late += buf;
      } else {
        same.push_back(members[i]);
      }
      continue;
    }
    elsewhere += "; rank " + std::to_string(members[i]) + " is in step " +
                 std::to_string(a.step) + " waiting for " +
                 describe_fields(ctx, a.name, a.axis_mask, a.peer,
                                 a.to_peer != 0, a.axis, a.coord);
  }
  char head[160];
  std::snprintf(head, sizeof(head),
                "watchdog: rank %d waited %.1f s (--timeout %g) in step %lld "
                "for ",
                ctx->rank, waited, ctx->timeout_s, (long long)ctx->step);
  std::string line = head + describe(ctx, op);
  if (!silent.empty()) {
    char grace_s[32];
    std::snprintf(grace_s, sizeof(grace_s), "%g", grace);
    line += "; missing: " + ranks_word(silent) + " (no answer within " +
            grace_s + " s: stopped, dead, or busy outside the runtime's " +
            "waits)";
  }
  line += late + elsewhere;
  if (!same.empty())
    line += "; " + ranks_word(same) + (same.size() == 1 ? " waits" : " wait") +
            " for it too";
  if (silent.empty() && elsewhere.empty() && late.empty() && !members.empty())
    line += " (every member waits in it but it does not complete)";
  line += "; aborting the job";
  std::fprintf(stderr, "planrt: error: %s\n", line.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (s->hook)
    s->hook(ctx);
  MPI_Abort(MPI_COMM_WORLD, kTimeoutExitCode);
  std::_Exit(kTimeoutExitCode);
}

} // namespace

double now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void init(Context *ctx) {
  if (ctx->watchdog || !ctx->use_mpi || !mpi_usable())
    return;
  State *s = new State;
  if (ctx->world > 1)
    check(MPI_Comm_dup(MPI_COMM_WORLD, &s->comm), "MPI_Comm_dup");
  ctx->watchdog = s;
}

void finalize(Context *ctx) {
  State *s = state(ctx);
  if (!s)
    return;
  if (mpi_usable()) {
    for (auto &r : s->replies)
      MPI_Request_free(&r.first);
    if (s->comm != MPI_COMM_NULL)
      MPI_Comm_free(&s->comm);
  }
  delete s;
  ctx->watchdog = nullptr;
}

void set_abort_hook(Context *ctx, void (*hook)(Context *)) {
  if (State *s = state(ctx))
    s->hook = hook;
}

std::string describe(const Context *ctx, const Op &op) {
  return describe_fields(ctx, op.name, op.axis_mask, op.peer, op.to_peer,
                         op.axis, op.coord);
}

Wait::Wait(Context *ctx, const Op &op) : ctx_(ctx), op_(op), start_(now()) {
  if (State *s = state(ctx)) {
    s->waiting = true;
    s->op = op;
    s->since = start_;
  }
}

Wait::~Wait() {
  if (State *s = state(ctx_))
    s->waiting = false;
}

void Wait::slow_tick() {
  double waited = now() - start_;
  if (waited < 0.01) {
    sched_yield(); // ranks may share the cores (oversubscribed)
    return;
  }
  State *s = state(ctx_);
  if (s && s->comm != MPI_COMM_NULL)
    serve(ctx_, s);
  if (ctx_->timeout_s > 0 && waited > ctx_->timeout_s) {
    if (s && s->comm != MPI_COMM_NULL)
      expire(ctx_, s, op_, waited);
    fatal("watchdog: rank %d waited %.1f s (--timeout %g) in step %lld for "
          "%s; aborting the job",
          ctx_->rank, waited, ctx_->timeout_s, (long long)ctx_->step,
          describe(ctx_, op_).c_str());
  }
  // Long waits give the core away: other ranks may share it.
  if (waited > 0.2)
    sleep_us(100);
  else
    sched_yield();
}

//===--- Non-finite loss or gradient norm ---------------------------------===//

std::string last_good_checkpoint(const Context *ctx) {
  // The newest complete checkpoint (lib/checkpoint_*.cpp: DIR/step-NNNNNN/
  // with a manifest.json) of a step before this one: checkpoints are
  // written after check_finite passed, so its step had a finite loss and
  // gradient norm. (--save-every files are not checkpoints.)
  if (ctx->checkpoint_dir.empty())
    return "";
  DIR *d = ::opendir(ctx->checkpoint_dir.c_str());
  if (!d)
    return "";
  int64_t best = -1;
  std::string best_name;
  while (dirent *e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind("step-", 0) != 0 || n.size() <= 5 || n.size() > 5 + 12 ||
        n.find_first_not_of("0123456789", 5) != std::string::npos)
      continue;
    int64_t step = std::strtoll(n.c_str() + 5, nullptr, 10);
    std::string manifest = ctx->checkpoint_dir + "/" + n + "/manifest.json";
    struct stat st;
    if (step < ctx->step && step > best && ::stat(manifest.c_str(), &st) == 0 &&
        S_ISREG(st.st_mode)) {
      best = step;
      best_name = n;
    }
  }
  ::closedir(d);
  if (best < 0)
    return "";
  std::string dir = ctx->checkpoint_dir;
  if (dir.back() != '/')
    dir += '/';
  return dir + best_name;
}

void check_finite(Context *ctx) {
  // 1: the loss is not finite, 2: the gradient norm is not finite.
  int what = 0;
  if (ctx->loss_reported && !std::isfinite(ctx->last_loss))
    what = 1;
  // A step skipped for a loss-scale overflow is not a divergence.
  else if (ctx->grad_norm_reported && !std::isfinite(ctx->last_grad_norm) &&
           !ctx->skip_step)
    what = 2;
  // Every rank learns the lowest rank that saw one (a rank may see what
  // another does not: values reduced in another order, a stage's own).
  int first = what ? ctx->rank : ctx->world;
  if (ctx->use_mpi && ctx->world > 1) {
    int mine = first;
    allreduce(ctx, &mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD,
              group_op("the check of the loss for NaN/Inf", -1));
  }
  if (first == ctx->world)
    return;
  if (ctx->rank == first) {
    char head[200];
    if (what == 1)
      std::snprintf(head, sizeof(head), "step %lld: the loss is %g",
                    (long long)ctx->step, (double)ctx->last_loss);
    else
      std::snprintf(head, sizeof(head),
                    "step %lld: the gradient norm is %g (loss %g)",
                    (long long)ctx->step, (double)ctx->last_grad_norm,
                    (double)ctx->last_loss);
    std::string ckpt = last_good_checkpoint(ctx);
    std::fprintf(
        stderr,
        "planrt: error: %s%s: training diverged; stopping every "
        "rank (exit code 1); %s\n",
        head,
        ctx->world > 1 ? (" on rank " + std::to_string(ctx->rank)).c_str() : "",
        ckpt.empty() ? "no checkpoint was written"
                     : ("the last good checkpoint is " + ckpt +
                        " (continue from it with --resume " + ckpt +
                        ", e.g. with a lower learning rate)")
                           .c_str());
  }
  std::fflush(stderr);
  std::fflush(stdout);
  if (mpi_usable())
    MPI_Finalize();
  std::exit(1);
}

//===--- MPI operations ---------------------------------------------------===//

void wait_all(Context *ctx, int n, MPI_Request *requests, const Op &op) {
  wait_until(ctx, op, [&] {
    int flag = 0;
    check(MPI_Testall(n, requests, &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
    return flag != 0;
  });
}

void allreduce(Context *ctx, const void *send, void *recv, int count,
               MPI_Datatype type, MPI_Op mpi_op, MPI_Comm comm, const Op &op) {
  MPI_Request r;
  check(MPI_Iallreduce(send, recv, count, type, mpi_op, comm, &r),
        "MPI_Iallreduce");
  wait_all(ctx, 1, &r, op);
}

void bcast(Context *ctx, void *data, int count, MPI_Datatype type, int root,
           MPI_Comm comm, const Op &op) {
  MPI_Request r;
  check(MPI_Ibcast(data, count, type, root, comm, &r), "MPI_Ibcast");
  wait_all(ctx, 1, &r, op);
}

void reduce(Context *ctx, const void *send, void *recv, int count,
            MPI_Datatype type, MPI_Op mpi_op, int root, MPI_Comm comm,
            const Op &op) {
  MPI_Request r;
  check(MPI_Ireduce(send, recv, count, type, mpi_op, root, comm, &r),
        "MPI_Ireduce");
  wait_all(ctx, 1, &r, op);
}

void barrier(Context *ctx, MPI_Comm comm, const Op &op) {
  MPI_Request r;
  check(MPI_Ibarrier(comm, &r), "MPI_Ibarrier");
  wait_all(ctx, 1, &r, op);
}

void gather(Context *ctx, const void *send, int count, MPI_Datatype type,
            void *recv, int root, MPI_Comm comm, const Op &op) {
  MPI_Request r;
  check(MPI_Igather(send, count, type, recv, count, type, root, comm, &r),
        "MPI_Igather");
  wait_all(ctx, 1, &r, op);
}

void send(Context *ctx, const void *data, int count, MPI_Datatype type,
          int dest, int tag, MPI_Comm comm, const Op &op) {
  MPI_Request r;
  check(MPI_Isend(data, count, type, dest, tag, comm, &r), "MPI_Isend");
  wait_all(ctx, 1, &r, op);
}

void recv(Context *ctx, void *data, int count, MPI_Datatype type, int src,
          int tag, MPI_Comm comm, const Op &op) {
  MPI_Request r;
  check(MPI_Irecv(data, count, type, src, tag, comm, &r), "MPI_Irecv");
  wait_all(ctx, 1, &r, op);
}

void probe(Context *ctx, int src, MPI_Comm comm, MPI_Status *status,
           const Op &op) {
  wait_until(ctx, op, [&] {
    int flag = 0;
    check(MPI_Iprobe(src, MPI_ANY_TAG, comm, &flag, status), "MPI_Iprobe");
    return flag != 0;
  });
}

} // namespace watchdog
} // namespace planrt
