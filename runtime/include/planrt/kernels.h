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

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define PLANRT_HD __host__ __device__
#else
#define PLANRT_HD
#endif

namespace planrt {
namespace kernels {

/// Number of elements summed by one partial of a chunked reduction.
constexpr int64_t kReduceChunk = 1024;

//===--- Scalar helpers ---------------------------------------------------===//

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

/// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
PLANRT_HD inline float gelu_fwd(float x) {
  float u = kSqrt2OverPi * (x + kGeluCoeff * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

/// d gelu(x) / dx. 1 - t^2 is computed as (1 - t)(1 + t), which keeps its
/// relative accuracy when |t| is close to 1.
PLANRT_HD inline float gelu_deriv(float x) {
  float x2 = x * x;
  float u = kSqrt2OverPi * (x + kGeluCoeff * x2 * x);
  float t = tanhf(u);
  float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * x2);
  return 0.5f * (1.0f + t) + 0.5f * x * ((1.0f - t) * (1.0f + t)) * du;
}

//===--- Element-wise functors (index space: output elements) -------------===//

struct BiasAddFn {
  const float *x, *b;
  float *out;
  int64_t n; // length of b
  PLANRT_HD void operator()(int64_t i) const { out[i] = x[i] + b[i % n]; }
};

struct AddFn {
  const float *a, *b;
  float *out;
  PLANRT_HD void operator()(int64_t i) const { out[i] = a[i] + b[i]; }
};

struct ReluFn {
  const float *x;
  float *out;
  PLANRT_HD void operator()(int64_t i) const {
    out[i] = x[i] > 0.0f ? x[i] : 0.0f;
  }
};

struct ReluGradFn {
  const float *x, *dy;
  float *dx;
  PLANRT_HD void operator()(int64_t i) const {
    dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
  }
};

struct GeluFn {
  const float *x;
  float *out;
  PLANRT_HD void operator()(int64_t i) const { out[i] = gelu_fwd(x[i]); }
};

struct GeluGradFn {
  const float *x, *dy;
  float *dx;
  PLANRT_HD void operator()(int64_t i) const {
    dx[i] = dy[i] * gelu_deriv(x[i]);
  }
};

/// dpred = 2 * scale * (pred - target).
struct MseGradFn {
  const float *pred, *target;
  float *dpred;
  float scale2; // 2 * scale
  PLANRT_HD void operator()(int64_t i) const {
    dpred[i] = scale2 * (pred[i] - target[i]);
  }
};

struct SgdFn {
  float *w;
  const float *g;
  float lr;
  PLANRT_HD void operator()(int64_t i) const { w[i] -= lr * g[i]; }
};

/// AdamW (decoupled weight decay, bias-corrected moments). `bc1` and `bc2`
/// are 1 - beta1^t and 1 - beta2^t, computed by the caller in double.
struct AdamWFn {
  float *w, *m, *v;
  const float *g;
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2;
  PLANRT_HD void operator()(int64_t i) const {
    float gi = g[i];
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bc1;
    float vhat = vi / bc2;
    float wi = w[i];
    w[i] = wi - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * wi);
  }
};

//===--- Reductions -------------------------------------------------------===//

/// db[j] = sum_r dy[r, j]; index space: the n columns. Rows are summed in
/// order.
struct BiasGradFn {
  const float *dy;
  float *db;
  int64_t rows, n;
  PLANRT_HD void operator()(int64_t j) const {
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      acc += dy[r * n + j];
    db[j] = acc;
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

} // namespace kernels
} // namespace planrt

#endif // PLANRT_KERNELS_H
