//===- RankDialect.h - The per-rank planc dialect ---------------*- C++ -*-===//
#ifndef PLANC_DIALECTS_RANK_RANKDIALECT_H
#define PLANC_DIALECTS_RANK_RANKDIALECT_H

#include "dialects/plan/PlanDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

#include "dialects/rank/RankDialect.h.inc"
#include "dialects/rank/RankInterfaces.h.inc"

#define GET_OP_CLASSES
#include "dialects/rank/RankOps.h.inc"

#endif
