// Tests run with `mpirun -np 4` on a 2 x 2 mesh, axes dp (axis 0, outer) and
// tp (axis 1): world rank r has dp = r / 2, tp = r % 2. Collectives over
// each axis on every dim of 3-D tensors, the non-blocking all-reduce,
// sharded and segmented parameters (init and --save against one rank), and
// vocab-parallel embedding and cross-entropy against the whole ops; the
// host backend's ring collectives on groups of 2, 3 and 4 ranks; expert
// parallelism's routed gather and reduce-scatter on one axis of 4.
#include "host/ring.h"
#include "mpi_main.h"
#include "planrt/internal.h"
#include "planrt/planrt.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

using namespace planrt;

namespace {

constexpr int64_t kDp = 0, kTp = 1; // axis indices

int world_rank() { return planrt_test::worldRank(); }
int64_t coord(int64_t axis) {
  return axis == kDp ? world_rank() / 2 : world_rank() % 2;
}
int64_t other_coord(int64_t axis) { return coord(1 - axis); }

/// A started 2 x 2 context in step 1.
Context *mesh() {
  Context *ctx = internal::create_context("mesh", /*use_mpi=*/true);
  declare_mesh_axis(ctx, "dp", 2);
  declare_mesh_axis(ctx, "tp", 2);
  internal::start(ctx);
  internal::begin_step(ctx, 1);
  return ctx;
}

using Shape = std::vector<int64_t>;

Tensor *make(Context *ctx, const Shape &s) {
  int64_t d[4] = {1, 1, 1, 1};
  for (size_t i = 0; i < s.size(); ++i)
    d[i] = s[i];
  return alloc(ctx, (int64_t)s.size(), d[0], d[1], d[2], d[3]);
}

Tensor *tensor(Context *ctx, const Shape &s, const std::vector<float> &v) {
  Tensor *t = make(ctx, s);
  internal::from_host(ctx, t, v);
  return t;
}

/// Block k of the G blocks of a row-major 3-D tensor along `dim`.
template <class E>
std::vector<E> block(const std::vector<E> &x, const Shape &s, int dim,
                     int64_t G, int64_t k) {
  Shape b = s;
  b[dim] /= G;
  std::vector<E> out;
  for (int64_t i = 0; i < b[0]; ++i)
    for (int64_t j = 0; j < b[1]; ++j)
      for (int64_t l = 0; l < b[2]; ++l) {
        int64_t idx[3] = {i, j, l};
        idx[dim] += k * b[dim];
        out.push_back(x[(idx[0] * s[1] + idx[1]) * s[2] + idx[2]]);
      }
  return out;
}

Shape block_shape(Shape s, int dim, int64_t G) {
  s[dim] /= G;
  return s;
}

const Shape kShape = {4, 6, 8};

/// The global tensor of this rank's group over `axis`: distinct integers,
/// different for the two groups of the axis (exact in f32).
std::vector<float> group_tensor(int64_t axis) {
  std::vector<float> x(4 * 6 * 8);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = (float)(i + 1) + 1000.0f * (float)other_coord(axis);
  return x;
}

TEST(Collectives, AllGatherEveryDimOverEachAxis) {
  Context *ctx = mesh();
  for (int64_t axis : {kDp, kTp})
    for (int dim = 0; dim < 3; ++dim) {
      auto x = group_tensor(axis);
      Tensor *in = tensor(ctx, block_shape(kShape, dim, 2),
                          block(x, kShape, dim, 2, coord(axis)));
      Tensor *out = make(ctx, kShape);
      all_gather(ctx, in, out, dim, axis);
      EXPECT_EQ(internal::to_host(ctx, out), x)
          << "axis " << axis << " dim " << dim;
    }
  internal::destroy_context(ctx);
}

TEST(Collectives, ReduceScatterEveryDimOverEachAxis) {
  Context *ctx = mesh();
  for (int64_t axis : {kDp, kTp})
    for (int dim = 0; dim < 3; ++dim) {
      auto x = group_tensor(axis);
      // Member g contributes (g + 1) x: the sum is 3 x.
      std::vector<float> mine(x), sum(x);
      for (size_t i = 0; i < x.size(); ++i) {
        mine[i] = x[i] * (float)(coord(axis) + 1);
        sum[i] = 3.0f * x[i];
      }
      Tensor *in = tensor(ctx, kShape, mine);
      Tensor *out = make(ctx, block_shape(kShape, dim, 2));
      reduce_scatter(ctx, in, out, dim, axis);
      EXPECT_EQ(internal::to_host(ctx, out),
                block(sum, kShape, dim, 2, coord(axis)))
          << "axis " << axis << " dim " << dim;
    }
  internal::destroy_context(ctx);
}

TEST(Collectives, ShardSliceEveryDimOverEachAxis) {
  Context *ctx = mesh();
  for (int64_t axis : {kDp, kTp})
    for (int dim = 0; dim < 3; ++dim) {
      auto x = group_tensor(axis);
      Tensor *in = tensor(ctx, kShape, x);
      Tensor *out = make(ctx, block_shape(kShape, dim, 2));
      shard_slice(ctx, in, out, dim, axis);
      EXPECT_EQ(internal::to_host(ctx, out),
                block(x, kShape, dim, 2, coord(axis)))
          << "axis " << axis << " dim " << dim;
    }
  internal::destroy_context(ctx);
}

TEST(Collectives, AllToAllBothDirectionsOverEachAxis) {
  Context *ctx = mesh();
  for (int64_t axis : {kDp, kTp})
    for (int gd = 0; gd < 3; ++gd)
      for (int sd = 0; sd < 3; ++sd) {
        if (gd == sd)
          continue;
        auto x = group_tensor(axis);
        int64_t g = coord(axis);
        Tensor *in =
            tensor(ctx, block_shape(kShape, gd, 2), block(x, kShape, gd, 2, g));
        Tensor *out = make(ctx, block_shape(kShape, sd, 2));
        all_to_all(ctx, in, out, gd, sd, axis);
        EXPECT_EQ(internal::to_host(ctx, out), block(x, kShape, sd, 2, g))
            << "axis " << axis << " gather " << gd << " split " << sd;
        // And back: the original block.
        Tensor *back = make(ctx, block_shape(kShape, gd, 2));
        all_to_all(ctx, out, back, sd, gd, axis);
        EXPECT_EQ(internal::to_host(ctx, back), block(x, kShape, gd, 2, g));
      }
  internal::destroy_context(ctx);
}

/// A 16-bit tensor holding exactly `bits` (host memory: the host backend).
Tensor *tensor16(Context *ctx, const Shape &s, int dtype,
                 const std::vector<uint16_t> &bits) {
  int64_t d[4] = {1, 1, 1, 1};
  for (size_t i = 0; i < s.size(); ++i)
    d[i] = s[i];
  Tensor *t = alloc(ctx, (int64_t)s.size(), d[0], d[1], d[2], d[3], dtype);
  std::memcpy(t->data, bits.data(), bits.size() * 2);
  return t;
}
std::vector<uint16_t> bits16(const Tensor *t) {
  std::vector<uint16_t> v((size_t)t->numel());
  std::memcpy(v.data(), t->data, v.size() * 2);
  return v;
}

TEST(Collectives, SixteenBitValuesMoveAsTheyAre) {
  // bf16 and f16 tensors are gathered, sliced and exchanged as 2-byte
  // values (half of fp32's traffic), every bit pattern unchanged: signaling
  // NaNs included, which a trip through fp32 would make quiet.
  Context *ctx = mesh();
  for (int dtype : {BF16, F16}) {
    for (int64_t axis : {kDp, kTp})
      for (int dim = 0; dim < 3; ++dim) {
        // Every bit pattern the group's tensor holds, one per group.
        std::vector<uint16_t> x(4 * 6 * 8);
        for (size_t i = 0; i < x.size(); ++i)
          x[i] = uint16_t(i * 40503u + 7919u * (unsigned)other_coord(axis));
        x[5] = dtype == BF16 ? 0x7f81 : 0x7c01; // signaling NaN
        x[77] = dtype == BF16 ? 0xff82 : 0xfc02;
        SCOPED_TRACE("dtype " + std::to_string(dtype) + " axis " +
                     std::to_string(axis) + " dim " + std::to_string(dim));
        int64_t g = coord(axis);
        Tensor *part = tensor16(ctx, block_shape(kShape, dim, 2), dtype,
                                block(x, kShape, dim, 2, g));
        Tensor *whole =
            tensor16(ctx, kShape, dtype, std::vector<uint16_t>(x.size(), 0));
        all_gather(ctx, part, whole, dim, axis);
        EXPECT_EQ(bits16(whole), x);
        Tensor *slice = tensor16(ctx, block_shape(kShape, dim, 2), dtype,
                                 std::vector<uint16_t>(x.size() / 2, 0));
        shard_slice(ctx, whole, slice, dim, axis);
        EXPECT_EQ(bits16(slice), block(x, kShape, dim, 2, g));
        int sd = (dim + 1) % 3;
        Tensor *moved = tensor16(ctx, block_shape(kShape, sd, 2), dtype,
                                 std::vector<uint16_t>(x.size() / 2, 0));
        all_to_all(ctx, part, moved, dim, sd, axis);
        EXPECT_EQ(bits16(moved), block(x, kShape, sd, 2, g));
      }
  }
  internal::destroy_context(ctx);
}

float max_value(int64_t rank, size_t i) {
  return (float)((int64_t)(i * 7 + rank * 13) % 17) - 8.0f;
}

TEST(Collectives, AllReduceMaxFollowsTheMask) {
  Context *ctx = mesh();
  const size_t n = 40;
  for (int64_t mask : {0, 1, 2, 3}) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i)
      v[i] = max_value(world_rank(), i);
    Tensor *t = tensor(ctx, {5, 8}, v);
    all_reduce_max(ctx, t, mask);
    // Members: the ranks that agree with this one on the unmasked axes.
    std::vector<float> want(n, -1e30f);
    for (int r = 0; r < 4; ++r) {
      bool member = ((mask & 1) || r / 2 == coord(kDp)) &&
                    ((mask & 2) || r % 2 == coord(kTp));
      for (size_t i = 0; member && i < n; ++i)
        want[i] = std::max(want[i], max_value(r, i));
    }
    EXPECT_EQ(internal::to_host(ctx, t), want) << "mask " << mask;
  }
  internal::destroy_context(ctx);
}

TEST(NonBlocking, AllReducesOverlapALocalKernel) {
  Context *ctx = mesh();
  for (int64_t step = 1; step <= 3; ++step) {
    internal::begin_step(ctx, step);
    // In step 2 rank 0 starts its sums kLate late: on the other ranks the
    // starts and the local kernel must return before it arrives (a blocking
    // start would wait for it), and only the waits may wait for it. Not in
    // step 1: a group's communicator is split at its first collective, which
    // waits for every rank. The margins are wide for 4 ranks on 2 cores.
    const double kLate = 0.5;
    MPI_Barrier(MPI_COMM_WORLD);
    if (step == 2 && world_rank() == 0)
      usleep((useconds_t)(kLate * 1e6));
    const double t0 = MPI_Wtime();
    const int64_t na = 64 * 33, nb = 1000;
    std::vector<float> a(na), b(nb);
    for (int64_t i = 0; i < na; ++i)
      a[i] = (float)(i % 100) * (float)(world_rank() + 1) + (float)step;
    for (int64_t i = 0; i < nb; ++i)
      b[i] = (float)(world_rank() * 10 + i % 7);
    Tensor *ta = tensor(ctx, {64, 33}, a), *tb = tensor(ctx, {nb}, b);
    all_reduce_sum_start(ctx, ta, 2, 5); // over tp
    all_reduce_sum_start(ctx, tb, 3, 9); // over the whole mesh
    // Local work while the sums are in flight.
    std::vector<float> xv(16 * 8), wv(8 * 4);
    for (size_t i = 0; i < xv.size(); ++i)
      xv[i] = (float)(i % 5) - 2.0f;
    for (size_t i = 0; i < wv.size(); ++i)
      wv[i] = (float)(i % 3);
    Tensor *x = tensor(ctx, {16, 8}, xv), *w = tensor(ctx, {8, 4}, wv);
    Tensor *y = make(ctx, {16, 4});
    matmul(ctx, x, w, y, false, false);
    const double t1 = MPI_Wtime();
    collective_wait(ctx, 9);
    collective_wait(ctx, 5);
    const double t2 = MPI_Wtime();
    if (step == 2 && world_rank() != 0) {
      EXPECT_LT(t1 - t0, kLate / 2) << "the starts or the kernel waited";
      EXPECT_GT(t2 - t0, kLate / 2) << "the waits did not wait for rank 0";
    }

    auto ga = internal::to_host(ctx, ta), gb = internal::to_host(ctx, tb);
    // tp partner of rank r: r ^ 1; ranks r and r ^ 1 have factors r + 1 and
    // (r ^ 1) + 1.
    float fa = (float)(world_rank() + 1 + (world_rank() ^ 1) + 1);
    for (int64_t i = 0; i < na; ++i)
      ASSERT_EQ(ga[i], (float)(i % 100) * fa + 2.0f * (float)step) << i;
    for (int64_t i = 0; i < nb; ++i)
      ASSERT_EQ(gb[i], (float)(60 + 4 * (i % 7))) << i;
    auto gy = internal::to_host(ctx, y);
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 4; ++c) {
        float want = 0;
        for (int k = 0; k < 8; ++k)
          want += xv[r * 8 + k] * wv[k * 4 + c];
        ASSERT_EQ(gy[r * 4 + c], want);
      }
  }
  internal::destroy_context(ctx);
}

//===--- Sharded and segmented parameters ---------------------------------===//

/// Parameters with global shapes; `sharded` declares this rank's shards of
/// them on the 2 x 2 mesh, otherwise the whole tensors on one rank.
void declare_params(Context *ctx, bool sharded) {
  auto d = [&](int64_t whole, int64_t blocks) {
    return sharded ? whole / blocks : whole;
  };
  // A packed [q | k | v] weight: segments 16, 8, 8 split over tp.
  declare_param(ctx, "wqkv", 2, 3, d(32, 2), 1, 1, InitNormal, 0.0f, 1.0f);
  // Rows split over dp, then tp (block dp * 2 + tp).
  declare_param(ctx, "w_in", 2, d(8, 4), 5, 1, 1, InitUniform, -1.0f, 1.0f);
  // Rows split over tp, then dp (block tp * 2 + dp).
  declare_param(ctx, "w_in2", 2, d(8, 4), 5, 1, 1, InitNormal, 1.0f, 2.0f);
  // Rows over tp, columns over dp.
  declare_param(ctx, "emb", 2, d(16, 2), d(6, 2), 1, 1, InitNormal, 0.0f, 1.0f);
  declare_param(ctx, "b", 1, 5, 1, 1, 1, InitUniform, 0.0f, 1.0f);
  // Last dim over dp then tp, segments 4 and 12.
  declare_param(ctx, "w3", 3, 3, 2, d(16, 4), 1, InitNormal, 0.0f, 1.0f);
  if (!sharded)
    return;
  shard_param(ctx, 0, 1, kTp);
  set_param_segments(ctx, 0, 1, 16, 8, 8);
  shard_param(ctx, 1, 0, kDp);
  shard_param(ctx, 1, 0, kTp);
  shard_param(ctx, 2, 0, kTp);
  shard_param(ctx, 2, 0, kDp);
  shard_param(ctx, 3, 0, kTp);
  shard_param(ctx, 3, 1, kDp);
  shard_param(ctx, 5, 2, kDp);
  shard_param(ctx, 5, 2, kTp);
  set_param_segments(ctx, 5, 2, 4, 12, 0);
}

Context *params_context(bool sharded) {
  Context *ctx = internal::create_context("params", /*use_mpi=*/sharded);
  if (sharded) {
    declare_mesh_axis(ctx, "dp", 2);
    declare_mesh_axis(ctx, "tp", 2);
  }
  declare_params(ctx, sharded);
  set_training(ctx, 1, 11, 0, 0);
  internal::start(ctx);
  return ctx;
}

/// Global index along each dim of local element (i, j, l) of parameter p,
/// written out per parameter from the layout rules.
std::vector<int64_t> global_of(int p, int64_t i, int64_t j, int64_t l) {
  int64_t dp = coord(kDp), tp = coord(kTp);
  switch (p) {
  case 0: // segments of 16, 8, 8 split in 2: 8 + 4 + 4 local columns
    return {i,
            j < 8 ? tp * 8 + j
                  : (j < 12 ? 16 + tp * 4 + (j - 8) : 24 + tp * 4 + (j - 12)),
            0};
  case 1:
    return {(dp * 2 + tp) * 2 + i, j, 0};
  case 2:
    return {(tp * 2 + dp) * 2 + i, j, 0};
  case 3:
    return {tp * 8 + i, dp * 3 + j, 0};
  case 4:
    return {i, 0, 0};
  default: { // segments of 4 and 12 split in 4 blocks q: 1 + 3 local
    int64_t q = dp * 2 + tp;
    return {i, j, l == 0 ? q : 4 + q * 3 + (l - 1)};
  }
  }
}

TEST(ShardedParams, InitOfShardsIsTheWholeInit) {
  Context *whole = params_context(false);
  Context *ctx = params_context(true);
  for (int p = 0; p < 6; ++p) {
    Tensor *w = param(whole, p), *t = param(ctx, p);
    auto wv = internal::to_host(whole, w), tv = internal::to_host(ctx, t);
    int64_t W1 = w->shape[1], W2 = w->shape[2];
    for (int64_t i = 0; i < t->shape[0]; ++i)
      for (int64_t j = 0; j < t->shape[1]; ++j)
        for (int64_t l = 0; l < t->shape[2]; ++l) {
          auto g = global_of(p, i, j, l);
          ASSERT_EQ(tv[(i * t->shape[1] + j) * t->shape[2] + l],
                    wv[(g[0] * W1 + g[1]) * W2 + g[2]])
              << "param " << p << " local (" << i << ", " << j << ", " << l
              << ")";
        }
  }
  internal::destroy_context(ctx);
  internal::destroy_context(whole);
}

std::string read_file(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

TEST(ShardedParams, SaveWritesTheWholeTensorsOfOneRank) {
  std::string base = "/tmp/planrt_mesh_save_" + std::to_string(getpid());
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s", base.c_str());
  MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
  base = buf;
  Context *ctx = params_context(true);
  // Replicas along dp of wqkv and b (dp = 1) must not be read: make them
  // differ.
  if (coord(kDp) == 1)
    for (int p : {0, 4})
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
    EXPECT_GT(one.size(), 8u + 4u * (96 + 40 + 40 + 96 + 5 + 96));
    EXPECT_TRUE(four == one) << "the 4-rank file differs from the 1-rank one";
    EXPECT_NE(one.find("\"w3\":{\"dtype\":\"F32\",\"shape\":[3,2,16]"),
              std::string::npos);
  }
}

//===--- Vocab-parallel embedding and cross-entropy -----------------------===//

std::vector<float> uniform(size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 rng(seed); // the same values on every rank
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto &e : v)
    e = dist(rng);
  return v;
}

Tensor *id_tensor(Context *ctx, const Shape &s, const std::vector<int32_t> &v) {
  Tensor *t = make(ctx, s);
  t->dtype = I32;
  internal::from_host_ids(ctx, t, v);
  return t;
}

/// A one-rank (no MPI) context in step 1 for the whole ops.
Context *single() {
  Context *ctx = internal::create_context("single", /*use_mpi=*/false);
  internal::start(ctx);
  internal::begin_step(ctx, 1);
  return ctx;
}

TEST(VocabParallel, EmbeddingMatchesTheWholeTable) {
  const int64_t V = 8, C = 3, Vl = V / 2;
  std::vector<int32_t> ids = {0, 7, 3, 4, 4, 1, 6, 2, 5, 7};
  auto table = uniform(V * C, 1, -1.0f, 1.0f);
  auto dout = uniform(ids.size() * C, 2, -1.0f, 1.0f);
  Context *one = single();
  Tensor *want = make(one, {2, 5, C}), *want_grad = make(one, {V, C});
  embedding(one, id_tensor(one, {2, 5}, ids), tensor(one, {V, C}, table), want,
            -1);
  embedding_grad(one, id_tensor(one, {2, 5}, ids), tensor(one, {2, 5, C}, dout),
                 want_grad, -1);
  auto wv = internal::to_host(one, want),
       wg = internal::to_host(one, want_grad);

  Context *ctx = mesh();
  int64_t g = coord(kTp);
  std::vector<float> local(table.begin() + g * Vl * C,
                           table.begin() + (g + 1) * Vl * C);
  Tensor *tid = id_tensor(ctx, {2, 5}, ids);
  Tensor *out = make(ctx, {2, 5, C});
  embedding(ctx, tid, tensor(ctx, {Vl, C}, local), out, kTp);
  auto part = internal::to_host(ctx, out);
  for (size_t r = 0; r < ids.size(); ++r)
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(part[r * C + c], ids[r] / Vl == g ? wv[r * C + c] : 0.0f);
  all_reduce_sum(ctx, out, 1 << kTp);
  EXPECT_EQ(internal::to_host(ctx, out), wv);

  Tensor *dtable = make(ctx, {Vl, C});
  embedding_grad(ctx, tid, tensor(ctx, {2, 5, C}, dout), dtable, kTp);
  EXPECT_EQ(internal::to_host(ctx, dtable),
            std::vector<float>(wg.begin() + g * Vl * C,
                               wg.begin() + (g + 1) * Vl * C));
  internal::destroy_context(ctx);
  internal::destroy_context(one);
}

TEST(VocabParallel, CrossEntropyMatchesTheWholeLogits) {
  const int64_t B = 2, S = 3, V = 10, C = V / 2;
  std::vector<int32_t> tgt = {9, 0, 4, 5, 7, 2};
  auto logits = uniform(B * S * V, 3, -4.0f, 4.0f);
  const float scale = 1.0f / (B * S);
  Context *one = single();
  Tensor *loss1 = make(one, {}), *dl1 = make(one, {B, S, V});
  Tensor *l1 = tensor(one, {B, S, V}, logits);
  Tensor *t1 = id_tensor(one, {B, S}, tgt);
  cross_entropy(one, l1, t1, loss1, scale);
  cross_entropy_grad(one, l1, t1, dl1, scale);
  float want_loss = internal::to_host(one, loss1)[0];
  auto want_grad = internal::to_host(one, dl1);

  Context *ctx = mesh();
  int64_t g = coord(kTp);
  std::vector<float> local;
  for (int64_t r = 0; r < B * S; ++r)
    local.insert(local.end(), logits.begin() + r * V + g * C,
                 logits.begin() + r * V + (g + 1) * C);
  Tensor *lg = tensor(ctx, {B, S, C}, local), *tg = id_tensor(ctx, {B, S}, tgt);
  Tensor *m = make(ctx, {B * S}), *st = make(ctx, {B * S, 2});
  Tensor *loss = make(ctx, {}), *dl = make(ctx, {B, S, C});
  row_max(ctx, lg, m);
  all_reduce_max(ctx, m, 1 << kTp);
  ce_local_stats(ctx, lg, tg, m, st, kTp);
  all_reduce_sum(ctx, st, 1 << kTp);
  ce_loss_from_stats(ctx, st, m, loss, scale);
  ce_grad_from_stats(ctx, lg, tg, m, st, dl, scale, kTp);
  float got_loss = internal::to_host(ctx, loss)[0];
  EXPECT_NEAR(got_loss, want_loss, 1e-6 * std::fabs(want_loss));
  auto got = internal::to_host(ctx, dl);
  for (int64_t r = 0; r < B * S; ++r)
    for (int64_t c = 0; c < C; ++c) {
      float w = want_grad[r * V + g * C + c];
      ASSERT_NEAR(got[r * C + c], w, 1e-6 * std::fabs(w) + 1e-7 * scale)
          << "row " << r << " column " << g * C + c;
    }
  internal::destroy_context(ctx);
  internal::destroy_context(one);
}

/// ZeRO's in-place update (plan-shard-in-place): the shard is a view of the
/// whole parameter and the gather writes the whole around it, through MPI
/// (small) and the ring (large).
TEST(Collectives, AllGatherInPlaceAroundTheShardView) {
  Context *ctx = mesh();
  for (int64_t rows : {6, 2 * 40000}) {
    Tensor *whole = make(ctx, {rows, 3});
    std::vector<float> junk(rows * 3, -7.0f);
    internal::from_host(ctx, whole, junk);
    Tensor *shard = shard_view(ctx, whole, kDp);
    ASSERT_EQ(shard->shape[0], rows / 2);
    ASSERT_EQ(shard->data, whole->data + coord(kDp) * (rows / 2) * 3);
    std::vector<float> mine(rows / 2 * 3);
    for (size_t i = 0; i < mine.size(); ++i)
      mine[i] = (float)(coord(kDp) * 100000 + (int64_t)i) +
                0.5f * (float)other_coord(kDp);
    internal::from_host(ctx, shard, mine);
    all_gather(ctx, shard, whole, 0, kDp);
    std::vector<float> got = internal::to_host(ctx, whole);
    for (int64_t k = 0; k < 2; ++k)
      for (int64_t i = 0; i < rows / 2 * 3; ++i)
        ASSERT_EQ(got[k * (rows / 2) * 3 + i],
                  (float)(k * 100000 + i) + 0.5f * (float)other_coord(kDp))
            << "rows " << rows << " block " << k;
  }
  internal::destroy_context(ctx);
}

//===--- Ring collectives (host/ring.h) -----------------------------===//

/// Member m's value at index i: distinct small integers, so every sum is
/// exact in f32 whatever the order of the additions.
float ring_value(int m, int64_t i) { return (float)((i % 1000) * 8 + m); }

/// Runs `check(comm)` on a communicator of the first `size` world ranks
/// (the others wait): rings of 2, 3 (not a power of two) and 4 members.
void on_groups(const std::function<void(MPI_Comm)> &check) {
  for (int size : {2, 3, 4}) {
    MPI_Comm comm;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() < size ? 0 : MPI_UNDEFINED,
                   world_rank(), &comm);
    if (comm != MPI_COMM_NULL) {
      check(comm);
      MPI_Comm_free(&comm);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

ring::WaitFn plain_wait() {
  return [](int n, MPI_Request *r) { MPI_Waitall(n, r, MPI_STATUSES_IGNORE); };
}

TEST(Ring, AllReduceSumsUnevenBlocksInSegments) {
  on_groups([](MPI_Comm comm) {
    int G, g;
    MPI_Comm_size(comm, &G);
    MPI_Comm_rank(comm, &g);
    std::vector<float> scratch;
    // Counts below G (empty blocks), not divisible by G, and over several
    // segments of 5 floats per block.
    for (int64_t count : {1, 2, 7, 37, 101}) {
      std::vector<float> x(count);
      for (int64_t i = 0; i < count; ++i)
        x[i] = ring_value(g, i);
      ring::all_reduce(comm, x.data(), count, /*segment=*/5, scratch,
                       plain_wait());
      for (int64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int m = 0; m < G; ++m)
          want += ring_value(m, i);
        ASSERT_EQ(x[i], want) << "G " << G << " count " << count << " i " << i;
      }
    }
  });
}

TEST(Ring, ReduceScatterLeavesSendAlone) {
  on_groups([](MPI_Comm comm) {
    int G, g;
    MPI_Comm_size(comm, &G);
    MPI_Comm_rank(comm, &g);
    std::vector<float> scratch;
    for (int64_t count : {1, 13}) {
      std::vector<float> send(G * count), recv(count, -1.0f);
      for (int64_t i = 0; i < G * count; ++i)
        send[i] = ring_value(g, i);
      std::vector<float> kept = send;
      ring::reduce_scatter(comm, send.data(), recv.data(), count,
                           /*segment=*/4, scratch, plain_wait());
      EXPECT_EQ(send, kept);
      for (int64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int m = 0; m < G; ++m)
          want += ring_value(m, g * count + i);
        ASSERT_EQ(recv[i], want) << "G " << G << " count " << count;
      }
    }
  });
}

TEST(Ring, AllGatherCopiesOrWorksInPlace) {
  on_groups([](MPI_Comm comm) {
    int G, g;
    MPI_Comm_size(comm, &G);
    MPI_Comm_rank(comm, &g);
    const int64_t count = 11;
    for (bool in_place : {false, true}) {
      std::vector<float> send(count), recv(G * count, -1.0f);
      for (int64_t i = 0; i < count; ++i)
        send[i] = ring_value(g, i);
      const float *from = send.data();
      if (in_place) {
        std::copy(send.begin(), send.end(), recv.begin() + g * count);
        from = recv.data() + g * count;
      }
      ring::all_gather(comm, from, recv.data(), count, /*segment=*/3,
                       plain_wait());
      for (int m = 0; m < G; ++m)
        for (int64_t i = 0; i < count; ++i)
          ASSERT_EQ(recv[m * count + i], ring_value(m, i))
              << "G " << G << " member " << m;
    }
  });
}

/// Through planrt's ops: tensors large enough for the backend to use its
/// rings (from 2^16 floats), over one axis and over the whole 2 x 2 mesh,
/// blocking and started/waited.
TEST(Ring, LargeCollectivesOfTheHostBackend) {
  Context *ctx = mesh();
  const int64_t n = (int64_t(1) << 17) + 3;
  auto make_x = [&] {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i)
      v[i] = ring_value(world_rank(), i);
    return tensor(ctx, {n}, v);
  };
  for (int64_t mask : {1, 2, 3}) {
    Tensor *a = make_x(), *b = make_x();
    all_reduce_sum(ctx, a, mask);
    all_reduce_sum_start(ctx, b, mask, 0);
    collective_wait(ctx, 0);
    std::vector<float> ga = internal::to_host(ctx, a),
                       gb = internal::to_host(ctx, b);
    for (int64_t i = 0; i < n; ++i) {
      float want = 0;
      for (int m = 0; m < 4; ++m) {
        bool same_dp = m / 2 == world_rank() / 2,
             same_tp = m % 2 == world_rank() % 2;
        bool member =
            mask == 3 || (mask == 1 && same_tp) || (mask == 2 && same_dp);
        if (member)
          want += ring_value(m, i);
      }
      ASSERT_EQ(ga[i], want) << "mask " << mask << " i " << i;
      ASSERT_EQ(gb[i], want) << "mask " << mask << " i " << i;
    }
  }
  // Reduce-scatter then all-gather over dp: every rank of a tp column ends
  // with the column's sum.
  const int64_t rows = 2 * 40000;
  std::vector<float> v(rows * 2);
  for (int64_t i = 0; i < rows * 2; ++i)
    v[i] = ring_value(world_rank(), i);
  Tensor *in = tensor(ctx, {rows, 2}, v);
  Tensor *part = make(ctx, {rows / 2, 2});
  Tensor *whole = make(ctx, {rows, 2});
  reduce_scatter(ctx, in, part, 0, kDp);
  all_gather(ctx, part, whole, 0, kDp);
  std::vector<float> got = internal::to_host(ctx, whole);
  int peer = (world_rank() + 2) % 4;
  for (int64_t i = 0; i < rows * 2; ++i)
    ASSERT_EQ(got[i], ring_value(world_rank(), i) + ring_value(peer, i));
  internal::destroy_context(ctx);
}

//===--- Expert parallelism's routed collectives --------------------------===//

/// A started context of one axis "ep" over the 4 ranks.
Context *ep_group() {
  Context *ctx = internal::create_context("ep", /*use_mpi=*/true);
  declare_mesh_axis(ctx, "ep", 4);
  internal::start(ctx);
  internal::begin_step(ctx, 1);
  return ctx;
}

/// The group's choices: 4 members' blocks of 3 x 2 tokens, K = 2, over 8
/// experts (2 per member); some dropped (-(e + 1)), some tokens with both
/// choices on one member, the same on every rank.
constexpr int64_t kRoutedRows = 6, kRoutedK = 2, kPerRank = 2;
std::vector<int32_t> routed_choices() {
  std::mt19937 rng(7);
  std::vector<int32_t> c(4 * kRoutedRows * kRoutedK);
  for (int64_t t = 0; t < 4 * kRoutedRows; ++t) {
    int32_t a = int32_t(rng() % 8), b = int32_t(rng() % 8);
    if (b == a)
      b = (a ^ 1); // the other expert of a's member
    c[t * 2] = a;
    c[t * 2 + 1] = t % 5 == 0 ? -b - 1 : b;
  }
  return c;
}
bool routed_needed(const std::vector<int32_t> &c, int64_t row, int64_t r) {
  for (int64_t j = 0; j < kRoutedK; ++j)
    if (c[row * kRoutedK + j] >= 0 && c[row * kRoutedK + j] / kPerRank == r)
      return true;
  return false;
}

TEST(RoutedCollectives, GatherMovesTheRowsTheExpertsNeed) {
  Context *ctx = ep_group();
  const int64_t g = world_rank(), w = 5;
  auto c = routed_choices();
  Tensor *choices = id_tensor(ctx, {4 * 3, 2, kRoutedK}, c);
  std::vector<float> x(4 * kRoutedRows * w);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = float(i + 1);
  std::vector<float> mine(x.begin() + g * kRoutedRows * w,
                          x.begin() + (g + 1) * kRoutedRows * w);
  Tensor *in = tensor(ctx, {3, 2, w}, mine);
  Tensor *out = tensor(ctx, {12, 2, w}, std::vector<float>(x.size(), -7.0f));
  routed_all_gather(ctx, in, choices, out, kPerRank, 0);
  // The rank's own block whole, another's rows where its experts need them,
  // zero elsewhere.
  std::vector<float> want(x.size(), 0.0f);
  int64_t moved = 0;
  for (int64_t row = 0; row < 4 * kRoutedRows; ++row) {
    bool own = row / kRoutedRows == g, need = routed_needed(c, row, g);
    moved += !own && need;
    if (own || need)
      for (int64_t k = 0; k < w; ++k)
        want[row * w + k] = x[row * w + k];
  }
  EXPECT_EQ(internal::to_host(ctx, out), want);
  EXPECT_GT(moved, 0);
  EXPECT_LT(moved, 3 * kRoutedRows); // fewer than the dense gather's
  // 16-bit rows move as they are.
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < bits.size(); ++i)
    bits[i] = uint16_t(i * 40503u + 1);
  std::vector<uint16_t> mine16(bits.begin() + g * kRoutedRows * w,
                               bits.begin() + (g + 1) * kRoutedRows * w);
  Tensor *in16 = tensor16(ctx, {3, 2, w}, BF16, mine16);
  Tensor *out16 = tensor16(ctx, {12, 2, w}, BF16,
                           std::vector<uint16_t>(bits.size(), 0xffff));
  routed_all_gather(ctx, in16, choices, out16, kPerRank, 0);
  std::vector<uint16_t> want16(bits.size(), 0);
  for (int64_t row = 0; row < 4 * kRoutedRows; ++row)
    if (row / kRoutedRows == g || routed_needed(c, row, g))
      for (int64_t k = 0; k < w; ++k)
        want16[row * w + k] = bits[row * w + k];
  EXPECT_EQ(bits16(out16), want16);
  internal::destroy_context(ctx);
}

TEST(RoutedCollectives, ReduceScatterEqualsTheDenseOne) {
  // Each member's partial rows are non-zero only where its experts needed
  // the row (as the experts write them): the routed sum is the dense sum.
  Context *ctx = ep_group();
  const int64_t g = world_rank(), w = 3;
  auto c = routed_choices();
  Tensor *choices = id_tensor(ctx, {4 * 3, 2, kRoutedK}, c);
  std::vector<float> part(4 * kRoutedRows * w, 0.0f);
  for (int64_t row = 0; row < 4 * kRoutedRows; ++row)
    if (routed_needed(c, row, g))
      for (int64_t k = 0; k < w; ++k)
        part[row * w + k] = float((g + 1) * 100 + row * w + k);
  Tensor *in = tensor(ctx, {12, 2, w}, part);
  Tensor *routed = make(ctx, {3, 2, w});
  Tensor *dense = make(ctx, {3, 2, w});
  routed_reduce_scatter(ctx, in, choices, routed, kPerRank, 0);
  reduce_scatter(ctx, in, dense, 0, 0);
  EXPECT_EQ(internal::to_host(ctx, routed), internal::to_host(ctx, dense));
  internal::destroy_context(ctx);
}

TEST(RoutedCollectives, BlocksOfManyChunks) {
  // Blocks of 2500 rows: the routing's segments of 1024 rows (three per
  // member's block, the last partial) keep the rows in order.
  Context *ctx = ep_group();
  const int64_t g = world_rank(), rows = 2500, w = 3, K = 2;
  std::mt19937 rng(11);
  std::vector<int32_t> c(4 * rows * K);
  for (auto &e : c) {
    int32_t expert = int32_t(rng() % 8);
    e = rng() % 7 == 0 ? -expert - 1 : expert; // some dropped
  }
  auto needed = [&](int64_t row, int64_t r) {
    for (int64_t j = 0; j < K; ++j)
      if (c[row * K + j] >= 0 && c[row * K + j] / kPerRank == r)
        return true;
    return false;
  };
  Tensor *choices = id_tensor(ctx, {4 * rows, K}, c);
  std::vector<float> x(4 * rows * w);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = float(i % 9973);
  Tensor *in = tensor(ctx, {rows, w},
                      std::vector<float>(x.begin() + g * rows * w,
                                         x.begin() + (g + 1) * rows * w));
  Tensor *out = make(ctx, {4 * rows, w});
  routed_all_gather(ctx, in, choices, out, kPerRank, 0);
  std::vector<float> want(x.size(), 0.0f), part(x.size(), 0.0f);
  for (int64_t row = 0; row < 4 * rows; ++row)
    for (int64_t k = 0; k < w; ++k) {
      if (row / rows == g || needed(row, g))
        want[row * w + k] = x[row * w + k];
      if (needed(row, g))
        part[row * w + k] = float((g + 1) * 10 + k);
    }
  EXPECT_EQ(internal::to_host(ctx, out), want);
  Tensor *pin = tensor(ctx, {4 * rows, w}, part);
  Tensor *routed = make(ctx, {rows, w}), *dense = make(ctx, {rows, w});
  routed_reduce_scatter(ctx, pin, choices, routed, kPerRank, 0);
  reduce_scatter(ctx, pin, dense, 0, 0);
  EXPECT_EQ(internal::to_host(ctx, routed), internal::to_host(ctx, dense));
  internal::destroy_context(ctx);
}

} // namespace

int main(int argc, char **argv) {
  return planrt_test::runMpiTests(argc, argv, 4, "planrt_mesh_tests");
}
