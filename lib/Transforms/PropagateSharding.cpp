//===- PropagateSharding.cpp - Sharding propagation to a fixed point ------===//
//
// Every value of the distributed functions gets a layout, from a few seeds:
// sharded arguments (user `shard(...)`, the tensor policy, the data-parallel
// batch split, ZeRO) and `plan.sharding_constraint`s. Per op, the sharding
// rule (dialects/plan/ShardingRules.cpp) relates its tensors' dimensions
// through factors; the engine reads each factor's mesh axes from whichever
// tensor has the strongest claim and writes them to the tensors that have
// none, forward and backward over the ops until nothing changes (the way
// OpenXLA Shardy propagates). Claims are ordered by priority: user (0), then
// policy and data (1), then ZeRO storage (2); at equal priority a layout that
// comes from a parameter wins, then the first operand. Two user annotations
// that disagree on one factor are an error naming both. A mesh axis splits
// at most one factor per op (per independent tensor of sumsq); the weaker
// claim loses it.
//
// Then each op's decision is recorded: `plan.factor_axes` (the axes of each
// factor) and `plan.sharding` on its results. Where an operand's layout
// differs from what the op's factors need, plan-insert-reshards inserts a
// reshard.
//===----------------------------------------------------------------------===//
#include "ArgAttrBatch.h"
#include "ShardingAnalysis.h"
#include "planc/Transforms/Passes.h"

#include "llvm/Support/Allocator.h"

namespace planc {
#define GEN_PASS_DEF_PROPAGATESHARDING
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;
using Rule = OpShardingRule;

namespace {
constexpr int kOpen = 1 << 20;
struct DimState;
bool axisTaken(ArrayRef<DimState> ds, size_t d, ArrayRef<StringRef> axes,
               int prio);

int priorityOf(StringRef origin) {
  if (origin == "policy" || origin == "data")
    return 1;
  if (origin == "zero")
    return 2;
  return 0; // "user", and annotations written by hand in tests
}

/// The origins recorded as `plan.sharding_origin`: one string for every
/// dimension, or a list with one per dimension.
SmallVector<StringRef> readOrigins(Attribute a, StringRef fallback) {
  if (auto str = dyn_cast_or_null<StringAttr>(a))
    return {str.getValue()};
  SmallVector<StringRef> out;
  if (auto list = dyn_cast_or_null<ArrayAttr>(a))
    for (Attribute e : list)
      if (auto str = dyn_cast<StringAttr>(e))
        out.push_back(str.getValue());
  if (out.empty())
    out.push_back(fallback);
  return out;
}

struct DimState {
  SmallVector<StringRef, 2> axes;
  SmallVector<int64_t, 0> segments; // rare (packed q/k/v): none inline
  int prio = kOpen;                 // kOpen: nothing known yet
  bool closed = false;              // a seed: propagation never changes it
  bool anchored = false;            // the layout of a parameter
  LocationAttr origin;              // where the claim comes from (for errors)
  // axes[weakFrom..] hold only at weakPrio (a ZeRO refinement).
  size_t weakFrom = SIZE_MAX;
  int weakPrio = kOpen;
};

/// A mesh axis splits one dimension of a tensor: a claim on an axis that
/// another dimension holds at least as strongly loses.
bool axisTaken(ArrayRef<DimState> ds, size_t d, ArrayRef<StringRef> axes,
               int prio) {
  for (auto [e, other] : llvm::enumerate(ds))
    if (e != d && other.prio <= prio && llvm::any_of(axes, [&](StringRef a) {
          return llvm::is_contained(other.axes, a);
        }))
      return true;
  return false;
}

struct Choice {
  SmallVector<StringRef, 2> axes;
  SmallVector<int64_t> segments; // carried by dimensions the op passes on
  int prio = kOpen;
  // axes[weakFrom..] refine the claim with a weaker one (ZeRO's split of
  // optimizer state over dp on top of the tensor-parallel split); they are
  // the first to go when an axis is contested.
  size_t weakFrom = SIZE_MAX;
  int weakPrio = kOpen;
  bool anchored = false;
  LocationAttr origin;
};

/// One tensor of an op with the rule's view of its dimensions, and its
/// layout so far.
struct Slot {
  Value value;
  const Rule::TensorDims *dims;
  MutableArrayRef<DimState> state;
};

class Propagator {
public:
  explicit Propagator(MeshOp mesh) : mesh(mesh) {}
  Propagator(const Propagator &) = delete;
  ~Propagator() {
    for (auto &entry : index)
      for (DimState &d : entry.second)
        d.~DimState();
  }

  /// Sizes the tables for `f`'s values and builds each op's rule once (the
  /// sweeps visit every op several times).
  void prepare(func::FuncOp f) {
    size_t values = f.getNumArguments(), ops = 0;
    f.walk([&](Operation *op) {
      values += op->getNumResults();
      ++ops;
    });
    index.reserve(values);
    infos.reserve(ops);
    opIndex.reserve(ops);
    f.walk([&](Operation *op) {
      OpInfo info{op, nullptr, {}};
      if (auto r = dyn_cast<ShardingRuleOpInterface>(op)) {
        info.rule = &rules.get(r);
        const Rule &rule = *info.rule;
        for (auto [i, v] : llvm::enumerate(op->getOperands()))
          if (i < rule.operands.size())
            info.slots.push_back({v, &rule.operands[i], dims(v)});
        for (auto [i, v] : llvm::enumerate(op->getResults()))
          if (i < rule.results.size())
            info.slots.push_back({v, &rule.results[i], dims(v)});
      }
      opIndex[op] = infos.size();
      infos.push_back(std::move(info));
    });
  }

  /// `v`'s dimensions (none for a scalar or a non-tensor).
  MutableArrayRef<DimState> dims(Value v) {
    auto [it, fresh] = index.try_emplace(v);
    if (fresh)
      if (auto t = dyn_cast<RankedTensorType>(v.getType());
          t && t.getRank() > 0) {
        DimState *d = dimStore.Allocate<DimState>(t.getRank());
        for (int64_t i = 0; i < t.getRank(); ++i)
          new (d + i) DimState();
        it->second = {d, size_t(t.getRank())};
      }
    return it->second;
  }

  /// Seeds `v` with `s`. `origins` gives the origin of each dimension (one
  /// entry: all of them; none: "user"): it sets the claim's priority, and
  /// whether an unsplit dimension is fixed (a user's) or left open for
  /// propagation (a policy's, ZeRO's).
  LogicalResult seed(Value v, ShardingAttr s, ArrayRef<StringRef> origins,
                     bool anchored, Location loc, bool closeAll = false) {
    auto type = cast<RankedTensorType>(v.getType());
    if (s.getRank() != type.getRank())
      return mlir::emitError(loc) << "sharding " << s << " has " << s.getRank()
                                  << " dimensions but the value " << type
                                  << " has " << type.getRank();
    if (failed(checkAxes(s, loc)))
      return failure();
    MutableArrayRef<DimState> ds = dims(v);
    for (auto [d, st] : llvm::enumerate(ds)) {
      StringRef origin = origins.empty()       ? StringRef("user")
                         : origins.size() == 1 ? origins[0]
                                               : origins[d];
      st.axes.assign(s.getDimAxes(d));
      st.segments.assign(s.getDimSegments(d).begin(),
                         s.getDimSegments(d).end());
      if (st.axes.empty() && origin != "user" && origin != "data" && !closeAll)
        continue; // open
      // "policy/zero": the last axis is ZeRO's refinement of the rest;
      // "policy/zero:2": the last two (ZeRO over dp and ep).
      auto [strong, weakSpec] = origin.split('/');
      auto [weak, count] = weakSpec.split(':');
      st.prio = priorityOf(strong);
      size_t n = 1;
      if (!count.empty() && count.getAsInteger(10, n))
        n = 1;
      if (!weak.empty() && !st.axes.empty()) {
        st.weakFrom = st.axes.size() - std::min(n, st.axes.size());
        st.weakPrio = priorityOf(weak);
      }
      st.closed = true;
      st.anchored = anchored;
      st.origin = loc;
    }
    return success();
  }

  LogicalResult propagate(func::FuncOp f);
  /// ZeRO: splits every AdamW moment (stage >= 1) and, at stage 3 (or from
  /// stage 1 where the model reads it only in 16 bits), every parameter
  /// over `dp` as well, on the first dimension the split divides,
  /// on top of the layout propagation gave the parameter.
  void splitForZero(func::FuncOp f, int64_t stage);
  LogicalResult materialize(func::FuncOp f);

private:
  LogicalResult checkAxes(ShardingAttr s, Location loc) {
    for (int64_t d = 0; d < s.getRank(); ++d)
      for (StringRef a : s.getDimAxes(d))
        if (mesh.getAxisIndex(a) < 0)
          return mlir::emitError(loc)
                 << "sharding " << s << " names mesh axis '" << a << "', which "
                 << mesh.getSymName() << " does not have";
    return success();
  }

  int64_t product(ArrayRef<StringRef> axes) {
    int64_t n = 1;
    for (StringRef a : axes)
      n *= mesh.getAxisSize(a);
    return n;
  }

  /// Whether `axes` split factor `size` (each segment, when segmented).
  bool divides(int64_t size, ArrayRef<int64_t> segments,
               ArrayRef<StringRef> axes) {
    int64_t n = product(axes);
    if (segments.empty())
      return size % n == 0;
    return llvm::all_of(segments, [&](int64_t s) { return s % n == 0; });
  }

  /// An op of the function, in walk order, with its rule and its tensors'
  /// states found once (the sweeps visit every op several times).
  struct OpInfo {
    Operation *op;
    const Rule *rule; // null: not a rule op
    SmallVector<Slot, 6> slots;
  };

  FailureOr<SmallVector<Choice>> resolve(const OpInfo &info);
  void push(const OpInfo &info, ArrayRef<Choice> choice);
  void unify(Value a, Value b);
  LogicalResult visit(const OpInfo &info);

  /// A value's layout changed: the ops that read or write it are visited
  /// again by the next sweep (the others' values are as they left them).
  void touch(Value v) {
    auto mark = [&](Operation *op) {
      if (auto it = opIndex.find(op); it != opIndex.end())
        dirty[it->second] = true;
    };
    if (Operation *def = v.getDefiningOp())
      mark(def);
    for (Operation *user : v.getUsers())
      mark(user);
    changed = true;
  }

  MeshOp mesh;
  /// Each value's layout so far, one DimState per dimension. They live in
  /// one arena (a million values, most with two or three dimensions: one
  /// heap block each would be half of propagation's memory and time).
  /// (dims() makes every array, and only the index knows them: the
  /// destructor runs their elements' destructors.)
  llvm::BumpPtrAllocator dimStore;
  DenseMap<Value, MutableArrayRef<DimState>> index;
  /// Each kind of op's rule, built once (with the rules of the users that
  /// materialize asks about).
  RuleCache rules;
  std::vector<OpInfo> infos;
  DenseMap<Operation *, unsigned> opIndex;
  /// Per op (infos' order): whether one of its values changed since its
  /// last visit.
  std::vector<char> dirty;

  bool changed = false;
};
} // namespace

FailureOr<SmallVector<Choice>> Propagator::resolve(const OpInfo &info) {
  Operation *op = info.op;
  const Rule &rule = *info.rule;
  SmallVector<Choice> choice(rule.factors.size());
  SmallVector<SmallVector<Choice, 2>, 4> others(rule.factors.size());
  for (const Slot &s : info.slots) {
    MutableArrayRef<DimState> ds = s.state;
    for (auto [d, rd] : llvm::enumerate(*s.dims)) {
      if (rd.factors.empty() || d >= ds.size())
        continue;
      int64_t f = rd.factors.front();
      DimState &st = ds[d];
      if (rule.factors[f].needsReplication || st.prio >= kOpen ||
          st.axes.empty())
        continue;
      // A positional factor (the sequence of attention and rope) keeps only
      // a leading context-parallel split; the rest is gathered.
      SmallVector<StringRef, 2> axes(st.axes);
      if (rule.factors[f].positional) {
        if (axes.front() != Rule::kContextAxis)
          continue;
        axes.resize(1);
      }
      // Where the rule gives a dimension segments (attention's packed
      // q/k/v), the tensor must be split by them; elsewhere the op passes
      // the dimension on and its segments travel with the factor.
      SmallVector<int64_t> carried;
      if (!rd.segments.empty()) {
        if (ArrayRef<int64_t>(st.segments) != ArrayRef<int64_t>(rd.segments))
          continue;
      } else {
        carried.assign(st.segments.begin(), st.segments.end());
      }
      if (!divides(rule.factors[f].size, rd.segments, axes) ||
          !divides(rule.factors[f].size, carried, axes))
        continue;
      Choice &c = choice[f];
      if (c.prio == 0 && st.prio == 0 &&
          (c.axes != axes || c.segments != carried)) {
        InFlightDiagnostic diag = op->emitError()
                                  << "conflicting shardings from two "
                                     "annotations: one dimension is split "
                                     "over [";
        llvm::interleaveComma(c.axes, diag);
        diag << "] by one and over [";
        llvm::interleaveComma(axes, diag);
        diag << "] by the other; make the shard(...) annotations agree or "
                "remove one";
        if (c.origin)
          diag.attachNote(Location(c.origin)) << "the first is set here";
        if (st.origin)
          diag.attachNote(Location(st.origin)) << "the second is set here";
        return failure();
      }
      bool better =
          st.prio < c.prio || (st.prio == c.prio && st.anchored && !c.anchored);
      Choice cand;
      cand.axes = axes;
      cand.segments = carried;
      cand.prio = st.prio;
      cand.anchored = st.anchored;
      cand.origin = st.origin;
      cand.weakFrom = std::min(st.weakFrom, axes.size());
      cand.weakPrio = st.weakPrio;
      if (better) {
        if (c.prio < kOpen)
          others[f].push_back(c);
        c = cand;
      } else {
        others[f].push_back(cand);
      }
    }
  }
  // A weaker claim that splits a factor further than the chosen one (the
  // chosen axes followed by more) refines it.
  for (auto [f, c] : llvm::enumerate(choice)) {
    c.weakFrom = std::min(c.weakFrom, c.axes.size());
    for (const Choice &o : others[f]) {
      ArrayRef<StringRef> base = ArrayRef(c.axes).take_front(c.weakFrom);
      if (o.axes.size() > c.axes.size() && o.segments == c.segments &&
          ArrayRef(o.axes).take_front(base.size()) == base) {
        c.axes = o.axes;
        c.weakPrio =
            std::max(o.prio, o.weakFrom < o.axes.size() ? o.weakPrio : o.prio);
      }
    }
  }
  // A dimension made of several factors ([B * S] of a reshape) is split
  // by its major factor only: rank blocks of a minor factor are not
  // contiguous in it.
  for (auto &tensors : {std::cref(rule.operands), std::cref(rule.results)})
    for (const Rule::TensorDims &t : tensors.get())
      for (const Rule::Dim &d : t)
        for (size_t k = 1; k < d.factors.size(); ++k)
          choice[d.factors[k]].axes.clear();
  // One mesh axis splits at most one factor (of a group: Factor::group):
  // the strongest claim keeps it (a refinement counts at its own, weaker
  // priority).
  struct Part {
    int64_t factor;
    bool weak;
    int prio;
  };
  SmallVector<Part> parts;
  for (auto [f, c] : llvm::enumerate(choice)) {
    parts.push_back({(int64_t)f, false, c.prio});
    if (c.weakFrom < c.axes.size())
      parts.push_back({(int64_t)f, true, c.weakPrio});
  }
  llvm::stable_sort(parts, [&](const Part &a, const Part &b) {
    return std::make_tuple(a.prio, !choice[a.factor].anchored, a.weak) <
           std::make_tuple(b.prio, !choice[b.factor].anchored, b.weak);
  });
  SmallVector<StringRef, 8> used0; // few axes: a set would allocate
  DenseMap<int64_t, SmallVector<StringRef, 8>> usedByGroup;
  SmallVector<bool> cut(choice.size(), false);
  for (const Part &part : parts) {
    Choice &c = choice[part.factor];
    if (part.weak && cut[part.factor])
      continue;
    int64_t group = rule.factors[part.factor].group;
    auto &used = group ? usedByGroup[group] : used0;
    size_t begin = part.weak ? c.weakFrom : 0;
    size_t end =
        part.weak ? c.axes.size() : std::min(c.weakFrom, c.axes.size());
    size_t keep = begin;
    while (keep < end && !llvm::is_contained(used, c.axes[keep]))
      ++keep;
    for (size_t k = begin; k < keep; ++k)
      used.push_back(c.axes[k]);
    if (keep < end) {
      c.axes.truncate(keep);
      cut[part.factor] = true;
    }
    c.weakFrom = std::min(c.weakFrom, c.axes.size());
  }
  return choice;
}

void Propagator::push(const OpInfo &info, ArrayRef<Choice> choice) {
  for (const Slot &s : info.slots) {
    MutableArrayRef<DimState> ds = s.state;
    for (auto [d, rd] : llvm::enumerate(*s.dims)) {
      if (rd.factors.empty() || d >= ds.size())
        continue;
      const Choice &c = choice[rd.factors.front()];
      // Only the major factor of a dimension can carry its split.
      if (c.axes.empty() ||
          llvm::any_of(ArrayRef(rd.factors).drop_front(),
                       [&](int64_t f) { return !choice[f].axes.empty(); }))
        continue;
      DimState &st = ds[d];
      // ZeRO's storage split reaches arguments only where it is seeded (a
      // parameter is split by it only where splitForZero chose to).
      if (st.closed ||
          (isa<BlockArgument>(s.value) && c.prio >= priorityOf("zero")))
        continue;
      // A refinement extends what a tensor already has (never a
      // parameter's own layout: that is ZeRO's, seeded explicitly).
      bool refines =
          c.axes.size() > st.axes.size() && st.prio < kOpen &&
          ArrayRef(c.axes).take_front(st.axes.size()) == ArrayRef(st.axes) &&
          !isa<BlockArgument>(s.value);
      if (!refines && c.prio >= st.prio)
        continue;
      if (axisTaken(ds, d, c.axes, std::min(c.prio, st.prio)))
        continue;
      if (refines && c.prio >= st.prio) {
        st.weakFrom = std::min(st.weakFrom, st.axes.size());
        st.weakPrio = c.weakFrom < c.axes.size() ? c.weakPrio : c.prio;
        st.axes = c.axes;
        touch(s.value);
        continue;
      }
      st.axes = c.axes;
      ArrayRef<int64_t> segments =
          rd.segments.empty() ? ArrayRef(c.segments) : ArrayRef(rd.segments);
      st.segments.assign(segments.begin(), segments.end());
      st.prio = c.prio;
      st.anchored = c.anchored;
      st.origin = c.origin;
      st.weakFrom = c.weakFrom;
      st.weakPrio = c.weakPrio;
      touch(s.value);
    }
  }
}

/// Two values that must be laid out alike (a returned parameter and the
/// argument it updates): the stronger claim per dimension wins.
void Propagator::unify(Value a, Value b) {
  MutableArrayRef<DimState> da = dims(a), db = dims(b);
  // As in push: ZeRO's split reaches an argument only where it is seeded.
  auto storageIntoArg = [&](Value to, const DimState &from) {
    return isa<BlockArgument>(to) && from.prio >= priorityOf("zero");
  };
  for (size_t d = 0; d < da.size() && d < db.size(); ++d) {
    DimState &x = da[d], &y = db[d];
    if (storageIntoArg(b, x) || storageIntoArg(a, y))
      continue;
    if (x.prio < y.prio && !y.closed && !axisTaken(db, d, x.axes, x.prio)) {
      y = x;
      y.closed = false;
      touch(b);
    } else if (y.prio < x.prio && !x.closed &&
               !axisTaken(da, d, y.axes, y.prio)) {
      x = y;
      x.closed = false;
      touch(a);
    }
  }
}

LogicalResult Propagator::visit(const OpInfo &info) {
  Operation *op = info.op;
  if (info.rule) {
    FailureOr<SmallVector<Choice>> choice = resolve(info);
    if (failed(choice))
      return failure();
    push(info, *choice);
    return success();
  }
  // Layout ops already in the input keep dimensions where they are.
  if (isa<ReshardOp, AllReduceOp>(op))
    unify(op->getOperand(0), op->getResult(0));
  if (auto ret = dyn_cast<func::ReturnOp>(op)) {
    auto f = cast<func::FuncOp>(op->getParentOp());
    if (!f->hasAttr(kTrainStepAttr))
      return success();
    for (auto [i, arg] : llvm::enumerate(updatedArgs(f)))
      if (arg && i < ret.getNumOperands())
        unify(arg, ret.getOperand(i));
  }
  return success();
}

/// Whether every use of `param` but its update `update` is a cast to a
/// 16-bit float type (the copies plan-mixed-precision makes).
static bool onlyReadAs16Bit(Value param, Operation *update) {
  bool any = false;
  for (Operation *user : param.getUsers()) {
    if (user == update)
      continue;
    auto c = dyn_cast<CastOp>(user);
    if (!c)
      return false;
    Type e = cast<RankedTensorType>(c.getType()).getElementType();
    if (!e.isBF16() && !e.isF16())
      return false;
    any = true;
  }
  return any;
}

void Propagator::splitForZero(func::FuncOp f, int64_t stage) {
  // The data-parallel ranks of a parameter: dp, and the expert-parallel
  // ranks for every parameter they do not split (all but the experts').
  SmallVector<StringRef, 2> dataAxes;
  for (StringRef a : {StringRef("dp"), StringRef(Rule::kExpertAxis)})
    if (mesh.getAxisIndex(a) >= 0 && mesh.getAxisSize(a) > 1)
      dataAxes.push_back(a);
  if (dataAxes.empty())
    return;
  auto kindOf = [&](Value v) -> StringRef {
    auto arg = dyn_cast<BlockArgument>(v);
    if (!arg || arg.getOwner()->getParentOp() != f)
      return "";
    auto k = f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kKindAttr);
    return k ? k.getValue() : "";
  };
  f.walk([&](Operation *op) {
    if (!isa<AdamWUpdateOp, SgdUpdateOp>(op) ||
        kindOf(op->getOperand(0)) != "param")
      return;
    Value param = op->getOperand(0);
    SmallVector<Value> targets;
    for (Value v : op->getOperands().drop_front(2))
      if (kindOf(v) == "state")
        targets.push_back(v);
    // Stage 3 splits every parameter. At stages 1 and 2 a parameter the
    // model reads only through 16-bit copies is split too: its fp32 master
    // weights are optimizer state, which the 16-bit copy, gathered once per
    // step, stands in for (Megatron-LM's distributed optimizer, ZeRO's
    // K = 12 bytes of sharded state per parameter).
    if (stage >= 3 || (stage >= 1 && onlyReadAs16Bit(param, op)))
      targets.push_back(param);
    if (targets.empty())
      return;
    auto type = cast<RankedTensorType>(param.getType());
    MutableArrayRef<DimState> pd = dims(param);
    if (llvm::any_of(pd, [](const DimState &st) {
          return llvm::is_contained(st.axes, "dp");
        }))
      return;
    SmallVector<StringRef, 2> zeroAxes;
    for (StringRef a : dataAxes)
      if (llvm::none_of(pd, [&](const DimState &st) {
            return llvm::is_contained(st.axes, a);
          }))
        zeroAxes.push_back(a);
    if (zeroAxes.empty())
      return;
    int64_t dp = product(zeroAxes);
    for (int64_t d = 0; d < type.getRank(); ++d) {
      ArrayRef<StringRef> axes = pd[d].prio < kOpen
                                     ? ArrayRef<StringRef>(pd[d].axes)
                                     : ArrayRef<StringRef>();
      // Splitting a packed q/k/v dimension further would move its segments.
      if (!pd[d].segments.empty() && !axes.empty())
        continue;
      if ((type.getDimSize(d) / product(axes)) % dp != 0)
        continue;
      for (Value t : targets) {
        DimState &st = dims(t)[d];
        // The parameter's split holds as strongly as before; dp (and ep)
        // on top of it is ZeRO's, the weakest claim.
        st.prio = axes.empty() ? priorityOf("zero") : pd[d].prio;
        st.axes.assign(axes.begin(), axes.end());
        st.weakFrom = st.axes.size();
        st.weakPrio = priorityOf("zero");
        st.axes.append(zeroAxes.begin(), zeroAxes.end());
        st.segments.clear();
        st.closed = true;
        st.anchored = true;
      }
      return;
    }
  });
}

LogicalResult Propagator::propagate(func::FuncOp f) {
  // Each sweep can only strengthen a claim, and priorities are few, so this
  // ends; the bound is a guard against a rule that oscillates.
  // A visit reads and writes only the op's own values (and a return's
  // arguments), and writing what it wrote before changes nothing: an op
  // none of whose values changed since its last visit is skipped, which
  // gives the same layouts as visiting it (most of the second and later
  // sweeps, and of the backward half of the first, are such ops).
  dirty.assign(infos.size(), true);
  auto step = [&](unsigned i) -> LogicalResult {
    if (!dirty[i] && !isa<func::ReturnOp>(infos[i].op))
      return success();
    dirty[i] = false;
    return visit(infos[i]);
  };
  for (int iter = 0; iter < 64; ++iter) {
    changed = false;
    for (unsigned i = 0; i < infos.size(); ++i)
      if (failed(step(i)))
        return failure();
    for (unsigned i = infos.size(); i-- > 0;)
      if (failed(step(i)))
        return failure();
    if (!changed)
      return success();
  }
  return f.emitError() << "sharding propagation did not settle; this is a "
                          "bug in a sharding rule";
}

LogicalResult Propagator::materialize(func::FuncOp f) {
  MLIRContext *ctx = f.getContext();
  auto meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
  SmallVector<StringRef> sequential = sequentialAxes(f);
  ShardingCache cache;
  llvm::StringMap<ArrayAttr> axesCache;
  auto toAttr = [&](Value v) {
    SmallVector<Attribute> d, seg;
    bool anySeg = false;
    for (DimState &st : dims(v)) {
      bool split = st.prio < kOpen && !st.axes.empty();
      d.push_back(Builder(ctx).getStrArrayAttr(
          split ? ArrayRef<StringRef>(st.axes) : ArrayRef<StringRef>()));
      bool s = split && !st.segments.empty();
      anySeg |= s;
      seg.push_back(DenseI64ArrayAttr::get(ctx, s ? ArrayRef(st.segments)
                                                  : ArrayRef<int64_t>()));
    }
    if (!anySeg)
      seg.clear();
    return ShardingAttr::get(ctx, meshRef, ArrayAttr::get(ctx, d),
                             ArrayAttr::get(ctx, {}), ArrayAttr::get(ctx, seg));
  };
  // Each argument's layout, and how strongly each dimension holds it (so
  // that the forward function weighs its parameters as the step did).
  ArgAttrBatch argAttrs(f);
  for (BlockArgument arg : f.getArguments()) {
    if (!isa<RankedTensorType>(arg.getType()))
      continue;
    argAttrs.set(arg.getArgNumber(), kShardingAttr, toAttr(arg));
    SmallVector<std::string> origins;
    for (DimState &st : dims(arg)) {
      auto name = [](int prio) {
        return prio == 2 ? "zero" : prio == 1 ? "policy" : "user";
      };
      std::string o = name(st.prio);
      if (st.weakFrom < st.axes.size()) {
        o += std::string("/") + name(st.weakPrio);
        if (size_t n = st.axes.size() - st.weakFrom; n > 1)
          o += ":" + std::to_string(n);
      }
      origins.push_back(o);
    }
    if (llvm::any_of(origins, [](StringRef o) { return o != "user"; })) {
      SmallVector<StringRef> refs(origins.begin(), origins.end());
      argAttrs.set(arg.getArgNumber(), kShardingOriginAttr,
                   Builder(f.getContext()).getStrArrayAttr(refs));
    }
  }
  argAttrs.commit();

  // First every op's factors, so that each op can see how its results'
  // users will take them; then the results' layouts, in program order.
  for (const OpInfo &info : infos) {
    if (!info.rule)
      continue;
    FailureOr<SmallVector<Choice>> choice = resolve(info);
    if (failed(choice))
      return failure();
    FactorAxes axes;
    for (Choice &c : *choice)
      axes.push_back(
          {c.axes, c.axes.empty() ? SmallVector<int64_t>() : c.segments});
    writeFactorAxes(info.op, axes, &axesCache);
  }
  f.walk([&](Operation *op) {
    if (auto c = dyn_cast<ShardingConstraintOp>(op))
      return setSharding(op, c.getSharding());
    if (auto ar = dyn_cast<AllReduceOp>(op)) {
      ShardingAttr in = getSharding(ar.getInput());
      SmallVector<Attribute> rest;
      for (Attribute a : in.getPartial())
        if (!llvm::is_contained(ar.getAxes(), a))
          rest.push_back(a);
      return setSharding(op, ShardingAttr::get(ctx, in.getMesh(), in.getDims(),
                                               ArrayAttr::get(ctx, rest),
                                               in.getSegments()));
    }
    if (auto rs = dyn_cast<ReshardOp>(op))
      return setSharding(op, rs.getSharding());
    if (!isa<ShardingRuleOpInterface>(op))
      return;
    const Rule &rule = *infos[opIndex.lookup(op)].rule;
    FactorAxes axes = *readFactorAxes(op);
    // A sum of pending sums alike stays pending: one reduction after the
    // sum instead of one per summand, even where the result is wanted split.
    if (rule.linearity == Rule::Linearity::Joint) {
      ShardingAttr first = getSharding(op->getOperand(rule.linearOperands[0]));
      if (first && first.isPartial()) {
        FactorAxes tentative = axes;
        for (FactorSharding &fs : tentative) {
          size_t keep = 0;
          while (keep < fs.axes.size() &&
                 !llvm::is_contained(first.getPartialAxes(), fs.axes[keep]))
            ++keep;
          fs.axes.truncate(keep);
          if (fs.axes.empty())
            fs.segments.clear();
        }
        SmallVector<ShardingAttr> eff =
            effectiveOperandShardings(op, tentative, &rules);
        bool alike = llvm::all_of(rule.linearOperands, [&](unsigned i) {
          return eff[i] && eff[i].getPartial() == first.getPartial();
        });
        if (alike) {
          axes = tentative;
          writeFactorAxes(op, axes, &axesCache);
        }
      }
    }
    auto passed = acceptedPartials(op, rule, axes, &rules);
    llvm::SmallSetVector<StringRef, 4> through;
    for (auto &p : passed)
      through.insert(p.begin(), p.end());
    SmallVector<ShardingAttr> results;
    for (unsigned i = 0; i < op->getNumResults(); ++i)
      results.push_back(resultSharding(ctx, meshRef, rule, i, axes,
                                       through.getArrayRef(), sequential,
                                       &cache));
    setShardings(op, results);
  });
  return success();
}

/// `s` without the sequential axes: the forward function (generation) runs
/// all of a rank's samples at once.
static ShardingAttr withoutSequentialAxes(ShardingAttr s, MeshOp mesh) {
  if (!s || !mesh.getSequential())
    return s;
  Builder b(s.getContext());
  SmallVector<Attribute> dims;
  for (int64_t d = 0; d < s.getRank(); ++d) {
    SmallVector<StringRef> axes;
    for (StringRef a : s.getDimAxes(d))
      if (!mesh.isSequential(a))
        axes.push_back(a);
    dims.push_back(b.getStrArrayAttr(axes));
  }
  return ShardingAttr::get(s.getContext(), s.getMesh(), b.getArrayAttr(dims),
                           s.getPartial(), s.getSegments());
}

namespace {
struct PropagateShardingPass
    : public planc::impl::PropagateShardingBase<PropagateShardingPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    MeshOp mesh = getMesh(module);
    if (!mesh) {
      module.emitError() << "expected a plan.mesh op";
      return signalPassFailure();
    }
    int64_t zeroStage = 0;
    for (auto par : module.getOps<ParallelOp>())
      zeroStage = par.getZeroStage();
    SmallVector<func::FuncOp> funcs = distributedFunctions(module);
    func::FuncOp step = funcs.empty() || !funcs[0]->hasAttr(kTrainStepAttr)
                            ? func::FuncOp()
                            : funcs[0];
    for (func::FuncOp f : funcs) {
      Propagator p(mesh);
      p.prepare(f);
      for (BlockArgument arg : f.getArguments()) {
        unsigned i = arg.getArgNumber();
        auto kind = f.getArgAttrOfType<StringAttr>(i, kKindAttr);
        bool isParam =
            !kind || kind.getValue() == "param" || kind.getValue() == "state";
        ShardingAttr s = getSharding(arg);
        SmallVector<StringRef> origins = readOrigins(
            f.getArgAttr(i, kShardingOriginAttr), isParam ? "user" : "data");
        // The forward function holds parameters exactly as the step
        // decided, each dimension's claim as strong as it was there.
        bool exact = f != step && step && i < step.getNumArguments();
        if (exact) {
          s = withoutSequentialAxes(getSharding(step.getArgument(i)), mesh);
          origins =
              readOrigins(step.getArgAttr(i, kShardingOriginAttr), "user");
        }
        if (!s && !isParam)
          s = ShardingAttr::getReplicated(
              &getContext(), FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
              cast<RankedTensorType>(arg.getType()).getRank());
        if (!s)
          continue; // open: propagation decides
        if (failed(p.seed(arg, s, origins, isParam, arg.getLoc(), exact)))
          return signalPassFailure();
      }
      WalkResult seeded = f.walk([&](ShardingConstraintOp c) {
        // The forward function has no microbatches.
        if (f != step && step)
          c.setShardingAttr(withoutSequentialAxes(c.getSharding(), mesh));
        if (failed(p.seed(c.getResult(), c.getSharding(),
                          readOrigins(c->getAttr(kShardingOriginAttr), "user"),
                          /*anchored=*/false, c.getLoc())))
          return WalkResult::interrupt();
        return WalkResult::advance();
      });
      if (seeded.wasInterrupted() || failed(p.propagate(f)))
        return signalPassFailure();
      // ZeRO splits the optimizer state (and parameters) of the layouts
      // found so far; propagating again carries it to the updates.
      if (f == step && zeroStage > 0) {
        p.splitForZero(f, zeroStage);
        if (failed(p.propagate(f)))
          return signalPassFailure();
      }
      if (failed(p.materialize(f)))
        return signalPassFailure();
    }
  }
};
} // namespace
