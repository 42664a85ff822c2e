// The fp32 peak bench/host.sh reports against, measured rather than looked
// up (a VM's /proc/cpuinfo shows the nominal clock, not the one the cores
// run at): every thread runs independent FMA chains at the widest vector
// width the CPU has (AVX-512, else AVX2 + FMA), so the rate is
// threads x FMA units x lanes x 2 x the clock as it is. Next to it, the best
// rate of a large SGEMM (oneDNN's, the GEMM planrt uses) on the same threads.
//
//   g++ -O2 -fopenmp bench/peak.cpp -ldnnl -o peak && ./peak THREADS
// prints: "fma <ISA> <GFLOP/s>" and "sgemm <N> <GFLOP/s>".
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <immintrin.h>
#include <vector>

namespace {
constexpr long kIters = 200'000'000 / 8;

// 12 independent accumulators cover FMA latency (4) x units (2), with room;
// spelled out so that they stay in registers.
#define PEAK_FMA_LOOP(V, SET1, FMA, ADD)                                       \
  V x = SET1(1.0000001f), y = SET1(seed);                                      \
  V a0 = SET1(0), a1 = SET1(1), a2 = SET1(2), a3 = SET1(3), a4 = SET1(4),      \
    a5 = SET1(5), a6 = SET1(6), a7 = SET1(7), a8 = SET1(8), a9 = SET1(9),      \
    a10 = SET1(10), a11 = SET1(11);                                            \
  for (long i = 0; i < kIters; ++i) {                                          \
    a0 = FMA(a0, x, y), a1 = FMA(a1, x, y), a2 = FMA(a2, x, y);                \
    a3 = FMA(a3, x, y), a4 = FMA(a4, x, y), a5 = FMA(a5, x, y);                \
    a6 = FMA(a6, x, y), a7 = FMA(a7, x, y), a8 = FMA(a8, x, y);                \
    a9 = FMA(a9, x, y), a10 = FMA(a10, x, y), a11 = FMA(a11, x, y);            \
  }                                                                            \
  V s = ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7)));     \
  s = ADD(s, ADD(ADD(a8, a9), ADD(a10, a11)));

__attribute__((target("avx512f"))) double fma512(float seed) {
  PEAK_FMA_LOOP(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps)
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) double fma256(float seed) {
  PEAK_FMA_LOOP(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps)
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

double seconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
} // namespace

int main(int argc, char **argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : omp_get_max_threads();
  omp_set_num_threads(threads);
  bool avx512 = __builtin_cpu_supports("avx512f");
  int lanes = avx512 ? 16 : 8;
  double best = 0, sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    double t0 = seconds();
#pragma omp parallel reduction(+ : sink)
    sink += avx512 ? fma512(1e-9f) : fma256(1e-9f);
    double t = seconds() - t0;
    double flops = double(threads) * kIters * 12 * lanes * 2;
    if (flops / t > best)
      best = flops / t;
  }
  std::printf("fma %s %.1f\n", avx512 ? "AVX-512" : "AVX2", best / 1e9);

  const long n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double gemm = 0;
  for (int rep = 0; rep < 5; ++rep) {
    double t0 = seconds();
    dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
               c.data(), n);
    double t = seconds() - t0;
    if (2.0 * n * n * n / t > gemm)
      gemm = 2.0 * n * n * n / t;
  }
  std::printf("sgemm %ld %.1f\n", n, gemm / 1e9);
  return sink == 12345.0 ? 1 : 0; // uses sink so the FMA loops stay
}
