//===- Sema.cpp - Names, expressions and the model ------------------------===//
#include "Sema.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"

#include <cmath>
#include <cstdio>

using namespace mlir;
using namespace planc;
using namespace planc::plan;
using namespace planc::frontend;

std::string Sema::unquote(StringRef quoted) {
  return quoted.drop_front().drop_back().str();
}

Sema::Sema(MLIRContext *ctx) : ctx(ctx), b(ctx) { scopes.emplace_back(); }

//===----------------------------------------------------------------------===//
// Diagnostics
//===----------------------------------------------------------------------===//

Location Sema::loc(antlr4::Token *t) {
  StringAttr &file = sourceNames[t->getTokenSource()];
  if (!file)
    file = StringAttr::get(ctx, t->getTokenSource()->getSourceName());
  Location l =
      FileLineColLoc::get(file, t->getLine(), t->getCharPositionInLine() + 1);
  // Inside an inlined block, say where the block was called from.
  for (Location caller : llvm::reverse(callers))
    l = CallSiteLoc::get(l, caller);
  return l;
}

std::string Sema::suggest(StringRef name, ArrayRef<StringRef> known) {
  StringRef best;
  unsigned bestDist = std::min<unsigned>(3, name.size() / 2 + 1);
  for (StringRef k : known) {
    unsigned d = name.edit_distance(k, true, bestDist);
    if (d < bestDist) {
      bestDist = d;
      best = k;
    }
  }
  return best.empty() ? std::string()
                      : ("; did you mean '" + best + "'?").str();
}

std::string Sema::shapeStr(Type t) {
  std::string s;
  llvm::raw_string_ostream os(s);
  auto rt = cast<RankedTensorType>(t);
  os << '[';
  llvm::interleaveComma(rt.getShape(), os);
  os << ']';
  if (!rt.getElementType().isF32())
    os << " of " << rt.getElementType();
  return s;
}

Location Sema::defLoc(Value v) {
  if (auto arg = dyn_cast<BlockArgument>(v))
    return arg.getLoc();
  return v.getDefiningOp()->getLoc();
}

//===----------------------------------------------------------------------===//
// Names
//===----------------------------------------------------------------------===//

void Sema::bind(antlr4::Token *name, Val v, bool rebindable) {
  std::string n = name->getText();
  Location l = loc(name);
  if (n == "batch") {
    error(l) << "'batch' is reserved: it stands for the global batch size "
                "set in the train section";
    return;
  }
  for (auto &scope : scopes)
    if (auto it = scope.find(n); it != scope.end()) {
      if (rebindable && it->second.rebindable && &scope == &scopes.back()) {
        it->second = Binding{v, l, true};
        return;
      }
      auto d = error(l) << "'" << n << "' is already defined";
      if (isa<UnknownLoc>(it->second.defLoc))
        d.attachNote(l) << "'" << n << "' is a built-in name";
      else
        d.attachNote(it->second.defLoc) << "previous definition is here";
      if (rebindable && !it->second.rebindable)
        d.attachNote(l) << "only computed tensors can be given a new value; "
                           "constants, inputs and parameters cannot";
      return;
    }
  scopes.back().try_emplace(n, Binding{v, l, rebindable});
}

Val Sema::lookup(StringRef name, Location use) {
  // Innermost scope first; blocks see their own names and the top level.
  for (auto &scope : llvm::reverse(scopes))
    if (auto it = scope.find(name); it != scope.end()) {
      Val v = it->second.val;
      v.loc = use;
      return v;
    }
  SmallVector<StringRef> known;
  for (auto &scope : scopes)
    for (auto &kv : scope)
      known.push_back(kv.getKey());
  for (auto &kv : blocks)
    known.push_back(kv.getKey());
  if (blocks.count(name))
    error(use) << "'" << name << "' is a block; call it, e.g. '" << name
               << "(x)'";
  else
    error(use) << "unknown name '" << name << "'" << suggest(name, known)
               << "; names must be defined before they are used";
  // Poison it so that later uses stay quiet.
  scopes.back().try_emplace(name, Binding{Val::error(use), use});
  return Val::error(use);
}

//===----------------------------------------------------------------------===//
// Types, shardings, initializers
//===----------------------------------------------------------------------===//

std::optional<RankedTensorType>
Sema::tensorType(PlanParser::TensorTypeContext *t, bool isData) {
  std::string dtype = t->dtype->getText();
  bool ok = true;
  Type elt;
  if (dtype == "f32")
    elt = b.getF32Type();
  else if (dtype == "i32" && isData)
    elt = b.getI32Type();
  else if (dtype == "bf16" || dtype == "f16") {
    error(loc(t->dtype)) << "tensors are declared in f32; the training "
                            "precision is a train setting, e.g. 'precision = "
                         << dtype << "'";
    ok = false;
  } else {
    error(loc(t->dtype)) << "unknown element type '" << dtype << "'; use f32"
                         << (isData ? " (or i32 for token ids)" : "");
    ok = false;
  }
  SmallVector<int64_t> shape;
  for (auto [i, e] : llvm::enumerate(t->expr())) {
    if (isData && i == 0 && e->getText() != "batch") {
      error(loc(e)) << "the first dimension of an input or label must be "
                       "'batch' (samples are split over data-parallel ranks "
                       "along it)";
      ok = false;
      continue;
    }
    Val v = eval(e);
    if (v.isError()) {
      ok = false;
      continue;
    }
    if (!v.isInt() || v.getInt() < 1) {
      error(v.loc) << "a dimension must be a positive integer";
      ok = false;
      continue;
    }
    shape.push_back(v.getInt());
  }
  if (shape.size() > 4) {
    error(loc(t)) << "tensors have at most 4 dimensions";
    ok = false;
  }
  // Element counts must stay far from int64 overflow in every later stage.
  constexpr int64_t kMaxElements = int64_t(1) << 48;
  int64_t numel = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(numel, d, &numel) || numel > kMaxElements) {
      error(loc(t)) << "this tensor has more than 2^48 elements";
      ok = false;
      break;
    }
  if (!ok)
    return std::nullopt;
  return RankedTensorType::get(shape, elt);
}

std::optional<ShardingAttr> Sema::shardSpec(PlanParser::ShardSpecContext *spec,
                                            RankedTensorType type,
                                            StringRef what) {
  auto dims = spec->shardDim();
  if ((int64_t)dims.size() != type.getRank()) {
    error(loc(spec)) << "shard(...) of " << what << " lists " << dims.size()
                     << " dimension" << (dims.size() == 1 ? "" : "s")
                     << " but it has " << type.getRank() << " ("
                     << shapeStr(type) << "); write one entry per dimension, "
                     << "'_' for a dimension that is not split";
    return std::nullopt;
  }
  SmallVector<StringRef> axisNames = {"dp", "tp", "pp", "ep"};
  SmallVector<Attribute> out;
  bool ok = true;
  llvm::StringSet<> used;
  for (auto [i, d] : llvm::enumerate(dims)) {
    std::string axis = d->getText();
    if (axis == "_") {
      out.push_back(b.getArrayAttr({}));
      continue;
    }
    int64_t size = axis == "dp"   ? par.dp
                   : axis == "tp" ? par.tp
                   : axis == "pp" ? par.pp
                   : axis == "ep" ? par.ep
                                  : -1;
    if (size < 0) {
      error(loc(d)) << "unknown mesh axis '" << axis << "'"
                    << suggest(axis, axisNames)
                    << "; the mesh axes are dp, tp, pp and ep";
      ok = false;
      continue;
    }
    if (!used.insert(axis).second) {
      error(loc(d)) << "mesh axis '" << axis
                    << "' splits more than one dimension of " << what;
      ok = false;
      continue;
    }
    if (size == 1) {
      // Splitting over an axis of size 1 is no split (the mesh leaves it out).
      out.push_back(b.getArrayAttr({}));
      continue;
    }
    if (type.getDimSize(i) % size != 0) {
      error(loc(d)) << "dimension " << i << " of " << what << " has size "
                    << type.getDimSize(i) << ", which cannot be split evenly "
                    << "over " << axis << " = " << size;
      ok = false;
      continue;
    }
    out.push_back(b.getStrArrayAttr({axis}));
  }
  if (!ok)
    return std::nullopt;
  return ShardingAttr::get(ctx, meshRef, b.getArrayAttr(out),
                           b.getArrayAttr({}));
}

std::optional<InitAttr> Sema::evalInit(PlanParser::ExprContext *e) {
  auto *call = dynamic_cast<PlanParser::CallExprContext *>(e);
  auto *name = dynamic_cast<PlanParser::NameExprContext *>(e);
  std::string kind = call   ? call->callee->getText()
                     : name ? name->IDENT()->getSymbol()->getText()
                            : "";
  if (kind != "zeros" && kind != "ones" && kind != "normal" &&
      kind != "uniform") {
    error(loc(e)) << "a parameter's initializer must be zeros, ones, "
                     "normal(mean, std) or uniform(low, high)"
                  << (kind.empty() ? std::string()
                                   : suggest(kind, {"zeros", "ones", "normal",
                                                    "uniform"}));
    return std::nullopt;
  }
  bool takes = kind == "normal" || kind == "uniform";
  size_t n = call ? call->arg().size() : 0;
  if (takes ? n != 2 : n != 0) {
    error(loc(e)) << "'" << kind << "' takes "
                  << (takes ? "two numbers" : "no arguments");
    return std::nullopt;
  }
  double vals[2] = {0, 0};
  for (size_t i = 0; i < n; ++i) {
    Val v = eval(call->arg()[i]->expr());
    if (v.isError())
      return std::nullopt;
    if (!v.isNumber()) {
      error(v.loc) << "initializer arguments must be numbers";
      return std::nullopt;
    }
    vals[i] = v.getNumber();
  }
  if (kind == "normal" && vals[1] < 0) {
    error(loc(e)) << "the standard deviation of 'normal' must be >= 0";
    return std::nullopt;
  }
  if (kind == "uniform" && !(vals[0] < vals[1])) {
    error(loc(e)) << "'uniform(low, high)' needs low < high";
    return std::nullopt;
  }
  return InitAttr::get(ctx, kind, vals[0], vals[1]);
}

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

Val Sema::evalArith(Location l, char op, Val lhs, Val rhs) {
  Val out = Val::error(l);
  if (lhs.isError() || rhs.isError())
    return out;
  if (lhs.isTensor() || rhs.isTensor()) {
    if (op == '/' || op == '%' || !lhs.isTensor() || !rhs.isTensor()) {
      error(l) << "operator '" << op
               << "' is not defined here: tensors support elementwise '+', "
                  "'-' and '*' between tensors of the same shape; use "
                  "matmul(a, b) for products";
      return out;
    }
    Value a = lhs.getTensor(), c = rhs.getTensor();
    if (a.getType() != c.getType()) {
      auto d = error(l) << "operator '" << op << "' needs tensors of the "
                        << "same shape, got " << shapeStr(a.getType())
                        << " and " << shapeStr(c.getType());
      d.attachNote(defLoc(a)) << "the left operand, " << shapeStr(a.getType())
                              << ", comes from here";
      d.attachNote(defLoc(c)) << "the right operand, " << shapeStr(c.getType())
                              << ", comes from here";
      return out;
    }
    if (op == '+')
      out.v = AddOp::create(b, l, a.getType(), a, c).getResult();
    else if (op == '-')
      out.v = SubOp::create(b, l, TypeRange(a.getType()), ValueRange{a, c},
                            ArrayRef<NamedAttribute>())
                  ->getResult(0);
    else
      out.v = MulOp::create(b, l, TypeRange(a.getType()), ValueRange{a, c},
                            ArrayRef<NamedAttribute>())
                  ->getResult(0);
    return out;
  }
  if (!lhs.isNumber() || !rhs.isNumber()) {
    error(l) << "operator '" << op << "' needs numbers";
    return out;
  }
  if (lhs.isInt() && rhs.isInt()) {
    int64_t a = lhs.getInt(), c = rhs.getInt(), r = 0;
    bool overflow = false;
    switch (op) {
    case '+':
      overflow = __builtin_add_overflow(a, c, &r);
      break;
    case '-':
      overflow = __builtin_sub_overflow(a, c, &r);
      break;
    case '*':
      overflow = __builtin_mul_overflow(a, c, &r);
      break;
    default:
      if (c == 0) {
        error(rhs.loc) << "division by zero";
        return out;
      }
      if (a == INT64_MIN && c == -1)
        overflow = true;
      else
        r = op == '/' ? a / c : a % c;
    }
    if (overflow) {
      error(l) << "integer overflow in constant expression";
      return out;
    }
    out.v = r;
    return out;
  }
  double a = lhs.getNumber(), c = rhs.getNumber();
  if (op == '%') {
    error(l) << "'%' needs integers";
    return out;
  }
  out.v = op == '+' ? a + c : op == '-' ? a - c : op == '*' ? a * c : a / c;
  return out;
}

Val Sema::eval(PlanParser::ExprContext *e) {
  Location l = loc(e);
  // The commonest kinds first (a layer's body is names and calls), and
  // single tokens' text from the token: a rule's getText() walks its tree.
  if (auto *n = dynamic_cast<PlanParser::NameExprContext *>(e))
    return lookup(n->IDENT()->getSymbol()->getText(), l);
  if (auto *c = dynamic_cast<PlanParser::CallExprContext *>(e))
    return evalCall(c);
  if (auto *p = dynamic_cast<PlanParser::ParenExprContext *>(e))
    return eval(p->expr());
  if (auto *n = dynamic_cast<PlanParser::NegExprContext *>(e)) {
    Val v = eval(n->expr());
    if (v.isInt() && v.getInt() != INT64_MIN)
      return Val{-v.getInt(), l};
    if (v.isNumber())
      return Val{-v.getNumber(), l};
    if (!v.isError())
      error(l) << "unary '-' needs a number";
    return Val::error(l);
  }
  // Operands in source order, so their ops appear in that order too.
  if (auto *m = dynamic_cast<PlanParser::MulExprContext *>(e)) {
    Val lhs = eval(m->lhs);
    Val rhs = eval(m->rhs);
    return evalArith(loc(m->op), m->op->getText()[0], lhs, rhs);
  }
  if (auto *a = dynamic_cast<PlanParser::AddExprContext *>(e)) {
    Val lhs = eval(a->lhs);
    Val rhs = eval(a->rhs);
    return evalArith(loc(a->op), a->op->getText()[0], lhs, rhs);
  }
  if (auto *r = dynamic_cast<PlanParser::RepeatExprContext *>(e))
    return evalRepeat(r);
  if (auto *list = dynamic_cast<PlanParser::ListExprContext *>(e)) {
    NumList out;
    for (PlanParser::ExprContext *x : list->expr()) {
      Val v = eval(x);
      if (v.isError())
        return Val::error(l);
      if (!v.isNumber()) {
        error(v.loc) << "list elements must be numbers";
        return Val::error(l);
      }
      out.allInts &= v.isInt();
      out.values.push_back(v.getNumber());
    }
    return Val{out, l};
  }
  if (auto *s = dynamic_cast<PlanParser::StringExprContext *>(e)) {
    std::string t = s->STRING()->getSymbol()->getText();
    return Val{t.substr(1, t.size() - 2), l};
  }
  if (auto *num = dynamic_cast<PlanParser::NumberExprContext *>(e)) {
    std::string t = num->NUMBER()->getSymbol()->getText();
    if (t.find_first_of(".eE") == std::string::npos) {
      int64_t v;
      if (StringRef(t).getAsInteger(10, v)) {
        error(l) << "integer " << t << " is too large";
        return Val::error(l);
      }
      return Val{v, l};
    }
    double d = std::strtod(t.c_str(), nullptr);
    if (!std::isfinite(d)) {
      error(l) << "number " << t << " is out of range";
      return Val::error(l);
    }
    return Val{d, l};
  }
  return Val::error(l);
}

//===----------------------------------------------------------------------===//
// The model
//===----------------------------------------------------------------------===//

Value Sema::declareArg(RankedTensorType type, Location l, StringRef kind,
                       StringRef name, ArrayRef<NamedAttribute> extra) {
  Value arg = body->addArgument(type, l);
  SmallVector<NamedAttribute> attrs{
      b.getNamedAttr(kKindAttr, b.getStringAttr(kind)),
      b.getNamedAttr(kNameAttr, b.getStringAttr(name))};
  attrs.append(extra.begin(), extra.end());
  if (layer)
    attrs.push_back(b.getNamedAttr(kLayerAttr, b.getI64IntegerAttr(*layer)));
  argAttrs.push_back(b.getDictionaryAttr(attrs));
  return arg;
}

void Sema::runStmts(const std::vector<PlanParser::StmtContext *> &stmts,
                    bool inBlock, std::optional<Val> *ret) {
  for (PlanParser::StmtContext *stmt : stmts) {
    if (auto *d = dynamic_cast<PlanParser::DataDeclContext *>(stmt)) {
      if (inBlock) {
        error(loc(d)) << "inputs and labels are declared in the model, not "
                         "in a block; pass them to the block as arguments";
        continue;
      }
      auto type = tensorType(d->tensorType(), /*isData=*/true);
      if (!type) {
        bind(d->name, Val::error(loc(d->name)));
        continue;
      }
      // plan-seed-sharding splits the samples over the data-parallel axis.
      if (d->shardSpec())
        error(loc(d->shardSpec()))
            << "inputs and labels are split along the batch over dp; they "
               "take no shard(...) annotation";
      Value arg = declareArg(*type, loc(d->name), d->role->getText(),
                             d->name->getText(), {});
      bind(d->name, Val{arg, loc(d->name)});
    } else if (auto *p = dynamic_cast<PlanParser::ParamDeclContext *>(stmt)) {
      ++numParamDecls;
      auto type = tensorType(p->tensorType(), /*isData=*/false);
      std::optional<InitAttr> init =
          p->init ? evalInit(p->init) : InitAttr::get(ctx, "normal", 0, 0.02);
      // `as "ln_1.weight"` names the parameter for export (checkpoints,
      // safetensors); the plan keeps using its identifier.
      std::string name =
          paramPrefix + (p->exportName ? unquote(p->exportName->getText())
                                       : p->name->getText());
      std::optional<ShardingAttr> sharding;
      if (type && p->shardSpec())
        sharding = shardSpec(p->shardSpec(), *type, "'" + name + "'");
      if (!type || !init || (p->shardSpec() && !sharding)) {
        bind(p->name, Val::error(loc(p->name)));
        continue;
      }
      if (name.empty() || name.back() == '.') {
        error(loc(p->exportName)) << "an export name must be non-empty";
        bind(p->name, Val::error(loc(p->name)));
        continue;
      }
      if (auto [it, fresh] = paramNames.try_emplace(name, loc(p->name));
          !fresh) {
        auto d = error(loc(p->name))
                 << "two parameters are named '" << name << "'";
        d.attachNote(it->second) << "the other one is declared here";
        bind(p->name, Val::error(loc(p->name)));
        continue;
      }
      SmallVector<NamedAttribute> extra{b.getNamedAttr(kInitAttr, *init)};
      if (sharding)
        extra.push_back(b.getNamedAttr(kShardingAttr, *sharding));
      Value arg = declareArg(*type, loc(p->name), "param", name, extra);
      bind(p->name, Val{arg, loc(p->name)});
    } else if (auto *let = dynamic_cast<PlanParser::LetStmtContext *>(stmt)) {
      Val v = eval(let->expr());
      if (let->shardSpec() && !v.isError()) {
        if (!v.isTensor()) {
          error(loc(let->shardSpec())) << "only tensors can be sharded";
          v = Val::error(v.loc);
        } else if (auto s = shardSpec(
                       let->shardSpec(),
                       cast<RankedTensorType>(v.getTensor().getType()),
                       "'" + let->name->getText() + "'")) {
          Value t = v.getTensor();
          v.v = ShardingConstraintOp::create(
                    b, loc(let->shardSpec()), TypeRange(t.getType()),
                    ValueRange(t), {b.getNamedAttr("sharding", *s)})
                    ->getResult(0);
        } else {
          v = Val::error(v.loc);
        }
      }
      // Computed tensors (and failed values, to stay quiet) may be rebound.
      bind(let->name, v, v.isTensor() || v.isError());
    } else if (auto *ls = dynamic_cast<PlanParser::LossStmtContext *>(stmt)) {
      if (inBlock) {
        error(loc(ls)) << "a block cannot define the loss; return a value and "
                          "compute the loss in the model";
        continue;
      }
      if (loss) {
        auto d = error(loc(ls)) << "the model has more than one loss";
        if (*loss)
          d.attachNote(defLoc(*loss)) << "the first loss is here";
        continue;
      }
      Val v = eval(ls->expr());
      loss = Value();
      if (v.isError())
        continue;
      if (!v.isTensor() || !isa_and_nonnull<MseLossOp, CrossEntropyOp>(
                               v.getTensor().getDefiningOp())) {
        error(v.loc) << "the loss must be a loss function of the model's "
                        "output and label, e.g. 'loss mse(out, y)' or 'loss "
                        "cross_entropy(logits, targets)'";
        continue;
      }
      loss = v.getTensor();
    } else if (auto *r = dynamic_cast<PlanParser::ReturnStmtContext *>(stmt)) {
      if (!inBlock) {
        error(loc(r)) << "'return' belongs in a block; the model ends with "
                         "'loss ...'";
        continue;
      }
      if (ret->has_value()) {
        error(loc(r)) << "a block returns once, at its end";
        continue;
      }
      *ret = eval(r->expr());
    }
  }
}

void Sema::buildModel(PlanParser::ModelSectionContext *model) {
  Location l = loc(model->name);
  b.setInsertionPointToEnd(module.getBody());
  func = func::FuncOp::create(b, l, model->name->getText(),
                              b.getFunctionType({}, {}));
  func->setAttr(kModelAttr, b.getUnitAttr());
  body = func.addEntryBlock();
  b.setInsertionPointToStart(body);
  scopes.emplace_back();
  scopes.back().try_emplace(
      "batch", Binding{train.batch ? Val{*train.batch, l} : Val::error(l), l});

  runStmts(model->stmt(), /*inBlock=*/false, nullptr);
  scopes.pop_back();

  if (!loss)
    error(loc(model->getStop()))
        << "the model has no loss; end it with e.g. 'loss mse(out, y)'";
  // Counted on the statements run, so a parameter whose declaration failed
  // does not also trigger this error.
  if (numParamDecls == 0)
    error(l) << "the model has no parameters, so there is nothing to train";

  bool haveLoss = loss && *loss;
  func.setType(
      b.getFunctionType(body->getArgumentTypes(),
                        haveLoss ? TypeRange((*loss).getType()) : TypeRange()));
  func.setAllArgAttrs(argAttrs);
  b.setInsertionPointToEnd(body);
  Location retLoc = haveLoss ? defLoc(*loss) : l;
  if (haveLoss)
    func::ReturnOp::create(b, retLoc, *loss);
  else
    func::ReturnOp::create(b, retLoc);
}
