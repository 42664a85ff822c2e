//===- MoeOps.cpp - Mixture-of-experts ops: verifiers and sharding rules --===//
//
// The ops of PlanMoeOps.td in one place: what shapes they take, and how
// they may be split. Every MoE op works token by token, so the tokens (the
// leading dimensions) may be split over any axis, like an element-wise op's
// (dp, tp with sequence parallelism, cp); each rank then routes and runs
// its own tokens. The token's K choices and the feature dimensions stay
// whole. The experts (E) of moe_experts may be split (expert parallelism,
// over ep): a rank then runs only its experts, on every token of its ep
// group (one mesh axis splits one factor, and the weights' claim on ep wins
// over the tokens', which are gathered), and the output lacks E: a pending
// sum over ep, reduce-scattered back to the tokens' split. The experts'
// gradients are pending sums over the ranks that split the tokens (dp),
// reduced like any data-parallel gradient.
//
// Gradients (lib/Transforms/Autodiff.cpp): moe_topk has none (integers);
// moe_gates has moe_gates_grad; moe_experts has moe_experts_grad, which
// recomputes the experts' hidden activations from its input.
//===----------------------------------------------------------------------===//
#include "dialects/plan/PlanDialect.h"

using namespace mlir;
using namespace planc::plan;
using Rule = OpShardingRule;
using Lin = OpShardingRule::Linearity;

namespace {

ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}

/// `t` is `[lead..., last]` for the given leading shape.
bool hasLead(Value t, ArrayRef<int64_t> lead, int64_t last) {
  ArrayRef<int64_t> s = shapeOf(t);
  return s.size() == lead.size() + 1 && s.drop_back() == lead &&
         s.back() == last;
}

/// The routing ops' common shapes: logits [T..., E] and, when given,
/// experts [T..., K] with K <= E.
LogicalResult checkRouting(Operation *op, Value logits, Value experts,
                           int64_t k) {
  ArrayRef<int64_t> l = shapeOf(logits);
  if (l.size() < 2)
    return op->emitOpError()
           << "expects logits [tokens..., experts], got " << logits.getType();
  int64_t e = l.back();
  if (k < 1 || k > e)
    return op->emitOpError() << "top_k must be in [1, " << e
                             << "] (the number of experts), got " << k;
  if (experts && !hasLead(experts, l.drop_back(), k))
    return op->emitOpError()
           << "expects experts "
           << "[tokens..., " << k << "] for logits " << logits.getType()
           << ", got " << experts.getType();
  return success();
}

int64_t lastDim(Value v) { return shapeOf(v).back(); }

/// Factors for the token dimensions of `shape` (all but the last).
SmallVector<int64_t> tokenFactors(Rule &r, ArrayRef<int64_t> shape) {
  SmallVector<int64_t> fs;
  for (int64_t n : shape.drop_back())
    fs.push_back(n == 1 ? -1 : r.addFactor(n));
  return fs;
}

/// A factor that must stay whole (none for size 1).
int64_t whole(Rule &r, int64_t n) {
  return n == 1 ? -1 : r.addFactor(n, /*needsReplication=*/true);
}

/// `tokens` followed by `last`.
Rule::TensorDims withLast(ArrayRef<int64_t> tokens, int64_t last) {
  SmallVector<int64_t> fs(tokens);
  fs.push_back(last);
  return Rule::tensor(fs);
}

/// moe_experts and its gradient: x [T..., d], experts and gates [T..., K],
/// up [E, d, h], down [E, h, d'], gate [E, d, h]; the gradient's dy [T...,
/// d'] comes after the gates.
Rule expertsRule(Operation *op, bool isGrad) {
  Rule r;
  Value x = op->getOperand(0);
  SmallVector<int64_t> t = tokenFactors(r, shapeOf(x));
  unsigned w = isGrad ? 4 : 3; // the first weight operand
  ArrayRef<int64_t> up = shapeOf(op->getOperand(w)),
                    down = shapeOf(op->getOperand(w + 1));
  // E may be split (expert parallelism); the rank's lowering tells its
  // kernel which experts it holds.
  int64_t e = up[0] == 1 ? -1 : r.addFactor(up[0]), d = whole(r, up[1]),
          h = whole(r, up[2]), dout = whole(r, down[2]),
          k = whole(r, lastDim(op->getOperand(1)));
  Rule::TensorDims xs = withLast(t, d), ks = withLast(t, k),
                   ys = withLast(t, dout), upT = Rule::tensor({e, d, h}),
                   downT = Rule::tensor({e, h, dout});
  r.operands = {xs, ks, ks};
  if (isGrad)
    r.operands.push_back(ys);
  r.operands.push_back(upT);
  r.operands.push_back(downT);
  if (op->getNumOperands() > w + 2)
    r.operands.push_back(upT);
  if (!isGrad) {
    r.results = {ys};
    return r;
  }
  // The weights' gradients lack the token factors: pending sums.
  r.results = {xs, ks, upT, downT};
  if (op->getNumResults() > 4)
    r.results.push_back(upT);
  return r;
}

} // namespace

//===--- Verifiers --------------------------------------------------------===//

/// A 1-D f32 tensor of E values (one per expert).
static LogicalResult checkPerExpert(Operation *op, StringRef what, Value v,
                                    int64_t experts) {
  auto t = cast<RankedTensorType>(v.getType());
  if (t.getRank() != 1 || t.getDimSize(0) != experts ||
      !t.getElementType().isF32())
    return op->emitOpError() << "expects " << what << " tensor<" << experts
                             << "xf32> (one per expert), got " << t;
  return success();
}

LogicalResult MoeTopkOp::verify() {
  if (failed(checkRouting(*this, getLogits(), getResult(), getTopK())))
    return failure();
  if (getBias() &&
      failed(checkPerExpert(*this, "a bias", getBias(), lastDim(getLogits()))))
    return failure();
  if (bool(getBias()) != bool(getBiasUpdate()))
    return emitOpError() << "takes a bias exactly when it has a bias_update "
                            "rate";
  if (auto a = getAuxLoss(); a && !(a->convertToDouble() >= 0))
    return emitOpError() << "aux_loss must be >= 0";
  if (auto c = getCapacity()) {
    if (*c < 1)
      return emitOpError() << "capacity must be >= 1, got " << *c;
    if (shapeOf(getLogits()).size() < 3)
      return emitOpError() << "with a capacity, expects logits [..., "
                              "sequence, experts], got "
                           << getLogits().getType();
  }
  return success();
}

LogicalResult MoeAuxGradOp::verify() {
  int64_t k = lastDim(getExperts());
  if (failed(checkRouting(*this, getLogits(), getExperts(), k)))
    return failure();
  if (shapeOf(getLogits()).size() < 3)
    return emitOpError() << "expects logits [..., sequence, experts], got "
                         << getLogits().getType();
  if (!(getCoefficient().convertToDouble() >= 0) || getSequences() < 1)
    return emitOpError() << "expects a coefficient >= 0 and sequences >= 1";
  return success();
}

LogicalResult MoeLoadOp::verify() {
  if (shapeOf(getExperts()).size() < 2)
    return emitOpError() << "expects experts [tokens..., K], got "
                         << getExperts().getType();
  auto t = getResult().getType();
  return checkPerExpert(*this, "a result", getResult(),
                        t.getRank() == 1 ? t.getDimSize(0) : -1);
}

LogicalResult MoeBiasUpdateOp::verify() {
  auto t = getBias().getType();
  return checkPerExpert(*this, "a bias", getBias(),
                        t.getRank() == 1 ? t.getDimSize(0) : -1);
}

LogicalResult MoeGatesOp::verify() {
  int64_t k = lastDim(getExperts());
  if (failed(checkRouting(*this, getLogits(), getExperts(), k)))
    return failure();
  if (getResult().getType() !=
      getExperts().getType().clone(Float32Type::get(getContext())))
    return emitOpError() << "expects f32 gates shaped like the experts "
                         << getExperts().getType() << ", got "
                         << getResult().getType();
  return success();
}

LogicalResult MoeGatesGradOp::verify() {
  int64_t k = lastDim(getExperts());
  if (failed(checkRouting(*this, getLogits(), getExperts(), k)))
    return failure();
  if (getGrad().getType() !=
      getExperts().getType().clone(Float32Type::get(getContext())))
    return emitOpError() << "expects an f32 gradient shaped like the experts "
                         << getExperts().getType() << ", got "
                         << getGrad().getType();
  return success();
}

/// The shapes of moe_experts (and its gradient, whose `dy` has the result's
/// shape).
static LogicalResult checkExperts(Operation *op, Value x, Value experts,
                                  Value gates, Value up, Value down, Value gate,
                                  Value result, StringRef act) {
  ArrayRef<int64_t> xs = shapeOf(x), us = shapeOf(up), ds = shapeOf(down);
  if (xs.size() < 2)
    return op->emitOpError()
           << "expects an input [tokens..., d], got " << x.getType();
  if (act != "swiglu" && act != "gelu")
    return op->emitOpError()
           << "act must be \"swiglu\" or \"gelu\", got \"" << act << "\"";
  if ((act == "swiglu") != bool(gate))
    return op->emitOpError() << "takes a gate weight with act = \"swiglu\" "
                                "and none with \"gelu\"";
  if (us.size() != 3 || us[1] != xs.back())
    return op->emitOpError() << "expects up [experts, " << xs.back()
                             << ", hidden], got " << up.getType();
  if (ds.size() != 3 || ds[0] != us[0] || ds[1] != us[2])
    return op->emitOpError() << "expects down [" << us[0] << ", " << us[2]
                             << ", d'], got " << down.getType();
  if (gate && gate.getType() != up.getType())
    return op->emitOpError() << "expects gate shaped like up " << up.getType()
                             << ", got " << gate.getType();
  auto elt = cast<RankedTensorType>(x.getType()).getElementType();
  for (Value w : {up, down, gate, result})
    if (w && cast<RankedTensorType>(w.getType()).getElementType() != elt)
      return op->emitOpError() << "expects the weights and the result in the "
                                  "input's element type "
                               << elt << ", got " << w.getType();
  int64_t k = lastDim(experts);
  if (!hasLead(experts, xs.drop_back(), k) ||
      gates.getType() != cast<RankedTensorType>(experts.getType())
                             .clone(Float32Type::get(op->getContext())))
    return op->emitOpError()
           << "expects experts (i32) and f32 gates [tokens..., K] for the "
              "input "
           << x.getType() << ", got " << experts.getType() << " and "
           << gates.getType();
  if (!hasLead(result, xs.drop_back(), ds[2]))
    return op->emitOpError() << "expects a result [tokens..., " << ds[2]
                             << "], got " << result.getType();
  return success();
}

LogicalResult MoeExpertsOp::verify() {
  return checkExperts(*this, getInput(), getExperts(), getGates(), getUp(),
                      getDown(), getGate(), getResult(), getAct());
}

LogicalResult MoeExpertsGradOp::verify() {
  if (failed(checkExperts(*this, getInput(), getExperts(), getGates(), getUp(),
                          getDown(), getGate(), getGrad(), getAct())))
    return failure();
  if (bool(getGate()) != bool(getGateGrad()) ||
      (getGate() && getGate().getType() != getGateGrad().getType()))
    return emitOpError() << "has a gate gradient exactly when it has a gate "
                            "weight, of its type";
  return success();
}

//===--- Sharding rules ---------------------------------------------------===//

/// The sequence (the last token dimension) kept whole: per-sequence
/// capacities and balancing terms read all of its tokens.
static void wholeSequence(Rule &r, ArrayRef<int64_t> tokens) {
  if (!tokens.empty() && tokens.back() >= 0)
    r.factors[tokens.back()].needsReplication = true;
}

// logits [T..., E] -> experts [T..., K]: tokens split freely, the experts
// whole (a token's choice reads all its logits); with a capacity, the
// sequence whole.
Rule MoeTopkOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> t = tokenFactors(r, shapeOf(getLogits()));
  int64_t e = whole(r, lastDim(getLogits())), k = whole(r, getTopK());
  if (getCapacity())
    wholeSequence(r, t);
  r.operands = {withLast(t, e)};
  if (getBias())
    r.operands.push_back(Rule::tensor({e}));
  r.results = {withLast(t, k)};
  return r;
}

/// The factors of a routing op on logits [T..., E] and choices [T..., K]:
/// the tokens split freely, E and K whole.
struct RoutingFactors {
  SmallVector<int64_t> t;
  int64_t e, k;
};
static RoutingFactors routingFactors(Rule &r, Value logits, Value experts) {
  RoutingFactors f;
  f.t = tokenFactors(r, shapeOf(logits));
  f.e = whole(r, lastDim(logits));
  f.k = whole(r, lastDim(experts));
  return f;
}

Rule MoeAuxGradOp::getShardingRule() {
  Rule r;
  auto [t, e, k] = routingFactors(r, getLogits(), getExperts());
  wholeSequence(r, t);
  r.operands = {withLast(t, e), withLast(t, k)};
  r.results = {withLast(t, e)};
  return r;
}

// A count over the tokens: a split of them leaves a pending sum.
Rule MoeLoadOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> t = tokenFactors(r, shapeOf(getExperts()));
  int64_t k = whole(r, lastDim(getExperts())),
          e = whole(r, getResult().getType().getDimSize(0));
  r.operands = {withLast(t, k)};
  r.results = {Rule::tensor({e})};
  return r;
}

Rule MoeBiasUpdateOp::getShardingRule() {
  Rule r;
  int64_t e = whole(r, getBias().getType().getDimSize(0));
  r.operands = {Rule::tensor({e}), Rule::tensor({e})};
  r.results = {Rule::tensor({e})};
  return r;
}

Rule MoeGatesOp::getShardingRule() {
  Rule r;
  auto [t, e, k] = routingFactors(r, getLogits(), getExperts());
  r.operands = {withLast(t, e), withLast(t, k)};
  r.results = {withLast(t, k)};
  return r;
}

// Linear in the gates' gradient.
Rule MoeGatesGradOp::getShardingRule() {
  Rule r;
  auto [t, e, k] = routingFactors(r, getLogits(), getExperts());
  r.operands = {withLast(t, e), withLast(t, k), withLast(t, k)};
  r.results = {withLast(t, e)};
  r.setLinear(Lin::Each, {2});
  return r;
}

Rule MoeExpertsOp::getShardingRule() { return expertsRule(*this, false); }

// Linear in the output gradient (the gates and the input enter as
// products with it).
Rule MoeExpertsGradOp::getShardingRule() {
  Rule r = expertsRule(*this, true);
  r.setLinear(Lin::Each, {3});
  return r;
}
