//===- Sema.h - Semantic analysis of .plan files ----------------*- C++ -*-===//
//
// The parse trees of a plan file and its imports are walked once, in source
// order. Names are bound as they are defined, so every use refers to an
// earlier definition; inputs and parameters become arguments of the model
// function as they are declared; blocks are inlined at each call (and each
// repeat iteration), with call-site locations. Errors do not stop the walk: a
// failed definition binds its name to a poisoned value so later uses stay
// quiet, and every independent mistake in a file is reported.
//===----------------------------------------------------------------------===//
#ifndef PLANC_LIB_FRONTEND_SEMA_H
#define PLANC_LIB_FRONTEND_SEMA_H

#include "PlanParser.h"
#include "dialects/plan/PlanDialect.h"

#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/StringMap.h"

#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace planc::frontend {

using plan::kLayerAttr;

/// A list of numbers, e.g. `[0.9, 0.95]`.
struct NumList {
  std::vector<double> values;
  bool allInts = true;
};

/// The value of an expression: a number, a string, a tensor, a list of
/// numbers, or nothing (an error was already reported).
struct Val {
  std::variant<std::monostate, int64_t, double, std::string, mlir::Value,
               NumList>
      v;
  mlir::Location loc;

  bool isError() const { return v.index() == 0; }
  bool isInt() const { return v.index() == 1; }
  bool isNumber() const { return v.index() == 1 || v.index() == 2; }
  bool isString() const { return v.index() == 3; }
  bool isTensor() const { return v.index() == 4; }
  bool isList() const { return v.index() == 5; }
  int64_t getInt() const { return std::get<1>(v); }
  double getNumber() const {
    return isInt() ? double(std::get<1>(v)) : std::get<2>(v);
  }
  const std::string &getString() const { return std::get<3>(v); }
  mlir::Value getTensor() const { return std::get<4>(v); }
  const NumList &getList() const { return std::get<5>(v); }
  static Val error(mlir::Location l) { return Val{{}, l}; }
};

/// A named entity: its value and where it was defined. Computed tensors may
/// be rebound (`x = x + attention(...)`); constants, inputs and parameters
/// may not.
struct Binding {
  Val val;
  mlir::Location defLoc;
  bool rebindable = false;
};

/// One `key = value` of a settings section, after its value was evaluated.
struct Setting {
  Val val;
  PlanParser::SettingContext *ctx;
};
using Settings = llvm::StringMap<Setting>;

/// Parallel settings (section `parallel`), after checking.
struct ParallelPlan {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1;
  /// Expert parallelism: the experts split over `ep` ranks, which are
  /// data-parallel ranks for everything else (the batch splits over dp * ep).
  int64_t ep = 1;
  /// Context parallelism's exchange: "" (the compiler chooses),
  /// "all_to_all", "all_gather" or "ring".
  std::string cpComm;
  /// Expert parallelism's token exchange: "" (all_to_all) or "all_gather".
  std::string epComm;
  std::vector<std::string> order = {"pp", "dp", "ep", "cp", "tp"};
  bool sequenceParallel = false;
  std::string schedule = "1f1b";
  int64_t microbatches = 1;
  bool microbatchesSet = false;
  int64_t virtualStages = 1;
  std::vector<int64_t> stageBoundaries;
  int64_t zeroStage = 0;
  double bucketMB = 25.0;
  std::string recompute = "none";
  std::string tensorPolicy = "none";
  bool padVocab = false;
  bool padVocabSet = false; // written in the plan (else the target's default)
  int64_t world() const { return dp * ep * cp * tp * pp; }
  /// The ranks that split the batch.
  int64_t dataRanks() const { return dp * ep; }
  /// "dp * tp * pp" with ep and cp where they are used, for messages;
  /// `values` adds " = 2 * 1 * 4" (each axis's size).
  std::string axesProduct(bool values = false) const {
    std::string names = "dp", sizes = std::to_string(dp);
    auto add = [&](const char *n, int64_t v) {
      names += std::string(" * ") + n;
      sizes += " * " + std::to_string(v);
    };
    if (ep > 1)
      add("ep", ep);
    if (cp > 1)
      add("cp", cp);
    add("tp", tp);
    add("pp", pp);
    return values ? names + " = " + sizes : names;
  }
  std::optional<mlir::Location> tpLoc, ppLoc, dpLoc, cpLoc, epLoc, cpCommLoc,
      virtualLoc, zeroLoc, microLoc, boundariesLoc;
};

/// Training settings (section `train`), after checking.
struct TrainPlan {
  std::optional<int64_t> batch, microBatch;
  int64_t steps = 0, seed = 0;
  std::string precision = "fp32", lossScale = "none";
  std::string optimizer = "sgd";
  double lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weightDecay = 0;
  std::optional<double> gradClip, minLr;
  std::string lrSchedule = "constant";
  int64_t warmupSteps = 0;
  std::optional<int64_t> decaySteps;
  std::string data = "synthetic";
  std::optional<std::string> dataPath, checkpointDir;
  int64_t checkpointEvery = 0;
  std::optional<mlir::Location> batchLoc, microLoc;
};

/// One parsed file: its tree and where it came from.
struct SourceFile {
  std::string path;
  PlanParser::FileContext *tree;
};

class Sema {
public:
  Sema(mlir::MLIRContext *ctx);

  /// Checks the files (imports first, the main file last) and builds the
  /// module, or returns null after reporting every error.
  mlir::OwningOpRef<mlir::ModuleOp> run(llvm::ArrayRef<SourceFile> files);

  unsigned numErrors() const { return errors; }

  /// ImportOptions::maxRepeat: > 0 caps each top-level repeat's count.
  int64_t maxRepeat = 0;
  /// ImportOptions::target.
  std::string target = "host";

private:
  friend class SemaScope;
  // --- diagnostics (Sema.cpp) ----------------------------------------------
  mlir::Location loc(antlr4::Token *t);
  mlir::Location loc(antlr4::ParserRuleContext *c) {
    return loc(c->getStart());
  }
  mlir::InFlightDiagnostic error(mlir::Location l) {
    ++errors;
    return mlir::emitError(l);
  }
  mlir::InFlightDiagnostic warning(mlir::Location l) {
    return mlir::emitWarning(l);
  }
  static std::string suggest(llvm::StringRef name,
                             llvm::ArrayRef<llvm::StringRef> known);
  static std::string shapeStr(mlir::Type t);
  static std::string unquote(llvm::StringRef quoted);
  mlir::Location defLoc(mlir::Value v);

  // --- settings (Settings.cpp) ---------------------------------------------
  void readSettings(PlanParser::SettingsSectionContext *sec,
                    llvm::ArrayRef<llvm::StringRef> keys, Settings &out);
  std::optional<int64_t> intSetting(Settings &s, llvm::StringRef key,
                                    int64_t min, int64_t max = INT64_MAX);
  std::optional<double> numberSetting(Settings &s, llvm::StringRef key,
                                      double min, bool inclusive);
  std::optional<std::string>
  nameSetting(Settings &s, llvm::StringRef key,
              llvm::ArrayRef<llvm::StringRef> allowed);
  std::optional<bool> boolSetting(Settings &s, llvm::StringRef key);
  void readParallel();
  void readTrain();
  void readOptimizer(PlanParser::CallExprContext *call);
  void readLrSchedule(Setting &s);
  void readCluster();
  void checkPlan(mlir::Location modelLoc);

  // --- expressions and the model (Sema.cpp) --------------------------------
  void buildModel(PlanParser::ModelSectionContext *model);
  void runStmts(const std::vector<PlanParser::StmtContext *> &stmts,
                bool inBlock, std::optional<Val> *ret);
  void bind(antlr4::Token *name, Val v, bool rebindable = false);
  Val lookup(llvm::StringRef name, mlir::Location use);
  std::optional<mlir::RankedTensorType>
  tensorType(PlanParser::TensorTypeContext *t, bool isData);
  std::optional<plan::ShardingAttr>
  shardSpec(PlanParser::ShardSpecContext *spec, mlir::RankedTensorType type,
            llvm::StringRef what);
  Val eval(PlanParser::ExprContext *e);
  Val evalArith(mlir::Location l, char op, Val lhs, Val rhs);
  std::optional<plan::InitAttr> evalInit(PlanParser::ExprContext *e);
  mlir::Value declareArg(mlir::RankedTensorType type, mlir::Location l,
                         llvm::StringRef kind, llvm::StringRef name,
                         llvm::ArrayRef<mlir::NamedAttribute> extra);

  // --- calls: built-in layers and blocks (Layers.cpp) ----------------------
  struct Args {
    llvm::SmallVector<Val> positional;
    llvm::SmallVector<std::pair<std::string, Val>> named;
    llvm::SmallVector<mlir::Location> namedLocs;
  };
  Val evalCall(PlanParser::CallExprContext *call);
  Val evalRepeat(PlanParser::RepeatExprContext *rep);
  Args evalArgs(const std::vector<PlanParser::ArgContext *> &args, bool &bad);
  Val callBlock(PlanParser::BlockDeclContext *block, Args &args,
                mlir::Location callLoc);
  Val callBuiltin(llvm::StringRef fn, Args &args, mlir::Location l,
                  mlir::Location calleeLoc);
  static bool isBuiltin(llvm::StringRef fn);
  /// Declares batch_norm's running mean and variance (state arguments named
  /// after the scale parameter `gamma`); fails with a diagnostic when the
  /// scale is not a parameter or the names are taken.
  mlir::FailureOr<std::pair<mlir::Value, mlir::Value>>
  runningStats(mlir::Value gamma, mlir::Location gammaLoc, mlir::Location use);
  /// The per-expert bias of a moe layer's balancing (bias_update), named
  /// after its router; a failure is reported.
  mlir::FailureOr<mlir::Value> expertBias(mlir::Value router, int64_t experts,
                                          mlir::Location use);
  mlir::Value linear(mlir::Location l, mlir::Value x, mlir::Value w,
                     mlir::Value bias, bool transposeW, llvm::StringRef what);
  /// Checks that the megatron policy can split a parameter along `dim`
  /// (plan-seed-sharding makes the split).
  void seedSharding(mlir::Value param, int64_t dim, mlir::Location use);
  bool checkTpDivides(int64_t n, llvm::StringRef what, mlir::Location l);
  /// Context parallelism's constraints on an attention layer: the sequence
  /// (seq positions) splits into 2 cp chunks, and each rank's key/value
  /// heads (kv, before tp) split over cp (the all-to-all exchange).
  bool checkCp(int64_t seq, int64_t kv, mlir::Location l);
  /// Padded vocabulary sizes (pad_vocab) -> the real vocabulary.
  llvm::DenseMap<int64_t, int64_t> paddedVocab;
  /// Dropout ops made so far: each gets its own mask (uid).
  int64_t dropoutCount = 0;

  mlir::MLIRContext *ctx;
  mlir::OpBuilder b;
  unsigned errors = 0;

  // Items of all files.
  PlanParser::ModelSectionContext *modelSec = nullptr;
  PlanParser::SettingsSectionContext *parallelSec = nullptr,
                                     *trainSec = nullptr, *clusterSec = nullptr;
  llvm::StringMap<PlanParser::BlockDeclContext *> blocks;

  ParallelPlan par;
  TrainPlan train;
  struct Cluster {
    int64_t nodes = 0, gpusPerNode = 0;
    std::string gpu;
    // Unset: the GPU kind's usual links (CostModel/TimeModel.cpp).
    std::optional<double> intraGBps, interGBps;
    std::optional<mlir::Location> loc;
  } cluster;

  // Model state.
  mlir::ModuleOp module;
  mlir::func::FuncOp func;
  mlir::Block *body = nullptr;
  std::vector<llvm::StringMap<Binding>> scopes; // [0] = top-level constants
  std::vector<mlir::Location> callers;          // call sites of inlined blocks
  /// Each token source's file name, made once (loc() is called per token
  /// of every inlined layer, and ANTLR returns the name as a new string).
  llvm::DenseMap<antlr4::TokenSource *, mlir::StringAttr> sourceNames;
  std::string paramPrefix;                     // "block.3." inside blocks
  llvm::StringMap<int64_t> instanceCount;      // per prefix + block name
  llvm::StringMap<mlir::Location> paramNames;  // full names, for clashes
  llvm::StringMap<mlir::Location> bufferNames; // running statistics, alike
  /// "<prefix><block>.<i>." for the next instance of `block` here.
  std::string nextInstancePrefix(llvm::StringRef block);
  std::optional<int64_t> layer; // repeat iteration, if any
  int64_t numLayers = 0;
  int64_t numInstances = 0;  // blocks inlined so far (calls and repeats)
  int64_t numParamDecls = 0; // param statements run, including failed ones
  llvm::SmallVector<mlir::DictionaryAttr> argAttrs;
  std::optional<mlir::Value> loss;
  mlir::FlatSymbolRefAttr meshRef;
  llvm::SmallVector<llvm::StringRef> meshAxes; // axes of size > 1, plus dp
};

} // namespace planc::frontend

#endif
