//===- plan-opt.cpp - mlir-opt with planc's dialects and passes -----------===//
#include "planc/Transforms/Passes.h"
#include "planc/Transforms/Pipeline.h"

#include "mlir/Dialect/EmitC/IR/EmitC.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<planc::plan::PlanDialect, planc::rank::RankDialect,
                  mlir::func::FuncDialect, mlir::memref::MemRefDialect,
                  mlir::emitc::EmitCDialect>();
  planc::registerPlancPasses();
  planc::registerPipeline();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "planc optimizer driver (dialects plan and rank)\n",
      registry));
}
