//===- Schedule.cpp - pipeline schedule generation ------------------------===//
//
// The per-rank orders of GPipe, 1F1B, interleaved 1F1B and ZB-H1, and the
// in-flight bounds they guarantee. See Schedule.h for the schedules.
//
//===----------------------------------------------------------------------===//

#include "planc/Pipeline/Schedule.h"

#include "llvm/ADT/StringSwitch.h"

#include <algorithm>

using namespace llvm;

namespace planc::pipeline {

std::optional<Kind> parseKind(StringRef s) {
  return StringSwitch<std::optional<Kind>>(s)
      .Case("gpipe", Kind::GPipe)
      .Case("1f1b", Kind::OneFOneB)
      .Case("interleaved_1f1b", Kind::Interleaved)
      .Case("zero_bubble", Kind::ZeroBubble)
      .Default(std::nullopt);
}

StringRef kindName(Kind k) {
  switch (k) {
  case Kind::GPipe:
    return "gpipe";
  case Kind::OneFOneB:
    return "1f1b";
  case Kind::Interleaved:
    return "interleaved_1f1b";
  case Kind::ZeroBubble:
    return "zero_bubble";
  }
  llvm_unreachable("unknown schedule kind");
}

StringRef phaseName(Phase p) {
  switch (p) {
  case Phase::F:
    return "forward";
  case Phase::B:
    return "backward";
  case Phase::W:
    return "weight_grad";
  }
  llvm_unreachable("unknown phase");
}

static char phaseLetter(Phase p) {
  return p == Phase::F ? 'F' : p == Phase::B ? 'B' : 'W';
}

std::string label(const Action &a) {
  return phaseLetter(a.phase) + std::to_string(a.mb);
}

std::string describe(const Action &a) {
  return label(a) + " of stage " + std::to_string(a.stage);
}

namespace {

// The interleaved order numbers a rank's m*v forwards (and backwards) k = 0,
// 1, ...; k walks p microbatches through chunk 0, the same p through chunk 1,
// ..., then the next p microbatches. Backwards walk the chunks in reverse.
// Every rank uses the same numbering, which is what keeps each channel's
// sends and receives in the same order.
struct InterleavedNumbering {
  int64_t p, v;
  int64_t mb(int64_t k) const { return (k / (p * v)) * p + k % p; }
  int64_t fwdChunk(int64_t k) const { return (k % (p * v)) / p; }
  int64_t bwdChunk(int64_t k) const { return v - 1 - fwdChunk(k); }
  // How many of k in [0, n) run chunk c forward (resp. backward).
  int64_t countFwd(int64_t n, int64_t c) const { return countBlock(n, c); }
  int64_t countBwd(int64_t n, int64_t c) const {
    return countBlock(n, v - 1 - c);
  }

private:
  int64_t countBlock(int64_t n, int64_t block) const {
    int64_t full = n / (p * v), rest = n % (p * v);
    return full * p + std::clamp<int64_t>(rest - block * p, 0, p);
  }
};

// Megatron-LM's warm-up: enough forwards that rank r's first backward (of
// its last chunk) can already have come back, 2 per rank below it, plus a
// full group of p for each chunk before the last.
int64_t interleavedWarmup(Shape s, int64_t r) {
  int64_t total = s.microbatches * s.virtualStages;
  return std::min(total,
                  2 * (s.ranks - r - 1) + (s.virtualStages - 1) * s.ranks);
}

int64_t oneFOneBWarmup(Shape s, int64_t r) {
  return std::min(s.microbatches, s.ranks - r - 1);
}

// 1F1B's order of F and B on rank r (stage r): warm-up forwards, then one
// forward and one backward in turn, then the remaining backwards.
std::vector<Action> oneFOneB(Shape s, int64_t r) {
  std::vector<Action> out;
  int64_t m = s.microbatches, warm = oneFOneBWarmup(s, r);
  for (int64_t i = 0; i < warm; ++i)
    out.push_back({Phase::F, r, i});
  for (int64_t i = 0; i < m - warm; ++i) {
    out.push_back({Phase::F, r, warm + i});
    out.push_back({Phase::B, r, i});
  }
  for (int64_t i = m - warm; i < m; ++i)
    out.push_back({Phase::B, r, i});
  return out;
}

// ZB-H1: 1F1B's F/B order; W(i - r) right after B(i). Rank r's W lags its B
// by r microbatches so that its last B's (the drain, where it would wait for
// the ranks above) are not delayed, and the lagging W's fill the drain. At
// any F, rank r has done F's up to p-r-1+i and W's up to i-r-1: at most p in
// flight.
std::vector<Action> zeroBubbleH1(Shape s, int64_t r) {
  std::vector<Action> out;
  int64_t m = s.microbatches, nextW = 0;
  for (const Action &a : oneFOneB(s, r)) {
    out.push_back(a);
    if (a.phase == Phase::B && a.mb - r >= 0)
      out.push_back({Phase::W, r, nextW++});
  }
  while (nextW < m)
    out.push_back({Phase::W, r, nextW++});
  return out;
}

std::vector<Action> interleaved(Shape s, int64_t r) {
  std::vector<Action> out;
  InterleavedNumbering n{s.ranks, s.virtualStages};
  int64_t total = s.microbatches * s.virtualStages;
  int64_t warm = interleavedWarmup(s, r);
  auto fwd = [&](int64_t k) {
    out.push_back({Phase::F, n.fwdChunk(k) * s.ranks + r, n.mb(k)});
  };
  auto bwd = [&](int64_t k) {
    out.push_back({Phase::B, n.bwdChunk(k) * s.ranks + r, n.mb(k)});
  };
  for (int64_t k = 0; k < warm; ++k)
    fwd(k);
  for (int64_t j = 0; j < total - warm; ++j) {
    fwd(warm + j);
    bwd(j);
  }
  for (int64_t j = total - warm; j < total; ++j)
    bwd(j);
  return out;
}

} // namespace

Expected<std::vector<std::vector<Action>>> makeSchedule(Kind kind, Shape s) {
  if (s.ranks < 1 || s.virtualStages < 1 || s.microbatches < 1)
    return createStringError(
        "pipeline shape needs ranks, virtual stages and microbatches >= 1 (got "
        "ranks = %lld, virtual stages = %lld, microbatches = %lld)",
        (long long)s.ranks, (long long)s.virtualStages,
        (long long)s.microbatches);
  if (kind != Kind::Interleaved && s.virtualStages != 1)
    return createStringError(
        "schedule '%s' runs one stage per rank, but virtual stages = %lld; use "
        "interleaved_1f1b for several stages per rank, or set virtual stages "
        "to 1",
        kindName(kind).str().c_str(), (long long)s.virtualStages);
  if (kind == Kind::Interleaved) {
    if (s.virtualStages < 2)
      return createStringError("schedule 'interleaved_1f1b' needs at least 2 "
                               "virtual stages per rank "
                               "(got %lld); with one stage per rank use 1f1b",
                               (long long)s.virtualStages);
    if (s.microbatches % s.ranks != 0)
      return createStringError(
          "schedule 'interleaved_1f1b' moves microbatches in groups of one per "
          "rank, so microbatches (%lld) must be a multiple of the pipeline "
          "ranks "
          "(%lld); use %lld or %lld microbatches",
          (long long)s.microbatches, (long long)s.ranks,
          (long long)(s.microbatches / s.ranks * s.ranks),
          (long long)((s.microbatches / s.ranks + 1) * s.ranks));
  }

  std::vector<std::vector<Action>> order(s.ranks);
  for (int64_t r = 0; r < s.ranks; ++r) {
    switch (kind) {
    case Kind::GPipe:
      // Backwards in reverse: the last forward's output is the first the last
      // stage can differentiate without waiting, and every stage keeps the
      // same order so the gradient chain pipelines.
      for (int64_t i = 0; i < s.microbatches; ++i)
        order[r].push_back({Phase::F, r, i});
      for (int64_t i = s.microbatches - 1; i >= 0; --i)
        order[r].push_back({Phase::B, r, i});
      break;
    case Kind::OneFOneB:
      order[r] = oneFOneB(s, r);
      break;
    case Kind::ZeroBubble:
      order[r] = zeroBubbleH1(s, r);
      break;
    case Kind::Interleaved:
      order[r] = interleaved(s, r);
      break;
    }
  }
  return order;
}

// The interleaved peak on chunk c of rank r. After the warm-up and j steady
// rounds the rank has run forwards [0, W + j + 1) and backwards [0, j); the
// in-flight count of chunk c is the difference of the two counts. Its maximum
// over j is the bound (the cool-down only lowers it). No simulation involved:
// it follows from the numbering alone.
static int64_t interleavedBound(Shape s, int64_t stage) {
  InterleavedNumbering n{s.ranks, s.virtualStages};
  int64_t r = s.rankOf(stage), c = stage / s.ranks;
  int64_t total = s.microbatches * s.virtualStages;
  int64_t warm = interleavedWarmup(s, r);
  int64_t peak = n.countFwd(warm, c);
  // The difference is periodic in j with period p*v; one period suffices.
  int64_t steady = std::min(total - warm, s.ranks * s.virtualStages);
  for (int64_t j = 0; j < steady; ++j)
    peak = std::max(peak, n.countFwd(warm + j + 1, c) - n.countBwd(j, c));
  return peak;
}

int64_t inFlightBound(Kind kind, Shape s, int64_t stage) {
  int64_t m = s.microbatches, p = s.ranks;
  switch (kind) {
  case Kind::GPipe:
    return m;
  case Kind::OneFOneB:
    return std::min(m, p - s.rankOf(stage));
  case Kind::ZeroBubble:
    return std::min(m, p);
  case Kind::Interleaved:
    return interleavedBound(s, stage);
  }
  llvm_unreachable("unknown schedule kind");
}

std::vector<int64_t> inFlightBounds(Kind kind, Shape s) {
  std::vector<int64_t> out;
  for (int64_t st = 0; st < s.stages(); ++st)
    out.push_back(inFlightBound(kind, s, st));
  return out;
}

int64_t awaitingBBound(Kind kind, Shape s, int64_t stage) {
  if (kind == Kind::ZeroBubble)
    return std::min(s.microbatches, s.ranks - s.rankOf(stage));
  return inFlightBound(kind, s, stage);
}

} // namespace planc::pipeline
