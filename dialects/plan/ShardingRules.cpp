//===- ShardingRules.cpp - Each plan op's sharding rule, as data ----------===//
//
// One function per op family: which factor each dimension is. Propagation
// (lib/Transforms/PropagateSharding.cpp) derives everything else: a factor
// present in operands but absent from a result makes that result a pending
// sum over the factor's axes, a factor marked needsReplication is gathered,
// and the linearity says which pending sums an op passes through.
//===----------------------------------------------------------------------===//
#include "dialects/plan/PlanDialect.h"

using namespace mlir;
using namespace planc::plan;
using Rule = OpShardingRule;
using Lin = OpShardingRule::Linearity;

static ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}

/// Factors for every dimension of `shape` (size-1 dimensions get none).
static SmallVector<int64_t> addFactors(Rule &r, ArrayRef<int64_t> shape) {
  SmallVector<int64_t> fs;
  for (int64_t n : shape)
    fs.push_back(n == 1 ? -1 : r.addFactor(n));
  return fs;
}

/// Operands and results all of one shape, dimension by dimension; the last
/// dimension must stay whole when `wholeLast`.
static Rule elementwise(Operation *op, bool wholeLast = false) {
  Rule r;
  ArrayRef<int64_t> shape = shapeOf(op->getResult(0));
  SmallVector<int64_t> fs = addFactors(r, shape);
  if (wholeLast && !fs.empty() && fs.back() >= 0)
    r.factors[fs.back()].needsReplication = true;
  for (unsigned i = 0; i < op->getNumOperands(); ++i)
    r.operands.push_back(Rule::tensor(fs));
  for (unsigned i = 0; i < op->getNumResults(); ++i)
    r.results.push_back(Rule::tensor(fs));
  return r;
}

/// `fs` with the factors of all but the last `keep` dimensions removed.
static SmallVector<int64_t> lastOf(ArrayRef<int64_t> fs, size_t keep) {
  return SmallVector<int64_t>(fs.take_back(keep));
}

//===--- Elementwise ------------------------------------------------------===//

#define ELEMENTWISE_RULE(OP)                                                   \
  Rule OP::getShardingRule() { return elementwise(*this); }
ELEMENTWISE_RULE(ReluOp)
ELEMENTWISE_RULE(GeluOp)
ELEMENTWISE_RULE(SiluOp)
ELEMENTWISE_RULE(ReluGradOp)
ELEMENTWISE_RULE(GeluGradOp)
ELEMENTWISE_RULE(SiluGradOp)
ELEMENTWISE_RULE(MseLossGradOp)
#undef ELEMENTWISE_RULE

// A sum (or difference) of pending sums over the same axes is one.
Rule AddOp::getShardingRule() {
  Rule r = elementwise(*this);
  r.setLinear(Lin::Joint, {0, 1});
  return r;
}

Rule SubOp::getShardingRule() {
  Rule r = elementwise(*this);
  r.setLinear(Lin::Joint, {0, 1});
  return r;
}

// A product is linear in each factor, not in both.
Rule MulOp::getShardingRule() {
  Rule r = elementwise(*this);
  r.setLinear(Lin::Each, {0, 1});
  return r;
}

// Where a gradient's sum over ranks and microbatches happens: a pending
// sum passes through a cast (linear), so bf16 gradients are summed in fp32
// after their cast to the master weight's type (Megatron's default for
// bf16), except through a widening of f16: fp16 gradients, scaled by the
// loss scale, are summed in fp16 before it, as Megatron and Micikevicius et
// al. 2018 do, unless plan-fuse-casts marked the cast `plan.sum_wide`
// (pipelines: see there).
Rule CastOp::getShardingRule() {
  Rule r = elementwise(*this);
  if (!getInput().getType().getElementType().isF16() ||
      (*this)->hasAttr("plan.sum_wide"))
    r.setLinear(Lin::Each, {0});
  return r;
}

Rule LossScaleOp::getShardingRule() {
  Rule r = elementwise(*this);
  r.setLinear(Lin::Each, {0});
  return r;
}

Rule ScaleOp::getShardingRule() {
  Rule r = elementwise(*this);
  r.setLinear(Lin::Each, {0});
  return r;
}

Rule SoftmaxOp::getShardingRule() {
  return elementwise(*this, /*wholeLast=*/true);
}

Rule SoftmaxGradOp::getShardingRule() {
  return elementwise(*this, /*wholeLast=*/true);
}

// The identity pins its result; propagation treats it specially, this rule
// only says that the layout passes through.
Rule ShardingConstraintOp::getShardingRule() {
  Rule r = elementwise(*this);
  r.setLinear(Lin::Each, {0});
  return r;
}

//===--- Linear algebra ---------------------------------------------------===//

// [..., m, k] x [k, n] (or [..., k, n]) -> [..., m, n]; k is summed over,
// and with sum_leading the leading dimensions too (the result is [m, n]).
Rule MatmulOp::getShardingRule() {
  Rule r;
  ArrayRef<int64_t> a = shapeOf(getLhs()), b = shapeOf(getRhs());
  int64_t rank = a.size();
  SmallVector<int64_t> batch = addFactors(r, a.drop_back(2));
  bool ta = getTransposeLhs(), tb = getTransposeRhs();
  int64_t m = a[rank - (ta ? 1 : 2)], k = a[rank - (ta ? 2 : 1)];
  int64_t n = b[b.size() - (tb ? 2 : 1)];
  int64_t fm = m == 1 ? -1 : r.addFactor(m), fk = k == 1 ? -1 : r.addFactor(k);
  int64_t fn = n == 1 ? -1 : r.addFactor(n);
  SmallVector<int64_t> lhs(batch), rhs, out(batch);
  lhs.append(ta ? SmallVector<int64_t>{fk, fm} : SmallVector<int64_t>{fm, fk});
  if (b.size() == a.size())
    rhs.append(batch);
  rhs.append(tb ? SmallVector<int64_t>{fn, fk} : SmallVector<int64_t>{fk, fn});
  if (getSumLeading())
    out.clear();
  out.append({fm, fn});
  r.operands = {Rule::tensor(lhs), Rule::tensor(rhs)};
  r.results = {Rule::tensor(out)};
  r.setLinear(Lin::Each, {0, 1});
  return r;
}

Rule BiasAddOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(getInput()));
  r.operands = {Rule::tensor(fs), Rule::tensor(lastOf(fs, 1))};
  r.results = {Rule::tensor(fs)};
  return r;
}

// Summed over the rows: a pending sum wherever the rows are split.
Rule BiasGradOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(getGrad()));
  r.operands = {Rule::tensor(fs)};
  r.results = {Rule::tensor(lastOf(fs, 1))};
  r.setLinear(Lin::Each, {0});
  return r;
}

Rule TransposeOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(getInput()));
  SmallVector<int64_t> out;
  for (int64_t p : getPermutation())
    out.push_back(fs[p]);
  r.operands = {Rule::tensor(fs)};
  r.results = {Rule::tensor(out)};
  r.setLinear(Lin::Each, {0});
  return r;
}

// Both shapes as products of common factors, e.g. [B, S, D] -> [B * S, D]
// is factors b, s, d with result dimension 0 = (b, s). Where the shapes
// have no common factorization, one replicated factor covers the rest.
Rule ReshapeOp::getShardingRule() {
  Rule r;
  ArrayRef<int64_t> in = shapeOf(getInput()), out = shapeOf(getResult());
  Rule::TensorDims inDims(in.size()), outDims(out.size());
  size_t i = 0, j = 0;
  int64_t ri = 1, rj = 1; // what is left of in[i] / out[j]
  auto skipOnes = [&]() {
    while (i < in.size() && ri == 1 && in[i] == 1)
      ++i;
    while (j < out.size() && rj == 1 && out[j] == 1)
      ++j;
  };
  skipOnes();
  if (i < in.size() && ri == 1)
    ri = in[i];
  if (j < out.size() && rj == 1)
    rj = out[j];
  while (i < in.size() && j < out.size()) {
    int64_t f;
    if (ri % rj == 0 || rj % ri == 0) {
      int64_t size = std::min(ri, rj);
      f = r.addFactor(size);
      inDims[i].factors.push_back(f);
      outDims[j].factors.push_back(f);
      ri /= size;
      rj /= size;
    } else {
      // No common factor boundary: the rest moves as one whole block.
      f = r.addFactor(ri * rj, /*needsReplication=*/true);
      for (; i < in.size(); ++i)
        inDims[i].factors.push_back(f);
      for (; j < out.size(); ++j)
        outDims[j].factors.push_back(f);
      break;
    }
    if (ri == 1) {
      ++i;
      while (i < in.size() && in[i] == 1)
        ++i;
      if (i < in.size())
        ri = in[i];
    }
    if (rj == 1) {
      ++j;
      while (j < out.size() && out[j] == 1)
        ++j;
      if (j < out.size())
        rj = out[j];
    }
  }
  r.operands = {inDims};
  r.results = {outDims};
  r.setLinear(Lin::Each, {0});
  return r;
}

//===--- Losses -----------------------------------------------------------===//

// Every element is summed into the scalar.
Rule MseLossOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(getPrediction()));
  r.operands = {Rule::tensor(fs), Rule::tensor(fs)};
  r.results = {Rule::TensorDims()};
  return r;
}

// Every input keeps its own layout: each is a group of its own.
Rule SumSqOp::getShardingRule() {
  Rule r;
  for (auto [i, in] : llvm::enumerate(getInputs())) {
    size_t first = r.factors.size();
    r.operands.push_back(Rule::tensor(addFactors(r, shapeOf(in))));
    for (size_t f = first; f < r.factors.size(); ++f)
      r.factors[f].group = int64_t(i);
  }
  r.results = {Rule::TensorDims()};
  return r;
}

// Positions are summed into the mean. The class dimension may be split
// (vocab-parallel): the lowering exchanges each row's maximum and sum of
// exponentials over its axes, so the full logits are never gathered.
static Rule crossEntropyRule(Value logits, bool isGrad) {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(logits));
  if (fs.back() >= 0)
    r.factors[fs.back()].exchangedByOp = true;
  r.operands = {Rule::tensor(fs), Rule::tensor(ArrayRef(fs).drop_back())};
  r.results = {isGrad ? Rule::tensor(fs) : Rule::TensorDims()};
  return r;
}

Rule CrossEntropyOp::getShardingRule() {
  return crossEntropyRule(getLogits(), false);
}

Rule CrossEntropyGradOp::getShardingRule() {
  return crossEntropyRule(getLogits(), true);
}

//===--- Transformer layers -----------------------------------------------===//

// ids [..., ] x table [v, d] -> [..., d]. The lookup is a sum over v of
// one-hot(ids) * table: a rank holding rows [a, b) of the table contributes
// those rows (zeros for other ids), so splitting v leaves a pending sum
// (vocab-parallel embedding).
Rule EmbeddingOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> ids = addFactors(r, shapeOf(getIds()));
  SmallVector<int64_t> table = addFactors(r, shapeOf(getTable()));
  SmallVector<int64_t> out(ids);
  out.push_back(table[1]);
  r.operands = {Rule::tensor(ids), Rule::tensor(table)};
  r.results = {Rule::tensor(out)};
  r.setLinear(Lin::Each, {1});
  return r;
}

// Rows scatter-added into [v, d]: summed over the positions; a rank that
// holds rows [a, b) of the table adds only those.
Rule EmbeddingGradOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> ids = addFactors(r, shapeOf(getIds()));
  SmallVector<int64_t> table = addFactors(r, shapeOf(getResult()));
  SmallVector<int64_t> grad(ids);
  grad.push_back(table[1]);
  r.operands = {Rule::tensor(ids), Rule::tensor(grad)};
  r.results = {Rule::tensor(table)};
  r.setLinear(Lin::Each, {1});
  return r;
}

// [b, s, d] + table[0..s): the table's rows stay whole; the positions may
// be split over cp (each rank adds its positions' rows).
Rule PosEmbeddingOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(getInput()));
  int64_t t = r.addFactor(shapeOf(getTable())[0], /*needsReplication=*/true);
  if (fs[1] >= 0)
    r.factors[fs[1]].positional = true;
  r.operands = {Rule::tensor(fs), Rule::tensor({t, fs[2]})};
  r.results = {Rule::tensor(fs)};
  return r;
}

Rule PosEmbeddingGradOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(getGrad()));
  int64_t t = r.addFactor(shapeOf(getResult())[0], /*needsReplication=*/true);
  // Split over cp, each rank writes its positions' rows: a pending sum.
  if (fs[1] >= 0)
    r.factors[fs[1]].positional = true;
  r.operands = {Rule::tensor(fs)};
  r.results = {Rule::tensor({t, fs[2]})};
  r.setLinear(Lin::Each, {0});
  return r;
}

/// Normalizations over the last dimension, with 1-D parameters on it:
/// `params` operands after the input, `grads`: the gradient ops' extra
/// operand (the output gradient, shaped like the input) and results.
static Rule normRule(Operation *op, unsigned params, bool isGrad) {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(op->getOperand(0)));
  if (fs.back() >= 0)
    r.factors[fs.back()].needsReplication = true;
  Rule::TensorDims x = Rule::tensor(fs), p = Rule::tensor(lastOf(fs, 1));
  r.operands.push_back(x);
  for (unsigned i = 0; i < params; ++i)
    r.operands.push_back(p);
  if (!isGrad) {
    r.results = {x};
    return r;
  }
  r.operands.push_back(x); // the output gradient
  // d input, then the parameters' gradients, summed over the rows.
  r.results.push_back(x);
  for (unsigned i = 1; i < op->getNumResults(); ++i)
    r.results.push_back(p);
  return r;
}

Rule LayerNormOp::getShardingRule() { return normRule(*this, 2, false); }
Rule RmsNormOp::getShardingRule() { return normRule(*this, 1, false); }
Rule LayerNormGradOp::getShardingRule() { return normRule(*this, 1, true); }
Rule RmsNormGradOp::getShardingRule() { return normRule(*this, 1, true); }

/// Attention over packed [b, s, (H + 2 KV) * Dh]: the heads are a factor
/// (of size KV, so that a split keeps query heads with their key/value
/// head), the packed dimension is three segments split by it, and the
/// output [b, s, H * Dh] is split by it plainly. The sequence is
/// positional: split over cp only, where the lowering exchanges what causal
/// attention needs (context parallelism); any other split is gathered.
static Rule attentionRule(Operation *op, int64_t h, int64_t kv,
                          unsigned numInputs) {
  Rule r;
  ArrayRef<int64_t> qkv = shapeOf(op->getOperand(0));
  int64_t dh = qkv[2] / (h + 2 * kv);
  int64_t b = qkv[0] == 1 ? -1 : r.addFactor(qkv[0]);
  int64_t s = qkv[1] == 1 ? -1 : r.addFactor(qkv[1]);
  if (s >= 0)
    r.factors[s].positional = true;
  int64_t heads = r.addFactor(kv);
  Rule::TensorDims packed = Rule::tensor({b, s, heads});
  packed[2].segments = {h * dh, kv * dh, kv * dh};
  Rule::TensorDims out = Rule::tensor({b, s, heads});
  r.operands.push_back(packed);
  if (numInputs == 2)
    r.operands.push_back(out); // the output gradient
  r.results.push_back(numInputs == 2 ? packed : out);
  return r;
}

Rule AttentionOp::getShardingRule() {
  return attentionRule(*this, getNumHeads(), getNumKvHeads(), 1);
}

Rule AttentionGradOp::getShardingRule() {
  return attentionRule(*this, getNumHeads(), getNumKvHeads(), 2);
}

/// rope rotates each query / key head by its sequence position: laid out
/// like attention's packed input (sequence positional, heads split as three
/// segments), result alike; a rotation is linear.
Rule RopeOp::getShardingRule() {
  Rule r = attentionRule(*this, getNumHeads(), getNumKvHeads(), 2);
  r.operands.pop_back(); // attention_grad's output gradient
  r.setLinear(Lin::Each, {0});
  return r;
}

//===--- Convolutional networks -------------------------------------------===//

/// A factor for a dimension of `size` (none for size 1).
static int64_t factorOf(Rule &r, int64_t size, bool needsReplication = false) {
  return size == 1 ? -1 : r.addFactor(size, needsReplication);
}

/// conv2d and its gradient over NCHW: the batch n and, with one group, the
/// output channels o and input channels c are factors; c is summed over
/// (split: pending sums), the filter gradient sums over n (data parallel:
/// pending sums over dp, reduced like any gradient). Spatial dimensions
/// stay whole, since a split would need halo exchanges; with groups, the
/// channels stay whole too.
static Rule convRule(Value x, Value w, Value y, bool isGrad, int64_t groups) {
  Rule r;
  ArrayRef<int64_t> xs = shapeOf(x), ws = shapeOf(w), ys = shapeOf(y);
  bool grouped = groups != 1;
  int64_t n = factorOf(r, xs[0]);
  int64_t c = factorOf(r, xs[1], grouped), o = factorOf(r, ws[0], grouped);
  int64_t h = factorOf(r, xs[2], true), wd = factorOf(r, xs[3], true);
  int64_t ho = factorOf(r, ys[2], true), wo = factorOf(r, ys[3], true);
  Rule::TensorDims in = Rule::tensor({n, c, h, wd});
  Rule::TensorDims filter = Rule::tensor({o, grouped ? -1 : c, -1, -1});
  Rule::TensorDims out = Rule::tensor({n, o, ho, wo});
  r.operands = {in, filter};
  if (!isGrad) {
    r.results = {out};
    r.setLinear(Lin::Each, {0, 1});
    return r;
  }
  r.operands.push_back(out); // the output gradient
  r.results = {in, filter};
  r.setLinear(Lin::Each, {2});
  return r;
}

Rule Conv2dOp::getShardingRule() {
  return convRule(getInput(), getFilter(), getResult(), false, getGroups());
}

Rule Conv2dGradOp::getShardingRule() {
  return convRule(getInput(), getFilter(), getGrad(), true, getGroups());
}

/// Pooling keeps the batch and channels and reads whole windows.
static Rule poolRule(Value x, Value y, bool isGrad, bool linear) {
  Rule r;
  ArrayRef<int64_t> xs = shapeOf(x), ys = shapeOf(y);
  int64_t n = factorOf(r, xs[0]), c = factorOf(r, xs[1]);
  Rule::TensorDims in =
      Rule::tensor({n, c, factorOf(r, xs[2], true), factorOf(r, xs[3], true)});
  Rule::TensorDims out =
      Rule::tensor({n, c, factorOf(r, ys[2], true), factorOf(r, ys[3], true)});
  r.operands = {in};
  if (isGrad) {
    r.operands.push_back(out);
    r.results = {in};
    r.setLinear(Lin::Each, {1}); // linear in the output gradient
  } else {
    r.results = {out};
    if (linear)
      r.setLinear(Lin::Each, {0});
  }
  return r;
}

Rule Pool2dOp::getShardingRule() {
  return poolRule(getInput(), getResult(), false, getKind() == "avg");
}

Rule Pool2dGradOp::getShardingRule() {
  return poolRule(getInput(), getGrad(), true, false);
}

Rule ChannelBiasAddOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(getInput()));
  r.operands = {Rule::tensor(fs), Rule::tensor({fs[1]})};
  r.results = {Rule::tensor(fs)};
  return r;
}

// Summed over all but the channels: pending sums where those are split.
Rule ChannelBiasGradOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(getGrad()));
  r.operands = {Rule::tensor(fs)};
  r.results = {Rule::tensor({fs[1]})};
  r.setLinear(Lin::Each, {0});
  return r;
}

/// Channel normalizations over [N, C, ...] with per-channel scale and
/// shift (`params` of them after the input; the gradients' extra operand
/// is the output gradient, their results d input and the parameters'
/// gradients). The spatial dimensions stay whole.
///  - batch norm (`perSample` false): per-channel statistics over the batch
///    and the rest. The batch may be split (data parallel): the lowering
///    sums the statistics over its axes, so results lacking the batch (the
///    parameters' gradients) are whole, not pending sums. Channels split
///    freely.
///  - group norm (`perSample` true): statistics per sample over a group of
///    channels, so the batch splits freely, the channels stay whole, and the
///    parameters' gradients are pending sums where the batch is split.
static Rule channelNormRule(Value x, unsigned params, bool isGrad,
                            bool perSample) {
  Rule r;
  ArrayRef<int64_t> xs = shapeOf(x);
  SmallVector<int64_t> fs;
  for (auto [i, n] : llvm::enumerate(xs))
    fs.push_back(factorOf(r, n, /*needsReplication=*/i >= (perSample ? 1 : 2)));
  if (!perSample && fs[0] >= 0)
    r.factors[fs[0]].exchangedByOp = true;
  Rule::TensorDims in = Rule::tensor(fs), p = Rule::tensor({fs[1]});
  r.operands.push_back(in);
  for (unsigned i = 0; i < params; ++i)
    r.operands.push_back(p);
  if (!isGrad) {
    r.results = {in};
    return r;
  }
  r.operands.push_back(in); // the output gradient
  r.results = {in, p, p};
  return r;
}

// The running statistics follow the channels like the scale and shift.
Rule BatchNormOp::getShardingRule() {
  return channelNormRule(getInput(), 2 + getRunning().size(), false, false);
}

// Sums over all but the channels: pending sums where the batch (or the rest)
// is split, resolved like any contraction's. Not linear (x * x).
Rule BatchNormMomentsOp::getShardingRule() {
  Rule r;
  SmallVector<int64_t> fs = addFactors(r, shapeOf(getInput()));
  r.operands = {Rule::tensor(fs)};
  r.results.assign(2, Rule::tensor({fs[1]}));
  return r;
}

// Channel by channel.
Rule RunningStatsUpdateOp::getShardingRule() { return elementwise(*this); }

Rule BatchNormGradOp::getShardingRule() {
  return channelNormRule(getInput(), 1, true, false);
}

Rule GroupNormOp::getShardingRule() {
  return channelNormRule(getInput(), 2, false, true);
}

Rule GroupNormGradOp::getShardingRule() {
  return channelNormRule(getInput(), 1, true, true);
}

// Element by element: the mask follows each element's global index.
Rule DropoutOp::getShardingRule() {
  Rule r = elementwise(*this);
  r.setLinear(Lin::Each, {0});
  return r;
}

//===--- Optimizer --------------------------------------------------------===//

// Parameter, gradient and moments element by element, all whole (the
// gradient was reduced for its norm already), and the whole sum of squares
// that clips the gradient.
static Rule updateRule(Operation *op, Value clipSumsq) {
  Rule r = elementwise(op);
  if (clipSumsq)
    r.operands.back() = Rule::TensorDims();
  return r;
}
Rule SgdUpdateOp::getShardingRule() {
  return updateRule(*this, getClipSumsq());
}
Rule AdamWUpdateOp::getShardingRule() {
  return updateRule(*this, getClipSumsq());
}
