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
//                                cuDNN declines is fatal, with its reason),
//                                each case twice: its backward running the
//                                forward again, and from the forward's kept
//                                output and log-sum-exps; then ring's
//                                blocks on cuDNN (cp_cases_cudnn_ring),
//                                every rank's
//   cp_tiles_gpu --speed         all_gather's bf16 attention of a 32k-token
//                                sequence (cp 4, rank 1; 8 query heads and 1
//                                key head of 128: Llama-70B's at tp 8) timed
//                                on cuDNN and on the tiles: the first
//                                measure of what planc's cost model says
//                                (the tiles several times slower)
#include "cp_attention_cases.h"
#include "cuda/attention_cp.h"
#include "cuda/attention_cudnn.h"
#include "planrt/workspace.h"

#include <algorithm>
#include <cmath>
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
/// With `keep`, as a plan that keeps them (plan-keep-attention): the
/// forward writes its chunks' log-sum-exps to a buffer of
/// cudnn_cp_lse_floats (NaN before, so that `kept_ok` can tell whether
/// cuDNN wrote every chunk's), which the backward reads with the forward's
/// output instead of running the forward again.
struct GpuCpCudnn {
  bool keep = false;
  mutable std::vector<char> out_bytes; // the forward's output, kept
  mutable std::vector<float> lse;
  mutable bool kept_ok = true;

  template <class T>
  bool forward(const kernels::AttnCp &c, const std::vector<T> &qkv,
               const std::vector<T> &kv, std::vector<T> &out) const {
    Device<T> q(qkv), k(kv), o(out);
    namespace ws = workspace::outside;
    Device<float> l(std::vector<float>(
        (size_t)ws::cudnn_cp_lse_floats(c.a.B, c.a.H, c.a.S), NAN));
    if (!cuda_attention_cp::cudnn_forward<T>(nullptr, c, q.p, k.p, o.p,
                                             keep ? l.p : nullptr))
      return false;
    o.back(out);
    if (keep) {
      l.back(lse);
      out_bytes.assign((const char *)out.data(),
                       (const char *)(out.data() + out.size()));
      for (const cuda_attention_cp::CudnnChunk &ch :
           cuda_attention_cp::cudnn_chunks(
               c, std::is_same<T, kernels::bf16_t>::value)) {
        const int64_t at = ws::cudnn_cp_lse_at(c.a.B, c.a.H, ch.row0);
        for (int64_t i = 0; i < c.a.B * c.a.H * ch.problem.sq; ++i)
          kept_ok &= std::isfinite(lse[(size_t)(at + i)]);
      }
    }
    return true;
  }
  template <class T>
  bool backward(const kernels::AttnCp &c, const std::vector<T> &qkv,
                const std::vector<T> &kv, const std::vector<T> &dout,
                std::vector<T> &dqkv, std::vector<float> &dkv) const {
    Device<T> q(qkv), k(kv), dy(dout), dx(dqkv);
    Device<float> g(dkv);
    std::vector<T> fwd_out(out_bytes.size() / sizeof(T));
    if (keep)
      std::memcpy(fwd_out.data(), out_bytes.data(), out_bytes.size());
    Device<T> fo(fwd_out);
    Device<float> l(keep ? lse : std::vector<float>(1));
    if (!cuda_attention_cp::cudnn_backward<T>(nullptr, c, q.p, k.p, dy.p, dx.p,
                                              g.p, keep ? fo.p : nullptr,
                                              keep ? l.p : nullptr))
      return false;
    dx.back(dqkv);
    g.back(dkv);
    return true;
  }
};

/// ring's blocks on cuDNN, one at a time, over host vectors.
struct GpuRingCudnn {
  template <class T>
  bool forward(const kernels::AttnCp &c, const kernels::KvBlock &kb,
               const std::vector<T> &qkv, const std::vector<T> &blk,
               std::vector<float> &acc, std::vector<float> &ml) const {
    Device<T> q(qkv), b(blk),
        part(std::vector<T>((size_t)(c.a.B * c.a.S * c.a.H * c.a.D)));
    Device<float> a(acc), m(ml);
    if (!cuda_attention_cp::cudnn_ring_forward<T>(nullptr, c, kb, q.p, b.p,
                                                  part.p, a.p, m.p))
      return false;
    a.back(acc);
    m.back(ml);
    return true;
  }
  template <class T>
  bool backward(const kernels::AttnCp &c, const kernels::KvBlock &kb,
                const std::vector<T> &qkv, const std::vector<T> &blk,
                const std::vector<T> &dout, const std::vector<T> &out,
                const std::vector<float> &ml, std::vector<float> &dq,
                std::vector<float> &dkv) const {
    Device<T> q(qkv), b(blk), dy(dout), o(out), dq16(qkv);
    Device<float> m(ml), g(dq), gkv(dkv);
    if (!cuda_attention_cp::cudnn_ring_backward<T>(
            nullptr, c, kb, q.p, b.p, dy.p, o.p, m.p, g.p, gkv.p, dq16.p))
      return false;
    g.back(dq);
    gkv.back(dkv);
    return true;
  }
};

/// Milliseconds per call of f() on the GPU: the median of 5 after one
/// untimed call (cuDNN builds its graphs there).
template <class F> double time_ms(const F &f) {
  f();
  check(cudaDeviceSynchronize(), "the warm-up call");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> ms;
  for (int i = 0; i < 5; ++i) {
    check(cudaEventRecord(start), "cudaEventRecord");
    f();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "the timed call");
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms[ms.size() / 2];
}

/// --speed: cuDNN's whole attention against the tiles' three kernels (the
/// op's fills, finish and dq copy left out) on one large problem.
int speed() {
  using T = kernels::bf16_t;
  kernels::AttnCp c;
  c.a = {1, 8192, 8, 1, 128, 1.0f / std::sqrt(128.0f)};
  c.part = {1, 4};
  c.S = c.a.S * 4;
  const kernels::AttnShape &a = c.a;
  const int64_t rows = a.B * a.H * a.S;
  test::CpSetup setup(
      {a.B, a.S, a.H, a.KV, a.D, 4, 1, false, false, test::CpStore::bf16, 51});
  auto values = [&](int64_t n) { return test::narrow<T>(setup.random(n)); };
  Device<T> qkv(values(a.B * a.S * a.width())),
      kv(values(a.B * c.S * c.kvWidth())), dout(values(rows * a.D)),
      out(std::vector<T>((size_t)(rows * a.D))),
      dqkv(std::vector<T>((size_t)(a.B * a.S * a.width())));
  Device<float> acc(std::vector<float>((size_t)(rows * a.D), 0.0f)),
      ml(std::vector<float>((size_t)(2 * rows), 0.0f)),
      delta(std::vector<float>((size_t)rows, 0.0f)),
      dq(std::vector<float>((size_t)(rows * a.D), 0.0f)),
      dkv(std::vector<float>((size_t)(a.B * c.S * c.kvWidth()), 0.0f));
  const kernels::KvBlock kb{c.S, {0, 1}};
  bool ok = true;
  const double cudnn_fwd = time_ms([&] {
    ok &= cuda_attention_cp::cudnn_forward<T>(nullptr, c, qkv.p, kv.p, out.p);
  });
  const double cudnn_grad = time_ms([&] {
    ok &= cuda_attention_cp::cudnn_backward<T>(nullptr, c, qkv.p, kv.p, dout.p,
                                               dqkv.p, dkv.p);
  });
  // The gradient from the forward's kept output and log-sum-exps.
  Device<float> lse(std::vector<float>(
      (size_t)workspace::outside::cudnn_cp_lse_floats(a.B, a.H, a.S), 0.0f));
  ok &= cuda_attention_cp::cudnn_forward<T>(nullptr, c, qkv.p, kv.p, out.p,
                                            lse.p);
  const double cudnn_kept = time_ms([&] {
    ok &= cuda_attention_cp::cudnn_backward<T>(nullptr, c, qkv.p, kv.p, dout.p,
                                               dqkv.p, dkv.p, out.p, lse.p);
  });
  auto forward = [&] {
    ok &= cuda_attention_cp::forward(
        nullptr, kernels::AttentionBlockFn<T>{qkv.p, kv.p, acc.p, ml.p, c, kb});
  };
  const double tiles_fwd = time_ms(forward);
  forward(); // the statistics the gradients read (their values do not matter)
  const double tiles_grad = time_ms([&] {
    forward();
    ok &= cuda_attention_cp::grad_q(
        nullptr, kernels::AttentionBlockGradQFn<T>{qkv.p, kv.p, dout.p, ml.p,
                                                   delta.p, dq.p, c, kb});
    ok &= cuda_attention_cp::grad_kv(
        nullptr, kernels::AttentionBlockGradKVFn<T>{qkv.p, kv.p, dout.p, ml.p,
                                                    delta.p, dkv.p, c, kb});
  });
  // ring on cuDNN, its G blocks without the shifts (the first L rows of kv
  // stand for each block): the forward, and the gradient as the op runs it
  // (the forward's ring again, then each block's backward).
  auto ring_forward = [&] {
    for (int64_t o = 0; o < c.part.G; ++o)
      ok &= cuda_attention_cp::cudnn_ring_forward<T>(
          nullptr, c, kernels::KvBlock{a.S, {o, c.part.G}}, qkv.p, kv.p, out.p,
          acc.p, ml.p);
  };
  const double ring_fwd = time_ms(ring_forward);
  const double ring_grad = time_ms([&] {
    ring_forward();
    for (int64_t o = 0; o < c.part.G; ++o)
      ok &= cuda_attention_cp::cudnn_ring_backward<T>(
          nullptr, c, kernels::KvBlock{a.S, {o, c.part.G}}, qkv.p, kv.p, dout.p,
          out.p, ml.p, dq.p, dkv.p, dqkv.p);
  });
  std::printf("attention: %s\n", cuda_attention::cudnn::status());
  std::printf("cp speed (bf16, B 1, %lld tokens, cp 4 rank 1, H 8, KV 1, D "
              "128): cudnn forward %.3f ms, gradient %.3f ms (%.3f ms from "
              "the kept log-sum-exps); tiles forward %.3f ms, gradient %.3f "
              "ms; tiles/cudnn %.1fx; ring on cudnn forward %.3f ms, "
              "gradient %.3f ms (its forward again included), "
              "ring/all_gather %.2fx%s\n",
              (long long)c.S, cudnn_fwd, cudnn_grad, cudnn_kept, tiles_fwd,
              tiles_grad, (tiles_fwd + tiles_grad) / (cudnn_fwd + cudnn_kept),
              ring_fwd, ring_grad,
              (ring_fwd + ring_grad) / (cudnn_fwd + cudnn_kept),
              ok ? "" : "; some part did not run");
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
  if (argc > 1 && std::strcmp(argv[1], "--speed") == 0)
    return speed();
  double worst = 0; // relative to each case's tolerance
  int cases = 0, bad = 0;
  const bool cudnn = argc > 1 && std::strcmp(argv[1], "--cudnn") == 0;
  const int first = cudnn ? 2 : 1;
  std::vector<test::CpCase> all =
      cudnn ? test::cp_cases_cudnn() : test::cp_cases();
  for (const test::CpCase &cs :
       cudnn ? test::cp_cases_cudnn_ring() : test::cp_cases_16bit())
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
      else if constexpr (sizeof(T) == 2) {
        if (cs.ring) { // every rank's blocks
          test::CpCase r = cs;
          for (r.g = 0; r.g < r.G; ++r.g)
            ran &= test::run_cp_ring_case<T>(r, GpuRingCudnn(), report);
          return;
        }
        ran &= test::run_cp_whole_case<T>(cs, GpuCpCudnn(), report);
        // Again from the kept output and log-sum-exps.
        GpuCpCudnn kept;
        kept.keep = true;
        ran &= test::run_cp_whole_case<T>(
            cs, kept, [&](const std::string &what, double e) {
              report(what + ", kept", e);
            });
        if (!kept.kept_ok)
          std::printf("case %d: cuDNN left a chunk's log-sum-exp unwritten\n",
                      (int)n + 1);
        ran &= kept.kept_ok;
      }
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
