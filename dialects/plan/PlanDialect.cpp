//===- PlanDialect.cpp - The global planc dialect -------------------------===//
#include "dialects/plan/PlanDialect.h"

#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace planc::plan;

#include "dialects/plan/PlanDialect.cpp.inc"
#include "dialects/plan/PlanInterfaces.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "dialects/plan/PlanAttrs.cpp.inc"

#define GET_OP_CLASSES
#include "dialects/plan/PlanOps.cpp.inc"

void PlanDialect::initialize() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "dialects/plan/PlanAttrs.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "dialects/plan/PlanOps.cpp.inc"
      >();
}

//===----------------------------------------------------------------------===//
// ShardingAttr
//===----------------------------------------------------------------------===//

static ArrayAttr axisList(MLIRContext *ctx, ArrayRef<StringRef> axes) {
  SmallVector<Attribute> attrs;
  for (StringRef a : axes)
    attrs.push_back(StringAttr::get(ctx, a));
  return ArrayAttr::get(ctx, attrs);
}

static SmallVector<StringRef> axisNames(ArrayAttr list) {
  SmallVector<StringRef> names;
  for (Attribute a : list)
    names.push_back(cast<StringAttr>(a).getValue());
  return names;
}

ShardingAttr ShardingAttr::getReplicated(MLIRContext *ctx,
                                         FlatSymbolRefAttr mesh, int64_t rank) {
  SmallVector<Attribute> dims(rank, ArrayAttr::get(ctx, {}));
  return ShardingAttr::get(ctx, mesh, ArrayAttr::get(ctx, dims),
                           ArrayAttr::get(ctx, {}));
}

SmallVector<StringRef> ShardingAttr::getDimAxes(int64_t dim) const {
  return axisNames(cast<ArrayAttr>(getDims()[dim]));
}

SmallVector<StringRef> ShardingAttr::getPartialAxes() const {
  return axisNames(getPartial());
}

bool ShardingAttr::isReplicated() const {
  return !isPartial() && llvm::all_of(getDims(), [](Attribute d) {
    return cast<ArrayAttr>(d).empty();
  });
}

LogicalResult ShardingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                   FlatSymbolRefAttr mesh, ArrayAttr dims,
                                   ArrayAttr partial) {
  if (!mesh)
    return emitError() << "sharding needs a mesh";
  llvm::SmallSetVector<StringRef, 4> seen;
  auto check = [&](ArrayAttr list) -> LogicalResult {
    for (Attribute a : list) {
      auto s = dyn_cast<StringAttr>(a);
      if (!s)
        return emitError() << "mesh axes must be names";
      if (!seen.insert(s.getValue()))
        return emitError() << "mesh axis '" << s.getValue()
                           << "' is used more than once in one sharding";
    }
    return success();
  };
  for (Attribute d : dims) {
    auto list = dyn_cast<ArrayAttr>(d);
    if (!list)
      return emitError() << "each dimension's sharding must be a list of axes";
    if (failed(check(list)))
      return failure();
  }
  return check(partial);
}

static ParseResult parseAxisList(AsmParser &parser,
                                 SmallVectorImpl<Attribute> &axes) {
  return parser.parseCommaSeparatedList(
      AsmParser::Delimiter::Square, [&]() -> ParseResult {
        std::string name;
        if (parser.parseKeywordOrString(&name))
          return failure();
        axes.push_back(StringAttr::get(parser.getContext(), name));
        return success();
      });
}

Attribute ShardingAttr::parse(AsmParser &parser, Type) {
  MLIRContext *ctx = parser.getContext();
  FlatSymbolRefAttr mesh;
  SmallVector<Attribute> dims, partial;
  if (parser.parseLess() || parser.parseAttribute(mesh) || parser.parseComma())
    return {};
  if (parser.parseCommaSeparatedList(
          AsmParser::Delimiter::Square, [&]() -> ParseResult {
            SmallVector<Attribute> axes;
            if (parseAxisList(parser, axes))
              return failure();
            dims.push_back(ArrayAttr::get(ctx, axes));
            return success();
          }))
    return {};
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseKeyword("partial") || parser.parseEqual() ||
        parseAxisList(parser, partial))
      return {};
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<ShardingAttr>(ctx, mesh, ArrayAttr::get(ctx, dims),
                                         ArrayAttr::get(ctx, partial));
}

static void printAxisList(AsmPrinter &printer, ArrayAttr axes) {
  printer << '[';
  llvm::interleaveComma(axes, printer, [&](Attribute a) {
    printer.printKeywordOrString(cast<StringAttr>(a).getValue());
  });
  printer << ']';
}

void ShardingAttr::print(AsmPrinter &printer) const {
  printer << '<' << getMesh() << ", [";
  llvm::interleaveComma(getDims(), printer, [&](Attribute d) {
    printAxisList(printer, cast<ArrayAttr>(d));
  });
  printer << ']';
  if (isPartial()) {
    printer << ", partial = ";
    printAxisList(printer, getPartial());
  }
  printer << '>';
}

//===----------------------------------------------------------------------===//
// InitAttr
//===----------------------------------------------------------------------===//

static bool initTakesValues(StringRef kind) {
  return kind == "normal" || kind == "uniform";
}

LogicalResult InitAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               StringRef kind, APFloat aF, APFloat bF) {
  double a = aF.convertToDouble(), b = bF.convertToDouble();
  if (kind != "zeros" && kind != "ones" && !initTakesValues(kind))
    return emitError() << "unknown initializer '" << kind
                       << "'; expected zeros, ones, normal or uniform";
  if (kind == "normal" && !(b >= 0))
    return emitError() << "normal initializer needs a standard deviation >= 0";
  if (kind == "uniform" && !(a < b))
    return emitError() << "uniform initializer needs low < high";
  return success();
}

Attribute InitAttr::parse(AsmParser &parser, Type) {
  std::string kind;
  double a = 0, b = 0;
  if (parser.parseLess() || parser.parseKeywordOrString(&kind))
    return {};
  if (initTakesValues(kind) && (parser.parseComma() || parser.parseFloat(a) ||
                                parser.parseComma() || parser.parseFloat(b)))
    return {};
  if (parser.parseGreater())
    return {};
  return parser.getChecked<InitAttr>(parser.getContext(), kind, APFloat(a),
                                     APFloat(b));
}

void InitAttr::print(AsmPrinter &printer) const {
  printer << '<' << getKind();
  if (initTakesValues(getKind()))
    printer << ", " << getA().convertToDouble() << ", "
            << getB().convertToDouble();
  printer << '>';
}

//===----------------------------------------------------------------------===//
// Helpers
//===----------------------------------------------------------------------===//

ShardingAttr planc::plan::getSharding(Value value) {
  if (auto arg = dyn_cast<BlockArgument>(value)) {
    auto func = dyn_cast<func::FuncOp>(arg.getOwner()->getParentOp());
    if (!func)
      return {};
    return func.getArgAttrOfType<ShardingAttr>(arg.getArgNumber(),
                                               kShardingAttr);
  }
  return value.getDefiningOp()->getAttrOfType<ShardingAttr>(kShardingAttr);
}

void planc::plan::setSharding(Operation *op, ShardingAttr sharding) {
  op->setAttr(kShardingAttr, sharding);
}

ShardingAttr planc::plan::dropPartial(ShardingAttr s) {
  return ShardingAttr::get(s.getContext(), s.getMesh(), s.getDims(),
                           ArrayAttr::get(s.getContext(), {}));
}

MeshOp planc::plan::getMesh(ModuleOp module) {
  auto meshes = module.getOps<MeshOp>();
  return meshes.empty() ? MeshOp() : *meshes.begin();
}

SmallVector<int64_t> planc::plan::getLocalShape(ArrayRef<int64_t> shape,
                                                ShardingAttr sharding,
                                                MeshOp mesh) {
  SmallVector<int64_t> local(shape);
  if (!sharding)
    return local;
  for (int64_t d = 0; d < (int64_t)local.size(); ++d)
    for (StringRef axis : sharding.getDimAxes(d))
      local[d] /= mesh.getAxisSize(axis);
  return local;
}

//===----------------------------------------------------------------------===//
// Verifiers
//===----------------------------------------------------------------------===//

int64_t MeshOp::getNumRanks() {
  int64_t n = 1;
  for (int64_t s : getShape())
    n *= s;
  return n;
}

int64_t MeshOp::getAxisIndex(StringRef name) {
  for (auto [i, a] : llvm::enumerate(getAxes()))
    if (cast<StringAttr>(a).getValue() == name)
      return i;
  return -1;
}

int64_t MeshOp::getAxisSize(StringRef name) {
  int64_t i = getAxisIndex(name);
  return i < 0 ? 1 : getShape()[i];
}

LogicalResult MeshOp::verify() {
  if (getAxes().size() != getShape().size())
    return emitOpError() << "has " << getAxes().size() << " axes but "
                         << getShape().size() << " sizes";
  llvm::SmallSetVector<StringRef, 4> names;
  for (auto [a, s] : llvm::zip(getAxes(), getShape())) {
    StringRef name = cast<StringAttr>(a).getValue();
    if (!names.insert(name))
      return emitOpError() << "axis '" << name << "' is declared twice";
    if (s < 1)
      return emitOpError() << "axis '" << name << "' has size " << s
                           << "; sizes must be at least 1";
  }
  return success();
}

LogicalResult TrainOp::verify() {
  if (getStepsAttr().getInt() < 0)
    return emitOpError() << "steps must be >= 0";
  if (getGlobalBatchAttr().getInt() < 1)
    return emitOpError() << "global_batch must be >= 1";
  if (getData() != "synthetic")
    return emitOpError() << "unknown data source '" << getData()
                         << "'; expected \"synthetic\"";
  if (getOptimizer() != "sgd" && getOptimizer() != "adamw")
    return emitOpError() << "unknown optimizer '" << getOptimizer()
                         << "'; expected \"sgd\" or \"adamw\"";
  if (!(getLr().convertToDouble() > 0))
    return emitOpError() << "lr must be > 0";
  return success();
}

static LogicalResult expectRank(Operation *op, Value v, int64_t rank,
                                StringRef what) {
  auto type = cast<RankedTensorType>(v.getType());
  if (type.getRank() != rank)
    return op->emitOpError()
           << "expects " << what << " of rank " << rank << ", got " << type;
  return success();
}

/// Rows/cols of op(x) for a 2-D tensor.
static std::pair<int64_t, int64_t> opShape(Value v, bool transposed) {
  auto s = cast<RankedTensorType>(v.getType()).getShape();
  return transposed ? std::make_pair(s[1], s[0]) : std::make_pair(s[0], s[1]);
}

LogicalResult MatmulOp::verify() {
  if (failed(expectRank(*this, getLhs(), 2, "a 2-D lhs")) ||
      failed(expectRank(*this, getRhs(), 2, "a 2-D rhs")) ||
      failed(expectRank(*this, getResult(), 2, "a 2-D result")))
    return failure();
  auto [m, k] = opShape(getLhs(), getTransposeLhs());
  auto [k2, n] = opShape(getRhs(), getTransposeRhs());
  if (k != k2)
    return emitOpError() << "contracts a dimension of size " << k
                         << " with one of size " << k2;
  auto rs = getResult().getType().getShape();
  if (rs[0] != m || rs[1] != n)
    return emitOpError() << "result must be " << m << "x" << n << ", got "
                         << getResult().getType();
  return success();
}

LogicalResult BiasAddOp::verify() {
  auto in = getInput().getType();
  auto bias = getBias().getType();
  if (bias.getRank() != 1 || in.getRank() < 1 ||
      bias.getDimSize(0) != in.getDimSize(in.getRank() - 1))
    return emitOpError() << "bias " << bias
                         << " must be 1-D with the size of the last dimension "
                            "of the input "
                         << in;
  return success();
}

LogicalResult BiasGradOp::verify() {
  auto g = getGrad().getType();
  auto r = getResult().getType();
  if (g.getRank() < 1 || r.getRank() != 1 ||
      r.getDimSize(0) != g.getDimSize(g.getRank() - 1))
    return emitOpError() << "result " << r
                         << " must be 1-D with the size of the last dimension "
                            "of "
                         << g;
  return success();
}

LogicalResult MseLossOp::verify() {
  if (getPrediction().getType() != getTarget().getType())
    return emitOpError() << "prediction " << getPrediction().getType()
                         << " and target " << getTarget().getType()
                         << " must have the same type";
  return success();
}

//===----------------------------------------------------------------------===//
// Sharding rules
//===----------------------------------------------------------------------===//

namespace {
/// A mutable sharding, built up by the rules below.
struct Layout {
  SmallVector<SmallVector<StringRef>> dims;
  llvm::SmallSetVector<StringRef, 4> partial;

  explicit Layout(int64_t rank) : dims(rank) {}
  ShardingAttr get(MLIRContext *ctx, FlatSymbolRefAttr mesh) const {
    SmallVector<Attribute> d;
    for (auto &axes : dims)
      d.push_back(axisList(ctx, axes));
    return ShardingAttr::get(ctx, mesh, ArrayAttr::get(ctx, d),
                             axisList(ctx, partial.getArrayRef()));
  }
};
} // namespace

static LogicalResult requireSameDims(Operation *op,
                                     ArrayRef<ShardingAttr> operands) {
  for (ShardingAttr s : operands.drop_front())
    if (s.getDims() != operands.front().getDims())
      return op->emitOpError()
             << "operands are distributed differently (" << operands.front()
             << " vs " << s
             << "); resharding between them is not supported yet";
  return success();
}

/// Elementwise ops: the result is laid out like the operands.
static FailureOr<ShardingAttr>
elementwiseRule(Operation *op, ArrayRef<ShardingAttr> operands) {
  if (failed(requireSameDims(op, operands)))
    return failure();
  return operands.front();
}

static bool allPartialAlike(ArrayRef<ShardingAttr> operands) {
  return llvm::all_of(operands, [&](ShardingAttr s) {
    return s.isPartial() && s == operands.front();
  });
}

#define ELEMENTWISE_RULE(OP)                                                   \
  FailureOr<ShardingAttr> OP::inferResultSharding(                             \
      ArrayRef<ShardingAttr> operands) {                                       \
    return elementwiseRule(*this, operands);                                   \
  }
ELEMENTWISE_RULE(AddOp)
ELEMENTWISE_RULE(ReluOp)
ELEMENTWISE_RULE(GeluOp)
ELEMENTWISE_RULE(ReluGradOp)
ELEMENTWISE_RULE(GeluGradOp)
ELEMENTWISE_RULE(MseLossGradOp)
#undef ELEMENTWISE_RULE

// A sum of pending sums over the same axes is a pending sum.
bool AddOp::acceptsPartialOperands(ArrayRef<ShardingAttr> operands) {
  return allPartialAlike(operands);
}

FailureOr<ShardingAttr>
MatmulOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr lhs = operands[0], rhs = operands[1];
  int64_t lm = getTransposeLhs() ? 1 : 0, rn = getTransposeRhs() ? 0 : 1;
  auto lk = lhs.getDimAxes(1 - lm), rk = rhs.getDimAxes(1 - rn);
  if (lk != rk)
    return emitOpError()
           << "contraction dimension is split differently in the operands ("
           << lhs << " vs " << rhs
           << "); resharding between them is not supported yet";
  Layout out(2);
  out.dims[0] = lhs.getDimAxes(lm);
  out.dims[1] = rhs.getDimAxes(rn);
  // Contracting a split dimension leaves each rank a summand.
  for (StringRef a : lk)
    out.partial.insert(a);
  for (ShardingAttr s : operands)
    for (StringRef a : s.getPartialAxes())
      out.partial.insert(a);
  return out.get(getContext(), lhs.getMesh());
}

// A product is linear in each factor: one partial factor gives a partial
// product, two do not.
bool MatmulOp::acceptsPartialOperands(ArrayRef<ShardingAttr> operands) {
  return operands[0].isPartial() != operands[1].isPartial();
}

FailureOr<ShardingAttr>
BiasAddOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  if (!operands[1].isReplicated())
    return emitOpError() << "bias sharded as " << operands[1]
                         << " is not supported yet; it must be replicated";
  return operands[0];
}

FailureOr<ShardingAttr>
BiasGradOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr g = operands[0];
  int64_t last = g.getRank() - 1;
  Layout out(1);
  out.dims[0] = g.getDimAxes(last);
  for (int64_t d = 0; d < last; ++d)
    for (StringRef a : g.getDimAxes(d))
      out.partial.insert(a);
  for (StringRef a : g.getPartialAxes())
    out.partial.insert(a);
  return out.get(getContext(), g.getMesh());
}

bool BiasGradOp::acceptsPartialOperands(ArrayRef<ShardingAttr>) { return true; }

FailureOr<ShardingAttr>
MseLossOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  if (failed(requireSameDims(*this, operands)))
    return failure();
  Layout out(0);
  for (int64_t d = 0; d < operands[0].getRank(); ++d)
    for (StringRef a : operands[0].getDimAxes(d))
      out.partial.insert(a);
  return out.get(getContext(), operands[0].getMesh());
}

static FailureOr<ShardingAttr> updateRule(Operation *op,
                                          ArrayRef<ShardingAttr> operands) {
  if (operands[0].getDims() != operands[1].getDims())
    return op->emitOpError() << "gradient is distributed as " << operands[1]
                             << " but the parameter as " << operands[0];
  return operands[0];
}

FailureOr<ShardingAttr>
SgdUpdateOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  return updateRule(*this, operands);
}

FailureOr<ShardingAttr>
AdamWUpdateOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  return updateRule(*this, operands);
}
