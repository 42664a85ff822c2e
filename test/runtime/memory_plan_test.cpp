//===- memory_plan_test.cpp - The arena of the compiler's memory plan -----===//
//
// planrt's side of plan-memory: buffers at planned offsets, the checks that
// catch a wrong plan (overlapping live buffers, an op taking other
// temporaries than planned, a buffer never released, bytes past the arena),
// the high-water mark the run compares with the plan, and the live bytes
// counted by kind.
//===----------------------------------------------------------------------===//
#include "context_fixture.h"

#include "context.h"

#include "planrt/workspace.h"

#include <cmath>
#include <cstdlib>

namespace planrt {
namespace {

namespace ws = planrt::workspace;

/// A context whose step function has a 16 KiB arena (32 KiB of buffers
/// without reuse), inside arena_begin.
class MemoryPlanTest : public test::ContextTest {
protected:
  MemoryPlanTest() : ContextTest("memory-plan", 7) {}
  void declare() override { plan_arena(ctx, 0, 0, 16384, 32768); }
  void SetUp() override {
    ContextTest::SetUp();
    arena_begin(ctx, 0);
  }
  /// [n] floats at `offset`, of kind `kind`.
  Tensor *at(int64_t offset, int64_t n, int64_t kind = 0) {
    return alloc_at(ctx, offset, kind, 1, n, 1, 1, 1);
  }
};

TEST_F(MemoryPlanTest, BuffersLiveAtTheirOffsetsAndReuseBytes) {
  Tensor *a = at(0, 64), *b = at(256, 64, 1);
  EXPECT_EQ((char *)b->data - (char *)a->data, 256);
  fill(ctx, a, 1.0f);
  fill(ctx, b, 2.0f);
  EXPECT_EQ(internal::to_host(ctx, a)[63], 1.0f);
  dealloc(ctx, a);
  Tensor *c = at(0, 32); // a's bytes, free again
  EXPECT_EQ(c->data, a->data);
  dealloc(ctx, b);
  dealloc(ctx, c);
  arena_end(ctx);
  EXPECT_EQ(ctx->planned_fns[0].high_water, 512);
  // Peaks by kind: a and c never lived together; b is a gradient.
  EXPECT_EQ(ctx->live_peak[0], 256);
  EXPECT_EQ(ctx->live_peak[1], 256);
  EXPECT_EQ(ctx->live_total_peak, 512);
}

TEST_F(MemoryPlanTest, WrongPlansAreFatal) {
  Tensor *a = at(256, 64);
  EXPECT_DEATH(at(0, 100), "alloc_at: bytes \\[0, 512\\) of the arena overlap "
                           "the live activation buffer at \\[256, 512\\)");
  EXPECT_DEATH(at(16128, 128), "past the end of the arena \\(16384 B planned");
  EXPECT_DEATH(at(100, 1), "alloc_at: invalid arguments");
  EXPECT_DEATH(op_workspace(ctx, 0, 512), "op_workspace: bytes \\[0, 512\\) "
                                          "of the arena overlap");
  EXPECT_DEATH(arena_end(ctx), "arena_end: 1 buffers were never released");
  Tensor other;
  EXPECT_DEATH(dealloc(ctx, &other), "not a live buffer of the memory plan");
  dealloc(ctx, a);
  arena_end(ctx);
  EXPECT_DEATH(at(0, 1), "alloc_at: called outside a planned function");
}

// sumsq_accumulate takes the partial sums workspace.h promises; less or
// more than planned is fatal.
TEST_F(MemoryPlanTest, OpsTakeExactlyTheirWorkspace) {
  int64_t n = 3000; // 3 partial sums of 1024 elements
  Tensor *g = at(0, n), *acc = alloc_at(ctx, 12288, 0, 0, 1, 1, 1, 1);
  fill(ctx, g, 1.0f);
  fill(ctx, acc, 0.0f);
  int64_t bytes = ws::sumsq_accumulate(n);
  EXPECT_EQ(bytes, 256);
  op_workspace(ctx, 12544, bytes);
  sumsq_accumulate(ctx, g, acc);
  EXPECT_EQ(internal::to_host(ctx, acc)[0], 3000.0f);
  EXPECT_EQ(ctx->live_peak[2], 256);
  // Planned too much: the op takes 256 of 512 bytes.
  op_workspace(ctx, 12544, 512);
  sumsq_accumulate(ctx, g, acc);
  EXPECT_DEATH(dealloc(ctx, g), "an op took 256 B of temporaries where the "
                                "plan gave it 512 B");
  // Planned too little.
  ctx->ws_used = ctx->ws_bytes;
  EXPECT_DEATH(sumsq_accumulate(ctx, g, acc),
               "an op took more than the 512 B of temporaries the plan gave");
  // No workspace planned at all.
  ctx->ws_offset = -1;
  ctx->ws_used = ctx->ws_bytes = 0;
  EXPECT_DEATH(sumsq_accumulate(ctx, g, acc),
               "an op took 256 B of temporaries the plan did not give it");
  dealloc(ctx, g);
  dealloc(ctx, acc);
  arena_end(ctx);
}

TEST_F(MemoryPlanTest, PoisonMakesReleasedBytesNaN) {
  ctx->poison = true;
  Tensor *a = at(0, 8);
  fill(ctx, a, 3.0f);
  float *bytes = a->data;
  dealloc(ctx, a);
  Tensor view;
  view.ndim = 1;
  view.shape[0] = 8;
  view.data = bytes;
  EXPECT_TRUE(std::isnan(internal::to_host(ctx, &view)[0]));
  arena_end(ctx);
}

TEST(MemoryPlanWorkspace, FormulasRoundLikeTheArena) {
  EXPECT_EQ(ws::round(0), 256);
  EXPECT_EQ(ws::round(257), 512);
  EXPECT_EQ(ws::floats(64), 256);
  EXPECT_EQ(ws::floats(65), 512);
  EXPECT_EQ(ws::reduce_sum(1024), 256);
  EXPECT_EQ(ws::norm_grad(true, 4, 8), 512);
  EXPECT_EQ(ws::norm_grad(false, 4, 8), 256);
  EXPECT_EQ(ws::all_gather(10, 20, 1, 2, 4), 0); // contiguous blocks
  EXPECT_EQ(ws::all_gather(10, 20, 2, 2, 4), 256);
  // 16-bit values staged as they are: 2 bytes each.
  EXPECT_EQ(ws::all_gather(100, 200, 2, 2, 4), 1024);
  EXPECT_EQ(ws::all_gather(100, 200, 2, 2, 2), 512);
  EXPECT_EQ(ws::all_to_all(200, 2, 2, 2, 2), 1024);
  // (max, sum) of 100 rows: 800 B -> 1024; delta: 400 B -> 512.
  EXPECT_EQ(ws::attention_grad(8, 100), 1536);
}

} // namespace
} // namespace planrt
