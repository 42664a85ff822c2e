//===- Simulate.cpp - pipeline programs: build, verify, simulate ----------===//
//
// chainProgram turns a schedule's order into a program with messages;
// simulate checks a program statically, then runs it as a discrete-event
// simulation. The static checks come first so that a wrong program is
// reported by its cause (a misordered channel) rather than by its symptom
// (a deadlock or a wrong value).
//
//===----------------------------------------------------------------------===//

#include "planc/Pipeline/Schedule.h"

#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/Format.h"

#include <algorithm>
#include <map>
#include <set>

using namespace llvm;

namespace planc::pipeline {

static double costAt(const std::vector<double> &v, int64_t stage,
                     int64_t stages, const char *name) {
  if (v.empty())
    return 1.0;
  if ((int64_t)v.size() != stages)
    report_fatal_error(Twine("pipeline Costs::") + name + " has " +
                       Twine(v.size()) + " entries for " + Twine(stages) +
                       " stages");
  return v[stage];
}

Program chainProgram(Shape shape, bool splitW,
                     ArrayRef<std::vector<Action>> order, const Costs &costs) {
  Program prog;
  prog.shape = shape;
  prog.splitW = splitW;
  prog.transfer = costs.transfer;
  int64_t S = shape.stages();
  prog.ranks.resize(order.size());
  for (size_t r = 0; r < order.size(); ++r) {
    for (const Action &a : order[r]) {
      Step step;
      step.action = a;
      int64_t s = a.stage;
      bool inRange = s >= 0 && s < S;
      // Out-of-range stages are kept (with cost 1) so that simulate() names
      // them.
      auto rankOf = [&](int64_t st) { return shape.rankOf(st); };
      switch (a.phase) {
      case Phase::F:
        step.cost = inRange ? costAt(costs.f, s, S, "f") : 1.0;
        if (inRange && s > 0 && rankOf(s - 1) != (int64_t)r)
          step.recvs.push_back({rankOf(s - 1), 2 * (s - 1), a.mb});
        if (inRange && s + 1 < S && rankOf(s + 1) != (int64_t)r)
          step.sends.push_back({rankOf(s + 1), 2 * s, a.mb});
        break;
      case Phase::B:
        step.cost = inRange ? costAt(costs.b, s, S, "b") : 1.0;
        if (!splitW && inRange)
          step.cost += costAt(costs.w, s, S, "w");
        if (inRange && s + 1 < S && rankOf(s + 1) != (int64_t)r)
          step.recvs.push_back({rankOf(s + 1), 2 * (s + 1) + 1, a.mb});
        if (inRange && s > 0 && rankOf(s - 1) != (int64_t)r)
          step.sends.push_back({rankOf(s - 1), 2 * s + 1, a.mb});
        break;
      case Phase::W:
        step.cost = inRange ? costAt(costs.w, s, S, "w") : 1.0;
        break;
      }
      prog.ranks[r].push_back(std::move(step));
    }
  }
  return prog;
}

namespace {

std::string where(int64_t rank, int64_t step, const Action &a) {
  return "rank " + std::to_string(rank) + ", step " + std::to_string(step) +
         " (" + describe(a) + ", microbatch " + std::to_string(a.mb) + ")";
}

std::string msgText(const Message &m) {
  return "transfer " + std::to_string(m.transfer) + " of microbatch " +
         std::to_string(m.mb);
}

Error fail(const std::string &text) {
  return createStringError(inconvertibleErrorCode(), text);
}

struct Pos {
  int64_t rank = -1, step = -1;
};

// One end of a message: the step that sends or receives it.
struct Endpoint {
  Message msg;
  int64_t step;
  size_t index; // among the step's receives (unused for sends)
};

} // namespace

Expected<Timeline> simulate(const Program &prog, ArrayRef<int64_t> bounds) {
  const Shape &shape = prog.shape;
  if (shape.ranks < 1 || shape.virtualStages < 1 || shape.microbatches < 1)
    return fail(
        "program shape needs ranks, virtual stages and microbatches >= 1");
  int64_t P = shape.ranks, S = shape.stages(), M = shape.microbatches;
  if ((int64_t)prog.ranks.size() != P)
    return fail("program has " + std::to_string(prog.ranks.size()) +
                " ranks but its shape has " + std::to_string(P));
  if (!bounds.empty() && (int64_t)bounds.size() != S)
    return fail("in-flight bounds: " + std::to_string(bounds.size()) +
                " given for " + std::to_string(S) + " stages");

  // --- every action exactly once, on its own rank ---------------------------
  // pos[phase][stage * M + mb]
  std::vector<std::vector<Pos>> pos(3, std::vector<Pos>(S * M));
  auto at = [&](Phase ph, int64_t s, int64_t mb) -> Pos & {
    return pos[(int)ph][s * M + mb];
  };
  for (int64_t r = 0; r < P; ++r) {
    for (int64_t i = 0; i < (int64_t)prog.ranks[r].size(); ++i) {
      const Action &a = prog.ranks[r][i].action;
      if (a.stage < 0 || a.stage >= S || a.mb < 0 || a.mb >= M)
        return fail(where(r, i, a) + ": out of range (" + std::to_string(S) +
                    " stages, " + std::to_string(M) + " microbatches)");
      if (a.phase == Phase::W && !prog.splitW)
        return fail(
            where(r, i, a) +
            ": a weight-gradient action, but this program does not split W "
            "out of B");
      if (shape.rankOf(a.stage) != r)
        return fail(where(r, i, a) + ": stage " + std::to_string(a.stage) +
                    " lives on rank " + std::to_string(shape.rankOf(a.stage)));
      if (prog.ranks[r][i].cost < 0)
        return fail(where(r, i, a) + ": negative cost");
      Pos &p = at(a.phase, a.stage, a.mb);
      if (p.rank >= 0)
        return fail(where(r, i, a) + ": repeated; it already ran at step " +
                    std::to_string(p.step));
      p = {r, i};
    }
  }
  for (int ph = 0; ph < (prog.splitW ? 3 : 2); ++ph)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t mb = 0; mb < M; ++mb)
        if (at((Phase)ph, s, mb).rank < 0) {
          Action a{(Phase)ph, s, mb};
          return fail(describe(a) + " (microbatch " + std::to_string(mb) +
                      ") is missing: rank " + std::to_string(shape.rankOf(s)) +
                      " never runs it");
        }

  // --- dependencies on a rank, and the in-flight counts ----------------------
  Timeline tl;
  tl.peakInFlight.assign(S, 0);
  tl.peakAwaitingB.assign(S, 0);
  for (int64_t r = 0; r < P; ++r) {
    std::vector<int64_t> inFlight(S, 0), awaitingB(S, 0);
    for (int64_t i = 0; i < (int64_t)prog.ranks[r].size(); ++i) {
      const Action &a = prog.ranks[r][i].action;
      auto needBefore = [&](Action dep, const char *why) -> Error {
        Pos d = at(dep.phase, dep.stage, dep.mb);
        if (d.rank == r && d.step > i)
          return fail(where(r, i, a) + " runs before " + describe(dep) +
                      " (step " + std::to_string(d.step) + " on rank " +
                      std::to_string(r) + "), which " + why);
        return Error::success();
      };
      int64_t s = a.stage;
      switch (a.phase) {
      case Phase::F:
        // Stages on other ranks are ordered by the messages; consecutive
        // stages on one rank exchange none, so their order is checked here.
        if (s > 0 && shape.rankOf(s - 1) == r)
          if (Error e =
                  needBefore({Phase::F, s - 1, a.mb}, "produces its input"))
            return std::move(e);
        ++inFlight[s];
        ++awaitingB[s];
        tl.peakInFlight[s] = std::max(tl.peakInFlight[s], inFlight[s]);
        tl.peakAwaitingB[s] = std::max(tl.peakAwaitingB[s], awaitingB[s]);
        if (!bounds.empty() && inFlight[s] > bounds[s])
          return fail(where(r, i, a) + ": " + std::to_string(inFlight[s]) +
                      " microbatches in flight on stage " + std::to_string(s) +
                      ", above its bound of " + std::to_string(bounds[s]));
        break;
      case Phase::B:
        if (Error e = needBefore({Phase::F, s, a.mb}, "it differentiates"))
          return std::move(e);
        if (s + 1 < S && shape.rankOf(s + 1) == r)
          if (Error e = needBefore({Phase::B, s + 1, a.mb},
                                   "produces its output gradient"))
            return std::move(e);
        --awaitingB[s];
        if (!prog.splitW)
          --inFlight[s];
        break;
      case Phase::W:
        if (Error e = needBefore({Phase::B, s, a.mb},
                                 "produces the gradient it needs"))
          return std::move(e);
        --inFlight[s];
        break;
      }
    }
  }

  // --- channels: the k-th send on a -> b is the k-th receive on b from a ----
  // sends[{a, b}] in a's program order; recvs[{a, b}] in b's.
  std::map<std::pair<int64_t, int64_t>, std::vector<Endpoint>> sends, recvs;
  for (int64_t r = 0; r < P; ++r) {
    for (int64_t i = 0; i < (int64_t)prog.ranks[r].size(); ++i) {
      const Step &st = prog.ranks[r][i];
      for (int dir = 0; dir < 2; ++dir) {
        const std::vector<Message> &msgs = dir ? st.sends : st.recvs;
        for (size_t j = 0; j < msgs.size(); ++j) {
          const Message &m = msgs[j];
          if (m.peer < 0 || m.peer >= P || m.peer == r)
            return fail(where(r, i, st.action) + ": " +
                        (dir ? "sends " : "receives ") + msgText(m) +
                        (dir ? " to" : " from") + " rank " +
                        std::to_string(m.peer) +
                        (m.peer == r ? ", itself" : ", which does not exist"));
          if (dir)
            sends[{r, m.peer}].push_back({m, i, j});
          else
            recvs[{m.peer, r}].push_back({m, i, j});
        }
      }
    }
  }
  // senderOf[b][i][j] = (a, step of a) that sends the j-th receive of b's step
  // i.
  std::vector<std::vector<std::vector<Pos>>> senderOf(P);
  for (int64_t r = 0; r < P; ++r) {
    senderOf[r].resize(prog.ranks[r].size());
    for (size_t i = 0; i < prog.ranks[r].size(); ++i)
      senderOf[r][i].resize(prog.ranks[r][i].recvs.size());
  }
  std::set<std::pair<int64_t, int64_t>> channels;
  for (auto &kv : sends)
    channels.insert(kv.first);
  for (auto &kv : recvs)
    channels.insert(kv.first);
  for (auto ch : channels) {
    auto [a, b] = ch;
    const std::vector<Endpoint> &out = sends[ch], &in = recvs[ch];
    std::string chName =
        "channel rank " + std::to_string(a) + " -> rank " + std::to_string(b);
    for (size_t k = 0; k < std::min(out.size(), in.size()); ++k) {
      const Message &ms = out[k].msg, &mr = in[k].msg;
      if (ms.transfer != mr.transfer || ms.mb != mr.mb)
        return fail(chName + ": message " + std::to_string(k) + " is " +
                    msgText(ms) + ", sent by " +
                    where(a, out[k].step, prog.ranks[a][out[k].step].action) +
                    ", but " +
                    where(b, in[k].step, prog.ranks[b][in[k].step].action) +
                    " receives " + msgText(mr) +
                    " as that message (messages on a channel match in order)");
    }
    if (out.size() != in.size()) {
      bool moreSent = out.size() > in.size();
      const Endpoint &e = moreSent ? out[in.size()] : in[out.size()];
      int64_t er = moreSent ? a : b;
      return fail(chName + ": rank " + std::to_string(a) + " sends " +
                  std::to_string(out.size()) + " messages, rank " +
                  std::to_string(b) + " receives " + std::to_string(in.size()) +
                  "; the first unmatched is " + msgText(e.msg) +
                  (moreSent ? " sent by " : " received by ") +
                  where(er, e.step, prog.ranks[er][e.step].action));
    }
    for (size_t k = 0; k < in.size(); ++k)
      senderOf[b][in[k].step][in[k].index] = {a, out[k].step};
  }

  // --- discrete-event simulation ---------------------------------------------
  // A step's start depends only on earlier end times, so sweeping the ranks
  // until nothing moves computes the same times as an event queue would.
  std::vector<int64_t> next(P, 0);
  std::vector<double> freeAt(P, 0);
  tl.span.resize(P);
  for (int64_t r = 0; r < P; ++r)
    tl.span[r].resize(prog.ranks[r].size());
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t r = 0; r < P; ++r) {
      while (next[r] < (int64_t)prog.ranks[r].size()) {
        int64_t i = next[r];
        double start = freeAt[r];
        bool ready = true;
        for (const Pos &src : senderOf[r][i]) {
          if (next[src.rank] <= src.step) {
            ready = false;
            break;
          }
          start = std::max(start,
                           tl.span[src.rank][src.step].second + prog.transfer);
        }
        if (!ready)
          break;
        double end = start + prog.ranks[r][i].cost;
        tl.span[r][i] = {start, end};
        freeAt[r] = end;
        ++next[r];
        progress = true;
      }
    }
  }
  std::string blocked;
  int64_t nBlocked = 0;
  for (int64_t r = 0; r < P; ++r) {
    int64_t i = next[r];
    if (i >= (int64_t)prog.ranks[r].size())
      continue;
    const Step &st = prog.ranks[r][i];
    for (size_t j = 0; j < st.recvs.size(); ++j) {
      Pos src = senderOf[r][i][j];
      if (next[src.rank] > src.step)
        continue;
      blocked += "\n  " + where(r, i, st.action) + " waits for " +
                 msgText(st.recvs[j]) + " from rank " +
                 std::to_string(src.rank) + ", sent by its step " +
                 std::to_string(src.step) + " (" +
                 describe(prog.ranks[src.rank][src.step].action) + ")";
      break;
    }
    ++nBlocked;
  }
  if (nBlocked)
    return fail("deadlock: " + std::to_string(nBlocked) + " of " +
                std::to_string(P) + " ranks blocked:" + blocked);

  tl.busy.assign(P, 0);
  for (int64_t r = 0; r < P; ++r)
    for (size_t i = 0; i < prog.ranks[r].size(); ++i) {
      tl.busy[r] += prog.ranks[r][i].cost;
      tl.makespan = std::max(tl.makespan, tl.span[r][i].second);
    }
  double sum = 0;
  int64_t counted = 0;
  for (int64_t r = 0; r < P; ++r)
    if (tl.busy[r] > 0) {
      sum += (tl.makespan - tl.busy[r]) / tl.busy[r];
      ++counted;
    }
  tl.bubbleFraction = counted ? sum / counted : 0;
  return tl;
}

} // namespace planc::pipeline
