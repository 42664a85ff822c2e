// Context parallelism's attention tiles on a GPU against the host functors
// (cp_attention_cases.h's cases; blocks_test runs the same ones on the
// host). The device suite (bench/gpu/run.sh) runs it: with one GPU lent,
// NCCL cannot run a cp plan's two ranks there, so this is where the tiles
// meet a GPU. fp32 cases run the fp32 tiles, 16-bit ones the tensor-core
// tiles. Prints each case's worst relative error and exits 1 where one is
// above its tolerance (cp_tolerance), or where the tiles do not run.
//   cp_tiles_gpu [N...]   only cases N (1-based; the suite's sanitizer runs
//                         take one fp32 and one 16-bit case)
#include "cp_attention_cases.h"
#include "cuda/attention_cp.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

using namespace planrt;

namespace {

void check(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "cp_tiles_gpu: CUDA error %s in %s\n",
                 cudaGetErrorString(e), what);
    std::exit(2);
  }
}

/// A host vector's copy on the device, copied back by `back`.
template <class T> struct Device {
  T *p = nullptr;
  size_t n;
  explicit Device(const std::vector<T> &v) : n(v.size()) {
    check(cudaMalloc(&p, n * sizeof(T) + 16), "cudaMalloc");
    check(cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice),
          "copy in");
  }
  void back(std::vector<T> &v) const {
    check(cudaDeviceSynchronize(), "the tiles");
    check(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost),
          "copy out");
  }
  ~Device() { cudaFree(p); }
  Device(const Device &) = delete;
  Device &operator=(const Device &) = delete;
};

bool ran = true; // every part took the tiles

struct GpuCpTiles {
  template <class T>
  void forward(const kernels::AttnCp &c, const kernels::KvBlock &kb,
               const std::vector<T> &qkv, const std::vector<T> &blk,
               std::vector<float> &acc, std::vector<float> &ml) const {
    Device<T> q(qkv), b(blk);
    Device<float> a(acc), m(ml);
    ran &= cuda_attention_cp::forward(
        nullptr, kernels::AttentionBlockFn<T>{q.p, b.p, a.p, m.p, c, kb});
    a.back(acc);
    m.back(ml);
  }
  template <class T>
  void grad_q(const kernels::AttnCp &c, const kernels::KvBlock &kb,
              const std::vector<T> &qkv, const std::vector<T> &blk,
              const std::vector<T> &dout, const std::vector<float> &ml,
              const std::vector<float> &delta, std::vector<float> &dq) const {
    Device<T> q(qkv), b(blk), dy(dout);
    Device<float> m(ml), dl(delta), g(dq);
    ran &= cuda_attention_cp::grad_q(
        nullptr, kernels::AttentionBlockGradQFn<T>{q.p, b.p, dy.p, m.p, dl.p,
                                                   g.p, c, kb});
    g.back(dq);
  }
  template <class T>
  void grad_kv(const kernels::AttnCp &c, const kernels::KvBlock &kb,
               const std::vector<T> &qkv, const std::vector<T> &blk,
               const std::vector<T> &dout, const std::vector<float> &ml,
               const std::vector<float> &delta, std::vector<float> &dkv) const {
    Device<T> q(qkv), b(blk), dy(dout);
    Device<float> m(ml), dl(delta), g(dkv);
    ran &= cuda_attention_cp::grad_kv(
        nullptr, kernels::AttentionBlockGradKVFn<T>{q.p, b.p, dy.p, m.p, dl.p,
                                                    g.p, c, kb});
    g.back(dkv);
  }
};

} // namespace

int main(int argc, char **argv) {
  double worst = 0; // relative to each case's tolerance
  int cases = 0, bad = 0;
  std::vector<test::CpCase> all = test::cp_cases();
  for (const test::CpCase &cs : test::cp_cases_16bit())
    all.push_back(cs);
  std::vector<bool> wanted(all.size(), argc < 2);
  for (int i = 1; i < argc; ++i) {
    const int n = std::atoi(argv[i]);
    if (n < 1 || n > (int)all.size()) {
      std::fprintf(stderr, "cp_tiles_gpu: no case %s (1 to %zu)\n", argv[i],
                   all.size());
      return 2;
    }
    wanted[n - 1] = true;
  }
  const char *names[] = {"fp32", "bf16", "fp16"};
  for (size_t n = 0; n < all.size(); ++n) {
    if (!wanted[n])
      continue;
    const test::CpCase &cs = all[n];
    const double tol = test::cp_tolerance(cs, true);
    double err = 0;
    std::string where;
    auto report = [&](const std::string &what, double e) {
      if (!(e <= err)) { // NaN included
        err = e;
        where = what;
      }
    };
    test::with_store(cs, [&](auto e) {
      test::run_cp_case<decltype(e)>(cs, GpuCpTiles(), report);
    });
    ++cases;
    const bool good = err <= tol;
    const int number = (int)n + 1;
    bad += !good;
    worst = err / tol > worst || err != err ? err / tol : worst;
    std::printf("case %d (%s, %s%s): worst %.2e (<= %g) at %s%s\n", number,
                cs.ring ? "ring" : "all_gather", names[(int)cs.store],
                cs.dropout ? ", dropout" : "", err, tol, where.c_str(),
                good ? "" : "  FAIL");
  }
  std::printf("cp tiles: %d cases, worst relative error %.2f of its "
              "tolerance (<= 1)%s\n",
              cases, worst, ran ? "" : "; some part did not take the tiles");
  return bad || !ran ? 1 : 0;
}
