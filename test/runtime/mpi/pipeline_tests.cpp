// Tests run with `mpirun -np 4` on a 2 x 2 mesh, axes pp (axis 0, outer, the
// pipeline) and dp (axis 1): world rank r has pp = r / 2, dp = r % 2.
// Point to point both ways at once (async sends: no deadlock, even for a
// message MPI sends with its rendezvous protocol), order, self messages,
// stage ownership, stage-owned parameters (init against one rank, nullptr
// elsewhere, --save against one rank), units and the in-flight peaks.
#include "mpi_main.h"
#include "planrt/internal.h"
#include "planrt/planrt.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

using namespace planrt;

namespace {

constexpr int64_t kPp = 0, kDp = 1; // axis indices

int world_rank() { return planrt_test::worldRank(); }
int64_t coord(int64_t axis) {
  return axis == kPp ? world_rank() / 2 : world_rank() % 2;
}

/// A started 2 x 2 context with a pipeline of `stages` stages, in step 1.
Context *mesh(int64_t stages) {
  Context *ctx = internal::create_context("pipeline", /*use_mpi=*/true);
  declare_mesh_axis(ctx, "pp", 2);
  declare_mesh_axis(ctx, "dp", 2);
  declare_pipeline(ctx, kPp, stages);
  internal::start(ctx);
  internal::begin_step(ctx, 1);
  return ctx;
}

Tensor *vec(Context *ctx, const std::vector<float> &v) {
  Tensor *t = alloc(ctx, 1, (int64_t)v.size(), 1, 1, 1);
  internal::from_host(ctx, t, v);
  return t;
}

/// Message k from world rank `from`: n distinct values.
std::vector<float> message(int from, int k, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = (float)(from * 1000 + k * 100) + (float)(i % 97);
  return v;
}

TEST(Pipeline, CoordinatesAndOwnership) {
  Context *ctx = mesh(4);
  EXPECT_EQ(mesh_coord(ctx, kPp), coord(kPp));
  EXPECT_EQ(mesh_coord(ctx, kDp), coord(kDp));
  for (int64_t s = 0; s < 4; ++s)
    EXPECT_EQ(owns_stage(ctx, s), s % 2 == coord(kPp) ? 1 : 0) << "stage " << s;
  EXPECT_EQ(owns_stage(ctx, -1), 1);
  internal::destroy_context(ctx);
}

TEST(PointToPoint, BothDirectionsAtOnceInOrder) {
  Context *ctx = mesh(2);
  // Sizes: small, 4 MiB (MPI's rendezvous protocol: a blocking send would
  // wait for the peer, which is sending too), and one I32 message.
  const std::vector<size_t> sizes = {5, size_t(1) << 20, 3};
  for (int64_t axis : {kPp, kDp}) {
    int64_t peer = 1 - coord(axis);
    int peer_rank = axis == kPp ? (int)(peer * 2 + coord(kDp))
                                : (int)(coord(kPp) * 2 + peer);
    for (int k = 0; k < 3; ++k) {
      Tensor *t = vec(ctx, message(world_rank(), k, sizes[k]));
      if (k == 2) {
        t->dtype = I32;
        internal::from_host_ids(ctx, t, {world_rank(), -7, 1 << 30});
      }
      send(ctx, t, axis, peer);
      fill(ctx, t, -1.0f); // the send copied it
    }
    for (int k = 0; k < 3; ++k) {
      Tensor *out = alloc(ctx, 1, (int64_t)sizes[k], 1, 1, 1);
      if (k == 2) {
        out->dtype = I32;
        recv(ctx, out, axis, peer);
        EXPECT_EQ(internal::to_host_ids(ctx, out),
                  (std::vector<int32_t>{peer_rank, -7, 1 << 30}));
      } else {
        recv(ctx, out, axis, peer);
        EXPECT_EQ(internal::to_host(ctx, out), message(peer_rank, k, sizes[k]))
            << "axis " << axis << " message " << k;
      }
    }
  }
  internal::end_step(ctx);
  internal::destroy_context(ctx);
}

TEST(PointToPoint, MessagesToItselfAndBetweenStages) {
  Context *ctx = mesh(2);
  // To itself: a local queue, in order.
  send(ctx, vec(ctx, {1, 2}), kPp, coord(kPp));
  send(ctx, vec(ctx, {3, 4, 5}), kPp, coord(kPp));
  Tensor *a = alloc(ctx, 1, 2, 1, 1, 1), *b = alloc(ctx, 1, 3, 1, 1, 1);
  recv(ctx, a, kPp, coord(kPp));
  recv(ctx, b, kPp, coord(kPp));
  EXPECT_EQ(internal::to_host(ctx, a), (std::vector<float>{1, 2}));
  EXPECT_EQ(internal::to_host(ctx, b), (std::vector<float>{3, 4, 5}));
  // Stage 0 -> stage 1, then back: four messages each way, in order.
  for (int k = 0; k < 4; ++k)
    if (coord(kPp) == 0)
      send(ctx, vec(ctx, message(world_rank(), k, 10)), kPp, 1);
  for (int k = 0; k < 4; ++k) {
    if (coord(kPp) == 1) {
      Tensor *out = alloc(ctx, 2, 2, 5, 1, 1);
      recv(ctx, out, kPp, 0);
      EXPECT_EQ(internal::to_host(ctx, out), message(world_rank() - 2, k, 10));
      send(ctx, out, kPp, 0);
    }
  }
  for (int k = 0; k < 4; ++k)
    if (coord(kPp) == 0) {
      Tensor *out = alloc(ctx, 1, 10, 1, 1, 1);
      recv(ctx, out, kPp, 1);
      EXPECT_EQ(internal::to_host(ctx, out), message(world_rank(), k, 10));
    }
  internal::end_step(ctx);
  internal::destroy_context(ctx);
}

//===--- Stage-owned parameters ------------------------------------------===//

/// Parameters: a (stage 0), b (stage 1, columns split over dp), c (every
/// rank), d (stage 3); state s0 (stage 0), s1 (every rank). With `pipelined`
/// false: one rank without MPI and without a mesh split (the whole tensors).
Context *params_context(bool pipelined) {
  Context *ctx = internal::create_context("params", pipelined);
  declare_mesh_axis(ctx, "pp", pipelined ? 2 : 1);
  declare_mesh_axis(ctx, "dp", pipelined ? 2 : 1);
  declare_pipeline(ctx, kPp, 4);
  set_training(ctx, 1, 5, 0, 0);
  declare_param(ctx, "a", 2, 3, 4, 1, 1, InitNormal, 0.0f, 1.0f);
  set_param_stage(ctx, 0, 0);
  declare_param(ctx, "b", 2, 3, pipelined ? 4 : 8, 1, 1, InitUniform, -1.0f,
                1.0f);
  shard_param(ctx, 1, 1, kDp);
  set_param_stage(ctx, 1, 1);
  declare_param(ctx, "c", 1, 6, 1, 1, 1, InitNormal, 1.0f, 0.5f);
  declare_param(ctx, "d", 1, 5, 1, 1, 1, InitUniform, 0.0f, 2.0f);
  set_param_stage(ctx, 3, 3);
  declare_state(ctx, "s0", 1, 4, 1, 1, 1);
  set_state_stage(ctx, 0, 0);
  declare_state(ctx, "s1", 1, 4, 1, 1, 1);
  internal::start(ctx);
  internal::begin_step(ctx, 1);
  return ctx;
}

TEST(StageParams, UnownedAreNullOwnedAreTheWholeInit) {
  Context *whole = params_context(false);
  Context *ctx = params_context(true);
  bool pp0 = coord(kPp) == 0;
  EXPECT_EQ(param(ctx, 0) != nullptr, pp0);
  EXPECT_EQ(param(ctx, 1) != nullptr, !pp0);
  EXPECT_NE(param(ctx, 2), nullptr);
  EXPECT_EQ(param(ctx, 3) != nullptr, !pp0); // stage 3 is on coordinate 1
  EXPECT_EQ(state(ctx, 0) != nullptr, pp0);
  EXPECT_NE(state(ctx, 1), nullptr);
  for (int p : {0, 2, 3}) {
    if (param(ctx, p)) {
      EXPECT_EQ(internal::to_host(ctx, param(ctx, p)),
                internal::to_host(whole, param(whole, p)))
          << "param " << p;
    }
  }
  if (Tensor *b = param(ctx, 1)) { // columns [4 dp, 4 dp + 4) of 8
    auto w = internal::to_host(whole, param(whole, 1));
    auto t = internal::to_host(ctx, b);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j)
        EXPECT_EQ(t[i * 4 + j], w[i * 8 + coord(kDp) * 4 + j]);
  }
  internal::destroy_context(ctx);
  internal::destroy_context(whole);
}

std::string read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

TEST(StageParams, SaveWritesTheWholeTensorsOfOneRank) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "/tmp/planrt_pipeline_save_%d", getpid());
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::string base = buf;
  Context *ctx = params_context(true);
  // Replicas along dp of a, c and d must not be read: make them differ.
  if (coord(kDp) == 1)
    for (int p : {0, 2, 3})
      if (param(ctx, p))
        fill(ctx, param(ctx, p), 1234.0f);
  internal::save_safetensors(ctx, base + "-4.safetensors");
  internal::destroy_context(ctx);
  if (world_rank() == 0) {
    Context *whole = params_context(false);
    internal::save_safetensors(whole, base + "-1.safetensors");
    internal::destroy_context(whole);
    std::string four = read_file(base + "-4.safetensors");
    std::string one = read_file(base + "-1.safetensors");
    std::remove((base + "-4.safetensors").c_str());
    std::remove((base + "-1.safetensors").c_str());
    EXPECT_GT(one.size(), 4u * (12 + 24 + 6 + 5));
    EXPECT_TRUE(four == one) << "the 4-rank file differs from the 1-rank one";
    EXPECT_NE(one.find("\"d\":{\"dtype\":\"F32\",\"shape\":[5]"),
              std::string::npos);
  }
}

//===--- Units ------------------------------------------------------------===//

TEST(Units, InFlightPeaksOf1F1B) {
  // 2 stages, 4 microbatches, 1F1B: stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3
  // (peak 2), stage 1 F B F B ... (peak 1). Units carry real messages.
  Context *ctx = mesh(2);
  int64_t stage = coord(kPp);
  std::vector<std::pair<int64_t, int64_t>> order; // (phase, mb)
  if (stage == 0)
    order = {{0, 0}, {0, 1}, {1, 0}, {0, 2}, {1, 1}, {0, 3}, {1, 2}, {1, 3}};
  else
    for (int64_t mb = 0; mb < 4; ++mb)
      order.insert(order.end(), {{0, mb}, {1, mb}});
  for (auto &e : order) {
    int64_t phase = e.first, mb = e.second;
    unit_begin(ctx, stage, phase, mb, phase);
    Tensor *t = alloc(ctx, 1, 4, 1, 1, 1);
    if (stage == 0 && phase == 0) {
      fill(ctx, t, (float)mb);
      send(ctx, t, kPp, 1);
    } else if (stage == 0) {
      recv(ctx, t, kPp, 1);
      EXPECT_EQ(internal::to_host(ctx, t)[0], 10.0f + (float)mb);
    } else if (phase == 0) {
      recv(ctx, t, kPp, 0);
      EXPECT_EQ(internal::to_host(ctx, t)[0], (float)mb);
    } else {
      fill(ctx, t, 10.0f + (float)mb);
      send(ctx, t, kPp, 0);
    }
    unit_end(ctx);
  }
  internal::end_step(ctx);
  std::vector<int64_t> want =
      stage == 0 ? std::vector<int64_t>{2, 0} : std::vector<int64_t>{0, 1};
  EXPECT_EQ(internal::pipeline_peaks(ctx), want);
  internal::destroy_context(ctx);
}

} // namespace

int main(int argc, char **argv) {
  return planrt_test::runMpiTests(argc, argv, 4, "planrt_pipeline_tests");
}
