//===- planc.cpp - The planc compiler driver ------------------------------===//
//
//   planc model.plan -o model               build an executable (host target)
//   planc model.plan --emit=mlir            the IR after the last stage
//   planc model.plan --print-ir-after-all   the IR after every pass
//   planc model.plan --report[=json]        what a step costs, per rank
//   planc model.plan --autoplan [-o b.plan] the fastest plan that fits
//===----------------------------------------------------------------------===//
#include "planc/AutoPlan/AutoPlan.h"
#include "planc/AutoPlan/PlanText.h"
#include "planc/Codegen/Codegen.h"
#include "planc/CostModel/StepReport.h"
#include "planc/Frontend/Frontend.h"
#include "planc/Transforms/Passes.h"
#include "planc/Transforms/Pipeline.h"
#include "planc/Transforms/PipelineSchedule.h"

#include "ToolchainConfig.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassInstrumentation.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Signals.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
using namespace planc;
namespace cl = llvm::cl;

static cl::OptionCategory cat("planc options");
static cl::opt<std::string> inputFile(cl::Positional, cl::desc("<file.plan>"),
                                      cl::Required, cl::cat(cat));
static cl::opt<std::string>
    outputFile("o",
               cl::desc("Output file (default: the model's name for "
                        "executables, stdout otherwise)"),
               cl::value_desc("path"), cl::cat(cat));

enum class Emit { Exe, Mlir, Cpp, Cuda, Schedule };
static cl::opt<Emit>
    emit("emit", cl::desc("What to produce"), cl::init(Emit::Exe),
         cl::values(clEnumValN(Emit::Exe, "exe", "an executable (default)"),
                    clEnumValN(Emit::Mlir, "mlir",
                               "MLIR after the last stage run (see --stage)"),
                    clEnumValN(Emit::Cpp, "cpp", "the generated C++ source"),
                    clEnumValN(Emit::Schedule, "schedule",
                               "the pipeline schedule as a Chrome trace "
                               "(JSON; -o X.svg: as a picture)"),
                    clEnumValN(Emit::Cuda, "cuda",
                               "the generated CUDA C++ source (implies "
                               "--target=cuda)")),
         cl::cat(cat));
enum class Report { None, Table, Json };
static cl::opt<Report> report(
    "report",
    cl::desc("Print what a step costs, read from the compiled program "
             "(parameters, memory, communication per rank; docs/cost-model.md) "
             "instead of building"),
    cl::init(Report::None), cl::ValueOptional,
    cl::values(clEnumValN(Report::Table, "", "a table (--report)"),
               clEnumValN(Report::Table, "table", "a table"),
               clEnumValN(Report::Json, "json", "one JSON object")),
    cl::cat(cat));
static cl::opt<double>
    tokens("tokens",
           cl::desc("With --report: the training time of this many tokens"),
           cl::value_desc("N"), cl::cat(cat));
static cl::opt<bool> autoplan(
    "autoplan",
    cl::desc("Search dp/tp/pp (cp for long sequences, ep for experts), mesh "
             "order, virtual stages, schedule, micro "
             "batch, ZeRO, sequence parallelism and recompute for the plan's "
             "model, batch and cluster; print the fastest plans that fit next "
             "to the input's, and write the best as a .plan file with -o "
             "(docs/cost-model.md)"),
    cl::cat(cat));
static cl::opt<unsigned> autoplanVerify(
    "autoplan-compile",
    cl::desc("With --autoplan: how many of the best estimates to compile and "
             "report (default 4)"),
    cl::init(4), cl::value_desc("N"), cl::cat(cat));
static cl::opt<unsigned>
    autoplanThreads("autoplan-threads",
                    cl::desc("With --autoplan: compile threads (default: "
                             "the machine's cores)"),
                    cl::init(0), cl::value_desc("N"), cl::cat(cat));
static cl::opt<Target> target(
    "target", cl::desc("Where the program runs"), cl::init(Target::Host),
    cl::values(clEnumValN(Target::Host, "host",
                          "CPU; each MPI rank plays one GPU (default)"),
               clEnumValN(Target::Cuda, "cuda",
                          "NVIDIA GPUs: cuBLASLt and NCCL, built with nvcc")),
    cl::cat(cat));
// Its description lists the pipeline's passes; main() fills it in from
// pipelinePassNames() so --help cannot fall behind the pipeline.
static cl::opt<std::string> stopAfter("stage", cl::value_desc("stage"),
                                      cl::cat(cat));
static cl::opt<bool>
    timePasses("pass-timing",
               cl::desc("Print the time each pass took (to stderr)"),
               cl::cat(cat));
static cl::opt<bool> verifyEach(
    "verify-each",
    cl::desc("Verify the IR after every pass (default: once, after the "
             "last; a failure there names no pass)"),
    cl::cat(cat));
static cl::opt<bool> printIRAfterAll("print-ir-after-all",
                                     cl::desc("Print the IR after every pass "
                                              "(to stderr)"),
                                     cl::cat(cat));
static cl::opt<std::string>
    dumpIR("dump-ir",
           cl::desc("Write the IR after parsing and after every pass to "
                    "DIR/NN-<stage>.mlir"),
           cl::value_desc("DIR"), cl::cat(cat));
static cl::opt<bool> paramCopies(
    "param-copies", cl::init(true),
    cl::desc("With precision = bf16 or fp16: keep the 16-bit weights across "
             "steps, written by the optimizer update (2 bytes per parameter "
             "more memory); =false casts the fp32 weights before every use "
             "instead (plan-keep-param-copies)"),
    cl::cat(cat));
static cl::opt<bool> saveTemps("save-temps",
                               cl::desc("Keep the generated source next to "
                                        "the executable (<out>.cpp/.cu)"),
                               cl::cat(cat));
static cl::opt<bool> verbose("v", cl::desc("Print the compiler commands run"),
                             cl::cat(cat));
static cl::opt<bool> debugInfo("mlir-debuginfo",
                               cl::desc("Print source locations in MLIR"),
                               cl::cat(cat));

/// Whether writing a --dump-ir file failed (the instrumentation that sets it
/// is owned, and destroyed, by the pass manager).
static bool dumpFailed = false;

namespace {
/// Writes the module after every pass to DIR/NN-<pass>.mlir.
class DumpInstrumentation : public PassInstrumentation {
public:
  DumpInstrumentation(std::string dir, int first)
      : dir(std::move(dir)), n(first) {}
  void runAfterPass(Pass *pass, Operation *op) override {
    write(op, pass->getArgument());
  }
  void write(Operation *op, StringRef stage) {
    llvm::SmallString<128> path(dir);
    std::string name =
        (n < 10 ? "0" : "") + std::to_string(n) + "-" + stage.str() + ".mlir";
    ++n;
    llvm::sys::path::append(path, name);
    std::error_code ec;
    llvm::raw_fd_ostream os(path, ec);
    if (!ec) {
      op->print(os, OpPrintingFlags().enableDebugInfo(debugInfo));
      os.close();
      ec = os.error();
      os.clear_error();
    }
    if (ec) {
      if (!dumpFailed) // one line, not one per pass
        llvm::errs() << "planc: error: --dump-ir: cannot write " << path << ": "
                     << ec.message() << "\n";
      dumpFailed = true;
    }
  }

private:
  std::string dir;
  int n;
};
} // namespace

/// The pipeline schedule of the compiled module as a Chrome trace or an SVG
/// picture: the simulation plan-schedule-pipeline verified. A plan without
/// pipeline parallelism shows its one rank's microbatches.
static LogicalResult writeSchedule(ModuleOp module, bool svg,
                                   llvm::raw_ostream &os) {
  namespace pl = planc::pipeline;
  plan::MeshOp mesh = plan::getMesh(module);
  rank::PipelineOp pipe;
  module.walk([&](rank::PipelineOp p) { pipe = p; });
  PipelineSimulation sim;
  std::string title;
  if (pipe) {
    FailureOr<PipelineSimulation> s =
        simulatePipeline(pipe, mesh.getAxisSize("pp"));
    if (failed(s))
      return failure();
    sim = std::move(*s);
    title = (pipe.getSchedule() + ", pp = " + Twine(mesh.getAxisSize("pp")) +
             ", " + Twine(pipe.getStages()) + " stages, " +
             Twine(pipe.getMicrobatches()) + " microbatches")
                .str();
  } else {
    int64_t m = 1;
    if (mesh && mesh.isSequential("mb"))
      m = mesh.getAxisSize("mb");
    pl::Shape shape{1, 1, m};
    auto order = pl::makeSchedule(pl::Kind::OneFOneB, shape);
    if (!order) {
      llvm::errs() << "planc: error: " << llvm::toString(order.takeError())
                   << "\n";
      return failure();
    }
    sim.program = pl::chainProgram(shape, false, *order, {});
    auto t = pl::simulate(sim.program);
    if (!t) {
      llvm::errs() << "planc: error: " << llvm::toString(t.takeError()) << "\n";
      return failure();
    }
    sim.timeline = std::move(*t);
    title = "no pipeline: " + std::to_string(m) + " microbatch" +
            (m == 1 ? "" : "es") + " on every rank";
  }
  if (svg)
    pl::writeSvg(sim.program, sim.timeline, os, title);
  else
    pl::writeChromeTrace(sim.program, sim.timeline, os);
  return success();
}

static OpPrintingFlags printFlags() {
  return OpPrintingFlags().enableDebugInfo(debugInfo);
}

static int
writeOutput(llvm::function_ref<LogicalResult(llvm::raw_ostream &)> fn,
            StringRef path) {
  std::string err;
  auto out = openOutputFile(path.empty() ? "-" : path, &err);
  if (!out) {
    llvm::errs() << "planc: error: " << err << "\n";
    return 1;
  }
  if (failed(fn(out->os())))
    return 1;
  out->os().flush();
  if (std::error_code ec = out->os().error()) {
    out->os().clear_error(); // reported here, not by a crash at exit
    llvm::errs() << "planc: error: cannot write "
                 << (path.empty() || path == "-" ? "to stdout" : path) << ": "
                 << ec.message() << "\n";
    return 1;
  }
  out->keep();
  return 0;
}

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  cl::SetVersionPrinter([](llvm::raw_ostream &os) {
    os << "planc " PLANC_VERSION " (MLIR " LLVM_VERSION_STRING ")\n";
  });
  cl::HideUnrelatedOptions(cat);
  static const std::string stageDesc = [] {
    std::string d = "Stop after this stage: parse, or a pass of the pipeline: ";
    llvm::raw_string_ostream os(d);
    llvm::interleaveComma(pipelinePassNames(), os);
    return d;
  }();
  stopAfter.setDescription(stageDesc);
  cl::ParseCommandLineOptions(
      argc, argv,
      "planc: compiles a .plan file (model + parallel plan + training) into "
      "a program launched with mpirun\n");
  if (emit == Emit::Cuda)
    target = Target::Cuda;
  if (tokens.getNumOccurrences() && report == Report::None) {
    llvm::errs() << "planc: error: --tokens needs --report\n";
    return 1;
  }
  if (tokens.getNumOccurrences() && !(tokens > 0)) {
    llvm::errs() << "planc: error: --tokens must be > 0, got " << tokens
                 << "\n";
    return 1;
  }

  if (autoplan &&
      (report != Report::None || emit != Emit::Exe || !stopAfter.empty())) {
    llvm::errs() << "planc: error: --autoplan writes a plan file; it does not "
                    "combine with --report, --emit or --stage\n";
    return 1;
  }
  if (autoplan && autoplanVerify < 1) {
    llvm::errs() << "planc: error: --autoplan-compile must be at least 1\n";
    return 1;
  }

  // Our passes are module passes; one thread also keeps IR printing legal.
  MLIRContext context(MLIRContext::Threading::DISABLED);
  context.loadDialect<plan::PlanDialect, rank::RankDialect, func::FuncDialect,
                      memref::MemRefDialect, emitc::EmitCDialect>();
  context.printOpOnDiagnostic(false);

  llvm::SourceMgr sourceMgr;
  std::string err;
  if (inputFile != "-" && !llvm::sys::fs::exists(inputFile)) {
    llvm::errs() << "planc: error: cannot open input file '" << inputFile
                 << "': No such file or directory\n";
    return 1;
  }
  std::unique_ptr<llvm::MemoryBuffer> file = readPlanFile(inputFile, err);
  if (!file) {
    llvm::errs() << (inputFile == "-" ? "<stdin>" : inputFile.getValue())
                 << ": error: " << err << "\n";
    return 1;
  }
  sourceMgr.AddNewSourceBuffer(std::move(file), llvm::SMLoc());
  SourceMgrDiagnosticHandler diagHandler(sourceMgr, &context);

  ImportOptions importOptions;
  importOptions.target = target == Target::Cuda ? "cuda" : "host";
  OwningOpRef<ModuleOp> module = importPlan(sourceMgr, &context, importOptions);
  if (!module)
    return 1;

  if (autoplan) {
    AutoPlanOptions ao;
    ao.verify = autoplanVerify;
    ao.threads = autoplanThreads;
    const llvm::MemoryBuffer *buf =
        sourceMgr.getMemoryBuffer(sourceMgr.getMainFileID());
    llvm::Expected<AutoPlanResult> r =
        autoPlan(buf->getBufferIdentifier(), buf->getBuffer(), *module, ao);
    if (!r) {
      llvm::errs() << inputFile
                   << ": error: --autoplan: " << llvm::toString(r.takeError())
                   << "\n";
      return 1;
    }
    printAutoPlan(*r, ao.verify, llvm::outs());
    if (r->ranked.empty())
      return 1;
    if (outputFile.empty()) {
      auto s = findSection(r->bestText, "parallel");
      llvm::outs() << "\nthe best plan's parallel section (-o FILE writes "
                      "the whole plan):\n"
                   << StringRef(r->bestText).slice(s->begin, s->end) << "\n";
      return 0;
    }
    // Imports resolve next to the file: written elsewhere, they are made
    // absolute.
    std::string best = r->bestText;
    llvm::SmallString<256> from(inputFile.getValue()),
        to(outputFile.getValue());
    llvm::sys::fs::make_absolute(from);
    llvm::sys::fs::make_absolute(to);
    if (llvm::sys::path::parent_path(from) != llvm::sys::path::parent_path(to))
      best = rebaseImports(best, llvm::sys::path::parent_path(from));
    int rc = writeOutput(
        [&](llvm::raw_ostream &os) {
          os << best;
          return success();
        },
        outputFile);
    if (!rc)
      llvm::outs() << "wrote " << outputFile << "\n";
    return rc;
  }

  std::unique_ptr<DumpInstrumentation> dumper;
  if (!dumpIR.empty()) {
    std::error_code ec = llvm::sys::fs::create_directories(dumpIR);
    if (!ec && !llvm::sys::fs::is_directory(dumpIR))
      ec = std::make_error_code(std::errc::not_a_directory);
    if (ec) {
      llvm::errs() << "planc: error: --dump-ir: cannot create the directory "
                   << dumpIR << ": " << ec.message() << "\n";
      return 1;
    }
    dumper = std::make_unique<DumpInstrumentation>(dumpIR, 0);
    dumper->write(*module, "parse");
    if (dumpFailed)
      return 1;
  }

  bool parseOnly = stopAfter == "parse";
  if (!parseOnly) {
    PassManager pm(&context);
    PipelineOptions options;
    options.stopAfter = stopAfter;
    options.target = target == Target::Cuda ? "cuda" : "host";
    options.paramCopies = paramCopies;
    if ((emit == Emit::Schedule || report != Report::None) && stopAfter.empty())
      options.stopAfter = "plan-memory";
    if (failed(buildPipeline(pm, options))) {
      llvm::errs() << "planc: error: unknown stage '" << stopAfter
                   << "' for --stage; expected parse";
      for (StringRef name : pipelinePassNames())
        llvm::errs() << ", " << name;
      llvm::errs() << "\n";
      return 1;
    }
    if (printIRAfterAll)
      pm.enableIRPrinting(
          /*shouldPrintBeforePass=*/[](Pass *, Operation *) { return false; },
          /*shouldPrintAfterPass=*/[](Pass *, Operation *) { return true; },
          /*printModuleScope=*/true, /*printAfterOnlyOnChange=*/false,
          /*printAfterOnlyOnFailure=*/false, llvm::errs(), printFlags());
    if (dumper)
      pm.addInstrumentation(std::move(dumper));
    if (timePasses) {
      auto timing = std::make_unique<DefaultTimingManager>();
      timing->setEnabled(true);
      pm.enableTiming(std::move(timing));
    }
    // Verifying after each pass took 28% of the compile time of a
    // 2000-layer model; the passes' own checks run anyway.
    pm.enableVerifier(verifyEach);
    if (failed(pm.run(*module)))
      return 1;
    if (!verifyEach && failed(verify(*module))) {
      llvm::errs() << "planc: error: the pipeline produced invalid IR (a bug "
                      "in planc); rerun with --verify-each to find the pass\n";
      return 1;
    }
  }
  if (dumpFailed)
    return 1;

  if (report != Report::None && stopAfter.empty()) {
    ReportOptions ro;
    ro.cuda = target == Target::Cuda;
    if (tokens.getNumOccurrences())
      ro.tokens = tokens;
    FailureOr<StepReport> r = computeStepReport(*module, ro);
    if (failed(r))
      return 1;
    return writeOutput(
        [&](llvm::raw_ostream &os) {
          if (report == Report::Json)
            os << llvm::formatv("{0:2}", llvm::json::Value(stepReportJson(*r)))
               << "\n";
          else
            printStepReport(*r, os);
          return success();
        },
        outputFile);
  }
  if (emit == Emit::Schedule && stopAfter.empty())
    return writeOutput(
        [&](llvm::raw_ostream &os) {
          return writeSchedule(*module, StringRef(outputFile).ends_with(".svg"),
                               os);
        },
        outputFile);
  if (emit == Emit::Mlir || !stopAfter.empty())
    return writeOutput(
        [&](llvm::raw_ostream &os) {
          module->print(os, printFlags());
          return success();
        },
        outputFile);
  if (emit == Emit::Cpp || emit == Emit::Cuda)
    return writeOutput(
        [&](llvm::raw_ostream &os) { return emitSource(*module, target, os); },
        outputFile);

  // An executable.
  std::string out = outputFile;
  if (out.empty())
    out = module->getSymName() ? module->getSymName()->str() : "a.out";
  llvm::SmallString<128> src;
  const char *ext = target == Target::Cuda ? "cu" : "cpp";
  if (saveTemps) {
    src = out + "." + ext;
  } else if (auto ec = llvm::sys::fs::createTemporaryFile("planc", ext, src)) {
    llvm::errs() << "planc: error: cannot create a temporary file: "
                 << ec.message() << "\n";
    return 1;
  }
  if (int rc = writeOutput(
          [&](llvm::raw_ostream &os) {
            return emitSource(*module, target, os);
          },
          src)) {
    if (!saveTemps)
      llvm::sys::fs::remove(src);
    return rc;
  }
  if (!saveTemps) // also if planc is interrupted (after writeOutput, whose
    llvm::sys::RemoveFileOnSignal(src); // keep() unregisters the path)
  LogicalResult built = compileExecutable(src.str().str(), out, target,
                                          Toolchain::fromBuild(), verbose);
  if (!saveTemps)
    llvm::sys::fs::remove(src);
  return failed(built) ? 1 : 0;
}
