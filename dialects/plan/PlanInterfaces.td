//===- PlanInterfaces.td - Sharding rules of plan ops ---------------------===//
#ifndef PLAN_INTERFACES_TD
#define PLAN_INTERFACES_TD

include "mlir/IR/OpBase.td"

def ShardingRuleOpInterface : OpInterface<"ShardingRuleOpInterface"> {
  let cppNamespace = "::planc::plan";
  let description = [{
    How an op's result is distributed given how its operands are: the rule
    that sharding propagation applies op by op. A dimension of the result is
    split over a mesh axis when it comes from a split operand dimension; a
    reduction or contraction over a split dimension makes the result
    `partial` over that axis (each rank holds a summand).
  }];
  let methods = [
    InterfaceMethod<
      "Result sharding from operand shardings; emits an error and fails when "
      "the operands' shardings are incompatible.",
      "::mlir::FailureOr<::planc::plan::ShardingAttr>", "inferResultSharding",
      (ins "::llvm::ArrayRef<::planc::plan::ShardingAttr>":$operands)>,
    InterfaceMethod<
      "Shardings of every result; ops with several results override this "
      "(their inferResultSharding gives the first).",
      "::mlir::FailureOr<::llvm::SmallVector<::planc::plan::ShardingAttr>>",
      "inferResultShardings",
      (ins "::llvm::ArrayRef<::planc::plan::ShardingAttr>":$operands),
      /*methodBody=*/"", /*defaultImplementation=*/[{
        auto s = $_op.inferResultSharding(operands);
        if (::mlir::failed(s))
          return ::mlir::failure();
        return ::llvm::SmallVector<::planc::plan::ShardingAttr>{*s};
      }]>,
    InterfaceMethod<
      "Whether the op is linear in its operands, so that partial operands "
      "give a partial result without communication.",
      "bool", "acceptsPartialOperands",
      (ins "::llvm::ArrayRef<::planc::plan::ShardingAttr>":$operands),
      /*methodBody=*/"", /*defaultImplementation=*/"return false;">,
  ];
}

#endif
