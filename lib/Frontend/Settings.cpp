//===- Settings.cpp - The parallel, train and cluster sections ------------===//
#include "Sema.h"

#include "llvm/ADT/StringExtras.h"

#include <cmath>
#include <cstdio>

using namespace mlir;
using namespace planc;
using namespace planc::frontend;

/// A number as a person would write it (0.1, not 1.000000e-01).
static std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

/// Settings whose value is a name or a call: evaluated by their reader.
static bool takesRawValue(StringRef key) {
  return llvm::is_contained({"order", "schedule", "recompute", "tensor",
                             "sequence_parallel", "pad_vocab", "optimizer",
                             "cp_comm", "ep_comm", "lr_schedule", "data",
                             "precision", "loss_scale", "gpu"},
                            key);
}

void Sema::readSettings(PlanParser::SettingsSectionContext *sec,
                        ArrayRef<StringRef> keys, Settings &out) {
  for (PlanParser::SettingContext *set : sec->setting()) {
    std::string key = set->key->getText();
    if (!llvm::is_contained(keys, key)) {
      error(loc(set->key)) << "unknown setting '" << key << "' in the "
                           << sec->kind->getText() << " section"
                           << suggest(key, keys)
                           << "; expected one of: " << llvm::join(keys, ", ");
      continue;
    }
    if (auto it = out.find(key); it != out.end()) {
      auto d = error(loc(set->key)) << "'" << key << "' is set twice";
      d.attachNote(loc(it->second.ctx->key)) << "first set here";
      continue;
    }
    Val v = takesRawValue(key) ? Val{{}, loc(set->expr())} : eval(set->expr());
    out.try_emplace(key, Setting{v, set});
  }
}

/// The name or string a setting was given (`schedule = 1f1b` is not a name,
/// so every raw value is taken by its text).
static std::optional<std::string> rawName(PlanParser::ExprContext *e) {
  if (auto *n = dynamic_cast<PlanParser::NameExprContext *>(e))
    return n->getText();
  if (auto *s = dynamic_cast<PlanParser::StringExprContext *>(e)) {
    std::string t = s->getText();
    return t.substr(1, t.size() - 2);
  }
  return std::nullopt;
}

std::optional<int64_t> Sema::intSetting(Settings &s, StringRef key, int64_t min,
                                        int64_t max) {
  auto it = s.find(key);
  if (it == s.end())
    return std::nullopt;
  Val &v = it->second.val;
  if (v.isError())
    return std::nullopt;
  if (!v.isInt()) {
    error(v.loc) << "'" << key << "' must be an integer";
    return std::nullopt;
  }
  if (v.getInt() < min) {
    error(v.loc) << "'" << key << "' must be at least " << min << ", got "
                 << v.getInt();
    return std::nullopt;
  }
  if (v.getInt() > max) {
    error(v.loc) << "'" << key << "' must be at most " << max << ", got "
                 << v.getInt();
    return std::nullopt;
  }
  return v.getInt();
}

std::optional<double> Sema::numberSetting(Settings &s, StringRef key,
                                          double min, bool inclusive) {
  auto it = s.find(key);
  if (it == s.end())
    return std::nullopt;
  Val &v = it->second.val;
  if (v.isError())
    return std::nullopt;
  if (!v.isNumber()) {
    error(v.loc) << "'" << key << "' must be a number";
    return std::nullopt;
  }
  double x = v.getNumber();
  if (inclusive ? x < min : x <= min) {
    error(v.loc) << "'" << key << "' must be " << (inclusive ? ">= " : "> ")
                 << num(min) << ", got " << num(x);
    return std::nullopt;
  }
  return x;
}

std::optional<std::string> Sema::nameSetting(Settings &s, StringRef key,
                                             ArrayRef<StringRef> allowed) {
  auto it = s.find(key);
  if (it == s.end())
    return std::nullopt;
  std::optional<std::string> name = rawName(it->second.ctx->expr());
  if (!name || (!allowed.empty() && !llvm::is_contained(allowed, *name))) {
    error(it->second.val.loc)
        << "'" << key << "' must be one of: " << llvm::join(allowed, ", ")
        << (name ? suggest(*name, allowed) : std::string());
    return std::nullopt;
  }
  return name;
}

std::optional<bool> Sema::boolSetting(Settings &s, StringRef key) {
  auto v = nameSetting(s, key, {"true", "false"});
  return v ? std::optional<bool>(*v == "true") : std::nullopt;
}

//===----------------------------------------------------------------------===//
// parallel
//===----------------------------------------------------------------------===//

/// Mesh axes, microbatches, virtual stages and cluster sizes are at most
/// 2^20 each, so that products of three of them (dp * tp * pp) cannot
/// overflow.
static constexpr int64_t kMaxCount = int64_t(1) << 20;

/// A list element as an integer, if it is one that fits in int64_t.
static std::optional<int64_t> listInt(double x) {
  if (!(x >= -9.0e18 && x <= 9.0e18) || x != std::trunc(x))
    return std::nullopt;
  return int64_t(x);
}

void Sema::readParallel() {
  if (!parallelSec)
    return;
  Settings s;
  readSettings(parallelSec,
               {"dp", "tp", "pp", "cp", "ep", "cp_comm", "ep_comm", "world",
                "order", "sequence_parallel", "schedule", "microbatches",
                "virtual_stages", "stage_boundaries", "zero", "bucket_mb",
                "recompute", "tensor", "pad_vocab"},
               s);
  auto at = [&](StringRef key) { return s.find(key)->second.val.loc; };
  if (auto v = intSetting(s, "dp", 1, kMaxCount)) {
    par.dp = *v;
    par.dpLoc = at("dp");
  }
  if (auto v = intSetting(s, "tp", 1, kMaxCount)) {
    par.tp = *v;
    par.tpLoc = at("tp");
  }
  if (auto v = intSetting(s, "pp", 1, kMaxCount)) {
    par.pp = *v;
    par.ppLoc = at("pp");
  }
  if (auto v = intSetting(s, "cp", 1, kMaxCount)) {
    par.cp = *v;
    par.cpLoc = at("cp");
  }
  if (auto v = intSetting(s, "ep", 1, kMaxCount)) {
    par.ep = *v;
    par.epLoc = at("ep");
  }
  if (auto v =
          nameSetting(s, "cp_comm", {"all_to_all", "all_gather", "ring"})) {
    par.cpComm = *v;
    par.cpCommLoc = at("cp_comm");
  }
  if (par.cp == 1 && par.cpCommLoc)
    error(*par.cpCommLoc) << "cp_comm chooses how context parallelism "
                             "exchanges keys and values, but cp = 1; set "
                             "cp > 1 or remove cp_comm";
  if (auto v = nameSetting(s, "ep_comm", {"all_to_all", "all_gather"})) {
    par.epComm = *v;
    if (par.ep == 1)
      error(at("ep_comm")) << "ep_comm chooses how expert parallelism moves "
                              "tokens to their experts, but ep = 1; set "
                              "ep > 1 or remove ep_comm";
  }
  if (auto w = intSetting(s, "world", 1); w && *w != par.world()) {
    auto diag = error(at("world"));
    diag << "world = " << *w << " but " << par.axesProduct(true) << " = "
         << par.world() << "; the mesh must use every rank exactly once";
  }
  if (auto it = s.find("order"); it != s.end()) {
    auto *list =
        dynamic_cast<PlanParser::ListExprContext *>(it->second.ctx->expr());
    std::vector<std::string> order;
    if (list)
      for (PlanParser::ExprContext *e : list->expr())
        if (auto n = rawName(e))
          order.push_back(*n);
    std::vector<std::string> sorted = order;
    llvm::sort(sorted);
    // cp and ep may be left out: cp then sits just outside tp, and ep just
    // inside dp.
    bool withCp = llvm::is_contained(sorted, "cp"),
         withEp = llvm::is_contained(sorted, "ep");
    std::vector<std::string> want = {"dp", "pp", "tp"};
    if (withCp)
      want.push_back("cp");
    if (withEp)
      want.push_back("ep");
    llvm::sort(want);
    if (!list || sorted != want) {
      error(it->second.val.loc)
          << "'order' lists the mesh axes dp, tp and pp (and optionally cp "
             "and ep) once each, outermost first, e.g. 'order = [pp, dp, ep, "
             "cp, tp]' (the last one varies fastest and stays within a node)";
    } else {
      if (!withCp)
        order.insert(llvm::find(order, "tp"), "cp");
      if (!withEp)
        order.insert(llvm::find(order, "dp") + 1, "ep");
      // The batch splits over dp, then within each dp block over ep: a
      // rank's samples follow its coordinates in mesh order.
      if (llvm::find(order, "ep") < llvm::find(order, "dp"))
        error(it->second.val.loc)
            << "'order' puts ep outside dp; expert-parallel ranks split each "
               "data-parallel rank's samples, so ep comes after dp, e.g. "
               "'order = [pp, dp, ep, tp]'";
      else
        par.order = order;
    }
  }
  if (auto v = boolSetting(s, "sequence_parallel"))
    par.sequenceParallel = *v;
  if (auto v = nameSetting(
          s, "schedule", {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"}))
    par.schedule = *v;
  if (auto v = intSetting(s, "microbatches", 1, kMaxCount)) {
    par.microbatches = *v;
    par.microbatchesSet = true;
    par.microLoc = at("microbatches");
  }
  if (auto v = intSetting(s, "virtual_stages", 1, kMaxCount)) {
    par.virtualStages = *v;
    par.virtualLoc = at("virtual_stages");
    if (*v > 1 && par.schedule != "interleaved_1f1b")
      error(at("virtual_stages"))
          << "virtual_stages = " << *v << " needs the interleaved schedule; "
          << "set schedule = interleaved_1f1b (the " << par.schedule
          << " schedule runs one stage per rank)";
  }
  if (auto it = s.find("stage_boundaries"); it != s.end()) {
    Val &v = it->second.val;
    par.boundariesLoc = v.loc;
    if (!v.isError() && (!v.isList() || !v.getList().allInts))
      error(v.loc) << "'stage_boundaries' is a list of layer indices where "
                      "stages start, e.g. [6, 12, 18]";
    else if (!v.isError()) {
      int64_t prev = 0;
      for (double x : v.getList().values) {
        std::optional<int64_t> i = listInt(x);
        if (!i || *i <= prev) {
          error(v.loc) << "stage boundaries must be increasing layer indices "
                          "above 0";
          par.stageBoundaries.clear();
          break;
        }
        prev = *i;
        par.stageBoundaries.push_back(prev);
      }
    }
  }
  if (auto v = intSetting(s, "zero", 0)) {
    par.zeroLoc = at("zero");
    if (*v > 3)
      error(at("zero")) << "ZeRO stages are 0 to 3, got " << *v;
    else
      par.zeroStage = *v;
  }
  if (auto v = numberSetting(s, "bucket_mb", 0, /*inclusive=*/false))
    par.bucketMB = *v;
  if (auto v = nameSetting(s, "recompute", {"none", "selective", "full"}))
    par.recompute = *v;
  if (auto v = nameSetting(s, "tensor", {"none", "megatron"}))
    par.tensorPolicy = *v;
  if (auto v = boolSetting(s, "pad_vocab")) {
    par.padVocab = *v;
    par.padVocabSet = true;
  }
  if (par.sequenceParallel && par.tp == 1)
    error(at("sequence_parallel"))
        << "sequence parallelism splits the activations that tensor "
           "parallelism leaves replicated, so it needs tp > 1";
}

//===----------------------------------------------------------------------===//
// train
//===----------------------------------------------------------------------===//

void Sema::readOptimizer(PlanParser::CallExprContext *call) {
  train.optimizer = call->callee->getText();
  SmallVector<StringRef> known;
  if (train.optimizer == "sgd")
    known = {"lr"};
  else if (train.optimizer == "adamw")
    known = {"lr", "betas", "beta1", "beta2", "eps", "weight_decay"};
  else {
    error(loc(call->callee)) << "unknown optimizer '" << train.optimizer << "'"
                             << suggest(train.optimizer, {"sgd", "adamw"})
                             << "; expected sgd or adamw";
    return;
  }
  bool haveLr = false;
  for (PlanParser::ArgContext *a : call->arg()) {
    if (!a->key) {
      error(loc(a)) << "optimizer arguments are named, e.g. " << train.optimizer
                    << "(lr = 0.01)";
      continue;
    }
    std::string key = a->key->getText();
    if (!llvm::is_contained(known, key)) {
      error(loc(a->key)) << train.optimizer << " has no argument '" << key
                         << "'" << suggest(key, known)
                         << "; expected: " << llvm::join(known, ", ");
      continue;
    }
    Val v = eval(a->expr());
    if (v.isError())
      continue;
    if (key == "betas") {
      if (!v.isList() || v.getList().values.size() != 2) {
        error(v.loc) << "'betas' is a pair, e.g. betas = [0.9, 0.95]";
        continue;
      }
      for (int i = 0; i < 2; ++i) {
        double x = v.getList().values[i];
        if (!(x >= 0 && x < 1))
          error(v.loc) << "betas must be in [0, 1), got " << num(x);
        (i == 0 ? train.beta1 : train.beta2) = x;
      }
      continue;
    }
    if (!v.isNumber()) {
      error(v.loc) << "'" << key << "' must be a number";
      continue;
    }
    double x = v.getNumber();
    if (key == "lr") {
      haveLr = true;
      if (!(x > 0))
        error(v.loc) << "the learning rate must be > 0, got " << num(x);
      train.lr = x;
    } else if (key == "beta1" || key == "beta2") {
      if (!(x >= 0 && x < 1))
        error(v.loc) << key << " must be in [0, 1), got " << num(x);
      (key == "beta1" ? train.beta1 : train.beta2) = x;
    } else if (key == "eps") {
      if (!(x > 0))
        error(v.loc) << "eps must be > 0, got " << num(x);
      train.eps = x;
    } else {
      if (!(x >= 0))
        error(v.loc) << "weight_decay must be >= 0, got " << num(x);
      train.weightDecay = x;
    }
  }
  if (!haveLr)
    error(loc(call)) << train.optimizer << " needs a learning rate, e.g. "
                     << train.optimizer << "(lr = 0.01)";
}

void Sema::readLrSchedule(Setting &s) {
  PlanParser::ExprContext *e = s.ctx->expr();
  if (auto n = rawName(e); n && *n == "constant") {
    train.lrSchedule = "constant";
    return;
  }
  auto *call = dynamic_cast<PlanParser::CallExprContext *>(e);
  if (!call || call->callee->getText() != "cosine") {
    error(s.val.loc) << "'lr_schedule' is constant or cosine(warmup = N, "
                        "min_lr = x, decay_steps = N)";
    return;
  }
  train.lrSchedule = "cosine";
  for (PlanParser::ArgContext *a : call->arg()) {
    std::string key = a->key ? a->key->getText() : "";
    if (!llvm::is_contained({"warmup", "min_lr", "decay_steps"}, key)) {
      error(loc(a)) << "cosine takes warmup, min_lr and decay_steps, by name"
                    << (key.empty() ? std::string()
                                    : suggest(key, {"warmup", "min_lr",
                                                    "decay_steps"}));
      continue;
    }
    Val v = eval(a->expr());
    if (v.isError())
      continue;
    if (key == "min_lr") {
      if (!v.isNumber() || v.getNumber() < 0)
        error(v.loc) << "min_lr must be a number >= 0";
      else
        train.minLr = v.getNumber();
    } else if (!v.isInt() || v.getInt() < 0) {
      error(v.loc) << key << " must be an integer >= 0";
    } else if (key == "warmup") {
      train.warmupSteps = v.getInt();
    } else {
      train.decaySteps = v.getInt();
    }
  }
}

void Sema::readTrain() {
  if (!trainSec) {
    error(modelSec ? loc(modelSec) : UnknownLoc::get(ctx))
        << "the plan has no train section; add one, e.g. 'train { batch = "
           "32  steps = 100  optimizer = sgd(lr = 0.05) }'";
    return;
  }
  Settings s;
  readSettings(trainSec,
               {"batch", "micro_batch", "steps", "seed", "precision",
                "loss_scale", "optimizer", "grad_clip", "lr_schedule", "data",
                "checkpoint", "checkpoint_every"},
               s);
  Location where = loc(trainSec);
  auto at = [&](StringRef key) { return s.find(key)->second.val.loc; };
  auto required = [&](StringRef key, StringRef example) {
    if (!s.count(key))
      error(where) << "the train section must set '" << key << "', e.g. '"
                   << key << " = " << example << "'";
  };
  required("batch", "32");
  required("steps", "100");
  train.batch = intSetting(s, "batch", 1);
  if (train.batch)
    train.batchLoc = at("batch");
  if ((train.microBatch = intSetting(s, "micro_batch", 1)))
    train.microLoc = at("micro_batch");
  train.steps = intSetting(s, "steps", 0).value_or(0);
  train.seed = intSetting(s, "seed", 0).value_or(0);
  if (auto v = nameSetting(s, "precision", {"fp32", "tf32", "bf16", "fp16"}))
    train.precision = *v;
  if (auto v = nameSetting(s, "loss_scale", {"none", "dynamic"})) {
    train.lossScale = *v;
    if (*v == "dynamic" && train.precision != "fp16")
      error(at("loss_scale")) << "dynamic loss scaling is for fp16; "
                              << train.precision << " does not need it";
  }
  if (train.precision == "fp16" && train.lossScale == "none" &&
      s.count("precision"))
    warning(at("precision")) << "fp16 training without loss scaling "
                                "underflows small gradients; add "
                                "'loss_scale = dynamic'";
  train.gradClip = numberSetting(s, "grad_clip", 0, /*inclusive=*/false);
  if (auto it = s.find("lr_schedule"); it != s.end())
    readLrSchedule(it->second);
  if (auto it = s.find("data"); it != s.end()) {
    PlanParser::ExprContext *e = it->second.ctx->expr();
    auto *call = dynamic_cast<PlanParser::CallExprContext *>(e);
    if (auto n = rawName(e); n && *n == "synthetic") {
      train.data = "synthetic";
    } else if (call &&
               (call->callee->getText() == "shards" ||
                call->callee->getText() == "cifar10") &&
               call->arg().size() == 1) {
      std::string kind = call->callee->getText();
      Val v = eval(call->arg()[0]->expr());
      if (!v.isError() && !v.isString())
        error(v.loc) << kind << "(...) takes a file pattern in quotes, e.g. "
                     << kind
                     << (kind == "shards" ? "(\"data/train_*.bin\")"
                                          : "(\"cifar/data_batch_*.bin\")");
      else if (!v.isError()) {
        train.data = kind;
        train.dataPath = v.getString();
      }
    } else {
      error(it->second.val.loc) << "'data' is synthetic, "
                                   "shards(\"pattern/*.bin\") or "
                                   "cifar10(\"pattern/*.bin\")";
    }
  }
  if (auto it = s.find("checkpoint"); it != s.end()) {
    Val &v = it->second.val;
    if (!v.isError() && !v.isString())
      error(v.loc) << "'checkpoint' is a directory in quotes, e.g. "
                      "checkpoint = \"ckpt/\"";
    else if (!v.isError())
      train.checkpointDir = v.getString();
  }
  train.checkpointEvery = intSetting(s, "checkpoint_every", 0).value_or(0);
  if (train.checkpointEvery > 0 && !train.checkpointDir)
    error(at("checkpoint_every")) << "checkpoint_every needs a directory: "
                                     "add checkpoint = \"ckpt/\"";
  if (auto it = s.find("optimizer"); it == s.end()) {
    error(where) << "the train section must set 'optimizer', e.g. "
                    "'optimizer = sgd(lr = 0.05)'";
  } else if (auto *call = dynamic_cast<PlanParser::CallExprContext *>(
                 it->second.ctx->expr())) {
    readOptimizer(call);
  } else {
    error(it->second.val.loc)
        << "'optimizer' expects sgd(lr = ...) or adamw(lr = ..., betas = "
           "[..., ...], eps = ..., weight_decay = ...)";
  }
  // After the optimizer, which sets the learning rate.
  if (train.minLr && *train.minLr > train.lr)
    error(at("lr_schedule"))
        << "min_lr (" << num(*train.minLr) << ") is above the learning rate ("
        << num(train.lr) << ")";
}

//===----------------------------------------------------------------------===//
// cluster
//===----------------------------------------------------------------------===//

void Sema::readCluster() {
  if (!clusterSec)
    return;
  Settings s;
  readSettings(clusterSec,
               {"nodes", "gpus_per_node", "gpu", "intra_bw", "inter_bw"}, s);
  cluster.loc = loc(clusterSec);
  // The bandwidths default to the GPU kind's usual links.
  for (StringRef key : {"nodes", "gpus_per_node", "gpu"})
    if (!s.count(key))
      error(*cluster.loc) << "the cluster section must set '" << key << "'";
  cluster.nodes = intSetting(s, "nodes", 1, kMaxCount).value_or(0);
  cluster.gpusPerNode =
      intSetting(s, "gpus_per_node", 1, kMaxCount).value_or(0);
  if (auto v = nameSetting(
          s, "gpu", {"a100", "a100_40gb", "h100", "h200", "b200", "l40s"}))
    cluster.gpu = *v;
  cluster.intraGBps = numberSetting(s, "intra_bw", 0, /*inclusive=*/false);
  cluster.interGBps = numberSetting(s, "inter_bw", 0, /*inclusive=*/false);
  int64_t gpus = cluster.nodes * cluster.gpusPerNode;
  if (cluster.nodes && cluster.gpusPerNode && gpus != par.world()) {
    auto d = error(*cluster.loc) << "the cluster has " << cluster.nodes << " x "
                                 << cluster.gpusPerNode << " = " << gpus
                                 << " GPUs but the plan uses "
                                 << par.axesProduct() << " = " << par.world();
    if (parallelSec)
      d.attachNote(loc(parallelSec)) << "the parallel plan is here";
  }
  if (cluster.gpusPerNode && par.tp > cluster.gpusPerNode)
    warning(*par.tpLoc) << "tp = " << par.tp << " spans nodes ("
                        << cluster.gpusPerNode
                        << " GPUs per node): tensor-parallel all-reduces "
                           "then cross the slower inter-node network";
}

//===----------------------------------------------------------------------===//
// Whole-plan checks, once the model is known
//===----------------------------------------------------------------------===//

void Sema::checkPlan(Location modelLoc) {
  // Context parallelism splits sequences, which only attention models have.
  if (par.cp > 1) {
    bool attention = false;
    module.walk([&](plan::AttentionOp) { attention = true; });
    if (!attention)
      error(*par.cpLoc) << "cp = " << par.cp
                        << " splits the sequence of attention layers over "
                           "ranks (context parallelism), but the model has "
                           "none; remove cp or use dp";
  }
  // Expert parallelism splits the experts of mixture-of-experts layers.
  if (par.ep > 1) {
    bool moe = false;
    module.walk([&](plan::MoeExpertsOp m) {
      moe = true;
      int64_t experts = m.getUp().getType().getDimSize(0);
      if (experts % par.ep != 0) {
        auto d = error(m.getLoc())
                 << "'moe' has " << experts << " experts, which ep = " << par.ep
                 << " cannot split evenly; choose an ep that divides "
                 << experts;
        d.attachNote(*par.epLoc) << "ep is set here";
      }
    });
    if (!moe)
      error(*par.epLoc) << "ep = " << par.ep
                        << " splits the experts of 'moe' layers over ranks "
                           "(expert parallelism), but the model has none; "
                           "remove ep or use dp";
  }
  // Batches: global = micro * microbatches * dp (* ep: the expert-parallel
  // ranks take their own samples too).
  if (train.batch) {
    int64_t B = *train.batch, dp = par.dataRanks();
    std::string dpName = par.ep > 1 ? "dp * ep" : "dp";
    // dp and microbatches are at most 2^20, micro_batch is not.
    int64_t got = 0;
    if (train.microBatch && par.microbatchesSet) {
      bool overflow = __builtin_mul_overflow(*train.microBatch,
                                             par.microbatches * dp, &got);
      if (overflow || got != B) {
        auto d =
            error(*train.batchLoc)
            << "the global batch " << B << " must equal micro_batch * "
            << "microbatches * " << dpName << " = " << *train.microBatch
            << " * " << par.microbatches << " * " << dp << " = "
            << (overflow ? std::string("more than 2^63") : std::to_string(got));
        d.attachNote(*train.microLoc) << "micro_batch is set here";
        d.attachNote(*par.microLoc) << "microbatches is set here";
      }
    } else if (train.microBatch) {
      bool overflow = __builtin_mul_overflow(*train.microBatch, dp, &got);
      if (overflow || B % got != 0)
        error(*train.batchLoc)
            << "the global batch " << B << " is not a multiple of "
            << "micro_batch * " << dpName << " = "
            << (overflow ? std::to_string(*train.microBatch) + " * " +
                               std::to_string(dp)
                         : std::to_string(got))
            << ", so it cannot be cut into whole microbatches";
      else
        par.microbatches = B / got;
    } else if (B % (par.microbatches * dp) != 0) {
      if (par.microbatches == 1)
        error(*train.batchLoc)
            << "the global batch " << B << " is not divisible by " << dpName
            << " = " << dp
            << ": every data-parallel rank needs the same number of samples; "
               "use a multiple of "
            << dp << ", e.g. "
            << (B / dp + (B / dp < INT64_MAX / dp ? 1 : 0)) * dp;
      else
        error(*train.batchLoc)
            << "the global batch " << B << " cannot be split into "
            << par.microbatches << " microbatches on each of " << dpName
            << " = " << dp << " ranks; use a multiple of "
            << par.microbatches * dp;
    } else {
      train.microBatch = B / (par.microbatches * dp);
    }
  }
  // A batch dimension of size 1 has no sharding factor (size-1 dimensions
  // broadcast), so nothing would mark the layers' ops as per microbatch.
  if (train.batch && *train.batch == 1 && par.pp > 1)
    error(*train.batchLoc)
        << "pipeline parallelism (pp = " << par.pp
        << ") needs a global batch of at least 2: with one sample planc "
           "cannot yet tell the per-microbatch work from the rest; use "
           "batch >= 2 or pp = 1";
  if (par.zeroStage > 0 && par.dataRanks() == 1)
    error(*par.zeroLoc) << "ZeRO stage " << par.zeroStage
                        << " shards optimizer state over data-parallel "
                           "ranks, but dp = 1; set zero = 0 or dp > 1";
  // Pipeline stages.
  int64_t stages = par.pp * par.virtualStages;
  if (!par.stageBoundaries.empty()) {
    if ((int64_t)par.stageBoundaries.size() != stages - 1)
      error(*par.boundariesLoc)
          << par.stageBoundaries.size() << " stage boundaries make "
          << par.stageBoundaries.size() + 1 << " stages, but pp * "
          << "virtual_stages = " << stages << " needs " << stages - 1;
    else if (par.stageBoundaries.back() >= numLayers)
      error(*par.boundariesLoc)
          << "stage boundary " << par.stageBoundaries.back()
          << " is past the last layer: the model has " << numLayers
          << " repeated layers (0 to " << numLayers - 1 << ")";
  } else if (stages > 1) {
    if (numLayers == 0)
      error(par.pp > 1 ? *par.ppLoc : *par.virtualLoc)
          << "pipeline parallelism cuts the model's repeated "
             "layers into stages, but the model has no "
             "repeat(n) of a block";
    else if (numLayers < stages)
      error(par.virtualStages > 1 ? *par.virtualLoc : *par.ppLoc)
          << "pp * virtual_stages = " << par.pp << " * " << par.virtualStages
          << " = " << stages << " stages need at least " << stages
          << " repeated layers, but the model has " << numLayers
          << "; use fewer stages";
  }
  // The pipeline bubble: (p - 1) idle slots per (v * m + p - 1).
  if (par.pp > 1) {
    double m = double(par.microbatches), v = double(par.virtualStages),
           p = double(par.pp);
    double bubble = (p - 1) / (v * m + p - 1);
    if (bubble > 0.25) {
      int64_t need = int64_t(std::ceil(3 * (p - 1) / v));
      warning(par.microLoc ? *par.microLoc : *par.ppLoc)
          << "the pipeline bubble is " << int64_t(std::round(bubble * 100))
          << "% of each step (pp = " << par.pp << ", " << par.microbatches
          << " microbatch" << (par.microbatches == 1 ? "" : "es")
          << (par.virtualStages > 1
                  ? ", " + std::to_string(par.virtualStages) + " virtual stages"
                  : std::string())
          << "); use at least " << need
          << " microbatches to bring it under 25%";
    }
  }
}
