//===- Codegen.h - From EmitC to an executable ------------------*- C++ -*-===//
#ifndef PLANC_CODEGEN_CODEGEN_H
#define PLANC_CODEGEN_CODEGEN_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace planc {

enum class Target { Host, Cuda };

/// Prints the EmitC module as C++ (host) or CUDA C++ (cuda) source.
mlir::LogicalResult emitSource(mlir::ModuleOp module, Target target,
                               llvm::raw_ostream &os);

/// Where the runtime's headers and libraries are, and how to compile.
struct Toolchain {
  std::string runtimeInclude; ///< directory holding planrt/planrt.h
  std::string runtimeLibDir;  ///< directory holding libplanrt_*.a
  std::string hostCompiler;   ///< MPI C++ compiler wrapper (mpicxx)
  std::string nvcc;
  std::string cudaRoot;
  std::string cudaArchs; ///< e.g. "80;90"
  /// Defaults from the build that produced this planc, overridable with the
  /// PLANC_RUNTIME_DIR (include and lib under it), PLANC_CXX and
  /// PLANC_NVCC environment variables.
  static Toolchain fromBuild();
};

/// Compiles `sourcePath` to the executable `outPath` and links planrt. On
/// failure, prints the failing command and returns failure. The compiler
/// writes a temporary file next to `outPath` that is renamed to it only on
/// success, and runs in its own process group, stopped (and the temporary
/// removed) if planc is interrupted.
mlir::LogicalResult compileExecutable(const std::string &sourcePath,
                                      const std::string &outPath, Target target,
                                      const Toolchain &tc, bool verbose);

} // namespace planc

#endif
