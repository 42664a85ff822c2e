//===- RankDialect.cpp - The per-rank planc dialect -----------------------===//
#include "dialects/rank/RankDialect.h"

#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace planc::rank;

#include "dialects/rank/RankDialect.cpp.inc"
#include "dialects/rank/RankInterfaces.cpp.inc"

#define GET_OP_CLASSES
#include "dialects/rank/RankOps.cpp.inc"

void RankDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/rank/RankOps.cpp.inc"
      >();
}

LogicalResult InputDeclOp::verify() {
  if (getRole() != "input" && getRole() != "label")
    return emitOpError() << "role must be \"input\" or \"label\", got \""
                         << getRole() << "\"";
  return success();
}

template <typename DeclOp>
static LogicalResult verifyDeclRef(Operation *op, FlatSymbolRefAttr name,
                                   Type type, SymbolTableCollection &tables,
                                   StringRef what) {
  auto decl = tables.lookupNearestSymbolFrom<DeclOp>(op, name);
  if (!decl)
    return op->emitOpError()
           << "refers to " << name << ", which is not a " << what;
  if (decl.getType() != type)
    return op->emitOpError() << "has type " << type << " but " << name
                             << " is declared as " << decl.getType();
  return success();
}

LogicalResult ParamOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyDeclRef<ParamDeclOp>(*this, getNameAttr(), getType(), tables,
                                    "rank.param_decl");
}

LogicalResult InputOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyDeclRef<InputDeclOp>(*this, getNameAttr(), getType(), tables,
                                    "rank.input_decl");
}

LogicalResult MatmulOp::verify() {
  auto a = getLhs().getType(), b = getRhs().getType(), c = getOut().getType();
  if (a.getRank() != 2 || b.getRank() != 2 || c.getRank() != 2)
    return emitOpError() << "expects 2-D buffers";
  int64_t m = a.getDimSize(getTransposeLhs() ? 1 : 0);
  int64_t k = a.getDimSize(getTransposeLhs() ? 0 : 1);
  int64_t k2 = b.getDimSize(getTransposeRhs() ? 1 : 0);
  int64_t n = b.getDimSize(getTransposeRhs() ? 0 : 1);
  if (k != k2 || c.getDimSize(0) != m || c.getDimSize(1) != n)
    return emitOpError() << "shapes do not agree: " << a << ", " << b << " -> "
                         << c;
  return success();
}

SmallVector<StringRef> AdamWUpdateOp::getRuntimeAttrNames() {
  // planrt::adamw_update(ctx, w, g, param_index, lr, beta1, beta2, eps, wd).
  return {"param_index", "lr", "beta1", "beta2", "eps", "weight_decay"};
}
