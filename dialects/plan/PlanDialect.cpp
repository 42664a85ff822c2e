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
  // Ops with several results record one sharding per result.
  Attribute a = value.getDefiningOp()->getAttr(kShardingAttr);
  if (auto list = dyn_cast_or_null<ArrayAttr>(a)) {
    unsigned i = cast<OpResult>(value).getResultNumber();
    return i < list.size() ? dyn_cast<ShardingAttr>(list[i]) : ShardingAttr();
  }
  return dyn_cast_or_null<ShardingAttr>(a);
}

void planc::plan::setSharding(Operation *op, ShardingAttr sharding) {
  op->setAttr(kShardingAttr, sharding);
}

void planc::plan::setShardings(Operation *op,
                               ArrayRef<ShardingAttr> shardings) {
  if (shardings.size() == 1)
    return setSharding(op, shardings[0]);
  SmallVector<Attribute> list(shardings.begin(), shardings.end());
  op->setAttr(kShardingAttr, ArrayAttr::get(op->getContext(), list));
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

/// Checks that string setting `name` is one of `allowed`.
static LogicalResult expectOneOf(Operation *op, StringRef name, StringRef value,
                                 ArrayRef<StringRef> allowed) {
  if (llvm::is_contained(allowed, value))
    return success();
  InFlightDiagnostic diag = op->emitOpError() << "unknown " << name << " '"
                                              << value << "'; expected ";
  for (auto [i, a] : llvm::enumerate(allowed)) {
    if (i > 0)
      diag << (i + 1 == allowed.size() ? " or " : ", ");
    diag << '"' << a << '"';
  }
  return diag;
}

LogicalResult TrainOp::verify() {
  if (getStepsAttr().getInt() < 0)
    return emitOpError() << "steps must be >= 0";
  int64_t batch = getGlobalBatchAttr().getInt();
  if (batch < 1)
    return emitOpError() << "global_batch must be >= 1";
  if (getData() != "synthetic" && getData() != "shards")
    return emitOpError() << "unknown data source '" << getData()
                         << "'; expected \"synthetic\" or \"shards\"";
  if (getData() == "shards" && !getDataPathAttr())
    return emitOpError() << "data = \"shards\" needs data_path, the "
                            "directory that holds the token shards";
  if (getOptimizer() != "sgd" && getOptimizer() != "adamw")
    return emitOpError() << "unknown optimizer '" << getOptimizer()
                         << "'; expected \"sgd\" or \"adamw\"";
  double lr = getLr().convertToDouble();
  if (!(lr > 0))
    return emitOpError() << "lr must be > 0";
  if (auto mb = getMicroBatchAttr()) {
    int64_t m = mb.getInt();
    if (m < 1)
      return emitOpError() << "micro_batch must be >= 1, got " << m;
    if (batch % m != 0)
      return emitOpError() << "global_batch (" << batch
                           << ") must be a multiple of micro_batch (" << m
                           << ")";
  }
  if (failed(expectOneOf(*this, "precision", getPrecision(),
                         {"fp32", "bf16", "fp16"})) ||
      failed(expectOneOf(*this, "loss_scale", getLossScale(),
                         {"none", "dynamic"})) ||
      failed(expectOneOf(*this, "lr_schedule", getLrSchedule(),
                         {"constant", "cosine"})))
    return failure();
  if (getLossScale() == "dynamic" && getPrecision() != "fp16")
    return emitOpError() << "loss_scale = \"dynamic\" is only for precision "
                            "= \"fp16\" (got \""
                         << getPrecision()
                         << "\", which does not need loss scaling)";
  if (auto clip = getGradClipAttr(); clip && !(clip.getValueAsDouble() > 0))
    return emitOpError() << "grad_clip must be > 0 (leave it out to disable "
                            "clipping), got "
                         << clip.getValueAsDouble();
  if ((int64_t)getWarmupSteps() < 0)
    return emitOpError() << "warmup_steps must be >= 0";
  if (auto minLr = getMinLrAttr()) {
    double v = minLr.getValueAsDouble();
    if (!(v >= 0) || v > lr)
      return emitOpError() << "min_lr must be in [0, lr = " << lr << "], got "
                           << v;
  }
  if (auto decay = getDecayStepsAttr(); decay && decay.getInt() < 1)
    return emitOpError() << "decay_steps must be >= 1, got " << decay.getInt();
  int64_t every = getCheckpointEvery();
  if (every < 0)
    return emitOpError() << "checkpoint_every must be >= 0 (0: never)";
  if (every > 0 && !getCheckpointDirAttr())
    return emitOpError() << "checkpoint_every = " << every
                         << " needs checkpoint_dir, where checkpoints are "
                            "written";
  return success();
}

LogicalResult ParallelOp::verify() {
  if (failed(expectOneOf(*this, "schedule", getSchedule(),
                         {"gpipe", "1f1b", "interleaved_1f1b"})) ||
      failed(expectOneOf(*this, "recompute", getRecompute(),
                         {"none", "selective", "full"})) ||
      failed(expectOneOf(*this, "tensor_policy", getTensorPolicy(),
                         {"none", "megatron"})))
    return failure();
  int64_t microbatches = getMicrobatches();
  if (microbatches < 1)
    return emitOpError() << "microbatches must be >= 1, got " << microbatches;
  int64_t virtualStages = getVirtualStages();
  if (virtualStages < 1)
    return emitOpError() << "virtual_stages must be >= 1, got "
                         << virtualStages;
  if (virtualStages > 1 && getSchedule() != "interleaved_1f1b")
    return emitOpError() << "virtual_stages = " << virtualStages
                         << " needs schedule = \"interleaved_1f1b\" (\""
                         << getSchedule() << "\" runs one stage per rank)";
  int64_t zero = getZeroStage();
  if (zero < 0 || zero > 3)
    return emitOpError() << "zero_stage must be 0, 1, 2 or 3, got " << zero;
  if (!(getBucketMb().convertToDouble() > 0))
    return emitOpError() << "bucket_mb must be > 0, got "
                         << getBucketMb().convertToDouble();
  if (std::optional<ArrayRef<int64_t>> bounds = getStageBoundaries()) {
    int64_t prev = 0;
    for (int64_t b : *bounds) {
      if (b <= prev)
        return emitOpError()
               << "stage_boundaries must be > 0 and strictly increasing "
                  "(the first layer of each stage after the first), got "
               << b << (prev == 0 ? "" : " after ")
               << (prev == 0 ? std::string() : std::to_string(prev));
      prev = b;
    }
  }
  return success();
}

LogicalResult ClusterOp::verify() {
  if ((int64_t)getNodes() < 1)
    return emitOpError() << "nodes must be >= 1";
  if ((int64_t)getGpusPerNode() < 1)
    return emitOpError() << "gpus_per_node must be >= 1";
  if (getGpu().empty())
    return emitOpError() << "gpu must name the accelerator (e.g. \"H100\")";
  if (!(getIntraNodeGbps().convertToDouble() > 0))
    return emitOpError() << "intra_node_gbps must be > 0";
  if (!(getInterNodeGbps().convertToDouble() > 0))
    return emitOpError() << "inter_node_gbps must be > 0";
  return success();
}

/// Rows/cols of op(x): the last two dimensions, swapped when transposed.
static std::pair<int64_t, int64_t> opShape(RankedTensorType type,
                                           bool transposed) {
  auto s = type.getShape().take_back(2);
  return transposed ? std::make_pair(s[1], s[0]) : std::make_pair(s[0], s[1]);
}

/// "8x4" for shape [8, 4].
static std::string shapeString(ArrayRef<int64_t> shape) {
  std::string out;
  llvm::raw_string_ostream os(out);
  llvm::interleave(shape, os, "x");
  return out;
}

LogicalResult MatmulOp::verify() {
  auto lt = getLhs().getType(), rt = getRhs().getType();
  auto ot = getResult().getType();
  int64_t rank = lt.getRank();
  if (rank < 2)
    return emitOpError() << "expects an lhs of rank >= 2, got " << lt;
  if (rt.getRank() != 2 && rt.getRank() != rank)
    return emitOpError() << "expects a 2-D rhs or one of the lhs's rank "
                         << rank << ", got " << rt;
  ArrayRef<int64_t> batch = lt.getShape().drop_back(2);
  if (rt.getRank() == rank && rt.getShape().drop_back(2) != batch)
    return emitOpError() << "batch dimensions of the lhs " << lt
                         << " and the rhs " << rt << " differ";
  auto [m, k] = opShape(lt, getTransposeLhs());
  auto [k2, n] = opShape(rt, getTransposeRhs());
  if (k != k2)
    return emitOpError() << "contracts a dimension of size " << k
                         << " with one of size " << k2;
  SmallVector<int64_t> expected(batch);
  expected.append({m, n});
  if (ot.getShape() != ArrayRef<int64_t>(expected))
    return emitOpError() << "result must be " << shapeString(expected)
                         << ", got " << ot;
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

LogicalResult SoftmaxOp::verify() {
  if (getInput().getType().getRank() < 1)
    return emitOpError() << "expects a tensor of rank >= 1 (softmax runs over "
                            "the last dimension)";
  return success();
}

LogicalResult EmbeddingOp::verify() {
  auto ids = getIds().getType(), table = getTable().getType();
  if (ids.getRank() < 1)
    return emitOpError() << "expects ids of rank >= 1, got " << ids;
  if (table.getRank() != 2)
    return emitOpError() << "expects a 2-D table [vocab, dim], got " << table;
  SmallVector<int64_t> expected(ids.getShape());
  expected.push_back(table.getDimSize(1));
  auto want = RankedTensorType::get(expected, table.getElementType());
  if (getResult().getType() != want)
    return emitOpError() << "result must be " << want
                         << " (the ids' shape followed by the table's row "
                            "width), got "
                         << getResult().getType();
  return success();
}

/// Checks a normalization's input and 1-D scale/shift `param`.
static LogicalResult verifyNorm(Operation *op, RankedTensorType input,
                                RankedTensorType param, StringRef paramName,
                                APFloat eps) {
  if (input.getRank() < 1)
    return op->emitOpError() << "expects an input of rank >= 1, got " << input;
  int64_t width = input.getDimSize(input.getRank() - 1);
  if (param.getRank() != 1 || param.getDimSize(0) != width)
    return op->emitOpError()
           << paramName << " " << param
           << " must be 1-D with the size of the last dimension of the input "
           << input << " (" << width << ")";
  if (!(eps.convertToDouble() >= 0))
    return op->emitOpError() << "eps must be >= 0";
  return success();
}

LogicalResult LayerNormOp::verify() {
  return verifyNorm(*this, getInput().getType(), getGamma().getType(),
                    "gamma and beta", getEps());
}

LogicalResult RmsNormOp::verify() {
  return verifyNorm(*this, getInput().getType(), getGamma().getType(), "gamma",
                    getEps());
}

int64_t AttentionOp::getHeadDim() {
  int64_t heads = (int64_t)getNumHeads() + 2 * (int64_t)getNumKvHeads();
  return getQkv().getType().getDimSize(2) / heads;
}

LogicalResult AttentionOp::verify() {
  auto qkv = getQkv().getType();
  int64_t h = getNumHeads(), kv = getNumKvHeads();
  if (h < 1 || kv < 1)
    return emitOpError() << "num_heads and num_kv_heads must be >= 1, got " << h
                         << " and " << kv;
  if (h % kv != 0)
    return emitOpError() << "num_heads (" << h
                         << ") must be a multiple of num_kv_heads (" << kv
                         << ")";
  if (qkv.getRank() != 3)
    return emitOpError() << "expects qkv of rank 3 [batch, seq, (num_heads + "
                            "2 * num_kv_heads) * head_dim], got "
                         << qkv;
  int64_t packed = qkv.getDimSize(2);
  if (packed < 1 || packed % (h + 2 * kv) != 0)
    return emitOpError() << "last dimension of qkv (" << packed
                         << ") must be a positive multiple of num_heads + 2 * "
                            "num_kv_heads = "
                         << h + 2 * kv;
  auto want = RankedTensorType::get(
      {qkv.getDimSize(0), qkv.getDimSize(1), h * getHeadDim()},
      qkv.getElementType());
  if (getResult().getType() != want)
    return emitOpError() << "result must be " << want << " (num_heads * "
                         << "head_dim = " << h << " * " << getHeadDim()
                         << "), got " << getResult().getType();
  return success();
}

LogicalResult CrossEntropyOp::verify() {
  auto logits = getLogits().getType(), targets = getTargets().getType();
  if (logits.getRank() < 1)
    return emitOpError() << "expects logits of rank >= 1, got " << logits;
  auto want = RankedTensorType::get(logits.getShape().drop_back(),
                                    targets.getElementType());
  if (targets != want)
    return emitOpError() << "targets must be " << want
                         << " (the logits' shape without the class "
                            "dimension), got "
                         << targets;
  return success();
}

LogicalResult TransposeOp::verify() {
  auto in = getInput().getType();
  ArrayRef<int64_t> perm = getPermutation();
  if ((int64_t)perm.size() != in.getRank())
    return emitOpError() << "permutation has " << perm.size()
                         << " entries but the input has rank " << in.getRank();
  SmallVector<bool> seen(perm.size(), false);
  SmallVector<int64_t> expected;
  for (int64_t p : perm) {
    if (p < 0 || p >= in.getRank() || seen[p])
      return emitOpError() << "permutation [" << perm
                           << "] must list each of 0.." << in.getRank() - 1
                           << " once";
    seen[p] = true;
    expected.push_back(in.getDimSize(p));
  }
  auto want = RankedTensorType::get(expected, in.getElementType());
  if (getResult().getType() != want)
    return emitOpError() << "result must be " << want << ", got "
                         << getResult().getType();
  return success();
}

LogicalResult ReshapeOp::verify() {
  auto in = getInput().getType(), out = getResult().getType();
  if (!in.hasStaticShape() || !out.hasStaticShape())
    return emitOpError() << "expects static shapes";
  if (in.getNumElements() != out.getNumElements())
    return emitOpError() << "cannot reshape " << in << " ("
                         << in.getNumElements() << " elements) to " << out
                         << " (" << out.getNumElements() << " elements)";
  return success();
}

LogicalResult ShardingConstraintOp::verify() {
  auto type = getInput().getType();
  if (getSharding().getRank() != type.getRank())
    return emitOpError() << "sharding " << getSharding() << " has "
                         << getSharding().getRank()
                         << " dimensions but the value has rank "
                         << type.getRank();
  return success();
}

LogicalResult
ShardingConstraintOp::verifySymbolUses(SymbolTableCollection &symbols) {
  ShardingAttr sharding = getSharding();
  auto mesh =
      symbols.lookupNearestSymbolFrom<MeshOp>(*this, sharding.getMesh());
  if (!mesh)
    return emitOpError() << "sharding refers to " << sharding.getMesh()
                         << ", which is not a plan.mesh";
  auto checkAxis = [&](StringRef axis) -> LogicalResult {
    if (mesh.getAxisIndex(axis) < 0)
      return emitOpError() << "mesh axis '" << axis << "' is not an axis of "
                           << sharding.getMesh();
    return success();
  };
  auto type = getInput().getType();
  for (int64_t d = 0; d < sharding.getRank(); ++d) {
    int64_t parts = 1;
    for (StringRef axis : sharding.getDimAxes(d)) {
      if (failed(checkAxis(axis)))
        return failure();
      parts *= mesh.getAxisSize(axis);
    }
    if (!type.isDynamicDim(d) && type.getDimSize(d) % parts != 0)
      return emitOpError() << "dimension " << d << " of size "
                           << type.getDimSize(d) << " cannot be split into "
                           << parts << " equal parts";
  }
  for (StringRef axis : sharding.getPartialAxes())
    if (failed(checkAxis(axis)))
      return failure();
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
  void addPartial(ArrayRef<StringRef> axes) {
    for (StringRef a : axes)
      partial.insert(a);
  }
  ShardingAttr get(MLIRContext *ctx, FlatSymbolRefAttr mesh) const {
    SmallVector<Attribute> d;
    for (auto &axes : dims)
      d.push_back(axisList(ctx, axes));
    return ShardingAttr::get(ctx, mesh, ArrayAttr::get(ctx, d),
                             axisList(ctx, partial.getArrayRef()));
  }
  /// The sharding, or an error on `op` when the operands' shardings would
  /// use one mesh axis twice in the result (e.g. to split two dimensions):
  /// no rank would hold what that layout describes.
  FailureOr<ShardingAttr> build(Operation *op, ArrayRef<ShardingAttr> operands,
                                FlatSymbolRefAttr mesh) const {
    llvm::SmallSetVector<StringRef, 4> seen;
    auto clash = [&](StringRef a) -> LogicalResult {
      InFlightDiagnostic diag = op->emitOpError() << "operand shardings (";
      llvm::interleaveComma(operands, diag);
      diag << ") would use mesh axis '" << a
           << "' twice in the result; this combination is not supported yet";
      return diag;
    };
    for (auto &axes : dims)
      for (StringRef a : axes)
        if (!seen.insert(a))
          return clash(a);
    for (StringRef a : partial)
      if (!seen.insert(a))
        return clash(a);
    return get(op->getContext(), mesh);
  }
};
} // namespace

/// Checks that the dimensions `dims` of `s` are not split.
static LogicalResult requireUnsplit(Operation *op, ShardingAttr s,
                                    ArrayRef<int64_t> dims, StringRef what) {
  for (int64_t d : dims)
    if (!s.getDimAxes(d).empty())
      return op->emitOpError() << "splitting " << what << " (dimension " << d
                               << " of " << s << ") is not supported yet";
  return success();
}

/// Checks that a parameter-like operand (bias, norm scale) is replicated.
static LogicalResult requireReplicated(Operation *op, ShardingAttr s,
                                       StringRef what) {
  if (!s.isReplicated())
    return op->emitOpError() << what << " sharded as " << s
                             << " is not supported yet; it must be replicated";
  return success();
}

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

/// Elementwise ops: the result is laid out like the operands, and is
/// partial like the partial ones (the op accepted them only if that is
/// right, see acceptsPartialOperands).
static FailureOr<ShardingAttr>
elementwiseRule(Operation *op, ArrayRef<ShardingAttr> operands) {
  if (failed(requireSameDims(op, operands)))
    return failure();
  for (ShardingAttr s : operands)
    if (s.isPartial())
      return s;
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
ELEMENTWISE_RULE(MulOp)
ELEMENTWISE_RULE(SubOp)
ELEMENTWISE_RULE(SiluOp)
#undef ELEMENTWISE_RULE

// A sum of pending sums over the same axes is a pending sum.
bool AddOp::acceptsPartialOperands(ArrayRef<ShardingAttr> operands) {
  return allPartialAlike(operands);
}

// So is a difference.
bool SubOp::acceptsPartialOperands(ArrayRef<ShardingAttr> operands) {
  return allPartialAlike(operands);
}

// A product is linear in each factor: one partial factor gives a partial
// product, two do not. (The whole factor is laid out like the partial one,
// so every summand is multiplied by the same elements.)
bool MulOp::acceptsPartialOperands(ArrayRef<ShardingAttr> operands) {
  return operands[0].isPartial() != operands[1].isPartial();
}

FailureOr<ShardingAttr>
MatmulOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr lhs = operands[0], rhs = operands[1];
  int64_t rank = lhs.getRank(), rhsRank = rhs.getRank();
  // Positions of M, K in op(lhs) and of K, N in op(rhs).
  int64_t lm = rank - (getTransposeLhs() ? 1 : 2);
  int64_t lk = rank - (getTransposeLhs() ? 2 : 1);
  int64_t rk = rhsRank - (getTransposeRhs() ? 1 : 2);
  int64_t rn = rhsRank - (getTransposeRhs() ? 2 : 1);
  auto lkAxes = lhs.getDimAxes(lk), rkAxes = rhs.getDimAxes(rk);
  if (lkAxes != rkAxes)
    return emitOpError()
           << "contraction dimension is split differently in the operands ("
           << lhs << " vs " << rhs
           << "); resharding between them is not supported yet";
  Layout out(rank);
  // Batch dimensions come from the lhs; a batched rhs must agree.
  for (int64_t d = 0; d < rank - 2; ++d) {
    out.dims[d] = lhs.getDimAxes(d);
    if (rhsRank == rank && rhs.getDimAxes(d) != out.dims[d])
      return emitOpError() << "batch dimension " << d
                           << " is split differently in the operands (" << lhs
                           << " vs " << rhs
                           << "); resharding between them is not supported "
                              "yet";
  }
  out.dims[rank - 2] = lhs.getDimAxes(lm);
  out.dims[rank - 1] = rhs.getDimAxes(rn);
  // Contracting a split dimension leaves each rank a summand.
  out.addPartial(lkAxes);
  for (ShardingAttr s : operands)
    out.addPartial(s.getPartialAxes());
  return out.build(*this, operands, lhs.getMesh());
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

FailureOr<ShardingAttr>
SoftmaxOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr x = operands[0];
  if (failed(
          requireUnsplit(*this, x, {x.getRank() - 1}, "the softmax dimension")))
    return failure();
  return dropPartial(x);
}

FailureOr<ShardingAttr>
EmbeddingOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr ids = operands[0], table = operands[1];
  if (ids.isPartial())
    return emitOpError() << "ids sharded as " << ids
                         << " are partial; indices cannot be pending sums";
  Layout out(ids.getRank() + 1);
  for (int64_t d = 0; d < ids.getRank(); ++d)
    out.dims[d] = ids.getDimAxes(d);
  // Vocab-parallel: each rank looks up the rows it owns (zeros for the
  // others), so the result is a sum over the axes that split the vocabulary.
  out.addPartial(table.getDimAxes(0));
  out.dims.back() = table.getDimAxes(1);
  out.addPartial(table.getPartialAxes());
  return out.build(*this, operands, table.getMesh());
}

// The lookup is linear in the table; partial ids are rejected by the rule
// (integer indices cannot be reduced, so they must reach it).
bool EmbeddingOp::acceptsPartialOperands(ArrayRef<ShardingAttr>) {
  return true;
}

/// Normalizations over the last dimension of operand 0 with replicated
/// scale/shift operands.
static FailureOr<ShardingAttr> normRule(Operation *op,
                                        ArrayRef<ShardingAttr> operands) {
  ShardingAttr x = operands[0];
  if (failed(
          requireUnsplit(op, x, {x.getRank() - 1}, "the normalized dimension")))
    return failure();
  for (ShardingAttr param : operands.drop_front())
    if (failed(requireReplicated(op, param, "scale or shift")))
      return failure();
  return dropPartial(x);
}

FailureOr<ShardingAttr>
LayerNormOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  return normRule(*this, operands);
}

FailureOr<ShardingAttr>
RmsNormOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  return normRule(*this, operands);
}

FailureOr<ShardingAttr>
AttentionOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr qkv = operands[0];
  if (failed(requireUnsplit(*this, qkv, {1}, "the sequence")) ||
      failed(requireUnsplit(*this, qkv, {2}, "the heads")))
    return failure();
  // Sequences of the batch are independent.
  Layout out(3);
  out.dims[0] = qkv.getDimAxes(0);
  return out.build(*this, operands, qkv.getMesh());
}

FailureOr<ShardingAttr>
CrossEntropyOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr logits = operands[0], targets = operands[1];
  if (targets.isPartial())
    return emitOpError() << "targets sharded as " << targets
                         << " are partial; class indices cannot be pending "
                            "sums";
  int64_t last = logits.getRank() - 1;
  if (failed(requireUnsplit(*this, logits, {last}, "the vocabulary")))
    return failure();
  Layout out(0);
  for (int64_t d = 0; d < last; ++d) {
    if (logits.getDimAxes(d) != targets.getDimAxes(d))
      return emitOpError() << "logits and targets are distributed differently ("
                           << logits << " vs " << targets
                           << "); resharding between them is not supported "
                              "yet";
    // Each rank sums the losses of its positions: a summand of the mean.
    out.addPartial(logits.getDimAxes(d));
  }
  return out.build(*this, operands, logits.getMesh());
}

// Nonlinear in the logits; partial targets are let through only so that the
// rule rejects them (integer indices cannot be reduced).
bool CrossEntropyOp::acceptsPartialOperands(ArrayRef<ShardingAttr> operands) {
  return operands[1].isPartial();
}

FailureOr<ShardingAttr>
TransposeOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr x = operands[0];
  Layout out(x.getRank());
  for (auto [i, p] : llvm::enumerate(getPermutation()))
    out.dims[i] = x.getDimAxes(p);
  out.addPartial(x.getPartialAxes());
  return out.build(*this, operands, x.getMesh());
}

// Moving elements around is linear.
bool TransposeOp::acceptsPartialOperands(ArrayRef<ShardingAttr>) {
  return true;
}

FailureOr<ShardingAttr>
ReshapeOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr x = operands[0];
  auto in = getInput().getType(), res = getResult().getType();
  bool split = false, splitBeyond0 = false;
  for (int64_t d = 0; d < x.getRank(); ++d)
    if (!x.getDimAxes(d).empty()) {
      split = true;
      splitBeyond0 |= d > 0;
    }
  Layout out(res.getRank());
  out.addPartial(x.getPartialAxes());
  if (!split)
    return out.build(*this, operands, x.getMesh());
  // Each rank holds a contiguous block of whole rows of dimension 0. They
  // reshape on their own when the result keeps dimension 0, or when the
  // result's dimension 0 collapses the leading dimensions of the input
  // ([B, S, D] -> [B * S, D]): then the block stays contiguous.
  auto collapsesLeading = [&]() {
    if (res.getRank() < 1 || res.getRank() > in.getRank())
      return false;
    int64_t k = in.getRank() - res.getRank();
    int64_t lead = 1;
    for (int64_t d = 0; d <= k; ++d)
      lead *= in.getDimSize(d);
    return lead == res.getDimSize(0) &&
           in.getShape().drop_front(k + 1) == res.getShape().drop_front();
  };
  if (!splitBeyond0 && res.getRank() >= 1 &&
      (res.getDimSize(0) == in.getDimSize(0) || collapsesLeading())) {
    out.dims[0] = x.getDimAxes(0);
    return out.build(*this, operands, x.getMesh());
  }
  return emitOpError() << "reshaping " << in << " distributed as " << x
                       << " to " << res
                       << " is not supported yet (only a replicated input, or "
                          "one split along dimension 0 that keeps its size or "
                          "collapses the leading dimensions)";
}

// Moving elements around is linear.
bool ReshapeOp::acceptsPartialOperands(ArrayRef<ShardingAttr>) { return true; }

FailureOr<ShardingAttr>
ShardingConstraintOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr in = operands[0], want = getSharding();
  if (in == want)
    return want;
  // A replicated value narrows to any split locally: each rank keeps its
  // slice. Anything else moves data between ranks.
  if (!in.isReplicated() || want.isPartial() || in.getMesh() != want.getMesh())
    return emitOpError() << "resharding from " << in << " to " << want
                         << " is not supported yet";
  return want;
}

// An identity keeps a pending sum when it is asked to; otherwise the value
// is reduced first.
bool ShardingConstraintOp::acceptsPartialOperands(
    ArrayRef<ShardingAttr> operands) {
  return operands[0].isPartial() && operands[0] == getSharding();
}

//===----------------------------------------------------------------------===//
// PosEmbeddingOp
//===----------------------------------------------------------------------===//

LogicalResult PosEmbeddingOp::verify() {
  auto in = getInput().getType(), table = getTable().getType();
  if (in.getRank() != 3 || table.getRank() != 2 ||
      table.getDimSize(1) != in.getDimSize(2) ||
      table.getDimSize(0) < in.getDimSize(1))
    return emitOpError() << "adds rows 0..S-1 of a [max_seq, D] table to a "
                            "[B, S, D] input, got "
                         << in << " and " << table;
  return success();
}

FailureOr<ShardingAttr>
PosEmbeddingOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  if (failed(requireReplicated(*this, operands[1], "the position table")) ||
      failed(requireUnsplit(*this, operands[0], {1}, "the sequence")))
    return failure();
  return operands[0];
}

//===----------------------------------------------------------------------===//
// Gradient ops
//===----------------------------------------------------------------------===//

LogicalResult EmbeddingGradOp::verify() {
  auto ids = getIds().getType(), g = getGrad().getType();
  auto r = getResult().getType();
  if (g.getRank() != ids.getRank() + 1 || r.getRank() != 2 ||
      g.getShape().drop_back() != ids.getShape() ||
      g.getDimSize(g.getRank() - 1) != r.getDimSize(1))
    return emitOpError() << "expects ids [...], grad [..., D] and a [V, D] "
                            "result, got "
                         << ids << ", " << g << " and " << r;
  return success();
}

/// Axes that split the leading (all but last) dims: summing over those
/// positions leaves a pending sum.
static void addLeadingAxes(Layout &out, ShardingAttr s) {
  for (int64_t d = 0; d + 1 < s.getRank(); ++d)
    out.addPartial(s.getDimAxes(d));
  out.addPartial(s.getPartialAxes());
}

FailureOr<ShardingAttr>
EmbeddingGradOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr ids = operands[0], g = operands[1];
  if (ids.getDims() !=
      ArrayAttr::get(getContext(), g.getDims().getValue().drop_back()))
    return emitOpError() << "ids " << ids << " and gradient " << g
                         << " must be split alike";
  Layout out(2);
  out.dims[1] = g.getDimAxes(g.getRank() - 1);
  addLeadingAxes(out, g);
  return out.build(*this, operands, g.getMesh());
}

bool EmbeddingGradOp::acceptsPartialOperands(ArrayRef<ShardingAttr> ops) {
  return !ops[0].isPartial();
}

LogicalResult PosEmbeddingGradOp::verify() {
  auto g = getGrad().getType(), r = getResult().getType();
  if (g.getRank() != 3 || r.getRank() != 2 ||
      r.getDimSize(1) != g.getDimSize(2) || r.getDimSize(0) < g.getDimSize(1))
    return emitOpError() << "expects a [B, S, D] gradient and a [T, D] "
                            "result with T >= S, got "
                         << g << " and " << r;
  return success();
}

FailureOr<ShardingAttr>
PosEmbeddingGradOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr g = operands[0];
  if (failed(requireUnsplit(*this, g, {1}, "the sequence")))
    return failure();
  Layout out(2);
  out.dims[1] = g.getDimAxes(2);
  out.addPartial(g.getDimAxes(0));
  out.addPartial(g.getPartialAxes());
  return out.build(*this, operands, g.getMesh());
}

bool PosEmbeddingGradOp::acceptsPartialOperands(ArrayRef<ShardingAttr>) {
  return true;
}

/// d input like input; d scale/shift summed over the leading dims.
static FailureOr<SmallVector<ShardingAttr>>
normGradRule(Operation *op, ArrayRef<ShardingAttr> operands, unsigned n) {
  ShardingAttr x = operands[0], g = operands[2];
  if (failed(requireUnsplit(op, x, {x.getRank() - 1},
                            "the normalized dimension")) ||
      failed(requireReplicated(op, operands[1], "the scale")))
    return failure();
  if (x.getDims() != g.getDims())
    return op->emitOpError()
           << "input " << x << " and gradient " << g << " must be split alike";
  Layout param(1);
  addLeadingAxes(param, x);
  FailureOr<ShardingAttr> p = param.build(op, operands, x.getMesh());
  if (failed(p))
    return failure();
  SmallVector<ShardingAttr> out{dropPartial(x)};
  out.append(n - 1, *p);
  return out;
}

/// The first of several result shardings (multi-result ops' single form).
static FailureOr<ShardingAttr>
firstResult(FailureOr<SmallVector<ShardingAttr>> all) {
  if (failed(all))
    return failure();
  return (*all)[0];
}

FailureOr<ShardingAttr>
LayerNormGradOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  return firstResult(inferResultShardings(operands));
}

FailureOr<SmallVector<ShardingAttr>>
LayerNormGradOp::inferResultShardings(ArrayRef<ShardingAttr> operands) {
  return normGradRule(*this, operands, 3);
}

FailureOr<ShardingAttr>
RmsNormGradOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  return firstResult(inferResultShardings(operands));
}

FailureOr<SmallVector<ShardingAttr>>
RmsNormGradOp::inferResultShardings(ArrayRef<ShardingAttr> operands) {
  return normGradRule(*this, operands, 2);
}

FailureOr<ShardingAttr>
AttentionGradOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr qkv = operands[0];
  if (failed(requireUnsplit(*this, qkv, {1, 2}, "the sequence or heads")) ||
      failed(requireSameDims(*this, operands)))
    return failure();
  return qkv;
}

FailureOr<ShardingAttr>
SiluGradOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  return elementwiseRule(*this, operands);
}

FailureOr<ShardingAttr>
SoftmaxGradOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  if (failed(requireUnsplit(*this, operands[0], {operands[0].getRank() - 1},
                            "the softmax dimension")))
    return failure();
  return elementwiseRule(*this, operands);
}

FailureOr<ShardingAttr>
CrossEntropyGradOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  ShardingAttr logits = operands[0];
  if (failed(requireUnsplit(*this, logits, {logits.getRank() - 1},
                            "the vocabulary")))
    return failure();
  return dropPartial(logits);
}

FailureOr<ShardingAttr>
SumSqOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  Layout out(0);
  for (int64_t d = 0; d < operands[0].getRank(); ++d)
    out.addPartial(operands[0].getDimAxes(d));
  return out.build(*this, operands, operands[0].getMesh());
}

FailureOr<ShardingAttr>
ClipByNormOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  if (!operands[1].isReplicated())
    return emitOpError() << "the sum of squares must be whole (replicated), "
                            "got "
                         << operands[1];
  return operands[0];
}

FailureOr<ShardingAttr>
ScaleOp::inferResultSharding(ArrayRef<ShardingAttr> operands) {
  return operands[0];
}
