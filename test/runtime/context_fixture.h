//===- context_fixture.h - A one-rank planrt context for kernel tests -----===//
#ifndef PLANRT_TEST_CONTEXT_FIXTURE_H
#define PLANRT_TEST_CONTEXT_FIXTURE_H

#include "planrt/internal.h"
#include "planrt/planrt.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace planrt::test {

// The OpenMP pool starts threads on first use; fork-based death tests need the
// threadsafe style.
inline const bool kDeathStyle = [] {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return true;
}();

/// A started single-rank host context (no MPI) in step 1, with helpers that
/// make scratch tensors. Fixtures declare parameters in `declare()`.
class ContextTest : public ::testing::Test {
protected:
  explicit ContextTest(const char *name, unsigned seed)
      : name(name), rng(seed) {}
  virtual void declare() {}

  void SetUp() override {
    ctx = internal::create_context(name, /*use_mpi=*/false);
    declare_mesh_axis(ctx, "dp", 1);
    declare();
    internal::start(ctx);
    internal::begin_step(ctx, 1);
  }
  void TearDown() override { internal::destroy_context(ctx); }

  Tensor *make(std::vector<int64_t> shape) {
    int64_t d[4] = {1, 1, 1, 1};
    for (size_t i = 0; i < shape.size(); ++i)
      d[i] = shape[i];
    return alloc(ctx, (int64_t)shape.size(), d[0], d[1], d[2], d[3]);
  }
  /// A scratch int32 tensor holding `values` (token ids, targets).
  Tensor *ids(std::vector<int64_t> shape, std::vector<int32_t> values) {
    Tensor *t = make(shape);
    t->dtype = I32;
    internal::from_host_ids(ctx, t, values);
    return t;
  }
  /// A scratch tensor filled with uniform values in [lo, hi).
  Tensor *random(std::vector<int64_t> shape, float lo = -1.0f,
                 float hi = 1.0f) {
    Tensor *t = make(shape);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v((size_t)t->numel());
    for (auto &e : v)
      e = dist(rng);
    internal::from_host(ctx, t, v);
    return t;
  }

  const char *name;
  Context *ctx = nullptr;
  std::mt19937 rng;
};

} // namespace planrt::test

#endif
