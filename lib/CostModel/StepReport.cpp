//===- StepReport.cpp - What one training step costs, read from the rank --===//
#include "planc/CostModel/StepReport.h"
#include "planc/Transforms/PipelineSchedule.h"

#include "dialects/plan/PlanDialect.h"
#include "dialects/rank/RankDialect.h"
#include "planrt/workspace.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <functional>

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;

namespace {
/// Bytes of a buffer of the rank IR, whose element types are real: with
/// mixed precision, activations are 16-bit while master weights, their
/// gradients and the optimizer state are f32.
double bufferBytes(Type t) {
  auto m = cast<MemRefType>(t);
  return double(m.getNumElements()) *
         double(m.getElementType().getIntOrFloatBitWidth()) / 8.0;
}

/// The share of another rank's rows that expert parallelism's all-to-all
/// dispatcher moves to a rank, under balanced routing: each row's top_k
/// distinct choices uniform over G * per_rank experts, the row moves when
/// one of them is the rank's, 1 - C(E - per_rank, k) / C(E, k).
double routedShare(int64_t group, int64_t perRank, int64_t k) {
  double e = double(group * perRank), none = 1;
  for (int64_t i = 0; i < k; ++i)
    none *= std::max(0.0, (e - double(perRank) - double(i)) / (e - double(i)));
  return 1 - none;
}
template <class Op> double routedShare(Op op, int64_t group) {
  return routedShare(group, op.getExpertsPerRank(),
                     op.getExperts().getType().getShape().back());
}
/// The bytes a routed collective would move densely: the gathered rows
/// (moved as they are), or the partial rows (summed in fp32).
double routedBytes(rk::RoutedAllGatherOp op) {
  return bufferBytes(op.getOut().getType());
}
double routedBytes(rk::RoutedReduceScatterOp op) {
  return double(op.getInput().getType().getNumElements()) * 4;
}
/// What it moves under balanced routing (the payload of its comm line).
template <class Op> double routedPayload(Op op, int64_t group) {
  return routedBytes(op) * routedShare(op, group);
}

/// What the rank that runs `op` sends per step for it, by (kind, axes).
struct Counter {
  plan::MeshOp mesh;
  std::map<std::pair<std::string, std::string>, CommLine> lines;

  int64_t groupOf(ArrayRef<StringRef> axes) {
    int64_t n = 1;
    for (StringRef a : axes)
      n *= mesh.getAxisSize(a);
    return n;
  }
  void add(StringRef kind, ArrayRef<StringRef> axes, double payload,
           double factor, double times) {
    int64_t n = groupOf(axes);
    if (n <= 1 && kind != "send")
      return; // a group of one rank moves nothing
    CommLine &l = lines[{kind.str(), llvm::join(axes, ",")}];
    l.kind = kind.str();
    l.axes = llvm::join(axes, ",");
    l.group = n;
    l.calls += (int64_t)times;
    l.payloadBytes += payload * times;
    double ring = kind == "all_reduce" ? 2.0 * double(n - 1) / double(n)
                  : kind == "send" || kind == "ring_shift"
                      ? 1.0
                      : double(n - 1) / double(n);
    l.sentBytes += payload * ring * factor * times;
  }
  void visit(Operation *op, double times) {
    auto axesOf = [](ArrayAttr a) {
      SmallVector<StringRef> out;
      for (Attribute x : a)
        out.push_back(cast<StringAttr>(x).getValue());
      return out;
    };
    if (auto ar = dyn_cast<rk::AllReduceOp>(op))
      add("all_reduce", axesOf(ar.getAxes()),
          bufferBytes(ar.getBuffer().getType()), 1, times);
    else if (auto ar = dyn_cast<rk::AllReduceStartOp>(op))
      add("all_reduce", axesOf(ar.getAxes()),
          bufferBytes(ar.getBuffer().getType()), 1, times);
    else if (auto g = dyn_cast<rk::AllGatherOp>(op))
      add("all_gather", {g.getAxis()}, bufferBytes(g.getOut().getType()), 1,
          times);
    else if (auto rs = dyn_cast<rk::ReduceScatterOp>(op))
      add("reduce_scatter", {rs.getAxis()},
          bufferBytes(rs.getInput().getType()), 1, times);
    else if (auto a2a = dyn_cast<rk::AllToAllOp>(op))
      add("all_to_all", {a2a.getAxis()}, bufferBytes(a2a.getInput().getType()),
          1, times);
    else if (auto d = dyn_cast<rk::RoutedAllGatherOp>(op))
      add("dispatch", {d.getAxis()}, routedPayload(d, groupOf({d.getAxis()})),
          1, times);
    else if (auto c = dyn_cast<rk::RoutedReduceScatterOp>(op))
      add("combine", {c.getAxis()}, routedPayload(c, groupOf({c.getAxis()})), 1,
          times);
    else if (auto s = dyn_cast<rk::SeqToHeadsOp>(op))
      add("all_to_all", {s.getAxis()}, bufferBytes(s.getInput().getType()), 1,
          times);
    else if (isa<rk::AttentionRingOp, rk::AttentionRingGradOp>(op)) {
      // The keys and values go round: G - 1 shifts of a rank's block (the
      // gradient: twice, once where it reads the forward's kept output and
      // log-sum-exps, and G shifts of their f32 gradients).
      StringRef axis = op->getAttrOfType<StringAttr>("axis").getValue();
      auto qkv = cast<MemRefType>(op->getOperand(0).getType());
      int64_t heads = op->getAttrOfType<IntegerAttr>("num_heads").getInt();
      int64_t kv = op->getAttrOfType<IntegerAttr>("num_kv_heads").getInt();
      double block = double(qkv.getNumElements()) / double(heads + 2 * kv) *
                     double(2 * kv);
      double width = bufferBytes(qkv) / double(qkv.getNumElements());
      double G = double(groupOf({axis}));
      auto grad = dyn_cast<rk::AttentionRingGradOp>(op);
      add("ring_shift", {axis}, block * width, 1,
          times * (grad && !grad.getLse() ? 2 : 1) * (G - 1));
      if (grad)
        add("ring_shift", {axis}, block * 4, 1, times * G);
    } else if (auto g = dyn_cast<rk::KvGatherOp>(op))
      add("all_gather", {g.getAxis()}, bufferBytes(g.getKv().getType()), 1,
          times);
    else if (auto rs = dyn_cast<rk::KvReduceScatterOp>(op))
      add("reduce_scatter", {rs.getAxis()}, bufferBytes(rs.getDkv().getType()),
          1, times);
    else if (auto s = dyn_cast<rk::HeadsToSeqOp>(op))
      add("all_to_all", {s.getAxis()}, bufferBytes(s.getInput().getType()), 1,
          times);
    else if (auto s = dyn_cast<rk::SendOp>(op))
      add("send", {"pp"}, bufferBytes(s.getBuffer().getType()), 1, times);
  }
};

int64_t stageOf(Operation *op) {
  auto s = op->getAttrOfType<IntegerAttr>(rk::kRankStageAttr);
  return s ? s.getInt() : -1;
}

std::pair<double, double> asMatrix(MemRefType t) {
  double cols = double(t.getShape().back());
  return {double(t.getNumElements()) / cols, cols};
}

std::vector<std::string> axesOf(ArrayAttr a) {
  std::vector<std::string> out;
  for (Attribute x : a)
    out.push_back(cast<StringAttr>(x).getValue().str());
  return out;
}

/// What one execution of a rank op costs on one rank.
struct OpCost {
  enum Kind { None, Gemm, Attention, Memory, Collective, Async };
  Kind kind = None;
  double flops = 0; // executed FLOPs
  double time = 0;  // seconds
};

/// The experts ops of a mixture of experts, whichever form (gelu or swiglu,
/// forward or gradient, kept or not): their choices and weights.
struct MoeExpertsView {
  Value experts, up, down, gate; // gate: swiglu's
  bool gated, grad, kept;
  StringRef expertAxis; // expert parallelism's axis, or ""
};
std::optional<MoeExpertsView> moeExpertsView(Operation *op) {
  auto view = [](auto o, Value gate, bool grad, bool kept) {
    return MoeExpertsView{o.getExperts(), o.getUp(),        o.getDown(),
                          gate,           bool(gate),       grad,
                          kept,           o.getExpertAxis()};
  };
  if (auto o = dyn_cast<rk::MoeExpertsOp>(op))
    return view(o, Value(), false, false);
  if (auto o = dyn_cast<rk::MoeExpertsSwigluOp>(op))
    return view(o, o.getGate(), false, false);
  if (auto o = dyn_cast<rk::MoeExpertsKeepOp>(op))
    return view(o, Value(), false, true);
  if (auto o = dyn_cast<rk::MoeExpertsSwigluKeepOp>(op))
    return view(o, o.getGate(), false, true);
  if (auto o = dyn_cast<rk::MoeExpertsGradOp>(op))
    return view(o, Value(), true, false);
  if (auto o = dyn_cast<rk::MoeExpertsSwigluGradOp>(op))
    return view(o, o.getGate(), true, false);
  if (auto o = dyn_cast<rk::MoeExpertsGradKeptOp>(op))
    return view(o, Value(), true, true);
  if (auto o = dyn_cast<rk::MoeExpertsSwigluGradKeptOp>(op))
    return view(o, o.getGate(), true, true);
  return std::nullopt;
}

/// Whether the cuda target's planrt may run `op` on cuDNN's SDPA
/// (planrt/workspace.h outside::cudnn_attention: 16 bits, no dropout, a head
/// size cuDNN takes): one GPU's attentions, and context parallelism's
/// all_gather (two chunks of queries over key prefixes) and ring (a chunk
/// or two of queries a block).
static bool mayRunCudnn(Operation *op) {
  if (!isa<rk::AttentionOp, rk::AttentionGradOp, rk::AttentionKeepOp,
           rk::AttentionGradKeptOp, rk::AttentionLseOp, rk::AttentionGradLseOp,
           rk::AttentionCpOp, rk::AttentionCpGradOp, rk::AttentionRingOp,
           rk::AttentionRingGradOp>(op))
    return false;
  auto qkv = cast<MemRefType>(op->getOperand(0).getType());
  int64_t h = op->getAttrOfType<IntegerAttr>("num_heads").getInt();
  int64_t kv = op->getAttrOfType<IntegerAttr>("num_kv_heads").getInt();
  auto dropout = op->getAttrOfType<FloatAttr>("dropout");
  return planrt::workspace::outside::cudnn_attention(
      !qkv.getElementType().isF32(), dropout && dropout.getValueAsDouble() > 0,
      qkv.getDimSize(2) / (h + 2 * kv));
}

/// Costs rank ops with the time model. Bytes are those of the buffers' real
/// element types (mixed precision: 16-bit activations, f32 master weights,
/// gradients and state); GEMMs run at the rate of the plan's precision.
struct OpCoster {
  TimeModel tm;
  double actBytes = 4;
  // The cuda target: attentions cuDNN runs are costed as the fused kernel
  // they are, not as Megatron-LM's materialized scores.
  bool cuda = false;
  std::vector<std::string> axes;
  std::vector<int64_t> sizes;
  std::map<std::vector<std::string>, Link> links;

  const Link &link(const std::vector<std::string> &g) {
    auto it = links.find(g);
    if (it == links.end())
      it = links.emplace(g, linkOf(tm.c, axes, sizes, g)).first;
    return it->second;
  }
  int64_t group(const std::vector<std::string> &g) {
    int64_t n = 1;
    for (size_t i = 0; i < axes.size(); ++i)
      if (std::find(g.begin(), g.end(), axes[i]) != g.end())
        n *= sizes[i];
    return n;
  }
  double elems(Value v) {
    return double(cast<MemRefType>(v.getType()).getNumElements());
  }
  double bytes(Value v) { return bufferBytes(v.getType()); }
  OpCost collective(StringRef kind, const std::vector<std::string> &g,
                    double bytes, bool async = false) {
    OpCost c;
    c.kind = async ? OpCost::Async : OpCost::Collective;
    c.time = tm.collectiveTime(kind, bytes, group(g), link(g));
    return c;
  }

  /// Ops the cuda backend queues and launches in batches
  /// (planrt/workspace.h outside::kAdamWBatch): 1 for an AdamW update, 2
  /// for the sum of squares of a small f32 tensor (with its chunks in
  /// `chunks`), 0 for every other op.
  int batchKind(Operation *op, int64_t &chunks) const {
    chunks = 0;
    if (!cuda)
      return 0;
    if (isa<rk::AdamWUpdateOp>(op))
      return 1;
    auto sq = dyn_cast<rk::SumSqAccumulateOp>(op);
    if (!sq)
      return 0;
    auto t = cast<MemRefType>(sq.getInput().getType());
    chunks = (t.getNumElements() + planrt::workspace::kReduceChunk - 1) /
             planrt::workspace::kReduceChunk;
    return t.getElementType().isF32() &&
                   chunks <= planrt::workspace::outside::kSumsqQueueChunks
               ? 2
               : 0;
  }

  OpCost cost(Operation *op) {
    OpCost c;
    auto gemm = [&](auto mm) {
      auto [ar, ac] = asMatrix(mm.getLhs().getType());
      auto [br, bc] = asMatrix(mm.getRhs().getType());
      double m = mm.getTransposeLhs() ? ac : ar;
      double k = mm.getTransposeLhs() ? ar : ac;
      double n = mm.getTransposeRhs() ? br : bc;
      c.kind = OpCost::Gemm;
      c.flops = 2 * m * n * k;
      c.time = tm.gemmTime(m, n, k, 1, actBytes);
      return c;
    };
    if (auto mm = dyn_cast<rk::MatmulOp>(op))
      return gemm(mm);
    // The bias (and GELU) in the GEMM's epilogue: no pass of their own.
    if (auto mm = dyn_cast<rk::MatmulBiasOp>(op))
      return gemm(mm);
    if (auto mm = dyn_cast<rk::MatmulBiasGeluOp>(op))
      return gemm(mm);
    // The GELU's derivative, or the bias gradient, in the backward GEMM's
    // epilogue: likewise.
    if (auto mm = dyn_cast<rk::MatmulDgeluOp>(op))
      return gemm(mm);
    if (auto mm = dyn_cast<rk::MatmulBiasGradOp>(op))
      return gemm(mm);
    if (isa<rk::AttentionOp, rk::AttentionGradOp, rk::AttentionKeepOp,
            rk::AttentionGradKeptOp, rk::AttentionLseOp, rk::AttentionGradLseOp,
            rk::AttentionCpOp, rk::AttentionCpGradOp, rk::AttentionRingOp,
            rk::AttentionRingGradOp>(op)) {
      // Costed as Megatron-LM (2021) runs it: batched GEMMs over the heads
      // and a materialized score matrix for the softmax; the backward keeps
      // the probabilities (dV, dP, dQ, dK: four GEMMs, twice the forward's
      // FLOPs, and a softmax backward reading P and dP and writing dS).
      // rank.attention_keep / attention_grad_kept (recompute = none) are
      // that; planrt's attention_grad recomputes q.k instead, costed alike.
      auto qkv = cast<MemRefType>(op->getOperand(0).getType());
      int64_t heads = op->getAttrOfType<IntegerAttr>("num_heads").getInt();
      int64_t kv = op->getAttrOfType<IntegerAttr>("num_kv_heads").getInt();
      // Context parallelism by all-gather: this rank's sq queries over
      // every position's sk keys.
      double b = qkv.getDimSize(0), sq = qkv.getDimSize(1), sk = sq;
      if (isa<rk::AttentionCpOp, rk::AttentionCpGradOp>(op))
        sk =
            double(cast<MemRefType>(op->getOperand(1).getType()).getDimSize(1));
      bool ring = isa<rk::AttentionRingOp, rk::AttentionRingGradOp>(op);
      std::vector<std::string> ringAxis;
      if (ring) {
        ringAxis = {op->getAttrOfType<StringAttr>("axis").getValue().str()};
        sk = sq * double(group(ringAxis));
      }
      double d = double(qkv.getDimSize(2)) / double(heads + 2 * kv);
      double bh = b * double(heads), scores = bh * sq * sk * actBytes;
      c.kind = OpCost::Attention;
      c.flops = 4 * bh * sq * sk * d;
      // The cuda target keeps no score matrix (plan-keep-attention): one
      // GPU's attention runs cuDNN's fused kernel where it may (a backward
      // without the kept output and log-sum-exp runs the forward again
      // first), else planrt's tiles.
      if (cuda && isa<rk::AttentionOp, rk::AttentionGradOp, rk::AttentionLseOp,
                      rk::AttentionGradLseOp>(op)) {
        bool grad = isa<rk::AttentionGradOp, rk::AttentionGradLseOp>(op);
        if (grad)
          c.flops *= 2;
        if (!mayRunCudnn(op)) {
          c.time = tm.tiledAttentionTime(bh, sq, sk, d, grad);
          return c;
        }
        c.time = tm.flashAttentionTime(bh, sq, sk, d, grad);
        if (isa<rk::AttentionGradOp>(op))
          c.time += tm.flashAttentionTime(bh, sq, sk, d, false);
        return c;
      }
      // all_gather's on cuDNN: the rank's two chunks of queries, each over
      // the keys before its end, together the causal work of its rows over
      // every key (two launches a pass). The gradient runs its backward
      // from the kept output and log-sum-exps (plan-keep-attention), or
      // each chunk's forward again first, and adds the chunk's f32 dk, dv.
      if (cuda && isa<rk::AttentionCpOp, rk::AttentionCpGradOp>(op) &&
          mayRunCudnn(op)) {
        double launch = tm.c.k.kernelLaunchS;
        auto grad = dyn_cast<rk::AttentionCpGradOp>(op);
        c.time = grad && grad.getLse()
                     ? 0
                     : tm.flashAttentionTime(bh, sq, sk, d, false) + launch;
        if (grad) {
          c.flops *= 2;
          double dkv = b * sk * 2 * double(kv) * d;
          c.time += tm.flashAttentionTime(bh, sq, sk, d, true) + launch +
                    tm.memoryTime(dkv * (4 + 2 * (2 + 8)));
        }
        return c;
      }
      // ring's blocks on cuDNN (attention_cp.cu cudnn_ring_chunks): per
      // rank G + 1 calls over at most its L rows of keys, the slowest
      // rank's costed. Its two chunks causal over its own block (the second
      // over all L keys: three quarters seen), then a call a block without
      // a mask (one chunk over the block, or both over its first chunk);
      // each forward's output merged into f32 running statistics. The
      // gradient runs that ring again, then each call's backward from the
      // ring's output and final log-sum-exps, adding its 16-bit dq and dk,
      // dv into f32 sums. The shifts overlap as with the tiles (below).
      if (cuda && ring && mayRunCudnn(op)) {
        double G = double(group(ringAxis)), half = sq / 2;
        double launch = tm.c.k.kernelLaunchS;
        auto pass = [&](bool backward) {
          auto call = [&](double q, double k, double seen) {
            double t = tm.flashAttentionTime(bh, q, k, d, backward, seen) +
                       launch + tm.memoryTime(bh * q * d * (4 + 4 + 2));
            if (backward) // the log-sum-exps, and dk, dv added up
              t += 2 * launch + tm.memoryTime(bh * q * 8) +
                   tm.memoryTime(b * k * 2 * double(kv) * d * (4 + 4 + 2));
            return t;
          };
          if (G <= 1)
            return call(sq, sq, 0.5);
          return call(half, half, 0.5) + call(half, sq, 0.75) +
                 (G - 1) * std::max(call(sq, half, 1), call(half, sq, 1));
        };
        double block = b * sq * 2 * double(kv) * d;
        double shift = tm.p2pTime(block * actBytes, link(ringAxis));
        double forward = std::max(pass(false), (G - 1) * shift);
        if (isa<rk::AttentionRingOp>(op)) {
          c.time = forward;
          return c;
        }
        double back = tm.p2pTime(block * 4, link(ringAxis));
        c.time = std::max(pass(true), (G - 1) * shift + G * back);
        c.flops = 2 * c.flops;
        if (!cast<rk::AttentionRingGradOp>(op).getLse()) {
          c.flops += c.flops / 2;
          c.time += forward;
        }
        return c;
      }
      // Context parallelism's all_gather and ring attentions on cuda:
      // planrt's tiles for a block of keys (attention_cp.cu), as one GPU's
      // tiles. Their gradient runs a forward first (the rows' statistics):
      // all_gather's inside the op, ring's as a ring of its own (below).
      // Other head dims run the reference loops, one thread per query row,
      // which nothing here models: costed as Megatron's (an underestimate;
      // planc warns where a plan lowers to them).
      const bool cpTiles =
          cuda &&
          isa<rk::AttentionCpOp, rk::AttentionCpGradOp, rk::AttentionRingOp,
              rk::AttentionRingGradOp>(op) &&
          planrt::workspace::outside::tiled_attention(int64_t(d));
      double forward = tm.gemmTime(sq, sk, d, bh, actBytes) + // Q K^T
                       tm.memoryTime(2 * scores) +            // softmax
                       tm.gemmTime(sq, d, sk, bh, actBytes);  // P V
      // A ring launches its tiles once a block (G blocks; two kernels a
      // block for the gradients).
      double blocks = ring ? double(group(ringAxis)) : 1;
      double launch = tm.c.k.kernelLaunchS;
      if (cpTiles)
        forward =
            tm.tiledAttentionTime(bh, sq, sk, d, false) + (blocks - 1) * launch;
      if (isa<rk::AttentionOp, rk::AttentionKeepOp, rk::AttentionLseOp,
              rk::AttentionCpOp, rk::AttentionRingOp>(op)) {
        c.time = forward;
      } else if (cpTiles) {
        c.flops *= 2;
        c.time = tm.tiledAttentionTime(bh, sq, sk, d, true);
        if (ring) // the gradients' ring alone
          c.time += (2 * blocks - 1) * launch -
                    tm.tiledAttentionTime(bh, sq, sk, d, false);
      } else {
        c.flops *= 2;
        c.time = tm.gemmTime(sk, d, sq, bh, actBytes) + // dV = P^T dO
                 tm.gemmTime(sq, sk, d, bh, actBytes) + // dP = dO V^T
                 tm.memoryTime(3 * scores) +            // dS
                 tm.gemmTime(sq, d, sk, bh, actBytes) + // dQ
                 tm.gemmTime(sk, d, sq, bh, actBytes);  // dK
      }
      if (ring) {
        // The shifts overlap the blocks' compute; the gradient runs the
        // forward's ring again first (its rows' statistics), unless it reads
        // the forward's kept output and log-sum-exps.
        double G = double(group(ringAxis));
        double block = b * sq * 2 * double(kv) * d;
        double shift = tm.p2pTime(block * actBytes, link(ringAxis));
        if (isa<rk::AttentionRingOp>(op)) {
          c.time = std::max(c.time, (G - 1) * shift);
        } else {
          double back = tm.p2pTime(block * 4, link(ringAxis));
          c.time = std::max(c.time, (G - 1) * shift + G * back);
          if (!cast<rk::AttentionRingGradOp>(op).getLse()) {
            c.flops += 4 * bh * sq * sk * d;
            c.time += std::max(forward, (G - 1) * shift);
          }
        }
      }
      return c;
    }
    if (isa<rk::Conv2dOp, rk::Conv2dGradOp>(op)) {
      // Implicit GEMM: M = output pixels, N = output channels, K = the
      // window (C / groups * KH * KW); the gradient is two such GEMMs.
      auto w = cast<MemRefType>(op->getOperand(1).getType());
      // The output (conv2d) or the output's gradient (conv2d_grad).
      Value out = op->getOperand(2);
      double n = w.getDimSize(0);
      double k = double(w.getDimSize(1) * w.getDimSize(2) * w.getDimSize(3));
      double m = elems(out) / n;
      int times = isa<rk::Conv2dGradOp>(op) ? 2 : 1;
      c.kind = OpCost::Gemm;
      c.flops = times * 2 * m * n * k;
      c.time = times * tm.gemmTime(m, n, k, 1, actBytes);
      return c;
    }
    if (std::optional<MoeExpertsView> moe = moeExpertsView(op)) {
      // The routed rows (tokens x top_k) go through one GEMM per expert and
      // weight. Assumed balanced: each expert gets rows / E of them (what
      // the routing gives is known only at run time). The backward takes
      // two GEMMs per weight, after recomputing the forward unless the
      // forward kept it (plan-keep-experts). The gather and the combine
      // move the rows' inputs and outputs.
      auto ut = cast<MemRefType>(moe->up.getType());
      auto dt = cast<MemRefType>(moe->down.getType());
      double rows = elems(moe->experts);
      double e = ut.getDimSize(0), d = ut.getDimSize(1), h = ut.getDimSize(2),
             dout = dt.getDimSize(2), m = rows / e;
      double weights = moe->gated ? 2 : 1;
      double forward = weights * tm.gemmTime(m, h, d, e, actBytes) +
                       tm.gemmTime(m, dout, h, e, actBytes);
      double fwdFlops = 2 * rows * (weights * d * h + h * dout);
      double moved = rows * (d + dout + weights * h) * actBytes;
      double passes = moe->grad ? (moe->kept ? 2 : 3) : 1;
      c.kind = OpCost::Gemm;
      c.flops = passes * fwdFlops;
      c.time = passes * (forward + tm.memoryTime(moved));
      return c;
    }
    if (auto ar = dyn_cast<rk::AllReduceOp>(op))
      return collective("all_reduce", axesOf(ar.getAxes()),
                        bytes(ar.getBuffer()));
    if (auto ar = dyn_cast<rk::AllReduceStartOp>(op))
      return collective("all_reduce", axesOf(ar.getAxes()),
                        bytes(ar.getBuffer()), /*async=*/true);
    if (auto ar = dyn_cast<rk::AllReduceMaxOp>(op))
      return collective("all_reduce", axesOf(ar.getAxes()),
                        bytes(ar.getBuffer()));
    if (auto g = dyn_cast<rk::AllGatherOp>(op))
      return collective("all_gather", {g.getAxis().str()}, bytes(g.getOut()));
    if (auto rs = dyn_cast<rk::ReduceScatterOp>(op))
      return collective("reduce_scatter", {rs.getAxis().str()},
                        bytes(rs.getInput()));
    if (auto a2a = dyn_cast<rk::AllToAllOp>(op))
      return collective("all_to_all", {a2a.getAxis().str()},
                        bytes(a2a.getInput()));
    if (auto d = dyn_cast<rk::RoutedAllGatherOp>(op))
      return collective("all_to_all", {d.getAxis().str()},
                        routedPayload(d, group({d.getAxis().str()})));
    if (auto c = dyn_cast<rk::RoutedReduceScatterOp>(op))
      return collective("all_to_all", {c.getAxis().str()},
                        routedPayload(c, group({c.getAxis().str()})));
    if (auto s = dyn_cast<rk::SeqToHeadsOp>(op))
      return collective("all_to_all", {s.getAxis().str()}, bytes(s.getInput()));
    if (auto g = dyn_cast<rk::KvGatherOp>(op))
      return collective("all_gather", {g.getAxis().str()}, bytes(g.getKv()));
    if (auto rs = dyn_cast<rk::KvReduceScatterOp>(op))
      return collective("reduce_scatter", {rs.getAxis().str()},
                        bytes(rs.getDkv()));
    if (auto s = dyn_cast<rk::HeadsToSeqOp>(op))
      return collective("all_to_all", {s.getAxis().str()}, bytes(s.getInput()));
    // Sends are asynchronous (the pipeline simulation delays their message
    // by the transfer time); receives wait there too.
    if (isa<rk::SendOp, rk::RecvOp, rk::ShardSliceOp>(op) ||
        !isa<rk::RuntimeCallOpInterface>(op))
      return c;
    // Every other kernel is memory-bound: the bytes of what it reads and
    // writes (an operand both read and written counts twice), one FLOP per
    // element written.
    double bytes = 0;
    if (auto mem = dyn_cast<MemoryEffectOpInterface>(op)) {
      SmallVector<MemoryEffects::EffectInstance> effects;
      mem.getEffects(effects);
      for (auto &e : effects) {
        Value v = e.getValue();
        if (!v || !isa<MemRefType>(v.getType()))
          continue;
        auto t = cast<MemRefType>(v.getType());
        double eb = double(t.getElementTypeBitWidth()) / 8.0;
        double n = double(t.getNumElements());
        // An embedding reads only the rows it looks up (as many as it
        // writes).
        if (isa<rk::EmbeddingOp>(op) && v == op->getOperand(1))
          n = elems(op->getOperand(op->getNumOperands() - 1));
        bytes += n * eb;
        if (isa<MemoryEffects::Write>(e.getEffect()))
          c.flops += double(t.getNumElements());
      }
    }
    c.kind = OpCost::Memory;
    c.time = tm.memoryTime(bytes);
    return c;
  }
};

/// One pipeline coordinate's walk: FLOPs, busy time by kind, and the clock of
/// its step (compute stream, and the stream non-blocking collectives run on).
struct Walk {
  double flops = 0, matmul = 0, attention = 0, other = 0;
  TimeBreakdown busy;
  std::map<std::string, double> byOp; // busy seconds by op name
  double clock = 0, commClock = 0;
  std::map<int64_t, double> slotDone;
  void account(Operation *op, const OpCost &c, double times) {
    if (c.kind != OpCost::None)
      byOp[op->getName().stripDialect().str()] += c.time * times;
    flops += c.flops * times;
    if (c.kind == OpCost::Gemm)
      matmul += c.flops * times;
    else if (c.kind == OpCost::Attention)
      attention += c.flops * times;
    else
      other += c.flops * times;
    switch (c.kind) {
    case OpCost::Gemm:
      busy.gemm += c.time * times;
      break;
    case OpCost::Attention:
      busy.attention += c.time * times;
      break;
    case OpCost::Memory:
      busy.memoryBound += c.time * times;
      break;
    case OpCost::Collective:
      busy.collectives += c.time * times;
      break;
    default:
      break;
    }
  }
};
} // namespace

double StepReport::sentBytes() const {
  double s = 0;
  for (const CommLine &l : comm)
    s += l.sentBytes;
  return s;
}

/// The cluster section, or the assumed one: A100 80GB nodes of 8 GPUs with
/// NVLink 3 (300 GB/s) and 8 x 200 Gb/s InfiniBand (25 GB/s per GPU).
ClusterModel planc::clusterModelOf(ModuleOp module) {
  ClusterModel c;
  c.gpu = findGpu("a100");
  c.assumed = true;
  for (auto cl : module.getOps<plan::ClusterOp>()) {
    // The frontend accepts the kinds TimeModel.cpp lists (the unit test
    // checks them all), so a miss is a bug, not a user error.
    c.gpu = findGpu(cl.getGpu());
    if (!c.gpu)
      llvm::report_fatal_error("planc: the cluster's GPU '" + cl.getGpu() +
                               "' has no entry in the time model");
    c.gpusPerNode = cl.getGpusPerNode();
    auto intra = cl.getIntraNodeGbps(), inter = cl.getInterNodeGbps();
    c.intraAssumed = !intra;
    c.interAssumed = !inter;
    c.intraGBps = intra ? intra->convertToDouble() : c.gpu->intraGBps;
    c.interGBps = inter ? inter->convertToDouble() : c.gpu->interGBps;
    c.assumed = false;
  }
  return c;
}

/// What `out` is a copy of, when a cast (or, with `gathers`, an all-gather)
/// writes it; null otherwise. Rank ops write their destination operand and
/// have no results, so the copy is found among the buffer's users.
static Value copySource(Value out, bool gathers) {
  for (Operation *u : out.getUsers()) {
    if (auto c = dyn_cast<rk::CastOp>(u); c && c.getOut() == out)
      return c.getInput();
    if (auto g = dyn_cast<rk::AllGatherOp>(u);
        gathers && g && g.getOut() == out)
      return g.getInput();
  }
  return Value();
}

FailureOr<StepReport> planc::computeStepReport(ModuleOp module,
                                               const ReportOptions &opts) {
  plan::MeshOp mesh = plan::getMesh(module);
  auto step = module.lookupSymbol<func::FuncOp>("plan_step");
  if (!mesh || !step) {
    module.emitError() << "the report needs the rank-level program "
                          "(after plan-schedule-pipeline)";
    return failure();
  }
  StepReport r;
  r.ranks = mesh.getNumRanks();
  r.tokens = opts.tokens;
  int64_t pp = mesh.getAxisSize("pp");

  OpCoster coster;
  coster.tm.c = clusterModelOf(module);
  r.precision = "fp32";
  int64_t globalBatch = 1;
  for (auto t : module.getOps<plan::TrainOp>()) {
    r.precision = t.getPrecision().str();
    globalBatch = t.getGlobalBatch();
  }
  // 16-bit values; tf32 keeps fp32 values and runs the GEMMs on tensor
  // cores.
  coster.tm.lowPrecision = r.precision == "bf16" || r.precision == "fp16";
  coster.tm.tf32 = r.precision == "tf32";
  coster.actBytes = coster.tm.lowPrecision ? 2 : 4;
  coster.cuda = opts.cuda;
  for (auto [a, n] : llvm::zip(mesh.getAxes(), mesh.getShape())) {
    StringRef name = cast<StringAttr>(a).getValue();
    if (mesh.isSequential(name))
      continue;
    coster.axes.push_back(name.str());
    coster.sizes.push_back(n);
  }
  r.gpu = coster.tm.c.gpu->name;
  r.clusterAssumed = coster.tm.c.assumed;
  r.intraGBps = coster.tm.c.intraGBps;
  r.interGBps = coster.tm.c.interGBps;
  r.intraAssumed = coster.tm.c.intraAssumed;
  r.interAssumed = coster.tm.c.interAssumed;
  r.peakFlops = coster.tm.peakFlops();
  r.gpuMemoryBytes = coster.tm.c.gpu->memoryGB * 1e9;
  if (opts.cuda) {
    // Device memory outside the plan: cuBLASLt's workspace, and cuDNN's
    // buffers, each grown to the largest attention that needs it (the
    // backward's recomputed output, the log-sum-exp, the workspace).
    namespace out = planrt::workspace::outside;
    int64_t ws = 0, recomputed = 0, lse = 0, cpDkv = 0;
    module.walk([&](Operation *op) {
      if (!mayRunCudnn(op))
        return;
      auto qkv = cast<MemRefType>(op->getOperand(0).getType());
      int64_t h = op->getAttrOfType<IntegerAttr>("num_heads").getInt();
      int64_t kv = op->getAttrOfType<IntegerAttr>("num_kv_heads").getInt();
      int64_t b = qkv.getDimSize(0), s = qkv.getDimSize(1);
      int64_t d = qkv.getDimSize(2) / (h + 2 * kv);
      bool backward = isa<rk::AttentionGradOp, rk::AttentionGradKeptOp,
                          rk::AttentionGradLseOp, rk::AttentionCpGradOp,
                          rk::AttentionRingGradOp>(op);
      // cp's all_gather: its chunks' queries are fewer than its rows (the
      // rows' count bounds them); its gradient's dk, dv before they are
      // added up span the gathered keys.
      ws = std::max(ws, out::cudnn_workspace_budget(b, h, s, d, backward));
      if (isa<rk::AttentionCpGradOp>(op))
        cpDkv = std::max(
            cpDkv,
            out::cudnn_cp_dkv(
                b, cast<MemRefType>(op->getOperand(1).getType()).getDimSize(1),
                kv, d));
      // ring's blocks (the rank's s rows of queries and of keys): a
      // chunk's log-sum-exp before the forward merges it (its output goes
      // to its rows of the op's output first), the final log-sum-exps the
      // gradient's blocks read with the output (recomputed, where the
      // forward's is not kept), and a block's 16-bit dk, dv before they are
      // added up.
      if (isa<rk::AttentionRingOp, rk::AttentionRingGradOp>(op)) {
        auto grad = dyn_cast<rk::AttentionRingGradOp>(op);
        if (grad && !grad.getLse()) // the output it recomputes
          recomputed = std::max(recomputed, out::cudnn_recomputed(b, h, s, d));
        lse = std::max(lse, out::cudnn_lse(b, h, s));
        if (backward)
          cpDkv = std::max(cpDkv, out::cudnn_cp_dkv(b, s, kv, d));
        if (r.cudnnAttention.empty() || r.cudnnAttention == "forward only")
          r.cudnnAttention = llvm::formatv("ring's blocks of B {0}, S {1}, "
                                           "{2} heads of {3}",
                                           b, s, h, d)
                                 .str();
        return;
      }
      // The kept pairs (plan-keep-attention) write and read the plan's
      // log-sum-exp and output: no buffers of cuDNN's own for them.
      auto cpGrad = dyn_cast<rk::AttentionCpGradOp>(op);
      bool kept = isa<rk::AttentionLseOp, rk::AttentionGradLseOp>(op) ||
                  (cpGrad && cpGrad.getLse());
      if (isa<rk::AttentionCpOp>(op)) { // its statistics in the plan's buffer
        if (r.cudnnAttention.empty())
          r.cudnnAttention = "forward only";
        return;
      }
      if (!kept)
        lse = std::max(lse, isa<rk::AttentionCpGradOp>(op)
                                ? out::cudnn_cp_lse(b, h, s)
                                : out::cudnn_lse(b, h, s));
      if (backward && !kept && out::cudnn_recomputed(b, h, s, d) > recomputed) {
        recomputed = out::cudnn_recomputed(b, h, s, d);
        r.cudnnAttention = llvm::formatv("backward of B {0}, S {1}, {2} "
                                         "heads of {3}",
                                         b, s, h, d)
                               .str();
      }
      if (backward && kept &&
          (r.cudnnAttention.empty() || r.cudnnAttention == "forward only"))
        r.cudnnAttention = llvm::formatv("backward of B {0}, S {1}, {2} heads "
                                         "of {3} from the kept output",
                                         b, s, h, d)
                               .str();
      if (r.cudnnAttention.empty())
        r.cudnnAttention = "forward only";
    });
    r.libraryBytes = out::kCublasLtWorkspace + out::kSumsqPartials + ws +
                     recomputed + lse + cpDkv;
    r.sendCopies = pp > 1;
  }

  // Tokens per step: the global batch times the sequence of a token input
  // ([batch, seq] of i32); a sample counts as one token otherwise.
  r.tokensPerStep = double(globalBatch);
  for (auto in : module.getOps<rk::InputDeclOp>()) {
    auto t = cast<MemRefType>(in.getType());
    if (t.getElementType().isInteger(32) && t.getRank() >= 2) {
      // The local sequence times the ranks that split it (context
      // parallelism).
      int64_t parts = in.getSeqAxis() ? mesh.getAxisSize(*in.getSeqAxis()) : 1;
      r.tokensPerStep = double(globalBatch) * double(t.getDimSize(1) * parts);
      break;
    }
  }

  // Per pipeline coordinate: what its ranks hold and send.
  std::vector<Counter> counters(pp, Counter{mesh, {}});
  std::vector<int64_t> params(pp, 0), weightBytes(pp, 0), stateBytes(pp, 0),
      gradBytes(pp, 0), copyBytes(pp, 0);
  auto owns = [&](int64_t stage, int64_t c) {
    return stage < 0 || stage % pp == c;
  };
  // The parameters that are experts' weights under expert parallelism: ep
  // splits them by experts (their own layout), where it is ZeRO's split of
  // every other parameter. Found from the experts ops, through a 16-bit
  // copy and a ZeRO-3 gather.
  llvm::StringSet<> expertParams;
  step.walk([&](Operation *op) {
    std::optional<MoeExpertsView> moe = moeExpertsView(op);
    if (!moe || moe->expertAxis.empty())
      return;
    for (Value w : {moe->gate, moe->up, moe->down})
      for (int hop = 0; hop < 4 && w; ++hop) {
        if (auto p = w.getDefiningOp<rk::ParamOp>()) {
          expertParams.insert(p.getName());
          break;
        }
        if (auto p = w.getDefiningOp<rk::ParamCopyOp>()) {
          expertParams.insert(p.getName());
          break;
        }
        w = copySource(w, /*gathers=*/true);
      }
  });
  for (auto d : module.getOps<rk::ParamDeclOp>()) {
    MemRefType t = d.getType();
    int64_t local = t.getNumElements();
    int64_t split = 1;
    if (auto s = d.getShardingAttr())
      for (int64_t i = 0; i < t.getRank(); ++i)
        for (StringRef a : s.getDimAxes(i))
          split *= mesh.getAxisSize(a);
    r.params += local * split;
    // The backward computes a parameter's gradient whole over ZeRO's axes
    // (ZeRO 3 gathers the parameter, then reduce-scatters its gradient):
    // the data-parallel axes, but ep for the experts, which it splits.
    bool expert = expertParams.contains(d.getSymName());
    int64_t dpSplit = 1;
    if (auto s = d.getShardingAttr())
      for (int64_t i = 0; i < t.getRank(); ++i)
        for (StringRef a : s.getDimAxes(i))
          if (a == "dp" || (a == plan::OpShardingRule::kExpertAxis && !expert))
            dpSplit *= mesh.getAxisSize(a);
    for (int64_t c = 0; c < pp; ++c)
      if (owns(stageOf(d), c)) {
        params[c] += local;
        weightBytes[c] += (int64_t)bufferBytes(t);
        // The 16-bit copy kept beside it (plan-keep-param-copies).
        if (auto copy = d.getCopyAttr()) {
          auto bytes = (int64_t)bufferBytes(
              MemRefType::get(t.getShape(), copy.getValue()));
          weightBytes[c] += bytes;
          copyBytes[c] += bytes;
        }
        gradBytes[c] += (int64_t)bufferBytes(t) * dpSplit;
      }
  }
  for (auto d : module.getOps<rk::StateDeclOp>())
    for (int64_t c = 0; c < pp; ++c)
      if (owns(stageOf(d), c))
        stateBytes[c] += (int64_t)bufferBytes(d.getType());
  // Collectives and FLOPs: once per microbatch inside loops and pipeline
  // units.
  std::vector<Walk> walks(pp);
  DenseMap<Operation *, OpCost> costs;
  // The cuda backend queues consecutive AdamW updates and small sums of
  // squares and launches them in batches: per coordinate (a rank runs only
  // its stages' ops), the batch its last op opened or joined, and the ops
  // that joined one (no launch of their own). Allocations, observations and
  // views use no stream.
  struct Queue {
    int kind = 0, count = 0;
    int64_t chunks = 0;
  };
  std::vector<Queue> queues(pp);
  std::vector<DenseSet<Operation *>> batched(pp);
  auto joinsBatch = [&](Operation *op, int64_t c) {
    namespace out = planrt::workspace::outside;
    if (isa<rk::AllocOp, rk::DeallocOp, rk::ObserveOp>(op) ||
        (op->getNumRegions() == 0 && !isa<rk::RuntimeCallOpInterface>(op)))
      return false;
    int64_t chunks = 0;
    int kind = coster.batchKind(op, chunks);
    Queue &q = queues[c];
    bool joins = kind != 0 && q.kind == kind &&
                 (kind == 1 ? q.count < out::kAdamWBatch
                            : q.count < out::kSumsqBatch &&
                                  q.chunks + chunks <= out::kSumsqBatchChunks);
    q.kind = kind;
    q.count = joins ? q.count + 1 : 1;
    q.chunks = joins ? q.chunks + chunks : chunks;
    if (joins)
      batched[c].insert(op);
    return joins;
  };
  step.walk([&](Operation *op) {
    double times = 1;
    int64_t stage = stageOf(op);
    for (Operation *p = op->getParentOp(); p && p != step;
         p = p->getParentOp()) {
      if (auto loop = dyn_cast<rk::MicrobatchLoopOp>(p))
        times *= double(loop.getCount());
      if (auto unit = dyn_cast<rk::UnitOp>(p)) {
        stage = unit.getStage();
        times *=
            double(unit->getParentOfType<rk::PipelineOp>().getMicrobatches());
      }
    }
    OpCost c = coster.cost(op);
    costs[op] = c;
    for (int64_t c2 = 0; c2 < pp; ++c2)
      if (owns(stage, c2)) {
        counters[c2].visit(op, times);
        OpCost mine = c;
        if (joinsBatch(op, c2))
          mine.time -= coster.tm.c.k.kernelLaunchS;
        walks[c2].account(op, mine, times);
      }
  });

  // Activations: what a microbatch's forward keeps for its backward. With a
  // pipeline, the stash (rank.alloc marked rank.stash in a unit, kept until
  // the stage's last backward unit of that microbatch ends), summed over the
  // microbatches each coordinate has in flight in its timeline's order, as
  // the runtime holds it. Without one, the buffers written before the loss
  // gradient (the first backward op) and read at or after it.
  std::vector<double> activations(pp, 0);
  auto bufBytes = [&](Value v) {
    auto t = cast<MemRefType>(v.getType());
    double n = std::max<double>(1, double(t.getNumElements()));
    return n * double(t.getElementTypeBitWidth()) / 8.0;
  };
  step.walk([&](rk::PipelineOp pipe) {
    SmallVector<rk::UnitOp> units(pipe.getBody().front().getOps<rk::UnitOp>());
    std::vector<double> stashOf;
    for (rk::UnitOp u : units) {
      double b = 0;
      u.walk([&](rk::AllocOp a) {
        if (a->hasAttr("rank.stash"))
          b += bufBytes(a.getResult());
      });
      stashOf.push_back(b);
    }
    for (auto t : pipe.getBody().front().getOps<rk::TimelineOp>()) {
      int64_t c = t.getRank();
      if (c < 0 || c >= pp)
        continue;
      std::map<std::pair<int64_t, int64_t>, double> held; // (stage, mb)
      double live = 0, peak = 0;
      for (auto e : t.getBody().front().getOps<rk::ExecOp>()) {
        if (e.getUnit() >= units.size())
          continue;
        rk::UnitOp u = units[e.getUnit()];
        std::pair<int64_t, int64_t> key{int64_t(u.getStage()),
                                        int64_t(e.getMb())};
        live += stashOf[e.getUnit()];
        held[key] += stashOf[e.getUnit()];
        peak = std::max(peak, live);
        if (u.getLast()) {
          live -= held[key];
          held.erase(key);
        }
      }
      activations[c] = std::max(activations[c], peak);
    }
  });
  Operation *lossGrad = nullptr;
  step.walk([&](Operation *op) {
    if (!lossGrad && !op->getParentOfType<rk::PipelineOp>() &&
        isa<rk::CrossEntropyGradOp, rk::CrossEntropyInPlaceOp,
            rk::CeGradFromStatsOp, rk::MseLossGradOp>(op))
      lossGrad = op;
  });
  if (lossGrad) {
    Block *block = lossGrad->getBlock();
    Operation *at = lossGrad;
    while (at->getBlock() != block)
      at = at->getParentOp();
    double kept = 0;
    for (Operation &op : *block) {
      if (&op == at)
        break;
      auto a = dyn_cast<rk::AllocOp>(&op);
      if (!a)
        continue;
      // Used (written) before the loss gradient and read at or after it,
      // through views: a view nobody reads (recompute leaves some behind)
      // keeps nothing, and a buffer first used by the backward (the loss
      // gradient's output) is no activation.
      std::function<bool(Value, bool)> usedOf = [&](Value v, bool later) {
        return llvm::any_of(v.getUsers(), [&](Operation *u) {
          if (isa<rk::ViewOp, rk::RowsOp, rk::SubviewOp, rk::ShardViewOp>(u))
            return usedOf(u->getResult(0), later);
          if (isa<rk::DeallocOp>(u))
            return false; // the end of its life, not a read
          Operation *top = block->findAncestorOpInBlock(*u);
          if (!top)
            return false;
          bool after = top == at || at->isBeforeInBlock(top);
          return after == later;
        });
      };
      if (usedOf(a.getResult(), false) && usedOf(a.getResult(), true))
        kept += bufBytes(a.getResult());
    }
    for (int64_t c = 0; c < pp; ++c)
      activations[c] = std::max(activations[c], kept);
  }

  // The step's time on each pipeline coordinate: its top-level ops in order
  // on one compute stream; a started all-reduce runs on a second stream
  // (one collective at a time, as NCCL's communicator does) until its wait.
  auto bodyTime = [&](Block &block) {
    double t = 0;
    block.walk([&](Operation *op) {
      const OpCost &c = costs[op];
      if (c.kind != OpCost::None)
        t += c.time;
    });
    return t;
  };
  for (Operation &top : step.getBody().front()) {
    if (auto pipe = dyn_cast<rk::PipelineOp>(&top)) {
      double transfer = 0;
      pipe.walk([&](rk::SendOp s) {
        transfer =
            std::max(transfer, coster.tm.p2pTime(coster.bytes(s.getBuffer()),
                                                 coster.link({"pp"})));
      });
      auto unitCost = [&](rk::UnitOp u) {
        return bodyTime(u.getBody().front());
      };
      FailureOr<PipelineSimulation> sim =
          simulatePipeline(pipe, pp, unitCost, transfer);
      if (failed(sim))
        return failure();
      r.bubbleFraction = sim->timeline.bubbleFraction;
      for (int64_t c = 0; c < pp; ++c) {
        double end = 0;
        for (auto &sp : sim->timeline.span[c])
          end = std::max(end, sp.second);
        Walk &w = walks[c];
        w.busy.pipelineWait += end - sim->timeline.busy[c];
        w.clock += end;
      }
      continue;
    }
    for (int64_t c = 0; c < pp; ++c) {
      if (!owns(stageOf(&top), c))
        continue;
      Walk &w = walks[c];
      if (auto loop = dyn_cast<rk::MicrobatchLoopOp>(&top)) {
        w.clock += bodyTime(loop.getBody().front()) * double(loop.getCount());
        continue;
      }
      OpCost oc = costs[&top];
      if (batched[c].contains(&top))
        oc.time -= coster.tm.c.k.kernelLaunchS;
      if (auto start = dyn_cast<rk::AllReduceStartOp>(&top)) {
        w.commClock = std::max(w.commClock, w.clock) + oc.time;
        w.slotDone[start.getSlot()] = w.commClock;
        continue;
      }
      if (auto wait = dyn_cast<rk::CollectiveWaitOp>(&top)) {
        double done = w.slotDone[wait.getSlot()];
        if (done > w.clock) {
          w.busy.collectives += done - w.clock;
          w.clock = done;
        }
        continue;
      }
      w.clock += oc.time;
    }
  }
  for (int64_t c = 0; c < pp; ++c) {
    Walk &w = walks[c];
    if (w.commClock > w.clock) { // a started collective nobody waited for
      w.busy.collectives += w.commClock - w.clock;
      w.clock = w.commClock;
    }
  }

  // Communication: the pipeline coordinate that sends the most bytes (then
  // holds the most model states).
  int64_t worst = 0;
  auto load = [&](int64_t c) {
    double s = 0;
    for (auto &kv : counters[c].lines)
      s += kv.second.sentBytes;
    return std::make_pair(s, weightBytes[c] + stateBytes[c]);
  };
  for (int64_t c = 1; c < pp; ++c)
    if (load(c) > load(worst))
      worst = c;
  // Memory: the coordinate that holds the most (model states and
  // activations).
  int64_t fullest = 0;
  // The memory plan, read from the step's attributes (per coordinate).
  auto planAt = [&](StringRef attr, int64_t c) -> int64_t {
    auto a = step->getAttrOfType<DenseI64ArrayAttr>(attr);
    return a && c < a.size() ? a[c] : 0;
  };
  bool planned = step->hasAttr(rk::kArenaBytesAttr);
  int64_t inputBytes = 0;
  for (auto in : module.getOps<rk::InputDeclOp>())
    inputBytes += in.getType().getNumElements() *
                  ((in.getType().getElementTypeBitWidth() + 7) / 8);
  auto held = [&](int64_t c) {
    if (planned) // what the program holds, at any precision
      return double(weightBytes[c] + stateBytes[c] + inputBytes +
                    planAt(rk::kArenaBytesAttr, c) +
                    planAt(rk::kStashBytesAttr, c));
    return double(weightBytes[c] + gradBytes[c] + stateBytes[c]) +
           activations[c];
  };
  for (int64_t c = 1; c < pp; ++c)
    if (held(c) > held(fullest))
      fullest = c;
  r.paramsPerRank = params[fullest];
  r.weightBytes = weightBytes[fullest];
  r.paramCopyBytes = copyBytes[fullest];
  r.gradientBytes = gradBytes[fullest]; // fp32, one per parameter
  r.optimizerBytes = stateBytes[fullest];
  r.activationBytes = activations[fullest];
  r.activationsByCoordinate = activations;
  if (planned) {
    r.planned = true;
    r.arenaBytes = planAt(rk::kArenaBytesAttr, fullest);
    r.workspaceBytes = planAt(rk::kWorkspaceBytesAttr, fullest);
    r.stashBytes = planAt(rk::kStashBytesAttr, fullest);
    r.inputBytes = inputBytes;
  }
  for (auto &kv : counters[worst].lines)
    r.comm.push_back(kv.second);
  // The gradients reduced over dp (all-reduced, or reduce-scattered with
  // ZeRO 2 and 3), as one message.
  for (const CommLine &l : r.comm)
    if (l.axes == "dp" &&
        (l.kind == "all_reduce" || l.kind == "reduce_scatter"))
      r.allReduceBytes += l.payloadBytes;
  r.allReduceRanks = mesh.getAxisSize("dp");
  if (r.allReduceBytes > 0 && r.allReduceRanks > 1)
    r.allReduce = allReduceAlgorithms(r.allReduceBytes, r.allReduceRanks,
                                      coster.link({"dp"}));
  if (auto f = step->getAttrOfType<FloatAttr>(rk::kStepFlopsAttr))
    r.stepFlopsPerRank = f.getValueAsDouble();
  r.modelFlopsPerStep = r.stepFlopsPerRank * double(r.ranks);

  // A mixture of experts' layers and the weights of their experts (the
  // fp32 parameters behind any 16-bit copies), and what expert parallelism
  // moves over its axis.
  llvm::SetVector<Value> expertWeights;
  StringRef expertAxis;
  step.walk([&](Operation *op) {
    std::optional<MoeExpertsView> moe = moeExpertsView(op);
    if (!moe || moe->grad)
      return;
    ++r.moeLayers;
    r.moeTopK = cast<MemRefType>(moe->experts.getType()).getShape().back();
    expertAxis = moe->expertAxis;
    r.moeEp = expertAxis.empty() ? 1 : mesh.getAxisSize(expertAxis);
    for (Value w : {moe->gate, moe->up, moe->down}) {
      if (!w)
        continue;
      if (Value source = copySource(w, /*gathers=*/false))
        w = source;
      r.moeExpertsPerRank = cast<MemRefType>(w.getType()).getDimSize(0);
      r.moeExperts = r.moeExpertsPerRank * r.moeEp;
      expertWeights.insert(w);
    }
  });
  step.walk([&](rk::RoutedAllGatherOp d) {
    r.moeRoutedShare = routedShare(d, mesh.getAxisSize(d.getAxis()));
  });
  for (Value w : expertWeights)
    r.expertWeightBytesPerRank +=
        cast<MemRefType>(w.getType()).getNumElements() * 4;
  r.expertWeightBytes = r.expertWeightBytesPerRank * r.moeEp;
  for (const CommLine &l : r.comm)
    if (!expertAxis.empty() && l.axes == expertAxis) {
      if (l.kind == "dispatch") {
        r.moeDispatchBytes += l.payloadBytes;
        r.moeDispatchSent += l.sentBytes;
      } else if (l.kind == "combine") {
        r.moeCombineBytes += l.payloadBytes;
        r.moeCombineSent += l.sentBytes;
      } else if (l.kind == "all_gather") {
        r.moeGatherBytes += l.payloadBytes;
        r.moeGatherSent += l.sentBytes;
      } else if (l.kind == "reduce_scatter") {
        r.moeScatterBytes += l.payloadBytes;
        r.moeScatterSent += l.sentBytes;
      }
    }

  // FLOPs: every pipeline coordinate's ranks (ranks / pp of them) run what
  // its walk counted.
  double replicas = double(r.ranks) / double(pp);
  int64_t slowest = 0;
  for (int64_t c = 0; c < pp; ++c) {
    r.flopsPerStep += walks[c].flops * replicas;
    r.matmulFlops += walks[c].matmul * replicas;
    r.attentionFlops += walks[c].attention * replicas;
    r.otherFlops += walks[c].other * replicas;
    if (walks[c].clock > walks[slowest].clock)
      slowest = c;
  }
  r.stepTime = walks[slowest].clock;
  r.time = walks[slowest].busy;
  r.timeByOp = walks[slowest].byOp;
  return r;
}

void planc::printStepReport(const StepReport &r, llvm::raw_ostream &os) {
  auto mb = [](double b) { return b / 1e6; };
  os << "step report (" << r.ranks << " ranks; per rank: the most loaded)\n";
  os << llvm::format("  parameters          %14lld total, %lld per rank\n",
                     (long long)r.params, (long long)r.paramsPerRank);
  os << llvm::format("  FLOPs/step          %14.4g executed (matmul %.4g, "
                     "attention %.4g, other %.4g), model %.4g\n",
                     r.flopsPerStep, r.matmulFlops, r.attentionFlops,
                     r.otherFlops, r.modelFlopsPerStep);
  os << llvm::format("  memory per rank     weights %.3f MB, gradients %.3f "
                     "MB, optimizer %.3f MB, activations %.3f MB\n",
                     mb(r.weightBytes), mb(r.gradientBytes),
                     mb(r.optimizerBytes), mb(r.activationBytes));
  if (r.planned)
    os << llvm::format("  memory plan         arena %.3f MB (largest workspace "
                       "%.3f MB), stash pool %.3f MB, inputs %.3f MB\n",
                       mb(r.arenaBytes), mb(r.workspaceBytes), mb(r.stashBytes),
                       mb(r.inputBytes));
  if (r.libraryBytes > 0)
    os << llvm::format(
        "  outside the plan    at most %.3f MB: cuBLASLt's "
        "workspace %.3f MB, the gradient norm's partial sums %.3f MB%s%s%s "
        "(not counted: the CUDA context, NCCL's buffers%s)\n",
        mb(double(r.libraryBytes)),
        mb(double(planrt::workspace::outside::kCublasLtWorkspace)),
        mb(double(planrt::workspace::outside::kSumsqPartials)),
        r.cudnnAttention.empty() ? "" : ", cuDNN's attention (",
        r.cudnnAttention.c_str(), r.cudnnAttention.empty() ? "" : ")",
        r.sendCopies ? ", the copies of the tensors a stage sends" : "");
  os << llvm::format(
      "  peak memory         %.3f GB%s of the %s's %.0f GB: %s\n",
      r.memoryPeakBytes() / 1e9,
      r.libraryBytes > 0 ? llvm::formatv(" + {0:f3} GB outside the plan",
                                         double(r.libraryBytes) / 1e9)
                               .str()
                               .c_str()
                         : "",
      r.gpu.c_str(), r.gpuMemoryBytes / 1e9,
      r.fits() ? "fits" : "does not fit");
  if (r.moeLayers > 0 && r.moeEp == 1)
    os << llvm::format("  mixture of experts  %lld layers of %lld experts (top "
                       "%lld): expert weights %.3f MB, whole on every rank "
                       "that holds their layer (no ep); time assumes "
                       "balanced routing\n",
                       (long long)r.moeLayers, (long long)r.moeExperts,
                       (long long)r.moeTopK, mb(r.expertWeightBytes));
  if (r.moeLayers > 0 && r.moeEp > 1) {
    os << llvm::format("  mixture of experts  %lld layers of %lld experts (top "
                       "%lld), %lld per rank (ep = %lld): expert weights "
                       "%.3f MB, %.3f MB per rank; time assumes balanced "
                       "routing\n",
                       (long long)r.moeLayers, (long long)r.moeExperts,
                       (long long)r.moeTopK, (long long)r.moeExpertsPerRank,
                       (long long)r.moeEp, mb(r.expertWeightBytes),
                       mb(r.expertWeightBytesPerRank));
    if (r.moeDispatchBytes > 0 || r.moeCombineBytes > 0)
      os << llvm::format(
          "    ep dispatch (all-to-all of the rows routed to another rank's "
          "experts: %.3f of them under balanced routing; the choices "
          "all-gathered), per step and rank: dispatch %.4f MB (sent %.4f), "
          "combine %.4f MB (sent %.4f), gathers %.4f MB (sent %.4f)\n",
          r.moeRoutedShare, mb(r.moeDispatchBytes), mb(r.moeDispatchSent),
          mb(r.moeCombineBytes), mb(r.moeCombineSent), mb(r.moeGatherBytes),
          mb(r.moeGatherSent));
    else
      os << llvm::format("    ep dispatch (all-gather of the tokens, choices "
                         "and gates; reduce-scatter of the outputs), per step "
                         "and rank: gathers %.4f MB (sent %.4f), "
                         "reduce-scatters %.4f MB (sent %.4f)\n",
                         mb(r.moeGatherBytes), mb(r.moeGatherSent),
                         mb(r.moeScatterBytes), mb(r.moeScatterSent));
  }
  os << "  communication per step and rank (ring algorithms):\n";
  os << llvm::format("    %-15s %-8s %6s %7s %14s %14s\n", "collective", "axes",
                     "ranks", "calls", "payload MB", "sent MB");
  for (const CommLine &l : r.comm)
    os << llvm::format("    %-15s %-8s %6lld %7lld %14.4f %14.4f\n",
                       l.kind.c_str(), l.axes.c_str(), (long long)l.group,
                       (long long)l.calls, mb(l.payloadBytes), mb(l.sentBytes));
  os << llvm::format("    %-15s %-8s %6s %7s %14s %14.4f\n", "total", "", "",
                     "", "", mb(r.sentBytes()));
  os << llvm::format("  time on %s%s, %s\n", r.gpu.c_str(),
                     r.clusterAssumed ? " (assumed: no cluster section)" : "",
                     r.precision.c_str());
  if (r.intraAssumed || r.interAssumed) {
    std::string links;
    if (r.intraAssumed)
      links += llvm::formatv("intra_bw = {0:F0} GB/s", r.intraGBps).str();
    if (r.interAssumed)
      links += (links.empty() ? "" : ", ") +
               llvm::formatv("inter_bw = {0:F0} GB/s", r.interGBps).str();
    os << "    links assumed from the gpu kind (the cluster section does not "
          "set them): "
       << links << "\n";
  }
  os << llvm::format("    step %.4g s, %.4g tokens/s, %.1f TFLOP/s per GPU, "
                     "MFU %.1f%%, bubble %.1f%%\n",
                     r.stepTime, r.tokensPerSecond(), r.tflopsPerGpu(),
                     100 * r.mfu(), 100 * r.bubbleFraction);
  const TimeBreakdown &t = r.time;
  os << llvm::format("    gemm %.4g s, attention %.4g s, memory-bound %.4g s, "
                     "collectives %.4g s, pipeline wait %.4g s\n",
                     t.gemm, t.attention, t.memoryBound, t.collectives,
                     t.pipelineWait);
  if (!r.allReduce.empty()) {
    os << llvm::format("  all-reduce of the dp gradients (%.4f MB over %lld "
                       "ranks, one message) by algorithm:\n",
                       mb(r.allReduceBytes), (long long)r.allReduceRanks);
    for (const AllReduceAlgorithm &a : r.allReduce)
      os << llvm::format("    %-17s %12.6f s %14.4f MB sent\n", a.name, a.timeS,
                         mb(a.sentBytes));
  }
  if (r.tokens)
    os << llvm::format("    %.4g tokens: %.4g s (%.2f days)\n", *r.tokens,
                       *r.tokens / r.tokensPerSecond(),
                       *r.tokens / r.tokensPerSecond() / 86400);
}

llvm::json::Object planc::stepReportJson(const StepReport &r) {
  llvm::json::Object comm, memory;
  std::map<std::string, double> byKind;
  llvm::json::Array lines;
  for (const CommLine &l : r.comm) {
    byKind[l.kind] += l.sentBytes;
    lines.push_back(llvm::json::Object{{"kind", l.kind},
                                       {"axes", l.axes},
                                       {"ranks", l.group},
                                       {"calls", l.calls},
                                       {"payload_bytes", l.payloadBytes},
                                       {"sent_bytes", l.sentBytes}});
  }
  for (auto &kv : byKind)
    comm[kv.first] = kv.second;
  memory["weights"] = r.weightBytes;
  memory["gradients"] = r.gradientBytes;
  memory["optimizer"] = r.optimizerBytes;
  memory["activations"] = r.activationBytes;
  memory["workspace"] = r.workspaceBytes;
  if (r.planned) {
    memory["arena"] = r.arenaBytes;
    memory["stash"] = r.stashBytes;
    memory["inputs"] = r.inputBytes;
  }
  memory["peak"] = r.memoryPeakBytes();
  if (r.libraryBytes > 0)
    memory["outside_plan"] = r.libraryBytes;
  const TimeBreakdown &t = r.time;
  llvm::json::Object o{
      {"ranks", r.ranks},
      {"params", r.params},
      {"params_per_rank", r.paramsPerRank},
      {"model_flops_per_step_per_rank", r.stepFlopsPerRank},
      {"flops_per_step", r.flopsPerStep},
      {"model_flops_per_step", r.modelFlopsPerStep},
      {"flops_by_kind", llvm::json::Object{{"matmul", r.matmulFlops},
                                           {"attention", r.attentionFlops},
                                           {"other", r.otherFlops}}},
      {"memory_per_rank", std::move(memory)},
      {"moe",
       r.moeLayers == 0
           ? llvm::json::Value(nullptr)
           : llvm::json::Object{{"layers", r.moeLayers},
                                {"experts", r.moeExperts},
                                {"experts_per_rank", r.moeExpertsPerRank},
                                {"ep", r.moeEp},
                                {"top_k", r.moeTopK},
                                {"expert_weight_bytes", r.expertWeightBytes},
                                {"expert_weight_bytes_per_rank",
                                 r.expertWeightBytesPerRank},
                                {"dispatch",
                                 llvm::json::Object{{"kind",
                                                     r.moeDispatchBytes > 0 || r.moeCombineBytes > 0 ? "all_to_all" : "all_gather"},
                                                    {"routed_share", r.moeRoutedShare},
                                                    {"dispatch_bytes", r.moeDispatchBytes},
                                                    {"dispatch_sent_bytes", r.moeDispatchSent},
                                                    {"combine_bytes", r.moeCombineBytes},
                                                    {"combine_sent_bytes", r.moeCombineSent},
                                                    {"gather_bytes", r.moeGatherBytes},
                                                    {"gather_sent_bytes", r.moeGatherSent},
                                                    {"reduce_scatter_bytes", r.moeScatterBytes},
                                                    {"reduce_scatter_sent_"
                                                     "bytes",
                                                     r
                                                         .moeScatterSent}}},
                                {"routing_assumed", "balanced"}}},
      {"comm_bytes_per_step", std::move(comm)},
      {"comm_sent_bytes_per_step", r.sentBytes()},
      {"comm", std::move(lines)},
      {"gpu", r.gpu},
      {"cluster_assumed", r.clusterAssumed},
      {"intra_bw_gbps", r.intraGBps},
      {"inter_bw_gbps", r.interGBps},
      {"bandwidth_assumed", llvm::json::Array([&] {
         std::vector<llvm::json::Value> v;
         if (r.intraAssumed)
           v.push_back("intra_bw");
         if (r.interAssumed)
           v.push_back("inter_bw");
         return v;
       }())},
      {"precision", r.precision},
      {"peak_flops_per_gpu", r.peakFlops},
      {"step_time_s", r.stepTime},
      {"tokens_per_step", r.tokensPerStep},
      {"tokens_per_s", r.tokensPerSecond()},
      {"tflops_per_gpu", r.tflopsPerGpu()},
      {"mfu", r.mfu()},
      {"bubble_fraction", r.bubbleFraction},
      {"fits", r.fits()},
      {"time_breakdown_s",
       llvm::json::Object{{"gemm", t.gemm},
                          {"attention", t.attention},
                          {"memory_bound", t.memoryBound},
                          {"collectives", t.collectives},
                          {"pipeline_wait", t.pipelineWait}}}};
  llvm::json::Object byOp;
  for (auto &kv : r.timeByOp)
    byOp[kv.first] = kv.second;
  o["time_by_op_s"] = std::move(byOp);
  llvm::json::Array algos;
  for (const AllReduceAlgorithm &a : r.allReduce)
    algos.push_back(llvm::json::Object{
        {"name", a.name}, {"time_s", a.timeS}, {"sent_bytes", a.sentBytes}});
  o["allreduce_algorithms"] =
      llvm::json::Object{{"bytes", r.allReduceBytes},
                         {"ranks", r.allReduceRanks},
                         {"algorithms", std::move(algos)}};
  if (r.tokens) {
    o["tokens"] = *r.tokens;
    o["training_time_s"] = *r.tokens / r.tokensPerSecond();
  }
  return o;
}
