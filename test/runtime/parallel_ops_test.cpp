// Ops for tensor parallelism and ZeRO on one rank (no MPI): the block
// packing functors of the dim-moving collectives, the collectives on groups
// of one rank, the split cross-entropy against cross_entropy, vocab-parallel
// embedding, non-blocking all-reduce slots, declared optimizer state and the
// checks of sharded / segmented parameters. Multi-rank behaviour is tested
// in mpi/mesh_tests.cpp.
#include "planrt/internal.h"
#include "planrt/kernels.h"
#include "planrt/planrt.h"

#include "context_fixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using namespace planrt;

namespace {

class ParallelOpsTest : public test::ContextTest {
protected:
  ParallelOpsTest() : ContextTest("parallel", 97) {}

  std::vector<float> host(const Tensor *t) { return internal::to_host(ctx, t); }
};

/// Row-major index of (a, b, c) in a [A, B, C] tensor.
int64_t at3(const int64_t s[3], int64_t a, int64_t b, int64_t c) {
  return (a * s[1] + b) * s[2] + c;
}

//===--- Block packing ----------------------------------------------------===//

TEST(BlockFunctors, SplitAndMergeAlongEveryDimOf3D) {
  const int64_t shape[3] = {4, 6, 9};
  std::vector<float> x(4 * 6 * 9);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = (float)i;
  for (int64_t G : {2, 3}) {
    for (int dim = 0; dim < 3; ++dim) {
      if (shape[dim] % G)
        continue;
      int64_t outer = 1, inner = 1, D = shape[dim], Db = D / G;
      for (int i = 0; i < dim; ++i)
        outer *= shape[i];
      for (int i = dim + 1; i < 3; ++i)
        inner *= shape[i];
      std::vector<float> packed(x.size()), merged(x.size());
      kernels::SplitBlocksFn<> split{x.data(), packed.data(), outer, D,
                                     Db,       inner,         0};
      for (int64_t i = 0; i < (int64_t)x.size(); ++i)
        split(i);
      // Block k holds x restricted to [k*Db, (k+1)*Db) along dim, row-major.
      int64_t bs[3] = {shape[0], shape[1], shape[2]};
      bs[dim] = Db;
      int64_t per = bs[0] * bs[1] * bs[2];
      for (int64_t k = 0; k < G; ++k)
        for (int64_t a = 0; a < bs[0]; ++a)
          for (int64_t b = 0; b < bs[1]; ++b)
            for (int64_t c = 0; c < bs[2]; ++c) {
              int64_t idx[3] = {a, b, c};
              idx[dim] += k * Db;
              ASSERT_EQ(packed[k * per + at3(bs, a, b, c)],
                        x[at3(shape, idx[0], idx[1], idx[2])])
                  << "G " << G << " dim " << dim << " block " << k;
            }
      kernels::MergeBlocksFn<> merge{
          packed.data(), merged.data(), outer, Db, inner, G};
      for (int64_t i = 0; i < (int64_t)x.size(); ++i)
        merge(i);
      EXPECT_EQ(merged, x) << "G " << G << " dim " << dim;
      // One block alone (shard_slice): block G - 1.
      std::vector<float> last((size_t)per);
      kernels::SplitBlocksFn<> one{x.data(), last.data(), outer, D,
                                   Db,       inner,       G - 1};
      for (int64_t i = 0; i < per; ++i)
        one(i);
      EXPECT_EQ(last, std::vector<float>(packed.end() - per, packed.end()));
    }
  }
}

//===--- Collectives on a group of one rank -------------------------------===//

TEST_F(ParallelOpsTest, CollectivesOnOneRankCopy) {
  Tensor *x = random({2, 3, 4});
  auto xv = host(x);
  for (int dim = 0; dim < 3; ++dim) {
    Tensor *a = make({2, 3, 4}), *b = make({2, 3, 4}), *c = make({2, 3, 4});
    all_gather(ctx, x, a, dim, 0);
    reduce_scatter(ctx, x, b, dim, 0);
    shard_slice(ctx, x, c, dim, 0);
    EXPECT_EQ(host(a), xv);
    EXPECT_EQ(host(b), xv);
    EXPECT_EQ(host(c), xv);
  }
  Tensor *d = make({2, 3, 4});
  all_to_all(ctx, x, d, 0, 2, 0);
  EXPECT_EQ(host(d), xv);
  Tensor *m = random({5});
  auto mv = host(m);
  all_reduce_max(ctx, m, 1);
  EXPECT_EQ(host(m), mv);
}

TEST_F(ParallelOpsTest, CollectivesCheckShapes) {
  Tensor *x = random({2, 3, 4});
  EXPECT_DEATH(all_gather(ctx, x, make({2, 6, 4}), 1, 0),
               "planrt: error: all_gather: out \\[2, 6, 4\\] must be \\[2, 3, "
               "4\\]: in \\[2, 3, 4\\] with dimension 1 times the axis size "
               "\\(mesh axis 'dp' of size 1\\)");
  EXPECT_DEATH(reduce_scatter(ctx, x, make({2, 3}), 0, 0),
               "reduce_scatter: out \\[2, 3\\] must be \\[2, 3, 4\\]");
  EXPECT_DEATH(shard_slice(ctx, x, make({2, 3, 4}), 3, 0),
               "shard_slice: dimension 3 out of range for in \\[2, 3, 4\\]");
  EXPECT_DEATH(all_gather(ctx, x, make({2, 3, 4}), 0, 1),
               "all_gather: mesh axis 1 is not declared \\(1 axes\\)");
  EXPECT_DEATH(all_to_all(ctx, x, make({2, 3, 4}), 1, 1, 0),
               "all_to_all: gather_dim and split_dim must differ, both are 1");
  EXPECT_DEATH(all_to_all(ctx, x, make({2, 3, 5}), 0, 2, 0),
               "all_to_all: out \\[2, 3, 5\\] must be \\[2, 3, 4\\]: in \\[2, "
               "3, 4\\] with dimension 0 times and dimension 2 divided");
  // In place is only `in` as this rank's block of `out` along dimension 0
  // (ZeRO's gather of an updated shard view; with one rank, the whole).
  EXPECT_DEATH(all_gather(ctx, x, x, 1, 0), "all_gather: out may not alias in");
  auto before = host(x);
  all_gather(ctx, x, x, 0, 0);
  EXPECT_EQ(host(x), before);
  EXPECT_DEATH(all_reduce_max(ctx, x, 2),
               "all_reduce_max: axis mask 2 names axes that are not declared");
}

//===--- Non-blocking all-reduce slots ------------------------------------===//

TEST_F(ParallelOpsTest, NonBlockingAllReduceSlots) {
  Tensor *a = random({3, 4}), *b = random({7});
  auto av = host(a), bv = host(b);
  all_reduce_sum_start(ctx, a, 1, 0);
  all_reduce_sum_start(ctx, b, 1, 1023);
  collective_wait(ctx, 1023);
  collective_wait(ctx, 0);
  EXPECT_EQ(host(a), av); // a group of one rank: the sum is the tensor
  EXPECT_EQ(host(b), bv);
  all_reduce_sum_start(ctx, a, 1, 0); // the slot is free again
  collective_wait(ctx, 0);

  all_reduce_sum_start(ctx, a, 1, 7);
  EXPECT_DEATH(all_reduce_sum_start(ctx, b, 1, 7),
               "planrt: error: all_reduce_sum_start: slot 7 is busy with "
               "all_reduce_sum_start of a \\[3, 4\\] tensor over axis mask 1");
  EXPECT_DEATH(collective_wait(ctx, 8),
               "planrt: error: collective_wait: slot 8 is idle");
  EXPECT_DEATH(internal::begin_step(ctx, 2),
               "planrt: error: begin_step: all_reduce_sum_start of a \\[3, "
               "4\\] tensor over axis mask 1 on slot 7 was started and not "
               "waited for; call collective_wait\\(ctx, 7\\)");
  collective_wait(ctx, 7);
  EXPECT_DEATH(collective_wait(ctx, 7), "collective_wait: slot 7 is idle");
  EXPECT_DEATH(all_reduce_sum_start(ctx, a, 1, 1024),
               "all_reduce_sum_start: slot 1024 out of range \\[0, 1024\\)");
  EXPECT_DEATH(collective_wait(ctx, -1),
               "collective_wait: slot -1 out of range");
}

void step_without_wait(Context *ctx) {
  all_reduce_sum_start(ctx, alloc(ctx, 1, 4, 1, 1, 1), 1, 12);
}

TEST(NonBlocking, StepEndingWithABusySlotIsFatal) {
  Context *ctx = internal::create_context("slots", false);
  declare_mesh_axis(ctx, "dp", 1);
  internal::start(ctx);
  EXPECT_DEATH(internal::train(ctx, step_without_wait, 2, true),
               "planrt: error: end of step: all_reduce_sum_start of a \\[4\\] "
               "tensor over axis mask 1 on slot 12 was started and not waited "
               "for");
  internal::destroy_context(ctx);
}

//===--- Split cross-entropy ----------------------------------------------===//

TEST_F(ParallelOpsTest, SplitCrossEntropyOnOneRankIsCrossEntropy) {
  const int64_t B = 3, S = 4, V = 11;
  std::vector<int32_t> tv(B * S);
  for (size_t i = 0; i < tv.size(); ++i)
    tv[i] = (int32_t)((i * 5 + 3) % V);
  Tensor *logits = random({B, S, V}, -4.0f, 4.0f), *tgt = ids({B, S}, tv);
  const float scale = 1.0f / (B * S);
  Tensor *loss = make({}), *dl = make({B, S, V});
  cross_entropy(ctx, logits, tgt, loss, scale);
  cross_entropy_grad(ctx, logits, tgt, dl, scale);

  for (int64_t axis : {-1, 0}) { // an axis of size 1 is the whole vocabulary
    Tensor *m = make({B, S}), *st = make({B, S, 2}), *loss2 = make({});
    Tensor *dl2 = make({B, S, V});
    row_max(ctx, logits, m);
    all_reduce_max(ctx, m, 1);
    ce_local_stats(ctx, logits, tgt, m, st, axis);
    all_reduce_sum(ctx, st, 1);
    ce_loss_from_stats(ctx, st, m, loss2, scale);
    ce_grad_from_stats(ctx, logits, tgt, m, st, dl2, scale, axis);
    // The same arithmetic in the same order: bit for bit.
    EXPECT_EQ(host(loss2), host(loss)) << "axis " << axis;
    EXPECT_EQ(host(dl2), host(dl)) << "axis " << axis;
  }
}

TEST_F(ParallelOpsTest, RowMaxAndStatsValues) {
  Tensor *x = make({2, 3});
  internal::from_host(ctx, x, {1.0f, -2.0f, 0.5f, -1.0f, -3.0f, -0.25f});
  Tensor *m = make({2});
  row_max(ctx, x, m);
  EXPECT_EQ(host(m), (std::vector<float>{1.0f, -0.25f}));
  Tensor *st = make({2, 2});
  ce_local_stats(ctx, x, ids({2}, {2, 0}), m, st, -1);
  auto s = host(st);
  EXPECT_FLOAT_EQ(s[0], 1.0f + std::exp(-3.0f) + std::exp(-0.5f));
  EXPECT_EQ(s[1], 0.5f);
  EXPECT_FLOAT_EQ(s[2], std::exp(-0.75f) + std::exp(-2.75f) + 1.0f);
  EXPECT_EQ(s[3], -1.0f);
  Tensor *loss = make({});
  ce_loss_from_stats(ctx, st, m, loss, 0.5f);
  EXPECT_FLOAT_EQ(host(loss)[0], 0.5f * (1.0f + std::log(s[0]) - 0.5f - 0.25f +
                                         std::log(s[2]) + 1.0f));

  EXPECT_DEATH(ce_local_stats(ctx, x, ids({2}, {3, 0}), m, st, -1),
               "planrt: error: ce_local_stats: target 3 out of range \\[0, "
               "3\\)");
  EXPECT_DEATH(
      ce_grad_from_stats(ctx, x, ids({2}, {0, -1}), m, st, make({2, 3}), 1.0f,
                         -1),
      "planrt: error: ce_grad_from_stats: target -1 out of range \\[0, 3\\)");
  EXPECT_DEATH(row_max(ctx, x, make({3})),
               "planrt: error: row_max: out \\[3\\] must have 2 elements");
  EXPECT_DEATH(ce_local_stats(ctx, x, ids({2}, {0, 0}), m, make({2, 3}), -1),
               "ce_local_stats: stats \\[2, 3\\] must have 4 elements as "
               "\\[rows, 2\\]");
  EXPECT_DEATH(ce_local_stats(ctx, x, ids({2}, {0, 0}), m, st, 4),
               "ce_local_stats: mesh axis 4 is not declared");
}

//===--- Vocab-parallel embedding on one rank -----------------------------===//

TEST_F(ParallelOpsTest, EmbeddingWithAnAxisOfOneIsWhole) {
  Tensor *table = random({6, 3}), *id = ids({2, 2}, {5, 0, 2, 5});
  Tensor *a = make({2, 2, 3}), *b = make({2, 2, 3});
  embedding(ctx, id, table, a, -1);
  embedding(ctx, id, table, b, 0);
  EXPECT_EQ(host(a), host(b));
  Tensor *dout = random({2, 2, 3}), *da = make({6, 3}), *db = make({6, 3});
  embedding_grad(ctx, id, dout, da, -1);
  embedding_grad(ctx, id, dout, db, 0);
  EXPECT_EQ(host(da), host(db));
  EXPECT_DEATH(embedding(ctx, ids({1}, {6}), table, make({1, 3}), 0),
               "planrt: error: embedding: token id 6 out of range \\[0, 6\\)");
  EXPECT_DEATH(embedding(ctx, id, table, a, 3),
               "planrt: error: embedding: mesh axis 3 is not declared");
}

//===--- Declared optimizer state -----------------------------------------===//

class StateTest : public test::ContextTest {
protected:
  StateTest() : ContextTest("state", 5) {}
  void declare() override {
    declare_param(ctx, "w", 2, 3, 5, 1, 1, InitNormal, 0.0f, 1.0f);
    declare_param(ctx, "w_copy", 2, 3, 5, 1, 1, InitNormal, 0.0f, 1.0f);
    declare_state(ctx, "w.m", 2, 3, 5, 1, 1);
    declare_state(ctx, "w.v", 2, 3, 5, 1, 1);
    declare_state(ctx, "scalar", 0, 1, 1, 1, 1);
    set_lr_schedule(ctx, LrCosine, 2, 0.001f, 6);
  }
};

TEST_F(StateTest, StateIsZeroUntilAdamWAdvancesIt) {
  for (int i = 0; i < 3; ++i)
    for (float v : internal::to_host(ctx, state(ctx, i)))
      EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(state(ctx, 2)->ndim, 0);
  EXPECT_EQ(state(ctx, 1)->shape[1], 5);
  // (The update's arithmetic is checked against a double reference in
  // kernels_test.cpp.)
  internal::begin_step(ctx, 1);
  adamw_update(ctx, param(ctx, 0), random({3, 5}), state(ctx, 0), state(ctx, 1),
               0.01f, 0.9f, 0.95f, 1e-8f, 0.1f);
  EXPECT_NE(internal::to_host(ctx, state(ctx, 0)),
            std::vector<float>(15, 0.0f));
  EXPECT_DEATH(state(ctx, 3), "planrt: error: state: index 3 out of range "
                              "\\(3 state tensors declared\\)");
  EXPECT_DEATH(adamw_update(ctx, param(ctx, 1), make({3, 5}), state(ctx, 0),
                            state(ctx, 2), 0.01f, 0.9f, 0.95f, 1e-8f, 0.0f),
               "adamw_update: w \\[3, 5\\] and v \\[\\] have different "
               "shapes");
  EXPECT_DEATH(declare_state(ctx, "late", 1, 2, 1, 1, 1),
               "declare_state: called after the program started");
}

TEST(DeclareState, RejectsBadDeclarations) {
  Context *ctx = internal::create_context("state", false);
  declare_state(ctx, "m", 1, 4, 1, 1, 1);
  EXPECT_DEATH(declare_state(ctx, "m", 1, 4, 1, 1, 1),
               "declare_state: state 'm' declared twice");
  EXPECT_DEATH(declare_state(ctx, "x", 2, 4, 0, 1, 1),
               "declare_state 'x': dimension 1 must be >= 1, got 0");
  EXPECT_DEATH(expect_bytes(ctx, -1, 0, 0),
               "expect_bytes: byte counts must be >= 0");
  internal::destroy_context(ctx);
}

// plan_setup's tables: each row is one declare_param / declare_state, in
// order, with their checks.
class TableTest : public test::ContextTest {
protected:
  TableTest() : ContextTest("tables", 5) {}
  void declare() override {
    const ParamDecl params[] = {{"w", 2, 3, 5, 1, 1, InitNormal, 0.0f, 0.02f},
                                {"b", 1, 5, 1, 1, 1, InitOnes, 0.0f, 0.0f}};
    declare_params(ctx, params, 2);
    const StateDecl states[] = {{"w.m", 2, 3, 5, 1, 1}, {"b.m", 1, 5, 1, 1, 1}};
    declare_states(ctx, states, 2);
  }
};

TEST_F(TableTest, RowsDeclareLikeTheirCalls) {
  EXPECT_EQ(param(ctx, 0)->shape[1], 5);
  EXPECT_EQ(param(ctx, 1)->ndim, 1);
  EXPECT_EQ(internal::to_host(ctx, param(ctx, 1)), std::vector<float>(5, 1.0f));
  std::vector<float> w = internal::to_host(ctx, param(ctx, 0));
  EXPECT_NE(w, std::vector<float>(15, 0.0f)) << "normal init";
  for (float x : w)
    EXPECT_LT(std::fabs(x), 0.2f) << "std 0.02";
  EXPECT_EQ(state(ctx, 0)->shape[0], 3);
  EXPECT_EQ(internal::to_host(ctx, state(ctx, 1)), std::vector<float>(5, 0.0f));
}

TEST(DeclareTables, RefuseDuplicatesAndBadTables) {
  Context *ctx = internal::create_context("tables", false);
  const ParamDecl params[] = {{"b", 1, 5, 1, 1, 1, InitZeros, 0.0f, 0.0f}};
  declare_params(ctx, params, 1);
  const StateDecl states[] = {{"b.m", 1, 5, 1, 1, 1}};
  declare_states(ctx, states, 1);
  EXPECT_DEATH(declare_param(ctx, "b", 1, 5, 1, 1, 1, InitZeros, 0, 0),
               "declare_param: parameter 'b' declared twice");
  EXPECT_DEATH(declare_states(ctx, states, 1),
               "declare_state: state 'b.m' declared twice");
  EXPECT_DEATH(declare_params(ctx, nullptr, 3),
               "declare_params: invalid table \\(3 rows\\)");
  internal::destroy_context(ctx);
}

//===--- Sharded and segmented parameters ---------------------------------===//

TEST(ParamSegments, OneBlockSegmentsKeepTheWholeInit) {
  Context *whole = internal::create_context("seg", false);
  declare_param(whole, "qkv", 2, 3, 10, 1, 1, InitUniform, -1.0f, 1.0f);
  internal::start(whole);
  Context *seg = internal::create_context("seg", false);
  declare_mesh_axis(seg, "tp", 1);
  declare_param(seg, "qkv", 2, 3, 10, 1, 1, InitUniform, -1.0f, 1.0f);
  shard_param(seg, 0, 1, 0);
  set_param_segments(seg, 0, 1, 6, 2, 2);
  internal::start(seg);
  EXPECT_EQ(internal::to_host(seg, param(seg, 0)),
            internal::to_host(whole, param(whole, 0)));
  internal::destroy_context(seg);
  internal::destroy_context(whole);
}

void start_with(int64_t tp, int64_t local, int64_t s0, int64_t s1, int64_t s2) {
  Context *ctx = internal::create_context("seg", false);
  declare_mesh_axis(ctx, "dp", 1);
  declare_mesh_axis(ctx, "tp", tp);
  declare_param(ctx, "qkv", 2, 3, local, 1, 1, InitZeros, 0.0f, 0.0f);
  shard_param(ctx, 0, 1, 1);
  set_param_segments(ctx, 0, 1, s0, s1, s2);
  internal::start(ctx);
}

TEST(ParamSegments, RejectsBadSegments) {
  // The description is checked before the world size, so a 2-way split can
  // be checked on one rank.
  EXPECT_DEATH(start_with(2, 5, 6, 3, 1),
               "planrt: error: parameter 'qkv': segment 1 of dimension 1 has "
               "size 3, which does not split evenly over the 2 blocks");
  EXPECT_DEATH(start_with(2, 5, 6, 2, 4),
               "planrt: error: parameter 'qkv': the segments of dimension 1 "
               "sum to 12 but the global dimension is 10 \\(local 5 x 2 "
               "blocks\\)");
  EXPECT_DEATH(start_with(1, 5, 2, 0, 3),
               "set_param_segments 'qkv': segment 1 is 0, which ends the "
               "list, but segment 2 is 3");
  EXPECT_DEATH(start_with(1, 5, 0, 0, 0),
               "set_param_segments 'qkv': at least one segment size must be "
               "> 0");
  EXPECT_DEATH(start_with(1, 5, -5, 0, 0),
               "set_param_segments 'qkv': segment 0 has negative size -5");
  Context *ctx = internal::create_context("seg", false);
  declare_mesh_axis(ctx, "tp", 2);
  declare_param(ctx, "w", 2, 4, 4, 1, 1, InitZeros, 0.0f, 0.0f);
  shard_param(ctx, 0, 0, 0);
  EXPECT_DEATH(shard_param(ctx, 0, 0, 0),
               "shard_param 'w': axis 0 already splits dimension 0");
  EXPECT_DEATH(shard_param(ctx, 0, 1, 0),
               "shard_param 'w': axis 0 already splits dimension 0");
  set_param_segments(ctx, 0, 1, 2, 2, 0);
  EXPECT_DEATH(set_param_segments(ctx, 0, 1, 4, 0, 0),
               "set_param_segments 'w': the segments of dimension 1 are "
               "already set");
  EXPECT_DEATH(set_param_segments(ctx, 0, 2, 4, 0, 0),
               "set_param_segments 'w': dimension 2 out of range for rank 2");
  EXPECT_DEATH(set_param_segments(ctx, 1, 0, 4, 0, 0),
               "set_param_segments: parameter index 1 out of range");
  internal::destroy_context(ctx);
}

} // namespace
