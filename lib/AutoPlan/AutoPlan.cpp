//===- AutoPlan.cpp - Search the parallel plans of a model for the fastest ===//
//
// See AutoPlan.h for the three phases and docs/cost-model.md ("The
// auto-planner") for every formula of the screening estimate.
//===----------------------------------------------------------------------===//
#include "planc/AutoPlan/AutoPlan.h"
#include "Compile.h"
#include "planc/AutoPlan/PlanText.h"

#include "dialects/plan/PlanDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Threading.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <set>
#include <thread>

using namespace mlir;
using namespace planc;

std::string ParallelConfig::describe() const {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "dp " << dp << " tp " << tp << " pp " << pp;
  if (cp > 1)
    os << " cp " << cp;
  if (ep > 1)
    os << " ep " << ep;
  if (pp > 1) {
    os << " " << schedule;
    if (virtualStages > 1)
      os << " v " << virtualStages;
  }
  os << " mbs " << microBatch << " m " << microbatches;
  if (zero)
    os << " zero " << zero;
  if (sequenceParallel)
    os << " sp";
  os << " " << recompute;
  // The order of the axes that split the mesh (size 1 moves nothing).
  std::vector<std::string> split;
  for (const std::string &a : order) {
    if (a == "tp" && cp > 1)
      split.push_back("cp");
    if ((a == "dp" ? dp : a == "tp" ? tp : pp) > 1)
      split.push_back(a);
    if (a == "dp" && ep > 1)
      split.push_back("ep");
  }
  if (split.size() > 1)
    os << " [" << llvm::join(split, ",") << "]";
  return s;
}

namespace {
using Clock = std::chrono::steady_clock;

/// Seconds with 4 significant digits (a tiny model's step is microseconds).
std::string secs(double s) {
  return llvm::formatv("{0}", llvm::format("%.4g", s)).str();
}

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// Runs fn(i) for i in [0, n) on `threads` threads.
void parallelFor(size_t n, unsigned threads,
                 const std::function<void(size_t)> &fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++)
      fn(i);
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < std::min<size_t>(threads, n); ++t)
    pool.emplace_back(work);
  work();
  for (auto &t : pool)
    t.join();
}

/// What a layer and the rest of the model cost one rank, per microbatch,
/// for one (tp, sp, recompute, micro batch): the difference of the probes
/// with two layers and with one.
struct LayerCosts {
  std::string problem; // the probe did not compile
  double layerTime = 0, restTime = 0, firstTime = 0; // seconds per microbatch
  double optimizerPerParam = 0;                      // seconds per step
  double layerAct = 0, restAct = 0;                  // bytes kept
  // In a pipeline: what a layer's unit stashes per microbatch, and what the
  // last stage's head adds (from a probe of two layers on pp = 2).
  // Zero bubble stashes more: the weight gradient, deferred, needs its
  // inputs and output gradients kept.
  double layerStash = 0, layerStashSplitW = 0;
  bool hasStash = false, hasStashSplitW = false;
  double layerParams = 0, restParams = 0;                // on a tp rank
  double weightBytes = 4, gradBytes = 4, stateBytes = 8; // per parameter
  double copyBytes = 0; // of weightBytes: kept 16-bit copies (zero = 0)
  double workspace = 0;
};

bool isOptimizerOp(llvm::StringRef name) {
  return name == "adamw_update" || name == "sgd_update" ||
         name == "clip_by_global_norm" || name == "sumsq_accumulate";
}

double optimizerTime(const StepReport &r) {
  double t = 0;
  for (auto &[name, s] : r.timeByOp)
    if (isOptimizerOp(name))
      t += s;
  return t;
}

double firstStageTime(const StepReport &r) {
  double t = 0;
  for (auto &[name, s] : r.timeByOp)
    if (llvm::StringRef(name).starts_with("embedding") ||
        llvm::StringRef(name).starts_with("pos_embedding"))
      t += s;
  return t;
}

LayerCosts layerCosts(const CompiledReport &one, const CompiledReport &two,
                      const CompiledReport &piped,
                      const CompiledReport &pipedSplitW) {
  LayerCosts c;
  if (!one.report || !two.report) {
    c.problem = !one.report ? one.error : two.error;
    return c;
  }
  const StepReport &r1 = *one.report, &r2 = *two.report;
  double o1 = optimizerTime(r1), o2 = optimizerTime(r2);
  double c1 = r1.stepTime - o1, c2 = r2.stepTime - o2;
  c.layerTime = std::max(0.0, c2 - c1);
  c.restTime = std::max(0.0, c1 - c.layerTime);
  c.firstTime = std::min(c.restTime, firstStageTime(r1));
  double p1 = double(r1.paramsPerRank), p2 = double(r2.paramsPerRank);
  c.layerParams = std::max(0.0, p2 - p1);
  c.restParams = std::max(0.0, p1 - c.layerParams);
  c.optimizerPerParam = p2 > 0 ? o2 / p2 : 0;
  if (p1 > 0) {
    c.weightBytes = double(r1.weightBytes) / p1;
    c.copyBytes = double(r1.paramCopyBytes) / p1;
    c.gradBytes = double(r1.gradientBytes) / p1;
    c.stateBytes = double(r1.optimizerBytes) / p1;
  }
  c.layerAct = std::max(0.0, r2.activationBytes - r1.activationBytes);
  c.restAct = std::max(0.0, r1.activationBytes - c.layerAct);
  c.workspace = double(std::max(r1.workspaceBytes, r2.workspaceBytes));
  // Stage 0 holds the embeddings (which keep nothing a layer does not: the
  // layer's input is its own stash) and layer 0, for two microbatches.
  auto stage0 = [](const CompiledReport &cr) {
    return cr.report && !cr.report->activationsByCoordinate.empty()
               ? std::optional<double>(cr.report->activationsByCoordinate[0] /
                                       2)
               : std::nullopt;
  };
  if (auto a = stage0(piped)) {
    c.hasStash = true;
    c.layerStash = *a;
  }
  // Zero bubble: the fuller of the two stages (an upper bound; what stage 0
  // holds until the deferred weight gradients is not separable from the
  // head's share in so small a probe).
  if (pipedSplitW.report) {
    c.hasStashSplitW = true;
    c.layerStashSplitW = pipedSplitW.report->activationBytes / 2;
  }
  return c;
}

struct ProbeKey {
  int64_t tp;
  bool sp;
  std::string recompute;
  int64_t microBatch;
  int64_t cp = 1, ep = 1;
  bool operator<(const ProbeKey &o) const {
    return std::tie(tp, sp, recompute, microBatch, cp, ep) <
           std::tie(o.tp, o.sp, o.recompute, o.microBatch, o.cp, o.ep);
  }
};

/// Sequences at least this long are searched with context parallelism
/// (shorter ones fit without it, and it would only add all-to-alls).
constexpr int64_t kLongSequence = 8192;

/// The input's model, batch and cluster, read from its parsed module.
struct Problem {
  int64_t gpus = 1, layers = 0, globalBatch = 1;
  bool hasCluster = false;
  ClusterModel cluster;
  bool lowPrecision = false;
  bool tf32 = false;                 // precision = tf32
  double boundaryElemsPerSample = 0; // a layer's input, per sample
  int64_t maxTp = 1;                 // a node's GPUs
  std::map<std::vector<int64_t>, int64_t> paramShapes; // shape -> count
  ParallelConfig user;
  std::string parallelKeep; // bucket_mb, pad_vocab of the user's section
  // Attention's sequence (0: no attention): context parallelism needs 2 cp
  // to divide it.
  int64_t seq = 0;
  // The experts of every mixture-of-experts layer (0: none): expert
  // parallelism's degrees divide each.
  std::vector<int64_t> experts;
};

/// Micro batches above this (and above the input's) are not searched:
/// their activations rarely fit and GEMMs reach full efficiency long before.
constexpr int64_t kMaxMicroBatch = 8;

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i)
        d.push_back(n / i);
    }
  llvm::sort(d);
  return d;
}

/// The user's parallel settings the search does not choose (bucket_mb,
/// pad_vocab), as lines of a section.
std::string keptSettings(llvm::StringRef text) {
  std::string keep;
  if (std::optional<SectionSpan> s = findSection(text, "parallel"))
    for (const SettingSpan &x : s->settings)
      if (x.key == "bucket_mb" || x.key == "pad_vocab")
        keep += "  " + x.key + " = " +
                text.slice(x.valueBegin, x.valueEnd).str() + "\n";
  return keep;
}

Problem readProblem(ModuleOp module, llvm::StringRef text) {
  Problem p;
  plan::MeshOp mesh = plan::getMesh(module);
  p.cluster = clusterModelOf(module);
  for (auto c : module.getOps<plan::ClusterOp>()) {
    p.hasCluster = true;
    p.gpus = c.getNodes() * c.getGpusPerNode();
  }
  p.user.order.clear();
  int64_t ranks = 1;
  for (auto [a, n] : llvm::zip(mesh.getAxes(), mesh.getShape())) {
    llvm::StringRef name = cast<StringAttr>(a).getValue();
    if (mesh.isSequential(name))
      continue;
    ranks *= n;
    p.user.order.push_back(name.str());
    if (name == "dp")
      p.user.dp = n;
    else if (name == "tp")
      p.user.tp = n;
    else if (name == "pp")
      p.user.pp = n;
    else if (name == "cp")
      p.user.cp = n;
    else if (name == "ep")
      p.user.ep = n;
  }
  // Axes of size 1 are not in the mesh: they keep their default places,
  // the others fill the remaining places in the mesh's order. (cp and ep
  // are not orders of their own: cp sits just outside tp, ep inside dp.)
  llvm::erase(p.user.order, "cp");
  llvm::erase(p.user.order, "ep");
  {
    std::vector<std::string> present = p.user.order, order;
    size_t k = 0;
    for (const char *a : {"pp", "dp", "tp"})
      order.push_back(llvm::is_contained(present, a) ? present[k++] : a);
    p.user.order = order;
  }
  if (!p.hasCluster)
    p.gpus = ranks;
  p.maxTp = p.cluster.gpusPerNode;
  for (auto par : module.getOps<plan::ParallelOp>()) {
    p.user.schedule = par.getSchedule().str();
    p.user.microbatches = par.getMicrobatches();
    p.user.virtualStages = par.getVirtualStages();
    p.user.zero = par.getZeroStage();
    p.user.recompute = par.getRecompute().str();
    p.user.sequenceParallel = par.getSequenceParallel();
  }
  for (auto t : module.getOps<plan::TrainOp>()) {
    p.globalBatch = t.getGlobalBatch();
    p.lowPrecision = t.getPrecision() == "bf16" || t.getPrecision() == "fp16";
    p.tf32 = t.getPrecision() == "tf32";
    p.user.microBatch = t.getMicroBatch().value_or(
        p.globalBatch /
        std::max<int64_t>(1, p.user.dp * p.user.ep * p.user.microbatches));
  }
  // Layers and the tensor a pipeline stage passes on (a layer's input).
  for (auto f : module.getOps<func::FuncOp>()) {
    if (!f->hasAttr("plan.model"))
      continue;
    for (unsigned i = 0; i < f.getNumArguments(); ++i) {
      if (auto l = f.getArgAttrOfType<IntegerAttr>(i, plan::kLayerAttr))
        p.layers = std::max(p.layers, l.getInt() + 1);
      auto kind = f.getArgAttrOfType<StringAttr>(i, plan::kKindAttr);
      auto t = dyn_cast<RankedTensorType>(f.getArgument(i).getType());
      if (kind && kind.getValue() == "param" && t && t.hasStaticShape())
        ++p.paramShapes[std::vector<int64_t>(t.getShape().begin(),
                                             t.getShape().end())];
    }
    f.walk([&](plan::AttentionOp a) {
      p.seq = a.getQkv().getType().getDimSize(1);
    });
    f.walk([&](plan::MoeExpertsOp m) {
      p.experts.push_back(m.getUp().getType().getDimSize(0));
    });
    f.walk([&](Operation *op) {
      auto l = op->getAttrOfType<IntegerAttr>(plan::kLayerAttr);
      if (!l)
        return;
      p.layers = std::max(p.layers, l.getInt() + 1);
      if (p.boundaryElemsPerSample == 0 && op->getNumOperands())
        if (auto t = dyn_cast<RankedTensorType>(op->getOperand(0).getType()))
          if (t.hasStaticShape() && t.getRank() > 0)
            p.boundaryElemsPerSample =
                double(t.getNumElements()) /
                double(std::max<int64_t>(1, t.getDimSize(0)));
    });
  }
  p.parallelKeep = keptSettings(text);
  return p;
}

std::string parallelSection(const ParallelConfig &c, llvm::StringRef keep,
                            llvm::StringRef comment) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << "parallel {\n";
  if (!comment.empty())
    os << "  // " << comment << "\n";
  os << "  order = [" << llvm::join(c.order, ", ") << "]\n";
  os << "  dp = " << c.dp << "\n  tp = " << c.tp << "\n  pp = " << c.pp << "\n";
  if (c.cp > 1)
    os << "  cp = " << c.cp << "\n";
  if (c.ep > 1)
    os << "  ep = " << c.ep << "\n";
  if (c.tp > 1)
    os << "  tensor = megatron\n";
  if (c.sequenceParallel)
    os << "  sequence_parallel = true\n";
  if (c.pp > 1) {
    os << "  schedule = " << c.schedule << "\n";
    if (c.virtualStages > 1)
      os << "  virtual_stages = " << c.virtualStages << "\n";
  }
  os << "  microbatches = " << c.microbatches << "\n";
  if (c.zero)
    os << "  zero = " << c.zero << "\n";
  os << "  recompute = " << c.recompute << "\n" << keep << "}";
  return s;
}

/// The user's file cut to a probe: tp x cp x ep ranks only (dp = pp = 1),
/// one microbatch of `microBatch` samples per data-parallel rank (ep's
/// too), a cluster of one node of tp x cp x ep GPUs.
/// With pp = 2: two pipeline ranks and two microbatches of `microBatch`
/// samples, both in flight on stage 0 at its peak.
std::string probeText(llvm::StringRef text, const ProbeKey &k,
                      llvm::StringRef keep, int64_t pp = 1,
                      llvm::StringRef schedule = "1f1b") {
  ParallelConfig c;
  c.pp = pp;
  c.schedule = schedule.str();
  c.tp = k.tp;
  c.cp = k.cp;
  c.ep = k.ep;
  c.sequenceParallel = k.sp;
  c.recompute = k.recompute;
  c.microbatches = pp; // stage 0 then holds pp microbatches at its peak
  std::string out =
      replaceSection(text, "parallel", parallelSection(c, keep, ""));
  std::string mb = std::to_string(k.microBatch);
  out = setSettings(
      out, "train",
      {{"batch", std::to_string(k.microBatch * c.dp * c.ep * c.microbatches)},
       {"micro_batch", mb}});
  return setSettings(out, "cluster",
                     {{"nodes", std::to_string(c.pp * c.dp)},
                      {"gpus_per_node", std::to_string(k.tp * k.cp * k.ep)}});
}

/// The screening estimate of one plan.
struct Estimate {
  double time = 0, memory = 0;
};

struct Screen {
  const Problem &p;
  TimeModel tm;
  double actBytes;

  mutable std::map<std::pair<int64_t, int64_t>, double> zeroCache;

  /// The fraction of the parameters ZeRO can split over dp (and ep): those
  /// whose first dimension dp * ep * tp divides (an estimate of plan-propagate-
  /// sharding's rule, which splits the first dimension dp divides after the
  /// tensor-parallel split, and never a packed q/k/v dimension).
  double zeroFraction(const ParallelConfig &c) const {
    if (c.zero == 0 || c.dp * c.ep == 1)
      return 0;
    auto [it, fresh] = zeroCache.try_emplace({c.dp * c.ep, c.tp}, 0.0);
    if (fresh) {
      double all = 0, split = 0;
      for (auto &[shape, n] : p.paramShapes) {
        double e = n;
        for (int64_t d : shape)
          e *= double(d);
        all += e;
        if (!shape.empty() && shape[0] % (c.dp * c.ep * c.tp) == 0)
          split += e;
      }
      it->second = all > 0 ? split / all : 0;
    }
    return it->second;
  }

  Screen(const Problem &p) : p(p) {
    tm.c = p.cluster;
    tm.lowPrecision = p.lowPrecision;
    tm.tf32 = p.tf32;
    actBytes = p.lowPrecision ? 2 : 4;
  }

  Link link(const ParallelConfig &c, llvm::StringRef axis) const {
    std::vector<std::string> order;
    std::vector<int64_t> sizes;
    for (const std::string &a : c.order) {
      if (a == "tp") {
        order.push_back("cp");
        sizes.push_back(c.cp);
      }
      order.push_back(a);
      sizes.push_back(a == "dp" ? c.dp : a == "tp" ? c.tp : c.pp);
      if (a == "dp") {
        order.push_back("ep");
        sizes.push_back(c.ep);
      }
    }
    return linkOf(tm.c, order, sizes, {axis.str()});
  }

  Estimate estimate(const ParallelConfig &c, const LayerCosts &lc) const {
    Estimate e;
    double L = double(p.layers), m = double(c.microbatches);
    double pp = double(c.pp), v = double(c.virtualStages);
    // The busiest rank's layers and parameters (the first pipeline rank,
    // which also holds the embeddings; the partition balances FLOPs, so a
    // rank's work is about 1/pp of the step, and at least its whole layers).
    double rankLayers = c.pp == 1 ? L : std::ceil(L / (pp * v)) * v;
    double params = rankLayers * lc.layerParams + lc.restParams;
    double perMb;
    if (c.pp == 1)
      perMb = L * lc.layerTime + lc.restTime;
    else
      perMb = std::max((L * lc.layerTime + lc.restTime) / pp,
                       rankLayers * lc.layerTime + lc.firstTime);
    double compute = m * perMb;
    // Gradients accumulate over microbatches. The layers' weight GEMMs add
    // into their accumulators themselves (matmul_accumulate); the rest (the
    // embeddings' gradient sums) take one add per weight each.
    compute += (m - 1) * tm.memoryTime(3 * lc.restParams * actBytes);
    if (c.pp > 1) {
      double fill = (pp - 1) * perMb;
      if (c.schedule == "interleaved_1f1b")
        fill /= v;
      else if (c.schedule == "zero_bubble")
        fill /= 3;
      double transfer =
          tm.p2pTime(p.boundaryElemsPerSample * double(c.microBatch) * actBytes,
                     link(c, "pp"));
      compute += fill + 2 * (pp - 1) * transfer;
    }
    double comm = 0;
    if (c.dp * c.cp * c.ep > 1) {
      // Gradients are summed over dp, cp and ep (whose ranks see other
      // tokens of the same weights; the experts' only over dp, which this
      // overestimates); ZeRO splits over dp and ep. (The slowest link of the
      // three stands for all.) The probes' layer times hold ep's dispatch.
      Link l = link(c, c.dp > 1 ? "dp" : c.ep > 1 ? "ep" : "cp");
      double g = params * actBytes;
      auto t = [&](llvm::StringRef kind) {
        return tm.collectiveTime(
            kind, g, kind == "all_reduce" ? c.dp * c.cp * c.ep : c.dp * c.ep,
            l);
      };
      switch (c.zero) {
      case 0:
        comm = t("all_reduce");
        // Buckets overlap the backward when the step has one microbatch.
        if (c.pp == 1 && c.microbatches == 1)
          comm = std::max(0.0, comm - compute * 2.0 / 3.0);
        break;
      case 1:
        comm = t("all_reduce") + t("all_gather");
        break;
      // ZeRO 2 and 3 keep only their gradient shard: each microbatch's
      // gradients are reduce-scattered (plan-expand-reshards), m times a
      // step; stage 3 also gathers each parameter before every use.
      case 2:
        comm = m * t("reduce_scatter") + t("all_gather");
        break;
      default:
        comm = m * t("reduce_scatter") + (2 * m + 1) * t("all_gather");
      }
    }
    double shards = c.zero >= 1 ? double(c.dp * c.ep) : 1.0;
    // ZeRO shards a parameter only along a dimension dp divides (after its
    // tensor-parallel split); the others stay whole on every rank.
    double z = zeroFraction(c);
    double stateShards = 1 / (z / shards + (1 - z));
    double optimizer = lc.optimizerPerParam * params / stateShards;
    e.time = compute + comm + optimizer;
    // Memory of that rank: model states by ZeRO stage, what the schedule
    // keeps in flight, the largest workspace.
    double layersKept = c.pp == 1 ? L : rankLayers;
    if (c.pp > 1) {
      double perStage = std::ceil(L / (pp * v));
      if (c.schedule == "gpipe")
        layersKept = m * rankLayers;
      else if (c.schedule == "interleaved_1f1b")
        layersKept = std::min(m * rankLayers,
                              v * perStage * pp * (1 + (pp - 1) / (pp * v)));
      else
        layersKept = std::min(m, pp) * rankLayers;
    }
    double acts = layersKept * lc.layerAct + lc.restAct;
    if (c.pp > 1 && c.schedule == "zero_bubble" && lc.hasStashSplitW)
      acts = layersKept * lc.layerStashSplitW;
    else if (c.pp > 1 && lc.hasStash)
      acts = layersKept * lc.layerStash;
    // Without ZeRO a 16-bit plan keeps its weights' 16-bit copies across
    // steps (the probes' copyBytes, plan-keep-param-copies), which serve
    // every microbatch. ZeRO keeps none: ZeRO-3 splits the weights; in 16
    // bits ZeRO 1 and 2 split the fp32 masters too, and hold a whole 16-bit
    // copy through the step (as a 16-bit plan without kept copies does with
    // microbatches or a pipeline: one copy serves them all; with one
    // microbatch each use casts its own, for a moment).
    bool kept = c.zero == 0 && lc.copyBytes > 0;
    double masters = lc.weightBytes - lc.copyBytes;
    double weightShards =
        c.zero == 3 || (p.lowPrecision && c.zero >= 1) ? stateShards : 1.0;
    bool heldCopy = p.lowPrecision && c.zero < 3 && !kept &&
                    (c.zero >= 1 || c.microbatches > 1 || c.pp > 1);
    e.memory = params * (masters / weightShards + (kept ? lc.copyBytes : 0.0) +
                         lc.gradBytes + lc.stateBytes / stateShards +
                         (heldCopy ? actBytes : 0.0)) +
               acts + lc.workspace;
    return e;
  }
};

struct Scored {
  ParallelConfig config;
  Estimate est;
};

const std::vector<std::vector<std::string>> &orders() {
  static const std::vector<std::vector<std::string>> o = {
      {"pp", "dp", "tp"}, {"dp", "pp", "tp"}, {"pp", "tp", "dp"},
      {"tp", "pp", "dp"}, {"dp", "tp", "pp"}, {"tp", "dp", "pp"}};
  return o;
}

/// The order with the axes of size 1 left out: orders that differ only in
/// them are the same mesh.
std::string meshKey(const ParallelConfig &c) {
  std::string k;
  for (const std::string &a : c.order) {
    if (a == "tp" && c.cp > 1)
      k += "cp,";
    int64_t n = a == "dp" ? c.dp : a == "tp" ? c.tp : c.pp;
    if (n > 1)
      k += a + ",";
    if (a == "dp" && c.ep > 1)
      k += "ep,";
  }
  return k;
}
const char *const kRecomputes[] = {"none", "selective", "full"};

/// Calls fn for every plan of the search space (microbatches not yet set):
/// dp x tp x pp = the GPUs, one mesh order per distinct mesh (orders that
/// differ only in axes of size 1 are one), expert parallelism `eps` (ep
/// just inside dp), context parallelism `cps` (cp
/// just outside tp), micro batches `mbs`, up to 8
/// virtual stages (interleaved_1f1b exactly when more than 1), the
/// schedules with a pipeline, ZeRO 0-3 with dp, sequence parallelism with
/// tp, and the recompute levels (`none` not in a pipeline, which runs it as
/// `selective`: docs/language.md).
void forEachPlan(const Problem &p, llvm::ArrayRef<int64_t> mbs,
                 llvm::ArrayRef<int64_t> cps, llvm::ArrayRef<int64_t> eps,
                 llvm::function_ref<void(ParallelConfig &)> fn) {
  std::set<std::string> seenMesh;
  const char *const schedules[] = {"1f1b", "gpipe", "zero_bubble",
                                   "interleaved_1f1b"};
  for (int64_t ep : eps)
    for (int64_t cp : cps)
      for (int64_t tp : divisors(p.gpus))
        for (int64_t pp : divisors(p.gpus / tp))
          for (const auto &order : orders()) {
            if ((p.gpus / tp / pp) % (cp * ep))
              continue;
            ParallelConfig c;
            c.tp = tp;
            c.pp = pp;
            c.cp = cp;
            c.ep = ep;
            c.dp = p.gpus / tp / pp / cp / ep;
            c.order = order;
            if (!seenMesh
                     .insert(std::to_string(tp) + "/" + std::to_string(pp) +
                             "/" + std::to_string(cp) + "/" +
                             std::to_string(ep) + "/" + meshKey(c))
                     .second)
              continue;
            for (int64_t mb : mbs)
              for (int64_t v = 1; v <= (pp > 1 ? 8 : 1); ++v)
                for (llvm::StringRef sched : schedules) {
                  if ((pp == 1 && sched != "1f1b") ||
                      ((sched == "interleaved_1f1b") != (v > 1)))
                    continue;
                  for (int64_t zero = 0; zero <= (c.dp * c.ep > 1 ? 3 : 0);
                       ++zero)
                    for (bool sp : {false, true})
                      for (llvm::StringRef rc : kRecomputes) {
                        if ((sp && tp == 1) || (pp > 1 && rc == "none"))
                          continue;
                        c.microBatch = mb;
                        c.virtualStages = v;
                        c.schedule = sched.str();
                        c.zero = zero;
                        c.sequenceParallel = sp;
                        c.recompute = rc.str();
                        fn(c);
                      }
                }
          }
}

/// Why `c` cannot run (or is not searched), or nothing; sets its
/// microbatches.
std::optional<std::string> invalidPlan(ParallelConfig &c, const Problem &p,
                                       const Screen &screen) {
  if (c.tp > p.maxTp)
    return "tp spans nodes (more than a node's GPUs)";
  if (c.tp > 1 && screen.link(c, "tp").interNode)
    return "tp's ranks span nodes in this mesh order";
  if (c.cp > 1 && p.seq % (2 * c.cp * (c.sequenceParallel ? c.tp : 1)))
    return "cp does not divide the sequence into 2 cp chunks (with sequence "
           "parallelism, 2 cp tp)";
  if (p.globalBatch % (c.dp * c.ep * c.microBatch))
    return "the batch does not divide into dp x ep x micro batch";
  c.microbatches = p.globalBatch / (c.dp * c.ep * c.microBatch);
  if (c.pp * c.virtualStages > std::max<int64_t>(p.layers, 1))
    return "more pipeline stages than layers";
  if (c.schedule == "interleaved_1f1b" && c.microbatches % c.pp)
    return "interleaved_1f1b needs microbatches divisible by pp";
  return std::nullopt;
}
} // namespace

llvm::Expected<AutoPlanResult> planc::autoPlan(llvm::StringRef path,
                                               llvm::StringRef text,
                                               ModuleOp userModule,
                                               const AutoPlanOptions &opts) {
  AutoPlanResult r;
  Problem p = readProblem(userModule, text);
  r.gpus = p.gpus;
  r.layers = p.layers;
  r.globalBatch = p.globalBatch;
  r.cluster =
      p.hasCluster
          ? llvm::formatv("{0} nodes x {1} {2}", p.gpus / p.cluster.gpusPerNode,
                          p.cluster.gpusPerNode, p.cluster.gpu->name)
                .str()
          : llvm::formatv("no cluster section: {0}, {1} per node "
                          "assumed",
                          p.cluster.gpu->name, p.cluster.gpusPerNode)
                .str();
  unsigned threads = opts.threads
                         ? opts.threads
                         : unsigned(std::max(1, llvm::get_physical_cores()));
  auto reject = [&](const std::string &why) { ++r.rejected[why]; };

  // 1. Probes for every (tp, sp, recompute, micro batch) that can occur.
  auto t0 = Clock::now();
  std::vector<int64_t> tps, mbs;
  for (int64_t t : divisors(p.gpus))
    if (t <= p.maxTp)
      tps.push_back(t);
  // The input's micro batch is searched too (and what lies below it).
  for (int64_t b : divisors(p.globalBatch))
    if (b <= std::max(kMaxMicroBatch, p.user.microBatch))
      mbs.push_back(b);
  // Context parallelism for long sequences (and the input's cp): the
  // degrees whose chunks and key/value heads divide.
  std::vector<int64_t> cps = {1};
  if (p.seq >= kLongSequence || p.user.cp > 1)
    for (int64_t c : divisors(p.gpus))
      if (c > 1 && p.seq % (2 * c) == 0)
        cps.push_back(c);
  // Expert parallelism for mixtures of experts: the degrees that divide
  // every layer's experts.
  std::vector<int64_t> eps = {1};
  if (!p.experts.empty())
    for (int64_t e : divisors(p.gpus))
      if (e > 1 &&
          llvm::all_of(p.experts, [&](int64_t n) { return n % e == 0; }))
        eps.push_back(e);
  std::vector<ProbeKey> keys;
  for (int64_t ep : eps)
    for (int64_t cp : cps)
      for (int64_t t : tps)
        for (bool sp : {false, true}) {
          if ((sp && t == 1) || t * cp * ep > p.gpus)
            continue;
          for (const char *rc : kRecomputes)
            for (int64_t b : mbs)
              keys.push_back({t, sp, rc, b, cp, ep});
        }
  // Per key: one and two layers without a pipeline; two layers on pp = 2
  // when the model can be piped (not for `none`, which a pipeline runs as
  // `selective`).
  std::vector<CompiledReport> probe1(keys.size()), probe2(keys.size()),
      piped(keys.size()), pipedSplitW(keys.size());
  bool pipes = p.layers >= 2 && p.gpus % 2 == 0;
  parallelFor(4 * keys.size(), threads, [&](size_t i) {
    const ProbeKey &k = keys[i / 4];
    bool pipeProbe = pipes && k.recompute != "none";
    switch (i % 4) {
    case 0:
      probe1[i / 4] =
          compilePlanText(path, probeText(text, k, p.parallelKeep), 1);
      break;
    case 1:
      probe2[i / 4] =
          compilePlanText(path, probeText(text, k, p.parallelKeep), 2);
      break;
    case 2:
      if (pipeProbe)
        piped[i / 4] =
            compilePlanText(path, probeText(text, k, p.parallelKeep, 2), 2);
      break;
    default:
      if (pipeProbe)
        pipedSplitW[i / 4] = compilePlanText(
            path, probeText(text, k, p.parallelKeep, 2, "zero_bubble"), 2);
    }
  });
  for (size_t i = 0; i < keys.size(); ++i)
    r.probes += 2 + 2 * (pipes && keys[i].recompute != "none");
  std::map<ProbeKey, LayerCosts> costs;
  bool anyProbe = false;
  for (size_t i = 0; i < keys.size(); ++i) {
    costs[keys[i]] = layerCosts(probe1[i], probe2[i], piped[i], pipedSplitW[i]);
    anyProbe |= costs[keys[i]].problem.empty();
  }
  r.probeSeconds = since(t0);
  if (!anyProbe) {
    std::string why = probe1.empty() ? "no probe" : probe1.front().error;
    return llvm::createStringError(
        "no plan of the model compiles; the first probe (tp = 1) failed: " +
        why);
  }

  // 2. Screening.
  t0 = Clock::now();
  Screen screen(p);
  std::vector<Scored> fit;
  forEachPlan(p, mbs, cps, eps, [&](ParallelConfig &c) {
    ++r.considered;
    if (std::optional<std::string> why = invalidPlan(c, p, screen))
      return reject(*why);
    auto it = costs.find(
        {c.tp, c.sequenceParallel, c.recompute, c.microBatch, c.cp, c.ep});
    if (it == costs.end() || !it->second.problem.empty())
      return reject("does not compile: " + (it == costs.end()
                                                ? std::string("not probed")
                                                : it->second.problem));
    // A ZeRO stage that splits no parameter (dp divides none of their
    // dimensions) compiles to the plan without it.
    if (c.zero > 0 && screen.zeroFraction(c) == 0) {
      ++r.duplicates;
      return;
    }
    Estimate e = screen.estimate(c, it->second);
    if (e.memory > p.cluster.gpu->memoryGB * 1e9)
      return reject("does not fit in GPU memory (estimated)");
    fit.push_back({c, e});
  });
  r.screened = int64_t(fit.size());
  llvm::stable_sort(fit, [](const Scored &a, const Scored &b) {
    return a.est.time < b.est.time;
  });
  r.screenSeconds = since(t0);

  // 3. Verification: compile the best estimates (and the user's plan).
  t0 = Clock::now();
  std::vector<Verified> work;
  {
    Verified u;
    u.config = p.user;
    auto it = costs.find({p.user.tp, p.user.sequenceParallel, p.user.recompute,
                          p.user.microBatch, p.user.cp, p.user.ep});
    if (it != costs.end() && it->second.problem.empty()) {
      Estimate e = screen.estimate(p.user, it->second);
      u.estimatedStepTime = e.time;
      u.estimatedMemory = e.memory;
    }
    work.push_back(u);
  }
  size_t next = 0;
  auto compileBatch = [&](size_t from) {
    parallelFor(work.size() - from, threads, [&](size_t i) {
      Verified &w = work[from + i];
      std::string t = writePlan(text, w.config, "");
      CompiledReport cr = from + i == 0 ? compilePlanText(path, text)
                                        : compilePlanText(path, t);
      if (cr.report)
        w.report = std::move(cr.report);
      else
        w.problem = "does not compile: " + cr.error;
    });
  };
  // Up to `verify` compiled plans that fit; a few more rounds when the
  // estimate let through plans that do not. The input's plan compiles with
  // the first round. The screening's memory model is coarse (per-layer
  // probes), so each round learns from the compiled reports: the largest
  // ratio of compiled to estimated memory scales the estimates of the plans
  // still to pick, which skips those that would not fit either.
  size_t from = 0;
  double calibration = 1.0;
  const double gpuBytes = p.cluster.gpu->memoryGB * 1e9;
  for (unsigned round = 0; round < 6 && r.ranked.size() < opts.verify;
       ++round) {
    size_t want = opts.verify - r.ranked.size(), picked = 0;
    while (picked < want && next < fit.size()) {
      // Plans the estimate cannot tell apart (within 0.1% of time and 1% of
      // memory: a mesh order that changes no link, a ZeRO stage that splits
      // almost nothing) are one plan: compile the first only.
      const Scored &f = fit[next++];
      if (f.est.memory * calibration > gpuBytes) {
        reject("does not fit in GPU memory (estimated, calibrated by the "
               "compiled plans)");
        continue;
      }
      if (llvm::any_of(work, [&](const Verified &w) {
            return std::abs(w.estimatedStepTime - f.est.time) <=
                       1e-3 * f.est.time &&
                   std::abs(w.estimatedMemory - f.est.memory) <=
                       1e-2 * f.est.memory;
          }))
        continue;
      Verified w;
      w.config = f.config;
      w.estimatedStepTime = f.est.time;
      w.estimatedMemory = f.est.memory;
      work.push_back(w);
      ++picked;
    }
    if (from == work.size())
      break;
    compileBatch(from);
    for (size_t i = from; i < work.size(); ++i)
      if (work[i].report && work[i].estimatedMemory > 0)
        calibration = std::max(calibration, work[i].report->memoryPeakBytes() /
                                                work[i].estimatedMemory);
    for (size_t i = std::max<size_t>(from, 1); i < work.size(); ++i) {
      Verified &w = work[i];
      if (w.report && !w.report->fits())
        w.problem = "does not fit in GPU memory (compiled)";
      if (w.problem.empty()) {
        r.ranked.push_back(w);
      } else {
        reject(w.problem);
        r.dropped.push_back(w);
      }
    }
    from = work.size();
  }
  r.compiled = int64_t(work.size());
  r.user = work.front();
  if (!r.user->report)
    r.user->problem =
        r.user->problem.empty() ? "does not compile" : r.user->problem;
  else if (!r.user->report->fits())
    r.user->problem = "does not fit in GPU memory";
  llvm::stable_sort(r.ranked, [](const Verified &a, const Verified &b) {
    return a.report->stepTime < b.report->stepTime;
  });
  r.verifySeconds = since(t0);
  // The input's plan competes too: when nothing found is faster, it is the
  // plan written.
  if (r.user->report && r.user->problem.empty() &&
      (r.ranked.empty() ||
       r.user->report->stepTime < r.ranked.front().report->stepTime)) {
    r.userIsBest = true;
    r.ranked.insert(r.ranked.begin(), *r.user);
  }
  if (!r.ranked.empty()) {
    const Verified &best = r.ranked.front();
    std::string comment =
        r.userIsBest
            ? llvm::formatv("planc --autoplan found no faster plan than this "
                            "one: step {0} s predicted",
                            secs(best.report->stepTime))
                  .str()
            : llvm::formatv("chosen by planc --autoplan: step {0} s "
                            "predicted",
                            secs(best.report->stepTime))
                  .str();
    if (r.user->report && !r.userIsBest)
      comment += llvm::formatv(" (the input's plan: {0} s)",
                               secs(r.user->report->stepTime))
                     .str();
    r.bestText = writePlan(text, best.config, comment);
  }
  return r;
}

std::string planc::writePlan(llvm::StringRef text, const ParallelConfig &c,
                             llvm::StringRef comment) {
  std::string out = replaceSection(
      text, "parallel", parallelSection(c, keptSettings(text), comment));
  return setSettings(out, "train",
                     {{"micro_batch", std::to_string(c.microBatch)}});
}

void planc::printAutoPlan(const AutoPlanResult &r, unsigned show,
                          llvm::raw_ostream &os) {
  int64_t rejected = 0;
  for (auto &[why, n] : r.rejected)
    rejected += n;
  os << "autoplan: " << r.gpus << " GPUs (" << r.cluster << "), batch "
     << r.globalBatch << ", " << r.layers << " layers\n";
  int64_t dropped = int64_t(r.dropped.size());
  os << llvm::formatv("  {0} plans considered: {1} rejected, {2} the same as "
                      "another, {3} estimated; {4} probes compiled in {5:f2} "
                      "s, screening {6:f2} s, {7} plans compiled in {8:f2} s "
                      "({9} of them rejected)\n",
                      r.considered, rejected - dropped, r.duplicates,
                      r.screened, r.probes, r.probeSeconds, r.screenSeconds,
                      r.compiled, r.verifySeconds, dropped);
  if (!r.rejected.empty()) {
    os << "  rejected, by reason:\n";
    std::vector<std::pair<int64_t, std::string>> reasons;
    for (auto &[why, n] : r.rejected)
      reasons.push_back({n, why});
    llvm::sort(reasons, [](auto &a, auto &b) { return a.first > b.first; });
    for (auto &[n, why] : reasons)
      os << llvm::formatv("  {0,10}  {1}\n", n, why);
  }
  os << "\n"
     << llvm::formatv("{0,-4} {1,-58} {2,9} {3,9} {4,8} {5,6} {6,7} {7,8} "
                      "{8,10}\n",
                      "", "plan", "step s", "TFLOP/s", "MFU", "bubble", "GB",
                      "fits", "est. s");
  auto row = [&](llvm::StringRef label, const Verified &v) {
    os << llvm::formatv("{0,-4} {1,-58} ", label, v.config.describe());
    if (v.report) {
      const StepReport &s = *v.report;
      os << llvm::formatv("{0,9} {1,9:f1} {2,7:f1}% {3,5:f1}% {4,7:f1} "
                          "{5,8} ",
                          secs(s.stepTime), s.tflopsPerGpu(), 100 * s.mfu(),
                          100 * s.bubbleFraction, s.memoryPeakBytes() / 1e9,
                          s.fits() ? "yes" : "no");

    } else {
      os << llvm::formatv("{0,-55} ", v.problem);
    }
    if (v.estimatedStepTime > 0)
      os << llvm::formatv("{0,10}", secs(v.estimatedStepTime));
    os << "\n";
  };
  for (size_t i = 0; i < r.ranked.size() && i < show; ++i)
    row(r.userIsBest && i == 0 ? "1=you" : std::to_string(i + 1), r.ranked[i]);
  for (const Verified &v : r.dropped)
    row("x", v);
  if (r.user)
    row("you", *r.user);
  if (r.ranked.empty()) {
    os << "\nno plan fits\n";
    return;
  }
  if (r.userIsBest) {
    os << "\nno plan found is faster than the input's\n";
  } else if (r.user && r.user->report) {
    double gain = r.user->report->stepTime / r.ranked.front().report->stepTime;
    os << llvm::formatv("\nthe best plan is predicted {0:f2}x the speed of "
                        "the input's\n",
                        gain);
  }
}
