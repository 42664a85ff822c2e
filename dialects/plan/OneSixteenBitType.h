//===- OneSixteenBitType.h - At most one 16-bit float type per op -*- C++
//-*-===//
//
// The plan and rank dialects carry f32, bf16 and f16 (and i32 ids). Every
// op computes in fp32 (planrt widens 16-bit operands and rounds 16-bit
// results), so an op may mix f32 with one 16-bit type: bf16 activations
// with an f32 weight gradient (mixed precision, plan-fuse-casts), or f32
// logits from bf16 operands. bf16 and f16 never meet in one op: a model
// trains in one precision, and conversions between them are plan.cast.
//===----------------------------------------------------------------------===//
#ifndef PLANC_DIALECTS_PLAN_ONESIXTEENBITTYPE_H
#define PLANC_DIALECTS_PLAN_ONESIXTEENBITTYPE_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"

namespace planc {

inline mlir::LogicalResult verifyOneSixteenBitType(mlir::Operation *op) {
  mlir::Type first;
  auto check = [&](mlir::Type t) -> mlir::LogicalResult {
    auto shaped = mlir::dyn_cast<mlir::ShapedType>(t);
    if (!shaped || !mlir::isa<mlir::FloatType>(shaped.getElementType()) ||
        shaped.getElementType().isF32())
      return mlir::success();
    mlir::Type e = shaped.getElementType();
    if (!first)
      first = e;
    else if (e != first)
      return op->emitOpError()
             << "mixes the 16-bit float types " << first << " and " << e
             << "; one op holds f32 and at most one 16-bit type (convert "
                "with plan.cast)";
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
class OneSixteenBitType
    : public mlir::OpTrait::TraitBase<ConcreteType, OneSixteenBitType> {
public:
  static mlir::LogicalResult verifyTrait(mlir::Operation *op) {
    return verifyOneSixteenBitType(op);
  }
};

} // namespace planc

#endif
