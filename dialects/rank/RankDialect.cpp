//===- RankDialect.cpp - The per-rank planc dialect -----------------------===//
#include "dialects/rank/RankDialect.h"

#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace planc::rank;

#include "dialects/rank/RankDialect.cpp.inc"
#include "dialects/rank/RankInterfaces.cpp.inc"

#define GET_OP_CLASSES
#include "dialects/rank/RankOps.cpp.inc"

void RankDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/rank/RankOps.cpp.inc"
      >();
  registerWorkspaceModels(getContext());
}

planc::rank::Extent planc::rank::extentOf(Value v) {
  auto elements = [](Value x) {
    return cast<MemRefType>(x.getType()).getNumElements();
  };
  int64_t offset = 0, n = elements(v);
  bool exact = true;
  while (Operation *def = v.getDefiningOp()) {
    if (auto sv = dyn_cast<SubviewOp>(def)) {
      offset += sv.getOffset();
      v = sv.getSource();
    } else if (auto vw = dyn_cast<ViewOp>(def)) {
      v = vw.getSource();
    } else if (auto r = dyn_cast<RowsOp>(def)) {
      exact = false;
      v = r.getSource();
    } else if (auto sh = dyn_cast<ShardViewOp>(def)) {
      exact = false;
      v = sh.getSource();
    } else {
      break;
    }
  }
  if (!exact)
    return {v, 0, elements(v)};
  return {v, offset, offset + n};
}

Value planc::rank::viewRoot(Value v) {
  while (Operation *d = v.getDefiningOp()) {
    if (auto vw = dyn_cast<ViewOp>(d))
      v = vw.getSource();
    else if (auto sv = dyn_cast<SubviewOp>(d))
      v = sv.getSource();
    else if (auto r = dyn_cast<RowsOp>(d))
      v = r.getSource();
    else if (auto sh = dyn_cast<ShardViewOp>(d))
      v = sh.getSource();
    else
      break;
  }
  return v;
}

int64_t planc::rank::classifierClasses(ModuleOp module, Operation *step) {
  auto trains = module.getOps<plan::TrainOp>();
  if (trains.empty() || (*trains.begin()).getData() == "shards")
    return 0;
  for (auto in : module.getOps<InputDeclOp>())
    if (in.getRole() != "label" && in.getType().getElementType().isInteger(32))
      return 0;
  plan::MeshOp mesh = plan::getMesh(module);
  int64_t classes = 0;
  step->walk([&](Operation *op) {
    if (classes ||
        !isa<CrossEntropyOp, CrossEntropyInPlaceOp, CeLocalStatsOp>(op))
      return;
    auto logits = cast<MemRefType>(op->getOperand(0).getType());
    classes = logits.getShape().back();
    if (auto ls = dyn_cast<CeLocalStatsOp>(op);
        ls && !ls.getVocabAxis().empty() && mesh)
      classes *= mesh.getShape()[mesh.getAxisIndex(ls.getVocabAxis())];
  });
  return classes;
}

LogicalResult InputDeclOp::verify() {
  if (getRole() != "input" && getRole() != "label")
    return emitOpError() << "role must be \"input\" or \"label\", got \""
                         << getRole() << "\"";
  return success();
}

template <typename DeclOp>
static LogicalResult verifyDeclRef(Operation *op, FlatSymbolRefAttr name,
                                   Type type, SymbolTableCollection &tables,
                                   StringRef what) {
  auto decl = tables.lookupNearestSymbolFrom<DeclOp>(op, name);
  if (!decl)
    return op->emitOpError()
           << "refers to " << name << ", which is not a " << what;
  if (decl.getType() != type)
    return op->emitOpError() << "has type " << type << " but " << name
                             << " is declared as " << decl.getType();
  return success();
}

LogicalResult ParamOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyDeclRef<ParamDeclOp>(*this, getNameAttr(), getType(), tables,
                                    "rank.param_decl");
}

/// A norm's gradient with the residual stream's added to d input: of d
/// input's type, in another buffer.
static LogicalResult verifyNormResidual(Operation *op, Value residual,
                                        Value inputGrad) {
  if (!residual)
    return success();
  if (residual.getType() != inputGrad.getType())
    return op->emitOpError()
           << "expects the residual of the input gradient's type, got "
           << residual.getType() << " and " << inputGrad.getType();
  if (viewRoot(residual) == viewRoot(inputGrad))
    return op->emitOpError()
           << "expects the residual and the input gradient in two buffers";
  return success();
}

LogicalResult LayerNormGradOp::verify() {
  if (failed(verifyNormResidual(*this, getResidual(), getInputGrad())))
    return failure();
  return planc::plan::verifyNormParamGrad(*this, getGamma().getType(),
                                          getGammaGrad().getType());
}

LogicalResult RmsNormGradOp::verify() {
  if (failed(verifyNormResidual(*this, getResidual(), getInputGrad())))
    return failure();
  return planc::plan::verifyNormParamGrad(*this, getGamma().getType(),
                                          getGammaGrad().getType());
}

std::string LayerNormGradOp::getRuntimeCallee() {
  return getResidual() ? "planrt::layernorm_grad_add"
                       : "planrt::layernorm_grad";
}

std::string RmsNormGradOp::getRuntimeCallee() {
  return getResidual() ? "planrt::rmsnorm_grad_add" : "planrt::rmsnorm_grad";
}

LogicalResult ParamDeclOp::verify() {
  if (auto copy = getCopyAttr()) {
    Type t = copy.getValue();
    if (!t.isBF16() && !t.isF16())
      return emitOpError() << "keeps a copy in bf16 or f16, got " << t;
    if (!getType().getElementType().isF32())
      return emitOpError() << "keeps a 16-bit copy of an f32 parameter, not of "
                           << getType();
  }
  return success();
}

LogicalResult ParamCopyOp::verifySymbolUses(SymbolTableCollection &tables) {
  auto decl = tables.lookupNearestSymbolFrom<ParamDeclOp>(*this, getNameAttr());
  if (!decl)
    return emitOpError() << "refers to " << getNameAttr()
                         << ", which is not a rank.param_decl";
  if (!decl.getCopyAttr())
    return emitOpError() << getNameAttr()
                         << " is declared without a 'copy' type";
  MemRefType want =
      MemRefType::get(decl.getType().getShape(), decl.getCopyAttr().getValue());
  if (getType() != want)
    return emitOpError() << "has type " << getType() << " but " << getNameAttr()
                         << "'s copy is " << want;
  return success();
}

/// An update's `copy`: the parameter's shape in a 16-bit type.
static LogicalResult verifyUpdateCopy(Operation *op, Value param, Value copy) {
  if (!copy)
    return success();
  auto p = cast<MemRefType>(param.getType());
  auto c = cast<MemRefType>(copy.getType());
  if (!p.getElementType().isF32() || c.getShape() != p.getShape() ||
      !(c.getElementType().isBF16() || c.getElementType().isF16()))
    return op->emitOpError() << "writes a copy " << c << " of a parameter " << p
                             << ": expected its shape in bf16 or f16 of an "
                                "f32 parameter";
  // The parameter's own copy: another's would go stale.
  auto pc = copy.getDefiningOp<ParamCopyOp>();
  auto po = param.getDefiningOp<ParamOp>();
  if (!pc || (po && po.getName() != pc.getName()))
    return op->emitOpError()
           << "writes a copy that is not "
           << (po ? "the rank.param_copy of " + po.getName().str()
                  : std::string("a rank.param_copy"));
  return success();
}

LogicalResult SgdUpdateOp::verify() {
  return verifyUpdateCopy(*this, getParam(), getCopy());
}

std::string SgdUpdateOp::getRuntimeCallee() {
  return getCopy() ? "planrt::sgd_update_copy" : "planrt::sgd_update";
}

LogicalResult StateOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyDeclRef<StateDeclOp>(*this, getNameAttr(), getType(), tables,
                                    "rank.state_decl");
}

LogicalResult StateDeclOp::verify() {
  if (getInit() && !getBuffer())
    return emitOpError() << "has an initializer but is optimizer state (zero "
                            "at the start); only a 'buffer' takes 'init'";
  return success();
}

LogicalResult InputOp::verifySymbolUses(SymbolTableCollection &tables) {
  return verifyDeclRef<InputDeclOp>(*this, getNameAttr(), getType(), tables,
                                    "rank.input_decl");
}

/// A buffer of rank >= 2 viewed as 2-D [rows, last dim], as planrt's
/// matmul sees it.
static std::pair<int64_t, int64_t> asMatrix(MemRefType t) {
  int64_t last = t.getDimSize(t.getRank() - 1);
  return {t.getNumElements() / last, last};
}

/// The shapes of out = op(a) @ op(b), each viewed as a matrix.
static LogicalResult verifyMatmulShapes(Operation *op, MemRefType a,
                                        MemRefType b, MemRefType c,
                                        bool transposeA, bool transposeB) {
  if (a.getRank() < 2 || b.getRank() < 2 || c.getRank() < 2)
    return op->emitOpError() << "expects buffers of rank 2 or more (leading "
                                "dimensions are rows)";
  auto [ar, ac] = asMatrix(a);
  auto [br, bc] = asMatrix(b);
  auto [cr, cc] = asMatrix(c);
  int64_t m = transposeA ? ac : ar, k = transposeA ? ar : ac;
  int64_t k2 = transposeB ? bc : br, n = transposeB ? br : bc;
  if (k != k2 || cr != m || cc != n)
    return op->emitOpError()
           << "shapes do not agree: " << a << ", " << b << " -> " << c;
  return success();
}

LogicalResult MatmulOp::verify() {
  if (Value r = getResidual()) {
    if (getAccumulate())
      return emitOpError() << "adds either a residual or its own output "
                              "(accumulate), not both";
    if (r.getType() != getOut().getType())
      return emitOpError() << "expects the residual of out's type, got "
                           << r.getType() << " and " << getOut().getType();
    if (viewRoot(r) == viewRoot(getOut()))
      return emitOpError() << "expects the residual and out in two buffers";
  }
  return verifyMatmulShapes(*this, getLhs().getType(), getRhs().getType(),
                            getOut().getType(), getTransposeLhs(),
                            getTransposeRhs());
}

/// A GEMM with a bias epilogue: the shapes, and a bias of c's last dim
/// and element type.
static LogicalResult verifyBiasedMatmul(Operation *op, MemRefType a,
                                        MemRefType b, MemRefType bias,
                                        MemRefType c, bool transposeA,
                                        bool transposeB) {
  if (failed(verifyMatmulShapes(op, a, b, c, transposeA, transposeB)))
    return failure();
  if (bias.getRank() != 1 ||
      bias.getDimSize(0) != c.getDimSize(c.getRank() - 1))
    return op->emitOpError()
           << "expects a bias of out's last dim ("
           << c.getDimSize(c.getRank() - 1) << "), got " << bias;
  if (bias.getElementType() != c.getElementType())
    return op->emitOpError() << "expects a bias of out's element type ("
                             << c.getElementType() << "), got " << bias;
  return success();
}

LogicalResult MatmulBiasOp::verify() {
  if (Value r = getResidual()) {
    if (r.getType() != getOut().getType())
      return emitOpError() << "expects the residual of out's type, got "
                           << r.getType() << " and " << getOut().getType();
    if (viewRoot(r) == viewRoot(getOut()))
      return emitOpError() << "expects the residual and out in two buffers";
  }
  return verifyBiasedMatmul(*this, getLhs().getType(), getRhs().getType(),
                            getBias().getType(), getOut().getType(),
                            getTransposeLhs(), getTransposeRhs());
}

LogicalResult MatmulBiasGeluOp::verify() {
  if (getPre().getType() != getOut().getType())
    return emitOpError() << "expects pre and out of one type, got "
                         << getPre().getType() << " and " << getOut().getType();
  if (getPre() == getOut())
    return emitOpError() << "expects pre and out in two buffers (the "
                            "backward reads pre)";
  return verifyBiasedMatmul(*this, getLhs().getType(), getRhs().getType(),
                            getBias().getType(), getOut().getType(),
                            getTransposeLhs(), getTransposeRhs());
}

LogicalResult MatmulDgeluOp::verify() {
  if (getPre().getType() != getOut().getType())
    return emitOpError() << "expects pre and out of one type, got "
                         << getPre().getType() << " and " << getOut().getType();
  if (getPre() == getOut())
    return emitOpError() << "expects pre and out in two buffers";
  return verifyMatmulShapes(*this, getLhs().getType(), getRhs().getType(),
                            getOut().getType(), getTransposeLhs(),
                            getTransposeRhs());
}

LogicalResult MatmulBiasGradOp::verify() {
  if (getTransposeRhs())
    return emitOpError() << "expects rhs not transposed (the bias gradient "
                            "sums its rows)";
  auto rhs = getRhs().getType();
  auto db = getBiasGrad().getType();
  if (failed(verifyMatmulShapes(*this, getLhs().getType(), rhs,
                                getOut().getType(), getTransposeLhs(),
                                getTransposeRhs())))
    return failure();
  if (db.getRank() != 1 ||
      db.getDimSize(0) != rhs.getDimSize(rhs.getRank() - 1))
    return emitOpError() << "expects a bias gradient of rhs's last dim ("
                         << rhs.getDimSize(rhs.getRank() - 1) << "), got "
                         << db;
  if (db.getElementType() != rhs.getElementType() &&
      !db.getElementType().isF32())
    return emitOpError() << "expects a bias gradient of rhs's element type "
                            "or f32, got "
                         << db;
  return success();
}

std::string MatmulOp::getRuntimeCallee() {
  return getAccumulate() ? "planrt::matmul_accumulate"
         : getResidual() ? "planrt::matmul_add"
                         : "planrt::matmul";
}

SmallVector<StringRef> MatmulOp::getRuntimeAttrNames() {
  return {"transpose_lhs", "transpose_rhs"};
}

std::string MatmulBiasOp::getRuntimeCallee() {
  return getResidual() ? "planrt::matmul_bias_add" : "planrt::matmul_bias";
}

SmallVector<StringRef> MatmulBiasOp::getRuntimeAttrNames() {
  return {"transpose_lhs", "transpose_rhs"};
}

SmallVector<StringRef> MatmulBiasGeluOp::getRuntimeAttrNames() {
  return {"transpose_lhs", "transpose_rhs"};
}

SmallVector<StringRef> MatmulDgeluOp::getRuntimeAttrNames() {
  return {"transpose_lhs", "transpose_rhs"};
}

std::string MatmulBiasGradOp::getRuntimeCallee() {
  return getAccumulate() ? "planrt::matmul_bias_grad_accumulate"
                         : "planrt::matmul_bias_grad";
}

SmallVector<StringRef> MatmulBiasGradOp::getRuntimeAttrNames() {
  return {"transpose_lhs", "transpose_rhs"};
}

SmallVector<StringRef> CrossEntropyInPlaceOp::getRuntimeAttrNames() {
  return {"scale", "grad_scale", "valid_classes"};
}

std::string AdamWUpdateOp::getRuntimeCallee() {
  std::string callee =
      getClipSumsq() ? "planrt::adamw_update_clipped" : "planrt::adamw_update";
  return getCopy() ? callee + "_copy" : callee;
}

SmallVector<StringRef> AdamWUpdateOp::getRuntimeAttrNames() {
  // planrt::adamw_update(ctx, w, g, m, v, lr, beta1, beta2, eps, wd) and
  // planrt::adamw_update_clipped(ctx, w, g, m, v, sumsq, ..., max_norm);
  // the _copy variants take the copy after v (and sumsq).
  if (getClipSumsq())
    return {"lr", "beta1", "beta2", "eps", "weight_decay", "max_norm"};
  return {"lr", "beta1", "beta2", "eps", "weight_decay"};
}

LogicalResult ShardViewOp::verify() {
  MemRefType src = getSource().getType(), res = getResult().getType();
  bool ok = src.getRank() >= 1 && src.getRank() == res.getRank() &&
            src.getElementType() == res.getElementType() &&
            res.getDimSize(0) > 0 && src.getDimSize(0) % res.getDimSize(0) == 0;
  for (int64_t d = 1; ok && d < src.getRank(); ++d)
    ok = src.getDimSize(d) == res.getDimSize(d);
  if (!ok)
    return emitOpError() << "views " << src << " as " << res
                         << ": expected a whole fraction of dimension 0 and "
                            "the other dimensions unchanged";
  return success();
}

LogicalResult AdamWUpdateOp::verify() {
  if (!getClipSumsq() != !getMaxNormAttr())
    return emitOpError() << "takes 'max_norm' exactly when it is clipped by "
                            "a sum of squares";
  if (getClipSumsq() && getClipSumsq().getType().getNumElements() != 1)
    return emitOpError() << "clips by a sum of squares of one element, got "
                         << getClipSumsq().getType();
  if (auto m = getMaxNormAttr(); m && !(m.getValueAsDouble() > 0))
    return emitOpError() << "max_norm must be > 0, got "
                         << m.getValueAsDouble();
  return verifyUpdateCopy(*this, getParam(), getCopy());
}

LogicalResult ViewOp::verify() {
  if (getSource().getType().getNumElements() !=
      getResult().getType().getNumElements())
    return emitOpError() << "views " << getSource().getType() << " as "
                         << getResult().getType()
                         << ", which has a different element count";
  return success();
}

//===--- Collectives ------------------------------------------------------===//

// planrt takes the dimensions before the axis.
SmallVector<StringRef> AllGatherOp::getRuntimeAttrNames() {
  return {"dim", "axis"};
}
SmallVector<StringRef> ReduceScatterOp::getRuntimeAttrNames() {
  return {"dim", "axis"};
}
SmallVector<StringRef> ShardSliceOp::getRuntimeAttrNames() {
  return {"dim", "axis"};
}
SmallVector<StringRef> AllToAllOp::getRuntimeAttrNames() {
  return {"gather_dim", "split_dim", "axis"};
}

SmallVector<StringRef> RoutedAllGatherOp::getRuntimeAttrNames() {
  return {"experts_per_rank", "axis"};
}
SmallVector<StringRef> RoutedReduceScatterOp::getRuntimeAttrNames() {
  return {"experts_per_rank", "axis"};
}

/// A routed collective: `block` and `whole` differ only in dimension 0, by
/// a whole factor; `experts` has whole's rows and `per_rank` >= 1.
static LogicalResult verifyRouted(Operation *op, MemRefType block,
                                  MemRefType whole, MemRefType experts,
                                  int64_t perRank) {
  bool ok = block.getRank() >= 2 && block.getRank() == whole.getRank() &&
            block.getElementType() == whole.getElementType() &&
            block.getDimSize(0) > 0 &&
            whole.getDimSize(0) % block.getDimSize(0) == 0;
  for (int64_t d = 1; ok && d < block.getRank(); ++d)
    ok = block.getDimSize(d) == whole.getDimSize(d);
  if (!ok)
    return op->emitOpError() << "expects a block and the group's whole of one "
                                "element type, differing only in dimension 0 "
                                "by a whole factor, got "
                             << block << " and " << whole;
  int64_t rows = whole.getNumElements() / whole.getShape().back();
  if (experts.getRank() < 2 ||
      experts.getNumElements() / experts.getShape().back() != rows)
    return op->emitOpError() << "expects the group's choices with " << rows
                             << " rows, got " << experts;
  if (perRank < 1)
    return op->emitOpError()
           << "experts_per_rank must be >= 1, got " << perRank;
  return success();
}

LogicalResult RoutedAllGatherOp::verify() {
  return verifyRouted(*this, getInput().getType(), getOut().getType(),
                      getExperts().getType(), getExpertsPerRank());
}

LogicalResult RoutedReduceScatterOp::verify() {
  return verifyRouted(*this, getOut().getType(), getInput().getType(),
                      getExperts().getType(), getExpertsPerRank());
}

/// The input and output differ only in dimension `dim`, by a whole factor
/// (`grows`: the output is the larger).
static LogicalResult verifyDimCollective(Operation *op, MemRefType in,
                                         MemRefType out, int64_t dim,
                                         bool grows) {
  if (in.getRank() != out.getRank() || dim < 0 || dim >= in.getRank())
    return op->emitOpError() << "expects buffers of one rank and a dimension "
                                "in range, got "
                             << in << ", " << out << " and dim " << dim;
  for (int64_t d = 0; d < in.getRank(); ++d) {
    int64_t a = in.getDimSize(d), b = out.getDimSize(d);
    if (d != dim ? a != b : (grows ? b % a : a % b) != 0)
      return op->emitOpError() << "cannot take " << in << " to " << out
                               << " along dimension " << dim;
  }
  return success();
}

LogicalResult AllGatherOp::verify() {
  return verifyDimCollective(*this, getInput().getType(), getOut().getType(),
                             getDim(), true);
}
LogicalResult ReduceScatterOp::verify() {
  return verifyDimCollective(*this, getInput().getType(), getOut().getType(),
                             getDim(), false);
}
LogicalResult ShardSliceOp::verify() {
  return verifyDimCollective(*this, getInput().getType(), getOut().getType(),
                             getDim(), false);
}

// planrt::rope takes the head counts, then the base, then the direction.
SmallVector<StringRef> RopeOp::getRuntimeAttrNames() {
  return {"num_heads", "num_kv_heads", "theta", "inverse", "seq_axis"};
}

/// seq_to_heads / heads_to_seq: `seq` is the sequence-split side [B, S/G,
/// W], `heads` the head-split one [B, S, W/G]; W is q_width (+ 2 kv_width).
static LogicalResult verifySeqHeads(Operation *op, MemRefType seq,
                                    MemRefType heads, int64_t q, int64_t kv) {
  if (seq.getRank() != 3 || heads.getRank() != 3 ||
      seq.getDimSize(0) != heads.getDimSize(0) || q < 1 || kv < 0 ||
      seq.getDimSize(2) != q + 2 * kv ||
      seq.getDimSize(2) % heads.getDimSize(2) != 0 ||
      heads.getDimSize(1) % seq.getDimSize(1) != 0 ||
      heads.getDimSize(1) / seq.getDimSize(1) !=
          seq.getDimSize(2) / heads.getDimSize(2) ||
      seq.getElementType() != heads.getElementType())
    return op->emitOpError()
           << "expects a sequence-split [B, S/G, q_width + 2 kv_width] and a "
              "head-split [B, S, W/G] buffer of one element type, got "
           << seq << " and " << heads << " with q_width " << q
           << " and kv_width " << kv;
  return success();
}
// planrt takes the widths (or head counts), then the axis.
SmallVector<StringRef> KvGatherOp::getRuntimeAttrNames() {
  return {"q_width", "kv_width", "axis"};
}
SmallVector<StringRef> KvReduceScatterOp::getRuntimeAttrNames() {
  return {"q_width", "kv_width", "axis"};
}
SmallVector<StringRef> AttentionRingOp::getRuntimeAttrNames() {
  return {"num_heads",   "num_kv_heads",   "axis",         "dropout",
          "dropout_uid", "batch_axes",     "microbatches", "mb_inner_axes",
          "head_axes",   "head_inner_axes"};
}
SmallVector<StringRef> AttentionRingGradOp::getRuntimeAttrNames() {
  return {"num_heads",   "num_kv_heads",   "axis",         "dropout",
          "dropout_uid", "batch_axes",     "microbatches", "mb_inner_axes",
          "head_axes",   "head_inner_axes"};
}
std::string AttentionRingOp::getRuntimeCallee() {
  return getLse() ? "planrt::attention_ring_lse" : "planrt::attention_ring";
}
std::string AttentionRingGradOp::getRuntimeCallee() {
  return getLse() ? "planrt::attention_ring_grad_lse"
                  : "planrt::attention_ring_grad";
}
/// A ring's kept log-sum-exps: f32 [B, H, L] of its local qkv [B, L, W].
static LogicalResult verifyRingLse(Operation *op, Value qkv, Value lse,
                                   int64_t heads) {
  if (!lse)
    return success();
  auto q = cast<MemRefType>(qkv.getType());
  auto l = cast<MemRefType>(lse.getType());
  SmallVector<int64_t> want = {q.getDimSize(0), heads, q.getDimSize(1)};
  if (!l.getElementType().isF32() || l.getShape() != ArrayRef(want))
    return op->emitOpError()
           << "keeps each row's log-sum-exp in an f32 [B, H, L] buffer ("
           << want[0] << "x" << want[1] << "x" << want[2] << "), got " << l;
  return success();
}
/// A gradient's `kept %fwd_out, %lse`: both or neither, the output of the
/// gradient's type.
static LogicalResult verifyKept(Operation *op, Value fwdOut, Value lse,
                                Value grad) {
  if (!fwdOut != !lse)
    return op->emitOpError() << "takes the forward's output and log-sum-exp "
                                "together, or neither";
  if (fwdOut && fwdOut.getType() != grad.getType())
    return op->emitOpError()
           << "reads the forward's output " << fwdOut.getType()
           << " beside its gradient " << grad.getType() << ": they must match";
  return success();
}
LogicalResult AttentionRingOp::verify() {
  return verifyRingLse(*this, getQkv(), getLse(), getNumHeads());
}
LogicalResult AttentionRingGradOp::verify() {
  if (failed(verifyKept(*this, getFwdOut(), getLse(), getGrad())))
    return failure();
  return verifyRingLse(*this, getQkv(), getLse(), getNumHeads());
}
std::string AttentionCpOp::getRuntimeCallee() {
  return getLse() ? "planrt::attention_cp_lse" : "planrt::attention_cp";
}
std::string AttentionCpGradOp::getRuntimeCallee() {
  return getLse() ? "planrt::attention_cp_grad_lse"
                  : "planrt::attention_cp_grad";
}
LogicalResult AttentionCpGradOp::verify() {
  return verifyKept(*this, getFwdOut(), getLse(), getGrad());
}
SmallVector<StringRef> AttentionCpOp::getRuntimeAttrNames() {
  return {"num_heads",   "num_kv_heads",   "axis",         "dropout",
          "dropout_uid", "batch_axes",     "microbatches", "mb_inner_axes",
          "head_axes",   "head_inner_axes"};
}
SmallVector<StringRef> AttentionCpGradOp::getRuntimeAttrNames() {
  return {"num_heads",   "num_kv_heads",   "axis",         "dropout",
          "dropout_uid", "batch_axes",     "microbatches", "mb_inner_axes",
          "head_axes",   "head_inner_axes"};
}
SmallVector<StringRef> SeqToHeadsOp::getRuntimeAttrNames() {
  return {"q_width", "kv_width", "axis"};
}
SmallVector<StringRef> HeadsToSeqOp::getRuntimeAttrNames() {
  return {"q_width", "kv_width", "axis"};
}
LogicalResult SeqToHeadsOp::verify() {
  return verifySeqHeads(*this, getInput().getType(), getOut().getType(),
                        getQWidth(), getKvWidth());
}
LogicalResult HeadsToSeqOp::verify() {
  return verifySeqHeads(*this, getOut().getType(), getInput().getType(),
                        getQWidth(), getKvWidth());
}

// planrt takes the vocabulary axis before the number of valid classes
// (which defaults to all of them).
SmallVector<StringRef> CeLocalStatsOp::getRuntimeAttrNames() {
  return {"vocab_axis", "valid_classes"};
}
SmallVector<StringRef> CeGradFromStatsOp::getRuntimeAttrNames() {
  return {"scale", "vocab_axis", "valid_classes"};
}
