//===- Frontend.h - .plan files to the plan dialect -------------*- C++ -*-===//
#ifndef PLANC_FRONTEND_FRONTEND_H
#define PLANC_FRONTEND_FRONTEND_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"

#include <memory>
#include <string>

namespace planc {

struct ImportOptions {
  /// When > 0, each top-level repeat instantiates at most this many of its
  /// layers (the auto-planner's probes cost a model of one and two layers
  /// and scale; docs/cost-model.md). 0: the plan as written.
  int64_t maxRepeat = 0;
  /// The target the plan is compiled for ("host" or "cuda"). On cuda,
  /// `pad_vocab` defaults to true and also pads a tied table to a multiple
  /// of 128 * tp rows so that the LM head's GEMMs read and write rows
  /// aligned for the tensor cores (GPT-2's 50257 columns are not).
  std::string target = "host";
};

/// Parses and checks the .plan file held by the main buffer of `sourceMgr`
/// and builds its module in the plan dialect: a `plan.mesh`, a `plan.train`
/// and the model's forward function (marked `plan.model`). Every problem is
/// reported through the context's diagnostic handler with its source
/// location; all of them are reported, not just the first. Returns null if
/// there was any error.
mlir::OwningOpRef<mlir::ModuleOp> importPlan(llvm::SourceMgr &sourceMgr,
                                             mlir::MLIRContext *context,
                                             const ImportOptions &options = {});

/// The largest plan file (and imported file) that is read, in bytes.
constexpr uint64_t kMaxPlanBytes = 16u << 20;

/// Empty if `text` can be a plan's source text; otherwise why not, e.g.
/// "not a text file (byte 0x7f at offset 0)". A file is taken for binary when
/// one of its first 4 bytes, or 8 or more bytes in all, are control bytes
/// (other than tab, newline and carriage return) or not UTF-8; a few stray
/// bytes in a text are reported at their line and column by importPlan.
std::string binaryContentProblem(llvm::StringRef text);

/// Reads a plan file: refuses, before reading, what is not a regular file
/// and files over kMaxPlanBytes, then binary content. Returns null and sets
/// `error` (a sentence without the file's name) on failure.
std::unique_ptr<llvm::MemoryBuffer> readPlanFile(llvm::StringRef path,
                                                 std::string &error);

} // namespace planc

#endif
