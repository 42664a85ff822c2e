//===- PlanInterfaces.td - Sharding rules of plan ops ---------------------===//
#ifndef PLAN_INTERFACES_TD
#define PLAN_INTERFACES_TD

include "mlir/IR/OpBase.td"

def ShardingRuleOpInterface : OpInterface<"ShardingRuleOpInterface"> {
  let cppNamespace = "::planc::plan";
  let description = [{
    The op's sharding rule as data (dialects/plan/ShardingRule.h): the
    factors of its iteration space, which factor each dimension of each
    operand and result is, which factors must stay whole, and in which
    operands the op is linear (so pending sums pass through it). Sharding
    propagation, reshard insertion and the partitioner read nothing else.
  }];
  let methods = [
    InterfaceMethod<"The op's sharding rule.",
      "::planc::plan::OpShardingRule", "getShardingRule", (ins)>,
  ];
}

#endif
