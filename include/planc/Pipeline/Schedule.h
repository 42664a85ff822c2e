//===- Schedule.h - pipeline-parallel schedules, verified and simulated
//----===//
//
// Pipeline parallelism cuts the model into S = ranks * virtualStages stages;
// stage s runs on pipeline rank s % ranks. A training step pushes m
// microbatches through the stages: a forward F(s, mb) needs F(s-1, mb), a
// backward B(s, mb) needs B(s+1, mb) and F(s, mb). With the zero-bubble split
// the backward is two actions: B computes the input gradient (what stage s-1
// waits for) and W the weight gradient (which nobody waits for, so it can be
// placed wherever a rank would otherwise idle).
//
// A schedule is the order of actions on each rank:
//  - GPipe: every forward, then every backward in reverse microbatch order
//    (the last forward's activations are the freshest; any order is valid).
//    Keeps all m microbatches' activations alive.
//  - 1F1B (PipeDream-flush): rank r runs p-r-1 warm-up forwards, then
//    alternates one forward and one backward, then drains the backwards.
//    Same bubble as GPipe, but at most p-r microbatches alive on rank r.
//  - Interleaved 1F1B (Narayanan et al. 2021, as in Megatron-LM): each rank
//    holds v stages (r, r+p, ...). Microbatches go through a rank's chunks in
//    groups of p, so a rank switches chunk every p microbatches; the warm-up
//    is 2(p-r-1) + (v-1)p forwards. Each chunk is 1/v of a rank's work, so
//    the fill/drain bubble shrinks by v, at the cost of more in flight.
//  - Zero bubble (ZB-H1 of Qi et al. 2023): 1F1B's order of F and B, with W
//    split out of B. Rank r defers its W's by r microbatches, so that every
//    rank holds at most p microbatches in flight (F done, W not done) -- the
//    peak of 1F1B's first rank -- and the deferred W's fill the drain. With
//    F = B = W the bubble is a third of 1F1B's.
//
// Verification model. A schedule becomes a Program: per rank, a list of
// steps, each an action with a cost, the messages it receives before it runs
// and the messages it sends when it ends. Messages from rank a to rank b are
// matched in order (a FIFO channel, as NCCL or MPI with one tag do); sends
// never block, receives block. simulate() first checks the program
// statically (every action exactly once on its own rank, F before B before W
// on a stage, local chain order, the k-th send on every channel equals the
// k-th receive, the in-flight bound), then runs it as a discrete-event
// simulation; if it stops with ranks blocked, that is a deadlock and every
// blocked rank is named with what it waits for. The resulting timeline gives
// the makespan, the bubble fraction and the peak in flight per stage, and can
// be exported as a Chrome trace or an SVG picture.
//
//===----------------------------------------------------------------------===//

#ifndef PLANC_PIPELINE_SCHEDULE_H
#define PLANC_PIPELINE_SCHEDULE_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace planc::pipeline {

/// B = input gradient; it includes the weight gradient unless the schedule
/// splits W out (zero bubble).
enum class Phase : uint8_t { F, B, W };
enum class Kind : uint8_t { GPipe, OneFOneB, Interleaved, ZeroBubble };

/// "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble".
std::optional<Kind> parseKind(llvm::StringRef);
/// The same spellings as parseKind.
llvm::StringRef kindName(Kind);
/// "forward", "backward", "weight_grad".
llvm::StringRef phaseName(Phase);
inline bool splitsWeightGrad(Kind k) { return k == Kind::ZeroBubble; }

struct Shape {
  int64_t ranks = 1, virtualStages = 1, microbatches = 1;
  int64_t stages() const { return ranks * virtualStages; }
  /// Stage s lives on pipeline rank s % ranks.
  int64_t rankOf(int64_t stage) const { return stage % ranks; }
};

struct Action {
  Phase phase;
  int64_t stage;
  int64_t mb;
};
inline bool operator==(const Action &a, const Action &b) {
  return a.phase == b.phase && a.stage == b.stage && a.mb == b.mb;
}
/// "F3", "B0", "W12" (phase letter + microbatch); the stage is not included.
std::string label(const Action &);
/// "B3 of stage 2": how errors name an action.
std::string describe(const Action &);

/// The order of actions on each pipeline rank (result[r] for rank r).
/// Errors: sizes below 1; GPipe/1F1B/ZeroBubble need virtualStages == 1;
/// Interleaved needs virtualStages >= 2 and microbatches % ranks == 0.
llvm::Expected<std::vector<std::vector<Action>>> makeSchedule(Kind, Shape);

/// The most microbatches the schedule keeps in flight on `stage` (F done, the
/// stage's last backward phase for that microbatch -- W when split, else B --
/// not yet done). With p = ranks, m = microbatches, r = rankOf(stage):
///  - GPipe: m.
///  - 1F1B: min(m, p - r).
///  - ZeroBubble (ZB-H1): min(m, p) on every stage. Counting until W, rank r
///    holds r more microbatches than 1F1B, never more than 1F1B's rank 0;
///    counting until B (the activations B needs) it is 1F1B's min(m, p - r),
///    see Timeline::peakAwaitingB and awaitingBBound().
///  - Interleaved: the exact peak of the Megatron order on the stage's chunk
///    c, counted from the order's numbering (not simulated; Schedule.cpp).
///    Earlier chunks hold more than later ones (the warm-up runs whole
///    groups of p through the first chunks); in the shapes tested (p <= 8,
///    v <= 4) it never exceeds min(m, 2p).
int64_t inFlightBound(Kind, Shape, int64_t stage);
/// inFlightBound for every stage, the form simulate() takes.
std::vector<int64_t> inFlightBounds(Kind, Shape);
/// The most microbatches with F done and B not yet done on `stage`; equals
/// inFlightBound except for ZeroBubble, where it is 1F1B's min(m, p - r).
int64_t awaitingBBound(Kind, Shape, int64_t stage);

/// A per-rank program to verify. Transfers are messages on the channel
/// (src rank -> dst rank); messages on one channel are matched in order
/// (FIFO). Sends are asynchronous (buffered, never block); receives block
/// until the matching message was sent.
struct Message {
  int64_t peer;     // the other rank
  int64_t transfer; // id of the value moved
  int64_t mb;
};
struct Step {
  Action action;
  double cost = 1;
  std::vector<Message> recvs; // all received before the step runs
  std::vector<Message> sends; // all sent when it ends
};
struct Program {
  Shape shape;
  bool splitW = false;                  // W actions exist
  std::vector<std::vector<Step>> ranks; // ranks[r] = steps of rank r in order
  double transfer = 0; // a message arrives this long after its send
};

/// Per-stage costs; empty vectors mean 1.0 each. When !splitW, B's cost is
/// b + w (so with w empty, B costs b + 1).
struct Costs {
  std::vector<double> f, b, w;
  double transfer = 0;
};

/// The standard chain for an order from makeSchedule: F(s, mb) sends its
/// output to F(s+1, mb) (transfer id 2*s), B(s, mb) sends the input gradient
/// to B(s-1, mb) (transfer id 2*s+1); no sends out of the last/first stage.
/// Consecutive stages on the same rank (ranks == 1) exchange no message.
/// Program::transfer is Costs::transfer.
/// Costs vectors that are neither empty nor one per stage are a caller bug
/// (fatal error).
Program chainProgram(Shape, bool splitW,
                     llvm::ArrayRef<std::vector<Action>> order, const Costs &);

struct Timeline {
  std::vector<std::vector<std::pair<double, double>>>
      span; // per rank, per step: start, end
  double makespan = 0;
  /// Mean over ranks of (makespan - busy_r) / busy_r, busy_r being the sum of
  /// rank r's step costs: the idle time per unit of useful work. For GPipe and
  /// 1F1B with uniform stages it is (p-1)/m. Ranks with no work are skipped.
  double bubbleFraction = 0;
  std::vector<int64_t>
      peakInFlight; // per stage (until the last backward phase)
  std::vector<int64_t> peakAwaitingB; // per stage: F done, B not yet done
  std::vector<double> busy;           // per rank: sum of step costs
};

/// Verifies `p`, then simulates it (a step starts when its rank finished the
/// previous step and all its messages arrived; a message arrives
/// Program::transfer time units after its send).
/// Errors name the rank, the step index on that rank, the action and the
/// microbatch:
///  - an action missing, repeated, out of range, on a rank other than
///    rankOf(stage), or a W when !splitW;
///  - B(s, mb) before F(s, mb), W before B; with two consecutive stages on
///    one rank, F(s+1, mb) before F(s, mb) or B(s, mb) before B(s+1, mb);
///  - a message to itself or to a rank out of range;
///  - channel order: the k-th send on a -> b differs (transfer, mb) from the
///    k-th receive on b from a, or the counts differ;
///  - deadlock: every blocked rank, its step and what it waits for;
///  - in flight on a stage above inFlightBounds[stage] (when given).
llvm::Expected<Timeline> simulate(const Program &,
                                  llvm::ArrayRef<int64_t> inFlightBounds = {});

/// Chrome trace JSON (Perfetto / chrome://tracing): one row (tid) per rank
/// named "pipeline rank r", one complete ("X") slice per step named by
/// label() with args {stage, microbatch, phase}, colored by phase ("cname"),
/// and a flow ("s"/"f") from each send to its receive. Times in microseconds,
/// `timeScaleUs` per cost unit.
void writeChromeTrace(const Program &, const Timeline &, llvm::raw_ostream &,
                      double timeScaleUs = 1000.0);
/// The timeline as an SVG picture: one row per rank, one <rect> per step
/// labeled with its microbatch and colored by phase, a legend (circles, so
/// that <rect> counts steps), the bubble fraction in the title.
void writeSvg(const Program &, const Timeline &, llvm::raw_ostream &,
              llvm::StringRef title = "");

} // namespace planc::pipeline

#endif // PLANC_PIPELINE_SCHEDULE_H
