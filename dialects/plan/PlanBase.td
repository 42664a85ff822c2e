//===- PlanBase.td - The global (tensor-semantics) planc dialect ----------===//
#ifndef PLAN_BASE_TD
#define PLAN_BASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Plan_Dialect : Dialect {
  let name = "plan";
  let cppNamespace = "::planc::plan";
  let summary = "Global level of planc: the model and its training step on "
                "whole tensors, with sharding as attributes on a device mesh";
  let description = [{
    Values are builtin ranked tensors with their global shapes. How a value
    is laid out across ranks is a `#plan.sharding` attribute that refers to a
    `plan.mesh` (named axes with sizes, e.g. dp). Lowering to the `rank`
    dialect turns global shapes into per-rank shapes and sharding changes
    into explicit collectives.
  }];
  let useDefaultAttributePrinterParser = 1;
  let dependentDialects = ["::mlir::func::FuncDialect"];
}

// Every float operand and result of an op has one element type (f32, bf16
// or f16): see dialects/plan/OneSixteenBitType.h.
def Plan_OneSixteenBitType : NativeOpTrait<"OneSixteenBitType"> {
  let cppNamespace = "::planc";
}

class Plan_Op<string mnemonic, list<Trait> traits = []>
    : Op<Plan_Dialect, mnemonic, !listconcat(traits, [Plan_OneSixteenBitType])>;
class Plan_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<Plan_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

#endif
