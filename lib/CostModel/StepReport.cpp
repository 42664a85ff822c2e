//===- StepReport.cpp - What one training step costs, read from the rank --===//
#include "planc/CostModel/StepReport.h"

#include "dialects/plan/PlanDialect.h"
#include "dialects/rank/RankDialect.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;

namespace {
double bufferBytes(Type t) {
  auto m = cast<MemRefType>(t);
  return double(m.getNumElements()) *
         double(m.getElementType().getIntOrFloatBitWidth()) / 8.0;
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
                  : kind == "send"     ? 1.0
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
    else if (auto s = dyn_cast<rk::SendOp>(op))
      add("send", {"pp"}, bufferBytes(s.getBuffer().getType()), 1, times);
  }
};

int64_t stageOf(Operation *op) {
  auto s = op->getAttrOfType<IntegerAttr>(rk::kRankStageAttr);
  return s ? s.getInt() : -1;
}
} // namespace

double StepReport::sentBytes() const {
  double s = 0;
  for (const CommLine &l : comm)
    s += l.sentBytes;
  return s;
}

FailureOr<StepReport> planc::computeStepReport(ModuleOp module) {
  plan::MeshOp mesh = plan::getMesh(module);
  auto step = module.lookupSymbol<func::FuncOp>("plan_step");
  if (!mesh || !step) {
    module.emitError() << "the report needs the rank-level program "
                          "(after plan-schedule-pipeline)";
    return failure();
  }
  StepReport r;
  r.ranks = mesh.getNumRanks();
  int64_t pp = mesh.getAxisSize("pp");
  // Per pipeline coordinate: what its ranks hold and send.
  std::vector<Counter> counters(pp, Counter{mesh, {}});
  std::vector<int64_t> params(pp, 0), weightBytes(pp, 0), stateBytes(pp, 0);
  auto owns = [&](int64_t stage, int64_t c) {
    return stage < 0 || stage % pp == c;
  };
  for (auto d : module.getOps<rk::ParamDeclOp>()) {
    MemRefType t = d.getType();
    int64_t local = t.getNumElements();
    int64_t split = 1;
    if (auto s = d.getShardingAttr())
      for (int64_t i = 0; i < t.getRank(); ++i)
        for (StringRef a : s.getDimAxes(i))
          split *= mesh.getAxisSize(a);
    r.params += local * split;
    for (int64_t c = 0; c < pp; ++c)
      if (owns(stageOf(d), c)) {
        params[c] += local;
        weightBytes[c] += (int64_t)bufferBytes(t);
      }
  }
  for (auto d : module.getOps<rk::StateDeclOp>())
    for (int64_t c = 0; c < pp; ++c)
      if (owns(stageOf(d), c))
        stateBytes[c] += (int64_t)bufferBytes(d.getType());
  // Collectives: once per microbatch inside loops and pipeline units.
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
    for (int64_t c = 0; c < pp; ++c)
      if (owns(stage, c))
        counters[c].visit(op, times);
  });
  // The most loaded pipeline coordinate: the most bytes sent, then memory.
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
  r.paramsPerRank = params[worst];
  r.weightBytes = weightBytes[worst];
  r.gradientBytes = weightBytes[worst]; // fp32 gradients, one per parameter
  r.optimizerBytes = stateBytes[worst];
  for (auto &kv : counters[worst].lines)
    r.comm.push_back(kv.second);
  if (auto f = step->getAttrOfType<FloatAttr>(rk::kStepFlopsAttr))
    r.stepFlopsPerRank = f.getValueAsDouble();
  return r;
}

void planc::printStepReport(const StepReport &r, llvm::raw_ostream &os) {
  auto mb = [](double b) { return b / 1e6; };
  os << "step report (" << r.ranks << " ranks; per rank: the most loaded)\n";
  os << llvm::format("  parameters          %14lld total, %lld per rank\n",
                     (long long)r.params, (long long)r.paramsPerRank);
  os << llvm::format("  model FLOPs/step    %14.4g per rank\n",
                     r.stepFlopsPerRank);
  os << llvm::format("  memory per rank     weights %.3f MB, gradients %.3f "
                     "MB, optimizer %.3f MB (activations: not yet "
                     "modelled)\n",
                     mb(r.weightBytes), mb(r.gradientBytes),
                     mb(r.optimizerBytes));
  os << "  communication per step and rank (ring algorithms):\n";
  os << llvm::format("    %-15s %-8s %6s %7s %14s %14s\n", "collective", "axes",
                     "ranks", "calls", "payload MB", "sent MB");
  for (const CommLine &l : r.comm)
    os << llvm::format("    %-15s %-8s %6lld %7lld %14.4f %14.4f\n",
                       l.kind.c_str(), l.axes.c_str(), (long long)l.group,
                       (long long)l.calls, mb(l.payloadBytes), mb(l.sentBytes));
  os << llvm::format("    %-15s %-8s %6s %7s %14s %14.4f\n", "total", "", "",
                     "", "", mb(r.sentBytes()));
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
  return llvm::json::Object{
      {"ranks", r.ranks},
      {"params", r.params},
      {"params_per_rank", r.paramsPerRank},
      {"model_flops_per_step_per_rank", r.stepFlopsPerRank},
      {"memory_per_rank", std::move(memory)},
      {"comm_bytes_per_step", std::move(comm)},
      {"comm_sent_bytes_per_step", r.sentBytes()},
      {"comm", std::move(lines)}};
}
