//===- kernels.h - Kernel bodies shared by the host and cuda backends -----===//
//
// Every element-wise or reduction kernel of the runtime is written once here
// as a functor whose call operator handles one index of the kernel's index
// space. The host backend calls it in a plain loop; the cuda backend calls it
// from a grid-stride __global__ kernel. Hence CPU tests exercise exactly the
// arithmetic the GPU runs. All math is fp32 with fp32 accumulation; every
// reduction has a fixed order, so results are deterministic.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_KERNELS_H
#define PLANRT_KERNELS_H

#include "planrt/dtype.h"
#include "planrt/host_dots.h"
#include "planrt/workspace.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#ifdef __CUDACC__
#define PLANRT_HD __host__ __device__
#else
#define PLANRT_HD
#endif

// A host loop whose iterations are independent: vectorized by the compiler
// (OpenMP's simd, which also lets it ignore the pointers' possible overlap).
#if defined(_OPENMP) && !defined(__CUDACC__)
#define PLANRT_SIMD _Pragma("omp simd")
#else
#define PLANRT_SIMD
#endif

namespace planrt {
namespace kernels {

/// Number of elements summed by one partial of a chunked reduction (the
/// memory plan sizes the partials from the same constant).
constexpr int64_t kReduceChunk = workspace::kReduceChunk;

//===--- Storage types ----------------------------------------------------===//
//
// Functors templated on their tensors' storage type T read every value with
// ld (widened exactly to fp32), compute in fp32 and write with st (rounded
// once to nearest even). T = float is the fp32 code (plain loads and
// stores); bf16_t and f16_t are mixed precision's 16-bit tensors, read and
// written in place with the bits that staging them through fp32 copies
// gives (ops_impl.inc; workspace.h native says which ops do).

struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};
PLANRT_HD inline float ld(float v) { return v; }
PLANRT_HD inline float ld(bf16_t v) { return float_from_bf16(v.bits); }
PLANRT_HD inline float ld(f16_t v) { return float_from_f16(v.bits); }
PLANRT_HD inline void st(float &out, float v) { out = v; }
PLANRT_HD inline void st(bf16_t &out, float v) {
  out.bits = bf16_from_float(v);
}
PLANRT_HD inline void st(f16_t &out, float v) { out.bits = f16_from_float(v); }

/// Host: columns [begin, end) of a sum over rows, into 16-bit outputs: each
/// block of columns sums in fp32 registers of its own, in row order, and is
/// stored once. add(r, j0, j1, acc) adds row r's columns [j0, j1) to acc[0..).
template <class Add, class Store>
void column_blocks(int64_t begin, int64_t end, int64_t rows, const Add &add,
                   const Store &store) {
  constexpr int64_t kBlock = 256;
  float acc[kBlock];
  for (int64_t j0 = begin; j0 < end; j0 += kBlock) {
    int64_t j1 = end - j0 < kBlock ? end : j0 + kBlock;
    for (int64_t j = 0; j < j1 - j0; ++j)
      acc[j] = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      add(r, j0, j1, acc);
    store(j0, j1, acc);
  }
}

//===--- Scalar helpers ---------------------------------------------------===//

/// e^x in a few inlinable float operations, so that host loops calling it
/// vectorize (libm's expf is a call per element), within 2 ulp of e^x
/// (kernels_test checks every float it is used on). x = k ln2 + r with
/// |r| <= ln2 / 2 (ln2 split in two so that k ln2 is exact), e^r by its
/// Taylor series to r^7 (the next term is < 1e-8 relative), times 2^k built
/// in the exponent bits. Results below 2^-126 (x < -87.3) are flushed to 0
/// and x > 88.3 gives +inf (e^x overflows a float from 88.72 on); NaN stays
/// NaN. The same code runs on the GPU.
PLANRT_HD inline float exp_f32(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693145751953125f; // 0x3f317200: 16 bits, k ln2hi exact
  const float kLn2Lo = 1.42860676533018e-06f; // ln2 - kLn2Hi
  const float kRound = 12582912.0f; // 1.5 * 2^23: rounds to an integer
  // Selects rather than branches, each condition always evaluated: the
  // loops calling this vectorize (no conditional compare to if-convert).
  float lo = x < -87.3f ? -87.3f : x;
  float xc = lo > 88.3f ? 88.3f : lo;
  // t's low mantissa bits hold k (integer arithmetic on the bits: no
  // float-to-int conversion, whose NaN case would be undefined).
  float t = xc * kLog2e + kRound;
  uint32_t tbits;
  memcpy(&tbits, &t, sizeof(tbits));
  float k = t - kRound;
  float r = (xc - k * kLn2Hi) - k * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  uint32_t bits = (tbits - 0x4B400000u + 127u) << 23; // 2^k
  float scale;
  memcpy(&scale, &bits, sizeof(scale));
  // NaN passes through as NaN (r and p are NaN).
  float y = p * scale;
  float high = x > 88.3f ? INFINITY : y;
  return x < -87.3f ? 0.0f : high;
}

/// tanh(x), inlinable like exp_f32 and within 2 ulp: the Taylor series to
/// x^17 below |x| = 0.55 (the next term is < 1e-8 relative there), else
/// 1 - 2 / (e^{2|x|} + 1), which has no cancellation for tanh >= 0.5.
PLANRT_HD inline float tanh_f32(float x) {
  float a = fabsf(x), z = a * a;
  float q = 6404582.0f / 10854718875.0f;
  q = q * z - 929569.0f / 638512875.0f;
  q = q * z + 21844.0f / 6081075.0f;
  q = q * z - 1382.0f / 155925.0f;
  q = q * z + 62.0f / 2835.0f;
  q = q * z - 17.0f / 315.0f;
  q = q * z + 2.0f / 15.0f;
  q = q * z - 1.0f / 3.0f;
  float small = a + a * (z * q);
  float large = 1.0f - 2.0f / (exp_f32(2.0f * a) + 1.0f);
  return copysignf(a < 0.55f ? small : large, x);
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

/// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
PLANRT_HD inline float gelu_fwd(float x) {
  float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return 0.5f * x * (1.0f + tanh_f32(u));
}

/// d gelu(x) / dx. 1 - t^2 is computed as (1 - t)(1 + t), which keeps its
/// relative accuracy when |t| is close to 1.
PLANRT_HD inline float gelu_deriv(float x) {
  float x2 = x * x;
  float u = kSqrt2OverPi * (x + kGeluCoeff * x2 * x);
  float t = tanh_f32(u);
  float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
  return 0.5f * (1.0f + t) + 0.5f * x * ((1.0f - t) * (1.0f + t)) * du;
}

//===--- Element-wise functors (index space: output elements) -------------===//
//
// Functors marked kElementwise write only index i of their outputs and read
// index i of any input that is also an output (an output may be one of the
// inputs, never shifted against it), so the host runs a range of them as one
// vector loop (host_backend.cpp: launch). Vector instructions round each lane
// like the scalar ones, so the bits are the same. kCheap marks other functors
// whose invocations are a few operations each: the host splits them over
// threads only when there are many (functors with a loop inside are split
// from a few invocations on).

/// Element types of a cast, as planrt::DType numbers them (planrt.h).
enum CastType : int { CastF32 = 0, CastBF16 = 2, CastF16 = 3 };

/// out = in converted between f32, bf16 and f16 (through fp32, rounding to
/// nearest even): mixed precision's casts, and the staging of 16-bit
/// operands into fp32 for the kernels below.
struct CastFn {
  static constexpr bool kElementwise = true;
  const void *in;
  void *out;
  int from, to; // CastType
  PLANRT_HD void operator()(int64_t i) const {
    float v = from == CastF32    ? ((const float *)in)[i]
              : from == CastBF16 ? float_from_bf16(((const uint16_t *)in)[i])
                                 : float_from_f16(((const uint16_t *)in)[i]);
    if (to == CastF32)
      ((float *)out)[i] = v;
    else
      ((uint16_t *)out)[i] =
          to == CastBF16 ? bf16_from_float(v) : f16_from_float(v);
  }
};

template <class T = float> struct BiasAddFn {
  static constexpr bool kElementwise = true;
  const T *x, *b;
  T *out;
  int64_t n; // length of b
  PLANRT_HD void operator()(int64_t i) const {
    st(out[i], ld(x[i]) + ld(b[i % n]));
  }
  /// Host: [begin, end) as rows of b, without a division per element.
  void range(int64_t begin, int64_t end) const {
    const T *xs = x, *bs = b;
    T *os = out;
    for (int64_t i = begin, j = begin % n; i < end; j = 0) {
      int64_t len = n - j < end - i ? n - j : end - i;
      PLANRT_SIMD
      for (int64_t k = 0; k < len; ++k)
        st(os[i + k], ld(xs[i + k]) + ld(bs[j + k]));
      i += len;
    }
  }
};

template <class T = float> struct AddFn {
  static constexpr bool kElementwise = true;
  const T *a, *b;
  T *out;
  PLANRT_HD void operator()(int64_t i) const {
    st(out[i], ld(a[i]) + ld(b[i]));
  }
};

/// GELU, exact form: x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2))).
PLANRT_HD inline float gelu_exact_fwd(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

/// d gelu_exact(x) / dx = Phi(x) + x phi(x).
PLANRT_HD inline float gelu_exact_deriv(float x) {
  float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  float pdf = 0.39894228040143268f * expf(-0.5f * x * x);
  return cdf + x * pdf;
}

/// dpred = 2 * scale * (pred - target).
struct MseGradFn {
  static constexpr bool kElementwise = true;
  const float *pred, *target;
  float *dpred;
  float scale2; // 2 * scale
  PLANRT_HD void operator()(int64_t i) const {
    dpred[i] = scale2 * (pred[i] - target[i]);
  }
};

/// An optimizer update's 16-bit copy of the parameter (planrt.h
/// set_param_copy): the updated value rounded as CastFn rounds it, written
/// in the same pass. Kind 0: none, 1: bf16, 2: f16.
struct ParamCopy {
  uint16_t *bits = nullptr;
  bool f16 = false;
  PLANRT_HD int kind() const { return !bits ? 0 : f16 ? 2 : 1; }
  template <int Kind> PLANRT_HD void store(int64_t i, float w) const {
    if constexpr (Kind == 1)
      bits[i] = bf16_from_float(w);
    else if constexpr (Kind == 2)
      bits[i] = f16_from_float(w);
  }
};

/// body(std::integral_constant<int, kind>) for a ParamCopy's kind: the
/// host's loops test it once, not per element.
template <class Body>
void with_copy_kind(const ParamCopy &c, const Body &body) {
  switch (c.kind()) {
  case 1:
    return body(std::integral_constant<int, 1>());
  case 2:
    return body(std::integral_constant<int, 2>());
  default:
    return body(std::integral_constant<int, 0>());
  }
}

struct SgdFn {
  static constexpr bool kElementwise = true;
  float *w;
  const float *g;
  float lr;
  ParamCopy copy = {};
  template <int Kind> PLANRT_HD void update(int64_t i) const {
    float wi = w[i] - lr * g[i];
    w[i] = wi;
    copy.store<Kind>(i, wi);
  }
  PLANRT_HD void operator()(int64_t i) const {
    switch (copy.kind()) {
    case 1:
      return update<1>(i);
    case 2:
      return update<2>(i);
    default:
      return update<0>(i);
    }
  }
  /// Host: the copy's kind once per range.
  void range(int64_t begin, int64_t end) const {
    const SgdFn a = *this;
    with_copy_kind(copy, [&](auto kind) {
      constexpr int K = decltype(kind)::value;
      PLANRT_SIMD
      for (int64_t i = begin; i < end; ++i)
        a.update<K>(i);
    });
  }
};

/// AdamW (decoupled weight decay, bias-corrected moments). `bc1` and `bc2`
/// are 1 - beta1^t and 1 - beta2^t, computed by the caller in double.
/// With `clip_sumsq`, g is first scaled as ClipFn scales it (not written).
struct AdamWFn {
  static constexpr bool kElementwise = true;
  float *w, *m, *v;
  const float *g;
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2;
  const float *clip_sumsq = nullptr;
  float max_norm = 0.0f;
  ParamCopy copy = {};
  template <int Kind> PLANRT_HD void update_as(int64_t i, float gi) const {
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1;
    float vhat = vi / bc2;
    float wi = w[i];
    wi = wi - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * wi);
    w[i] = wi;
    copy.store<Kind>(i, wi);
  }
  PLANRT_HD void update(int64_t i, float gi) const {
    switch (copy.kind()) {
    case 1:
      return update_as<1>(i, gi);
    case 2:
      return update_as<2>(i, gi);
    default:
      return update_as<0>(i, gi);
    }
  }
  /// ClipFn's factor, or 1 (no scaling) without clipping or when >= 1.
  PLANRT_HD float clip_factor() const {
    if (!clip_sumsq)
      return 1.0f;
    float f = max_norm / (sqrtf(clip_sumsq[0]) + 1e-6f);
    return f < 1.0f ? f : 1.0f;
  }
  PLANRT_HD void operator()(int64_t i) const {
    float f = clip_factor();
    update(i, f < 1.0f ? g[i] * f : g[i]);
  }
  /// Host: the factor and the copy's kind once per range.
  void range(int64_t begin, int64_t end) const {
    const AdamWFn a = *this; // fields in registers
    float f = clip_factor();
    with_copy_kind(copy, [&](auto kind) {
      constexpr int K = decltype(kind)::value;
      if (f < 1.0f) {
        PLANRT_SIMD
        for (int64_t i = begin; i < end; ++i)
          a.update_as<K>(i, a.g[i] * f);
      } else {
        PLANRT_SIMD
        for (int64_t i = begin; i < end; ++i)
          a.update_as<K>(i, a.g[i]);
      }
    });
  }
};

//===--- Reductions -------------------------------------------------------===//

/// db[j] = sum_r dy[r, j]; index space: the n columns. Rows are summed in
/// order.
/// dy of storage type T, db of G (T, or f32 for a fused widening).
template <class T = float, class G = float> struct BiasGradFn {
  const T *dy;
  G *db;
  int64_t rows, n;
  /// cuda: the chunks' partial sums (workspace.h column_partials), or null
  /// when the rows fit in one chunk; the host's loops take none.
  float *partials = nullptr;
  PLANRT_HD void operator()(int64_t j) const {
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      acc += ld(dy[r * n + j]);
    st(db[j], acc);
  }
  /// Host: columns [begin, end) row after row (contiguous reads, one vector
  /// loop per row); each column still sums its rows in order from 0.
  void range(int64_t begin, int64_t end) const {
    if constexpr (std::is_same<G, float>::value) {
      float *out = db;
      for (int64_t j = begin; j < end; ++j)
        out[j] = 0.0f;
      for (int64_t r = 0; r < rows; ++r) {
        const T *row = dy + r * n;
        PLANRT_SIMD
        for (int64_t j = begin; j < end; ++j)
          out[j] += ld(row[j]);
      }
    } else {
      column_blocks(
          begin, end, rows,
          [&](int64_t r, int64_t j0, int64_t j1, float *acc) {
            const T *row = dy + r * n;
            PLANRT_SIMD
            for (int64_t j = j0; j < j1; ++j)
              acc[j - j0] += ld(row[j]);
          },
          [&](int64_t j0, int64_t j1, const float *acc) {
            for (int64_t j = j0; j < j1; ++j)
              st(db[j], acc[j - j0]);
          });
    }
  }
};

/// partial[c] = sum of (pred - target)^2 over chunk c of kReduceChunk
/// elements; index space: the chunks.
struct SqDiffPartialFn {
  const float *pred, *target;
  float *partial;
  int64_t n;
  PLANRT_HD void operator()(int64_t c) const {
    int64_t begin = c * kReduceChunk;
    int64_t end = begin + kReduceChunk < n ? begin + kReduceChunk : n;
    float acc = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      float d = pred[i] - target[i];
      acc += d * d;
    }
    partial[c] = acc;
  }
};

/// out[0] = scale * sum(partial[0..count)); index space: one element.
struct ScaledSumFn {
  const float *partial;
  float *out;
  int64_t count;
  float scale;
  PLANRT_HD void operator()(int64_t) const {
    float acc = 0.0f;
    for (int64_t c = 0; c < count; ++c)
      acc += partial[c];
    out[0] = scale * acc;
  }
};

//===--- More scalar helpers ----------------------------------------------===//

/// Logistic sigmoid; exp of a non-positive argument only, so no overflow.
PLANRT_HD inline float sigmoid(float x) {
  if (x >= 0.0f)
    return 1.0f / (1.0f + exp_f32(-x));
  float e = exp_f32(x);
  return e / (1.0f + e);
}

//===--- Activations: value and derivative, mapped elementwise ------------===//

/// out = A::value(x), elementwise.
template <class A, class T = float> struct MapFn {
  static constexpr bool kElementwise = true;
  const T *x;
  T *out;
  PLANRT_HD void operator()(int64_t i) const { st(out[i], A::value(ld(x[i]))); }
};

/// dx = dy * A::deriv(x), elementwise.
template <class A, class T = float> struct MapGradFn {
  static constexpr bool kElementwise = true;
  const T *x, *dy;
  T *dx;
  PLANRT_HD void operator()(int64_t i) const {
    st(dx[i], ld(dy[i]) * A::deriv(ld(x[i])));
  }
};

struct Relu {
  static PLANRT_HD float value(float x) { return x > 0.0f ? x : 0.0f; }
  static PLANRT_HD float deriv(float x) { return x > 0.0f ? 1.0f : 0.0f; }
};
struct GeluTanh {
  static PLANRT_HD float value(float x) { return gelu_fwd(x); }
  static PLANRT_HD float deriv(float x) { return gelu_deriv(x); }
};
struct GeluErf {
  static PLANRT_HD float value(float x) { return gelu_exact_fwd(x); }
  static PLANRT_HD float deriv(float x) { return gelu_exact_deriv(x); }
};
/// silu(x) = x s, d silu / dx = s + x s (1 - s), s = sigmoid(x).
struct Silu {
  static PLANRT_HD float value(float x) { return x * sigmoid(x); }
  static PLANRT_HD float deriv(float x) {
    float s = sigmoid(x);
    return s + x * s * (1.0f - s);
  }
};

using ReluFn = MapFn<Relu>;
using ReluGradFn = MapGradFn<Relu>;
using GeluFn = MapFn<GeluTanh>;
using GeluGradFn = MapGradFn<GeluTanh>;
using GeluExactFn = MapFn<GeluErf>;
using GeluExactGradFn = MapGradFn<GeluErf>;
using SiluFn = MapFn<Silu>;
using SiluGradFn = MapGradFn<Silu>;

/// sum_i term(i) over [0, n) in eight interleaved partial sums (term i goes
/// to sum i % 8) added pairwise at the end: a fixed order, the same on every
/// backend and thread count, that vectorizes and does not wait on one add
/// chain (attention's q.k and dout.v over the head dim were latency-bound).
template <class Term> PLANRT_HD inline float sum8(int64_t n, const Term &term) {
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l)
      acc[l] += term(i + l);
  for (int l = 0; i + l < n; ++l)
    acc[l] += term(i + l);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
         ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

template <class A = float, class B = A> struct ProductTerm {
  const A *a;
  const B *b;
  PLANRT_HD float operator()(int64_t i) const { return ld(a[i]) * ld(b[i]); }
};
struct ValueTerm {
  const float *a;
  PLANRT_HD float operator()(int64_t i) const { return a[i]; }
};

/// sum_i a[i] b[i] in sum8's order.
PLANRT_HD inline float dot(const float *a, const float *b, int64_t n) {
  return sum8(n, ProductTerm<>{a, b});
}
/// The same over values of storage types A and B, widened.
template <class A, class B>
PLANRT_HD inline float dot(const A *a, const B *b, int64_t n) {
  return sum8(n, ProductTerm<A, B>{a, b});
}

PLANRT_HD inline float row_max(const float *x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i)
    m = x[i] > m ? x[i] : m;
  return m;
}

/// Records a bad index in an error flag (flag[0] = 1, flag[1] = the value);
/// the op checks the flag after the kernel. Racing writers all store 1.
PLANRT_HD inline void flag_bad_index(int *flag, int32_t value) {
  flag[0] = 1;
  flag[1] = value;
}

//===--- More element-wise functors ---------------------------------------===//

template <class T = float> struct MulFn {
  static constexpr bool kElementwise = true;
  const T *a, *b;
  T *out;
  PLANRT_HD void operator()(int64_t i) const {
    st(out[i], ld(a[i]) * ld(b[i]));
  }
};

template <class T = float> struct SubFn {
  static constexpr bool kElementwise = true;
  const T *a, *b;
  T *out;
  PLANRT_HD void operator()(int64_t i) const {
    st(out[i], ld(a[i]) - ld(b[i]));
  }
};

template <class T = float> struct ScaleFn {
  static constexpr bool kElementwise = true;
  const T *x;
  T *out;
  float factor;
  PLANRT_HD void operator()(int64_t i) const { st(out[i], factor * ld(x[i])); }
};

/// Context parallelism's layout of a sequence split over G ranks: it is cut
/// into 2 G chunks of c = local / 2 positions and rank g holds chunks g and
/// 2 G - 1 - g, so that every rank has as much causal-attention work (early
/// positions attend to few keys, late ones to many). G = 1: the whole
/// sequence in order.
struct SeqPart {
  int64_t g = 0, G = 1;
  /// The global position of local row t of `local` rows.
  PLANRT_HD int64_t position(int64_t t, int64_t local) const {
    if (G <= 1)
      return t;
    int64_t c = local / 2;
    return t < c ? g * c + t : (2 * G - 1 - g) * c + (t - c);
  }
  /// The rank holding position p (of parts of `local` rows) and its row.
  PLANRT_HD void owner(int64_t p, int64_t local, int64_t *rank,
                       int64_t *row) const {
    if (G <= 1) {
      *rank = 0;
      *row = p;
      return;
    }
    int64_t c = local / 2, k = p / c;
    *rank = k < G ? k : 2 * G - 1 - k;
    *row = k < G ? p - k * c : c + p - k * c;
  }
  /// This rank's row of position p, or -1 when another rank holds it.
  PLANRT_HD int64_t local_row(int64_t p, int64_t local) const {
    int64_t r, t;
    owner(p, local, &r, &t);
    return r == g ? t : -1;
  }
};

/// Rotary position embedding (plan.rope) of packed qkv viewed as rows of
/// `width` = (H + 2 KV) Dh, `seq` rows per sequence: the first `rotated` =
/// (H + KV) Dh columns (query and key heads) are rotated in Llama's
/// rotate-half convention by a = pos theta^(-2k / Dh), k the index within
/// the head's half; value heads are copied. `sign` -1 rotates by -a (the
/// gradient). The angle is computed in double from (pos, k) alone, so every
/// plan and both backends use the same rotation. out must not alias x.
template <class T = float> struct RopeFn {
  static constexpr bool kElementwise = true;
  const T *x;
  T *out;
  int64_t seq, width, head_dim, rotated;
  double log_theta;
  float sign;
  SeqPart part = {}; // the rows' positions (context parallelism)
  PLANRT_HD void operator()(int64_t i) const {
    int64_t col = i % width;
    if (col >= rotated) {
      st(out[i], ld(x[i]));
      return;
    }
    int64_t pos = part.position((i / width) % seq, seq), half = head_dim / 2;
    int64_t j = col % head_dim, k = j % half;
    double a = double(pos) * exp(-log_theta * double(2 * k) / double(head_dim));
    float c = float(cos(a)), s = sign * float(sin(a));
    float v = ld(x[i]);
    if (j < half)
      st(out[i], v * c - ld(x[i + half]) * s);
    else
      st(out[i], v * c + ld(x[i - half]) * s);
  }
};

struct FillFn {
  static constexpr bool kElementwise = true;
  float *t;
  float value;
  PLANRT_HD void operator()(int64_t i) const { t[i] = value; }
};

struct FillI32Fn {
  static constexpr bool kElementwise = true;
  int32_t *t;
  int32_t value;
  PLANRT_HD void operator()(int64_t i) const { t[i] = value; }
};

/// out[r, c] = x[r, c] + table[position of r % S, c] for x viewed as
/// [B * S, C].
template <class T = float> struct PosEmbeddingFn {
  static constexpr bool kElementwise = true;
  const T *x, *table;
  T *out;
  int64_t S, C;
  SeqPart part = {};
  PLANRT_HD void operator()(int64_t i) const {
    int64_t s = part.position((i / C) % S, S);
    st(out[i], ld(x[i]) + ld(table[s * C + i % C]));
  }
};

/// A vocabulary split over ranks: the local table holds global rows
/// [row0, row0 + V) of a table of Vg rows (row0 = 0, Vg = V when whole).
/// Ids outside [0, Vg) are errors; ids outside the local rows belong to
/// another rank.
struct VocabSlice {
  int64_t V, row0, Vg;
  PLANRT_HD bool valid(int32_t id) const { return id >= 0 && id < Vg; }
  /// Local row of `id`, or -1 if another rank owns it.
  PLANRT_HD int64_t local(int32_t id) const {
    int64_t l = (int64_t)id - row0;
    return l >= 0 && l < V ? l : -1;
  }
};

/// out[r, :] = table[ids[r] - row0, :] if this rank owns ids[r], else 0;
/// index space: rows * C.
template <class T = float> struct EmbeddingFn {
  static constexpr bool kCheap = true;
  const int32_t *ids;
  const T *table;
  T *out;
  VocabSlice vocab;
  int64_t C;
  int *flag;
  PLANRT_HD void operator()(int64_t i) const {
    int32_t id = ids[i / C];
    if (!vocab.valid(id))
      flag_bad_index(flag, id);
    int64_t l = vocab.valid(id) ? vocab.local(id) : -1;
    st(out[i], l >= 0 ? ld(table[l * C + i % C]) : 0.0f);
  }
};

/// g *= min(1, max_norm / (sqrt(sumsq) + 1e-6)); sumsq is read on the device.
struct ClipFn {
  static constexpr bool kElementwise = true;
  float *g;
  const float *sumsq;
  float max_norm;
  PLANRT_HD void operator()(int64_t i) const {
    float f = max_norm / (sqrtf(sumsq[0]) + 1e-6f);
    if (f < 1.0f)
      g[i] *= f;
  }
  /// Host: the factor once per range, no pass at all when it is >= 1.
  void range(int64_t begin, int64_t end) const {
    float f = max_norm / (sqrtf(sumsq[0]) + 1e-6f);
    if (!(f < 1.0f))
      return;
    float *gs = g;
    PLANRT_SIMD
    for (int64_t i = begin; i < end; ++i)
      gs[i] *= f;
  }
};

//===--- Row-wise functors (index space: rows of [rows, C]) ---------------===//

struct SoftmaxFn {
  const float *x;
  float *out;
  int64_t C;
  PLANRT_HD void operator()(int64_t r) const {
    const float *xr = x + r * C;
    float *o = out + r * C;
    float m = row_max(xr, C), sum = 0.0f;
    for (int64_t j = 0; j < C; ++j) {
      float e = exp_f32(xr[j] - m);
      o[j] = e;
      sum += e;
    }
    float inv = 1.0f / sum;
    for (int64_t j = 0; j < C; ++j)
      o[j] *= inv;
  }
};

/// dx = y * (dy - sum(y * dy)).
struct SoftmaxGradFn {
  const float *y, *dy;
  float *dx;
  int64_t C;
  PLANRT_HD void operator()(int64_t r) const {
    const float *yr = y + r * C, *dyr = dy + r * C;
    float s = dot(yr, dyr, C);
    for (int64_t j = 0; j < C; ++j)
      dx[r * C + j] = yr[j] * (dyr[j] - s);
  }
};

/// The statistics of a norm's row xr: mean (`centered`, LayerNorm; 0 for
/// RMSNorm) and rstd = 1 / sqrt(var + eps) (var = mean of squares for
/// RMSNorm). The output and the input gradient compute them per row, so a
/// row is read from memory once for both.
template <class T>
PLANRT_HD void norm_row_stats(const T *xr, int64_t C, bool centered, float eps,
                              float &mu, float &rs) {
  mu = 0.0f;
  if (centered) {
    for (int64_t j = 0; j < C; ++j)
      mu += ld(xr[j]);
    mu /= (float)C;
  }
  float var = 0.0f;
  for (int64_t j = 0; j < C; ++j) {
    float d = ld(xr[j]) - mu;
    var += d * d;
  }
  var /= (float)C;
  rs = 1.0f / sqrtf(var + eps);
}

/// out = (x - mean) * rstd * gamma + beta, with row r's statistics
/// (norm_row_stats; beta null for RMSNorm, which has no mean).
template <class T = float> struct NormFn {
  const T *x, *gamma, *beta;
  T *out;
  int64_t C;
  float eps;
  PLANRT_HD void operator()(int64_t r) const {
    float mu, rs;
    norm_row_stats(x + r * C, C, beta != nullptr, eps, mu, rs);
    for (int64_t j = 0; j < C; ++j) {
      float y = (ld(x[r * C + j]) - mu) * rs * ld(gamma[j]);
      st(out[r * C + j], beta ? y + ld(beta[j]) : y);
    }
  }
};

/// dx of LayerNorm (mean non-null): rstd (g dy - mean(g dy) - xhat
/// mean(g dy xhat)); of RMSNorm (mean null): rstd (g dy - xhat mean(g dy
/// xhat)), xhat = (x - mean) * rstd. Row r's statistics are computed here
/// and stored in mean[r] and rstd[r] for the parameters' gradients
/// (NormGradParamFn). With `plus` (the residual stream's gradient, of dx's
/// type), dx = plus + that, rounded once.
template <class T = float> struct NormGradXFn {
  const T *x, *gamma, *dout, *plus;
  float *mean, *rstd;
  T *dx;
  int64_t C;
  float eps;
  PLANRT_HD void operator()(int64_t r) const {
    const T *xr = x + r * C, *dyr = dout + r * C;
    float mu, rs;
    norm_row_stats(xr, C, mean != nullptr, eps, mu, rs);
    if (mean)
      mean[r] = mu;
    rstd[r] = rs;
    float a = 0.0f, b = 0.0f;
    for (int64_t j = 0; j < C; ++j) {
      float gd = ld(gamma[j]) * ld(dyr[j]);
      a += gd;
      b += gd * (ld(xr[j]) - mu) * rs;
    }
    a = mean ? a / (float)C : 0.0f;
    b /= (float)C;
    for (int64_t j = 0; j < C; ++j) {
      float xhat = (ld(xr[j]) - mu) * rs;
      float v = rs * (ld(gamma[j]) * ld(dyr[j]) - a - xhat * b);
      st(dx[r * C + j], plus ? v + ld(plus[r * C + j]) : v);
    }
  }
};

/// dgamma[j] = sum_r dout[r, j] xhat[r, j], dbeta[j] = sum_r dout[r, j]
/// (dbeta may be null); index space: the C columns, rows summed in order.
/// G: the gradients' storage (T, or f32 for a fused widening).
template <class T = float, class G = T> struct NormGradParamFn {
  const T *x, *dout;
  const float *mean, *rstd;
  G *dgamma, *dbeta;
  int64_t rows, C;
  /// cuda: the chunks' partial sums, as BiasGradFn's.
  float *partials = nullptr;
  PLANRT_HD void operator()(int64_t j) const {
    float dg = 0.0f, db = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      float mu = mean ? mean[r] : 0.0f;
      float dy = ld(dout[r * C + j]);
      dg += dy * (ld(x[r * C + j]) - mu) * rstd[r];
      db += dy;
    }
    st(dgamma[j], dg);
    if (dbeta)
      st(dbeta[j], db);
  }
  /// Host: columns [begin, end) row after row, the same sums in the same
  /// order as the call operator.
  void range(int64_t begin, int64_t end) const {
    if constexpr (!std::is_same<T, float>::value) {
      // 16-bit outputs: the sums in fp32 blocks, stored once.
      for (G *out : {dgamma, dbeta}) {
        if (!out)
          continue;
        const bool gamma = out == dgamma;
        column_blocks(
            begin, end, rows,
            [&](int64_t r, int64_t j0, int64_t j1, float *acc) {
              float mu = mean ? mean[r] : 0.0f, rs = rstd[r];
              const T *dyr = dout + r * C, *xr = x + r * C;
              if (gamma) {
                PLANRT_SIMD
                for (int64_t j = j0; j < j1; ++j)
                  acc[j - j0] += ld(dyr[j]) * (ld(xr[j]) - mu) * rs;
              } else {
                PLANRT_SIMD
                for (int64_t j = j0; j < j1; ++j)
                  acc[j - j0] += ld(dyr[j]);
              }
            },
            [&](int64_t j0, int64_t j1, const float *acc) {
              for (int64_t j = j0; j < j1; ++j)
                st(out[j], acc[j - j0]);
            });
      }
    } else {
      float *dg = dgamma, *db = dbeta;
      for (int64_t j = begin; j < end; ++j) {
        dg[j] = 0.0f;
        if (db)
          db[j] = 0.0f;
      }
      for (int64_t r = 0; r < rows; ++r) {
        float mu = mean ? mean[r] : 0.0f, rs = rstd[r];
        const float *dyr = dout + r * C, *xr = x + r * C;
        PLANRT_SIMD
        for (int64_t j = begin; j < end; ++j)
          dg[j] += dyr[j] * (xr[j] - mu) * rs;
        if (db) {
          PLANRT_SIMD
          for (int64_t j = begin; j < end; ++j)
            db[j] += dyr[j];
        }
      }
    }
  }
};

/// loss[r] = logsumexp(logits[r]) - logits[r, targets[r]].
/// Classes from `valid` on (vocabulary padding) take no part.
struct CrossEntropyFn {
  const float *logits;
  const int32_t *targets;
  float *loss;
  int64_t C, valid;
  int *flag;
  PLANRT_HD void operator()(int64_t r) const {
    int32_t t = targets[r];
    if (t < 0 || t >= valid) {
      flag_bad_index(flag, t);
      loss[r] = 0.0f;
      return;
    }
    const float *xr = logits + r * C;
    float m = row_max(xr, valid), sum = 0.0f;
    for (int64_t j = 0; j < valid; ++j)
      sum += exp_f32(xr[j] - m);
    loss[r] = m + logf(sum) - xr[t];
  }
};

/// correct[r] = 1 when the row's first maximum among the valid classes is
/// its target, else 0; index space: rows.
struct ArgmaxCorrectFn {
  const float *logits;
  const int32_t *targets;
  float *correct;
  int64_t c, valid;
  PLANRT_HD void operator()(int64_t r) const {
    const float *xr = logits + r * c;
    int64_t best = 0;
    for (int64_t j = 1; j < valid; ++j)
      if (xr[j] > xr[best])
        best = j;
    correct[r] = best == targets[r] ? 1.0f : 0.0f;
  }
};

/// dlogits[r] = scale * (softmax(logits[r]) - onehot(targets[r])).
/// fp32 logits; dlogits of storage type G (f32, or the bf16 a fused
/// narrowing wants: plan-fuse-casts).
template <class G = float> struct CrossEntropyGradFn {
  const float *logits;
  const int32_t *targets;
  G *dlogits;
  int64_t C, valid;
  float scale;
  int *flag;
  PLANRT_HD void operator()(int64_t r) const {
    int32_t t = targets[r];
    const float *xr = logits + r * C;
    G *d = dlogits + r * C;
    for (int64_t j = valid; j < C; ++j)
      st(d[j], 0.0f);
    if (t < 0 || t >= valid) {
      flag_bad_index(flag, t);
      for (int64_t j = 0; j < valid; ++j)
        st(d[j], 0.0f);
      return;
    }
    float m = row_max(xr, valid), sum = 0.0f;
    if constexpr (std::is_same<G, float>::value) {
      for (int64_t j = 0; j < valid; ++j) {
        float e = exp_f32(xr[j] - m);
        d[j] = e;
        sum += e;
      }
      float inv = scale / sum;
      for (int64_t j = 0; j < valid; ++j)
        d[j] *= inv;
      d[t] -= scale;
    } else {
      // 16 bits: the exponentials again instead of re-reading rounded
      // ones; each value as the fp32 code computes it, rounded once.
      for (int64_t j = 0; j < valid; ++j)
        sum += exp_f32(xr[j] - m);
      float inv = scale / sum;
      for (int64_t j = 0; j < valid; ++j) {
        float v = exp_f32(xr[j] - m) * inv;
        st(d[j], j == t ? v - scale : v);
      }
    }
  }
};

/// Cross-entropy's loss and gradient in one pass per row, the gradient
/// written over the logits (planrt::cross_entropy_in_place): loss[r] as
/// CrossEntropyFn computes it, then logits[r] = scale * (softmax(logits[r])
/// - onehot(targets[r])) as CrossEntropyGradFn computes it, every value from
/// the row as it was. Logits of storage type T (f32, or 16 bits: the
/// softmax's statistics in fp32 from the widened values, each gradient value
/// rounded once), so the bits of cross_entropy and cross_entropy_grad on the
/// widened logits.
template <class T = float> struct CrossEntropyInPlaceFn {
  T *logits;
  const int32_t *targets;
  float *loss;
  int64_t C, valid;
  float scale;
  int *flag;
  PLANRT_HD void operator()(int64_t r) const {
    int32_t t = targets[r];
    T *xr = logits + r * C;
    for (int64_t j = valid; j < C; ++j)
      st(xr[j], 0.0f);
    if (t < 0 || t >= valid) {
      flag_bad_index(flag, t);
      loss[r] = 0.0f;
      for (int64_t j = 0; j < valid; ++j)
        st(xr[j], 0.0f);
      return;
    }
    float m = ld(xr[0]), sum = 0.0f;
    for (int64_t j = 1; j < valid; ++j)
      m = ld(xr[j]) > m ? ld(xr[j]) : m;
    for (int64_t j = 0; j < valid; ++j)
      sum += exp_f32(ld(xr[j]) - m);
    loss[r] = m + logf(sum) - ld(xr[t]);
    float inv = scale / sum;
    for (int64_t j = 0; j < valid; ++j) {
      float v = exp_f32(ld(xr[j]) - m) * inv;
      st(xr[j], j == t ? v - scale : v);
    }
  }
};

//===--- Cross-entropy over a split vocabulary ----------------------------===//
//
// With the vocabulary (last dim of the logits) split over ranks, each rank
// holds C columns starting at global column `vocab.row0`. The row max and
// the two row statistics below are combined across ranks by collectives
// between the kernels; with a whole vocabulary they reproduce
// CrossEntropyFn / CrossEntropyGradFn operation for operation.

/// out[r] = max_j x[r, j]; index space: rows.
struct RowMaxFn {
  const float *x;
  float *out;
  int64_t C;
  PLANRT_HD void operator()(int64_t r) const { out[r] = row_max(x + r * C, C); }
};

/// stats[r, 0] = sum_j exp(logits[r, j] - rowmax[r]); stats[r, 1] =
/// logits[r, t - row0] if this rank owns target t, else 0. Index space: rows.
struct CeStatsFn {
  const float *logits, *rowmax;
  const int32_t *targets;
  float *stats;
  VocabSlice vocab;
  int64_t valid; // global classes from `valid` on take no part
  int *flag;
  PLANRT_HD void operator()(int64_t r) const {
    const float *xr = logits + r * vocab.V;
    float m = rowmax[r], sum = 0.0f;
    for (int64_t j = 0; j < vocab.V && vocab.row0 + j < valid; ++j)
      sum += exp_f32(xr[j] - m);
    int32_t t = targets[r];
    bool ok = vocab.valid(t) && t < valid;
    if (!ok)
      flag_bad_index(flag, t);
    int64_t l = ok ? vocab.local(t) : -1;
    stats[2 * r] = sum;
    stats[2 * r + 1] = l >= 0 ? xr[l] : 0.0f;
  }
};

/// loss[r] = rowmax[r] + log(stats[r, 0]) - stats[r, 1]; index space: rows.
struct CeRowLossFn {
  const float *stats, *rowmax;
  float *loss;
  PLANRT_HD void operator()(int64_t r) const {
    loss[r] = rowmax[r] + logf(stats[2 * r]) - stats[2 * r + 1];
  }
};

/// correct[r] = 1 when the target's logit stats[r, 1] is the row's maximum
/// over the split vocabulary (a classifier's accuracy without the whole
/// logits; a tie with another class counts as right), else 0; index space:
/// rows.
struct TargetIsMaxFn {
  const float *stats, *rowmax;
  float *correct;
  PLANRT_HD void operator()(int64_t r) const {
    correct[r] = stats[2 * r + 1] >= rowmax[r] ? 1.0f : 0.0f;
  }
};

/// dlogits[r] = scale * (exp(logits[r] - rowmax[r]) / stats[r, 0] -
/// onehot(owned target)); index space: rows.
/// dlogits of storage type G, as CrossEntropyGradFn's.
template <class G = float> struct CeGradFn {
  const float *logits, *rowmax, *stats;
  const int32_t *targets;
  G *dlogits;
  VocabSlice vocab;
  int64_t valid; // global classes from `valid` on take no part
  float scale;
  int *flag;
  PLANRT_HD void operator()(int64_t r) const {
    int64_t C = vocab.V;
    const float *xr = logits + r * C;
    G *d = dlogits + r * C;
    float m = rowmax[r], inv = scale / stats[2 * r];
    int32_t t = targets[r];
    int64_t l = -1; // the target's local column, if this rank owns it
    if (!vocab.valid(t) || t >= valid)
      flag_bad_index(flag, t);
    else
      l = vocab.local(t);
    for (int64_t j = 0; j < C; ++j) {
      float v = vocab.row0 + j < valid ? exp_f32(xr[j] - m) * inv : 0.0f;
      st(d[j], j == l ? v - scale : v);
    }
  }
};

//===--- Blocks along one dimension (collectives) -------------------------===//
//
// A tensor is viewed around one dimension as [outer, D, inner]. Collectives
// move contiguous blocks, so a tensor split along a dimension other than the
// outermost is packed into (or unpacked from) G contiguous blocks
// [G][outer, Db, inner], D = G * Db.

/// dst[i] = src[i].
struct CopyFn {
  static constexpr bool kElementwise = true;
  const float *src;
  float *dst;
  PLANRT_HD void operator()(int64_t i) const { dst[i] = src[i]; }
};

/// Host: to[0..len) = from[0..len), one vector loop (the block copies'
/// contiguous runs).
template <class T> inline void copy_run(T *to, const T *from, int64_t len) {
  PLANRT_SIMD
  for (int64_t x = 0; x < len; ++x)
    to[x] = from[x];
}

/// dst = blocks first, first + 1, ... of src [outer, D, inner] along the
/// middle dim, each stored contiguously as [outer, Db, inner]; index space:
/// dst elements (a multiple of outer * Db * inner). T: any storage type
/// (a move: 16-bit values are copied as they are, never converted).
template <class T = float> struct SplitBlocksFn {
  static constexpr bool kElementwise = true;
  const T *src;
  T *dst;
  int64_t outer, D, Db, inner, first;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t per = outer * Db * inner, k = i / per, r = i % per;
    int64_t o = r / (Db * inner), d = (r / inner) % Db, e = r % inner;
    dst[i] = src[(o * D + (first + k) * Db + d) * inner + e];
  }
  /// Host: the same copy by runs of Db * inner contiguous elements (one
  /// division per run instead of five per element).
  void range(int64_t begin, int64_t end) const {
    int64_t blk = Db * inner, per = outer * blk;
    for (int64_t i = begin; i < end;) {
      int64_t k = i / per, r = i % per, o = r / blk, off = r % blk;
      int64_t len = blk - off < end - i ? blk - off : end - i;
      copy_run(dst + i, src + (o * D + (first + k) * Db) * inner + off, len);
      i += len;
    }
  }
};

/// dst [outer, G * Db, inner] from G contiguous blocks src[k] [outer, Db,
/// inner] placed at k * Db along the middle dim; index space: dst elements.
template <class T = float> struct MergeBlocksFn {
  static constexpr bool kElementwise = true;
  const T *src;
  T *dst;
  int64_t outer, Db, inner, G;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t e = i % inner, t = i / inner;
    int64_t dd = t % (G * Db), o = t / (G * Db);
    int64_t k = dd / Db, d = dd % Db;
    dst[i] = src[((k * outer + o) * Db + d) * inner + e];
  }
  /// Host: the same copy by runs of Db * inner contiguous elements.
  void range(int64_t begin, int64_t end) const {
    int64_t blk = Db * inner;
    for (int64_t i = begin; i < end;) {
      int64_t q = i / blk, off = i % blk, o = q / G, k = q % G;
      int64_t len = blk - off < end - i ? blk - off : end - i;
      copy_run(dst + i, src + (k * outer + o) * blk + off, len);
      i += len;
    }
  }
};

//===--- Column reductions (index space: columns) -------------------------===//

/// dtable[ids[r], c] += dout[r, c] for r in order; index space: the C
/// columns, so every column is owned by one invocation (deterministic, no
/// atomics). dtable must be zero beforehand. The cuda backend splits each
/// column's owner further, by ranges of table rows (lib/cuda/embedding.cu).
template <class T = float> struct EmbeddingGradColumnFn {
  const int32_t *ids;
  const T *dout;
  float *dtable;
  int64_t rows;
  VocabSlice vocab;
  int64_t C;
  int *flag;
  PLANRT_HD void operator()(int64_t c) const { range(c, c + 1); }
  /// Columns [begin, end) row after row (the host's threads take ranges);
  /// each table element takes its rows' additions in row order.
  PLANRT_HD void range(int64_t begin, int64_t end) const {
    for (int64_t r = 0; r < rows; ++r) {
      int32_t id = ids[r];
      if (!vocab.valid(id)) {
        flag_bad_index(flag, id);
        continue;
      }
      int64_t l = vocab.local(id);
      if (l < 0)
        continue;
      float *dst = dtable + l * C;
      const T *src = dout + r * C;
      PLANRT_SIMD
      for (int64_t c = begin; c < end; ++c)
        dst[c] += ld(src[c]);
    }
  }
};

/// dtable[p, c] = sum_b dout[b, s, c] for the local row s at position p,
/// 0 for positions no local row holds; index space: T * C (all of dtable).
/// dout of storage type T, dtable of G (T, or f32 for a fused widening).
template <class T = float, class G = float> struct PosEmbeddingGradFn {
  static constexpr bool kElementwise = true;
  const T *dout;
  G *dtable;
  int64_t B, S, C;
  SeqPart part = {};
  PLANRT_HD void operator()(int64_t i) const {
    int64_t p = i / C, c = i % C;
    int64_t s = p < S * part.G ? part.local_row(p, S) : -1;
    float acc = 0.0f;
    if (s >= 0)
      for (int64_t b = 0; b < B; ++b)
        acc += ld(dout[(b * S + s) * C + c]);
    st(dtable[i], acc);
  }
};

//===--- Attention --------------------------------------------------------===//
//
// qkv is [B, S, W] with W = (H + 2 KV) D: query head h at columns h D, key
// head g at (H + g) D, value head g at (H + KV + g) D. Query head h reads kv
// head h / (H / KV). Row-statistics arrays are indexed ((b H + h) S + t).

/// A 64-bit mix (splitmix64's finalizer): dropout's masks.
PLANRT_HD inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Attention-probability dropout (attention(..., dropout = p)), as GPT-3
/// and Megatron train: query t of head h keeps key u's probability, scaled
/// by 1 / (1 - p), when mix(key, its index in the global [B, H, S, S]
/// probabilities) >= threshold. That is dropout()'s rule for a tensor of
/// that shape, so every plan (batch split over ranks and microbatches,
/// heads over tp, recompute) draws the same mask. b0 and h0 place the
/// problem's batch row 0 and head 0 in the global tensor. The softmax's
/// max and sum are those of the undropped scores, as in PyTorch: only the
/// weights of the values (and their gradients) see the mask.
struct AttnDropout {
  bool on = false;
  uint64_t key = 0;
  uint32_t threshold = 0;
  float scale = 1.0f;
  int64_t b0 = 0, Bg = 1, h0 = 0, Hg = 1;
  /// The mask of probability p (0 < p < 1) and key for a problem at batch
  /// row b0 of Bg and head h0 of Hg.
  static AttnDropout make(float p, uint64_t key, int64_t b0, int64_t Bg,
                          int64_t h0, int64_t Hg) {
    AttnDropout d;
    d.on = true;
    d.key = key;
    const double t = (double)p * 4294967296.0;
    d.threshold = (uint32_t)(t < 4294967295.0 ? t : 4294967295.0);
    d.scale = 1.0f / (1.0f - p);
    d.b0 = b0;
    d.Bg = Bg;
    d.h0 = h0;
    d.Hg = Hg;
    return d;
  }
  /// 1 / (1 - p) or 0 for query t and key u of (b, h), S positions.
  PLANRT_HD float z(int64_t b, int64_t h, int64_t S, int64_t t,
                    int64_t u) const {
    const int64_t g = (((b0 + b) * Hg + (h0 + h)) * S + t) * S + u;
    const uint32_t x = (uint32_t)(mix64(key ^ mix64((uint64_t)g)) >> 32);
    return x >= threshold ? scale : 0.0f;
  }
  /// The mask of the problem whose batch row 0 and head 0 are this one's
  /// (b, h) (the host's per-head subproblems).
  AttnDropout at(int64_t b, int64_t h) const {
    AttnDropout d = *this;
    d.b0 += b;
    d.h0 += h;
    return d;
  }
};

struct AttnShape {
  int64_t B, S, H, KV, D;
  float scale; // 1 / sqrt(D)
  PLANRT_HD int64_t width() const { return (H + 2 * KV) * D; }
  template <class T>
  PLANRT_HD const T *q(const T *qkv, int64_t b, int64_t t, int64_t h) const {
    return qkv + (b * S + t) * width() + h * D;
  }
  template <class T>
  PLANRT_HD const T *k(const T *qkv, int64_t b, int64_t t, int64_t g) const {
    return qkv + (b * S + t) * width() + (H + g) * D;
  }
  template <class T>
  PLANRT_HD const T *v(const T *qkv, int64_t b, int64_t t, int64_t g) const {
    return qkv + (b * S + t) * width() + (H + KV + g) * D;
  }
  PLANRT_HD int64_t o(int64_t b, int64_t t, int64_t h) const {
    return (b * S + t) * H * D + h * D;
  }
};

/// The largest head dim whose 16-bit attention runs in place: a GPU thread
/// keeps its row's fp32 sums in registers (workspace.h native::attention).
constexpr int64_t kAttnMaxHeadDim = workspace::native::kAttnMaxHeadDim;

/// Host: the rows [begin, end) of an index space (r S + t), cut at the
/// boundaries of its groups of S: f(r, t0, t1).
template <class F>
void for_each_group(int64_t begin, int64_t end, int64_t S, const F &f) {
  for (int64_t i = begin; i < end;) {
    int64_t r = i / S, t0 = i % S;
    int64_t t1 = S - t0 < end - i ? S : t0 + (end - i);
    f(r, t0, t1);
    i += t1 - t0;
  }
}

/// Host: dst[r, c] = src[r, c] widened, rows [r0, r1) of cols columns.
template <class T>
void widen_rows(const T *src, int64_t ld_src, int64_t r0, int64_t r1,
                int64_t cols, float *dst, int64_t ld_dst) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < cols; ++c)
      dst[r * ld_dst + c] = ld(src[r * ld_src + c]);
}

/// Host: dst[r, c] = src[r, c] rounded, rows [r0, r1) of cols columns.
template <class T>
void round_rows(const float *src, int64_t ld_src, int64_t r0, int64_t r1,
                int64_t cols, T *dst, int64_t ld_dst) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < cols; ++c)
      st(dst[r * ld_dst + c], src[r * ld_src + c]);
}

/// An attention head group as a problem of its own (B = 1, KV = 1, H =
/// heads, widened to fp32 by the host's 16-bit ranges below).
inline AttnShape one_group(const AttnShape &a, int64_t heads) {
  AttnShape m = a;
  m.B = 1;
  m.H = heads;
  m.KV = 1;
  return m;
}

/// Host: rows [0, t1) of query head h and its kv head, widened into x as
/// the qkv [S, 3 D] of one_group(a, 1).
template <class T>
void widen_head(const AttnShape &a, const T *qkv, int64_t b, int64_t h,
                int64_t t1, float *x) {
  const int64_t D = a.D, W = 3 * D, g = h / (a.H / a.KV);
  widen_rows(a.q(qkv, b, 0, h), a.width(), 0, t1, D, x, W);
  widen_rows(a.k(qkv, b, 0, g), a.width(), 0, t1, D, x + D, W);
  widen_rows(a.v(qkv, b, 0, g), a.width(), 0, t1, D, x + 2 * D, W);
}

/// out[b, t, h] = sum_{t' <= t} softmax_t'(scale q.k) v; index space: B H S
/// (i = (b H + h) S + t). Two passes: the row max m, then e = exp(s - m),
/// the normalizer sum e and the weighted sum of values accumulated in the
/// output row. With `keep` (recompute = none), the row's e values go to
/// keep[i S + t'] and (m, sum) to stats[2 i], so that the backward reads them
/// instead of recomputing q.k and exp: the same values either way, so the
/// results are the same bits.
template <class T = float> struct AttentionFn {
  static constexpr bool kF32 = std::is_same<T, float>::value;
  const T *qkv;
  T *out;
  AttnShape a;
  float *keep = nullptr, *stats = nullptr;
  AttnDropout drop = {};
  /// cuda: where cuDNN's forward writes each row's log-sum-exp [B, H, S]
  /// for attention_grad_lse (planrt::attention_lse); the functor ignores it.
  float *lse = nullptr;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t t = i % a.S, h = (i / a.S) % a.H, b = i / (a.S * a.H);
    int64_t g = h / (a.H / a.KV), D = a.D;
    const T *q = a.q(qkv, b, t, h);
    // With `keep`, the scores of the max pass wait there for the exp pass
    // (which overwrites them with e): q.k is computed once per key.
    float *row = keep ? keep + i * a.S : nullptr;
    float m = a.scale * dot(q, a.k(qkv, b, 0, g), D);
    if (row)
      row[0] = m;
    for (int64_t u = 1; u <= t; ++u) {
      float s = a.scale * dot(q, a.k(qkv, b, u, g), D);
      if (row)
        row[u] = s;
      m = s > m ? s : m;
    }
    // The output row's sums: in place in fp32, in registers for 16 bits.
    float local[kF32 ? 1 : kAttnMaxHeadDim];
    float *o = local;
    if constexpr (kF32)
      o = out + a.o(b, t, h);
    for (int64_t d = 0; d < D; ++d)
      o[d] = 0.0f;
    float sum = 0.0f;
    for (int64_t u = 0; u <= t; ++u) {
      float s = row ? row[u] : a.scale * dot(q, a.k(qkv, b, u, g), D);
      float e = exp_f32(s - m);
      if (row)
        row[u] = e;
      sum += e;
      if (drop.on)
        e *= drop.z(b, h, a.S, t, u);
      const T *v = a.v(qkv, b, u, g);
      for (int64_t d = 0; d < D; ++d)
        o[d] += e * ld(v[d]);
    }
    finish(i, o, m, sum);
    if constexpr (!kF32)
      for (int64_t d = 0; d < D; ++d)
        st(out[a.o(b, t, h) + d], o[d]);
  }
  /// Normalizes row i's output and keeps its statistics.
  PLANRT_HD void finish(int64_t i, float *o, float m, float sum) const {
    float inv = 1.0f / sum;
    for (int64_t d = 0; d < a.D; ++d)
      o[d] *= inv;
    if (stats) {
      stats[2 * i] = m;
      stats[2 * i + 1] = sum;
    }
  }
  void range(int64_t begin, int64_t end) const {
    if constexpr (kF32)
      tiles(begin, end);
    else
      widened(begin, end);
  }
  /// Host, 16-bit tensors: each head's rows as a problem of its own on
  /// widened copies of its q, k and v, run by the fp32 tiles below, its
  /// output rows rounded once.
  void widened(int64_t begin, int64_t end) const {
    const int64_t S = a.S, D = a.D, W = 3 * D;
    std::vector<float> x((size_t)(S * W)), o((size_t)(S * D));
    for_each_group(begin, end, S, [&](int64_t bh, int64_t t0, int64_t t1) {
      int64_t h = bh % a.H, b = bh / a.H;
      widen_head(a, qkv, b, h, t1, x.data());
      AttentionFn<float> one{x.data(),
                             o.data(),
                             one_group(a, 1),
                             keep ? keep + bh * S * S : nullptr,
                             stats ? stats + 2 * bh * S : nullptr,
                             drop.at(b, h)};
      one.range(t0, t1);
      round_rows(o.data(), D, t0, t1, D, out + a.o(b, 0, h), a.H * D);
    });
  }
  /// Host: tiles of up to kTileRows consecutive queries of one head. Their
  /// scores from a transposed copy of the kv head's keys, then per row the
  /// passes above in the same order, and the weighted values for all rows
  /// at once (host_dots.h).
  void tiles(int64_t begin, int64_t end) const {
    const int64_t S = a.S, D = a.D, ld = attn_ld(S);
    std::vector<float> kt((size_t)(D * ld)), local((size_t)(kTileRows * ld));
    int64_t held = -1; // (b KV + g) of kt
    for_each_tile(begin, end, S, [&](int64_t i, int64_t t, auto rows) {
      int64_t h = (i / S) % a.H, b = i / (S * a.H), g = h / (a.H / a.KV);
      if (b * a.KV + g != held) {
        transpose_rows(a.k(qkv, b, 0, g), a.width(), S, D, kt.data(), ld);
        held = b * a.KV + g;
      }
      tile<decltype(rows)::value>(i, t, b, h, g, kt.data(), local.data());
    });
  }
  /// Rows i + r (queries t + r) of head h, r < R.
  template <int R>
  void tile(int64_t i, int64_t t, int64_t b, int64_t h, int64_t g,
            const float *kt, float *local) const {
    const int64_t S = a.S, D = a.D, ld = attn_ld(S);
    const float *q[R];
    float *row[R], *o[R], m[R], sum[R];
    int64_t lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      q[r] = a.q(qkv, b, t + r, h);
      row[r] = local + r * ld;
    }
    dots_transposed_rows<R>(q, kt, ld, D, t + R, row);
    for (int r = 0; r < R; ++r) {
      const int64_t tr = t + r;
      float *e = row[r];
      PLANRT_SIMD
      for (int64_t u = 0; u <= tr; ++u)
        e[u] = a.scale * e[u];
      float mr = row_max(e, tr + 1), sr = 0.0f;
      PLANRT_SIMD
      for (int64_t u = 0; u <= tr; ++u)
        e[u] = exp_f32(e[u] - mr);
      if (keep)
        std::memcpy(keep + (i + r) * S, e, (size_t)(tr + 1) * sizeof(float));
      o[r] = out + a.o(b, tr, h);
      for (int64_t d = 0; d < D; ++d)
        o[r][d] = 0.0f;
      for (int64_t u = 0; u <= tr; ++u)
        sr += e[u];
      if (drop.on) // the values' weights only
        for (int64_t u = 0; u <= tr; ++u)
          e[u] *= drop.z(b, h, S, tr, u);
      m[r] = mr;
      sum[r] = sr;
      lo[r] = 0;
      hi[r] = tr + 1;
    }
    weighted_rows_add_rows<R>(row, lo, hi, a.v(qkv, b, 0, g), a.width(), D, o);
    for (int r = 0; r < R; ++r)
      finish(i + r, o[r], m[r], sum[r]);
  }
};

/// e = exp(scale q.k - m) of query row i and key u: kept by the forward, or
/// recomputed exactly as the forward computed it.
template <class T = float> struct AttnScores {
  const T *qkv;
  const float *keep;
  AttnShape a;
  PLANRT_HD float e(int64_t i, const T *q, int64_t b, int64_t u, int64_t g,
                    float m) const {
    if (keep)
      return keep[i * a.S + u];
    return exp_f32(a.scale * dot(q, a.k(qkv, b, u, g), a.D) - m);
  }
};

/// Backward, part 1; index space B H S like AttentionFn. Finds the row's m
/// and sum (kept, or recomputed as the forward does), stores them with
/// delta = sum_t' p dp (p = e / sum, dp = dout . v), and writes dq = scale
/// sum_t' p (dp - delta) k.
template <class T = float> struct AttentionGradQFn {
  static constexpr bool kF32 = std::is_same<T, float>::value;
  const T *qkv, *dout;
  T *dqkv;
  float *rowstats, *delta; // rowstats: (m, sum) per row
  AttnShape a;
  const float *keep = nullptr, *stats = nullptr;
  AttnDropout drop = {}; // dp (the dropped probabilities' gradient) masked
  /// cuda: the forward's output and log-sum-exp, which cuDNN's backward
  /// reads where the forward ran on cuDNN (planrt::attention_grad_lse);
  /// the functor recomputes instead and ignores them.
  const T *fwd_out = nullptr;
  const float *lse = nullptr;
  /// dout . v of query t and key u, through the mask.
  PLANRT_HD float dp(const T *dy, int64_t b, int64_t h, int64_t t, int64_t u,
                     int64_t g) const {
    float x = dot(dy, a.v(qkv, b, u, g), a.D);
    return drop.on ? x * drop.z(b, h, a.S, t, u) : x;
  }
  PLANRT_HD void operator()(int64_t i) const {
    int64_t t = i % a.S, h = (i / a.S) % a.H, b = i / (a.S * a.H);
    int64_t g = h / (a.H / a.KV), D = a.D;
    const T *q = a.q(qkv, b, t, h);
    const T *dy = dout + a.o(b, t, h);
    AttnScores<T> sc{qkv, keep, a};
    float m, sum = 0.0f, pdp = 0.0f;
    if (stats) {
      m = stats[2 * i];
      sum = stats[2 * i + 1];
      for (int64_t u = 0; u <= t; ++u)
        pdp += sc.e(i, q, b, u, g, m) * dp(dy, b, h, t, u, g);
    } else {
      m = a.scale * dot(q, a.k(qkv, b, 0, g), D);
      for (int64_t u = 1; u <= t; ++u) {
        float s = a.scale * dot(q, a.k(qkv, b, u, g), D);
        m = s > m ? s : m;
      }
      for (int64_t u = 0; u <= t; ++u) {
        float e = sc.e(i, q, b, u, g, m);
        sum += e;
        pdp += e * dp(dy, b, h, t, u, g);
      }
    }
    float dl = pdp / sum;
    rowstats[2 * i] = m;
    rowstats[2 * i + 1] = sum;
    delta[i] = dl;
    // dq's sums: in place in fp32, in registers for 16 bits.
    float local[kF32 ? 1 : kAttnMaxHeadDim];
    float *dq = local;
    if constexpr (kF32)
      dq = dqkv + (a.q(qkv, b, t, h) - qkv);
    for (int64_t d = 0; d < D; ++d)
      dq[d] = 0.0f;
    for (int64_t u = 0; u <= t; ++u) {
      const T *k = a.k(qkv, b, u, g);
      float p = sc.e(i, q, b, u, g, m) / sum;
      float ds = p * (dp(dy, b, h, t, u, g) - dl) * a.scale;
      for (int64_t d = 0; d < D; ++d)
        dq[d] += ds * ld(k[d]);
    }
    if constexpr (!kF32)
      for (int64_t d = 0; d < D; ++d)
        st(dqkv[(a.q(qkv, b, t, h) - qkv) + d], dq[d]);
  }
  void range(int64_t begin, int64_t end) const {
    if constexpr (kF32)
      tiles(begin, end);
    else
      widened(begin, end);
  }
  /// Host, 16-bit tensors: each head's rows as a problem of its own on
  /// widened copies of its q, k, v and dout, run by the fp32 tiles below
  /// (which write the row statistics in place), its dq rows rounded once.
  void widened(int64_t begin, int64_t end) const {
    const int64_t S = a.S, D = a.D, W = 3 * D;
    std::vector<float> x((size_t)(S * W)), dy((size_t)(S * D)),
        dx((size_t)(S * W));
    for_each_group(begin, end, S, [&](int64_t bh, int64_t t0, int64_t t1) {
      int64_t h = bh % a.H, b = bh / a.H;
      widen_head(a, qkv, b, h, t1, x.data());
      widen_rows(dout + a.o(b, 0, h), a.H * D, t0, t1, D, dy.data(), D);
      AttentionGradQFn<float> one{x.data(),
                                  dy.data(),
                                  dx.data(),
                                  rowstats + 2 * bh * S,
                                  delta + bh * S,
                                  one_group(a, 1),
                                  keep ? keep + bh * S * S : nullptr,
                                  stats ? stats + 2 * bh * S : nullptr,
                                  drop.at(b, h)};
      one.range(t0, t1);
      T *dq = dqkv + (a.q(qkv, b, 0, h) - qkv);
      round_rows(dx.data(), W, t0, t1, D, dq, a.width());
    });
  }
  /// Host: tiles of up to kTileRows consecutive queries of one head. Their
  /// dout.v (and scores, unless kept) from transposed copies of the kv
  /// head's values (and keys); then per row the sums above in the same
  /// order, and dq for all rows at once (host_dots.h).
  void tiles(int64_t begin, int64_t end) const {
    const int64_t S = a.S, D = a.D, ld = attn_ld(S);
    const bool scores = !keep || !stats;
    std::vector<float> vt((size_t)(D * ld)), kt(scores ? (size_t)(D * ld) : 0);
    std::vector<float> dp((size_t)(kTileRows * ld)),
        e((size_t)(kTileRows * ld));
    int64_t held = -1;
    for_each_tile(begin, end, S, [&](int64_t i, int64_t t, auto rows) {
      int64_t h = (i / S) % a.H, b = i / (S * a.H), g = h / (a.H / a.KV);
      if (b * a.KV + g != held) {
        transpose_rows(a.v(qkv, b, 0, g), a.width(), S, D, vt.data(), ld);
        if (scores)
          transpose_rows(a.k(qkv, b, 0, g), a.width(), S, D, kt.data(), ld);
        held = b * a.KV + g;
      }
      tile<decltype(rows)::value>(i, t, b, h, g, vt.data(),
                                  scores ? kt.data() : nullptr, dp.data(),
                                  e.data());
    });
  }
  /// Rows i + r (queries t + r) of head h, r < R; kt is null where the
  /// scores are kept.
  template <int R>
  void tile(int64_t i, int64_t t, int64_t b, int64_t h, int64_t g,
            const float *vt, const float *kt, float *dpbuf, float *ebuf) const {
    const int64_t S = a.S, D = a.D, ld = attn_ld(S);
    const float *q[R], *dy[R], *ds[R];
    float *dp[R], *es[R], *dq[R];
    int64_t lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      q[r] = a.q(qkv, b, t + r, h);
      dy[r] = dout + a.o(b, t + r, h);
      dp[r] = dpbuf + r * ld;
      es[r] = ebuf + r * ld;
    }
    dots_transposed_rows<R>(dy, vt, ld, D, t + R, dp);
    if (kt)
      dots_transposed_rows<R>(q, kt, ld, D, t + R, es);
    for (int r = 0; r < R; ++r) {
      const int64_t tr = t + r, ir = i + r;
      float *ew = es[r], m = 0.0f;
      if (kt) {
        float *e = ew;
        for (int64_t u = 0; u <= tr; ++u)
          e[u] = a.scale * e[u];
        if (stats) {
          m = stats[2 * ir];
        } else {
          m = e[0];
          for (int64_t u = 1; u <= tr; ++u)
            m = e[u] > m ? e[u] : m;
        }
      } else {
        m = stats[2 * ir];
      }
      if (!keep) {
        PLANRT_SIMD
        for (int64_t u = 0; u <= tr; ++u)
          ew[u] = exp_f32(ew[u] - m);
      }
      const float *e = keep ? keep + ir * S : ew;
      float sum = 0.0f, pdp = 0.0f, *p = dp[r];
      if (drop.on)
        for (int64_t u = 0; u <= tr; ++u)
          p[u] *= drop.z(b, h, S, tr, u);
      if (stats) {
        sum = stats[2 * ir + 1];
        for (int64_t u = 0; u <= tr; ++u)
          pdp += e[u] * p[u];
      } else {
        for (int64_t u = 0; u <= tr; ++u) {
          sum += e[u];
          pdp += e[u] * p[u];
        }
      }
      float dl = pdp / sum;
      rowstats[2 * ir] = m;
      rowstats[2 * ir + 1] = sum;
      delta[ir] = dl;
      dq[r] = dqkv + (q[r] - qkv);
      for (int64_t d = 0; d < D; ++d)
        dq[r][d] = 0.0f;
      for (int64_t u = 0; u <= tr; ++u) // dp becomes ds
        p[u] = e[u] / sum * (p[u] - dl) * a.scale;
      ds[r] = p;
      lo[r] = 0;
      hi[r] = tr + 1;
    }
    weighted_rows_add_rows<R>(ds, lo, hi, a.k(qkv, b, 0, g), a.width(), D, dq);
  }
};

/// Backward, part 2; index space B KV S (j = (b KV + g) S + t'). For key /
/// value position t' of kv head g, sums over the group's query heads h and
/// the queries t >= t' that see it: dv = sum p dout, dk = scale sum p (dp -
/// delta) q. Each invocation owns its dk and dv rows: no races.
template <class T = float> struct AttentionGradKVFn {
  static constexpr bool kF32 = std::is_same<T, float>::value;
  const T *qkv, *dout;
  const float *rowstats, *delta;
  T *dqkv;
  AttnShape a;
  const float *keep = nullptr;
  AttnDropout drop = {}; // dv from the dropped p, ds from the masked dp
  PLANRT_HD void operator()(int64_t j) const {
    int64_t u = j % a.S, g = (j / a.S) % a.KV, b = j / (a.S * a.KV);
    int64_t rep = a.H / a.KV, D = a.D;
    const T *k = a.k(qkv, b, u, g), *v = a.v(qkv, b, u, g);
    // dk's and dv's sums: in place in fp32, in registers for 16 bits.
    float local[kF32 ? 1 : 2 * kAttnMaxHeadDim];
    float *dk = local, *dv = local + (kF32 ? 0 : kAttnMaxHeadDim);
    if constexpr (kF32) {
      dk = dqkv + (k - qkv);
      dv = dqkv + (v - qkv);
    }
    AttnScores<T> sc{qkv, keep, a};
    for (int64_t d = 0; d < D; ++d) {
      dk[d] = 0.0f;
      dv[d] = 0.0f;
    }
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h)
      for (int64_t t = u; t < a.S; ++t) {
        int64_t row = (b * a.H + h) * a.S + t;
        const T *q = a.q(qkv, b, t, h);
        const T *dy = dout + a.o(b, t, h);
        float p =
            sc.e(row, q, b, u, g, rowstats[2 * row]) / rowstats[2 * row + 1];
        float z = drop.on ? drop.z(b, h, a.S, t, u) : 1.0f;
        float ds = p * (z * dot(dy, v, D) - delta[row]) * a.scale;
        p *= z;
        for (int64_t d = 0; d < D; ++d) {
          dv[d] += p * ld(dy[d]);
          dk[d] += ds * ld(q[d]);
        }
      }
    if constexpr (!kF32)
      for (int64_t d = 0; d < D; ++d) {
        st(dqkv[(k - qkv) + d], dk[d]);
        st(dqkv[(v - qkv) + d], dv[d]);
      }
  }
  void range(int64_t begin, int64_t end) const {
    if constexpr (kF32)
      tiles(begin, end);
    else
      widened(begin, end);
  }
  /// Host, 16-bit tensors: each kv head's keys as a problem of its own
  /// (its group's query heads, the kv head, their dout rows, widened from
  /// the first key on), run by the fp32 tiles below, its dk and dv rows
  /// rounded once.
  void widened(int64_t begin, int64_t end) const {
    const int64_t S = a.S, D = a.D, rep = a.H / a.KV, W = (rep + 2) * D;
    std::vector<float> x((size_t)(S * W)), dy((size_t)(S * rep * D)),
        dx((size_t)(S * W));
    for_each_group(begin, end, S, [&](int64_t bg, int64_t u0, int64_t u1) {
      int64_t g = bg % a.KV, b = bg / a.KV, h0 = g * rep;
      widen_rows(a.q(qkv, b, 0, h0), a.width(), u0, S, rep * D, x.data(), W);
      widen_rows(a.k(qkv, b, 0, g), a.width(), u0, S, D, x.data() + rep * D, W);
      widen_rows(a.v(qkv, b, 0, g), a.width(), u0, S, D,
                 x.data() + (rep + 1) * D, W);
      widen_rows(dout + a.o(b, 0, h0), a.H * D, u0, S, rep * D, dy.data(),
                 rep * D);
      int64_t row0 = (b * a.H + h0) * S; // the group's first row
      AttentionGradKVFn<float> one{x.data(),
                                   dy.data(),
                                   rowstats + 2 * row0,
                                   delta + row0,
                                   dx.data(),
                                   one_group(a, rep),
                                   keep ? keep + row0 * S : nullptr,
                                   drop.at(b, h0)};
      one.range(u0, u1);
      round_rows(dx.data() + rep * D, W, u0, u1, D,
                 dqkv + (a.k(qkv, b, 0, g) - qkv), a.width());
      round_rows(dx.data() + (rep + 1) * D, W, u0, u1, D,
                 dqkv + (a.v(qkv, b, 0, g) - qkv), a.width());
    });
  }
  /// Host: tiles of up to kTileRows consecutive keys of one kv head. Per
  /// query head of the group, the keys' dout.v (and q.k, unless kept) for
  /// every query t >= t' from transposed copies of the head's dout (and
  /// queries); then the sums above in the same order, for all keys of the
  /// tile at once (host_dots.h).
  void tiles(int64_t begin, int64_t end) const {
    const int64_t S = a.S, D = a.D, ld = attn_ld(S), rep = a.H / a.KV;
    std::vector<float> dyt((size_t)(rep * D * ld));
    std::vector<float> qt(keep ? 0 : (size_t)(rep * D * ld));
    std::vector<float> dp((size_t)(kTileRows * ld)),
        e((size_t)(kTileRows * ld));
    int64_t held = -1;
    for_each_tile(begin, end, S, [&](int64_t j, int64_t u, auto keys) {
      int64_t g = (j / S) % a.KV, b = j / (S * a.KV);
      if (b * a.KV + g != held) {
        for (int64_t r = 0; r < rep; ++r) {
          int64_t h = g * rep + r;
          transpose_rows(dout + a.o(b, 0, h), a.H * D, S, D,
                         dyt.data() + r * D * ld, ld);
          if (!keep)
            transpose_rows(a.q(qkv, b, 0, h), a.width(), S, D,
                           qt.data() + r * D * ld, ld);
        }
        held = b * a.KV + g;
      }
      tile<decltype(keys)::value>(u, b, g, dyt.data(), qt.data(), dp.data(),
                                  e.data());
    });
  }
  /// Keys u + k of kv head g, k < R. Buffer columns c are queries u + c;
  /// key k's terms are its columns c >= k.
  template <int R>
  void tile(int64_t u, int64_t b, int64_t g, const float *dyt, const float *qt,
            float *dpbuf, float *ebuf) const {
    const int64_t S = a.S, D = a.D, ld = attn_ld(S), rep = a.H / a.KV;
    const float *k[R], *v[R], *pw[R], *dsw[R];
    float *dk[R], *dv[R], *dp[R], *e[R];
    int64_t lo[R], hi[R];
    for (int r = 0; r < R; ++r) {
      k[r] = a.k(qkv, b, u + r, g);
      v[r] = a.v(qkv, b, u + r, g);
      dk[r] = dqkv + (k[r] - qkv);
      dv[r] = dqkv + (v[r] - qkv);
      for (int64_t d = 0; d < D; ++d) {
        dk[r][d] = 0.0f;
        dv[r][d] = 0.0f;
      }
      dp[r] = dpbuf + r * ld;
      e[r] = ebuf + r * ld;
      lo[r] = u + r;
      hi[r] = S;
      pw[r] = e[r] + r;
      dsw[r] = dp[r] + r;
    }
    const int64_t n = S - u; // queries u + c, c < n
    for (int64_t hr = 0; hr < rep; ++hr) {
      int64_t h = g * rep + hr;
      int64_t row0 = (b * a.H + h) * S + u;
      dots_transposed_rows<R>(v, dyt + hr * D * ld + u, ld, D, n, dp);
      if (!keep)
        dots_transposed_rows<R>(k, qt + hr * D * ld + u, ld, D, n, e);
      for (int r = 0; r < R; ++r) {
        float *er = e[r], *pr = dp[r];
        if (keep) {
          for (int64_t c = r; c < n; ++c)
            er[c] = keep[(row0 + c) * S + u + r];
        } else {
          PLANRT_SIMD
          for (int64_t c = r; c < n; ++c)
            er[c] = exp_f32(a.scale * er[c] - rowstats[2 * (row0 + c)]);
        }
        if (drop.on) {
          // Query u + c, key u + r: dp masked for ds, p masked for dv.
          for (int64_t c = r; c < n; ++c) {
            int64_t row = row0 + c;
            float z = drop.z(b, h, S, u + c, u + r);
            er[c] = er[c] / rowstats[2 * row + 1];
            pr[c] = er[c] * (z * pr[c] - delta[row]) * a.scale;
            er[c] *= z;
          }
          continue;
        }
        for (int64_t c = r; c < n; ++c) { // e becomes p, dp becomes ds
          int64_t row = row0 + c;
          er[c] = er[c] / rowstats[2 * row + 1];
          pr[c] = er[c] * (pr[c] - delta[row]) * a.scale;
        }
      }
      weighted_rows_add_rows<R>(pw, lo, hi, dout + a.o(b, 0, h), a.H * D, D,
                                dv);
      weighted_rows_add_rows<R>(dsw, lo, hi, a.q(qkv, b, 0, h), a.width(), D,
                                dk);
    }
  }
};

//===--- Chunked sums -----------------------------------------------------===//

/// partial[c] = sum of v (or v^2 with `square`) over chunk c of kReduceChunk
/// elements, in sum8's order; index space: the chunks.
struct SumPartialFn {
  const float *v;
  float *partial;
  int64_t n;
  bool square;
  PLANRT_HD void operator()(int64_t c) const {
    int64_t begin = c * kReduceChunk;
    int64_t end = begin + kReduceChunk < n ? begin + kReduceChunk : n;
    const float *x = v + begin;
    partial[c] =
        square ? dot(x, x, end - begin) : sum8(end - begin, ValueTerm{x});
  }
};

/// out[0] += sum(partial[0..count)); index space: one element.
struct AccumulateSumFn {
  const float *partial;
  float *out;
  int64_t count;
  PLANRT_HD void operator()(int64_t) const {
    float acc = 0.0f;
    for (int64_t c = 0; c < count; ++c)
      acc += partial[c];
    out[0] += acc;
  }
};

} // namespace kernels
} // namespace planrt

#endif // PLANRT_KERNELS_H
