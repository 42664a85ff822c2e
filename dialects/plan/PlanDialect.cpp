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

ArrayRef<int64_t> ShardingAttr::getDimSegments(int64_t dim) const {
  if (getSegments().empty())
    return {};
  return cast<DenseI64ArrayAttr>(getSegments()[dim]).asArrayRef();
}

bool ShardingAttr::isReplicated() const {
  return !isPartial() && llvm::all_of(getDims(), [](Attribute d) {
    return cast<ArrayAttr>(d).empty();
  });
}

LogicalResult ShardingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                   FlatSymbolRefAttr mesh, ArrayAttr dims,
                                   ArrayAttr partial, ArrayAttr segments) {
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
  // Segments are all-or-nothing per attribute (one entry per dimension), so
  // that equal layouts compare equal.
  if (!segments.empty()) {
    if (segments.size() != dims.size())
      return emitError() << "segments need one entry per dimension";
    bool any = false;
    for (auto [d, a] : llvm::enumerate(segments)) {
      auto seg = dyn_cast<DenseI64ArrayAttr>(a);
      if (!seg)
        return emitError() << "segments of a dimension must be sizes";
      if (seg.empty())
        continue;
      any = true;
      if (cast<ArrayAttr>(dims[d]).empty())
        return emitError() << "dimension " << d
                           << " has segments but is not split";
      for (int64_t n : seg.asArrayRef())
        if (n < 1)
          return emitError() << "segment sizes must be >= 1";
    }
    if (!any)
      return emitError() << "segments without a segmented dimension; leave "
                            "them out";
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
  SmallVector<Attribute> dims, partial, segments;
  bool anySegments = false;
  if (parser.parseLess() || parser.parseAttribute(mesh) || parser.parseComma())
    return {};
  if (parser.parseCommaSeparatedList(
          AsmParser::Delimiter::Square, [&]() -> ParseResult {
            SmallVector<Attribute> axes;
            if (parseAxisList(parser, axes))
              return failure();
            dims.push_back(ArrayAttr::get(ctx, axes));
            SmallVector<int64_t> seg;
            if (succeeded(parser.parseOptionalLBrace())) {
              if (parser.parseCommaSeparatedList([&]() -> ParseResult {
                    return parser.parseInteger(seg.emplace_back());
                  }) ||
                  parser.parseRBrace())
                return failure();
              anySegments = true;
            }
            segments.push_back(DenseI64ArrayAttr::get(ctx, seg));
            return success();
          }))
    return {};
  if (!anySegments)
    segments.clear();
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseKeyword("partial") || parser.parseEqual() ||
        parseAxisList(parser, partial))
      return {};
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<ShardingAttr>(ctx, mesh, ArrayAttr::get(ctx, dims),
                                         ArrayAttr::get(ctx, partial),
                                         ArrayAttr::get(ctx, segments));
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
  llvm::interleaveComma(llvm::enumerate(getDims()), printer, [&](auto it) {
    printAxisList(printer, cast<ArrayAttr>(it.value()));
    ArrayRef<int64_t> seg = getDimSegments(it.index());
    if (!seg.empty()) {
      printer << " {";
      llvm::interleaveComma(seg, printer);
      printer << '}';
    }
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
                           ArrayAttr::get(s.getContext(), {}), s.getSegments());
}

std::string planc::plan::recomputePolicy(ModuleOp module,
                                         llvm::StringRef option) {
  if (!option.empty())
    return option.str();
  std::string mode = "none";
  for (auto par : module.getOps<ParallelOp>())
    mode = par.getRecompute().str();
  return mode;
}

func::FuncOp planc::plan::getTrainStepOrError(ModuleOp module) {
  for (auto f : module.getOps<func::FuncOp>())
    if (f->hasAttr(kTrainStepAttr))
      return f;
  module.emitError() << "expected a train step; run plan-autodiff first";
  return {};
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
  for (auto [a, s] : llvm::zip(getAxes(), getShape()))
    if (!isSequential(cast<StringAttr>(a).getValue()))
      n *= s;
  return n;
}

bool MeshOp::isSequential(StringRef name) {
  auto seq = getSequential();
  return seq && llvm::any_of(*seq, [&](Attribute a) {
           return cast<StringAttr>(a).getValue() == name;
         });
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

LogicalResult planc::plan::verifyNormParamGrad(Operation *op, Type gamma,
                                               Type grad) {
  auto g = cast<ShapedType>(gamma), d = cast<ShapedType>(grad);
  if (d == g || (d.getShape() == g.getShape() && d.getElementType().isF32()))
    return success();
  return op->emitOpError() << "has a parameter gradient " << grad
                           << ": expected " << gamma << " or its shape in f32";
}

LogicalResult LayerNormGradOp::verify() {
  return verifyNormParamGrad(*this, getGamma().getType(),
                             getGammaGrad().getType());
}

LogicalResult RmsNormGradOp::verify() {
  return verifyNormParamGrad(*this, getGamma().getType(),
                             getGammaGrad().getType());
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
  if (getData() != "synthetic" && getData() != "shards" &&
      getData() != "cifar10")
    return emitOpError() << "unknown data source '" << getData()
                         << "'; expected \"synthetic\", \"shards\" or "
                            "\"cifar10\"";
  if (getData() != "synthetic" && !getDataPathAttr())
    return emitOpError() << "data = \"" << getData()
                         << "\" needs data_path, the files to read";
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
                         {"fp32", "tf32", "bf16", "fp16"})) ||
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
  if (failed(
          expectOneOf(*this, "schedule", getSchedule(),
                      {"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"})) ||
      failed(expectOneOf(*this, "recompute", getRecompute(),
                         {"none", "selective", "full"})) ||
      failed(expectOneOf(*this, "tensor_policy", getTensorPolicy(),
                         {"none", "megatron"})) ||
      (getCpComm() &&
       failed(expectOneOf(*this, "cp_comm", *getCpComm(),
                          {"all_to_all", "all_gather", "ring"}))) ||
      (getEpComm() && failed(expectOneOf(*this, "ep_comm", *getEpComm(),
                                         {"all_to_all", "all_gather"}))))
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
  if (getIntraNodeGbps() && !(getIntraNodeGbps()->convertToDouble() > 0))
    return emitOpError() << "intra_node_gbps must be > 0";
  if (getInterNodeGbps() && !(getInterNodeGbps()->convertToDouble() > 0))
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

/// An update is clipped by a sum of squares exactly when it has max_norm.
static LogicalResult verifyClip(Operation *op, Value sumsq, FloatAttr maxNorm) {
  if (!sumsq != !maxNorm)
    return op->emitOpError() << "takes 'max_norm' exactly when it is "
                                "clipped by a sum of squares";
  if (maxNorm && !(maxNorm.getValueAsDouble() > 0))
    return op->emitOpError()
           << "max_norm must be > 0, got " << maxNorm.getValueAsDouble();
  return success();
}

LogicalResult SgdUpdateOp::verify() {
  return verifyClip(*this, getClipSumsq(), getMaxNormAttr());
}

LogicalResult AdamWUpdateOp::verify() {
  return verifyClip(*this, getClipSumsq(), getMaxNormAttr());
}

LogicalResult SumSqOp::verify() {
  if (getInputs().empty())
    return emitOpError() << "expects at least one input";
  return success();
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
  if (getSumLeading() && rt.getRank() != rank)
    return emitOpError() << "sums over the leading dimensions of both "
                            "operands, but the lhs "
                         << lt << " and the rhs " << rt << " differ in rank";
  if (rt.getRank() == rank && rt.getShape().drop_back(2) != batch)
    return emitOpError() << "batch dimensions of the lhs " << lt
                         << " and the rhs " << rt << " differ";
  auto [m, k] = opShape(lt, getTransposeLhs());
  auto [k2, n] = opShape(rt, getTransposeRhs());
  if (k != k2)
    return emitOpError() << "contracts a dimension of size " << k
                         << " with one of size " << k2;
  SmallVector<int64_t> expected;
  if (!getSumLeading())
    expected.append(batch.begin(), batch.end());
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

LogicalResult CastOp::verify() {
  auto in = getInput().getType(), out = getResult().getType();
  if (in.getShape() != out.getShape())
    return emitOpError() << "converts " << in << " to " << out
                         << "; a cast keeps the shape";
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

LogicalResult RopeOp::verify() {
  auto qkv = getQkv().getType();
  int64_t h = getNumHeads(), kv = getNumKvHeads();
  if (h < 1 || kv < 1 || h % kv != 0)
    return emitOpError() << "num_heads (" << h << ") must be a positive "
                         << "multiple of num_kv_heads (" << kv << ")";
  if (qkv.getRank() != 3 || qkv.getDimSize(2) % (h + 2 * kv) != 0)
    return emitOpError() << "expects qkv [batch, seq, (num_heads + 2 * "
                            "num_kv_heads) * head_dim], got "
                         << qkv;
  int64_t dh = qkv.getDimSize(2) / (h + 2 * kv);
  if (dh % 2 != 0)
    return emitOpError() << "the head dimension (" << dh
                         << ") must be even: rotate-half pairs its halves";
  if (!(getTheta().convertToDouble() > 0))
    return emitOpError() << "theta must be > 0";
  return success();
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
// More verifiers
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

LogicalResult PosEmbeddingGradOp::verify() {
  auto g = getGrad().getType(), r = getResult().getType();
  if (g.getRank() != 3 || r.getRank() != 2 ||
      r.getDimSize(1) != g.getDimSize(2) || r.getDimSize(0) < g.getDimSize(1))
    return emitOpError() << "expects a [B, S, D] gradient and a [T, D] "
                            "result with T >= S, got "
                         << g << " and " << r;
  return success();
}
