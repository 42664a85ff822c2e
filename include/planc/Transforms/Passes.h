//===- Passes.h - planc's passes --------------------------------*- C++ -*-===//
#ifndef PLANC_TRANSFORMS_PASSES_H
#define PLANC_TRANSFORMS_PASSES_H

#include "dialects/plan/PlanDialect.h"
#include "dialects/rank/RankDialect.h"
#include "mlir/Dialect/EmitC/IR/EmitC.h"
#include "mlir/Pass/Pass.h"

namespace planc {

#define GEN_PASS_DECL
#include "planc/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "planc/Transforms/Passes.h.inc"

} // namespace planc

#endif
