//===- typed_vectors.h - Test data in a kernel's element type ---*- C++ -*-===//
//
// Converts test vectors between float and an element type of kernels.h
// (float, bf16_t, f16_t) with the kernels' own ld / st, so that a 16-bit
// input is rounded as the kernels round it; and the relative error the
// kernel tests compare them by.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_TEST_TYPED_VECTORS_H
#define PLANRT_TEST_TYPED_VECTORS_H

#include "planrt/kernels.h"

#include <cmath>
#include <vector>

namespace planrt {
namespace test {

/// x in T (16-bit types: rounded).
template <class T> std::vector<T> narrow(const std::vector<float> &x) {
  std::vector<T> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    kernels::st(out[i], x[i]);
  return out;
}
/// ||a - b|| / ||b|| (1 in place of a zero norm).
inline double rel_err(const std::vector<float> &a,
                      const std::vector<float> &b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

/// x's values as floats.
template <class T> std::vector<float> widen(const std::vector<T> &x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = kernels::ld(x[i]);
  return out;
}

} // namespace test
} // namespace planrt

#endif // PLANRT_TEST_TYPED_VECTORS_H
