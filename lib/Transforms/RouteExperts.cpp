//===- RouteExperts.cpp - Expert parallelism's all-to-all dispatcher ------===//
//
// Expert parallelism's layouts come from the sharding rules: at
// plan.moe_experts the weights' claim on ep wins, so the experts' operands
// (input, gates, the output's gradient) are all-gathered over ep, with the
// choices, and their token-shaped results (output, input and gates
// gradients) are pending sums over ep, reduce-scattered back. Those are
// the values every rank would need if every rank ran every expert; a rank
// runs only its own experts, which read only the rows routed to them and
// write zero elsewhere. So where a gather over the expert axis feeds only
// expert ops of that axis, and where a reduce-scatter over it reads only
// what one of them wrote, this pass replaces it by its routed form, which
// moves only the rows that matter (decided by the group's choices, which
// every rank holds): rank.routed_all_gather and rank.routed_reduce_scatter,
// one all-to-all with variable counts each. Same values where they are
// read, so the same results; what changes is the traffic (the rows routed
// to another rank's experts instead of every row).
//
// `ep_comm = all_gather` keeps the dense collectives (Megatron-Core's
// all-gather dispatcher).
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/TypeSwitch.h"

namespace planc {
#define GEN_PASS_DEF_ROUTEEXPERTS
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;

namespace {
struct RouteExpertsPass
    : public planc::impl::RouteExpertsBase<RouteExpertsPass> {
  void runOnOperation() override;
};

/// An expert op under expert parallelism: the choices it reads, its axis
/// and experts per rank, and its token-shaped operands and results.
struct ExpertsUse {
  Value experts;
  StringRef axis;
  int64_t perRank = 0;
  SmallVector<Value, 3> reads, writes;
};

template <class Op> ExpertsUse useOf(Op op) {
  ExpertsUse u;
  u.experts = op.getExperts();
  u.axis = op.getExpertAxis();
  u.perRank = op.getUp().getType().getDimSize(0);
  u.reads = {op.getInput(), op.getGates()};
  if constexpr (std::is_same_v<Op, rk::MoeExpertsGradOp> ||
                std::is_same_v<Op, rk::MoeExpertsSwigluGradOp>) {
    u.reads.push_back(op.getGrad());
    u.writes = {op.getInputGrad(), op.getGatesGrad()};
  } else {
    u.writes = {op.getOut()};
  }
  return u;
}

std::optional<ExpertsUse> expertsUse(Operation *op) {
  auto u =
      llvm::TypeSwitch<Operation *, std::optional<ExpertsUse>>(op)
          .Case<rk::MoeExpertsOp, rk::MoeExpertsSwigluOp, rk::MoeExpertsGradOp,
                rk::MoeExpertsSwigluGradOp>([](auto e) { return useOf(e); })
          .Default([](Operation *) { return std::nullopt; });
  if (!u || u->axis.empty())
    return std::nullopt;
  return u;
}

/// The ops that use `v`, looking through reshaping views (rank.view), but
/// not its deallocation.
void usersThroughViews(Value v, SmallVectorImpl<OpOperand *> &out) {
  for (OpOperand &use : v.getUses()) {
    if (auto view = dyn_cast<rk::ViewOp>(use.getOwner()))
      usersThroughViews(view.getResult(), out);
    else if (!isa<rk::DeallocOp>(use.getOwner()))
      out.push_back(&use);
  }
}

/// The buffer under reshaping views.
Value rootOf(Value v) {
  while (auto view = v.getDefiningOp<rk::ViewOp>())
    v = view.getSource();
  return v;
}

/// The all-gather over `axis` along dimension 0 that writes `buf` (or the
/// buffer it views, with the same last dimension), if one does.
rk::AllGatherOp gatherInto(Value buf, StringRef axis) {
  Value root = rootOf(buf);
  auto last = [](Value v) {
    return cast<MemRefType>(v.getType()).getShape().back();
  };
  if (last(root) != last(buf))
    return nullptr;
  for (Operation *user : root.getUsers())
    if (auto g = dyn_cast<rk::AllGatherOp>(user);
        g && g.getOut() == root && g.getAxis() == axis && g.getDim() == 0)
      return g;
  return nullptr;
}

/// How expert ops touch a buffer: read it (as their input, gates or output
/// gradient; any number of them), or write it (one op).
enum class Touch { Read, Write };

/// The choices, axis and experts per rank of the expert ops that are the
/// only users of `buf` (besides `self`), each touching it as `touch` says;
/// null if any other op touches it, or they differ.
std::optional<ExpertsUse> onlyExperts(Value buf, Operation *self, Touch touch) {
  SmallVector<OpOperand *> uses;
  usersThroughViews(buf, uses);
  std::optional<ExpertsUse> common;
  for (OpOperand *use : uses) {
    Operation *user = use->getOwner();
    if (user == self)
      continue;
    std::optional<ExpertsUse> u = expertsUse(user);
    if (!u)
      return std::nullopt;
    bool reads = llvm::is_contained(u->reads, use->get()),
         writes = llvm::is_contained(u->writes, use->get());
    if (touch == Touch::Read ? !reads || writes : !writes || common)
      return std::nullopt;
    if (common && (common->experts != u->experts || common->axis != u->axis ||
                   common->perRank != u->perRank))
      return std::nullopt;
    common = u;
  }
  return common;
}

/// The buffer under any view of it (reshapes, subviews, rows, shards).
Value baseOf(Value v) {
  while (Operation *def = v.getDefiningOp()) {
    if (!isa<rk::ViewOp, rk::SubviewOp, rk::RowsOp, rk::ShardViewOp>(def))
      break;
    v = def->getOperand(0);
  }
  return v;
}

/// Whether an op strictly between `from` and `to` (one block) may write
/// or free `buf` (through any view of its buffer).
bool writtenBetween(Operation *from, Operation *to, Value buf) {
  Value base = baseOf(buf);
  for (Operation *op = from->getNextNode(); op && op != to;
       op = op->getNextNode()) {
    auto effects = dyn_cast<MemoryEffectOpInterface>(op);
    if (!effects) {
      if (op->getNumRegions() > 0 || !isMemoryEffectFree(op))
        return true;
      continue;
    }
    SmallVector<MemoryEffects::EffectInstance> list;
    effects.getEffects(list);
    for (auto &e : list)
      if (isa<MemoryEffects::Write, MemoryEffects::Free>(e.getEffect()) &&
          (!e.getValue() || baseOf(e.getValue()) == base))
        return true;
  }
  return false;
}

/// A gather of the experts' token operands: routed by the group's choices,
/// placed after their gather when it comes later.
bool routeGather(rk::AllGatherOp g) {
  if (!g.getOut().getDefiningOp<rk::AllocOp>())
    return false; // a view: other ops may reach its buffer
  std::optional<ExpertsUse> u = onlyExperts(g.getOut(), g, Touch::Read);
  if (!u || u->axis != g.getAxis() || g.getDim() != 0)
    return false;
  rk::AllGatherOp choices = gatherInto(u->experts, u->axis);
  if (!choices || choices->getBlock() != g->getBlock() || choices == g)
    return false;
  Operation *at = g;
  if (g->isBeforeInBlock(choices)) {
    if (writtenBetween(g, choices, g.getInput()))
      return false;
    at = choices->getNextNode();
  }
  OpBuilder b(at);
  auto r = rk::RoutedAllGatherOp::create(b, g.getLoc(), g.getInput(),
                                         choices.getOut(), g.getOut(),
                                         u->perRank, g.getAxisAttr());
  r->setDiscardableAttrs(g->getDiscardableAttrDictionary());
  g.erase();
  return true;
}

/// A reduce-scatter of what one expert op wrote (its output or gradients),
/// read by nothing else: routed by that op's choices.
bool routeScatter(rk::ReduceScatterOp rs) {
  if (rs.getDim() != 0)
    return false;
  Value in = rs.getInput();
  if (!rootOf(in).getDefiningOp<rk::AllocOp>())
    return false;
  std::optional<ExpertsUse> writer = onlyExperts(rootOf(in), rs, Touch::Write);
  if (!writer || writer->axis != rs.getAxis())
    return false;
  rk::AllGatherOp choices = gatherInto(writer->experts, writer->axis);
  if (!choices)
    return false;
  OpBuilder b(rs);
  auto r = rk::RoutedReduceScatterOp::create(b, rs.getLoc(), in,
                                             choices.getOut(), rs.getOut(),
                                             writer->perRank, rs.getAxisAttr());
  r->setDiscardableAttrs(rs->getDiscardableAttrDictionary());
  rs.erase();
  return true;
}
} // namespace

void RouteExpertsPass::runOnOperation() {
  ModuleOp module = getOperation();
  // Nothing to route without expert parallelism (and no walk of a large
  // model's IR).
  plan::MeshOp mesh = plan::getMesh(module);
  if (mesh && mesh.getAxisIndex(plan::OpShardingRule::kExpertAxis) < 0)
    return;
  for (auto par : module.getOps<plan::ParallelOp>())
    if (par.getEpComm() && *par.getEpComm() == "all_gather")
      return;
  SmallVector<rk::AllGatherOp> gathers;
  SmallVector<rk::ReduceScatterOp> scatters;
  module.walk([&](Operation *op) {
    if (auto g = dyn_cast<rk::AllGatherOp>(op))
      gathers.push_back(g);
    else if (auto rs = dyn_cast<rk::ReduceScatterOp>(op))
      scatters.push_back(rs);
  });
  for (rk::AllGatherOp g : gathers)
    routeGather(g);
  for (rk::ReduceScatterOp rs : scatters)
    routeScatter(rs);
}
