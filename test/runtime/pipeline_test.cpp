// Pipeline parallelism on one rank (no MPI): the stash (views, reference
// counts, memory freed, the errors), the schedule, units and their
// in-flight counts, messages to itself, and the errors of each call.
#include "context_fixture.h"

#include <array>

using namespace planrt;

namespace {

/// One rank; mesh axis pp of size 1 carries a pipeline of 3 stages (all on
/// this rank); parameter "w" belongs to stage 2.
class PipelineTest : public test::ContextTest {
protected:
  PipelineTest() : ContextTest("pipeline", 3) {}
  void declare() override {
    declare_mesh_axis(ctx, "pp", 1);
    declare_pipeline(ctx, 1, 3);
    declare_param(ctx, "w", 1, 6, 1, 1, 1, InitOnes, 0.0f, 0.0f);
    set_param_stage(ctx, 0, 2);
    schedule_add(ctx, 0, 7, 0);
    // The rest as generated programs pass it: one table of triples.
    static const int64_t table[] = {0, 8, 1, 0, 9, 2};
    schedule_table(ctx, table, 2);
  }
};

TEST_F(PipelineTest, ScheduleAndOwnership) {
  EXPECT_EQ(schedule_length(ctx), 3);
  EXPECT_EQ(schedule_unit(ctx, 0), 7);
  EXPECT_EQ(schedule_mb(ctx, 0), 0);
  EXPECT_EQ(schedule_unit(ctx, 1), 8);
  EXPECT_EQ(schedule_mb(ctx, 1), 1);
  EXPECT_EQ(schedule_unit(ctx, 2), 9);
  EXPECT_EQ(schedule_mb(ctx, 2), 2);
  for (int64_t s : {-1, 0, 1, 2})
    EXPECT_EQ(owns_stage(ctx, s), 1);
  EXPECT_EQ(mesh_coord(ctx, 1), 0);
  EXPECT_NE(param(ctx, 0), nullptr); // the only pipeline rank owns stage 2
  EXPECT_DEATH(schedule_unit(ctx, 3), "schedule_unit: entry 3 out of range");
  EXPECT_DEATH(owns_stage(ctx, 3), "owns_stage: stage 3 out of range");
}

TEST_F(PipelineTest, StashViewsShareOneAllocationFreedAfterTheLastRelease) {
  EXPECT_EQ(internal::stash_live_bytes(ctx), 0);
  unit_begin(ctx, 0, 0, 0, 0);
  Tensor *a = alloc_stash(ctx, 2, 4, 8, 1, 1);
  internal::from_host(ctx, a, std::vector<float>(32, 2.5f));
  EXPECT_EQ(internal::stash_live_bytes(ctx), 128);
  stash_put(ctx, a, 0, 0, 2);                  // two readers
  stash_put(ctx, rows(ctx, a, 1, 2), 1, 0, 1); // a block of rows
  stash_put(ctx, subview(ctx, a, 30, 1, 2, 1, 1, 1), 2, 0, 1);
  stash_put(ctx, param(ctx, 0), 3, 0, 1);            // persistent memory
  Tensor *unused = alloc_stash(ctx, 1, 10, 1, 1, 1); // never put
  (void)unused;
  float *base = a->data; // a's header is scratch of this unit
  EXPECT_EQ(internal::stash_allocations(ctx), 2);
  unit_end(ctx); // frees the unused allocation only
  EXPECT_EQ(internal::stash_allocations(ctx), 1);
  EXPECT_EQ(internal::stash_live_bytes(ctx), 128);

  unit_begin(ctx, 0, 1, 0, 1);
  Tensor *r = stash_get(ctx, 1, 0);
  EXPECT_EQ(r->ndim, 2);
  EXPECT_EQ(r->shape[0], 2);
  EXPECT_EQ(r->data, base + 16);
  EXPECT_EQ(stash_get(ctx, 2, 0)->data, base + 30);
  EXPECT_EQ(stash_get(ctx, 3, 0)->data, param(ctx, 0)->data);
  EXPECT_EQ(internal::to_host(ctx, stash_get(ctx, 0, 0)),
            std::vector<float>(32, 2.5f));
  stash_release(ctx, 0, 0);
  stash_get(ctx, 0, 0); // one reader left
  stash_release(ctx, 0, 0);
  EXPECT_DEATH(stash_get(ctx, 0, 0),
               "stash_get: nothing was put in slot 0 of microbatch 0");
  stash_release(ctx, 1, 0);
  stash_release(ctx, 3, 0);
  EXPECT_EQ(internal::stash_live_bytes(ctx), 128); // slot 2 still points in
  stash_release(ctx, 2, 0);
  EXPECT_EQ(internal::stash_live_bytes(ctx), 0);
  EXPECT_EQ(internal::stash_allocations(ctx), 0);
  unit_end(ctx);
  internal::end_step(ctx);
}

TEST_F(PipelineTest, StashMemoryOfAnOpenUnitWaitsForItsEnd) {
  unit_begin(ctx, 1, 0, 3, 0);
  Tensor *a = alloc_stash(ctx, 1, 64, 1, 1, 1);
  stash_put(ctx, a, 5, 3, 1);
  stash_release(ctx, 5, 3); // the unit is still open: the memory stays
  EXPECT_EQ(internal::stash_live_bytes(ctx), 256);
  unit_end(ctx);
  EXPECT_EQ(internal::stash_live_bytes(ctx), 0);
  unit_begin(ctx, 1, 1, 3, 1);
  unit_end(ctx);
  internal::end_step(ctx);
}

TEST_F(PipelineTest, StashErrors) {
  unit_begin(ctx, 0, 0, 0, 0);
  Tensor *a = alloc_stash(ctx, 1, 4, 1, 1, 1);
  stash_put(ctx, a, 1, 2, 1);
  EXPECT_DEATH(stash_put(ctx, a, 1, 2, 1),
               "stash_put: slot 1 of microbatch 2 was already put");
  EXPECT_DEATH(stash_put(ctx, alloc(ctx, 1, 4, 1, 1, 1), 2, 2, 1),
               "stash_put: slot 2 of microbatch 2: the tensor \\[4\\] is arena "
               "scratch");
  EXPECT_DEATH(stash_put(ctx, a, 3, 2, 0), "needs at least one reader");
  EXPECT_DEATH(stash_release(ctx, 1, 3),
               "stash_release: nothing was put in slot 1 of microbatch 3");
  unit_end(ctx);
  EXPECT_DEATH(internal::end_step(ctx),
               "end of step: microbatch 0 of stage 0 is still in flight");
  unit_begin(ctx, 0, 1, 0, 1);
  unit_end(ctx);
  EXPECT_DEATH(internal::end_step(ctx),
               "end of step: the stash still holds 1 value\\(s\\): slot 1 of "
               "microbatch 2 \\(1 reader\\(s\\) left\\)");
  stash_release(ctx, 1, 2);
  internal::end_step(ctx);
  EXPECT_EQ(internal::stash_live_bytes(ctx), 0);
}

TEST_F(PipelineTest, UnitsCountMicrobatchesInFlight) {
  // Stage 0: F0 F1 F2 B0 B1 F3 B2 B3 -> peak 3; stage 1: F0 B0 W0 (split
  // backward: the weight-gradient phase is the last) -> peak 1.
  std::vector<std::array<int64_t, 4>> units = {
      {0, 0, 0, 0}, {0, 0, 1, 0}, {0, 0, 2, 0}, {0, 1, 0, 1},
      {0, 1, 1, 1}, {0, 0, 3, 0}, {0, 1, 2, 1}, {0, 1, 3, 1},
      {1, 0, 0, 0}, {1, 1, 0, 0}, {1, 2, 0, 1}};
  for (auto &u : units) {
    int64_t mark = arena_mark(ctx);
    unit_begin(ctx, u[0], u[1], u[2], u[3]);
    alloc(ctx, 1, 1000, 1, 1, 1); // given back at unit_end
    unit_end(ctx);
    EXPECT_EQ(arena_mark(ctx), mark + 1) << "the unit's mark was released";
    arena_release(ctx, mark);
  }
  internal::end_step(ctx);
  EXPECT_EQ(internal::pipeline_peaks(ctx), (std::vector<int64_t>{3, 1, 0}));
}

TEST_F(PipelineTest, UnitErrors) {
  EXPECT_DEATH(unit_begin(ctx, 3, 0, 0, 0), "unit_begin: stage 3 out of range");
  EXPECT_DEATH(unit_begin(ctx, 0, 3, 0, 0), "phase must be 0 \\(forward\\)");
  EXPECT_DEATH(unit_begin(ctx, 0, 1, 0, 1),
               "the last backward phase of microbatch 0 on stage 0 begins but "
               "its forward did not");
  EXPECT_DEATH(unit_end(ctx), "unit_end: no unit is open");
  unit_begin(ctx, 0, 0, 0, 0);
  EXPECT_DEATH(unit_begin(ctx, 1, 0, 0, 0), "is still open");
  EXPECT_DEATH(internal::end_step(ctx),
               "end of step: the unit of stage 0 \\(phase 0, microbatch 0\\) "
               "was begun and not ended");
  unit_end(ctx);
  EXPECT_DEATH(unit_begin(ctx, 0, 0, 0, 0),
               "forward of microbatch 0 on stage 0 begins while that "
               "microbatch is already in flight");
}

TEST_F(PipelineTest, MessagesToItself) {
  Tensor *a = make({3});
  internal::from_host(ctx, a, {1, 2, 3});
  send(ctx, a, 1, 0);
  Tensor *ids = make({2});
  ids->dtype = I32;
  internal::from_host_ids(ctx, ids, {7, 9});
  send(ctx, ids, 1, 0);
  internal::from_host(ctx, a, {0, 0, 0}); // the send copied it
  EXPECT_DEATH(recv(ctx, make({4}), 1, 0),
               "recv: the message from coordinate 0 on mesh axis 1 \\('pp'\\) "
               "has 3 elements but the receiving tensor \\[4\\] has 4");
  Tensor *b = make({3});
  recv(ctx, b, 1, 0);
  EXPECT_EQ(internal::to_host(ctx, b), (std::vector<float>{1, 2, 3}));
  EXPECT_DEATH(recv(ctx, make({2}), 1, 0),
               "the message from coordinate 0 on mesh axis 1 \\('pp'\\) is "
               "i32 but the receiving tensor \\[2\\] is f32");
  Tensor *c = make({2});
  c->dtype = I32;
  recv(ctx, c, 1, 0);
  EXPECT_EQ(internal::to_host_ids(ctx, c), (std::vector<int32_t>{7, 9}));
  EXPECT_DEATH(recv(ctx, c, 1, 0), "sent itself nothing");
  EXPECT_DEATH(send(ctx, c, 1, 1), "peer coordinate 1 out of range");
  EXPECT_DEATH(send(ctx, c, 2, 0), "mesh axis 2 is not declared");
}

TEST(PipelineDescription, Errors) {
  auto run_bad = [](void (*f)(Context *)) {
    Context *ctx = internal::create_context("bad", false);
    declare_mesh_axis(ctx, "dp", 1);
    declare_mesh_axis(ctx, "pp", 2);
    declare_param(ctx, "w", 1, 2, 1, 1, 1, InitZeros, 0.0f, 0.0f);
    f(ctx);
  };
  EXPECT_DEATH(run_bad([](Context *c) { declare_pipeline(c, 1, 3); }),
               "declare_pipeline: 3 stages is not a positive multiple of the "
               "size 2 of axis 'pp'");
  EXPECT_DEATH(run_bad([](Context *c) { set_param_stage(c, 0, 0); }),
               "set_param_stage: no pipeline is declared");
  EXPECT_DEATH(run_bad([](Context *c) {
                 declare_pipeline(c, 1, 4);
                 set_param_stage(c, 0, 4);
               }),
               "set_param_stage: stage 4 out of range \\(4 stages");
  EXPECT_DEATH(run_bad([](Context *c) {
                 declare_pipeline(c, 1, 2);
                 expect_pipeline_bytes(c, 1, 0, 0, 0);
               }),
               "expect_pipeline_bytes: call it once per pipeline coordinate");
  EXPECT_DEATH(run_bad([](Context *c) { schedule_add(c, 0, 0, 0); }),
               "schedule_add: no pipeline is declared");
  EXPECT_DEATH(run_bad([](Context *c) {
                 declare_pipeline(c, 1, 2);
                 schedule_table(c, nullptr, 1);
               }),
               "schedule_table: expected a table of entries >= 0 triples");
  EXPECT_DEATH(run_bad([](Context *c) {
                 static const int64_t t[] = {0, 0, 0};
                 declare_pipeline(c, 1, 2);
                 schedule_table(c, t, -1);
               }),
               "schedule_table: expected a table");
  EXPECT_DEATH(run_bad([](Context *c) {
                 static const int64_t t[] = {5, 0, 0};
                 declare_pipeline(c, 1, 2);
                 schedule_table(c, t, 1);
               }),
               "schedule_add: pipeline coordinate 5 out of range");
}

TEST(PipelineDescription, NoPipelineOwnsEverything) {
  Context *ctx = internal::create_context("none", false);
  declare_mesh_axis(ctx, "dp", 1);
  internal::start(ctx);
  EXPECT_EQ(owns_stage(ctx, 5), 1);
  EXPECT_EQ(mesh_coord(ctx, 0), 0);
  internal::destroy_context(ctx);
}

} // namespace
