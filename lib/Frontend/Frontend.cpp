//===- Frontend.cpp - .plan files to the plan dialect ---------------------===//
//
// Reads the main file and its imports (depth first, each once), parses each
// with the ANTLR grammar, and hands the trees to the semantic pass.
//===----------------------------------------------------------------------===//
#include "planc/Frontend/Frontend.h"

#include "PlanLexer.h"
#include "Sema.h"

#include "mlir/IR/Verifier.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/thread.h"

using namespace mlir;
using namespace planc;
using namespace planc::plan;
using namespace planc::frontend;

namespace {

/// The largest plan file, imports included, that is read.
constexpr size_t kMaxBytes = kMaxPlanBytes;

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

/// The ANTLR objects of one file; the tree lives as long as they do.
struct ParsedFile {
  std::unique_ptr<antlr4::ANTLRInputStream> input;
  std::unique_ptr<PlanLexer> lexer;
  std::unique_ptr<antlr4::CommonTokenStream> tokens;
  std::unique_ptr<PlanParser> parser;
  std::unique_ptr<ErrorListener> listener;
  SourceFile file;
};

/// Reads a file and its imports, in dependency order.
class Loader {
public:
  Loader(llvm::SourceMgr &sm, MLIRContext *ctx) : sm(sm), ctx(ctx) {}

  /// Parses the buffer `id` of the source manager and, first, its imports.
  /// Returns false if any file had an error.
  bool load(unsigned id, std::vector<std::string> &stack);

  std::vector<std::unique_ptr<ParsedFile>> files;

private:
  bool checkInput(StringRef text, StringRef file);

  llvm::SourceMgr &sm;
  MLIRContext *ctx;
  llvm::StringSet<> loaded;
};

} // namespace

/// Bytes that have no place in a plan's text: control characters other than
/// tab, newline and carriage return.
static bool isControlByte(uint8_t c) {
  return (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f;
}

std::string planc::binaryContentProblem(StringRef text) {
  size_t bad = 0, first = StringRef::npos;
  for (size_t i = 0; i < text.size();) {
    const auto *p = reinterpret_cast<const llvm::UTF8 *>(text.data() + i);
    unsigned len = llvm::getNumBytesForUTF8(*p);
    bool ok = i + len <= text.size() && llvm::isLegalUTF8Sequence(p, p + len);
    if (ok && len == 1 && isControlByte(uint8_t(text[i])))
      ok = false;
    if (ok) {
      i += len;
      continue;
    }
    if (first == StringRef::npos)
      first = i;
    if (++bad >= 8 || first < 4)
      break;
    ++i;
  }
  if (first == StringRef::npos || (bad < 8 && first >= 4))
    return "";
  return "not a text file (byte 0x" +
         llvm::utohexstr(uint8_t(text[first]), true, 2) + " at offset " +
         std::to_string(first) + "); planc reads .plan source text";
}

/// Standard input may never end (`planc - < /dev/zero`): read at most one
/// byte past the cap.
static std::unique_ptr<llvm::MemoryBuffer> readPlanStdin(std::string &error) {
  std::string text;
  char chunk[1 << 16];
  while (text.size() <= kMaxPlanBytes) {
    llvm::Expected<size_t> n = llvm::sys::fs::readNativeFile(
        llvm::sys::fs::getStdinHandle(),
        llvm::MutableArrayRef<char>(chunk, sizeof(chunk)));
    if (!n) {
      error = "cannot read standard input: " + llvm::toString(n.takeError());
      return nullptr;
    }
    if (*n == 0)
      break;
    text.append(chunk, *n);
  }
  if (text.size() > kMaxPlanBytes) {
    error = "standard input is longer than " + std::to_string(kMaxPlanBytes) +
            " bytes, the limit for plans";
    return nullptr;
  }
  error = binaryContentProblem(text);
  if (!error.empty())
    return nullptr;
  return llvm::MemoryBuffer::getMemBufferCopy(text, "<stdin>");
}

std::unique_ptr<llvm::MemoryBuffer> planc::readPlanFile(StringRef path,
                                                        std::string &error) {
  if (path == "-")
    return readPlanStdin(error);
  // Reading a device such as /dev/zero would never end, and a directory
  // cannot be read: only regular files of a sane size are read.
  llvm::sys::fs::file_status st;
  if (auto ec = llvm::sys::fs::status(path, st)) {
    error = "cannot read the file: " + ec.message();
    return nullptr;
  }
  if (st.type() != llvm::sys::fs::file_type::regular_file) {
    error = st.type() == llvm::sys::fs::file_type::directory_file
                ? "is a directory, not a plan file"
                : "it is not a regular file (planc reads only regular "
                  "files: not devices, FIFOs or sockets)";
    return nullptr;
  }
  if (st.getSize() > kMaxPlanBytes) {
    error = "the file is " + std::to_string(st.getSize()) +
            " bytes; plans are limited to " + std::to_string(kMaxPlanBytes) +
            " bytes";
    return nullptr;
  }
  auto fileOrErr = llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
  if (!fileOrErr) {
    error = "cannot read the file: " + fileOrErr.getError().message();
    return nullptr;
  }
  error = binaryContentProblem((*fileOrErr)->getBuffer());
  if (!error.empty())
    return nullptr;
  return std::move(*fileOrErr);
}

/// Rejects input that would make the parser or the semantic pass misbehave:
/// bytes that are not UTF-8 (ANTLR throws on them) and brackets nested so
/// deeply that recursive descent would exhaust the stack.
bool Loader::checkInput(StringRef text, StringRef file) {
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
    if (isControlByte(uint8_t(c))) {
      auto diag = mlir::emitError(FileLineColLoc::get(ctx, file, line, col));
      if (c == 0)
        diag << "NUL byte (0x00) in the file; plans are text: remove it";
      else
        diag << "control character 0x" << llvm::utohexstr(uint8_t(c), true, 2)
             << " in the file; plans are text: remove it";
      return false;
    }
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

bool Loader::load(unsigned id, std::vector<std::string> &stack) {
  const llvm::MemoryBuffer *buf = sm.getMemoryBuffer(id);
  std::string path = buf->getBufferIdentifier().str();
  if (!checkInput(buf->getBuffer(), path))
    return false;
  auto f = std::make_unique<ParsedFile>();
  f->input = std::make_unique<antlr4::ANTLRInputStream>(buf->getBufferStart(),
                                                        buf->getBufferSize());
  f->input->name = path; // Token locations name their file.
  f->lexer = std::make_unique<PlanLexer>(f->input.get());
  f->listener = std::make_unique<ErrorListener>(ctx, path);
  f->lexer->removeErrorListeners();
  f->lexer->addErrorListener(f->listener.get());
  f->tokens = std::make_unique<antlr4::CommonTokenStream>(f->lexer.get());
  f->parser = std::make_unique<PlanParser>(f->tokens.get());
  f->parser->removeErrorListeners();
  f->parser->addErrorListener(f->listener.get());
  f->file = {path, f->parser->file()};
  if (f->listener->errors)
    return false;

  bool ok = true;
  // Imports are recognized by their real path, the main file included.
  llvm::SmallString<256> self;
  if (llvm::sys::fs::real_path(path, self))
    self = path;
  loaded.insert(self);
  stack.push_back(std::string(self));
  for (PlanParser::ImportDeclContext *imp : f->file.tree->importDecl()) {
    antlr4::Token *t = imp->path;
    Location l = FileLineColLoc::get(ctx, path, t->getLine(),
                                     t->getCharPositionInLine() + 1);
    std::string rel = t->getText().substr(1, t->getText().size() - 2);
    llvm::SmallString<256> full(rel);
    if (!llvm::sys::path::is_absolute(rel)) {
      full = llvm::sys::path::parent_path(path);
      llvm::sys::path::append(full, rel);
    }
    llvm::SmallString<256> real;
    if (llvm::sys::fs::real_path(full, real)) {
      mlir::emitError(l) << "cannot import '" << rel << "': no such file ("
                         << full << ")";
      ok = false;
      continue;
    }
    if (llvm::is_contained(stack, std::string(real))) {
      mlir::emitError(l) << "'" << rel << "' imports itself, through "
                         << llvm::join(stack, " -> ");
      ok = false;
      continue;
    }
    if (!loaded.insert(real).second)
      continue; // Already read through another import.
    std::string why;
    std::unique_ptr<llvm::MemoryBuffer> file = readPlanFile(full, why);
    if (!file) {
      mlir::emitError(l) << "cannot import '" << rel << "': " << why;
      ok = false;
      continue;
    }
    unsigned newId = sm.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
    ok &= load(newId, stack);
  }
  stack.pop_back();
  files.push_back(std::move(f));
  return ok;
}

static OwningOpRef<ModuleOp> importOnThisThread(llvm::SourceMgr &sourceMgr,
                                                MLIRContext *context,
                                                const ImportOptions &options) {
  try {
    Loader loader(sourceMgr, context);
    std::vector<std::string> stack;
    if (!loader.load(sourceMgr.getMainFileID(), stack))
      return nullptr;
    std::vector<SourceFile> files;
    for (auto &f : loader.files)
      files.push_back(f->file);
    Sema sema(context);
    sema.maxRepeat = options.maxRepeat;
    sema.target = options.target;
    return sema.run(files);
  } catch (const std::exception &e) {
    // ANTLR reports problems by throwing; none may escape as a crash.
    const llvm::MemoryBuffer *buf =
        sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
    mlir::emitError(
        FileLineColLoc::get(context, buf->getBufferIdentifier(), 1, 1))
        << "the parser failed: " << e.what();
    return nullptr;
  }
}

OwningOpRef<ModuleOp> planc::importPlan(llvm::SourceMgr &sourceMgr,
                                        MLIRContext *context,
                                        const ImportOptions &options) {
  context->loadDialect<PlanDialect, func::FuncDialect>();
  // Parse trees of long operator chains are deep and both ANTLR and the
  // semantic pass recurse over them: run on a thread with a large stack.
  constexpr unsigned kStackBytes = 512u << 20;
  OwningOpRef<ModuleOp> result;
  llvm::thread worker(std::optional<unsigned>(kStackBytes), [&] {
    result = importOnThisThread(sourceMgr, context, options);
  });
  worker.join();
  return result;
}

//===----------------------------------------------------------------------===//
// Sema::run: the items of all files, then the module
//===----------------------------------------------------------------------===//

OwningOpRef<ModuleOp> Sema::run(ArrayRef<SourceFile> files) {
  scopes[0].try_emplace(
      "true", Binding{Val{int64_t(1), b.getUnknownLoc()}, b.getUnknownLoc()});
  scopes[0].try_emplace(
      "false", Binding{Val{int64_t(0), b.getUnknownLoc()}, b.getUnknownLoc()});
  // Items of every file: one model, one of each section, named blocks;
  // top-level constants are evaluated in order.
  for (const SourceFile &f : files) {
    for (PlanParser::ItemContext *item : f.tree->item()) {
      if (auto *m = item->modelSection()) {
        if (modelSec) {
          auto d = error(loc(m)) << "a plan holds one model";
          d.attachNote(loc(modelSec)) << "the first model is here";
          continue;
        }
        modelSec = m;
      } else if (auto *blk = item->blockDecl()) {
        std::string name = blk->name->getText();
        if (auto it = blocks.find(name); it != blocks.end()) {
          auto d = error(loc(blk->name))
                   << "block '" << name << "' is defined twice";
          d.attachNote(loc(it->second->name)) << "first defined here";
          continue;
        }
        blocks[name] = blk;
      } else if (auto *s = item->settingsSection()) {
        std::string kind = s->kind->getText();
        auto *&slot = kind == "parallel" ? parallelSec
                      : kind == "train"  ? trainSec
                                         : clusterSec;
        if (slot) {
          auto d = error(loc(s)) << "the " << kind << " section appears twice";
          d.attachNote(loc(slot)) << "the first one is here";
          continue;
        }
        slot = s;
      } else if (auto *c = item->constDecl()) {
        bind(c->name, eval(c->expr()));
      }
    }
  }
  if (!modelSec) {
    error(FileLineColLoc::get(ctx, files.back().path, 1, 1))
        << "the plan has no model; start with e.g. 'model mlp { ... }'";
    return nullptr;
  }

  OwningOpRef<ModuleOp> owned =
      ModuleOp::create(loc(modelSec), modelSec->name->getText());
  module = *owned;
  readParallel();
  readTrain();
  readCluster();

  b.setInsertionPointToEnd(module.getBody());
  Location ploc = parallelSec ? loc(parallelSec) : loc(modelSec);
  // Axes of size 1 other than dp carry no information; dp is kept because
  // inputs are always split over it.
  SmallVector<int64_t> sizes;
  for (const std::string &axis : par.order) {
    int64_t size = axis == "dp"   ? par.dp
                   : axis == "tp" ? par.tp
                   : axis == "cp" ? par.cp
                   : axis == "ep" ? par.ep
                                  : par.pp;
    if (axis == "dp" || size > 1) {
      meshAxes.push_back(axis == "dp"   ? "dp"
                         : axis == "tp" ? "tp"
                         : axis == "cp" ? "cp"
                         : axis == "ep" ? "ep"
                                        : "pp");
      sizes.push_back(size);
    }
  }
  auto mesh = MeshOp::create(b, ploc, "mesh", b.getStrArrayAttr(meshAxes),
                             b.getDenseI64ArrayAttr(sizes),
                             /*sequential=*/ArrayAttr());
  meshRef = FlatSymbolRefAttr::get(mesh.getSymNameAttr());

  Location tloc = trainSec ? loc(trainSec) : loc(modelSec);
  auto trainOp = TrainOp::create(
      b, tloc, b.getI64IntegerAttr(train.steps),
      b.getI64IntegerAttr(train.seed),
      b.getI64IntegerAttr(train.batch.value_or(1)), b.getStringAttr(train.data),
      b.getStringAttr(train.optimizer), b.getF64FloatAttr(train.lr),
      b.getF64FloatAttr(train.beta1), b.getF64FloatAttr(train.beta2),
      b.getF64FloatAttr(train.eps), b.getF64FloatAttr(train.weightDecay));

  buildModel(modelSec);
  checkPlan(loc(modelSec));

  // Settings that only matter beyond the basics are recorded when they
  // differ from their defaults, to keep the common IR short.
  auto setIf = [&](Operation *op, StringRef name, bool cond, Attribute a) {
    if (cond)
      op->setAttr(name, a);
  };
  setIf(trainOp, "micro_batch",
        train.microBatch.has_value() && (par.microbatches > 1 || par.pp > 1),
        b.getI64IntegerAttr(train.microBatch.value_or(0)));
  setIf(trainOp, "precision", train.precision != "fp32",
        b.getStringAttr(train.precision));
  setIf(trainOp, "loss_scale", train.lossScale != "none",
        b.getStringAttr(train.lossScale));
  setIf(trainOp, "grad_clip", train.gradClip.has_value(),
        b.getF64FloatAttr(train.gradClip.value_or(0)));
  setIf(trainOp, "lr_schedule", train.lrSchedule != "constant",
        b.getStringAttr(train.lrSchedule));
  setIf(trainOp, "warmup_steps", train.warmupSteps != 0,
        b.getI64IntegerAttr(train.warmupSteps));
  setIf(trainOp, "min_lr", train.minLr.has_value(),
        b.getF64FloatAttr(train.minLr.value_or(0)));
  setIf(trainOp, "decay_steps", train.decaySteps.has_value(),
        b.getI64IntegerAttr(train.decaySteps.value_or(0)));
  setIf(trainOp, "data_path", train.dataPath.has_value(),
        b.getStringAttr(train.dataPath.value_or("")));
  setIf(trainOp, "checkpoint_dir", train.checkpointDir.has_value(),
        b.getStringAttr(train.checkpointDir.value_or("")));
  setIf(trainOp, "checkpoint_every", train.checkpointEvery != 0,
        b.getI64IntegerAttr(train.checkpointEvery));

  if (parallelSec) {
    b.setInsertionPointAfter(mesh);
    SmallVector<NamedAttribute> attrs;
    auto add = [&](StringRef name, bool cond, Attribute a) {
      if (cond)
        attrs.push_back(b.getNamedAttr(name, a));
    };
    add("schedule", par.schedule != "1f1b", b.getStringAttr(par.schedule));
    add("microbatches", par.microbatches != 1,
        b.getI64IntegerAttr(par.microbatches));
    add("virtual_stages", par.virtualStages != 1,
        b.getI64IntegerAttr(par.virtualStages));
    add("zero_stage", par.zeroStage != 0, b.getI64IntegerAttr(par.zeroStage));
    add("bucket_mb", par.bucketMB != 25.0, b.getF64FloatAttr(par.bucketMB));
    add("recompute", par.recompute != "none", b.getStringAttr(par.recompute));
    add("sequence_parallel", par.sequenceParallel, b.getBoolAttr(true));
    add("cp_comm", !par.cpComm.empty(), b.getStringAttr(par.cpComm));
    add("ep_comm", !par.epComm.empty(), b.getStringAttr(par.epComm));
    add("tensor_policy", par.tensorPolicy != "none",
        b.getStringAttr(par.tensorPolicy));
    add("stage_boundaries", !par.stageBoundaries.empty(),
        b.getDenseI64ArrayAttr(par.stageBoundaries));
    if (!attrs.empty())
      ParallelOp::create(b, ploc, TypeRange(), ValueRange(), attrs);
  }
  if (clusterSec) {
    b.setInsertionPoint(trainOp);
    SmallVector<NamedAttribute> attrs = {
        b.getNamedAttr(
            "nodes", b.getI64IntegerAttr(std::max<int64_t>(cluster.nodes, 1))),
        b.getNamedAttr("gpus_per_node", b.getI64IntegerAttr(std::max<int64_t>(
                                            cluster.gpusPerNode, 1))),
        b.getNamedAttr("gpu", b.getStringAttr(cluster.gpu))};
    if (cluster.intraGBps)
      attrs.push_back(b.getNamedAttr("intra_node_gbps",
                                     b.getF64FloatAttr(*cluster.intraGBps)));
    if (cluster.interGBps)
      attrs.push_back(b.getNamedAttr("inter_node_gbps",
                                     b.getF64FloatAttr(*cluster.interGBps)));
    ClusterOp::create(b, *cluster.loc, TypeRange(), ValueRange(), attrs);
  }
  if (errors)
    return nullptr;
  // The frontend's own output must be valid IR; if it is not, that is a bug
  // in planc, reported as such rather than passed on.
  if (failed(mlir::verify(*owned))) {
    mlir::emitError(owned->getLoc())
        << "internal error: planc built invalid IR for this plan; please "
           "report it with the plan file";
    return nullptr;
  }
  return owned;
}
