// Context parallelism's attention tiles on a GPU against the host functors
// (cp_attention_cases.h's cases; blocks_test runs the same ones on the
// host). The device suite (bench/gpu/run.sh) runs it: with one GPU lent,
// NCCL cannot run a cp plan's two ranks there, so this is where the tiles
// meet a GPU. fp32 cases run the fp32 tiles, 16-bit ones the tensor-core
// tiles. Prints each case's worst relative error and exits 1 where one is
// above its tolerance (cp_tolerance), or where the tiles do not run.
//   cp_tiles_gpu [N...]          only cases N (1-based; the suite's
//                                sanitizer runs take one fp32 and one 16-bit
//                                case)
//   cp_tiles_gpu --cudnn [N...]  all_gather's 16-bit attention whole on
//                                cuDNN instead (cp_cases_cudnn; the suite
//                                sets PLANRT_ATTENTION=cudnn, so a case
//                                cuDNN declines is fatal, with its reason)
#include "cp_attention_cases.h"
#include "cuda/attention_cp.h"
#include "cuda/attention_cudnn.h"

#include <cstring>

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

/// all_gather's whole attention and gradient on cuDNN, over host vectors.
struct GpuCpCudnn {
  template <class T>
  bool forward(const kernels::AttnCp &c, const std::vector<T> &qkv,
               const std::vector<T> &kv, std::vector<T> &out) const {
    Device<T> q(qkv), k(kv), o(out);
    if (!cuda_attention_cp::cudnn_forward<T>(nullptr, c, q.p, k.p, o.p))
      return false;
    o.back(out);
    return true;
  }
  template <class T>
  bool backward(const kernels::AttnCp &c, const std::vector<T> &qkv,
                const std::vector<T> &kv, const std::vector<T> &dout,
                std::vector<T> &dqkv, std::vector<float> &dkv) const {
    Device<T> q(qkv), k(kv), dy(dout), dx(dqkv);
    Device<float> g(dkv);
    if (!cuda_attention_cp::cudnn_backward<T>(nullptr, c, q.p, k.p, dy.p, dx.p,
                                              g.p))
      return false;
    dx.back(dqkv);
    g.back(dkv);
    return true;
  }
};

} // namespace

int main(int argc, char **argv) {
  double worst = 0; // relative to each case's tolerance
  int cases = 0, bad = 0;
  const bool cudnn = argc > 1 && std::strcmp(argv[1], "--cudnn") == 0;
  const int first = cudnn ? 2 : 1;
  std::vector<test::CpCase> all =
      cudnn ? test::cp_cases_cudnn() : test::cp_cases();
  if (!cudnn)
    for (const test::CpCase &cs : test::cp_cases_16bit())
      all.push_back(cs);
  std::vector<bool> wanted(all.size(), argc <= first);
  for (int i = first; i < argc; ++i) {
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
    const double tol =
        cudnn ? test::cp_cudnn_tolerance(cs) : test::cp_tolerance(cs, true);
    double err = 0;
    std::string where;
    auto report = [&](const std::string &what, double e) {
      if (!(e <= err)) { // NaN included
        err = e;
        where = what;
      }
    };
    test::with_store(cs, [&](auto e) {
      using T = decltype(e);
      if (!cudnn)
        test::run_cp_case<T>(cs, GpuCpTiles(), report);
      else if constexpr (sizeof(T) == 2)
        ran &= test::run_cp_whole_case<T>(cs, GpuCpCudnn(), report);
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
  if (cudnn)
    std::printf("attention: %s\n", cuda_attention::cudnn::status());
  std::printf("cp %s: %d cases, worst relative error %.2f of its "
              "tolerance (<= 1)%s\n",
              cudnn ? "cudnn" : "tiles", cases, worst,
              ran     ? ""
              : cudnn ? "; cuDNN did not run some case (the attention line)"
                      : "; some part did not take the tiles");
  return bad || !ran ? 1 : 0;
}
