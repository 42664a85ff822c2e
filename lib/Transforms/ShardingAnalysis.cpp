//===- ShardingAnalysis.cpp - Factor shardings shared by the passes -------===//
#include "ShardingAnalysis.h"

#include "llvm/ADT/SetVector.h"

using namespace mlir;
using namespace planc::plan;

std::optional<FactorAxes> planc::plan::readFactorAxes(Operation *op) {
  auto list = op->getAttrOfType<ArrayAttr>(kFactorAxesAttr);
  if (!list)
    return std::nullopt;
  FactorAxes out;
  for (Attribute f : list) {
    out.emplace_back();
    for (Attribute a : cast<ArrayAttr>(f)) {
      if (auto seg = dyn_cast<DenseI64ArrayAttr>(a))
        out.back().segments.assign(seg.asArrayRef().begin(),
                                   seg.asArrayRef().end());
      else
        out.back().axes.push_back(cast<StringAttr>(a).getValue());
    }
  }
  return out;
}

bool planc::plan::isParamCopy(Value v, func::FuncOp f) {
  auto c = v.getDefiningOp<CastOp>();
  auto arg = c ? dyn_cast<BlockArgument>(c->getOperand(0)) : BlockArgument();
  if (!arg || arg.getOwner()->getParentOp() != f)
    return false;
  auto kind = f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kKindAttr);
  return kind && kind.getValue() == "param";
}

// The caches' keys below are the bytes of what they describe: counts, then
// NUL-ended axis names and 8-byte segments, so that a key reads one way
// (no formatting: the passes ask once per operand and result of every op).
static void appendAxesKey(SmallVectorImpl<char> &key,
                          ArrayRef<StringRef> axes) {
  key.push_back(char(axes.size()));
  for (StringRef a : axes) {
    key.append(a.begin(), a.end());
    key.push_back('\0');
  }
}
static void appendSegmentsKey(SmallVectorImpl<char> &key,
                              ArrayRef<int64_t> segments) {
  key.push_back(char(segments.size()));
  key.append(reinterpret_cast<const char *>(segments.data()),
             reinterpret_cast<const char *>(segments.data() + segments.size()));
}

void planc::plan::writeFactorAxes(Operation *op, const FactorAxes &axes,
                                  llvm::StringMap<ArrayAttr> *cache) {
  SmallString<64> key;
  if (cache) {
    key.push_back(char(axes.size()));
    for (const FactorSharding &f : axes) {
      appendAxesKey(key, f.axes);
      appendSegmentsKey(key, f.segments);
    }
    if (ArrayAttr hit = cache->lookup(key)) {
      op->setAttr(kFactorAxesAttr, hit);
      return;
    }
  }
  Builder b(op->getContext());
  SmallVector<Attribute> list;
  for (const FactorSharding &f : axes) {
    SmallVector<Attribute> entry;
    for (StringRef a : f.axes)
      entry.push_back(b.getStringAttr(a));
    if (!f.segments.empty())
      entry.push_back(b.getDenseI64ArrayAttr(f.segments));
    list.push_back(b.getArrayAttr(entry));
  }
  ArrayAttr attr = b.getArrayAttr(list);
  if (cache)
    (*cache)[key] = attr;
  op->setAttr(kFactorAxesAttr, attr);
}

const OpShardingRule &RuleCache::get(ShardingRuleOpInterface r) {
  Operation *op = r.getOperation();
  SmallVector<const void *, 16> key{
      op->getName().getAsOpaquePointer(),
      reinterpret_cast<const void *>(uintptr_t(op->getNumOperands())),
      reinterpret_cast<const void *>(uintptr_t(size_t(op->hashProperties())))};
  for (Type t : op->getOperandTypes())
    key.push_back(t.getAsOpaquePointer());
  for (Type t : op->getResultTypes())
    key.push_back(t.getAsOpaquePointer());
  for (NamedAttribute a : op->getDiscardableAttrs())
    if (a.getName() != kLayerAttr) {
      key.push_back(a.getName().getAsOpaquePointer());
      key.push_back(a.getValue().getAsOpaquePointer());
    }
  auto it = index.find(ArrayRef<const void *>(key));
  if (it != index.end())
    for (const Entry &e : it->second)
      if (op->getName().compareOpProperties(op->getPropertiesStorage(),
                                            e.op->getPropertiesStorage()))
        return *e.rule;
  rules.push_back(r.getShardingRule());
  if (it == index.end()) {
    keys.push_back(std::move(key));
    it = index.try_emplace(ArrayRef<const void *>(keys.back())).first;
  }
  it->second.push_back({op, &rules.back()});
  return rules.back();
}

static ArrayAttr names(MLIRContext *ctx, ArrayRef<StringRef> axes) {
  SmallVector<Attribute> out;
  for (StringRef a : axes)
    out.push_back(StringAttr::get(ctx, a));
  return ArrayAttr::get(ctx, out);
}

ShardingAttr planc::plan::projectSharding(
    MLIRContext *ctx, FlatSymbolRefAttr mesh,
    const OpShardingRule::TensorDims &dims, const FactorAxes &factors,
    ArrayRef<StringRef> partial, ShardingCache *cache) {
  struct Split {
    ArrayRef<StringRef> axes;
    ArrayRef<int64_t> segments;
  };
  SmallVector<Split, 4> splits;
  for (const OpShardingRule::Dim &d : dims) {
    Split s;
    if (!d.factors.empty()) {
      const FactorSharding &f = factors[d.factors.front()];
      s.axes = f.axes;
      s.segments =
          d.segments.empty() ? ArrayRef(f.segments) : ArrayRef(d.segments);
    }
    if (s.axes.empty())
      s.segments = {};
    splits.push_back(s);
  }
  SmallString<128> key;
  if (cache) {
    key += mesh.getValue();
    key.push_back('\0');
    key.push_back(char(splits.size()));
    for (const Split &s : splits) {
      appendAxesKey(key, s.axes);
      appendSegmentsKey(key, s.segments);
    }
    appendAxesKey(key, partial);
    if (ShardingAttr hit = cache->lookup(key))
      return hit;
  }
  SmallVector<Attribute> dimAttrs, segAttrs;
  bool anySegments = false;
  for (const Split &s : splits) {
    dimAttrs.push_back(names(ctx, s.axes));
    anySegments |= !s.segments.empty();
    segAttrs.push_back(DenseI64ArrayAttr::get(ctx, s.segments));
  }
  if (!anySegments)
    segAttrs.clear();
  ShardingAttr out =
      ShardingAttr::get(ctx, mesh, ArrayAttr::get(ctx, dimAttrs),
                        names(ctx, partial), ArrayAttr::get(ctx, segAttrs));
  if (cache)
    (*cache)[key] = out;
  return out;
}

SmallVector<ShardingAttr>
planc::plan::effectiveOperandShardings(Operation *op, const FactorAxes &factors,
                                       RuleCache *rules) {
  // Whether `user` would take `s` pending in operand `i`: linear there, and
  // none of its factors split over an axis of the pending sum.
  auto takesPending = [&](Operation *user, unsigned i, ShardingAttr s) {
    // A constraint keeps exactly the pending sums it names.
    if (auto c = dyn_cast<ShardingConstraintOp>(user))
      return c.getSharding().getPartial() == s.getPartial();
    // Squares are linear in nothing (and sumsq's rule, over every
    // gradient, is too large to build once per gradient).
    auto r = dyn_cast<ShardingRuleOpInterface>(user);
    if (!r || isa<SumSqOp>(user))
      return false;
    std::optional<OpShardingRule> built;
    const OpShardingRule &rule =
        rules ? rules->get(r) : built.emplace(r.getShardingRule());
    if (!rule.isLinearIn(i))
      return false;
    // A gradient's inverse loss scale waits for the sum over microbatches:
    // once per step instead of once per microbatch (the sum is needed
    // anyway, and scaling by a power of two gives the same bits).
    if (isa<LossScaleOp>(user)) {
      SmallVector<StringRef> sequential = sequentialAxes(user);
      if (llvm::any_of(s.getPartialAxes(), [&](StringRef a) {
            return llvm::is_contained(sequential, a);
          }))
        return false;
    }
    // Summing before an op that makes more elements than it reads (a
    // pooling's gradient, a table's gradient from fewer rows) moves fewer
    // bytes than summing its result.
    auto elems = [](Value v) {
      auto t = dyn_cast<RankedTensorType>(v.getType());
      return t ? t.getNumElements() : 0;
    };
    int64_t in = elems(user->getOperand(i));
    if (llvm::any_of(user->getResults(),
                     [&](Value res) { return elems(res) > in; }))
      return false;
    // The user's other linear operands must let it pass: a product takes one
    // pending factor, a sum only summands pending alike.
    for (unsigned j : rule.linearOperands) {
      if (j == i || j >= user->getNumOperands())
        continue;
      ShardingAttr o = getSharding(user->getOperand(j));
      bool pending = o && o.isPartial();
      if (rule.linearity == OpShardingRule::Linearity::Each && pending)
        return false;
      if (rule.linearity == OpShardingRule::Linearity::Joint &&
          (!pending || o.getPartial() != s.getPartial()))
        return false;
    }
    std::optional<FactorAxes> fs =
        user == op ? std::optional<FactorAxes>(factors) : readFactorAxes(user);
    return !fs || llvm::none_of(s.getPartialAxes(), [&](StringRef a) {
      return llvm::any_of(*fs, [&](const FactorSharding &f) {
        return llvm::is_contained(f.axes, a);
      });
    });
  };
  SmallVector<ShardingAttr> operands;
  for (Value v : op->getOperands()) {
    ShardingAttr s = getSharding(v);
    // Only a pending sum asks its uses (each use's rule is built anew).
    bool allTake =
        s && s.isPartial() && llvm::all_of(v.getUses(), [&](OpOperand &use) {
          return takesPending(use.getOwner(), use.getOperandNumber(), s);
        });
    operands.push_back(s && s.isPartial() && !allTake ? dropPartial(s) : s);
  }
  return operands;
}

SmallVector<SmallVector<StringRef>>
planc::plan::acceptedPartials(Operation *op, const OpShardingRule &rule,
                              const FactorAxes &factors, RuleCache *rules) {
  using Lin = OpShardingRule::Linearity;
  SmallVector<ShardingAttr> operands =
      effectiveOperandShardings(op, factors, rules);
  SmallVector<SmallVector<StringRef>> out(operands.size());
  SmallVector<unsigned> partial;
  for (unsigned i : rule.linearOperands)
    if (i < operands.size() && operands[i] && operands[i].isPartial())
      partial.push_back(i);
  if (partial.empty())
    return out;
  if (rule.linearity == Lin::Each && partial.size() == 1) {
    out[partial[0]] = operands[partial[0]].getPartialAxes();
    return out;
  }
  if (rule.linearity == Lin::Joint &&
      partial.size() == rule.linearOperands.size() &&
      llvm::all_of(partial, [&](unsigned i) {
        return operands[i].getPartial() == operands[partial[0]].getPartial();
      })) {
    for (unsigned i : partial)
      out[i] = operands[i].getPartialAxes();
  }
  return out;
}

ShardingAttr planc::plan::resultSharding(
    MLIRContext *ctx, FlatSymbolRefAttr mesh, const OpShardingRule &rule,
    unsigned i, const FactorAxes &factors, ArrayRef<StringRef> passed,
    ArrayRef<StringRef> sequential, ShardingCache *cache) {
  llvm::SmallSetVector<int64_t, 8> inResult, inOperands;
  for (const OpShardingRule::Dim &d : rule.results[i])
    inResult.insert(d.factors.begin(), d.factors.end());
  for (auto &t : rule.operands)
    for (const OpShardingRule::Dim &d : t)
      inOperands.insert(d.factors.begin(), d.factors.end());
  llvm::SmallSetVector<StringRef, 4> partial;
  // Each rank saw only its part of a factor the result does not have: the
  // result is a summand.
  for (int64_t f : inOperands) {
    if (inResult.contains(f) || rule.factors[f].needsReplication)
      continue;
    for (StringRef a : factors[f].axes)
      if (!rule.factors[f].exchangedByOp || llvm::is_contained(sequential, a))
        partial.insert(a);
  }
  partial.insert(passed.begin(), passed.end());
  return projectSharding(ctx, mesh, rule.results[i], factors,
                         partial.getArrayRef(), cache);
}

SmallVector<StringRef> planc::plan::sequentialAxes(Operation *op) {
  SmallVector<StringRef> out;
  auto module =
      isa<ModuleOp>(op) ? cast<ModuleOp>(op) : op->getParentOfType<ModuleOp>();
  if (MeshOp mesh = module ? getMesh(module) : MeshOp())
    for (Attribute a : mesh.getAxes())
      if (mesh.isSequential(cast<StringAttr>(a).getValue()))
        out.push_back(cast<StringAttr>(a).getValue());
  return out;
}

SmallVector<func::FuncOp> planc::plan::distributedFunctions(ModuleOp module) {
  SmallVector<func::FuncOp> out;
  for (auto f : module.getOps<func::FuncOp>())
    if (f->hasAttr(kTrainStepAttr))
      out.push_back(f);
  for (auto f : module.getOps<func::FuncOp>())
    if (f->hasAttr(kModelAttr) && !f->hasAttr(kTrainStepAttr))
      out.push_back(f);
  return out;
}

SmallVector<BlockArgument> planc::plan::updatedArgs(func::FuncOp f) {
  SmallVector<BlockArgument> params, states;
  for (BlockArgument arg : f.getArguments()) {
    auto kind = f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kKindAttr);
    if (kind && kind.getValue() == "param")
      params.push_back(arg);
    if (kind && kind.getValue() == "state")
      states.push_back(arg);
  }
  SmallVector<BlockArgument> out(f.getNumResults());
  if (!f->hasAttr(kTrainStepAttr))
    return out;
  size_t nextParam = 0, nextState = 0;
  for (unsigned i = 0; i < f.getNumResults(); ++i) {
    auto role = f.getResultAttrOfType<StringAttr>(i, kResultAttr);
    if (!role && nextParam < params.size())
      out[i] = params[nextParam++];
    else if (role && role.getValue() == "state" && nextState < states.size())
      out[i] = states[nextState++];
  }
  return out;
}
