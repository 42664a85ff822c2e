// 16-bit tensors in planrt's ops: cast rounds to nearest even, and an op
// given bf16 or f16 tensors computes exactly what the same op computes in
// fp32 on the widened values, rounded once on the way out (the arithmetic
// of a GPU kernel with 16-bit loads and stores and fp32 registers).
#include "planrt/dtype.h"
#include "planrt/internal.h"
#include "planrt/planrt.h"

#include "context_fixture.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

using namespace planrt;

namespace {

class MixedPrecisionTest : public test::ContextTest {
protected:
  MixedPrecisionTest() : ContextTest("mixed", 99) {}

  Tensor *make16(std::vector<int64_t> shape, int dtype) {
    int64_t d[4] = {1, 1, 1, 1};
    for (size_t i = 0; i < shape.size(); ++i)
      d[i] = shape[i];
    return alloc(ctx, (int64_t)shape.size(), d[0], d[1], d[2], d[3], dtype);
  }
  /// A 16-bit copy of `f` (cast) and the fp32 widening of that copy.
  std::pair<Tensor *, Tensor *> narrowed(Tensor *f, int dtype) {
    std::vector<int64_t> shape(f->shape, f->shape + f->ndim);
    Tensor *h = make16(shape, dtype);
    cast(ctx, f, h);
    Tensor *w = make(shape);
    cast(ctx, h, w);
    return {h, w};
  }
  std::vector<uint16_t> raw16(const Tensor *t) {
    std::vector<uint16_t> v((size_t)t->numel());
    std::memcpy(v.data(), t->data, v.size() * 2);
    return v;
  }
  /// The bits an fp32 result rounds to.
  std::vector<uint16_t> rounded(const Tensor *f, int dtype) {
    std::vector<uint16_t> v;
    for (float x : internal::to_host(ctx, f))
      v.push_back(dtype == BF16 ? bf16_from_float(x) : f16_from_float(x));
    return v;
  }
};

TEST_F(MixedPrecisionTest, CastRoundsToNearestEven) {
  for (int dtype : {BF16, F16}) {
    Tensor *f = random({3, 5}, -300.0f, 300.0f);
    auto [h, w] = narrowed(f, dtype);
    EXPECT_EQ(raw16(h), rounded(f, dtype));
    // Widening is exact: casting the widened values again changes nothing.
    Tensor *h2 = make16({3, 5}, dtype);
    cast(ctx, w, h2);
    EXPECT_EQ(raw16(h2), raw16(h));
  }
}

TEST_F(MixedPrecisionTest, ElementwiseOpsRoundTheFp32Result) {
  for (int dtype : {BF16, F16}) {
    auto [x, xw] = narrowed(random({4, 8}, -3.0f, 3.0f), dtype);
    auto [dy, dyw] = narrowed(random({4, 8}), dtype);
    Tensor *out = make16({4, 8}, dtype), *ref = make({4, 8});
    gelu(ctx, x, out);
    gelu(ctx, xw, ref);
    EXPECT_EQ(raw16(out), rounded(ref, dtype));
    gelu_grad(ctx, x, dy, out);
    gelu_grad(ctx, xw, dyw, ref);
    EXPECT_EQ(raw16(out), rounded(ref, dtype));
    add(ctx, x, dy, out);
    add(ctx, xw, dyw, ref);
    EXPECT_EQ(raw16(out), rounded(ref, dtype));
  }
}

TEST_F(MixedPrecisionTest, MatmulAccumulatesInFp32) {
  // k = 256 products: a 16-bit accumulator would lose most of them. Three
  // tensors of one 16-bit type take the backend's 16-bit GEMM (gemm16),
  // any other mix fp32 copies; both must be the fp32 product rounded once.
  for (int dtype : {BF16, F16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(std::string(dtype == BF16 ? "bf16" : "f16") +
                     (ta ? " a^T" : "") + (tb ? " b^T" : ""));
        auto [a, aw] = narrowed(random(ta ? std::vector<int64_t>{256, 6}
                                          : std::vector<int64_t>{6, 256}),
                                dtype);
        auto [b, bw] = narrowed(random(tb ? std::vector<int64_t>{5, 256}
                                          : std::vector<int64_t>{256, 5}),
                                dtype);
        Tensor *c = make16({6, 5}, dtype), *ref = make({6, 5});
        matmul(ctx, a, b, c, ta, tb);
        matmul(ctx, aw, bw, ref, ta, tb);
        EXPECT_EQ(raw16(c), rounded(ref, dtype));
        // An fp32 result of 16-bit operands (the weight gradient into fp32).
        Tensor *c32 = make({6, 5});
        matmul(ctx, a, b, c32, ta, tb);
        EXPECT_EQ(internal::to_host(ctx, c32), internal::to_host(ctx, ref));
      }
}

TEST_F(MixedPrecisionTest, LayerNormStatisticsInFp32) {
  auto [x, xw] = narrowed(random({3, 64}, 100.0f, 101.0f), BF16);
  auto [g, gw] = narrowed(random({64}), BF16);
  auto [be, bew] = narrowed(random({64}), BF16);
  Tensor *out = make16({3, 64}, BF16), *ref = make({3, 64});
  layernorm(ctx, x, g, be, out, 1e-5f);
  layernorm(ctx, xw, gw, bew, ref, 1e-5f);
  EXPECT_EQ(raw16(out), rounded(ref, BF16));
}

TEST_F(MixedPrecisionTest, SixteenBitTensorsTakeTwoBytes) {
  Tensor *h = make16({10, 3}, F16);
  Tensor *v = rows(ctx, h, 1, 2);
  EXPECT_EQ(v->dtype, F16);
  EXPECT_EQ((char *)v->data - (char *)h->data, 5 * 3 * 2);
  Tensor *s = subview(ctx, h, 7, 1, 4, 1, 1, 1);
  EXPECT_EQ((char *)s->data - (char *)h->data, 7 * 2);
}

TEST_F(MixedPrecisionTest, SixteenBitMatmulChecksItsTensors) {
  // The 16-bit GEMM path checks its tensors as the fp32 one does.
  Tensor *a = make16({3, 4}, BF16), *b = make16({4, 5}, BF16);
  Tensor *c = make16({3, 5}, BF16);
  Tensor bad = *a;
  bad.shape[0] = -3;
  EXPECT_DEATH(matmul(ctx, &bad, b, c, false, false),
               "matmul: a has a negative dimension");
  bad = *c;
  bad.ndim = 5;
  EXPECT_DEATH(matmul(ctx, a, b, &bad, false, false),
               "matmul: c has invalid rank 5");
  Tensor *b5 = make16({5, 5}, BF16);
  EXPECT_DEATH(matmul(ctx, a, b5, c, false, false), "matmul: shape mismatch");
}

TEST_F(MixedPrecisionTest, CastRefusesIds) {
  Tensor *i = ids({2}, {1, 2});
  Tensor *f = make({2});
  EXPECT_DEATH(cast(ctx, i, f), "cast: converts between f32, bf16 and f16");
}

} // namespace
