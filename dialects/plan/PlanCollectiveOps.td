//===- PlanCollectiveOps.td - Layout changes of the plan dialect ----------===//
//
// `plan.reshard` says that a value must change layout; plan-insert-reshards
// puts one wherever a use needs another layout than its value has, and
// plan-expand-reshards replaces it by the cheapest collectives below, each
// on one named mesh axis (all-reduce: on several). At the global level none
// of them changes the value: only how it is held by the ranks.
//===----------------------------------------------------------------------===//
#ifndef PLAN_COLLECTIVE_OPS_TD
#define PLAN_COLLECTIVE_OPS_TD

class Plan_LayoutOp<string mnemonic, list<Trait> traits = []>
    : Plan_Op<mnemonic, !listconcat(traits, [Pure, SameOperandsAndResultType])>;

def Plan_ReshardOp : Plan_LayoutOp<"reshard"> {
  let summary = "The operand, distributed as `sharding`";
  let description = [{
    ```mlir
    %y = plan.reshard %x <@mesh, [[dp], []]> : tensor<8x4xf32>
    ```
    The operand's own sharding is the one recorded on its definition.
    plan-expand-reshards turns each reshard into collectives.
  }];
  let arguments = (ins Plan_MovableTensor:$input, Plan_ShardingAttr:$sharding);
  let results = (outs Plan_MovableTensor:$result);
  let assemblyFormat = "$input $sharding attr-dict `:` type($result)";
}

def Plan_AllReduceOp : Plan_LayoutOp<"all_reduce"> {
  let summary = "Resolves a partial sum over mesh axes";
  let description = [{
    A tensor that is `partial` over `axes` becomes whole over them: an
    all-reduce among the ranks that differ only in those axes.

    ```mlir
    %g = plan.all_reduce %p over ["dp"] : tensor<64x64xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input, StrArrayAttr:$axes);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input `over` $axes attr-dict `:` type($result)";
}

def Plan_AllGatherOp : Plan_LayoutOp<"all_gather"> {
  let summary = "Unsplits dimension `dim` over mesh axis `axis`";
  let description = [{
    Dimension `dim` was split over `axis` (its innermost axis); afterwards
    every rank of the axis holds the blocks of all of them.

    ```mlir
    %w = plan.all_gather %s dim 0 over "dp" : tensor<64x64xf32>
    ```
  }];
  let arguments = (ins Plan_MovableTensor:$input, I64Attr:$dim, StrAttr:$axis);
  let results = (outs Plan_MovableTensor:$result);
  let assemblyFormat = "$input `dim` $dim `over` $axis attr-dict `:` type($result)";
}

def Plan_ReduceScatterOp : Plan_LayoutOp<"reduce_scatter"> {
  let summary = "Resolves a partial sum over `axis` and splits `dim` over it";
  let description = [{
    Each rank of `axis` keeps its block (along `dim`) of the sum: what an
    all-reduce followed by a local slice would give, for half the traffic.

    ```mlir
    %g = plan.reduce_scatter %p dim 0 over "dp" : tensor<64x64xf32>
    ```
  }];
  let arguments = (ins Plan_FloatTensor:$input, I64Attr:$dim, StrAttr:$axis);
  let results = (outs Plan_FloatTensor:$result);
  let assemblyFormat = "$input `dim` $dim `over` $axis attr-dict `:` type($result)";
}

def Plan_AllSliceOp : Plan_LayoutOp<"all_slice"> {
  let summary = "Splits a whole dimension over `axis`: each rank keeps its block";
  let description = [{
    No communication: the ranks of `axis` already hold the whole dimension.

    ```mlir
    %s = plan.all_slice %w dim 0 over "dp" : tensor<64x64xf32>
    ```
  }];
  let arguments = (ins Plan_MovableTensor:$input, I64Attr:$dim, StrAttr:$axis);
  let results = (outs Plan_MovableTensor:$result);
  let assemblyFormat = "$input `dim` $dim `over` $axis attr-dict `:` type($result)";
}

def Plan_AllToAllOp : Plan_LayoutOp<"all_to_all"> {
  let summary = "Moves the split over `axis` from `gather_dim` to `split_dim`";
  let description = [{
    ```mlir
    %t = plan.all_to_all %x gather 1 split 0 over "tp" : tensor<8x16x64xf32>
    ```
  }];
  let arguments = (ins Plan_MovableTensor:$input, I64Attr:$gather_dim,
                       I64Attr:$split_dim, StrAttr:$axis);
  let results = (outs Plan_MovableTensor:$result);
  let assemblyFormat = [{
    $input `gather` $gather_dim `split` $split_dim `over` $axis attr-dict `:` type($result)
  }];
}

#endif
