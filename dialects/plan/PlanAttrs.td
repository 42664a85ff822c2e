//===- PlanAttrs.td - Attributes of the plan dialect ----------------------===//
#ifndef PLAN_ATTRS_TD
#define PLAN_ATTRS_TD

include "dialects/plan/PlanBase.td"

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

def Plan_ShardingAttr : Plan_Attr<"Sharding", "sharding"> {
  let summary = "How a tensor is distributed over the axes of a mesh";
  let description = [{
    `dims` has one list of mesh axis names per tensor dimension: the
    dimension is split evenly over those axes (empty: not split). `partial`
    lists the axes over which the tensor is a pending sum: each rank holds a
    summand and the value is their sum. Everything not split or partial is
    replicated.

    A split dimension may be made of `segments` (global sizes, written after
    its axes): each segment is split on its own and a rank holds its block
    of every segment, in order. A packed `[q | k | v]` attention projection
    is split by heads that way.

    ```mlir
    #plan.sharding<@mesh, [[dp], []]>                 // batch split over dp
    #plan.sharding<@mesh, [[], []], partial = [dp]>   // dp-partial gradient
    #plan.sharding<@mesh, [[tp] {64, 64, 64}, []]>     // q, k, v split by heads
    ```
  }];
  let parameters = (ins "::mlir::FlatSymbolRefAttr":$mesh,
                        "::mlir::ArrayAttr":$dims,
                        "::mlir::ArrayAttr":$partial,
                        "::mlir::ArrayAttr":$segments);
  let builders = [
    // No segmented dimension.
    AttrBuilder<(ins "::mlir::FlatSymbolRefAttr":$mesh,
                     "::mlir::ArrayAttr":$dims, "::mlir::ArrayAttr":$partial), [{
      return $_get($_ctxt, mesh, dims, partial, ::mlir::ArrayAttr::get($_ctxt, {}));
    }]>
  ];
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Fully replicated sharding of a rank-`rank` tensor.
    static ShardingAttr getReplicated(::mlir::MLIRContext *ctx,
                                      ::mlir::FlatSymbolRefAttr mesh,
                                      int64_t rank);
    /// Mesh axes that split dimension `dim`.
    ::llvm::SmallVector<::llvm::StringRef> getDimAxes(int64_t dim) const;
    ::llvm::SmallVector<::llvm::StringRef> getPartialAxes() const;
    /// Global segment sizes of dimension `dim` (empty: one segment).
    ::llvm::ArrayRef<int64_t> getDimSegments(int64_t dim) const;
    bool isPartial() const { return !getPartial().empty(); }
    bool isReplicated() const;
    int64_t getRank() const { return getDims().size(); }
  }];
}

def Plan_InitAttr : Plan_Attr<"Init", "init"> {
  let summary = "How a parameter is initialized";
  let description = [{
    `#plan.init<zeros>`, `#plan.init<ones>`, `#plan.init<normal, mean, std>`,
    `#plan.init<uniform, low, high>`. Values depend only on the seed, the
    parameter's name and the element's global index, never on the plan.
  }];
  let parameters = (ins StringRefParameter<>:$kind, "::llvm::APFloat":$a,
                        "::llvm::APFloat":$b);
  let builders = [
    AttrBuilder<(ins "::llvm::StringRef":$kind, "double":$a, "double":$b), [{
      return $_get($_ctxt, kind, ::llvm::APFloat(a), ::llvm::APFloat(b));
    }]>
  ];
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

#endif
