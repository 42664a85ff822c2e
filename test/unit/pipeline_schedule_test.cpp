// Unit tests of the pipeline schedule library: every schedule verifies and
// has the bubble its paper gives, hand-broken programs are refused with the
// error that names the culprit, and the exports are well formed.
#include "planc/Pipeline/Schedule.h"

#include "llvm/Support/JSON.h"

#include <gtest/gtest.h>

#include <cstdio>

using namespace planc::pipeline;

namespace {

std::string errText(llvm::Error e) { return llvm::toString(std::move(e)); }

std::vector<double> uniform(Shape s, double x) {
  return std::vector<double>(s.stages(), x);
}

// Schedule, chain program and simulation in one; fails the test with the
// library's message when any of them refuses.
struct Run {
  Program prog;
  Timeline tl;
};
std::optional<Run> runSchedule(Kind k, Shape s, const Costs &c) {
  auto order = makeSchedule(k, s);
  if (!order) {
    ADD_FAILURE() << kindName(k).str() << ": " << errText(order.takeError());
    return std::nullopt;
  }
  Program prog = chainProgram(s, splitsWeightGrad(k), *order, c);
  auto tl = simulate(prog, inFlightBounds(k, s));
  if (!tl) {
    ADD_FAILURE() << kindName(k).str() << " p=" << s.ranks
                  << " v=" << s.virtualStages << " m=" << s.microbatches << ": "
                  << errText(tl.takeError());
    return std::nullopt;
  }
  return Run{std::move(prog), std::move(*tl)};
}

// f = b = w = 1: split kinds run B and W as 1 each, the others B = b + w = 2,
// so every kind does the same work per microbatch.
Costs unitCosts(Shape s) {
  return {uniform(s, 1), uniform(s, 1), uniform(s, 1), 0};
}

const int64_t kRanks[] = {2, 3, 4, 8};
const int64_t kMicrobatches[] = {1, 2, 4, 8, 16};

} // namespace

TEST(PipelineSchedule, KindNamesRoundTrip) {
  for (Kind k :
       {Kind::GPipe, Kind::OneFOneB, Kind::Interleaved, Kind::ZeroBubble})
    EXPECT_EQ(parseKind(kindName(k)), k);
  EXPECT_EQ(kindName(Kind::Interleaved), "interleaved_1f1b");
  EXPECT_EQ(kindName(Kind::ZeroBubble), "zero_bubble");
  EXPECT_FALSE(parseKind("interleaved").has_value());
  EXPECT_EQ(label({Phase::W, 5, 12}), "W12");
  EXPECT_EQ(describe({Phase::B, 2, 3}), "B3 of stage 2");
}

TEST(PipelineSchedule, ShapeErrors) {
  auto err = [](Kind k, Shape s) {
    auto r = makeSchedule(k, s);
    return r ? std::string() : errText(r.takeError());
  };
  EXPECT_NE(err(Kind::GPipe, {0, 1, 4}).find("ranks = 0"), std::string::npos);
  EXPECT_NE(err(Kind::OneFOneB, {2, 1, 0}).find("microbatches = 0"),
            std::string::npos);
  EXPECT_NE(err(Kind::OneFOneB, {2, 2, 4}).find("use interleaved_1f1b"),
            std::string::npos);
  EXPECT_NE(err(Kind::ZeroBubble, {2, 2, 4}).find("virtual stages = 2"),
            std::string::npos);
  EXPECT_NE(err(Kind::Interleaved, {2, 1, 4}).find("at least 2 virtual stages"),
            std::string::npos);
  std::string e = err(Kind::Interleaved, {4, 2, 6});
  EXPECT_NE(e.find("multiple of the pipeline ranks (4)"), std::string::npos)
      << e;
  EXPECT_NE(e.find("use 4 or 8 microbatches"), std::string::npos) << e;
  EXPECT_EQ(err(Kind::Interleaved, {4, 2, 8}), "");
}

TEST(PipelineSchedule, OneFOneBOrder) {
  // Rank 0 of 4: three warm-up forwards, then F/B alternating, then drain.
  auto order = makeSchedule(Kind::OneFOneB, {4, 1, 6});
  ASSERT_TRUE(bool(order));
  std::string s;
  for (const Action &a : (*order)[0])
    s += label(a) + " ";
  EXPECT_EQ(s, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  s.clear();
  for (const Action &a : (*order)[3])
    s += label(a) + " ";
  EXPECT_EQ(s, "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
}

TEST(PipelineSchedule, GPipeAndOneFOneBBubble) {
  for (Kind k : {Kind::GPipe, Kind::OneFOneB})
    for (int64_t p : kRanks)
      for (int64_t m : kMicrobatches) {
        Shape s{p, 1, m};
        auto run = runSchedule(k, s, unitCosts(s));
        ASSERT_TRUE(run);
        SCOPED_TRACE(kindName(k).str() + " p=" + std::to_string(p) +
                     " m=" + std::to_string(m));
        EXPECT_NEAR(run->tl.bubbleFraction, double(p - 1) / m, 1e-9);
        EXPECT_NEAR(run->tl.makespan, 3.0 * (m + p - 1), 1e-9);
        for (int64_t st = 0; st < s.stages(); ++st) {
          int64_t want = k == Kind::GPipe ? m : std::min(m, p - st);
          EXPECT_EQ(run->tl.peakInFlight[st], want) << "stage " << st;
          EXPECT_EQ(inFlightBound(k, s, st), want);
        }
      }
}

TEST(PipelineSchedule, BubbleDoesNotDependOnTheForwardBackwardRatio) {
  // (p-1)/m holds for any uniform f and b, not only for b = 2f.
  Shape s{4, 1, 8};
  Costs c{uniform(s, 1.5), uniform(s, 2.25), uniform(s, 0.25), 0};
  for (Kind k : {Kind::GPipe, Kind::OneFOneB}) {
    auto run = runSchedule(k, s, c);
    ASSERT_TRUE(run);
    EXPECT_NEAR(run->tl.bubbleFraction, 3.0 / 8, 1e-9);
  }
}

TEST(PipelineSchedule, InterleavedBubble) {
  for (int64_t p : kRanks)
    for (int64_t v : {2, 3, 4})
      for (int64_t m : {1, 2, 3, 4, 6, 8, 12, 16, 24}) {
        if (m % p != 0)
          continue;
        Shape s{p, v, m};
        // Each chunk is 1/v of a rank's model.
        double c = 1.0 / v;
        auto run =
            runSchedule(Kind::Interleaved, s,
                        {uniform(s, c), uniform(s, c), uniform(s, c), 0});
        ASSERT_TRUE(run);
        SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) +
                     " m=" + std::to_string(m));
        EXPECT_NEAR(run->tl.bubbleFraction, double(p - 1) / (v * m), 1e-9);
        for (int64_t st = 0; st < s.stages(); ++st) {
          EXPECT_LE(run->tl.peakInFlight[st],
                    inFlightBound(Kind::Interleaved, s, st));
          // The bound is the exact peak, derived without simulating.
          EXPECT_EQ(run->tl.peakInFlight[st],
                    inFlightBound(Kind::Interleaved, s, st));
          EXPECT_LE(run->tl.peakInFlight[st], std::min(m, 2 * p));
        }
      }
}

TEST(PipelineSchedule, InterleavedChannelsCarryForwardAndBackward) {
  // With 2 ranks, rank 0 -> rank 1 carries both activations (stage 0 -> 1)
  // and gradients (stage 2 -> 1): one FIFO channel for both directions of
  // the model. The schedule must keep them in one order on both ends.
  Shape s{2, 3, 8};
  auto run = runSchedule(Kind::Interleaved, s, unitCosts(s));
  ASSERT_TRUE(run);
  bool fwd = false, bwd = false;
  for (const Step &st : run->prog.ranks[0])
    for (const Message &m : st.sends) {
      EXPECT_EQ(m.peer, 1);
      fwd |= m.transfer % 2 == 0;
      bwd |= m.transfer % 2 == 1;
    }
  EXPECT_TRUE(fwd && bwd);
}

TEST(PipelineSchedule, ZeroBubbleBeatsOneFOneB) {
  for (int64_t p : kRanks)
    for (int64_t m : kMicrobatches) {
      Shape s{p, 1, m};
      auto zb = runSchedule(Kind::ZeroBubble, s, unitCosts(s));
      auto ofob = runSchedule(Kind::OneFOneB, s, unitCosts(s));
      ASSERT_TRUE(zb && ofob);
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      if (m >= p) {
        EXPECT_LT(zb->tl.bubbleFraction, ofob->tl.bubbleFraction);
        // ZB-H1 with F = B = W: the drain is filled by W, the remaining
        // bubble is the warm-up's (p-1) units, a third of 1F1B's 3(p-1).
        EXPECT_NEAR(zb->tl.makespan, 3.0 * m + (p - 1), 1e-9);
        EXPECT_NEAR(zb->tl.bubbleFraction, ofob->tl.bubbleFraction / 3, 1e-9);
      } else {
        EXPECT_LE(zb->tl.bubbleFraction, ofob->tl.bubbleFraction + 1e-12);
      }
      for (int64_t st = 0; st < s.stages(); ++st) {
        EXPECT_LE(zb->tl.peakInFlight[st],
                  inFlightBound(Kind::ZeroBubble, s, st));
        EXPECT_LE(zb->tl.peakInFlight[st], std::min(m, p));
        // The activations B needs are held exactly as long as in 1F1B.
        EXPECT_EQ(zb->tl.peakAwaitingB[st], ofob->tl.peakInFlight[st]);
        EXPECT_EQ(zb->tl.peakAwaitingB[st],
                  awaitingBBound(Kind::ZeroBubble, s, st));
      }
    }
}

TEST(PipelineSchedule, SingleRankHasNoMessagesAndNoBubble) {
  for (Kind k :
       {Kind::GPipe, Kind::OneFOneB, Kind::ZeroBubble, Kind::Interleaved}) {
    Shape s{1, k == Kind::Interleaved ? 3 : 1, 4};
    auto run = runSchedule(k, s, unitCosts(s));
    ASSERT_TRUE(run);
    for (const Step &st : run->prog.ranks[0])
      EXPECT_TRUE(st.sends.empty() && st.recvs.empty());
    EXPECT_NEAR(run->tl.bubbleFraction, 0, 1e-12);
  }
}

TEST(PipelineSchedule, TransferTimeDelaysTheChain) {
  Shape s{4, 1, 8};
  Costs c = unitCosts(s);
  c.transfer = 0.5;
  auto run = runSchedule(Kind::GPipe, s, c);
  ASSERT_TRUE(run);
  // Forwards fill in (p-1) hops, backwards drain in (p-1) hops.
  EXPECT_NEAR(run->tl.makespan, 3.0 * (8 + 3) + 2 * 3 * 0.5, 1e-9);
}

// --- hand-broken programs ----------------------------------------------------

namespace {
Program chain(Kind k, Shape s, std::vector<std::vector<Action>> order) {
  return chainProgram(s, splitsWeightGrad(k), order, unitCosts(s));
}
std::vector<std::vector<Action>> order(Kind k, Shape s) {
  auto o = makeSchedule(k, s);
  EXPECT_TRUE(bool(o));
  return o ? *o : std::vector<std::vector<Action>>{};
}
std::string simErr(const Program &p, llvm::ArrayRef<int64_t> bounds = {}) {
  auto r = simulate(p, bounds);
  return r ? std::string("(no error)") : errText(r.takeError());
}
#define EXPECT_HAS(text, part)                                                 \
  EXPECT_NE((text).find(part), std::string::npos) << (text)
} // namespace

TEST(PipelineVerify, BackwardBeforeItsForward) {
  Shape s{2, 1, 2};
  auto o = order(Kind::OneFOneB, s);
  // Rank 1 runs F0 B0 F1 B1; swap to F0 B0 B1 F1.
  ASSERT_EQ(label(o[1][2]), "F1");
  std::swap(o[1][2], o[1][3]);
  std::string e = simErr(chain(Kind::OneFOneB, s, o));
  EXPECT_HAS(e, "rank 1, step 2 (B1 of stage 1, microbatch 1) runs before F1 "
                "of stage 1 (step 3");
}

TEST(PipelineVerify, WeightGradBeforeBackward) {
  Shape s{2, 1, 2};
  auto o = order(Kind::ZeroBubble, s);
  // Rank 0: F0 F1 B0 W0 B1 W1; move W1 before B1.
  ASSERT_EQ(label(o[0][4]), "B1");
  std::swap(o[0][4], o[0][5]);
  std::string e = simErr(chain(Kind::ZeroBubble, s, o));
  EXPECT_HAS(
      e,
      "rank 0, step 4 (W1 of stage 0, microbatch 1) runs before B1 of stage 0");
}

TEST(PipelineVerify, SendsReorderedOnAChannel) {
  Shape s{2, 1, 2};
  Program p = chain(Kind::GPipe, s, order(Kind::GPipe, s));
  // Rank 0's F0 and F1 each send one activation to rank 1; swap the two.
  auto &r0 = p.ranks[0];
  ASSERT_EQ(r0[0].sends.size(), 1u);
  std::swap(r0[0].sends, r0[1].sends);
  std::string e = simErr(p);
  EXPECT_HAS(
      e, "channel rank 0 -> rank 1: message 0 is transfer 0 of microbatch 1, "
         "sent by rank 0, step 0 (F0 of stage 0, microbatch 0)");
  EXPECT_HAS(e,
             "rank 1, step 0 (F0 of stage 1, microbatch 0) receives transfer 0 "
             "of microbatch 0");
}

TEST(PipelineVerify, MessageCountsDiffer) {
  Shape s{2, 1, 2};
  Program p = chain(Kind::OneFOneB, s, order(Kind::OneFOneB, s));
  p.ranks[1].back().sends.clear(); // rank 1's last B sends no gradient
  std::string e = simErr(p);
  EXPECT_HAS(
      e,
      "channel rank 1 -> rank 0: rank 1 sends 1 messages, rank 0 receives 2");
  EXPECT_HAS(e, "received by rank 0, step 3 (B1 of stage 0, microbatch 1)");
}

TEST(PipelineVerify, CyclicWaitIsADeadlock) {
  Shape s{2, 1, 1};
  Program p = chain(Kind::OneFOneB, s, order(Kind::OneFOneB, s));
  // Rank 0: F0 (sends to 1), B0 (receives from 1). Make F0 wait for B0's
  // gradient: rank 0 step 0 waits for rank 1, whose step 0 waits for rank 0.
  std::swap(p.ranks[0][0].recvs, p.ranks[0][1].recvs);
  std::string e = simErr(p);
  EXPECT_HAS(e, "deadlock: 2 of 2 ranks blocked");
  EXPECT_HAS(
      e, "rank 0, step 0 (F0 of stage 0, microbatch 0) waits for transfer 3 "
         "of microbatch 0 from rank 1, sent by its step 1 (B0 of stage 1)");
  EXPECT_HAS(
      e, "rank 1, step 0 (F0 of stage 1, microbatch 0) waits for transfer 0 "
         "of microbatch 0 from rank 0, sent by its step 0 (F0 of stage 0)");
}

TEST(PipelineVerify, MissingRepeatedMisplacedActions) {
  Shape s{2, 1, 4};
  auto o = order(Kind::OneFOneB, s);
  auto dropped = o;
  dropped[1].erase(dropped[1].begin() + 4); // rank 1: F0 B0 F1 B1 [F2] ...
  EXPECT_HAS(simErr(chain(Kind::OneFOneB, s, dropped)),
             "F2 of stage 1 (microbatch 2) is missing: rank 1 never runs it");

  auto repeated = o;
  repeated[0].push_back(repeated[0][0]);
  EXPECT_HAS(simErr(chain(Kind::OneFOneB, s, repeated)),
             "rank 0, step 8 (F0 of stage 0, microbatch 0): repeated; it "
             "already ran at step 0");

  auto misplaced = o;
  misplaced[0][0].stage = 1;
  EXPECT_HAS(
      simErr(chain(Kind::OneFOneB, s, misplaced)),
      "rank 0, step 0 (F0 of stage 1, microbatch 0): stage 1 lives on rank 1");

  auto w = o;
  w[0].push_back({Phase::W, 0, 0});
  EXPECT_HAS(
      simErr(chain(Kind::OneFOneB, s, w)),
      "rank 0, step 8 (W0 of stage 0, microbatch 0): a weight-gradient action");
}

TEST(PipelineVerify, LocalChainOrderOnOneRank) {
  // One rank holding three chunks: no messages, so the stage order on the
  // rank is all that keeps F(s) after F(s-1).
  Shape s{1, 3, 1};
  std::vector<std::vector<Action>> o = {{{Phase::F, 0, 0},
                                         {Phase::F, 2, 0},
                                         {Phase::F, 1, 0},
                                         {Phase::B, 2, 0},
                                         {Phase::B, 1, 0},
                                         {Phase::B, 0, 0}}};
  EXPECT_HAS(
      simErr(chain(Kind::Interleaved, s, o)),
      "rank 0, step 1 (F0 of stage 2, microbatch 0) runs before F0 of stage 1 "
      "(step 2 on rank 0), which produces its input");
}

TEST(PipelineVerify, InFlightBoundExceeded) {
  // GPipe keeps all m in flight; with 1F1B's bounds it is refused on rank 0
  // at its (p+1)-th forward.
  Shape s{4, 1, 8};
  Program p = chain(Kind::GPipe, s, order(Kind::GPipe, s));
  std::string e = simErr(p, inFlightBounds(Kind::OneFOneB, s));
  EXPECT_HAS(e,
             "rank 0, step 4 (F4 of stage 0, microbatch 4): 5 microbatches in "
             "flight on stage 0, above its bound of 4");
  EXPECT_HAS(simErr(p, {1, 2}), "in-flight bounds: 2 given for 4 stages");
}

// --- exports -----------------------------------------------------------------

TEST(PipelineExport, ChromeTraceIsValidJson) {
  Shape s{4, 1, 8};
  auto run = runSchedule(Kind::ZeroBubble, s, unitCosts(s));
  ASSERT_TRUE(run);
  std::string text;
  llvm::raw_string_ostream os(text);
  writeChromeTrace(run->prog, run->tl, os);
  auto parsed = llvm::json::parse(text);
  ASSERT_TRUE(bool(parsed)) << errText(parsed.takeError());
  const llvm::json::Array *events =
      parsed->getAsObject()->getArray("traceEvents");
  ASSERT_TRUE(events);
  size_t steps = 0, messages = 0, slices = 0, flowStarts = 0, flowEnds = 0,
         names = 0;
  for (const auto &r : run->prog.ranks) {
    steps += r.size();
    for (const Step &st : r)
      messages += st.sends.size();
  }
  for (const llvm::json::Value &ev : *events) {
    const llvm::json::Object *o = ev.getAsObject();
    ASSERT_TRUE(o);
    llvm::StringRef ph = *o->getString("ph");
    if (ph == "X") {
      ++slices;
      const llvm::json::Object *args = o->getObject("args");
      ASSERT_TRUE(args && args->getInteger("stage") &&
                  args->getInteger("microbatch") && args->getString("phase"));
      EXPECT_TRUE(o->getString("cname").has_value());
    }
    flowStarts += ph == "s";
    flowEnds += ph == "f";
    if (ph == "M" && *o->getString("name") == "thread_name") {
      ++names;
      EXPECT_EQ(*o->getObject("args")->getString("name"),
                "pipeline rank " + std::to_string(*o->getInteger("tid")));
    }
  }
  EXPECT_EQ(slices, steps);
  EXPECT_EQ(steps, 3u * 4 * 8);
  EXPECT_EQ(flowStarts, messages);
  EXPECT_EQ(flowEnds, messages);
  EXPECT_EQ(messages, 2u * 3 * 8); // 3 hops forward and backward per microbatch
  EXPECT_EQ(names, 4u);
}

TEST(PipelineExport, SvgHasOneRectPerStep) {
  Shape s{4, 2, 8};
  auto run = runSchedule(Kind::Interleaved, s, unitCosts(s));
  ASSERT_TRUE(run);
  std::string text;
  llvm::raw_string_ostream os(text);
  writeSvg(run->prog, run->tl, os, "interleaved <p=4, v=2>");
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
  size_t rects = 0;
  for (size_t at = text.find("<rect"); at != std::string::npos;
       at = text.find("<rect", at + 1))
    ++rects;
  EXPECT_EQ(rects, 2u * 4 * 2 * 8);
  EXPECT_HAS(text, "interleaved &lt;p=4, v=2&gt;: bubble");
  EXPECT_HAS(text, "forward");
  EXPECT_EQ(text.find("weight gradient"), std::string::npos);
}

// Prints the bubble table (the numbers for the report) and checks each row
// against its schedule's closed form.
TEST(PipelineReport, BubbleTable) {
  std::printf("%-18s %3s %2s %3s %10s %10s\n", "schedule", "p", "v", "m",
              "makespan", "bubble");
  for (int64_t p : {4, 8})
    for (int64_t m : {8, 16}) {
      for (Kind k :
           {Kind::GPipe, Kind::OneFOneB, Kind::ZeroBubble, Kind::Interleaved}) {
        int64_t v = k == Kind::Interleaved ? 2 : 1;
        Shape s{p, v, m};
        double c = 1.0 / v;
        auto run =
            runSchedule(k, s, {uniform(s, c), uniform(s, c), uniform(s, c), 0});
        ASSERT_TRUE(run);
        std::printf("%-18s %3lld %2lld %3lld %10.3f %10.4f\n",
                    kindName(k).str().c_str(), (long long)p, (long long)v,
                    (long long)m, run->tl.makespan, run->tl.bubbleFraction);
        // Each row is its schedule's closed form (F = B = W = 1 per stage):
        // the table is what docs and reviews quote, so it must not drift.
        double fill = double(p - 1), makespan, bubble;
        switch (k) {
        case Kind::ZeroBubble:
          makespan = 3.0 * m + fill, bubble = fill / (3.0 * m);
          break;
        case Kind::Interleaved:
          makespan = 3.0 * m + 3.0 * fill / v, bubble = fill / double(v * m);
          break;
        default: // GPipe, 1F1B
          makespan = 3.0 * (m + fill), bubble = fill / m;
        }
        EXPECT_NEAR(run->tl.makespan, makespan, 1e-9) << kindName(k).str();
        EXPECT_NEAR(run->tl.bubbleFraction, bubble, 1e-9) << kindName(k).str();
      }
    }
}
