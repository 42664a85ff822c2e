//===- dtype.h - 16-bit floating-point storage formats ---------*- C++ -*-===//
//
// bfloat16 and IEEE half conversions with round-to-nearest-even, as GPUs
// and PyTorch convert (torch.Tensor.to(torch.bfloat16 / torch.float16)):
// the storage formats of mixed precision's 16-bit tensors and of
// --save-dtype bf16. Integer code only, host/device neutral, so the cuda
// kernels and the host kernels convert bit for bit alike.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_DTYPE_H
#define PLANRT_DTYPE_H

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define PLANRT_DTYPE_HD __host__ __device__
#else
#define PLANRT_DTYPE_HD
#endif

namespace planrt {

PLANRT_DTYPE_HD inline uint32_t bits_of(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
#endif
}

PLANRT_DTYPE_HD inline float float_of(uint32_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, 4);
  return f;
#endif
}

/// The bfloat16 nearest to `f` (ties to an even mantissa). Overflow rounds
/// to infinity, infinities stay, a NaN stays a NaN (quiet, sign kept).
PLANRT_DTYPE_HD inline uint16_t bf16_from_float(float f) {
  uint32_t bits = bits_of(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) // NaN: keep it a NaN
    return uint16_t((bits >> 16) | 0x0040u);
  uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb; // carries into the exponent when rounding up
  return uint16_t(bits >> 16);
}

PLANRT_DTYPE_HD inline float float_from_bf16(uint16_t h) {
  return float_of(uint32_t(h) << 16);
}

/// The IEEE binary16 nearest to `f` (ties to even), subnormals included.
/// Magnitudes from 65520 up round to infinity (65504 is the largest half);
/// a NaN stays a quiet NaN with its sign.
PLANRT_DTYPE_HD inline uint16_t f16_from_float(float f) {
  uint32_t x = bits_of(f);
  uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u)
    return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) // 65520 and up, infinity included
    return uint16_t(sign | 0x7c00u);
  if (a >= 0x38800000u) { // a normal half: rebias 127 -> 15, round 13 bits
    uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return uint16_t(sign | (r >> 13));
  }
  if (a < 0x33000000u) // below 2^-25 (a tie at 2^-25 goes to even 0)
    return sign;
  // A subnormal half counts units of 2^-24: the float's 24-bit significand
  // shifted right by 126 - exponent, rounded to nearest even.
  uint32_t e = a >> 23;
  uint32_t m = (a & 0x7fffffu) | 0x800000u;
  uint32_t s = 126u - e; // 14..24
  uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
  if (rem > half || (rem == half && (q & 1u)))
    ++q;
  return uint16_t(sign | q);
}

PLANRT_DTYPE_HD inline float float_from_f16(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu)
    return float_of(sign | 0x7f800000u | (m << 13));
  if (e == 0) { // zero or subnormal: m units of 2^-24, exact in float
    float v = float(m) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

} // namespace planrt

#endif
