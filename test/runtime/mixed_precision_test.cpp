// 16-bit tensors in planrt's ops: cast rounds to nearest even, and an op
// given bf16 or f16 tensors computes exactly what the same op computes in
// fp32 on the widened values, rounded once on the way out (the arithmetic
// of a GPU kernel with 16-bit loads and stores and fp32 registers).
#include "planrt/dtype.h"
#include "planrt/internal.h"
#include "planrt/planrt.h"
#include "planrt/workspace.h"

#include "context_fixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
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

TEST_F(MixedPrecisionTest, MatmulAccumulateAddsToItsOutput) {
  // c += op(a) @ op(b): a weight gradient summed over microbatches by its
  // GEMM. The result is within fp32 rounding of c + (a @ b) (the GEMM may
  // add c before or after its own sums), for fp32 and 16-bit operands and
  // an fp32 or 16-bit c; a second call adds the product again.
  for (int dtype : {F32, BF16, F16})
    for (bool ta : {false, true}) {
      SCOPED_TRACE(std::string(dtype == F32    ? "f32"
                               : dtype == BF16 ? "bf16"
                                               : "f16") +
                   (ta ? " a^T" : ""));
      Tensor *af = random(ta ? std::vector<int64_t>{64, 6}
                             : std::vector<int64_t>{6, 64});
      Tensor *bf = random({64, 5});
      Tensor *a = af, *b = bf, *aw = af, *bw = bf;
      if (dtype != F32) {
        std::tie(a, aw) = narrowed(af, dtype);
        std::tie(b, bw) = narrowed(bf, dtype);
      }
      Tensor *prod = make({6, 5});
      matmul(ctx, aw, bw, prod, ta, false);
      std::vector<float> p = internal::to_host(ctx, prod);
      Tensor *c0 = random({6, 5});
      std::vector<float> start = internal::to_host(ctx, c0);
      Tensor *c = make({6, 5});
      copy(ctx, c0, c);
      matmul_accumulate(ctx, a, b, c, ta, false);
      matmul_accumulate(ctx, a, b, c, ta, false);
      std::vector<float> got = internal::to_host(ctx, c);
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], start[i] + 2 * p[i], 1e-5f * (1 + std::fabs(p[i])))
            << i;
      if (dtype == F32)
        continue;
      // A 16-bit c: widened, summed in fp32, rounded once.
      auto [c16, c16w] = narrowed(c0, dtype);
      matmul_accumulate(ctx, a, b, c16, ta, false);
      std::vector<float> want = internal::to_host(ctx, c16w);
      for (size_t i = 0; i < want.size(); ++i)
        want[i] += p[i];
      Tensor *wantT = make({6, 5});
      internal::from_host(ctx, wantT, want);
      std::vector<uint16_t> w16 = rounded(wantT, dtype), g16 = raw16(c16);
      for (size_t i = 0; i < g16.size(); ++i)
        EXPECT_LE(std::abs(int(g16[i]) - int(w16[i])), 1) << i; // one ulp
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

// Every op that reads and writes 16-bit tensors in place (workspace.h
// native) gives the bits of the same op on the widened fp32 values rounded
// once, as staging does, and takes no more scratch memory than the fp32 op:
// no fp32 copies. Widths above 256 cross the host's column blocks.
class NativeOpsTest : public MixedPrecisionTest {
protected:
  /// Runs `op` on the 16-bit tensors and `ref` on their fp32 widenings;
  /// the 16-bit run must take the fp32 run's scratch bytes.
  template <class Op, class Ref> void run(const Op &op, const Ref &ref) {
    int64_t before = internal::arena_used(ctx);
    op();
    int64_t native = internal::arena_used(ctx) - before;
    before = internal::arena_used(ctx);
    ref();
    EXPECT_EQ(native, internal::arena_used(ctx) - before)
        << "the 16-bit op took fp32 copies";
  }
  void expect_rounded(const Tensor *h, const Tensor *ref, int dtype) {
    EXPECT_EQ(raw16(h), rounded(ref, dtype));
  }
  void expect_equal(const Tensor *a, const Tensor *b) {
    EXPECT_EQ(internal::to_host(ctx, a), internal::to_host(ctx, b));
  }
  static const char *name(int dtype) { return dtype == BF16 ? "bf16" : "f16"; }
};

TEST_F(NativeOpsTest, ElementwiseOps) {
  for (int dtype : {BF16, F16}) {
    SCOPED_TRACE(name(dtype));
    auto [a, aw] = narrowed(random({4, 300}, -3.0f, 3.0f), dtype);
    auto [b, bw] = narrowed(random({4, 300}), dtype);
    auto [bias, biasw] = narrowed(random({300}), dtype);
    Tensor *out = make16({4, 300}, dtype), *ref = make({4, 300});
    using Binary =
        void (*)(Context *, const Tensor *, const Tensor *, Tensor *);
    using Unary = void (*)(Context *, const Tensor *, Tensor *);
    for (Binary f :
         {Binary(add), Binary(mul), Binary(sub), Binary(relu_grad),
          Binary(gelu_grad), Binary(gelu_exact_grad), Binary(silu_grad)}) {
      run([&] { f(ctx, a, b, out); }, [&] { f(ctx, aw, bw, ref); });
      expect_rounded(out, ref, dtype);
    }
    for (Unary f : {Unary(relu), Unary(gelu), Unary(gelu_exact), Unary(silu),
                    Unary(copy)}) {
      run([&] { f(ctx, a, out); }, [&] { f(ctx, aw, ref); });
      expect_rounded(out, ref, dtype);
    }
    run([&] { scale(ctx, a, out, 0.37f); },
        [&] { scale(ctx, aw, ref, 0.37f); });
    expect_rounded(out, ref, dtype);
    run([&] { bias_add(ctx, a, bias, out); },
        [&] { bias_add(ctx, aw, biasw, ref); });
    expect_rounded(out, ref, dtype);
    // In place: out is one of the inputs.
    Tensor *acc = make16({4, 300}, dtype);
    copy(ctx, a, acc);
    add(ctx, acc, b, acc);
    add(ctx, aw, bw, ref);
    expect_rounded(acc, ref, dtype);
  }
}

TEST_F(NativeOpsTest, ColumnSums) {
  for (int dtype : {BF16, F16}) {
    SCOPED_TRACE(name(dtype));
    // 40 rows of sums, in the input's type and in f32.
    auto [dy, dyw] = narrowed(random({40, 300}), dtype);
    Tensor *db = make16({300}, dtype), *db32 = make({300}), *ref = make({300});
    run([&] { bias_grad(ctx, dy, db); }, [&] { bias_grad(ctx, dyw, ref); });
    expect_rounded(db, ref, dtype);
    run([&] { bias_grad(ctx, dy, db32); }, [&] { bias_grad(ctx, dyw, ref); });
    expect_equal(db32, ref);
    auto [dout, doutw] = narrowed(random({3, 5, 300}), dtype);
    Tensor *dt = make16({7, 300}, dtype), *dt32 = make({7, 300}),
           *tref = make({7, 300});
    run([&] { pos_embedding_grad(ctx, dout, dt); },
        [&] { pos_embedding_grad(ctx, doutw, tref); });
    expect_rounded(dt, tref, dtype);
    run([&] { pos_embedding_grad(ctx, dout, dt32); },
        [&] { pos_embedding_grad(ctx, doutw, tref); });
    expect_equal(dt32, tref);
  }
}

TEST_F(NativeOpsTest, Embeddings) {
  for (int dtype : {BF16, F16}) {
    SCOPED_TRACE(name(dtype));
    Tensor *tok = ids({3, 5}, {0, 6, 2, 2, 5, 1, 0, 3, 3, 3, 6, 4, 0, 1, 2});
    auto [table, tablew] = narrowed(random({7, 300}), dtype);
    Tensor *out = make16({3, 5, 300}, dtype), *ref = make({3, 5, 300});
    run([&] { embedding(ctx, tok, table, out, -1); },
        [&] { embedding(ctx, tok, tablew, ref, -1); });
    expect_rounded(out, ref, dtype);
    auto [x, xw] = narrowed(random({3, 5, 300}), dtype);
    run([&] { pos_embedding(ctx, x, table, out); },
        [&] { pos_embedding(ctx, xw, tablew, ref); });
    expect_rounded(out, ref, dtype);
    // Gradients into an f32 table: in place; a 16-bit table is staged (its
    // sums are rounded once), with the same bits as the fp32 sums rounded.
    auto [dout, doutw] = narrowed(random({3, 5, 300}), dtype);
    Tensor *dt = make({7, 300}), *dtref = make({7, 300});
    run([&] { embedding_grad(ctx, tok, dout, dt, -1); },
        [&] { embedding_grad(ctx, tok, doutw, dtref, -1); });
    expect_equal(dt, dtref);
    run([&] { embedding_grad_add(ctx, tok, dout, dt, -1); },
        [&] { embedding_grad_add(ctx, tok, doutw, dtref, -1); });
    expect_equal(dt, dtref);
    Tensor *dt16 = make16({7, 300}, dtype);
    embedding_grad(ctx, tok, dout, dt16, -1);
    embedding_grad(ctx, tok, doutw, dtref, -1);
    expect_rounded(dt16, dtref, dtype);
  }
}

TEST_F(NativeOpsTest, Norms) {
  for (int dtype : {BF16, F16}) {
    SCOPED_TRACE(name(dtype));
    auto [x, xw] = narrowed(random({6, 300}, -2.0f, 3.0f), dtype);
    auto [g, gw] = narrowed(random({300}), dtype);
    auto [be, bew] = narrowed(random({300}), dtype);
    auto [dy, dyw] = narrowed(random({6, 300}), dtype);
    Tensor *out = make16({6, 300}, dtype), *ref = make({6, 300});
    Tensor *dg = make16({300}, dtype), *dgref = make({300});
    Tensor *dbe = make16({300}, dtype), *dberef = make({300});
    run([&] { layernorm(ctx, x, g, be, out, 1e-5f); },
        [&] { layernorm(ctx, xw, gw, bew, ref, 1e-5f); });
    expect_rounded(out, ref, dtype);
    run([&] { layernorm_grad(ctx, x, g, dy, out, dg, dbe, 1e-5f); },
        [&] { layernorm_grad(ctx, xw, gw, dyw, ref, dgref, dberef, 1e-5f); });
    expect_rounded(out, ref, dtype);
    expect_rounded(dg, dgref, dtype);
    expect_rounded(dbe, dberef, dtype);
    run([&] { rmsnorm(ctx, x, g, out, 1e-5f); },
        [&] { rmsnorm(ctx, xw, gw, ref, 1e-5f); });
    expect_rounded(out, ref, dtype);
    run([&] { rmsnorm_grad(ctx, x, g, dy, out, dg, 1e-5f); },
        [&] { rmsnorm_grad(ctx, xw, gw, dyw, ref, dgref, 1e-5f); });
    expect_rounded(out, ref, dtype);
    expect_rounded(dg, dgref, dtype);
    // The parameters' gradients in f32 (plan-fuse-casts: gradients that
    // only widen to the fp32 master weights): the fp32 sums, not rounded,
    // in place (native::norm_grad).
    Tensor *dg32 = make({300}), *dbe32 = make({300});
    run([&] { layernorm_grad(ctx, x, g, dy, out, dg32, dbe32, 1e-5f); },
        [&] { layernorm_grad(ctx, xw, gw, dyw, ref, dgref, dberef, 1e-5f); });
    expect_rounded(out, ref, dtype);
    expect_equal(dg32, dgref);
    expect_equal(dbe32, dberef);
    run([&] { rmsnorm_grad(ctx, x, g, dy, out, dg32, 1e-5f); },
        [&] { rmsnorm_grad(ctx, xw, gw, dyw, ref, dgref, 1e-5f); });
    expect_rounded(out, ref, dtype);
    expect_equal(dg32, dgref);
    EXPECT_TRUE(
        workspace::native::norm_grad(dtype, dtype, dtype, dtype, F32, F32));
    EXPECT_FALSE(
        workspace::native::norm_grad(dtype, dtype, dtype, dtype, F32, dtype));
    EXPECT_FALSE(workspace::native::norm_grad(F32, F32, F32, F32, dtype, -1));
    // With the residual stream's gradient added as dx is written (the
    // _add forms, plan-fuse-epilogues): the fp32 dx plus the widened
    // addend, rounded once; the parameters' gradients unchanged.
    auto [plus, plusw] = narrowed(random({6, 300}), dtype);
    Tensor *sum = make({6, 300});
    run(
        [&] {
          layernorm_grad_add(ctx, x, g, dy, plus, out, dg32, dbe32, 1e-5f);
        },
        [&] { layernorm_grad(ctx, xw, gw, dyw, ref, dgref, dberef, 1e-5f); });
    add(ctx, ref, plusw, sum);
    expect_rounded(out, sum, dtype);
    expect_equal(dg32, dgref);
    expect_equal(dbe32, dberef);
    run([&] { rmsnorm_grad_add(ctx, x, g, dy, plus, out, dg32, 1e-5f); },
        [&] { rmsnorm_grad(ctx, xw, gw, dyw, ref, dgref, 1e-5f); });
    add(ctx, ref, plusw, sum);
    expect_rounded(out, sum, dtype);
    expect_equal(dg32, dgref);
  }
  // fp32: the same bits as the norm's gradient and then the add.
  Tensor *x = random({6, 300}, -2.0f, 3.0f), *g = random({300}),
         *dy = random({6, 300}), *plus = random({6, 300});
  Tensor *dx = make({6, 300}), *ref = make({6, 300}), *sum = make({6, 300});
  Tensor *dg = make({300}), *dbe = make({300}), *dgref = make({300}),
         *dberef = make({300});
  layernorm_grad_add(ctx, x, g, dy, plus, dx, dg, dbe, 1e-5f);
  layernorm_grad(ctx, x, g, dy, ref, dgref, dberef, 1e-5f);
  add(ctx, plus, ref, sum);
  expect_equal(dx, sum);
  expect_equal(dg, dgref);
  expect_equal(dbe, dberef);
  rmsnorm_grad_add(ctx, x, g, dy, plus, dx, dg, 1e-5f);
  rmsnorm_grad(ctx, x, g, dy, ref, dgref, 1e-5f);
  add(ctx, ref, plus, sum);
  expect_equal(dx, sum);
  expect_equal(dg, dgref);
}

TEST_F(NativeOpsTest, LossGradientsWriteSixteenBits) {
  // The cross-entropy gradient of fp32 logits written in 16 bits (the
  // loss gradient the backward GEMMs read: plan-fuse-casts), whole and
  // from split statistics, with padded classes and a masked-out tail.
  for (int dtype : {BF16, F16}) {
    SCOPED_TRACE(name(dtype));
    Tensor *logits = random({3, 4, 300}, -4.0f, 4.0f);
    std::vector<int32_t> t(12);
    for (int i = 0; i < 12; ++i)
      t[i] = (i * 37) % 290;
    Tensor *tg = ids({3, 4}, t);
    Tensor *d16 = make16({3, 4, 300}, dtype), *ref = make({3, 4, 300});
    run([&] { cross_entropy_grad(ctx, logits, tg, d16, 0.25f, 290); },
        [&] { cross_entropy_grad(ctx, logits, tg, ref, 0.25f, 290); });
    expect_rounded(d16, ref, dtype);
    Tensor *m = make({3, 4}), *st = make({3, 4, 2});
    row_max(ctx, logits, m);
    ce_local_stats(ctx, logits, tg, m, st, -1, 290);
    run(
        [&] {
          ce_grad_from_stats(ctx, logits, tg, m, st, d16, 0.25f, -1, 290);
        },
        [&] {
          ce_grad_from_stats(ctx, logits, tg, m, st, ref, 0.25f, -1, 290);
        });
    expect_rounded(d16, ref, dtype);
  }
}

TEST_F(NativeOpsTest, CrossEntropyInPlaceIsTheLossAndItsGradient) {
  // One pass writing the gradient over the logits: the bits of
  // cross_entropy and cross_entropy_grad on the widened logits (fp32: on
  // the logits), with padded classes, and no fp32 copies of 16-bit logits.
  std::vector<int32_t> t(12);
  for (int i = 0; i < 12; ++i)
    t[i] = (i * 37) % 290;
  Tensor *tg = ids({3, 4}, t);
  Tensor *loss = make({}), *loss_ref = make({});
  {
    Tensor *x = random({3, 4, 300}, -4.0f, 4.0f), *d_ref = make({3, 4, 300});
    cross_entropy(ctx, x, tg, loss_ref, 0.5f, 290);
    cross_entropy_grad(ctx, x, tg, d_ref, 0.25f, 290);
    cross_entropy_in_place(ctx, x, tg, loss, 0.5f, 0.25f, 290);
    expect_equal(loss, loss_ref);
    expect_equal(x, d_ref);
  }
  for (int dtype : {BF16, F16}) {
    SCOPED_TRACE(name(dtype));
    auto [x, xw] = narrowed(random({3, 4, 300}, -4.0f, 4.0f), dtype);
    Tensor *d_ref = make({3, 4, 300}), *xw2 = make({3, 4, 300});
    copy(ctx, xw, xw2);
    cross_entropy(ctx, xw, tg, loss_ref, 0.5f, 290);
    cross_entropy_grad(ctx, xw, tg, d_ref, 0.25f, 290);
    // 16-bit logits in place take the scratch of fp32 ones.
    run([&] { cross_entropy_in_place(ctx, x, tg, loss, 0.5f, 0.25f, 290); },
        [&] {
          cross_entropy_in_place(ctx, xw2, tg, loss_ref, 0.5f, 0.25f, 290);
        });
    expect_equal(loss, loss_ref);
    expect_rounded(x, d_ref, dtype);
  }
}

TEST_F(NativeOpsTest, CrossEntropyInPlaceRefusesAClassifier) {
  // A classifier's accuracy reads the logits the gradient would overwrite
  // (plan-fuse-epilogues never fuses there).
  Tensor *x = random({4, 10}), *loss = make({});
  Tensor *tg = ids({4}, {1, 2, 3, 4});
  set_training(ctx, 1, 1, 4, /*synthetic images*/ 2);
  EXPECT_DEATH(cross_entropy_in_place(ctx, x, tg, loss, 1.0f, 1.0f),
               "cross_entropy_in_place: a classifier's accuracy reads the "
               "logits this op overwrites");
}

TEST_F(NativeOpsTest, MixedTypesAreStaged) {
  // A mix the native rules do not cover still computes the fp32 result
  // rounded once, on fp32 copies (it takes more scratch than fp32).
  auto [a, aw] = narrowed(random({4, 8}), BF16);
  Tensor *b = random({4, 8}), *out = make16({4, 8}, BF16), *ref = make({4, 8});
  int64_t before = internal::arena_used(ctx);
  add(ctx, a, b, out);
  EXPECT_GT(internal::arena_used(ctx) - before, 0);
  add(ctx, aw, b, ref);
  expect_rounded(out, ref, BF16);
}

TEST_F(NativeOpsTest, ComputePrecisionIsOneOfThePlans) {
  set_compute_precision(ctx, "bf16");
  set_compute_precision(ctx, "tf32");
  set_compute_precision(ctx, "fp32");
  EXPECT_DEATH(set_compute_precision(ctx, "fp8"),
               "set_compute_precision: 'fp8' is not fp32, tf32, bf16 or fp16");
}

TEST_F(NativeOpsTest, NativeOpsRefuseIds) {
  Tensor *i = ids({4}, {1, 2, 3, 4});
  Tensor *f = make({4});
  EXPECT_DEATH(add(ctx, i, i, i),
               "add: output \\[4\\] must be f32, bf16 or f16, got i32");
  EXPECT_DEATH(bias_grad(ctx, i, f),
               "bias_grad: dy \\[4\\] must be f32, bf16 or f16, got i32");
  EXPECT_DEATH(bias_grad(ctx, f, nullptr), "bias_grad: db is a null tensor");
  Tensor *t = ids({1}, {0});
  EXPECT_DEATH(cross_entropy_grad(ctx, f, t, i, 1.0f),
               "cross_entropy_grad: dlogits \\[4\\] must be f32, bf16 or "
               "f16, got i32");
}

TEST_F(MixedPrecisionTest, SixteenBitTensorsTakeTwoBytes) {
  Tensor *h = make16({10, 3}, F16);
  Tensor *v = rows(ctx, h, 1, 2);
  EXPECT_EQ(v->dtype, F16);
  EXPECT_EQ((char *)v->data - (char *)h->data, 5 * 3 * 2);
  Tensor *s = subview(ctx, h, 7, 1, 4, 1, 1, 1);
  EXPECT_EQ((char *)s->data - (char *)h->data, 7 * 2);
}

TEST_F(MixedPrecisionTest, MatmulBiasIsTheMatmulThenTheBiasAdd) {
  // planrt::matmul_bias (plan-fuse-epilogues' op): on the host it is
  // matmul, then bias_add in place, with their bits (the 16-bit product
  // rounded before the add), for every type and transpose.
  for (int dtype : {F32, BF16, F16})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(std::to_string(dtype) + (ta ? " a^T" : "") +
                     (tb ? " b^T" : ""));
        Tensor *af = random(ta ? std::vector<int64_t>{64, 6}
                               : std::vector<int64_t>{6, 64});
        Tensor *bf = random(tb ? std::vector<int64_t>{5, 64}
                               : std::vector<int64_t>{64, 5});
        Tensor *biasf = random({5});
        Tensor *a = af, *b = bf, *bias = biasf;
        if (dtype != F32) {
          a = narrowed(af, dtype).first;
          b = narrowed(bf, dtype).first;
          bias = narrowed(biasf, dtype).first;
        }
        Tensor *prod = make16({6, 5}, dtype), *ref = make16({6, 5}, dtype);
        matmul(ctx, a, b, prod, ta, tb);
        bias_add(ctx, prod, bias, ref);
        Tensor *c = make16({6, 5}, dtype);
        matmul_bias(ctx, a, b, bias, c, ta, tb);
        size_t bytes = (size_t)c->numel() * (dtype == F32 ? 4 : 2);
        EXPECT_EQ(std::memcmp(c->data, ref->data, bytes), 0);
      }
}

TEST_F(MixedPrecisionTest, MatmulBiasAddIsTheThreeOps) {
  // planrt::matmul_bias_add (a biased product into the residual stream):
  // on the host matmul, bias_add and add (residual + product), with their
  // bits; the residual may not be the output.
  for (int dtype : {F32, BF16, F16}) {
    SCOPED_TRACE(dtype);
    Tensor *a = random({6, 64}), *b = random({64, 8}), *bias = random({8});
    Tensor *r = random({6, 8});
    if (dtype != F32) {
      a = narrowed(a, dtype).first;
      b = narrowed(b, dtype).first;
      bias = narrowed(bias, dtype).first;
      r = narrowed(r, dtype).first;
    }
    Tensor *prod = make16({6, 8}, dtype), *biased = make16({6, 8}, dtype);
    Tensor *ref = make16({6, 8}, dtype);
    matmul(ctx, a, b, prod, false, false);
    bias_add(ctx, prod, bias, biased);
    add(ctx, r, biased, ref);
    Tensor *out = make16({6, 8}, dtype);
    matmul_bias_add(ctx, a, b, bias, r, out, false, false);
    size_t bytes = (size_t)out->numel() * (dtype == F32 ? 4 : 2);
    EXPECT_EQ(std::memcmp(out->data, ref->data, bytes), 0);
  }
  Tensor *a = make({3, 4}), *b = make({4, 5}), *bias = make({5});
  Tensor *c = make({3, 5});
  EXPECT_DEATH(matmul_bias_add(ctx, a, b, bias, c, c, false, false),
               "matmul_bias_add: c may not alias residual");
  EXPECT_DEATH(matmul_bias_add(ctx, a, b, bias, make({3, 4}), c, false, false),
               "matmul_bias_add: residual \\[3, 4\\] and c \\[3, 5\\] have "
               "different shapes");
}

TEST_F(MixedPrecisionTest, MatmulAddIsTheTwoOps) {
  // planrt::matmul_add (an unbiased product into the residual stream): on
  // the host matmul and add (residual + product), with their bits.
  for (int dtype : {F32, BF16, F16}) {
    SCOPED_TRACE(dtype);
    Tensor *a = random({6, 64}), *b = random({8, 64}), *r = random({6, 8});
    if (dtype != F32) {
      a = narrowed(a, dtype).first;
      b = narrowed(b, dtype).first;
      r = narrowed(r, dtype).first;
    }
    Tensor *prod = make16({6, 8}, dtype), *ref = make16({6, 8}, dtype);
    matmul(ctx, a, b, prod, false, true);
    add(ctx, r, prod, ref);
    Tensor *out = make16({6, 8}, dtype);
    matmul_add(ctx, a, b, r, out, false, true);
    size_t bytes = (size_t)out->numel() * (dtype == F32 ? 4 : 2);
    EXPECT_EQ(std::memcmp(out->data, ref->data, bytes), 0);
  }
  Tensor *a = make({3, 4}), *b = make({4, 5}), *c = make({3, 5});
  EXPECT_DEATH(matmul_add(ctx, a, b, c, c, false, false),
               "matmul_add: c may not alias residual");
  EXPECT_DEATH(matmul_add(ctx, a, b, make16({3, 5}, BF16), c, false, false),
               "matmul_add: residual");
}

TEST_F(MixedPrecisionTest, MatmulBiasGeluIsTheThreeOps) {
  // planrt::matmul_bias_gelu: on the host matmul, bias_add and gelu, with
  // their bits, the pre-activation kept for the backward.
  for (int dtype : {F32, BF16, F16}) {
    SCOPED_TRACE(dtype);
    Tensor *a = random({6, 64}), *b = random({64, 8}), *bias = random({8});
    if (dtype != F32) {
      a = narrowed(a, dtype).first;
      b = narrowed(b, dtype).first;
      bias = narrowed(bias, dtype).first;
    }
    Tensor *prod = make16({6, 8}, dtype), *pre_ref = make16({6, 8}, dtype);
    Tensor *ref = make16({6, 8}, dtype);
    matmul(ctx, a, b, prod, false, false);
    bias_add(ctx, prod, bias, pre_ref);
    gelu(ctx, pre_ref, ref);
    Tensor *pre = make16({6, 8}, dtype), *out = make16({6, 8}, dtype);
    matmul_bias_gelu(ctx, a, b, bias, pre, out, false, false);
    size_t bytes = (size_t)out->numel() * (dtype == F32 ? 4 : 2);
    EXPECT_EQ(std::memcmp(pre->data, pre_ref->data, bytes), 0);
    EXPECT_EQ(std::memcmp(out->data, ref->data, bytes), 0);
  }
  Tensor *a = make({3, 4}), *b = make({4, 5}), *bias = make({5});
  Tensor *pre = make({3, 5});
  EXPECT_DEATH(matmul_bias_gelu(ctx, a, b, bias, pre, pre, false, false),
               "matmul_bias_gelu: out may not alias pre");
  Tensor *sq = make({5, 5});
  EXPECT_DEATH(
      matmul_bias_gelu(ctx, sq, sq, bias, make({5, 5}), sq, false, false),
      "matmul_bias_gelu: out may not alias an input");
  EXPECT_DEATH(
      matmul_bias_gelu(ctx, a, b, bias, pre, make({5, 3}), false, false),
      "matmul_bias_gelu: pre .* and out .* have different shapes");
}

TEST_F(MixedPrecisionTest, MatmulDgeluIsTheTwoOps) {
  // planrt::matmul_dgelu: on the host matmul, then gelu_grad over the
  // product, with their bits.
  for (int dtype : {F32, BF16, F16}) {
    SCOPED_TRACE(dtype);
    Tensor *a = random({6, 64}), *b = random({8, 64}), *pre = random({6, 8});
    if (dtype != F32) {
      a = narrowed(a, dtype).first;
      b = narrowed(b, dtype).first;
      pre = narrowed(pre, dtype).first;
    }
    Tensor *prod = make16({6, 8}, dtype), *ref = make16({6, 8}, dtype);
    matmul(ctx, a, b, prod, false, true);
    gelu_grad(ctx, pre, prod, ref);
    Tensor *dpre = make16({6, 8}, dtype);
    matmul_dgelu(ctx, a, b, pre, dpre, false, true);
    size_t bytes = (size_t)dpre->numel() * (dtype == F32 ? 4 : 2);
    EXPECT_EQ(std::memcmp(dpre->data, ref->data, bytes), 0);
  }
  Tensor *a = make({3, 4}), *b = make({4, 5}), *pre = make({3, 5});
  EXPECT_DEATH(matmul_dgelu(ctx, a, b, pre, pre, false, false),
               "matmul_dgelu: dpre may not alias pre");
  EXPECT_DEATH(matmul_dgelu(ctx, a, b, make({5, 3}), pre, false, false),
               "matmul_dgelu: pre .* and dpre .* have different shapes");
}

TEST_F(MixedPrecisionTest, MatmulBiasGradIsTheTwoOps) {
  // planrt::matmul_bias_grad: on the host matmul (x^T dy), then bias_grad
  // of dy, with their bits; the gradients in dy's type or fp32 (a 16-bit
  // plan's, widened for the fp32 master weights).
  for (int dtype : {F32, BF16, F16})
    for (int gtype : {dtype, int(F32)}) {
      SCOPED_TRACE(::testing::Message() << dtype << " " << gtype);
      Tensor *x = random({12, 16}), *dy = random({12, 8});
      if (dtype != F32) {
        x = narrowed(x, dtype).first;
        dy = narrowed(dy, dtype).first;
      }
      Tensor *cref = make16({16, 8}, gtype), *dbref = make16({8}, gtype);
      matmul(ctx, x, dy, cref, true, false);
      bias_grad(ctx, dy, dbref);
      Tensor *c = make16({16, 8}, gtype), *db = make16({8}, gtype);
      matmul_bias_grad(ctx, x, dy, c, db, true, false);
      const size_t w = gtype == F32 ? 4 : 2;
      EXPECT_EQ(std::memcmp(c->data, cref->data, c->numel() * w), 0);
      EXPECT_EQ(std::memcmp(db->data, dbref->data, db->numel() * w), 0);
      // Accumulating (microbatches): c += x^T dy as matmul_accumulate adds
      // it; db written, not added to.
      matmul_accumulate(ctx, x, dy, cref, true, false);
      matmul_bias_grad_accumulate(ctx, x, dy, c, db, true, false);
      EXPECT_EQ(std::memcmp(c->data, cref->data, c->numel() * w), 0);
      EXPECT_EQ(std::memcmp(db->data, dbref->data, db->numel() * w), 0);
    }
  Tensor *x = make({3, 4}), *dy = make({3, 5}), *c = make({4, 5});
  EXPECT_DEATH(matmul_bias_grad(ctx, x, dy, c, make({4}), true, false),
               "matmul_bias_grad: db must be 1-D of b's last dim: b \\[3, "
               "5\\], db \\[4\\]");
  Tensor *db = make({5});
  EXPECT_DEATH(matmul_bias_grad(ctx, x, dy, c, c, true, false),
               "matmul_bias_grad: db must be 1-D");
  EXPECT_DEATH(matmul_bias_grad(ctx, x, db, c, db, true, false),
               "matmul_bias_grad: db must be 1-D of b's last dim");
}

TEST_F(MixedPrecisionTest, AttentionKeptForCudnnIsAttentionOnTheHost) {
  // planrt::attention_lse and attention_grad_lse (plan-keep-attention, cuda
  // target): where cuDNN does not run them (here, the host) they are
  // attention and attention_grad, with their bits.
  for (int dtype : {F32, BF16}) {
    SCOPED_TRACE(dtype);
    Tensor *qkv = random({2, 8, 128}), *dout = random({2, 8, 64});
    if (dtype != F32) {
      qkv = narrowed(qkv, dtype).first;
      dout = narrowed(dout, dtype).first;
    }
    Tensor *ref = make16({2, 8, 64}, dtype), *out = make16({2, 8, 64}, dtype);
    attention(ctx, qkv, ref, 4, 2);
    Tensor *lse = make({2, 4, 8});
    attention_lse(ctx, qkv, out, lse, 4, 2);
    const size_t w = dtype == F32 ? 4 : 2;
    EXPECT_EQ(std::memcmp(out->data, ref->data, out->numel() * w), 0);
    Tensor *dref = make16({2, 8, 128}, dtype), *d = make16({2, 8, 128}, dtype);
    attention_grad(ctx, qkv, dout, dref, 4, 2);
    attention_grad_lse(ctx, qkv, out, lse, dout, d, 4, 2);
    EXPECT_EQ(std::memcmp(d->data, dref->data, d->numel() * w), 0);
  }
  Tensor *qkv = make({2, 8, 128}), *out = make({2, 8, 64});
  EXPECT_DEATH(attention_lse(ctx, qkv, out, make({2, 8}), 4, 2),
               "attention_lse: lse \\[2, 8\\] must hold one float per row "
               "of each head \\(\\[B, H, S\\] for B 2, H 4, S 8\\)");
  EXPECT_DEATH(attention_grad_lse(ctx, qkv, make({2, 8, 32}), make({2, 4, 8}),
                                  out, make({2, 8, 128}), 4, 2),
               "attention_grad_lse: fwd_out .* and dout .* have different "
               "shapes");
}

TEST_F(MixedPrecisionTest, CpAttentionKeptForCudnnIsAttentionCpOnTheHost) {
  // planrt::attention_cp_lse and attention_cp_grad_lse (all_gather's
  // attention keeping its chunks' log-sum-exps, cuda target): on the host
  // they are attention_cp and attention_cp_grad, with their bits, and the
  // kept buffer is not written. Without a cp axis (-1) the rank's rows are
  // the whole sequence: qkv [2, 8, 128] of 4 heads and 2 kv heads of 16.
  const int64_t lse_floats = workspace::outside::cudnn_cp_lse_floats(2, 4, 8);
  for (int dtype : {F32, BF16}) {
    SCOPED_TRACE(dtype);
    Tensor *qkv = random({2, 8, 128}), *dout = random({2, 8, 64});
    // kv: every position's keys and values (kv_gather's, by hand).
    std::vector<float> q = internal::to_host(ctx, qkv), k;
    for (int64_t r = 0; r < 16; ++r)
      k.insert(k.end(), q.begin() + r * 128 + 64, q.begin() + r * 128 + 128);
    Tensor *kv = make({2, 8, 64});
    internal::from_host(ctx, kv, k);
    if (dtype != F32) {
      qkv = narrowed(qkv, dtype).first;
      dout = narrowed(dout, dtype).first;
      kv = narrowed(kv, dtype).first;
    }
    Tensor *ref = make16({2, 8, 64}, dtype), *out = make16({2, 8, 64}, dtype);
    attention_cp(ctx, qkv, kv, ref, 4, 2, -1);
    Tensor *lse = make({lse_floats});
    fill(ctx, lse, 7.0f);
    attention_cp_lse(ctx, qkv, kv, out, lse, 4, 2, -1);
    const size_t w = dtype == F32 ? 4 : 2;
    EXPECT_EQ(std::memcmp(out->data, ref->data, out->numel() * w), 0);
    for (float v : internal::to_host(ctx, lse))
      ASSERT_EQ(v, 7.0f);
    Tensor *dref = make16({2, 8, 128}, dtype), *d = make16({2, 8, 128}, dtype);
    Tensor *dkv_ref = make({2, 8, 64}), *dkv = make({2, 8, 64});
    // Only dqkv's query columns are written (the rest is kv_reduce_scatter's).
    fill(ctx, dref, 0.0f);
    fill(ctx, d, 0.0f);
    attention_cp_grad(ctx, qkv, kv, dout, dref, dkv_ref, 4, 2, -1);
    attention_cp_grad_lse(ctx, qkv, kv, dout, d, dkv, out, lse, 4, 2, -1);
    EXPECT_EQ(std::memcmp(d->data, dref->data, d->numel() * w), 0);
    EXPECT_EQ(internal::to_host(ctx, dkv), internal::to_host(ctx, dkv_ref));
  }
  Tensor *qkv = make({2, 8, 128}), *kv = make({2, 8, 64}),
         *out = make({2, 8, 64});
  EXPECT_DEATH(attention_cp_lse(ctx, qkv, kv, out, make({2, 4, 7}), 4, 2, -1),
               "attention_cp_lse: lse \\[2, 4, 7\\] must hold 64 floats \\(the "
               "log-sum-exps of the rank's 8 rows, B 2 x H 4, by chunk, "
               "each packed and 16-byte aligned\\)");
  EXPECT_DEATH(attention_cp_grad_lse(ctx, qkv, kv, out, make({2, 8, 128}),
                                     make({2, 8, 64}), make({2, 8, 32}),
                                     make({lse_floats}), 4, 2, -1),
               "attention_cp_grad_lse: fwd_out .* and dout .* have different "
               "shapes");
  EXPECT_DEATH(attention_cp_grad_lse(ctx, qkv, kv, out, make({2, 8, 128}),
                                     make({2, 8, 64}), out, nullptr, 4, 2, -1),
               "attention_cp_grad_lse: fwd_out and lse must be tensors");
}

TEST_F(MixedPrecisionTest, RingKeptIsTheRingsAttention) {
  // planrt::attention_ring_lse and attention_ring_grad_lse: the ring's
  // output, each row's log-sum-exp, and the gradient from them without the
  // forward's ring again, on every backend. Without a cp axis (-1) the
  // ring is one rank's: qkv [2, 8, 128] of 4 heads and 2 kv heads of 16.
  for (int dtype : {F32, BF16}) {
    SCOPED_TRACE(dtype);
    Tensor *qkv = random({2, 8, 128}), *dout = random({2, 8, 64});
    if (dtype != F32) {
      qkv = narrowed(qkv, dtype).first;
      dout = narrowed(dout, dtype).first;
    }
    Tensor *ref = make16({2, 8, 64}, dtype), *out = make16({2, 8, 64}, dtype);
    attention_ring(ctx, qkv, ref, 4, 2, -1);
    Tensor *lse = make({2, 4, 8});
    attention_ring_lse(ctx, qkv, out, lse, 4, 2, -1);
    const size_t w = dtype == F32 ? 4 : 2;
    EXPECT_EQ(std::memcmp(out->data, ref->data, out->numel() * w), 0);
    // Each row's log-sum-exp of its scaled causal scores (1 / sqrt(16)).
    std::vector<float> got = internal::to_host(ctx, lse),
                       x = internal::to_host(ctx, qkv);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t t = 0; t < 8; ++t) {
          double sum = 0;
          for (int64_t j = 0; j <= t; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < 16; ++d)
              dot += double(x[(b * 8 + t) * 128 + h * 16 + d]) *
                     x[(b * 8 + j) * 128 + 64 + (h / 2) * 16 + d];
            sum += std::exp(0.25 * dot);
          }
          const float want = float(std::log(sum));
          ASSERT_NEAR(got[(b * 4 + h) * 8 + t], want,
                      1e-5f * (1 + std::fabs(want)));
        }
    Tensor *dref = make16({2, 8, 128}, dtype), *d = make16({2, 8, 128}, dtype);
    attention_ring_grad(ctx, qkv, dout, dref, 4, 2, -1);
    attention_ring_grad_lse(ctx, qkv, dout, d, out, lse, 4, 2, -1);
    // The statistics from the log-sum-exp (and for 16 bits delta from the
    // rounded output) round differently.
    std::vector<float> dg = internal::to_host(ctx, d),
                       dw = internal::to_host(ctx, dref);
    const float tol = dtype == F32 ? 1e-5f : 2e-2f;
    for (size_t i = 0; i < dg.size(); ++i)
      ASSERT_NEAR(dg[i], dw[i], tol * (1 + std::fabs(dw[i]))) << i;
  }
  Tensor *qkv = make({2, 8, 128}), *out = make({2, 8, 64});
  EXPECT_DEATH(attention_ring_lse(ctx, qkv, out, make({2, 8, 4}), 4, 2, -1),
               "attention_ring_lse: lse \\[2, 8, 4\\] must be \\[2, 4, 8\\] "
               "\\(each of the rank's rows' log-sum-exp: B, H, L\\)");
  EXPECT_DEATH(attention_ring_lse(ctx, qkv, out, nullptr, 4, 2, -1),
               "attention_ring_lse: lse must be a tensor");
  EXPECT_DEATH(attention_ring_grad_lse(ctx, qkv, out, make({2, 8, 128}),
                                       make({2, 8, 32}), make({2, 4, 8}), 4, 2,
                                       -1),
               "attention_ring_grad_lse: fwd_out .* and dout .* have different "
               "shapes");
  EXPECT_DEATH(attention_ring_grad_lse(ctx, qkv, out, make({2, 8, 128}), out,
                                       nullptr, 4, 2, -1),
               "attention_ring_grad_lse: fwd_out and lse must be tensors");
}

TEST_F(MixedPrecisionTest, MatmulBiasChecksItsBias) {
  Tensor *a = make({3, 4}), *b = make({4, 5}), *c = make({3, 5});
  EXPECT_DEATH(matmul_bias(ctx, a, b, make({4}), c, false, false),
               "matmul_bias: the bias must be 1-D, of c's last dim and type: "
               "bias \\[4\\] \\(f32\\), c \\[3, 5\\] \\(f32\\)");
  EXPECT_DEATH(matmul_bias(ctx, a, b, make16({5}, BF16), c, false, false),
               "matmul_bias: the bias must be 1-D, of c's last dim and type");
  EXPECT_DEATH(matmul_bias(ctx, a, make({3, 5}), make({5}), c, false, false),
               "matmul: shape mismatch");
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
