//===- plan-fuzz.cpp - libFuzzer target for the .plan frontend ------------===//
//
// Feeds arbitrary bytes to planc::importPlan as the file `fuzz.plan`. Errors
// are expected and swallowed; a crash, sanitizer report, hang or runaway
// memory use is a bug, and so is a module that comes back but does not
// verify: the frontend must either report an error or produce valid IR.
// Built only by scripts/fuzz.sh (-DPLANC_FUZZ=ON, clang).
//===----------------------------------------------------------------------===//
#include "dialects/plan/PlanDialect.h"
#include "planc/Frontend/Frontend.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdlib>

// LLVM's BumpPtrAllocator poisons its slabs when compiled with ASan and
// unpoisons what it hands out. Our instrumented code and Debian's
// uninstrumented MLIR libraries both carry inline copies of it, and the
// linker keeps one: an instrumented AllocateSlow poisons a slab that an
// uninstrumented Allocate then never unpoisons (a false use-after-poison in
// MLIRContext's constructor). Manual poisoning is therefore switched off;
// ASan's own redzones are unaffected.
extern "C" const char *__asan_default_options() {
  return "allow_user_poisoning=0";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mlir::MLIRContext context(mlir::MLIRContext::Threading::DISABLED);
  context.loadDialect<planc::plan::PlanDialect, mlir::func::FuncDialect>();

  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(
      llvm::MemoryBuffer::getMemBufferCopy(
          llvm::StringRef(reinterpret_cast<const char *>(data), size),
          "fuzz.plan"),
      llvm::SMLoc());
  // Diagnostics are the expected outcome for most inputs: drop them, but
  // show the verifier's.
  bool verifying = false;
  mlir::ScopedDiagnosticHandler handler(&context, [&](mlir::Diagnostic &d) {
    if (verifying)
      llvm::errs() << d.getLocation() << ": " << d << "\n";
    return mlir::success();
  });

  mlir::OwningOpRef<mlir::ModuleOp> module =
      planc::importPlan(sourceMgr, &context);
  verifying = true;
  if (module && mlir::failed(mlir::verify(*module))) {
    llvm::errs() << "importPlan returned a module that does not verify:\n";
    module->print(llvm::errs(), mlir::OpPrintingFlags().assumeVerified());
    llvm::errs() << "\n";
    std::abort();
  }
  return 0;
}
