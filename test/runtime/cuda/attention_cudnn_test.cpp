// How the cuda backend decides where 16-bit attention runs
// (runtime/lib/cuda/attention_cudnn.cpp), on a machine without a GPU: what
// PLANRT_ATTENTION and PLANRT_CUDNN_LIBRARY do, and what the user is told
// when cuDNN cannot run (the tiles then run, or, with
// PLANRT_ATTENTION=cudnn, the program stops and says why). Each case runs
// in a child process: the choice is made once per process. On a machine
// with a GPU these cases are skipped (the device suite runs cuDNN there).
// The frontend's checks of the suite's graphs (validate()) need no GPU and
// run everywhere.
#include "cp_attention_cases.h"
#include "cuda/attention_cp.h"
#include "cuda/attention_cudnn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace planrt;
namespace cudnn = planrt::cuda_attention::cudnn;

namespace {

kernels::AttnShape shape() {
  kernels::AttnShape a;
  a.B = 2;
  a.S = 128;
  a.H = 4;
  a.KV = 2;
  a.D = 64;
  a.scale = 0.125f;
  return a;
}

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// In the child: asks whether cuDNN runs the forward and the backward of
/// `a` (with attention dropout or not), prints the status line and what
/// was decided to stderr, exits 0.
[[noreturn]] void decide(const char *mode, const char *library,
                         kernels::AttnShape a = shape(), bool dropout = false) {
  if (mode)
    setenv("PLANRT_ATTENTION", mode, 1);
  else
    unsetenv("PLANRT_ATTENTION");
  if (library)
    setenv("PLANRT_CUDNN_LIBRARY", library, 1);
  bool f = cudnn::runs_forward(a, true, false, dropout);
  bool b = cudnn::runs_backward(a, true, dropout);
  std::fprintf(stderr, "forward %d backward %d held %zu: %s\n", f, b,
               cudnn::bytes_held(), cudnn::status());
  std::exit(0);
}

class AttentionCudnn : public ::testing::Test {
protected:
  void SetUp() override {
    if (has_gpu())
      GTEST_SKIP() << "a GPU is present: bench/gpu's suite runs cuDNN there";
  }
};

TEST_F(AttentionCudnn, TilesWhenTurnedOff) {
  EXPECT_EXIT(decide("tiles", nullptr), ::testing::ExitedWithCode(0),
              "forward 0 backward 0 held 0: 16-bit attention runs planrt's "
              "tiles \\(PLANRT_ATTENTION=tiles\\)");
}

TEST_F(AttentionCudnn, UnknownModeIsAnError) {
  EXPECT_EXIT(decide("flash", nullptr), ::testing::ExitedWithCode(1),
              "planrt: error: PLANRT_ATTENTION=flash: expected auto \\(cuDNN "
              "where it runs, else planrt's tiles\\), cudnn \\(fatal where "
              "cuDNN cannot run\\) or tiles");
}

#ifdef PLANRT_TEST_CUDNN_FRONTEND
TEST_F(AttentionCudnn, WhatCudnnNeverRunsIsFatalWhenRequired) {
  // Attention dropout (the host's mask) and head dims cuDNN does not take
  // stop a PLANRT_ATTENTION=cudnn run before any device work.
  EXPECT_EXIT(decide("cudnn", nullptr, shape(), true),
              ::testing::ExitedWithCode(1),
              "planrt: error: PLANRT_ATTENTION=cudnn, but cuDNN cannot run "
              "attention of bf16 B 2 S 128 H 4 KV 2 D 64: attention dropout "
              "draws planrt's own mask, which cuDNN cannot draw");
  kernels::AttnShape odd = shape();
  odd.D = 12;
  EXPECT_EXIT(decide("cudnn", nullptr, odd), ::testing::ExitedWithCode(1),
              "cuDNN cannot run attention of bf16 B 2 S 128 H 4 KV 2 D 12: "
              "cuDNN's flash attention takes head dims that are multiples of "
              "8, up to 256");
  // Not required: the tiles run them.
  EXPECT_EXIT(decide("auto", "/nonexistent/libcudnn.so.9", odd),
              ::testing::ExitedWithCode(0), "forward 0 backward 0 held 0");
}

TEST_F(AttentionCudnn, MissingLibraryRunsTheTiles) {
  EXPECT_EXIT(decide(nullptr, "/nonexistent/libcudnn.so.9"),
              ::testing::ExitedWithCode(0),
              "forward 0 backward 0 held 0: 16-bit attention runs planrt's "
              "tiles: cuDNN 9 was not found \\(/nonexistent/libcudnn.so.9: "
              ".*\\); put libcudnn.so.9 on LD_LIBRARY_PATH or name it in "
              "PLANRT_CUDNN_LIBRARY");
}

TEST_F(AttentionCudnn, MissingLibraryIsFatalWhenRequired) {
  EXPECT_EXIT(decide("cudnn", "/nonexistent/libcudnn.so.9"),
              ::testing::ExitedWithCode(1),
              "planrt: error: PLANRT_ATTENTION=cudnn, but cuDNN 9 was not "
              "found");
}

TEST_F(AttentionCudnn, NoDeviceRunsTheTiles) {
  // cuDNN loads (the CUDA install's), but without a GPU no handle is made.
  EXPECT_EXIT(decide("auto", nullptr), ::testing::ExitedWithCode(0),
              "forward 0 backward 0 held 0: 16-bit attention runs planrt's "
              "tiles: (cudnnCreate failed|loading cuDNN failed)");
}
#else
TEST_F(AttentionCudnn, BuiltWithoutTheFrontend) {
  EXPECT_EXIT(decide(nullptr, nullptr), ::testing::ExitedWithCode(0),
              "forward 0 backward 0 held 0: 16-bit attention runs planrt's "
              "tiles: this planrt was built without cuDNN's frontend");
  EXPECT_EXIT(decide("cudnn", nullptr), ::testing::ExitedWithCode(1),
              "PLANRT_ATTENTION=cudnn, but this planrt was built without "
              "cuDNN's frontend");
}
#endif

/// What cuDNN's SDPA graphs compute for problem `p` (attention_cudnn.h's
/// contract), on the host in fp32 over the same strided views: row i of
/// each head sees keys up to i (+ sk - sq when aligned to the last key),
/// or every key when unmasked.
struct HostSdpa {
  const cudnn::Sdpa &p;
  int64_t last(int64_t i) const {
    if (!p.causal)
      return p.sk - 1;
    return i + (p.bottom_right ? p.sk - p.sq : 0);
  }
  const float *q(const float *b, int64_t n, int64_t h, int64_t i) const {
    return b + n * p.q_batch + h * p.D + i * p.q_row;
  }
  const float *kv(const float *b, int64_t n, int64_t g, int64_t j) const {
    return b + n * p.kv_batch + g * p.D + j * p.kv_row;
  }
  int64_t o(int64_t n, int64_t h, int64_t i) const {
    return n * p.o_batch + h * p.D + i * p.o_row;
  }
  float dot(const float *x, const float *y) const {
    float s = 0;
    for (int64_t d = 0; d < p.D; ++d)
      s += x[d] * y[d];
    return s;
  }
  /// out and, when not null, the log-sum-exp.
  void forward(const float *q0, const float *k0, const float *v0, float *out,
               float *lse) const {
    for (int64_t n = 0; n < p.B; ++n)
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t i = 0; i < p.sq; ++i) {
          const int64_t g = h / (p.H / p.KV);
          float m = -INFINITY, l = 0;
          for (int64_t j = 0; j <= last(i); ++j)
            m = std::fmax(m, p.scale * dot(q(q0, n, h, i), kv(k0, n, g, j)));
          std::vector<float> acc((size_t)p.D, 0.0f);
          for (int64_t j = 0; j <= last(i); ++j) {
            float e =
                std::exp(p.scale * dot(q(q0, n, h, i), kv(k0, n, g, j)) - m);
            l += e;
            for (int64_t d = 0; d < p.D; ++d)
              acc[d] += e * kv(v0, n, g, j)[d];
          }
          for (int64_t d = 0; d < p.D; ++d)
            out[o(n, h, i) + d] = acc[d] / l;
          if (lse)
            lse[(n * p.H + h) * p.stats_head + i] = m + std::log(l);
        }
  }
  /// dq (overwritten), dk and dv (overwritten: keys 0..sk-1).
  void backward(const float *q0, const float *k0, const float *v0,
                const float *out, const float *lse, const float *dout,
                float *dq, float *dk, float *dv) const {
    for (int64_t n = 0; n < p.B; ++n)
      for (int64_t g = 0; g < p.KV; ++g)
        for (int64_t j = 0; j < p.sk; ++j)
          for (int64_t d = 0; d < p.D; ++d) {
            const_cast<float *>(kv(dk, n, g, j))[d] = 0;
            const_cast<float *>(kv(dv, n, g, j))[d] = 0;
          }
    for (int64_t n = 0; n < p.B; ++n)
      for (int64_t h = 0; h < p.H; ++h)
        for (int64_t i = 0; i < p.sq; ++i) {
          const int64_t g = h / (p.H / p.KV);
          const float *qi = q(q0, n, h, i), *dyi = dout + o(n, h, i);
          const float L = lse[(n * p.H + h) * p.stats_head + i];
          const float delta = dot(dyi, out + o(n, h, i));
          float *dqi = const_cast<float *>(q(dq, n, h, i));
          for (int64_t d = 0; d < p.D; ++d)
            dqi[d] = 0;
          for (int64_t j = 0; j <= last(i); ++j) {
            const float pr = std::exp(p.scale * dot(qi, kv(k0, n, g, j)) - L);
            const float ds = pr * (dot(dyi, kv(v0, n, g, j)) - delta);
            float *dkj = const_cast<float *>(kv(dk, n, g, j)),
                  *dvj = const_cast<float *>(kv(dv, n, g, j));
            for (int64_t d = 0; d < p.D; ++d) {
              dqi[d] += p.scale * ds * kv(k0, n, g, j)[d];
              dkj[d] += p.scale * ds * qi[d];
              dvj[d] += pr * dyi[d];
            }
          }
        }
  }
};

/// all_gather's whole attention as attention_cp.cu runs it on cuDNN
/// (cudnn_chunks, a chunk's forward again before its backward, its dk and
/// dv added up), each chunk run by HostSdpa. With `keep`, as a plan that
/// keeps the forward's output and log-sum-exps (attention_cp_lse): the
/// forward writes each chunk's into one buffer of cudnn_cp_lse_floats (NaN
/// before: a chunk's that overlaps another's, or one never written, shows
/// in the backward's results), the backward reads them instead.
struct HostCpChunks {
  bool keep = false;
  mutable std::vector<float> kept_out, kept_lse;

  bool forward(const kernels::AttnCp &c, const std::vector<float> &qkv,
               const std::vector<float> &kv, std::vector<float> &out) const {
    const kernels::AttnShape &a = c.a;
    namespace ws = workspace::outside;
    kept_lse.assign((size_t)ws::cudnn_cp_lse_floats(a.B, a.H, a.S), NAN);
    for (const cuda_attention_cp::CudnnChunk &k :
         cuda_attention_cp::cudnn_chunks(c, true)) {
      const int64_t at = ws::cudnn_cp_lse_at(a.B, a.H, k.row0);
      EXPECT_EQ(at % 4, 0) << "16-byte aligned";
      EXPECT_LE(at + a.B * a.H * k.problem.sq, (int64_t)kept_lse.size());
      HostSdpa{k.problem}.forward(qkv.data() + k.row0 * a.width(), kv.data(),
                                  kv.data() + a.KV * a.D,
                                  out.data() + k.row0 * a.H * a.D,
                                  keep ? kept_lse.data() + at : nullptr);
    }
    kept_out = out;
    return true;
  }
  bool backward(const kernels::AttnCp &c, const std::vector<float> &qkv,
                const std::vector<float> &kv, const std::vector<float> &dout,
                std::vector<float> &dqkv, std::vector<float> &dkv) const {
    const kernels::AttnShape &a = c.a;
    std::vector<float> o((size_t)(a.B * a.S * a.H * a.D)),
        lse((size_t)workspace::outside::cudnn_cp_lse(a.B, a.H, a.S) / 4),
        part(dkv.size());
    if (keep) {
      o = kept_out;
      lse = kept_lse;
    }
    std::fill(dkv.begin(), dkv.end(), 0.0f);
    for (const cuda_attention_cp::CudnnChunk &k :
         cuda_attention_cp::cudnn_chunks(c, true)) {
      const HostSdpa sdpa{k.problem};
      const float *q = qkv.data() + k.row0 * a.width();
      const int64_t at = k.row0 * a.H * a.D;
      float *stats =
          lse.data() + workspace::outside::cudnn_cp_lse_at(a.B, a.H, k.row0);
      if (!keep)
        sdpa.forward(q, kv.data(), kv.data() + a.KV * a.D, o.data() + at,
                     stats);
      sdpa.backward(q, kv.data(), kv.data() + a.KV * a.D, o.data() + at, stats,
                    dout.data() + at, dqkv.data() + k.row0 * a.width(),
                    part.data(), part.data() + a.KV * a.D);
      for (int64_t n = 0; n < a.B; ++n)
        for (int64_t i = 0; i < k.problem.sk * c.kvWidth(); ++i)
          dkv[n * c.S * c.kvWidth() + i] += part[n * c.S * c.kvWidth() + i];
    }
    return true;
  }
};

/// ring's blocks as attention_cp.cu runs them on cuDNN
/// (cudnn_ring_chunks; each chunk's output and log-sum-exp merged into the
/// running statistics; its backward from the ring's output and the final
/// log-sum-exps, its dq and dk, dv added up), each chunk run by HostSdpa
/// and the merges by the functors the GPU runs.
struct HostRingChunks {
  bool forward(const kernels::AttnCp &c, const kernels::KvBlock &kb,
               const std::vector<float> &qkv, const std::vector<float> &blk,
               std::vector<float> &acc, std::vector<float> &ml) const {
    const kernels::AttnShape &a = c.a;
    const auto cs = cuda_attention_cp::cudnn_ring_chunks(c, kb, true);
    std::vector<float> part((size_t)(a.B * a.S * a.H * a.D), NAN);
    for (const cuda_attention_cp::CudnnChunk &k : cs) {
      std::vector<float> lse((size_t)(a.B * a.H * k.problem.sq), NAN);
      HostSdpa{k.problem}.forward(qkv.data() + k.row0 * a.width(), blk.data(),
                                  blk.data() + a.KV * a.D,
                                  part.data() + k.row0 * a.H * a.D, lse.data());
      kernels::AttentionMergeFn<float> m{part.data(), lse.data(), acc.data(),
                                         ml.data(),   a,          k.row0,
                                         k.problem.sq};
      for (int64_t r = 0; r < a.B * a.H * k.problem.sq; ++r)
        m(r);
    }
    return !cs.empty();
  }
  bool backward(const kernels::AttnCp &c, const kernels::KvBlock &kb,
                const std::vector<float> &qkv, const std::vector<float> &blk,
                const std::vector<float> &dout, const std::vector<float> &out,
                const std::vector<float> &ml, std::vector<float> &dq,
                std::vector<float> &dkv) const {
    const kernels::AttnShape &a = c.a;
    const auto cs = cuda_attention_cp::cudnn_ring_chunks(c, kb, true);
    std::vector<float> dq16(qkv.size(), NAN), part(dkv.size(), NAN);
    for (const cuda_attention_cp::CudnnChunk &k : cs) {
      const int64_t rows = k.problem.sq;
      std::vector<float> lse((size_t)(a.B * a.H * rows));
      kernels::RowLseFn fl{ml.data(), lse.data(), a, k.row0, rows};
      for (int64_t r = 0; r < a.B * a.H * rows; ++r)
        fl(r);
      const int64_t at = k.row0 * a.H * a.D;
      HostSdpa{k.problem}.backward(qkv.data() + k.row0 * a.width(), blk.data(),
                                   blk.data() + a.KV * a.D, out.data() + at,
                                   lse.data(), dout.data() + at,
                                   dq16.data() + k.row0 * a.width(),
                                   part.data(), part.data() + a.KV * a.D);
      kernels::DqAddFn<float> fq{dq16.data(), dq.data(), a, k.row0, rows};
      for (int64_t e = 0; e < a.B * a.H * rows * a.D; ++e)
        fq(e);
      for (int64_t n = 0; n < a.B; ++n)
        for (int64_t i = 0; i < k.problem.sk * c.kvWidth(); ++i)
          dkv[n * kb.rows * c.kvWidth() + i] +=
              part[n * kb.rows * c.kvWidth() + i];
    }
    return !cs.empty();
  }
};

} // namespace

// ring's blocks as attention_cp.cu hands them to cuDNN (a chunk or two of
// the rank's queries over the block's first keys, masked or not), merged
// into the running statistics and differentiated from the ring's output:
// the functors' ring attention, for every rank. The device suite runs
// cuDNN itself on the same cases (bench/gpu cp-cudnn).
TEST(AttentionCpCudnn, RingChunksAreTheFunctorsRing) {
  for (test::CpCase cs : test::cp_cases_cudnn_ring()) {
    cs.store = test::CpStore::f32;
    for (int64_t g = 0; g < cs.G; ++g) {
      cs.g = g;
      SCOPED_TRACE("G " + std::to_string(cs.G) + " g " + std::to_string(g) +
                   " D " + std::to_string(cs.D));
      int reports = 0;
      EXPECT_TRUE(test::run_cp_ring_case<float>(
          cs, HostRingChunks(), [&](const std::string &what, double err) {
            ++reports;
            EXPECT_LE(err, 1e-5) << what;
          }));
      EXPECT_EQ(reports, 2 + 2 * cs.G);
    }
  }
}

// The chunks of each block: every key a row may see, once, and no other.
TEST(AttentionCpCudnn, RingChunksCoverEachRowsKeysOnce) {
  for (int64_t G : {1, 2, 3, 4})
    for (int64_t g = 0; g < G; ++g) {
      kernels::AttnCp c;
      c.a = shape();
      c.a.S = 10;
      c.S = c.a.S * G;
      c.part = {g, G};
      std::vector<int> seen((size_t)(c.a.S * c.S), 0);
      for (int64_t o = 0; o < G; ++o) {
        const kernels::KvBlock kb{c.a.S, {o, G}};
        for (const auto &k : cuda_attention_cp::cudnn_ring_chunks(c, kb, true))
          for (int64_t i = 0; i < k.problem.sq; ++i)
            for (int64_t j = 0; j < k.problem.sk; ++j) {
              const cudnn::Sdpa &p = k.problem;
              if (p.causal && j > i + (p.bottom_right ? p.sk - p.sq : 0))
                continue;
              ++seen[(size_t)((k.row0 + i) * c.S + kb.position(j))];
            }
      }
      for (int64_t t = 0; t < c.a.S; ++t)
        for (int64_t p = 0; p < c.S; ++p)
          EXPECT_EQ(seen[(size_t)(t * c.S + p)],
                    p <= c.part.position(t, c.a.S) ? 1 : 0)
              << "G " << G << " g " << g << " row " << t << " key " << p;
    }
}

// The chunks attention_cp.cu hands cuDNN, read as cuDNN's SDPA reads them,
// are all_gather's attention: the device suite compares cuDNN itself
// (bench/gpu cp-cudnn), this the decomposition and the views.
TEST(AttentionCpCudnn, ChunksAreTheFunctorsAttention) {
  for (test::CpCase cs : test::cp_cases_cudnn()) {
    cs.store = test::CpStore::f32;
    for (int64_t g = 0; g < cs.G; ++g) { // every rank's chunks
      cs.g = g;
      SCOPED_TRACE("G " + std::to_string(cs.G) + " g " + std::to_string(g) +
                   " D " + std::to_string(cs.D));
      for (bool keep : {false, true}) {
        SCOPED_TRACE(keep ? "from the kept log-sum-exps" : "recomputed");
        int reports = 0;
        HostCpChunks chunks;
        chunks.keep = keep;
        EXPECT_TRUE(test::run_cp_whole_case<float>(
            cs, chunks, [&](const std::string &what, double err) {
              ++reports;
              EXPECT_LE(err, 1e-5) << what;
            }));
        EXPECT_EQ(reports, 3);
      }
    }
  }
}

#ifdef PLANRT_TEST_CUDNN_FRONTEND
/// In the child: asks cuDNN to run all_gather's attention of rank 1 of 2
/// (with attention dropout or not; operands that are never read), prints
/// whether it ran and the status line to stderr, exits 0.
[[noreturn]] void decide_cp(const char *mode, bool dropout) {
  setenv("PLANRT_ATTENTION", mode, 1);
  kernels::AttnCp c;
  c.a = shape();
  c.a.S = 70;
  c.S = 140;
  c.part = {1, 2};
  if (dropout)
    c.drop = kernels::AttnDropout::make(0.1f, 7, 1, 2, 1, 4);
  // 16-byte aligned addresses: nothing is launched where cuDNN declines.
  auto *p = reinterpret_cast<kernels::bf16_t *>(uintptr_t(1) << 20);
  bool f =
      cuda_attention_cp::cudnn_forward<kernels::bf16_t>(nullptr, c, p, p, p);
  std::fprintf(stderr, "cp forward %d: %s\n", f, cudnn::status());
  std::exit(0);
}

/// The problems the device suite and the examples hand cuDNN: one GPU's
/// attention of GPT-2 124M (B 16, S 1024, 12 heads of 64), of the suite's
/// tiny plans (tiny-gpt B 16 or 8 S 64 H 4 D 16; its long variant S 130 H
/// 2 D 64, B 4; tiny-llama B 8 S 32 H 4 KV 2 D 16), each bf16 and fp16; and
/// all_gather's chunks of every rank of cp_cases_cudnn and of llama-long
/// (cp 4 of 131072 positions, 16 query and 4 key heads of 128 at tp 2).
std::vector<cudnn::Sdpa> suite_problems() {
  std::vector<cudnn::Sdpa> ps;
  auto whole = [&](int64_t B, int64_t S, int64_t H, int64_t KV, int64_t D) {
    kernels::AttnShape a{B, S, H, KV, D, 1.0f / std::sqrt((float)D)};
    for (bool bf16 : {true, false})
      ps.push_back(cudnn::Sdpa::whole(a, bf16));
  };
  whole(16, 1024, 12, 12, 64);
  whole(16, 64, 4, 4, 16);
  whole(8, 64, 4, 4, 16);
  whole(4, 130, 2, 2, 64);
  whole(8, 32, 4, 2, 16);
  auto chunks = [&](const kernels::AttnCp &c, bool bf16) {
    for (const cuda_attention_cp::CudnnChunk &k :
         cuda_attention_cp::cudnn_chunks(c, bf16))
      ps.push_back(k.problem);
  };
  for (test::CpCase cs : test::cp_cases_cudnn())
    for (cs.g = 0; cs.g < cs.G; ++cs.g)
      chunks(test::CpSetup(cs).c, cs.store == test::CpStore::bf16);
  kernels::AttnCp c;
  c.a = {1, 32768, 16, 4, 128, 1.0f / std::sqrt(128.0f)};
  c.S = 131072;
  // ring's blocks: the cases', and llama-long's with cp_comm = ring (every
  // block of ranks 0 and 3; the chunks' shapes repeat).
  auto ring = [&](const kernels::AttnCp &c, bool bf16) {
    for (int64_t o = 0; o < c.part.G; ++o)
      for (const cuda_attention_cp::CudnnChunk &k :
           cuda_attention_cp::cudnn_ring_chunks(
               c, kernels::KvBlock{c.a.S, {o, c.part.G}}, bf16))
        ps.push_back(k.problem);
  };
  for (test::CpCase cs : test::cp_cases_cudnn_ring())
    for (cs.g = 0; cs.g < cs.G; ++cs.g)
      ring(test::CpSetup(cs).c, cs.store == test::CpStore::bf16);
  for (int64_t g = 0; g < 4; ++g) {
    c.part = {g, 4};
    chunks(c, true);
    if (g == 0 || g == 3)
      ring(c, true);
  }
  return ps;
}

/// In the child: every suite problem's graphs through the frontend's
/// checks for Hopper (sm 90) and Ampere (sm 80); prints each failure and
/// exits with their count.
[[noreturn]] void validate_suite() {
  int bad = 0, n = 0;
  for (int sm : {90, 80})
    for (const cudnn::Sdpa &p : suite_problems()) {
      ++n;
      std::string why = cudnn::validate(p, true, sm);
      if (!why.empty()) {
        std::fprintf(stderr, "sm %d: %s\n", sm, why.c_str());
        ++bad;
      }
    }
  std::fprintf(stderr, "%d problems checked against cuDNN %zu's rules\n", n,
               cudnn::library_version());
  std::exit(bad);
}

/// In the child: a backward whose log-sum-exp is strided (each head's rows
/// 8 floats apart more than packed), which cuDNN before 9.26 reads wrong:
/// the frontend refuses it, and validate() says so.
[[noreturn]] void validate_strided_stats() {
  kernels::AttnShape a{2, 64, 4, 2, 64, 0.125f};
  cudnn::Sdpa p = cudnn::Sdpa::whole(a, true);
  p.stats_head = p.sq + 8;
  std::fprintf(stderr, "%zu: %s\n", cudnn::library_version(),
               cudnn::validate(p, true, 90).c_str());
  std::exit(0);
}

// Whether the graphs the suite will build pass the frontend's checks can
// be known here, without a GPU: a mistake in their dims, strides or
// masks shows before a device session is spent on it.
TEST(AttentionCudnnGraphs, TheSuitesProblemsPassTheFrontendsChecks) {
  EXPECT_EXIT(validate_suite(), ::testing::ExitedWithCode(0),
              "problems checked against cuDNN 9[0-9]+'s rules");
}

TEST(AttentionCudnnGraphs, AStridedLogSumExpIsRefusedBefore926) {
  EXPECT_EXIT(
      validate_strided_stats(), ::testing::ExitedWithCode(0),
      "(9[01][0-9]{3}|92[0-5][0-9]{2}): the deterministic backward of bf16 B 2 "
      "S 64 H 4 KV 2 D 64: .*packed BHSD|(92[6-9][0-9]{2}|9[3-9][0-9]{3}): "
      "$");
}

TEST_F(AttentionCudnn, CpAttentionDropoutIsFatalWhenRequired) {
  EXPECT_EXIT(decide_cp("cudnn", true), ::testing::ExitedWithCode(1),
              "planrt: error: PLANRT_ATTENTION=cudnn, but cuDNN cannot run "
              "attention of bf16 B 2 S 35 over 70 keys H 4 KV 2 D 64: "
              "attention dropout draws planrt's own mask");
  EXPECT_EXIT(decide_cp("tiles", false), ::testing::ExitedWithCode(0),
              "cp forward 0: 16-bit attention runs planrt's tiles "
              "\\(PLANRT_ATTENTION=tiles\\)");
}
#endif

TEST(AttentionCpCudnn, ChunksOfTheLastRankReachEveryKey) {
  kernels::AttnCp c;
  c.a = {1, 8, 2, 1, 16, 0.25f};
  c.S = 32;
  c.part = {3, 4};
  auto cs = cuda_attention_cp::cudnn_chunks(c, false);
  ASSERT_EQ(cs.size(), 2u);
  // Rank 3 of 4: chunks 3 and 4 of 8 (4 rows each).
  EXPECT_EQ(cs[0].row0, 0);
  EXPECT_EQ(cs[0].problem.sq, 4);
  EXPECT_EQ(cs[0].problem.sk, 16);
  EXPECT_EQ(cs[1].row0, 4);
  EXPECT_EQ(cs[1].problem.sk, 20);
  EXPECT_TRUE(cs[1].problem.bottom_right);
  // Each chunk's log-sum-exp packed (cuDNN < 9.26 reads no strided one).
  EXPECT_EQ(cs[0].problem.stats_head, cs[0].problem.sq);
  EXPECT_EQ(cs[1].problem.stats_head, cs[1].problem.sq);
  EXPECT_FALSE(cs[1].problem.bf16);
}
