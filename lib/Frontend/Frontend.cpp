//===- Frontend.cpp - .plan files to the plan dialect ---------------------===//
//
// The ANTLR parse tree is walked once, in source order. Names are bound in an
// environment as they are defined, so every use refers to an earlier
// definition; inputs and parameters become arguments of the model function as
// they are declared. Errors do not stop the walk: a failed definition binds
// its name to a poisoned entry so that later uses do not pile up follow-on
// errors, and every independent mistake in a file is reported.
//===----------------------------------------------------------------------===//
#include "planc/Frontend/Frontend.h"

#include "PlanLexer.h"
#include "PlanParser.h"
#include "dialects/plan/PlanDialect.h"

#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/thread.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <variant>

using namespace mlir;
using namespace planc;
using namespace planc::plan;

/// A number as a person would write it (0.1, not 1.000000e-01).
static std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

namespace {

/// Reports lexer and parser errors as located MLIR diagnostics.
class ErrorListener : public antlr4::BaseErrorListener {
public:
  ErrorListener(MLIRContext *ctx, StringRef file) : ctx(ctx), file(file) {}
  void syntaxError(antlr4::Recognizer *, antlr4::Token *, size_t line,
                   size_t col, const std::string &msg,
                   std::exception_ptr) override {
    ++errors;
    mlir::emitError(FileLineColLoc::get(ctx, file, line, col + 1))
        << "syntax error: " << msg;
  }
  unsigned errors = 0;

private:
  MLIRContext *ctx;
  std::string file;
};

/// The value of an expression: a number, a string, a tensor, or nothing
/// (an error was already reported).
struct Val {
  std::variant<std::monostate, int64_t, double, std::string, Value> v;
  Location loc;

  bool isError() const { return v.index() == 0; }
  bool isInt() const { return v.index() == 1; }
  bool isNumber() const { return v.index() == 1 || v.index() == 2; }
  bool isString() const { return v.index() == 3; }
  bool isTensor() const { return v.index() == 4; }
  int64_t getInt() const { return std::get<1>(v); }
  double getNumber() const {
    return isInt() ? double(std::get<1>(v)) : std::get<2>(v);
  }
  const std::string &getString() const { return std::get<3>(v); }
  Value getTensor() const { return std::get<4>(v); }
};

/// A named entity of the model.
struct Binding {
  Val val;
  Location defLoc;
};

/// What a setting's value must be.
enum class SettingKind { Int, Name, Call };
struct SettingSpec {
  const char *key;
  SettingKind kind;
  const char *help;
};

constexpr SettingSpec kParallelSettings[] = {
    {"dp", SettingKind::Int, "data-parallel degree"},
    {"tp", SettingKind::Int,
     "tensor-parallel degree (only 1 is supported yet)"},
    {"pp", SettingKind::Int,
     "pipeline-parallel degree (only 1 is supported yet)"},
    {"world", SettingKind::Int, "number of ranks; must equal dp * tp * pp"},
};
constexpr SettingSpec kTrainSettings[] = {
    {"batch", SettingKind::Int, "global batch size (samples per step)"},
    {"steps", SettingKind::Int, "number of training steps"},
    {"seed", SettingKind::Int, "seed of initialization and data"},
    {"optimizer", SettingKind::Call, "sgd(lr = ...) or adamw(lr = ...)"},
    {"data", SettingKind::Name, "data source: synthetic"},
};

class Sema {
public:
  Sema(MLIRContext *ctx, StringRef file) : ctx(ctx), file(file), b(ctx) {}

  OwningOpRef<ModuleOp> run(PlanParser::FileContext *tree);

private:
  // --- diagnostics ---------------------------------------------------------
  Location loc(antlr4::Token *t) {
    return FileLineColLoc::get(ctx, file, t->getLine(),
                               t->getCharPositionInLine() + 1);
  }
  Location loc(antlr4::ParserRuleContext *c) { return loc(c->getStart()); }
  InFlightDiagnostic error(Location l) {
    ++errors;
    return mlir::emitError(l);
  }
  /// " (did you mean 'x'?)" when a known name is close to `name`.
  static std::string suggest(StringRef name, ArrayRef<StringRef> known) {
    StringRef best;
    unsigned bestDist = 3;
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

  // --- settings ------------------------------------------------------------
  void checkSettings(
      PlanParser::SettingsSectionContext *sec, ArrayRef<SettingSpec> specs,
      llvm::StringMap<std::pair<Val, PlanParser::SettingContext *>> &out);
  void readParallel();
  void readTrain();
  std::optional<int64_t>
  intSetting(llvm::StringMap<std::pair<Val, PlanParser::SettingContext *>> &s,
             StringRef key, std::optional<int64_t> dflt, int64_t min,
             Location where, StringRef section);

  // --- model ---------------------------------------------------------------
  void buildModel(PlanParser::ModelSectionContext *model);
  void bind(antlr4::Token *name, Val v);
  std::optional<RankedTensorType> tensorType(PlanParser::TensorTypeContext *t,
                                             bool isData);
  Val eval(PlanParser::ExprContext *e);
  Val evalCall(PlanParser::CallExprContext *call);
  Val evalArith(Location l, char op, Val lhs, Val rhs);
  std::optional<InitAttr> evalInit(PlanParser::ExprContext *e);
  /// Where a tensor was defined, for notes.
  Location defLoc(Value v) {
    if (auto arg = dyn_cast<BlockArgument>(v))
      return arg.getLoc();
    return v.getDefiningOp()->getLoc();
  }
  static std::string shapeStr(Type t) {
    std::string s;
    llvm::raw_string_ostream os(s);
    os << '[';
    llvm::interleaveComma(cast<RankedTensorType>(t).getShape(), os);
    os << ']';
    return s;
  }
  bool expectTensor(const Val &v, StringRef what) {
    if (v.isError())
      return false;
    if (!v.isTensor()) {
      error(v.loc) << what << " must be a tensor, not a number or string";
      return false;
    }
    return true;
  }

  MLIRContext *ctx;
  std::string file;
  OpBuilder b;
  unsigned errors = 0;

  PlanParser::ModelSectionContext *modelSec = nullptr;
  PlanParser::SettingsSectionContext *parallelSec = nullptr,
                                     *trainSec = nullptr;

  // Settings, once read.
  int64_t dp = 1;
  std::optional<int64_t> batch;
  int64_t steps = 0, seed = 0;
  std::string optimizer = "sgd";
  double lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0.0;
  std::string data = "synthetic";

  // Model state.
  ModuleOp module;
  func::FuncOp func;
  Block *body = nullptr;
  llvm::StringMap<Binding> env;
  std::optional<Value> loss;
  FlatSymbolRefAttr meshRef;
};

} // namespace

//===----------------------------------------------------------------------===//
// Settings
//===----------------------------------------------------------------------===//

void Sema::checkSettings(
    PlanParser::SettingsSectionContext *sec, ArrayRef<SettingSpec> specs,
    llvm::StringMap<std::pair<Val, PlanParser::SettingContext *>> &out) {
  SmallVector<StringRef> keys;
  for (const SettingSpec &s : specs)
    keys.push_back(s.key);
  for (PlanParser::SettingContext *set : sec->setting()) {
    std::string key = set->key->getText();
    const SettingSpec *spec = nullptr;
    for (const SettingSpec &s : specs)
      if (key == s.key)
        spec = &s;
    if (!spec) {
      error(loc(set->key)) << "unknown setting '" << key << "' in the "
                           << sec->kind->getText() << " section"
                           << suggest(key, keys)
                           << "; expected one of: " << llvm::join(keys, ", ");
      continue;
    }
    if (auto it = out.find(key); it != out.end()) {
      auto d = error(loc(set->key)) << "'" << key << "' is set twice";
      d.attachNote(loc(it->second.second->key)) << "first set here";
      continue;
    }
    Val v{{}, loc(set->expr())};
    if (spec->kind == SettingKind::Call) {
      // Checked by the reader of this setting.
      out.try_emplace(key, v, set);
      continue;
    }
    if (spec->kind == SettingKind::Name) {
      if (auto *n = dynamic_cast<PlanParser::NameExprContext *>(set->expr()))
        v.v = n->getText();
      else if (auto *s =
                   dynamic_cast<PlanParser::StringExprContext *>(set->expr())) {
        std::string t = s->getText();
        v.v = t.substr(1, t.size() - 2);
      } else
        error(v.loc) << "'" << key << "' expects a name (" << spec->help << ")";
    } else {
      v = eval(set->expr());
      if (!v.isError() && !v.isInt()) {
        error(v.loc) << "'" << key << "' must be an integer (" << spec->help
                     << ")";
        v.v = std::monostate();
      }
    }
    out.try_emplace(key, v, set);
  }
}

std::optional<int64_t> Sema::intSetting(
    llvm::StringMap<std::pair<Val, PlanParser::SettingContext *>> &s,
    StringRef key, std::optional<int64_t> dflt, int64_t min, Location where,
    StringRef section) {
  auto it = s.find(key);
  if (it == s.end()) {
    if (!dflt)
      error(where) << "the " << section << " section must set '" << key
                   << "', e.g. '" << key << " = " << std::max<int64_t>(min, 1)
                   << "'";
    return dflt;
  }
  Val &v = it->second.first;
  if (v.isError())
    return std::nullopt;
  if (v.getInt() < min) {
    error(v.loc) << "'" << key << "' must be at least " << min << ", got "
                 << v.getInt();
    return std::nullopt;
  }
  return v.getInt();
}

void Sema::readParallel() {
  llvm::StringMap<std::pair<Val, PlanParser::SettingContext *>> s;
  Location where = parallelSec ? loc(parallelSec) : UnknownLoc::get(ctx);
  if (parallelSec)
    checkSettings(parallelSec, kParallelSettings, s);
  dp = intSetting(s, "dp", 1, 1, where, "parallel").value_or(1);
  for (StringRef key : {"tp", "pp"}) {
    auto v = intSetting(s, key, 1, 1, where, "parallel");
    if (v && *v != 1)
      error(s.find(key)->second.first.loc)
          << key << " = " << *v
          << " is not supported by this version of planc: only data "
             "parallelism (dp) is implemented; set "
          << key << " = 1";
  }
  if (auto w = intSetting(s, "world", dp, 1, where, "parallel"); w && *w != dp)
    error(s.find("world")->second.first.loc)
        << "world = " << *w << " but dp * tp * pp = " << dp
        << "; the mesh must use every rank exactly once";
}

void Sema::readTrain() {
  llvm::StringMap<std::pair<Val, PlanParser::SettingContext *>> s;
  if (!trainSec) {
    error(modelSec ? loc(modelSec) : UnknownLoc::get(ctx))
        << "the plan has no train section; add one, e.g. 'train { batch = "
           "32  steps = 100  optimizer = sgd(lr = 0.05) }'";
    return;
  }
  Location where = loc(trainSec);
  checkSettings(trainSec, kTrainSettings, s);
  batch = intSetting(s, "batch", std::nullopt, 1, where, "train");
  steps = intSetting(s, "steps", std::nullopt, 0, where, "train").value_or(0);
  seed = intSetting(s, "seed", 0, 0, where, "train").value_or(0);
  if (auto it = s.find("data"); it != s.end() && it->second.first.isString()) {
    data = it->second.first.getString();
    if (data != "synthetic")
      error(it->second.first.loc)
          << "unknown data source '" << data
          << "'; this version of planc supports only 'synthetic'";
  }
  if (batch && *batch % dp != 0)
    error(s.find("batch")->second.first.loc)
        << "the global batch " << *batch << " is not divisible by dp = " << dp
        << ": every data-parallel rank needs the same number of samples; use "
           "a multiple of "
        << dp << ", e.g. " << (*batch / dp + 1) * dp;

  auto it = s.find("optimizer");
  if (it == s.end()) {
    error(where) << "the train section must set 'optimizer', e.g. "
                    "'optimizer = sgd(lr = 0.05)'";
    return;
  }
  auto *call =
      dynamic_cast<PlanParser::CallExprContext *>(it->second.second->expr());
  if (!call) {
    error(it->second.first.loc)
        << "'optimizer' expects sgd(lr = ...) or adamw(lr = ..., beta1 = ..., "
           "beta2 = ..., eps = ..., weight_decay = ...)";
    return;
  }
  optimizer = call->callee->getText();
  SmallVector<StringRef> known;
  if (optimizer == "sgd")
    known = {"lr"};
  else if (optimizer == "adamw")
    known = {"lr", "beta1", "beta2", "eps", "weight_decay"};
  else {
    error(loc(call->callee))
        << "unknown optimizer '" << optimizer << "'"
        << suggest(optimizer, {"sgd", "adamw"}) << "; expected sgd or adamw";
    return;
  }
  bool haveLr = false;
  for (PlanParser::ArgContext *a : call->arg()) {
    if (!a->key) {
      error(loc(a)) << "optimizer arguments are named, e.g. " << optimizer
                    << "(lr = 0.01)";
      continue;
    }
    std::string key = a->key->getText();
    if (!llvm::is_contained(known, key)) {
      error(loc(a->key)) << optimizer << " has no argument '" << key << "'"
                         << suggest(key, known)
                         << "; expected: " << llvm::join(known, ", ");
      continue;
    }
    Val v = eval(a->expr());
    if (v.isError())
      continue;
    if (!v.isNumber()) {
      error(v.loc) << "'" << key << "' must be a number";
      continue;
    }
    double x = v.getNumber();
    if (key == "lr") {
      haveLr = true;
      if (!(x > 0))
        error(v.loc) << "the learning rate must be > 0, got " << num(x);
      lr = x;
    } else if (key == "beta1" || key == "beta2") {
      if (!(x >= 0 && x < 1))
        error(v.loc) << key << " must be in [0, 1), got " << num(x);
      (key == "beta1" ? beta1 : beta2) = x;
    } else if (key == "eps") {
      if (!(x > 0))
        error(v.loc) << "eps must be > 0, got " << num(x);
      eps = x;
    } else {
      if (!(x >= 0))
        error(v.loc) << "weight_decay must be >= 0, got " << num(x);
      weightDecay = x;
    }
  }
  if (!haveLr)
    error(loc(call)) << optimizer << " needs a learning rate, e.g. "
                     << optimizer << "(lr = 0.01)";
}

//===----------------------------------------------------------------------===//
// Expressions
//===----------------------------------------------------------------------===//

Val Sema::evalArith(Location l, char op, Val lhs, Val rhs) {
  Val out{{}, l};
  if (lhs.isError() || rhs.isError())
    return out;
  if (lhs.isTensor() || rhs.isTensor()) {
    if (op != '+' || !lhs.isTensor() || !rhs.isTensor()) {
      error(l) << "operator '" << op
               << "' is not defined on tensors; tensors support '+' "
                  "(elementwise); use matmul(a, b) for products";
      return out;
    }
    Value a = lhs.getTensor(), c = rhs.getTensor();
    if (a.getType() != c.getType()) {
      auto d = error(l) << "cannot add tensors of shapes "
                        << shapeStr(a.getType()) << " and "
                        << shapeStr(c.getType());
      d.attachNote(defLoc(a)) << "the left operand, " << shapeStr(a.getType())
                              << ", comes from here";
      d.attachNote(defLoc(c)) << "the right operand, " << shapeStr(c.getType())
                              << ", comes from here";
      return out;
    }
    out.v = AddOp::create(b, l, a.getType(), a, c).getResult();
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
    return Val{{}, l};
  }
  if (auto *m = dynamic_cast<PlanParser::MulExprContext *>(e))
    return evalArith(loc(m->op), m->op->getText()[0], eval(m->lhs),
                     eval(m->rhs));
  if (auto *a = dynamic_cast<PlanParser::AddExprContext *>(e))
    return evalArith(loc(a->op), a->op->getText()[0], eval(a->lhs),
                     eval(a->rhs));
  if (auto *c = dynamic_cast<PlanParser::CallExprContext *>(e))
    return evalCall(c);
  if (auto *s = dynamic_cast<PlanParser::StringExprContext *>(e)) {
    std::string t = s->getText();
    return Val{t.substr(1, t.size() - 2), l};
  }
  if (auto *num = dynamic_cast<PlanParser::NumberExprContext *>(e)) {
    std::string t = num->getText();
    if (t.find_first_of(".eE") == std::string::npos) {
      int64_t v;
      if (StringRef(t).getAsInteger(10, v)) {
        error(l) << "integer " << t << " is too large";
        return Val{{}, l};
      }
      return Val{v, l};
    }
    double d = std::strtod(t.c_str(), nullptr);
    if (!std::isfinite(d)) {
      error(l) << "number " << t << " is out of range";
      return Val{{}, l};
    }
    return Val{d, l};
  }
  auto *n = dynamic_cast<PlanParser::NameExprContext *>(e);
  if (!n)
    return Val{{}, l};
  std::string name = n->getText();
  auto it = env.find(name);
  if (it == env.end()) {
    SmallVector<StringRef> known;
    for (auto &kv : env)
      known.push_back(kv.getKey());
    error(l) << "unknown name '" << name << "'" << suggest(name, known)
             << "; names must be defined before they are used";
    // Poison it so that later uses stay quiet.
    env.try_emplace(name, Binding{Val{{}, l}, l});
    return Val{{}, l};
  }
  Val v = it->second.val;
  v.loc = l;
  return v;
}

Val Sema::evalCall(PlanParser::CallExprContext *call) {
  Location l = loc(call);
  std::string fn = call->callee->getText();
  SmallVector<Val> args;
  bool bad = false;
  for (PlanParser::ArgContext *a : call->arg()) {
    if (a->key) {
      error(loc(a->key)) << "'" << fn << "' takes positional arguments only";
      bad = true;
    }
    args.push_back(eval(a->expr()));
    bad |= args.back().isError();
  }
  Val out{{}, l};
  static const char *const kLayers[] = {"linear", "matmul", "relu",
                                        "gelu",   "add",    "mse"};
  auto arity = [&](size_t lo, size_t hi, StringRef usage) {
    if (args.size() < lo || args.size() > hi) {
      error(l) << "'" << fn << "' takes " << usage << ", got " << args.size()
               << " argument" << (args.size() == 1 ? "" : "s");
      return false;
    }
    return true;
  };
  if (!llvm::is_contained(kLayers, fn)) {
    error(loc(call->callee))
        << "unknown function '" << fn << "'"
        << suggest(fn, {"linear", "matmul", "relu", "gelu", "add", "mse"})
        << "; this version of planc knows linear, matmul, relu, gelu, add and "
           "mse";
    return out;
  }
  if (bad)
    return out;
  for (auto [i, a] : llvm::enumerate(args))
    if (!expectTensor(a,
                      "argument " + std::to_string(i + 1) + " of '" + fn + "'"))
      return out;
  auto shapeOf = [](Value v) {
    return cast<RankedTensorType>(v.getType()).getShape();
  };
  auto matmul = [&](Value x, Value w) -> Value {
    auto xs = shapeOf(x), ws = shapeOf(w);
    if (xs.size() != 2 || ws.size() != 2) {
      auto d = error(l) << "'" << fn << "' needs 2-D operands, got "
                        << shapeStr(x.getType()) << " and "
                        << shapeStr(w.getType());
      return {};
    }
    if (xs[1] != ws[0]) {
      auto d = error(l) << "'" << fn << "': the input has " << xs[1]
                        << " features (shape " << shapeStr(x.getType())
                        << ") but the weight expects " << ws[0] << " (shape "
                        << shapeStr(w.getType()) << ")";
      d.attachNote(defLoc(x))
          << "the input, " << shapeStr(x.getType()) << ", comes from here";
      d.attachNote(defLoc(w))
          << "the weight, " << shapeStr(w.getType()) << ", is defined here";
      return {};
    }
    auto t = RankedTensorType::get({xs[0], ws[1]}, b.getF32Type());
    return MatmulOp::create(b, l, t, x, w, false, false);
  };

  if (fn == "linear") {
    if (!arity(2, 3, "an input, a weight and an optional bias"))
      return out;
    Value y = matmul(args[0].getTensor(), args[1].getTensor());
    if (!y)
      return out;
    if (args.size() == 3) {
      Value bias = args[2].getTensor();
      auto bs = shapeOf(bias);
      if (bs.size() != 1 || bs[0] != shapeOf(y)[1]) {
        auto d = error(args[2].loc)
                 << "the bias of 'linear' must have shape [" << shapeOf(y)[1]
                 << "] (one value per output feature), got "
                 << shapeStr(bias.getType());
        d.attachNote(defLoc(bias)) << "the bias is defined here";
        return out;
      }
      y = BiasAddOp::create(b, l, y.getType(), y, bias);
    }
    out.v = y;
  } else if (fn == "matmul") {
    if (!arity(2, 2, "two matrices"))
      return out;
    if (Value y = matmul(args[0].getTensor(), args[1].getTensor()))
      out.v = y;
  } else if (fn == "relu" || fn == "gelu") {
    if (!arity(1, 1, "one tensor"))
      return out;
    Value x = args[0].getTensor();
    out.v = fn == "relu" ? ReluOp::create(b, l, x.getType(), x).getResult()
                         : GeluOp::create(b, l, x.getType(), x).getResult();
  } else if (fn == "add") {
    if (!arity(2, 2, "two tensors"))
      return out;
    return evalArith(l, '+', args[0], args[1]);
  } else if (fn == "mse") {
    if (!arity(2, 2, "a prediction and a target"))
      return out;
    Value p = args[0].getTensor(), t = args[1].getTensor();
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
    out.v =
        MseLossOp::create(b, l, RankedTensorType::get({}, b.getF32Type()), p, t)
            .getResult();
  }
  return out;
}

//===----------------------------------------------------------------------===//
// Model
//===----------------------------------------------------------------------===//

void Sema::bind(antlr4::Token *name, Val v) {
  std::string n = name->getText();
  Location l = loc(name);
  if (n == "batch") {
    error(l) << "'batch' is reserved: it stands for the global batch size "
                "set in the train section";
    return;
  }
  auto [it, inserted] = env.try_emplace(n, Binding{v, l});
  if (!inserted) {
    auto d = error(l) << "'" << n << "' is already defined";
    d.attachNote(it->second.defLoc) << "previous definition is here";
  }
}

std::optional<RankedTensorType>
Sema::tensorType(PlanParser::TensorTypeContext *t, bool isData) {
  std::string dtype = t->dtype->getText();
  bool ok = true;
  if (dtype != "f32") {
    error(loc(t->dtype)) << "element type '" << dtype
                         << "' is not supported by this version of planc; "
                            "use f32";
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
  return RankedTensorType::get(shape, b.getF32Type());
}

std::optional<InitAttr> Sema::evalInit(PlanParser::ExprContext *e) {
  auto *call = dynamic_cast<PlanParser::CallExprContext *>(e);
  auto *name = dynamic_cast<PlanParser::NameExprContext *>(e);
  std::string kind = call   ? call->callee->getText()
                     : name ? name->getText()
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

void Sema::buildModel(PlanParser::ModelSectionContext *model) {
  Location l = loc(model->name);
  b.setInsertionPointToEnd(module.getBody());
  func = func::FuncOp::create(b, l, model->name->getText(),
                              b.getFunctionType({}, {}));
  func->setAttr(kModelAttr, b.getUnitAttr());
  body = func.addEntryBlock();
  b.setInsertionPointToStart(body);
  if (batch)
    env.try_emplace("batch", Binding{Val{*batch, l}, l});
  else // Reported with the train section; keep uses quiet.
    env.try_emplace("batch", Binding{Val{{}, l}, l});

  SmallVector<DictionaryAttr> argAttrs;
  Location lossLoc = l;
  for (PlanParser::ModelStmtContext *stmt : model->modelStmt()) {
    if (auto *d = dynamic_cast<PlanParser::DataDeclContext *>(stmt)) {
      auto type = tensorType(d->tensorType(), /*isData=*/true);
      if (!type) {
        bind(d->name, Val{{}, loc(d->name)});
        continue;
      }
      Value arg = body->addArgument(*type, loc(d->name));
      SmallVector<Attribute> dims(type->getRank(), b.getArrayAttr({}));
      dims[0] = b.getStrArrayAttr({"dp"});
      argAttrs.push_back(b.getDictionaryAttr(
          {b.getNamedAttr(kKindAttr, b.getStringAttr(d->role->getText())),
           b.getNamedAttr(kNameAttr, b.getStringAttr(d->name->getText())),
           b.getNamedAttr(kShardingAttr,
                          ShardingAttr::get(ctx, meshRef, b.getArrayAttr(dims),
                                            b.getArrayAttr({})))}));
      bind(d->name, Val{arg, loc(d->name)});
    } else if (auto *p = dynamic_cast<PlanParser::ParamDeclContext *>(stmt)) {
      auto type = tensorType(p->tensorType(), /*isData=*/false);
      std::optional<InitAttr> init =
          p->init ? evalInit(p->init) : InitAttr::get(ctx, "normal", 0, 0.02);
      if (!type || !init) {
        bind(p->name, Val{{}, loc(p->name)});
        continue;
      }
      Value arg = body->addArgument(*type, loc(p->name));
      argAttrs.push_back(b.getDictionaryAttr(
          {b.getNamedAttr(kKindAttr, b.getStringAttr("param")),
           b.getNamedAttr(kNameAttr, b.getStringAttr(p->name->getText())),
           b.getNamedAttr(kInitAttr, *init)}));
      bind(p->name, Val{arg, loc(p->name)});
    } else if (auto *let = dynamic_cast<PlanParser::LetStmtContext *>(stmt)) {
      Val v = eval(let->expr());
      bind(let->name, v);
    } else if (auto *ls = dynamic_cast<PlanParser::LossStmtContext *>(stmt)) {
      if (loss) {
        auto d = error(loc(ls)) << "the model has more than one loss";
        d.attachNote(lossLoc) << "the first loss is here";
        continue;
      }
      lossLoc = loc(ls);
      Val v = eval(ls->expr());
      if (v.isError()) {
        loss = Value();
        continue;
      }
      if (!v.isTensor() || !v.getTensor().getDefiningOp<MseLossOp>()) {
        error(v.loc) << "the loss must be a loss function of the model's "
                        "output and label, e.g. 'loss mse(out, y)'";
        loss = Value();
        continue;
      }
      loss = v.getTensor();
    }
  }
  if (!loss)
    error(loc(model->getStop()))
        << "the model has no loss; end it with e.g. 'loss mse(out, y)'";

  // Counted on the source, so a parameter whose declaration failed does not
  // also trigger this error.
  bool hasParam = llvm::any_of(model->modelStmt(), [](auto *stmt) {
    return dynamic_cast<PlanParser::ParamDeclContext *>(stmt) != nullptr;
  });
  if (!hasParam)
    error(l) << "the model has no parameters, so there is nothing to train";

  func.setType(b.getFunctionType(body->getArgumentTypes(),
                                 loss && *loss ? TypeRange((*loss).getType())
                                               : TypeRange()));
  func.setAllArgAttrs(argAttrs);
  b.setInsertionPointToEnd(body);
  if (loss && *loss)
    func::ReturnOp::create(b, lossLoc, *loss);
  else
    func::ReturnOp::create(b, lossLoc);
}

OwningOpRef<ModuleOp> Sema::run(PlanParser::FileContext *tree) {
  // Sections: one model, at most one of each settings section.
  for (PlanParser::SectionContext *sec : tree->section()) {
    if (auto *m = sec->modelSection()) {
      if (modelSec) {
        auto d = error(loc(m)) << "a plan file holds one model";
        d.attachNote(loc(modelSec)) << "the first model is here";
        continue;
      }
      modelSec = m;
      continue;
    }
    auto *s = sec->settingsSection();
    auto *&slot = s->kind->getText() == "parallel" ? parallelSec : trainSec;
    if (slot) {
      auto d = error(loc(s))
               << "the " << s->kind->getText() << " section appears twice";
      d.attachNote(loc(slot)) << "the first one is here";
      continue;
    }
    slot = s;
  }
  if (!modelSec) {
    error(FileLineColLoc::get(ctx, file, 1, 1))
        << "the plan has no model; start with e.g. 'model mlp { ... }'";
    return nullptr;
  }

  OwningOpRef<ModuleOp> owned =
      ModuleOp::create(loc(modelSec), modelSec->name->getText());
  module = *owned;
  readParallel();
  readTrain();

  b.setInsertionPointToEnd(module.getBody());
  Location ploc = parallelSec ? loc(parallelSec) : loc(modelSec);
  auto mesh = MeshOp::create(b, ploc, "mesh", b.getStrArrayAttr({"dp"}),
                             b.getDenseI64ArrayAttr({dp}));
  meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());
  TrainOp::create(b, trainSec ? loc(trainSec) : loc(modelSec),
                  b.getI64IntegerAttr(steps), b.getI64IntegerAttr(seed),
                  b.getI64IntegerAttr(batch.value_or(1)), b.getStringAttr(data),
                  b.getStringAttr(optimizer), b.getF64FloatAttr(lr),
                  b.getF64FloatAttr(beta1), b.getF64FloatAttr(beta2),
                  b.getF64FloatAttr(eps), b.getF64FloatAttr(weightDecay));
  buildModel(modelSec);
  if (errors)
    return nullptr;
  return owned;
}

/// Rejects input that would make the parser or the semantic pass misbehave:
/// bytes that are not UTF-8 (ANTLR throws on them) and brackets nested so
/// deeply that recursive descent would exhaust the stack.
static bool checkInput(StringRef text, StringRef file, MLIRContext *ctx) {
  constexpr size_t kMaxBytes = 16u << 20;
  constexpr int kMaxDepth = 200;
  if (text.size() > kMaxBytes) {
    mlir::emitError(FileLineColLoc::get(ctx, file, 1, 1))
        << "the file is " << text.size() << " bytes; plans are limited to "
        << kMaxBytes << " bytes";
    return false;
  }
  unsigned line = 1, col = 1;
  int depth = 0;
  for (size_t i = 0; i < text.size();) {
    const auto *p = reinterpret_cast<const llvm::UTF8 *>(text.data() + i);
    unsigned len = llvm::getNumBytesForUTF8(*p);
    if (i + len > text.size() || !llvm::isLegalUTF8Sequence(p, p + len)) {
      mlir::emitError(FileLineColLoc::get(ctx, file, line, col))
          << "the file is not valid UTF-8 (byte 0x"
          << llvm::utohexstr(uint8_t(text[i])) << "); save it as UTF-8 text";
      return false;
    }
    char c = text[i];
    if (c == '(' || c == '[' || c == '{') {
      if (++depth > kMaxDepth) {
        mlir::emitError(FileLineColLoc::get(ctx, file, line, col))
            << "brackets are nested more than " << kMaxDepth
            << " deep; split the expression into named steps";
        return false;
      }
    } else if (c == ')' || c == ']' || c == '}') {
      depth = std::max(0, depth - 1);
    }
    if (c == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
    i += len;
  }
  return true;
}

static OwningOpRef<ModuleOp> importOnThisThread(llvm::SourceMgr &sourceMgr,
                                                MLIRContext *context) {
  const llvm::MemoryBuffer *buf =
      sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
  StringRef file = buf->getBufferIdentifier();
  if (!checkInput(buf->getBuffer(), file, context))
    return nullptr;
  try {
    antlr4::ANTLRInputStream input(buf->getBufferStart(), buf->getBufferSize());
    PlanLexer lexer(&input);
    ErrorListener listener(context, file);
    lexer.removeErrorListeners();
    lexer.addErrorListener(&listener);
    antlr4::CommonTokenStream tokens(&lexer);
    PlanParser parser(&tokens);
    parser.removeErrorListeners();
    parser.addErrorListener(&listener);
    PlanParser::FileContext *tree = parser.file();
    if (listener.errors)
      return nullptr;
    Sema sema(context, file);
    return sema.run(tree);
  } catch (const std::exception &e) {
    // ANTLR reports problems by throwing; none may escape as a crash.
    mlir::emitError(FileLineColLoc::get(context, file, 1, 1))
        << "the parser failed: " << e.what();
    return nullptr;
  }
}

OwningOpRef<ModuleOp> planc::importPlan(llvm::SourceMgr &sourceMgr,
                                        MLIRContext *context) {
  context->loadDialect<PlanDialect, func::FuncDialect>();
  // Parse trees of long operator chains are deep and both ANTLR and the
  // semantic pass recurse over them: run on a thread with a large stack.
  constexpr unsigned kStackBytes = 512u << 20;
  OwningOpRef<ModuleOp> result;
  llvm::thread worker(std::optional<unsigned>(kStackBytes),
                      [&] { result = importOnThisThread(sourceMgr, context); });
  worker.join();
  return result;
}
