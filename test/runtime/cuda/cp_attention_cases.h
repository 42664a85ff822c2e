//===- cp_attention_cases.h - Context parallelism's tiles vs functors -----===//
//
// The cases that compare the cuda backend's context-parallel attention tiles
// (runtime/lib/cuda/attention_cp_blocks.h) with the block functors of
// context_parallel.h, for two runners of the tiles: blocks_test runs them
// on the host (block.h's OpenMP emulation), cp_tiles_gpu.cu on a GPU (the
// device suite), so the same cases check the indexing there and the device
// code here.
//
// A case is rank g of G: all_gather's one block of every position, or
// ring's G blocks of one rank each in the ring's order, the running
// statistics carried from block to block. Each gradient starts from random
// values (the tiles must add to them), and what was added is compared;
// each part reads the functors' statistics, so it is checked alone.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_TEST_CUDA_CP_ATTENTION_CASES_H
#define PLANRT_TEST_CUDA_CP_ATTENTION_CASES_H

#include "../typed_vectors.h"
#include "planrt/context_parallel.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace planrt {
namespace test {

/// The storage type of qkv, the blocks and dout.
enum class CpStore { f32, bf16, f16 };

struct CpCase {
  int64_t B, L, H, KV, D; // L: this rank's rows (even)
  int64_t G, g;
  bool ring, dropout;
  CpStore store;
  uint32_t seed;
};

/// L 70 rows a rank: chunks of 35 positions, so a query tile spans both of
/// a rank's chunks and ends partial; grouped query heads; every head dim
/// with tiles; dropout by global position. fp32 storage: fp32 plans' tiles.
inline std::vector<CpCase> cp_cases() {
  using S = CpStore;
  return {
      {2, 70, 4, 2, 16, 2, 0, false, false, S::f32, 21},
      {2, 70, 4, 2, 16, 2, 1, true, false, S::f32, 22},
      {1, 130, 2, 1, 64, 3, 1, true, false, S::f32, 23},
      {1, 64, 2, 2, 32, 4, 3, false, false, S::f32, 24},
      {1, 20, 2, 1, 128, 2, 0, true, false, S::f32, 25},
      {2, 70, 4, 2, 16, 2, 1, true, true, S::f32, 27},
      {1, 130, 2, 1, 64, 2, 0, false, true, S::f32, 28},
  };
}

/// The same kinds of case in 16-bit storage: bf16 and fp16 plans' tiles (on
/// the tensor cores on a GPU; they round p and ds to the 16-bit type).
inline std::vector<CpCase> cp_cases_16bit() {
  using S = CpStore;
  return {
      {2, 70, 4, 2, 16, 2, 0, false, false, S::bf16, 31},
      {1, 70, 4, 2, 32, 2, 1, true, false, S::f16, 32},
      {1, 130, 2, 1, 64, 3, 1, true, false, S::bf16, 33},
      {1, 20, 2, 1, 128, 2, 0, true, false, S::f16, 34},
      {2, 70, 4, 2, 16, 2, 1, true, true, S::bf16, 35},
      {1, 130, 2, 1, 64, 2, 0, false, true, S::f16, 36},
  };
}

/// f<T>() with T the case's storage type.
template <class F> void with_store(const CpCase &cs, const F &f) {
  switch (cs.store) {
  case CpStore::f32:
    return f(float());
  case CpStore::bf16:
    return f(kernels::bf16_t());
  case CpStore::f16:
    return f(kernels::f16_t());
  }
}

/// What a 16-bit case's tiles may differ by from the fp32 functors on the
/// same values (tensor cores: p and ds rounded to 16 bits), and an fp32
/// case's (the order of the sums).
inline double cp_tolerance(const CpCase &cs, bool tensor_cores) {
  if (!tensor_cores || cs.store == CpStore::f32)
    return 1e-5;
  return cs.store == CpStore::f16 ? 1e-3 : 5e-3;
}

/// The relative error of what was added to `start`: got - start against
/// want - start.
inline double cp_added_err(const std::vector<float> &got,
                           const std::vector<float> &want,
                           const std::vector<float> &start) {
  std::vector<float> g(got.size()), w(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    g[i] = got[i] - start[i];
    w[i] = want[i] - start[i];
  }
  return rel_err(g, w);
}

/// Case `cs`'s problem (rank g of G, its dropout) and a generator of its
/// random values.
struct CpSetup {
  kernels::AttnCp c;
  std::mt19937 gen;
  std::normal_distribution<float> nd{0.0f, 1.0f};
  explicit CpSetup(const CpCase &cs) : gen(cs.seed) {
    c.a = {cs.B, cs.L, cs.H, cs.KV, cs.D, 1.0f / std::sqrt((float)cs.D)};
    c.part = {cs.g, cs.G};
    c.S = cs.L * cs.G;
    // p = 0.2 at batch row 3 and head 1 of a global [8, 6, S, S].
    if (cs.dropout)
      c.drop = kernels::AttnDropout::make(0.2f, kernels::mix64(77), 3, 8, 1, 6);
  }
  std::vector<float> random(int64_t n) {
    std::vector<float> v((size_t)n);
    for (float &x : v)
      x = nd(gen);
    return v;
  }
};

/// The functors' forward over block kb: merged into acc, ml.
template <class T>
void functor_forward(const kernels::AttnCp &c, const kernels::KvBlock &kb,
                     const std::vector<T> &qkv, const std::vector<T> &blk,
                     std::vector<float> &acc, std::vector<float> &ml) {
  kernels::AttentionBlockFn<T> f{qkv.data(), blk.data(), acc.data(),
                                 ml.data(),  c,          kb};
  for (int64_t i = 0; i < c.a.B * c.a.H * c.a.S; ++i)
    f(i);
}

/// The functors' gradients of block kb, added to dq and dkv.
template <class T>
void functor_grads(const kernels::AttnCp &c, const kernels::KvBlock &kb,
                   const std::vector<T> &qkv, const std::vector<T> &blk,
                   const std::vector<T> &dout, const std::vector<float> &ml,
                   const std::vector<float> &delta, std::vector<float> &dq,
                   std::vector<float> &dkv) {
  kernels::AttentionBlockGradQFn<T> fq{
      qkv.data(),   blk.data(), dout.data(), ml.data(),
      delta.data(), dq.data(),  c,           kb};
  for (int64_t i = 0; i < c.a.B * c.a.H * c.a.S; ++i)
    fq(i);
  kernels::AttentionBlockGradKVFn<T> fkv{
      qkv.data(),   blk.data(), dout.data(), ml.data(),
      delta.data(), dkv.data(), c,           kb};
  for (int64_t i = 0; i < c.a.B * c.a.KV * kb.rows; ++i)
    fkv(i);
}

/// Block kb's gradients from random starts: the functors' against
/// add(dq, dkv) (which adds its own and returns whether it ran), compared
/// by what each added; false where add did not run.
template <class T, class Add, class Report>
bool compare_block_grads(CpSetup &setup, const kernels::KvBlock &kb,
                         const std::vector<T> &qkv, const std::vector<T> &blk,
                         const std::vector<T> &dout,
                         const std::vector<float> &ml,
                         const std::vector<float> &delta,
                         const std::string &name, const Add &add,
                         const Report &report) {
  const kernels::AttnCp &c = setup.c;
  const std::vector<float> dq0 = setup.random(c.a.B * c.a.H * c.a.S * c.a.D),
                           dkv0 = setup.random(c.a.B * kb.rows * c.kvWidth());
  std::vector<float> dq_ref(dq0), dq(dq0), dkv_ref(dkv0), dkv(dkv0);
  functor_grads(c, kb, qkv, blk, dout, ml, delta, dq_ref, dkv_ref);
  if (!add(dq, dkv))
    return false;
  report("dq, " + name, cp_added_err(dq, dq_ref, dq0));
  report("dkv, " + name, cp_added_err(dkv, dkv_ref, dkv0));
  return true;
}

/// Runs case `cs` with storage T through `tiles` (forward, grad_q, grad_kv
/// over host vectors, with the functors' arguments) and the functors;
/// calls report(what, relative error) for every compared tensor.
template <class T, class Tiles, class Report>
void run_cp_case(const CpCase &cs, const Tiles &tiles, const Report &report) {
  CpSetup setup(cs);
  const kernels::AttnCp &c = setup.c;
  const kernels::AttnShape &a = c.a;
  const int64_t rows = a.B * a.H * a.S, D = a.D;
  auto random = [&](int64_t n) { return setup.random(n); };
  // Ring step s holds rank (g - s) mod G's keys.
  std::vector<kernels::KvBlock> kbs;
  if (cs.ring)
    for (int64_t s = 0; s < cs.G; ++s)
      kbs.push_back({a.S, {(cs.g - s + cs.G) % cs.G, cs.G}});
  else
    kbs.push_back({c.S, {0, 1}});
  const std::vector<T> qkv = narrow<T>(random(a.B * a.S * a.width()));
  const std::vector<T> dout = narrow<T>(random(rows * D));
  std::vector<std::vector<T>> blks;
  for (const kernels::KvBlock &kb : kbs)
    blks.push_back(narrow<T>(random(a.B * kb.rows * c.kvWidth())));
  const std::string name = "D " + std::to_string(D) + ", G " +
                           std::to_string(cs.G) + ", g " +
                           std::to_string(cs.g) + ", block ";

  // Forward: acc and ml after every block.
  std::vector<float> acc_ref((size_t)(rows * D), 0.0f), ml_ref(2 * rows, 0.0f);
  std::vector<float> acc(acc_ref), ml(ml_ref);
  for (size_t k = 0; k < kbs.size(); ++k) {
    functor_forward(c, kbs[k], qkv, blks[k], acc_ref, ml_ref);
    tiles.forward(c, kbs[k], qkv, blks[k], acc, ml);
    report("acc, " + name + std::to_string(k), rel_err(acc, acc_ref));
    report("ml, " + name + std::to_string(k), rel_err(ml, ml_ref));
  }
  std::vector<float> delta((size_t)rows);
  kernels::AttentionFinishFn<T> fin{acc_ref.data(), ml_ref.data(), nullptr,
                                    dout.data(),    delta.data(),  a};
  for (int64_t i = 0; i < rows; ++i)
    fin(i);

  // Backward, block by block.
  for (size_t k = 0; k < kbs.size(); ++k)
    compare_block_grads(
        setup, kbs[k], qkv, blks[k], dout, ml_ref, delta,
        name + std::to_string(k),
        [&](std::vector<float> &dq, std::vector<float> &dkv) {
          tiles.grad_q(c, kbs[k], qkv, blks[k], dout, ml_ref, delta, dq);
          tiles.grad_kv(c, kbs[k], qkv, blks[k], dout, ml_ref, delta, dkv);
          return true;
        },
        report);
}

/// all_gather's 16-bit attention without dropout, which the cuda backend
/// runs whole on cuDNN (attention_cp.cu cudnn_forward, cudnn_backward):
/// chunks of 64 and of an odd 35 rows, grouped queries down to one key
/// head (Llama-70B's at tp 8), head dims 32 to 128, a first and a last
/// rank.
inline std::vector<CpCase> cp_cases_cudnn() {
  using S = CpStore;
  return {
      {2, 128, 4, 2, 64, 2, 0, false, false, S::bf16, 41},
      {1, 256, 8, 1, 128, 4, 1, false, false, S::f16, 42},
      {1, 70, 4, 2, 32, 2, 1, false, false, S::bf16, 43},
      {2, 64, 2, 1, 128, 4, 3, false, false, S::bf16, 44},
  };
}

/// What cuDNN's whole attention may differ by from the fp32 functors on the
/// same values: its output, dq and each chunk's dk, dv are rounded to the
/// 16-bit type (the functors keep dq and dkv in fp32), and its products
/// round p and ds.
inline double cp_cudnn_tolerance(const CpCase &cs) {
  return cs.store == CpStore::f16 ? 3e-3 : 2e-2;
}

/// Runs all_gather case `cs` whole through `whole` (forward(c, qkv, kv,
/// out) and backward(c, qkv, kv, dout, dqkv, dkv), each returning whether
/// it ran) and the functors; calls report(what, relative error) for the
/// output, dq (dqkv's query columns) and dkv. False where `whole` did not
/// run.
template <class T, class Whole, class Report>
bool run_cp_whole_case(const CpCase &cs, const Whole &whole,
                       const Report &report) {
  CpSetup setup(cs);
  const kernels::AttnCp &c = setup.c;
  const kernels::AttnShape &a = c.a;
  const int64_t rows = a.B * a.H * a.S, D = a.D;
  auto random = [&](int64_t n) { return setup.random(n); };
  const kernels::KvBlock kb{c.S, {0, 1}};
  const std::vector<T> qkv = narrow<T>(random(a.B * a.S * a.width()));
  const std::vector<T> kv = narrow<T>(random(a.B * c.S * c.kvWidth()));
  const std::vector<T> dout = narrow<T>(random(rows * D));

  // The functors: the op's forward, then its backward from zero.
  std::vector<float> acc((size_t)(rows * D), 0.0f), ml(2 * rows, 0.0f);
  functor_forward(c, kb, qkv, kv, acc, ml);
  std::vector<T> out_ref((size_t)(rows * D));
  std::vector<float> delta((size_t)rows);
  kernels::AttentionFinishFn<T> fin{acc.data(),  ml.data(),    out_ref.data(),
                                    dout.data(), delta.data(), a};
  for (int64_t i = 0; i < rows; ++i)
    fin(i);
  std::vector<float> dq_ref((size_t)(rows * D), 0.0f),
      dkv_ref((size_t)(a.B * c.S * c.kvWidth()), 0.0f);
  functor_grads(c, kb, qkv, kv, dout, ml, delta, dq_ref, dkv_ref);

  std::vector<T> out((size_t)(rows * D)), dqkv(qkv.size());
  std::vector<float> dkv = random(a.B * c.S * c.kvWidth()); // overwritten
  if (!whole.forward(c, qkv, kv, out) ||
      !whole.backward(c, qkv, kv, dout, dqkv, dkv))
    return false;
  // dq [B H L, D] from dqkv's query columns.
  std::vector<float> dq((size_t)(rows * D));
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = i % a.S, h = (i / a.S) % a.H, b = i / (a.S * a.H);
    for (int64_t d = 0; d < D; ++d)
      dq[i * D + d] = kernels::ld(dqkv[(b * a.S + t) * a.width() + h * D + d]);
  }
  const std::string name = "D " + std::to_string(D) + ", G " +
                           std::to_string(cs.G) + ", g " + std::to_string(cs.g);
  report("out, " + name, rel_err(widen(out), widen(out_ref)));
  report("dq, " + name, rel_err(dq, dq_ref));
  report("dkv, " + name, rel_err(dkv, dkv_ref));
  return true;
}

/// ring's 16-bit attention without dropout, which the cuda backend runs a
/// block at a time on cuDNN (attention_cp.cu cudnn_ring_forward,
/// cudnn_ring_backward): run for every rank g of G (blocks before, at and
/// after the rank's chunks), without context parallelism (G 1), grouped
/// queries down to one key head, head dims 32 to 128, chunks of an odd 35
/// rows.
inline std::vector<CpCase> cp_cases_cudnn_ring() {
  using S = CpStore;
  return {
      {2, 128, 4, 2, 64, 2, 0, true, false, S::bf16, 51},
      {1, 64, 8, 1, 128, 4, 0, true, false, S::f16, 52},
      {1, 70, 4, 2, 32, 3, 0, true, false, S::bf16, 53},
      {2, 48, 2, 1, 64, 1, 0, true, false, S::bf16, 54},
  };
}

/// Runs ring case `cs` (its rank g) through `blocks`, a block at a time in
/// the ring's order, against the functors; calls report(what, relative
/// error) for the output and log-sum-exps after the ring (the running
/// statistics themselves may differ: any maximum is one) and, for each
/// block, the dq and dkv it added. blocks.forward(c, kb, qkv, blk, acc, ml)
/// merges block kb into the running statistics; blocks.backward(c, kb, qkv,
/// blk, dout, out, ml, dq, dkv) adds its gradients from the ring's output
/// and final statistics (the functors'); each returns whether it ran. False
/// where some block did not.
template <class T, class Blocks, class Report>
bool run_cp_ring_case(const CpCase &cs, const Blocks &blocks,
                      const Report &report) {
  CpSetup setup(cs);
  const kernels::AttnCp &c = setup.c;
  const kernels::AttnShape &a = c.a;
  const int64_t rows = a.B * a.H * a.S, D = a.D;
  auto random = [&](int64_t n) { return setup.random(n); };
  std::vector<kernels::KvBlock> kbs;
  for (int64_t s = 0; s < cs.G; ++s)
    kbs.push_back({a.S, {(cs.g - s + cs.G) % cs.G, cs.G}});
  const std::vector<T> qkv = narrow<T>(random(a.B * a.S * a.width()));
  const std::vector<T> dout = narrow<T>(random(rows * D));
  std::vector<std::vector<T>> blks;
  for (const kernels::KvBlock &kb : kbs) {
    (void)kb;
    blks.push_back(narrow<T>(random(a.B * a.S * c.kvWidth())));
  }
  // The blocks' own key rows are the rank's (its qkv's key columns) at
  // step 0, as the ring starts from them.
  for (int64_t r = 0; r < a.B * a.S; ++r)
    for (int64_t j = 0; j < c.kvWidth(); ++j)
      blks[0][(size_t)(r * c.kvWidth() + j)] =
          qkv[(size_t)(r * a.width() + a.H * D + j)];
  const std::string name = "D " + std::to_string(D) + ", G " +
                           std::to_string(cs.G) + ", g " + std::to_string(cs.g);

  std::vector<float> acc_ref((size_t)(rows * D), 0.0f), ml_ref(2 * rows, 0.0f);
  std::vector<float> acc(acc_ref), ml(ml_ref);
  for (size_t k = 0; k < kbs.size(); ++k) {
    functor_forward(c, kbs[k], qkv, blks[k], acc_ref, ml_ref);
    if (!blocks.forward(c, kbs[k], qkv, blks[k], acc, ml))
      return false;
  }
  // The output and log-sum-exp each set of statistics means.
  auto finish = [&](const std::vector<float> &sa, const std::vector<float> &sm,
                    std::vector<float> &o, std::vector<float> &lse) {
    o.assign((size_t)(rows * D), 0.0f);
    lse.assign((size_t)rows, 0.0f);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t d = 0; d < D; ++d)
        o[(size_t)(i * D + d)] = sa[(size_t)(i * D + d)] / sm[2 * i + 1];
      lse[(size_t)i] = sm[2 * i] + std::log(sm[2 * i + 1]);
    }
  };
  std::vector<float> o_ref, lse_ref, o_got, lse_got;
  finish(acc_ref, ml_ref, o_ref, lse_ref);
  finish(acc, ml, o_got, lse_got);
  report("out, " + name, rel_err(o_got, o_ref));
  report("lse, " + name, rel_err(lse_got, lse_ref));

  // The ring's output as the op writes it, and delta, from the functors'.
  std::vector<T> out((size_t)(rows * D));
  std::vector<float> delta((size_t)rows);
  kernels::AttentionFinishFn<T> fin{acc_ref.data(), ml_ref.data(), out.data(),
                                    dout.data(),    delta.data(),  a};
  for (int64_t i = 0; i < rows; ++i)
    fin(i);
  for (size_t k = 0; k < kbs.size(); ++k)
    if (!compare_block_grads(
            setup, kbs[k], qkv, blks[k], dout, ml_ref, delta,
            name + ", block " + std::to_string(k),
            [&](std::vector<float> &dq, std::vector<float> &dkv) {
              return blocks.backward(c, kbs[k], qkv, blks[k], dout, out, ml_ref,
                                     dq, dkv);
            },
            report))
      return false;
  return true;
}

} // namespace test
} // namespace planrt

#endif // PLANRT_TEST_CUDA_CP_ATTENTION_CASES_H
