//===- OpFlops.h - Floating-point operations of a plan op ------*- C++ -*-===//
//
// The arithmetic of one op of the plan dialect on its global shapes, used to
// balance pipeline stages and to give the schedule its durations (the cost
// model's times will replace it). Counts multiply-adds as 2.
//===----------------------------------------------------------------------===//
#ifndef PLANC_TRANSFORMS_OPFLOPS_H
#define PLANC_TRANSFORMS_OPFLOPS_H

#include "mlir/IR/Operation.h"

namespace planc {
/// FLOPs of `op`: 2 M N K for a matmul, 4 B S^2 (H D) for causal attention
/// (twice that for its gradient), one per result element for the rest;
/// collectives and reshapes count 0.
double opFlops(mlir::Operation *op);
} // namespace planc

#endif
