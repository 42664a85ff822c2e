//===- dtype.h - 16-bit floating-point storage formats ---------*- C++ -*-===//
//
// bfloat16 conversions with round-to-nearest-even, as GPUs and PyTorch
// convert (torch.Tensor.to(torch.bfloat16)): the first piece of mixed
// precision (issue 9) that the runtime has, used today by --save-dtype
// bf16. Header-only and host/device neutral so that the cuda backend and
// the host kernels share it when 16-bit tensors land.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_DTYPE_H
#define PLANRT_DTYPE_H

#include <cstdint>
#include <cstring>

namespace planrt {

/// The bfloat16 nearest to `f` (ties to an even mantissa). Overflow rounds
/// to infinity, infinities stay, a NaN stays a NaN (quiet, sign kept).
inline uint16_t bf16_from_float(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) // NaN: keep it a NaN
    return uint16_t((bits >> 16) | 0x0040u);
  uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb; // carries into the exponent when rounding up
  return uint16_t(bits >> 16);
}

inline float float_from_bf16(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

} // namespace planrt

#endif
