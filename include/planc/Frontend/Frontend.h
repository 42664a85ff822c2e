//===- Frontend.h - .plan files to the plan dialect -------------*- C++ -*-===//
#ifndef PLANC_FRONTEND_FRONTEND_H
#define PLANC_FRONTEND_FRONTEND_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/SourceMgr.h"

namespace planc {

/// Parses and checks the .plan file held by the main buffer of `sourceMgr`
/// and builds its module in the plan dialect: a `plan.mesh`, a `plan.train`
/// and the model's forward function (marked `plan.model`). Every problem is
/// reported through the context's diagnostic handler with its source
/// location; all of them are reported, not just the first. Returns null if
/// there was any error.
mlir::OwningOpRef<mlir::ModuleOp> importPlan(llvm::SourceMgr &sourceMgr,
                                             mlir::MLIRContext *context);

} // namespace planc

#endif
