//===- OneFloatType.h - One float element type per op -----------*- C++ -*-===//
//
// The plan and rank dialects carry f32, bf16 and f16 (and i32 ids). Every
// float operand and result of one op has the same element type: a kernel
// computes in one type, and conversions between types are explicit ops
// (mixed precision, issue 9: not produced yet; the frontend builds f32).
//===----------------------------------------------------------------------===//
#ifndef PLANC_DIALECTS_PLAN_ONEFLOATTYPE_H
#define PLANC_DIALECTS_PLAN_ONEFLOATTYPE_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"

namespace planc {

inline mlir::LogicalResult verifyOneFloatType(mlir::Operation *op) {
  mlir::Type first;
  auto check = [&](mlir::Type t) -> mlir::LogicalResult {
    auto shaped = mlir::dyn_cast<mlir::ShapedType>(t);
    if (!shaped || !mlir::isa<mlir::FloatType>(shaped.getElementType()))
      return mlir::success();
    mlir::Type e = shaped.getElementType();
    if (!first)
      first = e;
    else if (e != first)
      return op->emitOpError()
             << "mixes float element types " << first << " and " << e
             << "; the float operands and results of one op share one type";
    return mlir::success();
  };
  for (mlir::Type t : op->getOperandTypes())
    if (mlir::failed(check(t)))
      return mlir::failure();
  for (mlir::Type t : op->getResultTypes())
    if (mlir::failed(check(t)))
      return mlir::failure();
  return mlir::success();
}

template <typename ConcreteType>
class OneFloatType
    : public mlir::OpTrait::TraitBase<ConcreteType, OneFloatType> {
public:
  static mlir::LogicalResult verifyTrait(mlir::Operation *op) {
    return verifyOneFloatType(op);
  }
};

} // namespace planc

#endif
