//===- conv_kernels.h - Convolution and pooling kernel bodies -------------===//
//
// Functors over one index each, like planrt/kernels.h: the host backend runs
// them in loops, the cuda backend in grid-stride kernels, so CPU tests cover
// the arithmetic the GPU runs. Tensors are NCHW. Every output element is
// written by exactly one invocation that reads its inputs in a fixed order,
// so results are deterministic (the backward passes gather; they never
// scatter with atomics).
//===----------------------------------------------------------------------===//
#ifndef PLANRT_CONV_KERNELS_H
#define PLANRT_CONV_KERNELS_H

#include "planrt/kernels.h"

namespace planrt {
namespace kernels {

/// The geometry of a convolution or pooling window over NCHW tensors.
struct ConvShape {
  int64_t n, c, h, w; // input
  int64_t o, ho, wo;  // output channels (conv) and spatial size
  int64_t kh, kw;     // window
  int64_t sh, sw;     // stride
  int64_t ph, pw;     // zero padding
  int64_t dh, dw;     // dilation
  PLANRT_HD int64_t p() const { return ho * wo; }
  PLANRT_HD int64_t window() const { return kh * kw; }
};

/// col[(c*KH + i)*KW + j][n*P + oh*WO + ow] = x[n, c, oh*sh - ph + i*dh,
/// ow*sw - pw + j*dw] (0 outside the input); index space: col elements,
/// C*KH*KW rows of N*P columns.
struct Im2ColFn {
  const float *x;
  float *col;
  ConvShape s;
  PLANRT_HD void operator()(int64_t idx) const {
    int64_t cols = s.n * s.p();
    int64_t row = idx / cols, col_i = idx % cols;
    int64_t n = col_i / s.p(), p = col_i % s.p();
    int64_t c = row / s.window(), k = row % s.window();
    int64_t ih = (p / s.wo) * s.sh - s.ph + (k / s.kw) * s.dh;
    int64_t iw = (p % s.wo) * s.sw - s.pw + (k % s.kw) * s.dw;
    bool inside = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
    col[idx] = inside ? x[((n * s.c + c) * s.h + ih) * s.w + iw] : 0.0f;
  }
};

/// The adjoint of Im2ColFn: dx[n, c, ih, iw] sums the col entries that read
/// it, window position (i, j) in order; index space: input elements.
struct Col2ImFn {
  const float *col;
  float *dx;
  ConvShape s;
  PLANRT_HD void operator()(int64_t idx) const {
    int64_t iw = idx % s.w, ih = (idx / s.w) % s.h;
    int64_t c = (idx / (s.w * s.h)) % s.c, n = idx / (s.w * s.h * s.c);
    int64_t cols = s.n * s.p();
    float acc = 0.0f;
    for (int64_t i = 0; i < s.kh; ++i) {
      int64_t th = ih + s.ph - i * s.dh; // = oh * sh
      if (th < 0 || th % s.sh)
        continue;
      int64_t oh = th / s.sh;
      if (oh >= s.ho)
        continue;
      for (int64_t j = 0; j < s.kw; ++j) {
        int64_t tw = iw + s.pw - j * s.dw;
        if (tw < 0 || tw % s.sw)
          continue;
        int64_t ow = tw / s.sw;
        if (ow >= s.wo)
          continue;
        int64_t row = (c * s.kh + i) * s.kw + j;
        acc += col[row * cols + n * s.p() + oh * s.wo + ow];
      }
    }
    dx[idx] = acc;
  }
};

/// Swaps the two leading axes of a [a, b, inner] tensor: out[j, i, k] =
/// in[i, j, k]; index space: out elements. Moves between NCHW ([N, O, P])
/// and the GEMM layout [O, N*P].
struct SwapLeadFn {
  const float *in;
  float *out;
  int64_t a, b, inner;
  PLANRT_HD void operator()(int64_t idx) const {
    int64_t k = idx % inner, i = (idx / inner) % a, j = idx / (inner * a);
    out[idx] = in[(i * b + j) * inner + k];
  }
};

/// out[n, c, ...] = x[n, c, ...] + bias[c]; `inner` = elements per channel.
struct ChannelBiasAddFn {
  const float *x, *bias;
  float *out;
  int64_t c, inner;
  PLANRT_HD void operator()(int64_t i) const {
    out[i] = x[i] + bias[(i / inner) % c];
  }
};

/// db[c] = sum over n, then over the channel's elements, in order; index
/// space: the channels.
struct ChannelBiasGradFn {
  const float *dy;
  float *db;
  int64_t n, c, inner;
  PLANRT_HD void operator()(int64_t ch) const {
    float acc = 0.0f;
    for (int64_t b = 0; b < n; ++b) {
      const float *p = dy + (b * c + ch) * inner;
      for (int64_t k = 0; k < inner; ++k)
        acc += p[k];
    }
    db[ch] = acc;
  }
};

/// Calls f(flat input index) for the in-bounds positions of output (nc,
/// oh, ow)'s pooling window, row-major (padding is skipped).
template <class F>
PLANRT_HD inline void for_window(const ConvShape &s, int64_t nc, int64_t oh,
                                 int64_t ow, const F &f) {
  for (int64_t i = 0; i < s.kh; ++i) {
    int64_t ih = oh * s.sh - s.ph + i;
    if (ih < 0 || ih >= s.h)
      continue;
    for (int64_t j = 0; j < s.kw; ++j) {
      int64_t iw = ow * s.sw - s.pw + j;
      if (iw >= 0 && iw < s.w)
        f((nc * s.h + ih) * s.w + iw);
    }
  }
}

/// The flat input index of the first maximum of output (n, c, oh, ow)'s
/// window (row-major over the window; padding never wins).
PLANRT_HD inline int64_t pool_argmax(const float *x, const ConvShape &s,
                                     int64_t nc, int64_t oh, int64_t ow) {
  int64_t best = -1;
  float bv = 0.0f;
  for_window(s, nc, oh, ow, [&](int64_t at) {
    float v = x[at];
    // NaN propagates: a NaN wins over any number and keeps the first one.
    if (best < 0 || v > bv || (v != v && bv == bv)) {
      best = at;
      bv = v;
    }
  });
  return best;
}

/// Max (avg = false) or average pooling; an average divides by the whole
/// window, padding included. Index space: output elements.
struct Pool2dFn {
  const float *x;
  float *out;
  ConvShape s;
  bool avg;
  PLANRT_HD void operator()(int64_t idx) const {
    int64_t ow = idx % s.wo, oh = (idx / s.wo) % s.ho, nc = idx / s.p();
    if (!avg) {
      out[idx] = x[pool_argmax(x, s, nc, oh, ow)];
      return;
    }
    float acc = 0.0f;
    for_window(s, nc, oh, ow, [&](int64_t at) { acc += x[at]; });
    out[idx] = acc / (float)s.window();
  }
};

/// dx of Pool2dFn: each input element gathers the output gradients of the
/// windows that contain it (max: only where it is the window's first
/// maximum), windows in row-major order. Index space: input elements.
struct Pool2dGradFn {
  const float *x, *dy;
  float *dx;
  ConvShape s;
  bool avg;
  PLANRT_HD void operator()(int64_t idx) const {
    int64_t iw = idx % s.w, ih = (idx / s.w) % s.h, nc = idx / (s.w * s.h);
    // Windows oh with oh*sh - ph <= ih < oh*sh - ph + kh.
    int64_t oh0 = ih + s.ph - s.kh + 1, ow0 = iw + s.pw - s.kw + 1;
    oh0 = oh0 > 0 ? (oh0 + s.sh - 1) / s.sh : 0;
    ow0 = ow0 > 0 ? (ow0 + s.sw - 1) / s.sw : 0;
    float acc = 0.0f;
    for (int64_t oh = oh0; oh < s.ho && oh * s.sh - s.ph <= ih; ++oh)
      for (int64_t ow = ow0; ow < s.wo && ow * s.sw - s.pw <= iw; ++ow) {
        float g = dy[(nc * s.ho + oh) * s.wo + ow];
        if (avg)
          acc += g / (float)s.window();
        else if (pool_argmax(x, s, nc, oh, ow) == idx)
          acc += g;
      }
    dx[idx] = acc;
  }
};

//===--- Batch normalization (per channel over N and the rest) ------------===//

/// Per-sample, per-channel sums over the channel's elements of x [N, C,
/// inner], in order; index space: N*C. mode 0: out[n*C + c] = sum x;
/// mode 1: sum (x - mean[c])^2; mode 2 (rows of 2C): out[n*2C + c] = sum dy
/// and out[n*2C + C + c] = sum dy * (x - mean[c]) * rstd[c]. Summing these
/// rows over n in sample order gives the same bits for any split of the
/// batch (ColumnSumFn after an all-gather in sample order).
struct SampleSumsFn {
  const float *x, *mean, *rstd, *dy;
  float *out;
  int64_t c, inner;
  int mode;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t ch = i % c, n = i / c;
    const float *p = x + i * inner;
    float a = 0.0f, b = 0.0f;
    for (int64_t k = 0; k < inner; ++k) {
      if (mode == 0) {
        a += p[k];
      } else if (mode == 1) {
        float v = p[k] - mean[ch];
        a += v * v;
      } else {
        float g = dy[i * inner + k];
        a += g;
        b += g * ((p[k] - mean[ch]) * rstd[ch]);
      }
    }
    if (mode == 2) {
      out[n * 2 * c + ch] = a;
      out[n * 2 * c + c + ch] = b;
    } else {
      out[i] = a;
    }
  }
};

/// out[j] = sum over rows r, in order, of in[r * cols + j]; index: columns.
struct ColumnSumFn {
  const float *in;
  float *out;
  int64_t rows, cols;
  PLANRT_HD void operator()(int64_t j) const {
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      acc += in[r * cols + j];
    out[j] = acc;
  }
};

/// From the global sums over m values per channel: mean[c] = sum[c] / m, or
/// (rstd) 1 / sqrt(sum[c] / m + eps); in place. Index space: the channels.
struct BnFinalizeFn {
  float *v;
  float inv_m, eps;
  bool rstd;
  PLANRT_HD void operator()(int64_t ch) const {
    v[ch] = rstd ? 1.0f / sqrtf(v[ch] * inv_m + eps) : v[ch] * inv_m;
  }
};

/// out = gamma[c] (x - mean[c]) rstd[c] + beta[c]; index: elements.
struct BnNormFn {
  const float *x, *gamma, *beta, *mean, *rstd;
  float *out;
  int64_t c, inner;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t ch = (i / inner) % c;
    out[i] = gamma[ch] * ((x[i] - mean[ch]) * rstd[ch]) + beta[ch];
  }
};

/// Batch norm for evaluation, from the running statistics; index space:
/// elements.
struct BnInferFn {
  const float *x, *gamma, *beta, *mean, *var;
  float *out;
  int64_t c, inner;
  float eps;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t ch = (i / inner) % c;
    float rstd = 1.0f / sqrtf(var[ch] + eps);
    out[i] = gamma[ch] * ((x[i] - mean[ch]) * rstd) + beta[ch];
  }
};

/// sum[c] and sum_sq[c] of x [N, C, inner] over the samples and the rest,
/// accumulated in double (the running variance subtracts them); index
/// space: the channels.
struct BnMomentsFn {
  const float *x;
  float *sum, *sum_sq;
  int64_t n, c, inner;
  PLANRT_HD void operator()(int64_t ch) const {
    double a = 0.0, b = 0.0;
    for (int64_t r = 0; r < n; ++r) {
      const float *p = x + (r * c + ch) * inner;
      for (int64_t k = 0; k < inner; ++k) {
        double v = p[k];
        a += v;
        b += v * v;
      }
    }
    sum[ch] = (float)a;
    sum_sq[ch] = (float)b;
  }
};

/// PyTorch's running statistics rule from the whole batch's sums over
/// `count` values per channel: the batch mean and unbiased variance are
/// mixed in with weight `momentum`; index space: the channels.
struct RunningStatsFn {
  float *mean, *var;
  const float *sum, *sum_sq;
  double count;
  float momentum;
  PLANRT_HD void operator()(int64_t ch) const {
    double m = (double)sum[ch] / count;
    double v = ((double)sum_sq[ch] - (double)sum[ch] * m) / (count - 1.0);
    if (v < 0.0)
      v = 0.0; // rounding of a constant channel
    mean[ch] = (1.0f - momentum) * mean[ch] + momentum * (float)m;
    var[ch] = (1.0f - momentum) * var[ch] + momentum * (float)v;
  }
};

/// dx = gamma rstd (dy - sum dy / m - xhat sum(dy xhat) / m), the sums over
/// the global batch; index space: elements.
struct BnGradXFn {
  const float *x, *dy, *gamma, *mean, *rstd, *sums;
  float *dx;
  int64_t c, inner;
  float inv_m;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t ch = (i / inner) % c;
    float xhat = (x[i] - mean[ch]) * rstd[ch];
    dx[i] = gamma[ch] * rstd[ch] *
            (dy[i] - sums[ch] * inv_m - xhat * (sums[c + ch] * inv_m));
  }
};

//===--- Group normalization (per sample over groups of channels) ---------===//

/// The geometry of group norm over x [N, C, inner]: a group is cg = C / G
/// consecutive channels, cg * inner contiguous values of one sample.
struct GnShape {
  int64_t n, c, g, inner;
  PLANRT_HD int64_t cg() const { return c / g; }
  PLANRT_HD int64_t count() const { return cg() * inner; }
};

/// mean and rstd of each (sample, group), two passes; index: N*G.
struct GnStatsFn {
  const float *x;
  float *mean, *rstd;
  GnShape s;
  float eps;
  PLANRT_HD void operator()(int64_t ng) const {
    const float *p = x + ng * s.count();
    float sum = 0.0f;
    for (int64_t k = 0; k < s.count(); ++k)
      sum += p[k];
    float m = sum / (float)s.count(), sq = 0.0f;
    for (int64_t k = 0; k < s.count(); ++k)
      sq += (p[k] - m) * (p[k] - m);
    mean[ng] = m;
    rstd[ng] = 1.0f / sqrtf(sq / (float)s.count() + eps);
  }
};

/// out = gamma[c] (x - mean) rstd + beta[c]; index: elements.
struct GnNormFn {
  const float *x, *gamma, *beta, *mean, *rstd;
  float *out;
  GnShape s;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t ch = (i / s.inner) % s.c, n = i / (s.c * s.inner);
    int64_t ng = n * s.g + ch / s.cg();
    out[i] = gamma[ch] * ((x[i] - mean[ng]) * rstd[ng]) + beta[ch];
  }
};

/// dx of one (sample, group): with d = dy gamma[c],
/// dx = rstd (d - mean(d) - xhat mean(d xhat)); index: N*G.
struct GnGradXFn {
  const float *x, *dy, *gamma, *mean, *rstd;
  float *dx;
  GnShape s;
  PLANRT_HD void operator()(int64_t ng) const {
    int64_t base = ng * s.count(), c0 = (ng % s.g) * s.cg();
    float a = 0.0f, b = 0.0f;
    for (int64_t k = 0; k < s.count(); ++k) {
      float d = dy[base + k] * gamma[c0 + k / s.inner];
      a += d;
      b += d * ((x[base + k] - mean[ng]) * rstd[ng]);
    }
    float inv = 1.0f / (float)s.count();
    for (int64_t k = 0; k < s.count(); ++k) {
      float d = dy[base + k] * gamma[c0 + k / s.inner];
      float xhat = (x[base + k] - mean[ng]) * rstd[ng];
      dx[base + k] = rstd[ng] * (d - a * inv - xhat * (b * inv));
    }
  }
};

/// dgamma[c] = sum dy xhat and dbeta[c] = sum dy over the samples and the
/// channel's values, in order; index: channels.
struct GnGradParamFn {
  const float *x, *dy, *mean, *rstd;
  float *dgamma, *dbeta;
  GnShape s;
  PLANRT_HD void operator()(int64_t ch) const {
    float dg = 0.0f, db = 0.0f;
    for (int64_t n = 0; n < s.n; ++n) {
      int64_t ng = n * s.g + ch / s.cg();
      int64_t base = (n * s.c + ch) * s.inner;
      for (int64_t k = 0; k < s.inner; ++k) {
        float g = dy[base + k];
        dg += g * ((x[base + k] - mean[ng]) * rstd[ng]);
        db += g;
      }
    }
    dgamma[ch] = dg;
    dbeta[ch] = db;
  }
};

//===--- Dropout ----------------------------------------------------------===//

/// out = keep ? x * scale : 0, keep = mix(key, global index) >= threshold
/// (32 bits); the element's global index from its local coordinates plus
/// this rank's offsets. Index space: elements.
struct DropoutFn {
  const float *x;
  float *out;
  int64_t local[4], global[4], offset[4];
  uint64_t key;
  uint32_t threshold;
  float scale;
  PLANRT_HD void operator()(int64_t i) const {
    int64_t rest = i, g = 0, stride = 1;
    for (int d = 3; d >= 0; --d) {
      int64_t c = rest % local[d];
      rest /= local[d];
      g += (c + offset[d]) * stride;
      stride *= global[d];
    }
    uint32_t h = (uint32_t)(mix64(key ^ mix64((uint64_t)g)) >> 32);
    out[i] = h >= threshold ? x[i] * scale : 0.0f;
  }
};

} // namespace kernels
} // namespace planrt

#endif
