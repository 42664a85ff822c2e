//===- ArgAttrBatch.h - Set many argument attributes at once ---*- C++ -*-===//
//
// func::FuncOp::setArgAttr rebuilds the array of all argument attributes on
// every call, so setting one attribute per argument costs time and memory
// quadratic in the arguments (a 1000-layer model has 50000). This collects
// the changes and writes the array once.
//===----------------------------------------------------------------------===//
#ifndef PLANC_TRANSFORMS_ARGATTRBATCH_H
#define PLANC_TRANSFORMS_ARGATTRBATCH_H

#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace planc {
class ArgAttrBatch {
public:
  explicit ArgAttrBatch(mlir::func::FuncOp f) : f(f) {
    for (unsigned i = 0; i < f.getNumArguments(); ++i)
      lists.emplace_back(f.getArgAttrDict(i));
  }
  void set(unsigned i, llvm::StringRef name, mlir::Attribute value) {
    lists[i].set(name, value);
  }
  /// Writes the attributes (once).
  void commit() {
    llvm::SmallVector<mlir::DictionaryAttr> dicts;
    for (mlir::NamedAttrList &l : lists)
      dicts.push_back(l.getDictionary(f.getContext()));
    f.setAllArgAttrs(dicts);
  }

private:
  mlir::func::FuncOp f;
  llvm::SmallVector<mlir::NamedAttrList> lists;
};
} // namespace planc

#endif
