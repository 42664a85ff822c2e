//===- Layers.cpp - Built-in layers, blocks and repeat --------------------===//
//
// Built-in layers expand into plan-dialect ops at the call; blocks are
// inlined at each call with their own scope, and `repeat(n) block(x)` inlines
// n instances, each with its own parameters (`block.i.name`) and the layer
// index that pipeline partitioning uses.
//===----------------------------------------------------------------------===//
#include "Sema.h"

#include "llvm/ADT/StringExtras.h"

#include <array>
#include <cmath>
#include <numeric>

using namespace mlir;
using namespace planc;
using namespace planc::plan;
using namespace planc::frontend;

static ArrayRef<int64_t> shapeOf(Value v) {
  return cast<RankedTensorType>(v.getType()).getShape();
}

/// A list element as an integer, if it is one that fits in int64_t.
static std::optional<int64_t> listInt(double x) {
  if (!(x >= -9.0e18 && x <= 9.0e18) || x != std::trunc(x))
    return std::nullopt;
  return int64_t(x);
}

/// Blocks inlined into one model, counting every call and every repeat
/// iteration; beyond this a plan is a runaway expansion, not a model
/// (repeat(1000000000), or blocks that each call the next twice).
static constexpr int64_t kMaxInstances = 10000;

static RankedTensorType f32Tensor(ArrayRef<int64_t> shape, MLIRContext *ctx) {
  return RankedTensorType::get(shape, Float32Type::get(ctx));
}

Sema::Args Sema::evalArgs(const std::vector<PlanParser::ArgContext *> &args,
                          bool &bad) {
  Args out;
  for (PlanParser::ArgContext *a : args) {
    // `act = gelu` names an activation, not a value.
    auto *name = dynamic_cast<PlanParser::NameExprContext *>(a->expr());
    Val v = a->key && a->key->getText() == "act" && name
                ? Val{name->getText(), loc(name)}
                : eval(a->expr());
    bad |= v.isError();
    if (a->key) {
      out.named.emplace_back(a->key->getText(), v);
      out.namedLocs.push_back(loc(a->key));
    } else {
      if (!out.named.empty()) {
        error(v.loc) << "positional arguments come before named ones";
        bad = true;
      }
      out.positional.push_back(v);
    }
  }
  return out;
}

std::string Sema::nextInstancePrefix(StringRef block) {
  std::string key = paramPrefix + block.str();
  return key + "." + std::to_string(instanceCount[key]++) + ".";
}

Val Sema::evalCall(PlanParser::CallExprContext *call) {
  Location l = loc(call);
  std::string fn = call->callee->getText();
  bool bad = false;
  Args args = evalArgs(call->arg(), bad);
  if (auto it = blocks.find(fn); it != blocks.end()) {
    if (bad)
      return Val::error(l);
    // Each instance of a block has its own parameters: block.<i>.name.
    std::string outer = paramPrefix;
    paramPrefix = nextInstancePrefix(fn);
    Val out = callBlock(it->second, args, l);
    paramPrefix = outer;
    return out;
  }
  // An unknown callee is reported even when its arguments had errors.
  if (bad && isBuiltin(fn))
    return Val::error(l);
  return callBuiltin(fn, args, l, loc(call->callee));
}

Val Sema::evalRepeat(PlanParser::RepeatExprContext *rep) {
  Location l = loc(rep);
  Val n = eval(rep->count);
  std::string fn = rep->callee->getText();
  auto it = blocks.find(fn);
  if (it == blocks.end()) {
    SmallVector<StringRef> known;
    for (auto &kv : blocks)
      known.push_back(kv.getKey());
    error(loc(rep->callee)) << "repeat(...) applies a block, and '" << fn
                            << "' is not one" << suggest(fn, known);
    return Val::error(l);
  }
  if (n.isError())
    return Val::error(l);
  if (!n.isInt() || n.getInt() < 1) {
    error(n.loc) << "the repeat count must be a positive integer";
    return Val::error(l);
  }
  if (n.getInt() > kMaxInstances) {
    error(n.loc) << "the repeat count is " << n.getInt() << "; at most "
                 << kMaxInstances << " layers are supported";
    return Val::error(l);
  }
  bool bad = false;
  Args args = evalArgs(rep->arg(), bad);
  if (bad)
    return Val::error(l);
  if (args.positional.empty() || !args.positional[0].isTensor()) {
    error(l) << "repeat(n) " << fn << "(x, ...) feeds each instance's result "
             << "to the next as its first argument, which must be a tensor";
    return Val::error(l);
  }
  std::string outerPrefix = paramPrefix;
  std::optional<int64_t> outerLayer = layer;
  int64_t count = n.getInt();
  if (maxRepeat > 0 && !outerLayer)
    count = std::min(count, maxRepeat);
  for (int64_t i = 0; i < count; ++i) {
    paramPrefix = outerPrefix;
    // `repeat(n) block(x) as "h"` names the instances h.0., h.1., ...
    paramPrefix =
        nextInstancePrefix(rep->prefix ? unquote(rep->prefix->getText()) : fn);
    // Nested repeats stay within the outer layer.
    if (!outerLayer)
      layer = numLayers++;
    Operation *before = body->empty() ? nullptr : &body->back();
    Val out = callBlock(it->second, args, l);
    // Ops of this instance record their layer for stage partitioning.
    for (Operation &op : llvm::make_range(
             before ? std::next(before->getIterator()) : body->begin(),
             body->end()))
      op.setAttr(kLayerAttr, b.getI64IntegerAttr(*layer));
    if (out.isError()) {
      paramPrefix = outerPrefix;
      layer = outerLayer;
      return out;
    }
    if (out.isTensor() &&
        out.getTensor().getType() != args.positional[0].getTensor().getType()) {
      error(l) << "repeat needs a block that returns what it takes: " << fn
               << " takes "
               << shapeStr(args.positional[0].getTensor().getType())
               << " but returns " << shapeStr(out.getTensor().getType());
      paramPrefix = outerPrefix;
      layer = outerLayer;
      return Val::error(l);
    }
    args.positional[0] = out;
  }
  paramPrefix = outerPrefix;
  layer = outerLayer;
  return args.positional[0];
}

Val Sema::callBlock(PlanParser::BlockDeclContext *block, Args &args,
                    Location callLoc) {
  std::string name = block->name->getText();
  auto params = block->blockParam();
  if (!args.named.empty()) {
    error(args.namedLocs[0]) << "block arguments are positional: " << name
                             << " takes " << params.size();
    return Val::error(callLoc);
  }
  if (args.positional.size() != params.size()) {
    auto d = error(callLoc) << "'" << name << "' takes " << params.size()
                            << " argument" << (params.size() == 1 ? "" : "s")
                            << ", got " << args.positional.size();
    d.attachNote(loc(block->name)) << "'" << name << "' is defined here";
    return Val::error(callLoc);
  }
  if (callers.size() >= 32) {
    error(callLoc) << "blocks call each other more than 32 deep; is '" << name
                   << "' calling itself?";
    return Val::error(callLoc);
  }
  if (++numInstances > kMaxInstances) {
    // Reported once; every later call fails quietly.
    if (numInstances == kMaxInstances + 1)
      error(callLoc) << "the model inlines more than " << kMaxInstances
                     << " block instances (calls and repeat iterations); "
                        "is a block calling another one many times?";
    return Val::error(callLoc);
  }
  // A block sees the top-level constants and its own names only.
  std::vector<llvm::StringMap<Binding>> saved(scopes.begin() + 1, scopes.end());
  scopes.resize(1);
  scopes.emplace_back();
  Location l = loc(block->name);
  scopes.back().try_emplace(
      "batch", Binding{train.batch ? Val{*train.batch, l} : Val::error(l), l});
  callers.push_back(callLoc);

  bool ok = true;
  for (auto [p, a] : llvm::zip(params, args.positional)) {
    Location pl = loc(p->name);
    if (p->kind) {
      std::string kind = p->kind->getText();
      bool fits = kind == "int" ? a.isInt() : kind == "float" && a.isNumber();
      if (kind != "int" && kind != "float") {
        error(loc(p->kind)) << "a block parameter is a tensor type such as "
                               "f32[batch, d], or int, or float";
        ok = false;
      } else if (!fits) {
        auto d = error(callLoc) << "argument '" << p->name->getText()
                                << "' of '" << name << "' must be " << kind;
        d.attachNote(pl) << "declared here";
        ok = false;
      }
    } else if (auto type = tensorType(p->tensorType(), /*isData=*/false)) {
      if (!a.isTensor() || a.getTensor().getType() != *type) {
        auto d = error(callLoc)
                 << "argument '" << p->name->getText() << "' of '" << name
                 << "' must be a tensor of shape " << shapeStr(*type)
                 << (a.isTensor() ? ", got " + shapeStr(a.getTensor().getType())
                                  : std::string(", got a number or string"));
        d.attachNote(pl) << "declared here";
        ok = false;
      }
    } else {
      ok = false;
    }
    if (scopes.back().count(p->name->getText())) {
      error(pl) << "parameter '" << p->name->getText() << "' is listed twice";
      ok = false;
    }
    scopes.back().try_emplace(p->name->getText(), Binding{a, pl, a.isTensor()});
  }
  std::optional<Val> ret;
  if (ok)
    runStmts(block->stmt(), /*inBlock=*/true, &ret);
  callers.pop_back();
  scopes.resize(1);
  scopes.insert(scopes.end(), saved.begin(), saved.end());
  if (!ok)
    return Val::error(callLoc);
  if (!ret) {
    error(loc(block->getStop()))
        << "block '" << name << "' must end with 'return <value>'";
    return Val::error(callLoc);
  }
  Val out = *ret;
  out.loc = callLoc;
  return out;
}

bool Sema::checkTpDivides(int64_t n, StringRef what, Location l) {
  if (par.tp <= 1 || n % par.tp == 0)
    return true;
  auto d = error(l) << "tp = " << par.tp << " does not divide " << what << " ("
                    << n << "): tensor parallelism gives each rank an "
                    << "equal share; choose a tp that divides " << n;
  if (par.tpLoc)
    d.attachNote(*par.tpLoc) << "tp is set here";
  return false;
}

bool Sema::checkCp(int64_t seq, int64_t kv, Location l) {
  if (par.cp <= 1)
    return true;
  auto note = [&](InFlightDiagnostic &d) {
    if (par.cpLoc)
      d.attachNote(*par.cpLoc) << "cp is set here";
  };
  if (seq % (2 * par.cp) != 0) {
    auto d = error(l) << "context parallelism cuts the sequence (" << seq
                      << " positions) into 2 * cp = " << 2 * par.cp
                      << " equal chunks (rank r holds chunks r and "
                      << 2 * par.cp - 1
                      << " - r, which balances causal attention); choose a "
                         "sequence length that "
                      << 2 * par.cp << " divides";
    note(d);
    return false;
  }
  int64_t local = kv / std::max<int64_t>(par.tp, 1);
  if (par.cpComm == "all_to_all" && local % par.cp != 0) {
    auto d = error(l) << "cp = " << par.cp << " does not divide the "
                      << (par.tp > 1 ? "key/value heads per tensor-parallel "
                                       "rank ("
                                     : "key/value heads (")
                      << local
                      << "): the all-to-all exchange (cp_comm = all_to_all) "
                         "gives each rank of the cp group whole key/value "
                         "heads; choose a cp that divides "
                      << local << " or cp_comm = all_gather";
    note(d);
    return false;
  }
  return true;
}

void Sema::seedSharding(Value param, int64_t dim, Location use) {
  // The split itself is made by plan-seed-sharding; the frontend checks here
  // what it can report at the layer's location.
  auto arg = dyn_cast<BlockArgument>(param);
  if (par.tensorPolicy != "megatron" || par.tp <= 1 || !arg ||
      arg.getOwner() != body)
    return;
  DictionaryAttr attrs = argAttrs[arg.getArgNumber()];
  if (attrs.getAs<StringAttr>(kKindAttr).getValue() != "param" ||
      attrs.get(kShardingAttr))
    return; // Explicit annotations win over the policy.
  auto type = cast<RankedTensorType>(param.getType());
  checkTpDivides(type.getDimSize(dim),
                 "dimension " + std::to_string(dim) + " of '" +
                     attrs.getAs<StringAttr>(kNameAttr).getValue().str() + "'",
                 use);
}

Value Sema::linear(Location l, Value x, Value w, Value bias, bool transposeW,
                   StringRef what) {
  auto xs = shapeOf(x), ws = shapeOf(w);
  if (ws.size() != 2 || xs.empty()) {
    error(l) << what << ": the weight must be 2-D and the input at least 1-D, "
             << "got " << shapeStr(w.getType()) << " and "
             << shapeStr(x.getType());
    return {};
  }
  int64_t k = transposeW ? ws[1] : ws[0], n = transposeW ? ws[0] : ws[1];
  if (xs.back() != k) {
    auto d = error(l) << what << ": the input has " << xs.back()
                      << " features (shape " << shapeStr(x.getType())
                      << ") but the weight expects " << k << " (shape "
                      << shapeStr(w.getType())
                      << (transposeW ? ", used transposed)" : ")");
    d.attachNote(defLoc(x))
        << "the input, " << shapeStr(x.getType()) << ", comes from here";
    d.attachNote(defLoc(w))
        << "the weight, " << shapeStr(w.getType()) << ", is defined here";
    return {};
  }
  SmallVector<int64_t> outShape(xs);
  outShape.back() = n;
  auto type = f32Tensor(outShape, ctx);
  Value y;
  if (xs.size() == 1) {
    error(l) << what << ": the input must have a batch dimension";
    return {};
  }
  SmallVector<NamedAttribute> attrs;
  if (transposeW)
    attrs.push_back(b.getNamedAttr("transpose_rhs", b.getUnitAttr()));
  y = MatmulOp::create(b, l, TypeRange(type), ValueRange{x, w}, attrs)
          ->getResult(0);
  if (!bias)
    return y;
  auto bs = shapeOf(bias);
  if (bs.size() != 1 || bs[0] != n) {
    auto d = error(l) << what << ": the bias must have shape [" << n
                      << "] (one value per output feature), got "
                      << shapeStr(bias.getType());
    d.attachNote(defLoc(bias)) << "the bias is defined here";
    return {};
  }
  return BiasAddOp::create(b, l, type, y, bias);
}

static const char *const kBuiltins[] = {
    "linear",        "matmul",        "transpose",  "reshape",    "embedding",
    "pos_embedding", "layernorm",     "rmsnorm",    "attention",  "mlp",
    "relu",          "gelu",          "silu",       "softmax",    "add",
    "mse",           "cross_entropy", "conv2d",     "max_pool2d", "avg_pool2d",
    "flatten",       "batch_norm",    "group_norm", "dropout",    "moe"};

FailureOr<std::pair<Value, Value>>
Sema::runningStats(Value gamma, Location gammaLoc, Location use) {
  // The running statistics are named after the scale parameter: PyTorch's
  // names when it is exported as "<layer>.weight", else "<scale>.running_*".
  auto arg = dyn_cast<BlockArgument>(gamma);
  DictionaryAttr attrs =
      arg && arg.getOwner() == body ? argAttrs[arg.getArgNumber()] : nullptr;
  if (!attrs || attrs.getAs<StringAttr>(kKindAttr).getValue() != "param") {
    auto d = error(gammaLoc)
             << "the scale of 'batch_norm' must be a parameter: its running "
             << "statistics are named after it";
    d.attachNote(defLoc(gamma)) << "the scale is computed here";
    return failure();
  }
  StringRef scale = attrs.getAs<StringAttr>(kNameAttr).getValue();
  std::string prefix = scale.ends_with(".weight")
                           ? scale.drop_back(strlen("weight")).str()
                           : scale.str() + ".";
  SmallVector<Value, 2> stats;
  for (auto [suffix, init] :
       {std::pair<StringRef, StringRef>{"running_mean", "zeros"},
        {"running_var", "ones"}}) {
    std::string name = prefix + suffix.str();
    Location clash = use;
    bool taken = false;
    if (auto it = paramNames.find(name); it != paramNames.end()) {
      clash = it->second;
      taken = true;
    } else if (auto it = bufferNames.find(name); it != bufferNames.end()) {
      clash = it->second;
      taken = true;
    }
    if (taken) {
      auto d = error(use) << "'batch_norm': its running statistic '" << name
                          << "' (named after the scale '" << scale
                          << "') is taken; give each batch_norm its own scale "
                          << "parameter";
      d.attachNote(clash) << "'" << name << "' is already used here";
      return failure();
    }
    bufferNames.try_emplace(name, use);
    stats.push_back(
        declareArg(cast<RankedTensorType>(gamma.getType()), use, "state", name,
                   {b.getNamedAttr(kInitAttr, InitAttr::get(ctx, init, 0, 0)),
                    b.getNamedAttr(kBufferAttr, b.getUnitAttr())}));
  }
  return std::make_pair(stats[0], stats[1]);
}

FailureOr<Value> Sema::expertBias(Value router, int64_t experts, Location use) {
  // Named after the router parameter, as DeepSeek-V3's checkpoints name it:
  // "<layer>.e_score_correction_bias" next to "<layer>.weight", else
  // "<router>.expert_bias".
  auto arg = dyn_cast<BlockArgument>(router);
  DictionaryAttr attrs =
      arg && arg.getOwner() == body ? argAttrs[arg.getArgNumber()] : nullptr;
  if (!attrs || attrs.getAs<StringAttr>(kKindAttr).getValue() != "param") {
    auto d = error(use) << "'moe' with bias_update needs the router to be a "
                        << "parameter: its experts' bias is named after it";
    d.attachNote(defLoc(router)) << "the router is computed here";
    return failure();
  }
  StringRef r = attrs.getAs<StringAttr>(kNameAttr).getValue();
  std::string name =
      r.ends_with(".weight")
          ? r.drop_back(strlen("weight")).str() + "e_score_correction_bias"
          : r.str() + ".expert_bias";
  for (auto *names : {&paramNames, &bufferNames})
    if (auto it = names->find(name); it != names->end()) {
      auto d = error(use) << "'moe': its experts' bias '" << name
                          << "' (named after the router '" << r
                          << "') is taken; give each moe layer its own router";
      d.attachNote(it->second) << "'" << name << "' is already used here";
      return failure();
    }
  bufferNames.try_emplace(name, use);
  return declareArg(
      RankedTensorType::get({experts}, b.getF32Type()), use, "state", name,
      {b.getNamedAttr(kInitAttr, InitAttr::get(ctx, "zeros", 0, 0)),
       b.getNamedAttr(kBufferAttr, b.getUnitAttr())});
}

bool Sema::isBuiltin(StringRef fn) { return llvm::is_contained(kBuiltins, fn); }

Val Sema::callBuiltin(StringRef fn, Args &args, Location l,
                      Location calleeLoc) {
  Val out = Val::error(l);
  if (!isBuiltin(fn)) {
    SmallVector<StringRef> known(std::begin(kBuiltins), std::end(kBuiltins));
    for (auto &kv : blocks)
      known.push_back(kv.getKey());
    error(calleeLoc) << "unknown function '" << fn << "'" << suggest(fn, known)
                     << "; see docs/language.md for the built-in layers";
    return out;
  }
  auto &pos = args.positional;
  // Named arguments this layer accepts, consumed as they are read.
  llvm::StringMap<Val> named;
  for (auto [kv, nl] : llvm::zip(args.named, args.namedLocs))
    if (!named.try_emplace(kv.first, kv.second).second) {
      error(nl) << "argument '" << kv.first << "' is given twice";
      return out;
    }
  auto arity = [&](size_t lo, size_t hi, StringRef usage) {
    if (pos.size() < lo || pos.size() > hi) {
      error(l) << "'" << fn << "' takes " << usage << ", got " << pos.size()
               << " positional argument" << (pos.size() == 1 ? "" : "s");
      return false;
    }
    return true;
  };
  auto tensorArg = [&](size_t i) -> Value {
    if (!pos[i].isTensor()) {
      error(pos[i].loc) << "argument " << i + 1 << " of '" << fn
                        << "' must be a tensor, not a number or string";
      return {};
    }
    return pos[i].getTensor();
  };
  // A named tensor argument; `required` says whether it may be missing.
  bool badNamed = false;
  auto namedTensor = [&](StringRef key, bool required) -> Value {
    auto it = named.find(key);
    if (it == named.end()) {
      if (required) {
        error(l) << "'" << fn << "' needs '" << key << " = <param>'";
        badNamed = true;
      }
      return {};
    }
    Val v = it->second;
    named.erase(it);
    if (!v.isTensor()) {
      error(v.loc) << "'" << key << "' must be a tensor";
      badNamed = true;
      return {};
    }
    return v.getTensor();
  };
  auto namedNumber = [&](StringRef key, double dflt) -> double {
    auto it = named.find(key);
    if (it == named.end())
      return dflt;
    Val v = it->second;
    named.erase(it);
    if (!v.isNumber()) {
      error(v.loc) << "'" << key << "' must be a number";
      badNamed = true;
      return dflt;
    }
    return v.getNumber();
  };
  auto namedName = [&](StringRef key, StringRef dflt) -> std::string {
    auto it = named.find(key);
    if (it == named.end())
      return dflt.str();
    Val v = it->second;
    named.erase(it);
    if (v.isString())
      return v.getString();
    error(v.loc) << "'" << key << "' must be a name, e.g. " << key << " = "
                 << dflt;
    badNamed = true;
    return dflt.str();
  };
  auto leftovers = [&]() {
    for (auto &kv : named) {
      error(kv.second.loc) << "'" << fn << "' has no argument '" << kv.getKey()
                           << "'";
      badNamed = true;
    }
    return !badNamed;
  };
  auto generic = [&](auto opTag, Type type, ValueRange operands,
                     ArrayRef<NamedAttribute> attrs = {}) {
    return decltype(opTag)::create(b, l, TypeRange(type), operands, attrs)
        ->getResult(0);
  };

  if (fn == "linear") {
    if (!arity(2, 3, "an input, a weight and an optional bias"))
      return out;
    bool transposed = namedNumber("transposed", 0) != 0;
    if (!leftovers())
      return out;
    Value x = tensorArg(0), w = tensorArg(1);
    Value bias = pos.size() == 3 ? tensorArg(2) : Value();
    if (!x || !w || (pos.size() == 3 && !bias))
      return out;
    if (Value y = linear(l, x, w, bias, transposed, "'linear'"))
      out.v = y;
    return out;
  }
  if (fn == "matmul") {
    if (!arity(2, 2, "two tensors") || !leftovers())
      return out;
    Value a = tensorArg(0), c = tensorArg(1);
    if (!a || !c)
      return out;
    auto as = shapeOf(a), cs = shapeOf(c);
    if (as.size() < 2 || cs.size() != 2 || as.back() != cs[0]) {
      auto d = error(l) << "'matmul' multiplies [..., m, k] by [k, n], got "
                        << shapeStr(a.getType()) << " and "
                        << shapeStr(c.getType());
      d.attachNote(defLoc(a)) << "the left operand comes from here";
      d.attachNote(defLoc(c)) << "the right operand comes from here";
      return out;
    }
    SmallVector<int64_t> shape(as);
    shape.back() = cs[1];
    out.v = generic(MatmulOp(), f32Tensor(shape, ctx), {a, c});
    return out;
  }
  if (fn == "transpose") {
    if (!arity(1, 2, "a tensor and an optional permutation") || !leftovers())
      return out;
    Value x = tensorArg(0);
    if (!x)
      return out;
    auto xs = shapeOf(x);
    SmallVector<int64_t> perm;
    if (pos.size() == 2) {
      if (!pos[1].isList() || !pos[1].getList().allInts) {
        error(pos[1].loc) << "the permutation is a list of dimensions, e.g. "
                             "[0, 2, 1]";
        return out;
      }
      for (double d : pos[1].getList().values)
        perm.push_back(listInt(d).value_or(-1)); // -1: rejected below
    } else {
      if (xs.size() < 2) {
        error(l) << "'transpose' needs at least 2 dimensions";
        return out;
      }
      for (int64_t i = 0; i < (int64_t)xs.size(); ++i)
        perm.push_back(i);
      std::swap(perm[xs.size() - 1], perm[xs.size() - 2]);
    }
    SmallVector<int64_t> sorted(perm);
    llvm::sort(sorted);
    for (int64_t i = 0; i < (int64_t)sorted.size(); ++i)
      if (sorted.size() != xs.size() || sorted[i] != i) {
        error(pos.size() == 2 ? pos[1].loc : l)
            << "the permutation must list each of the " << xs.size()
            << " dimensions once";
        return out;
      }
    SmallVector<int64_t> shape;
    for (int64_t p : perm)
      shape.push_back(xs[p]);
    out.v =
        generic(TransposeOp(), f32Tensor(shape, ctx), {x},
                {b.getNamedAttr("permutation", b.getDenseI64ArrayAttr(perm))});
    return out;
  }
  if (fn == "reshape") {
    if (!arity(2, 2, "a tensor and a shape list") || !leftovers())
      return out;
    Value x = tensorArg(0);
    if (!x)
      return out;
    if (!pos[1].isList() || !pos[1].getList().allInts) {
      error(pos[1].loc) << "the new shape is a list of sizes, e.g. [batch, "
                           "seq, heads, 64]";
      return out;
    }
    SmallVector<int64_t> shape;
    int64_t n = 1;
    for (double d : pos[1].getList().values) {
      std::optional<int64_t> size = listInt(d);
      if (!size || *size < 1) {
        error(pos[1].loc) << "sizes must be positive integers";
        return out;
      }
      shape.push_back(*size);
      // The product is compared with an element count below 2^48.
      if (__builtin_mul_overflow(n, *size, &n))
        n = INT64_MAX;
    }
    auto type = cast<RankedTensorType>(x.getType());
    if (n != type.getNumElements()) {
      error(l) << "'reshape' keeps the number of elements: "
               << shapeStr(x.getType()) << " has " << type.getNumElements()
               << ", the new shape " << n;
      return out;
    }
    out.v = generic(ReshapeOp(), f32Tensor(shape, ctx), {x});
    return out;
  }
  if (fn == "embedding") {
    if (!arity(2, 2, "token ids and a table") || !leftovers())
      return out;
    Value ids = tensorArg(0), table = tensorArg(1);
    if (!ids || !table)
      return out;
    auto idType = cast<RankedTensorType>(ids.getType());
    auto ts = shapeOf(table);
    if (!idType.getElementType().isInteger(32) || ts.size() != 2) {
      error(l) << "'embedding' looks up i32 token ids in a [vocab, dim] "
                  "table, got "
               << shapeStr(ids.getType()) << " and "
               << shapeStr(table.getType());
      return out;
    }
    int64_t vocab = ts[0];
    // tp must divide the rows (vocab-parallel); with ZeRO, dp dividing them
    // too lets the optimizer state split by rows, in contiguous shards.
    bool tpSplits = par.tp > 1 && vocab % par.tp != 0;
    int64_t zeroDp = par.zeroStage >= 1 ? par.dp : 1;
    bool zeroSplits = zeroDp > 1 && vocab % (par.tp * zeroDp) != 0;
    int64_t multiple = 128 * par.tp; // Megatron-LM's
    // On the GPU a tied head's GEMMs read and write rows of `vocab` logits:
    // cuBLASLt's tensor-core kernels need them 16-byte aligned, and GPT-2's
    // 50257 columns send all three GEMMs of the head to slow kernels
    // (bench/gpu: about a quarter of its bf16 step). pad_vocab is on by
    // default there, and pads for that alignment too.
    bool cuda = target == "cuda";
    bool padVocab = par.padVocabSet ? par.padVocab : cuda;
    bool alignSplits = cuda && vocab % multiple != 0;
    auto arg = dyn_cast<BlockArgument>(table);
    bool canPad =
        padVocab && arg && arg.getOwner() == body &&
        llvm::all_of(arg.getUsers(), [](Operation *) { return false; });
    alignSplits = alignSplits && canPad;
    auto roundUp = [&](int64_t m) { return (vocab + m - 1) / m * m; };
    // Rows for ZeRO only with pad_vocab, and while they cost fewer padded
    // rows than Megatron's rounding adds at most: the head's GEMM computes
    // every padded row each step, where a column split copies its shard.
    int64_t both = std::lcm(multiple, par.tp * zeroDp);
    zeroSplits = zeroSplits && canPad && roundUp(both) - vocab < multiple;
    if (zeroSplits)
      multiple = both;
    if (tpSplits || zeroSplits || alignSplits) {
      int64_t padded = roundUp(multiple);
      if (canPad) {
        // Pad the table as Megatron does; the extra rows are never looked
        // up, masked out of a tied head's loss, and not exported.
        arg.setType(f32Tensor({padded, ts[1]}, ctx));
        paddedVocab[padded] = vocab;
        NamedAttrList attrs(argAttrs[arg.getArgNumber()]);
        attrs.set(kExportRowsAttr, b.getI64IntegerAttr(vocab));
        argAttrs[arg.getArgNumber()] = attrs.getDictionary(ctx);
        auto r = mlir::emitRemark(l);
        r << "the vocabulary is padded from " << vocab << " to " << padded
          << " rows (a multiple of ";
        if (multiple == 128 * par.tp)
          r << "128 * tp";
        else
          r << multiple;
        r << ") so that ";
        if (tpSplits)
          r << "tp = " << par.tp << " divides it";
        if (zeroSplits)
          r << (tpSplits ? " and " : "") << "ZeRO's split over dp = " << par.dp
            << " shards it by rows";
        if (!tpSplits && !zeroSplits)
          r << "the LM head's GEMMs run on aligned rows (cuda target; "
               "'pad_vocab = false' keeps the table as written)";
        vocab = padded;
      } else {
        auto d = error(l) << "the vocabulary (" << vocab
                          << " rows) is not divisible by tp = " << par.tp
                          << "; pad it to " << padded
                          << " (a multiple of 128 * tp, as Megatron-LM does) "
                          << "or set 'pad_vocab = true' in the parallel "
                             "section to let planc pad it";
        if (padVocab)
          d.attachNote(defLoc(table))
              << "planc pads only a table that nothing used before it";
        if (par.tpLoc)
          d.attachNote(*par.tpLoc) << "tp is set here";
        return out;
      }
    }
    seedSharding(table, 0, l);
    SmallVector<int64_t> shape(idType.getShape());
    shape.push_back(ts[1]);
    out.v = generic(EmbeddingOp(), f32Tensor(shape, ctx), {ids, table});
    return out;
  }
  if (fn == "pos_embedding") {
    if (!arity(2, 2, "an input [batch, seq, dim] and a table [max_seq, dim]") ||
        !leftovers())
      return out;
    Value x = tensorArg(0), table = tensorArg(1);
    if (!x || !table)
      return out;
    auto xs = shapeOf(x), ts = shapeOf(table);
    if (xs.size() != 3 || ts.size() != 2 || ts[1] != xs[2] || ts[0] < xs[1]) {
      error(l) << "'pos_embedding' adds rows 0..seq-1 of a [max_seq, dim] "
                  "table to a [batch, seq, dim] input, got "
               << shapeStr(x.getType()) << " and " << shapeStr(table.getType());
      return out;
    }
    out.v = generic(PosEmbeddingOp(), x.getType(), {x, table});
    return out;
  }
  if (fn == "layernorm" || fn == "rmsnorm") {
    bool ln = fn == "layernorm";
    if (!arity(ln ? 3 : 2, ln ? 3 : 2,
               ln ? "an input, a scale and a shift" : "an input and a scale"))
      return out;
    double eps = namedNumber("eps", ln ? 1e-5 : 1e-6);
    if (!leftovers())
      return out;
    SmallVector<Value> ops;
    for (size_t i = 0; i < pos.size(); ++i)
      if (Value v = tensorArg(i))
        ops.push_back(v);
      else
        return out;
    if (shapeOf(ops[0]).empty()) {
      error(pos[0].loc) << "'" << fn << "' normalizes the last dimension, but "
                        << "its input is a scalar";
      return out;
    }
    int64_t d = shapeOf(ops[0]).back();
    for (size_t i = 1; i < ops.size(); ++i)
      if (shapeOf(ops[i]).size() != 1 || shapeOf(ops[i])[0] != d) {
        auto diag = error(pos[i].loc)
                    << "'" << fn << "' normalizes the last dimension (" << d
                    << "), so its " << (i == 1 ? "scale" : "shift")
                    << " must have shape [" << d << "], got "
                    << shapeStr(ops[i].getType());
        diag.attachNote(defLoc(ops[i])) << "defined here";
        return out;
      }
    if (!(eps > 0)) {
      error(l) << "eps must be > 0";
      return out;
    }
    auto epsAttr = b.getNamedAttr("eps", b.getF32FloatAttr(float(eps)));
    out.v = ln ? generic(LayerNormOp(), ops[0].getType(), ops, {epsAttr})
               : generic(RmsNormOp(), ops[0].getType(), ops, {epsAttr});
    return out;
  }
  if (fn == "attention") {
    if (!arity(1, 1, "an input [batch, seq, dim] and named weights"))
      return out;
    Value x = tensorArg(0);
    Value wqkv = namedTensor("qkv", true),
          bqkv = namedTensor("qkv_bias", false);
    Value wout = namedTensor("out", true),
          bout = namedTensor("out_bias", false);
    double heads = namedNumber("heads", 0);
    double kvHeads = namedNumber("kv_heads", heads);
    // NaN: no rotary embeddings (any given value is checked below).
    double ropeTheta =
        namedNumber("rope_theta", std::numeric_limits<double>::quiet_NaN());
    bool rope = !std::isnan(ropeTheta);
    double dropout = namedNumber("dropout", 0.0);
    if (!leftovers() || !x || !wqkv || !wout)
      return out;
    if (!(dropout >= 0 && dropout < 1)) {
      error(l) << "'attention': dropout is the probability of zeroing an "
                  "attention probability, in [0, 1), got "
               << dropout;
      return out;
    }
    // Head counts are compared with a weight's width, so 2^20 is plenty and
    // keeps (heads + 2 * kv_heads) * head_dim far from overflow.
    auto isCount = [](double x) {
      return x >= 1 && x <= double(1 << 20) && x == std::trunc(x);
    };
    if (!isCount(heads) || !isCount(kvHeads)) {
      error(l) << "'attention' needs 'heads = <count>' (and optionally "
                  "'kv_heads = <count>' for grouped-query attention)";
      return out;
    }
    int64_t H = int64_t(heads), KV = int64_t(kvHeads);
    auto xs = shapeOf(x), ws = shapeOf(wqkv);
    if (xs.size() != 3) {
      error(l) << "'attention' takes a [batch, seq, dim] input, got "
               << shapeStr(x.getType());
      return out;
    }
    if (H % KV != 0) {
      error(l) << "heads (" << H << ") must be a multiple of kv_heads (" << KV
               << "): each key/value head serves a group of query heads";
      return out;
    }
    if (ws.size() != 2 || ws[1] % (H + 2 * KV) != 0) {
      auto d = error(l) << "'attention': qkv projects to (heads + 2 * "
                        << "kv_heads) * head_dim = (" << H << " + 2 * " << KV
                        << ") * head_dim columns, but its shape is "
                        << shapeStr(wqkv.getType());
      d.attachNote(defLoc(wqkv)) << "qkv is defined here";
      return out;
    }
    int64_t headDim = ws[1] / (H + 2 * KV);
    if (rope && !(ropeTheta > 0 && std::isfinite(ropeTheta))) {
      error(l) << "'rope_theta' must be a number > 0 (the rotary base, e.g. "
                  "10000.0 as in Llama 2 or 500000.0 as in Llama 3), got "
               << ropeTheta;
      return out;
    }
    if (rope && headDim % 2 != 0) {
      error(l) << "rotary position embeddings pair the two halves of each "
                  "head, so the head dimension must be even; it is "
               << headDim << " (qkv " << shapeStr(wqkv.getType()) << ", " << H
               << " + 2 * " << KV << " heads)";
      return out;
    }
    bool ok = checkTpDivides(H, "the attention heads", l) &&
              checkTpDivides(KV, "the key/value heads", l) &&
              checkCp(xs[1], KV, l);
    if (!ok)
      return out;
    seedSharding(wqkv, 1, l);
    if (bqkv)
      seedSharding(bqkv, 0, l);
    seedSharding(wout, 0, l);
    Value qkv = linear(l, x, wqkv, bqkv, false, "'attention' (qkv)");
    if (!qkv)
      return out;
    if (rope) // positions rotate the query and key heads
      qkv = generic(RopeOp(), qkv.getType(), {qkv},
                    {b.getNamedAttr("num_heads", b.getI64IntegerAttr(H)),
                     b.getNamedAttr("num_kv_heads", b.getI64IntegerAttr(KV)),
                     b.getNamedAttr("theta", b.getF64FloatAttr(ropeTheta))});
    SmallVector<NamedAttribute> attrs{
        b.getNamedAttr("num_heads", b.getI64IntegerAttr(H)),
        b.getNamedAttr("num_kv_heads", b.getI64IntegerAttr(KV))};
    if (dropout > 0) { // a mask of its own, as each dropout() call
      attrs.push_back(b.getNamedAttr("dropout", b.getF32FloatAttr(dropout)));
      attrs.push_back(
          b.getNamedAttr("dropout_uid", b.getI64IntegerAttr(dropoutCount++)));
    }
    Value a =
        generic(AttentionOp(), f32Tensor({xs[0], xs[1], H * headDim}, ctx),
                {qkv}, attrs);
    if (Value y = linear(l, a, wout, bout, false, "'attention' (out)"))
      out.v = y;
    return out;
  }
  if (fn == "mlp") {
    if (!arity(1, 1, "an input and named weights"))
      return out;
    Value x = tensorArg(0);
    std::string act = namedName("act", "gelu");
    if (!x)
      return out;
    if (act == "swiglu") {
      Value gate = namedTensor("gate", true), up = namedTensor("up", true),
            down = namedTensor("down", true);
      if (!leftovers() || !gate || !up || !down)
        return out;
      if (gate.getType() != up.getType()) {
        error(l) << "'mlp' with swiglu needs gate and up of the same shape, "
                 << "got " << shapeStr(gate.getType()) << " and "
                 << shapeStr(up.getType());
        return out;
      }
      if (shapeOf(gate).size() == 2 &&
          !checkTpDivides(shapeOf(gate)[1], "the MLP's hidden size", l))
        return out;
      seedSharding(gate, 1, l);
      seedSharding(up, 1, l);
      seedSharding(down, 0, l);
      Value g = linear(l, x, gate, {}, false, "'mlp' (gate)");
      Value u = g ? linear(l, x, up, {}, false, "'mlp' (up)") : Value();
      if (!u)
        return out;
      Value s = generic(SiluOp(), g.getType(), {g});
      Value h = generic(MulOp(), g.getType(), {s, u});
      if (Value y = linear(l, h, down, {}, false, "'mlp' (down)"))
        out.v = y;
      return out;
    }
    if (act != "gelu" && act != "gelu_exact" && act != "relu" &&
        act != "silu") {
      error(l) << "'mlp' activation must be gelu, gelu_exact, relu, silu or "
                  "swiglu, got '"
               << act << "'";
      return out;
    }
    Value fc = namedTensor("fc", true), fcBias = namedTensor("fc_bias", false);
    Value proj = namedTensor("proj", true),
          projBias = namedTensor("proj_bias", false);
    if (!leftovers() || !fc || !proj)
      return out;
    if (shapeOf(fc).size() == 2 &&
        !checkTpDivides(shapeOf(fc)[1], "the MLP's hidden size", l))
      return out;
    seedSharding(fc, 1, l);
    if (fcBias)
      seedSharding(fcBias, 0, l);
    seedSharding(proj, 0, l);
    Value h = linear(l, x, fc, fcBias, false, "'mlp' (fc)");
    if (!h)
      return out;
    h = act == "gelu" || act == "gelu_exact"
            ? Value(GeluOp::create(b, l, h.getType(), h,
                                   act == "gelu_exact" ? b.getUnitAttr()
                                                       : UnitAttr()))
        : act == "relu" ? Value(ReluOp::create(b, l, h.getType(), h))
                        : generic(SiluOp(), h.getType(), {h});
    if (Value y = linear(l, h, proj, projBias, false, "'mlp' (proj)"))
      out.v = y;
    return out;
  }
  if (fn == "moe") {
    if (!arity(1, 1, "an input [..., dim] and named weights"))
      return out;
    Value x = tensorArg(0);
    std::string act = namedName("act", "swiglu");
    // NaN: not given (a given value is checked below).
    const double none = std::numeric_limits<double>::quiet_NaN();
    double auxLoss = namedNumber("aux_loss", none),
           capacityFactor = namedNumber("capacity_factor", none),
           biasRate = namedNumber("bias_update", none);
    if (act != "swiglu" && act != "gelu") {
      error(l) << "'moe' activation must be swiglu or gelu, got '" << act
               << "'";
      return out;
    }
    bool gated = act == "swiglu";
    Value router = namedTensor("router", true);
    Value gate = gated ? namedTensor("gate", true) : Value();
    Value up = namedTensor("up", true), down = namedTensor("down", true);
    Value sGate = gated ? namedTensor("shared_gate", false) : Value();
    Value sUp = namedTensor("shared_up", false),
          sDown = namedTensor("shared_down", false);
    double topK = namedNumber("top_k", 0);
    if (!leftovers() || !x || !router || (gated && !gate) || !up || !down)
      return out;
    auto xs = shapeOf(x), rs = shapeOf(router), us = shapeOf(up),
         ds = shapeOf(down);
    if (xs.size() < 2) {
      error(l) << "'moe' takes an input with a batch dimension [..., dim], got "
               << shapeStr(x.getType());
      return out;
    }
    int64_t d = xs.back();
    if (rs.size() != 2 || rs[0] != d) {
      auto diag = error(l) << "'moe': the router must be [" << d
                           << ", experts] for inputs of width " << d << ", got "
                           << shapeStr(router.getType());
      diag.attachNote(defLoc(router)) << "the router is defined here";
      return out;
    }
    int64_t experts = rs[1];
    auto expertShape = [&](Value w, StringRef name, int64_t rows) {
      auto ws = shapeOf(w);
      if (ws.size() == 3 && ws[0] == experts && ws[1] == rows)
        return true;
      auto diag = error(l) << "'moe': '" << name << "' must be [" << experts
                           << " experts, " << rows << ", ...] (one matrix per "
                           << "expert of the router's " << experts << "), got "
                           << shapeStr(w.getType());
      diag.attachNote(defLoc(w)) << "'" << name << "' is defined here";
      return false;
    };
    if (!expertShape(up, "up", d) || (gate && !expertShape(gate, "gate", d)))
      return out;
    if (gate && gate.getType() != up.getType()) {
      error(l) << "'moe' with swiglu needs gate and up of the same shape, got "
               << shapeStr(gate.getType()) << " and " << shapeStr(up.getType());
      return out;
    }
    if (!expertShape(down, "down", us[2]))
      return out;
    if (!(topK >= 1 && topK <= double(experts) && topK == std::trunc(topK))) {
      error(l) << "'moe' needs 'top_k = <count>' between 1 and the number of "
                  "experts ("
               << experts << "), got " << topK;
      return out;
    }
    if (topK > 32) {
      error(l) << "'moe': top_k is at most 32, got " << topK;
      return out;
    }
    int64_t k = int64_t(topK);
    // The balancing terms and capacities are per sequence: [..., seq, d].
    auto perSequence = [&](StringRef key) {
      if (xs.size() >= 3)
        return true;
      error(l) << "'moe' with '" << key << "' needs an input [batch, seq, "
               << "dim]: it is taken per sequence; got "
               << shapeStr(x.getType());
      return false;
    };
    SmallVector<NamedAttribute> routing{
        b.getNamedAttr("top_k", b.getI64IntegerAttr(k))};
    if (!std::isnan(auxLoss)) {
      if (!(auxLoss >= 0 && std::isfinite(auxLoss))) {
        error(l) << "'aux_loss' must be a coefficient >= 0 (e.g. 0.01), got "
                 << auxLoss;
        return out;
      }
      if (!perSequence("aux_loss"))
        return out;
      routing.push_back(b.getNamedAttr("aux_loss", b.getF64FloatAttr(auxLoss)));
    }
    if (!std::isnan(capacityFactor)) {
      if (!(capacityFactor > 0 && std::isfinite(capacityFactor))) {
        error(l) << "'capacity_factor' must be > 0 (e.g. 1.25), got "
                 << capacityFactor;
        return out;
      }
      if (!perSequence("capacity_factor"))
        return out;
      if (par.cp > 1) {
        // The capacity walks a sequence in position order; a sequence split
        // in context parallelism's balanced chunks would be walked in
        // another order (other tokens dropped than on one rank).
        auto d = error(l) << "'moe': 'capacity_factor' with context "
                             "parallelism (cp = "
                          << par.cp
                          << ") is not implemented yet; drop the capacity "
                             "(dropless routing) or cp";
        if (par.cpLoc)
          d.attachNote(*par.cpLoc) << "cp is set here";
        return out;
      }
      // Each expert takes at most this many of a sequence's tokens.
      int64_t seqLen = xs[xs.size() - 2];
      int64_t cap = int64_t(
          std::ceil(capacityFactor * double(seqLen * k) / double(experts)));
      routing.push_back(b.getNamedAttr(
          "capacity",
          b.getI64IntegerAttr(std::max<int64_t>(1, std::min(cap, seqLen)))));
    }
    SmallVector<Value> topkOperands;
    if (!std::isnan(biasRate)) {
      if (!(biasRate > 0 && std::isfinite(biasRate))) {
        error(l) << "'bias_update' must be a rate > 0 (e.g. 0.001), got "
                 << biasRate;
        return out;
      }
      FailureOr<Value> bias = expertBias(router, experts, l);
      if (failed(bias))
        return out;
      topkOperands.push_back(*bias);
      routing.push_back(
          b.getNamedAttr("bias_update", b.getF32FloatAttr(float(biasRate))));
    }
    Value logits = linear(l, x, router, {}, false, "'moe' (router)");
    if (!logits)
      return out;
    topkOperands.insert(topkOperands.begin(), logits);
    SmallVector<int64_t> kShape(xs.drop_back());
    kShape.push_back(k);
    auto idxType = RankedTensorType::get(kShape, IntegerType::get(ctx, 32));
    Value idx = generic(MoeTopkOp(), idxType, topkOperands, routing);
    Value gates = generic(MoeGatesOp(), f32Tensor(kShape, ctx), {logits, idx});
    SmallVector<int64_t> yShape(xs.drop_back());
    yShape.push_back(ds[2]);
    SmallVector<Value> operands{x, idx, gates, up, down};
    if (gate)
      operands.push_back(gate);
    Value y = generic(MoeExpertsOp(), f32Tensor(yShape, ctx), operands,
                      {b.getNamedAttr("act", b.getStringAttr(act))});
    // Shared experts: an MLP every token goes through, added to the routed
    // experts' sum (DeepSeek's), tensor parallel like any MLP.
    if (sUp || sDown || sGate) {
      if (!sUp || !sDown || (gated && !sGate)) {
        error(l) << "'moe' shared experts need "
                 << (gated ? "shared_gate, shared_up and shared_down"
                           : "shared_up and shared_down");
        return out;
      }
      auto su = shapeOf(sUp);
      if (sGate && sGate.getType() != sUp.getType()) {
        error(l) << "'moe' needs shared_gate and shared_up of the same shape, "
                 << "got " << shapeStr(sGate.getType()) << " and "
                 << shapeStr(sUp.getType());
        return out;
      }
      if (su.size() == 2 &&
          !checkTpDivides(su[1], "the shared experts' hidden size", l))
        return out;
      if (sGate)
        seedSharding(sGate, 1, l);
      seedSharding(sUp, 1, l);
      seedSharding(sDown, 0, l);
      Value u = linear(l, x, sUp, {}, false, "'moe' (shared_up)");
      if (!u)
        return out;
      Value h;
      if (sGate) {
        Value g = linear(l, x, sGate, {}, false, "'moe' (shared_gate)");
        if (!g)
          return out;
        h = generic(MulOp(), g.getType(),
                    {generic(SiluOp(), g.getType(), {g}), u});
      } else {
        h = GeluOp::create(b, l, u.getType(), u, UnitAttr());
      }
      Value s2 = linear(l, h, sDown, {}, false, "'moe' (shared_down)");
      if (!s2)
        return out;
      if (s2.getType() != y.getType()) {
        error(l) << "'moe': the shared experts give " << shapeStr(s2.getType())
                 << " but the routed experts " << shapeStr(y.getType());
        return out;
      }
      y = generic(AddOp(), y.getType(), {y, s2});
    }
    out.v = y;
    return out;
  }
  if (fn == "relu" || fn == "gelu" || fn == "silu" || fn == "softmax") {
    // gelu(x) is GPT-2's tanh form; gelu(x, exact = true) the erf form.
    bool exact = fn == "gelu" && namedNumber("exact", 0) != 0;
    if (!arity(1, 1, "one tensor") || !leftovers())
      return out;
    Value x = tensorArg(0);
    if (!x)
      return out;
    Type t = x.getType();
    if (fn == "softmax" && shapeOf(x).empty()) {
      error(pos[0].loc) << "'softmax' normalizes over the last dimension, but "
                        << "its input is a scalar";
      return out;
    }
    out.v = fn == "relu" ? Value(ReluOp::create(b, l, t, x))
            : fn == "gelu"
                ? Value(GeluOp::create(b, l, t, x,
                                       exact ? b.getUnitAttr() : UnitAttr()))
            : fn == "silu" ? generic(SiluOp(), t, {x})
                           : generic(SoftmaxOp(), t, {x});
    return out;
  }
  // A spatial hyper-parameter: one integer for both dimensions, or
  // [height, width]; nullopt (reported) when malformed or below `min`.
  auto namedPair = [&](StringRef key, int64_t dflt, int64_t dflt2,
                       int64_t min) -> std::optional<std::array<int64_t, 2>> {
    auto it = named.find(key);
    if (it == named.end())
      return std::array<int64_t, 2>{dflt, dflt2};
    Val v = it->second;
    named.erase(it);
    std::array<int64_t, 2> r{-1, -1};
    if (v.isNumber()) {
      std::optional<int64_t> n = listInt(v.getNumber());
      r = {n.value_or(-1), n.value_or(-1)};
    } else if (v.isList() && v.getList().allInts &&
               v.getList().values.size() == 2) {
      r = {listInt(v.getList().values[0]).value_or(-1),
           listInt(v.getList().values[1]).value_or(-1)};
    }
    if (r[0] < min || r[1] < min) {
      error(v.loc) << "'" << key << "' is an integer >= " << min
                   << " or a pair [height, width], e.g. " << key << " = "
                   << std::max<int64_t>(min, 1);
      badNamed = true;
      return std::nullopt;
    }
    return r;
  };
  auto nchw = [&](Value x, StringRef what) {
    if (shapeOf(x).size() == 4)
      return true;
    auto d = error(l) << "'" << fn << "' takes " << what
                      << " in NCHW layout [batch, channels, height, width], "
                      << "got " << shapeStr(x.getType());
    d.attachNote(defLoc(x)) << "it is defined here";
    return false;
  };
  if (fn == "conv2d") {
    if (!arity(2, 3, "an input, a filter and an optional bias"))
      return out;
    auto stride = namedPair("stride", 1, 1, 1);
    auto padding = namedPair("padding", 0, 0, 0);
    auto dilation = namedPair("dilation", 1, 1, 1);
    double groupsNum = namedNumber("groups", 1);
    if (!leftovers() || !stride || !padding || !dilation)
      return out;
    Value x = tensorArg(0), w = tensorArg(1);
    Value bias = pos.size() == 3 ? tensorArg(2) : Value();
    if (!x || !w || (pos.size() == 3 && !bias) || !nchw(x, "an input") ||
        !nchw(w, "a filter"))
      return out;
    std::optional<int64_t> groups = listInt(groupsNum);
    auto xs = shapeOf(x), ws = shapeOf(w);
    if (!groups || *groups < 1 || xs[1] % *groups || ws[0] % *groups) {
      error(l) << "'conv2d': groups must be a positive integer dividing the "
               << "input channels (" << xs[1] << ") and the output channels ("
               << ws[0] << ")";
      return out;
    }
    if (ws[1] != xs[1] / *groups) {
      auto d = error(l) << "'conv2d': the filter must be [out_channels, "
                        << "in_channels / groups, kh, kw] = [" << ws[0] << ", "
                        << xs[1] / *groups << ", " << ws[2] << ", " << ws[3]
                        << "] for an input with " << xs[1] << " channels, got "
                        << shapeStr(w.getType());
      d.attachNote(defLoc(w)) << "the filter is defined here";
      return out;
    }
    int64_t ho = spatialOutSize(xs[2], ws[2], (*stride)[0], (*padding)[0],
                                (*dilation)[0]);
    int64_t wo = spatialOutSize(xs[3], ws[3], (*stride)[1], (*padding)[1],
                                (*dilation)[1]);
    if (ho < 1 || wo < 1) {
      error(l) << "'conv2d': the " << ws[2] << "x" << ws[3]
               << " filter (dilated, with padding) does not fit in the "
               << xs[2] << "x" << xs[3] << " input";
      return out;
    }
    auto y = Conv2dOp::create(
        b, l, f32Tensor({xs[0], ws[0], ho, wo}, ctx), x, w,
        b.getDenseI64ArrayAttr(*stride), b.getDenseI64ArrayAttr(*padding),
        b.getDenseI64ArrayAttr(*dilation), b.getI64IntegerAttr(*groups));
    out.v = y.getResult();
    if (!bias)
      return out;
    if (shapeOf(bias) != ArrayRef<int64_t>{ws[0]}) {
      auto d = error(l) << "'conv2d': the bias must have shape [" << ws[0]
                        << "] (one value per output channel), got "
                        << shapeStr(bias.getType());
      d.attachNote(defLoc(bias)) << "the bias is defined here";
      out.v = {};
      return out;
    }
    out.v = generic(ChannelBiasAddOp(), y.getType(), {y, bias});
    return out;
  }
  if (fn == "max_pool2d" || fn == "avg_pool2d") {
    if (!arity(1, 1, "one tensor and a named kernel size"))
      return out;
    auto kernel = namedPair("kernel", 2, 2, 1);
    auto stride =
        kernel ? namedPair("stride", (*kernel)[0], (*kernel)[1], 1) : kernel;
    auto padding = namedPair("padding", 0, 0, 0);
    if (!leftovers() || !kernel || !stride || !padding)
      return out;
    Value x = tensorArg(0);
    if (!x || !nchw(x, "an input"))
      return out;
    if ((*padding)[0] * 2 > (*kernel)[0] || (*padding)[1] * 2 > (*kernel)[1]) {
      error(l) << "'" << fn << "': padding must be at most half the kernel";
      return out;
    }
    auto xs = shapeOf(x);
    int64_t ho =
        spatialOutSize(xs[2], (*kernel)[0], (*stride)[0], (*padding)[0]);
    int64_t wo =
        spatialOutSize(xs[3], (*kernel)[1], (*stride)[1], (*padding)[1]);
    if (ho < 1 || wo < 1) {
      error(l) << "'" << fn << "': the " << (*kernel)[0] << "x" << (*kernel)[1]
               << " window does not fit in the " << xs[2] << "x" << xs[3]
               << " input";
      return out;
    }
    out.v = Pool2dOp::create(
        b, l, f32Tensor({xs[0], xs[1], ho, wo}, ctx), x,
        b.getStringAttr(fn == "max_pool2d" ? "max" : "avg"),
        b.getDenseI64ArrayAttr(*kernel), b.getDenseI64ArrayAttr(*stride),
        b.getDenseI64ArrayAttr(*padding));
    return out;
  }
  if (fn == "batch_norm" || fn == "group_norm") {
    // batch_norm(x, gamma, beta, eps = 1e-5, momentum = 0.1): per channel
    // (dimension 1) over the batch and the rest while training, with
    // running statistics for evaluation; group_norm(x, gamma, beta, groups
    // = G, eps = 1e-5): per sample over groups of channels.
    if (!arity(3, 3, "an input, a scale and a shift"))
      return out;
    double eps = namedNumber("eps", 1e-5);
    double groupsNum = fn == "group_norm" ? namedNumber("groups", -1) : 1;
    double momentum = fn == "batch_norm" ? namedNumber("momentum", 0.1) : 0;
    if (!leftovers())
      return out;
    Value x = tensorArg(0), gamma = tensorArg(1), beta = tensorArg(2);
    if (!x || !gamma || !beta)
      return out;
    auto xs = shapeOf(x);
    if (xs.size() < 2) {
      error(l) << "'" << fn << "' normalizes channels (dimension 1); its "
               << "input needs at least 2 dimensions, got "
               << shapeStr(x.getType());
      return out;
    }
    for (Value p : {gamma, beta})
      if (shapeOf(p) != ArrayRef<int64_t>{xs[1]}) {
        auto d = error(l) << "'" << fn
                          << "': the scale and the shift must have "
                          << "shape [" << xs[1] << "] (one value per "
                          << "channel), got " << shapeStr(p.getType());
        d.attachNote(defLoc(p)) << "it is defined here";
        return out;
      }
    if (!(eps > 0)) {
      error(l) << "'" << fn << "': eps must be > 0, got " << eps;
      return out;
    }
    int64_t perChannel = 1;
    for (auto [i, n] : llvm::enumerate(xs))
      perChannel *= i == 1 ? 1 : n;
    if (fn == "batch_norm" && perChannel < 2) {
      error(l) << "'batch_norm' needs more than one value per channel in a "
               << "batch (its running variance is the unbiased one), got "
               << shapeStr(x.getType());
      return out;
    }
    auto epsAttr = b.getNamedAttr("eps", b.getF32FloatAttr(eps));
    if (fn == "batch_norm") {
      if (!(momentum >= 0 && momentum <= 1)) {
        error(l) << "'batch_norm': momentum is the weight of the batch's "
                 << "statistics in the running ones, in [0, 1], got "
                 << momentum;
        return out;
      }
      FailureOr<std::pair<Value, Value>> running =
          runningStats(gamma, pos[1].loc, l);
      if (failed(running))
        return out;
      out.v = generic(
          BatchNormOp(), x.getType(),
          {x, gamma, beta, running->first, running->second},
          {epsAttr, b.getNamedAttr("momentum", b.getF32FloatAttr(momentum))});
      return out;
    }
    std::optional<int64_t> groups = listInt(groupsNum);
    if (!groups || *groups < 1 || xs[1] % *groups) {
      error(l) << "'group_norm' needs 'groups = G' with G a positive integer "
               << "dividing the " << xs[1] << " channels";
      return out;
    }
    out.v = generic(
        GroupNormOp(), x.getType(), {x, gamma, beta},
        {epsAttr, b.getNamedAttr("groups", b.getI64IntegerAttr(*groups))});
    return out;
  }
  if (fn == "dropout") {
    // dropout(x, p = 0.5): inverted dropout; each call (and each repeat
    // instance) draws its own mask, the same for every plan.
    if (!arity(1, 1, "one tensor and a named probability"))
      return out;
    double p = namedNumber("p", 0.5);
    if (!leftovers())
      return out;
    Value x = tensorArg(0);
    if (!x)
      return out;
    if (!(p >= 0 && p < 1)) {
      error(l) << "'dropout': p is the probability of zeroing an element, "
               << "in [0, 1), got " << p;
      return out;
    }
    if (shapeOf(x).size() > 4) {
      error(l) << "'dropout' takes tensors of at most 4 dimensions, got "
               << shapeStr(x.getType());
      return out;
    }
    out.v =
        generic(DropoutOp(), x.getType(), {x},
                {b.getNamedAttr("p", b.getF32FloatAttr(p)),
                 b.getNamedAttr("uid", b.getI64IntegerAttr(dropoutCount++))});
    return out;
  }
  if (fn == "flatten") {
    // [batch, ...] -> [batch, product of the rest], e.g. before a classifier.
    if (!arity(1, 1, "one tensor") || !leftovers())
      return out;
    Value x = tensorArg(0);
    if (!x)
      return out;
    auto xs = shapeOf(x);
    if (xs.size() < 2) {
      error(l) << "'flatten' keeps the batch dimension and joins the rest; "
               << "its input needs at least 2 dimensions, got "
               << shapeStr(x.getType());
      return out;
    }
    int64_t rest = 1;
    for (int64_t d : xs.drop_front())
      rest *= d;
    out.v = generic(ReshapeOp(), f32Tensor({xs[0], rest}, ctx), {x});
    return out;
  }
  if (fn == "add") {
    if (!arity(2, 2, "two tensors") || !leftovers())
      return out;
    return evalArith(l, '+', pos[0], pos[1]);
  }
  if (fn == "mse") {
    if (!arity(2, 2, "a prediction and a target") || !leftovers())
      return out;
    Value p = tensorArg(0), t = tensorArg(1);
    if (!p || !t)
      return out;
    if (p.getType() != t.getType()) {
      auto d = error(l) << "'mse' compares tensors of the same shape, got "
                        << shapeStr(p.getType()) << " and "
                        << shapeStr(t.getType());
      d.attachNote(defLoc(p))
          << "the prediction, " << shapeStr(p.getType()) << ", comes from here";
      d.attachNote(defLoc(t))
          << "the target, " << shapeStr(t.getType()) << ", comes from here";
      return out;
    }
    out.v = MseLossOp::create(b, l, f32Tensor({}, ctx), p, t).getResult();
    return out;
  }
  // cross_entropy
  if (!arity(2, 2, "logits and target ids") || !leftovers())
    return out;
  Value logits = tensorArg(0), targets = tensorArg(1);
  if (!logits || !targets)
    return out;
  auto ls = shapeOf(logits);
  auto tt = cast<RankedTensorType>(targets.getType());
  if (!tt.getElementType().isInteger(32) ||
      ls.size() != tt.getShape().size() + 1 ||
      ls.drop_back() != tt.getShape()) {
    auto d = error(l) << "'cross_entropy' takes logits [..., vocab] and i32 "
                         "targets [...] with the same leading shape, got "
                      << shapeStr(logits.getType()) << " and "
                      << shapeStr(targets.getType());
    d.attachNote(defLoc(logits)) << "the logits come from here";
    d.attachNote(defLoc(targets)) << "the targets come from here";
    return out;
  }
  Value loss = generic(CrossEntropyOp(), f32Tensor({}, ctx), {logits, targets});
  // Logits over a padded vocabulary (a tied, padded table): the padding is
  // masked out of the loss, so results do not change.
  if (auto it = paddedVocab.find(ls.back()); it != paddedVocab.end())
    loss.getDefiningOp()->setAttr("valid_classes",
                                  b.getI64IntegerAttr(it->second));
  out.v = loss;
  return out;
}
