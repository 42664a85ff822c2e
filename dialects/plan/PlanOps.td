//===- PlanOps.td - Ops and attributes of the plan dialect ----------------===//
#ifndef PLAN_OPS_TD
#define PLAN_OPS_TD

include "dialects/plan/PlanAttrs.td"
include "dialects/plan/PlanInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/IR/CommonTypeConstraints.td"
include "mlir/IR/OpBase.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

//===----------------------------------------------------------------------===//
// Module-level ops
//===----------------------------------------------------------------------===//

def Plan_MeshOp : Plan_Op<"mesh", [Symbol]> {
  let summary = "A named device mesh: axes with sizes";
  let description = [{
    The ranks of a run arranged as a grid. Axes are listed outermost first;
    the last axis varies fastest across consecutive ranks (within a node).

    ```mlir
    plan.mesh @mesh axes = ["dp"] shape = [2]
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrArrayAttr:$axes,
                       DenseI64ArrayAttr:$shape);
  let assemblyFormat = "$sym_name `axes` `=` $axes `shape` `=` $shape attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getNumRanks();
    /// Index of axis `name`, or -1.
    int64_t getAxisIndex(::llvm::StringRef name);
    int64_t getAxisSize(::llvm::StringRef name);
  }];
}

def Plan_TrainOp : Plan_Op<"train"> {
  let summary = "Training-loop and optimizer settings of the program";
  let description = [{
    ```mlir
    plan.train {data = "synthetic", global_batch = 32 : i64, lr = 5.0e-02 : f64,
                optimizer = "sgd", seed = 42 : i64, steps = 50 : i64}
    ```
    `optimizer` is `sgd` or `adamw`; AdamW also uses beta1, beta2, eps and
    weight_decay.
  }];
  let arguments = (ins I64Attr:$steps, I64Attr:$seed, I64Attr:$global_batch,
                       StrAttr:$data, StrAttr:$optimizer, F64Attr:$lr,
                       DefaultValuedAttr<F64Attr, "0.9">:$beta1,
                       DefaultValuedAttr<F64Attr, "0.999">:$beta2,
                       DefaultValuedAttr<F64Attr, "1e-8">:$eps,
                       DefaultValuedAttr<F64Attr, "0.0">:$weight_decay);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Tensor ops
//===----------------------------------------------------------------------===//

def Plan_F32Tensor : RankedTensorOf<[F32]>;
def Plan_F32Scalar : 0DTensorOf<[F32]>;

// `overrides` names the interface methods with defaults that the op overrides.
class Plan_ComputeOp<string mnemonic, list<Trait> traits = [],
                     list<string> overrides = []>
    : Plan_Op<mnemonic, !listconcat(traits, [Pure,
        DeclareOpInterfaceMethods<ShardingRuleOpInterface, overrides>])>;

def Plan_MatmulOp : Plan_ComputeOp<"matmul", [], ["acceptsPartialOperands"]> {
  let summary = "Matrix product c = op(a) @ op(b) of 2-D tensors";
  let arguments = (ins Plan_F32Tensor:$lhs, Plan_F32Tensor:$rhs,
                       UnitAttr:$transpose_lhs, UnitAttr:$transpose_rhs);
  let results = (outs Plan_F32Tensor:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Plan_BiasAddOp : Plan_ComputeOp<"bias_add", [AllTypesMatch<["input", "result"]>]> {
  let summary = "Adds a 1-D bias along the last dimension";
  let arguments = (ins Plan_F32Tensor:$input, Plan_F32Tensor:$bias);
  let results = (outs Plan_F32Tensor:$result);
  let assemblyFormat = "$input `,` $bias attr-dict `:` type($input) `,` type($bias)";
  let hasVerifier = 1;
}

def Plan_BiasGradOp : Plan_ComputeOp<"bias_grad", [], ["acceptsPartialOperands"]> {
  let summary = "Gradient of a bias: sum of the output gradient over all but the last dimension";
  let arguments = (ins Plan_F32Tensor:$grad);
  let results = (outs Plan_F32Tensor:$result);
  let assemblyFormat = "$grad attr-dict `:` type($grad) `->` type($result)";
  let hasVerifier = 1;
}

class Plan_BinaryOp<string mnemonic, string doc, list<string> overrides = []>
    : Plan_ComputeOp<mnemonic, [SameOperandsAndResultType], overrides> {
  let summary = doc;
  let arguments = (ins Plan_F32Tensor:$lhs, Plan_F32Tensor:$rhs);
  let results = (outs Plan_F32Tensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

class Plan_UnaryOp<string mnemonic, string doc>
    : Plan_ComputeOp<mnemonic, [SameOperandsAndResultType]> {
  let summary = doc;
  let arguments = (ins Plan_F32Tensor:$input);
  let results = (outs Plan_F32Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Plan_AddOp : Plan_BinaryOp<"add", "Elementwise sum", ["acceptsPartialOperands"]>;
def Plan_ReluOp : Plan_UnaryOp<"relu", "max(x, 0)">;
def Plan_GeluOp : Plan_UnaryOp<"gelu", "GELU, tanh approximation">;
def Plan_ReluGradOp : Plan_BinaryOp<"relu_grad",
    "Input gradient of relu: `relu_grad %x, %dy` = dy * (x > 0)">;
def Plan_GeluGradOp : Plan_BinaryOp<"gelu_grad",
    "Input gradient of gelu: `gelu_grad %x, %dy` = dy * gelu'(x)">;

def Plan_MseLossOp : Plan_ComputeOp<"mse_loss",
    [AllTypesMatch<["prediction", "target"]>]> {
  let summary = "Mean squared error over all elements (a scalar)";
  let arguments = (ins Plan_F32Tensor:$prediction, Plan_F32Tensor:$target);
  let results = (outs Plan_F32Scalar:$result);
  let assemblyFormat = "$prediction `,` $target attr-dict `:` type($prediction) `->` type($result)";
  let hasVerifier = 1;
}

def Plan_MseLossGradOp : Plan_ComputeOp<"mse_loss_grad",
    [SameOperandsAndResultType]> {
  let summary = "Gradient of mse_loss with respect to the prediction (loss gradient 1)";
  let arguments = (ins Plan_F32Tensor:$prediction, Plan_F32Tensor:$target);
  let results = (outs Plan_F32Tensor:$result);
  let assemblyFormat = "$prediction `,` $target attr-dict `:` type($result)";
}

def Plan_SgdUpdateOp : Plan_ComputeOp<"sgd_update",
    [AllTypesMatch<["param", "grad", "result"]>]> {
  let summary = "Plain SGD step: result = param - lr * grad";
  let arguments = (ins Plan_F32Tensor:$param, Plan_F32Tensor:$grad, F32Attr:$lr);
  let results = (outs Plan_F32Tensor:$result);
  let assemblyFormat = "$param `,` $grad attr-dict `:` type($result)";
}

def Plan_AdamWUpdateOp : Plan_ComputeOp<"adamw_update",
    [AllTypesMatch<["param", "grad", "result"]>]> {
  let summary = "AdamW step with decoupled weight decay";
  let description = [{
    The moment estimates are optimizer state owned by the runtime, one pair
    per parameter; this op reads and advances them.
  }];
  let arguments = (ins Plan_F32Tensor:$param, Plan_F32Tensor:$grad, F32Attr:$lr,
                       F32Attr:$beta1, F32Attr:$beta2, F32Attr:$eps,
                       F32Attr:$weight_decay);
  let results = (outs Plan_F32Tensor:$result);
  let assemblyFormat = "$param `,` $grad attr-dict `:` type($result)";
}

def Plan_AllReduceOp : Plan_Op<"all_reduce", [Pure, SameOperandsAndResultType]> {
  let summary = "Resolves a partial sum over mesh axes";
  let description = [{
    At the global level the value does not change: a tensor that is
    `partial` over `axes` becomes replicated over them. Lowering to the rank
    level turns it into an all-reduce among the ranks that differ only in
    those axes.
  }];
  let arguments = (ins Plan_F32Tensor:$input, StrArrayAttr:$axes);
  let results = (outs Plan_F32Tensor:$result);
  let assemblyFormat = "$input `over` $axes attr-dict `:` type($result)";
}

#endif
