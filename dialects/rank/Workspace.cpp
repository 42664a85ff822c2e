//===- Workspace.cpp - The temporaries each rank op takes -----------------===//
//
// WorkspaceOpInterface as external models: each op's bytes come from
// planrt/workspace.h, the header the runtime checks its ops against, with
// the sizes the op sees (its buffers' local shapes and the mesh). Keeping
// the formulas in one header shared with planrt is what lets the memory
// plan reserve exactly what the runtime takes.
//===----------------------------------------------------------------------===//
#include "dialects/rank/RankDialect.h"

#include "planrt/workspace.h"

using namespace mlir;
using namespace planc::rank;
namespace ws = planrt::workspace;

namespace {
int64_t numel(Value v) {
  return cast<MemRefType>(v.getType()).getNumElements();
}
int64_t dim(Value v, int64_t d) {
  return cast<MemRefType>(v.getType()).getDimSize(d);
}
int64_t rank(Value v) { return cast<MemRefType>(v.getType()).getRank(); }
/// Rows of a buffer seen as [rows, last dim] (planrt's lead_rows).
int64_t leadRows(Value v) {
  int64_t r = 1;
  for (int64_t d = 0; d + 1 < rank(v); ++d)
    r *= dim(v, d);
  return r;
}
int64_t lastDim(Value v) { return rank(v) ? dim(v, rank(v) - 1) : 1; }
/// The product of the dimensions before `d` (planrt's dim_view outer).
int64_t outer(Value v, int64_t d) {
  int64_t r = 1;
  for (int64_t i = 0; i < d && i < rank(v); ++i)
    r *= dim(v, i);
  return r;
}
int64_t groupOf(const WorkspaceEnv &env, ArrayAttr axes) {
  int64_t g = 1;
  for (Attribute a : axes)
    g *= env.axisSize(cast<StringAttr>(a).getValue());
  return g;
}

} // namespace

namespace {
/// planrt::DType of a buffer's elements: F32 0, I32 1, BF16 2, F16 3.
int dtypeOf(Value v) {
  Type t = cast<MemRefType>(v.getType()).getElementType();
  return t.isF32() ? 0 : t.isBF16() ? 2 : t.isF16() ? 3 : 1;
}
bool isFloatBuffer(Value v) {
  auto m = dyn_cast<MemRefType>(v.getType());
  return m && isa<FloatType>(m.getElementType());
}

/// Whether planrt runs `op` on its 16-bit buffers as they are, without fp32
/// copies: planrt/workspace.h's rules, which the runtime applies too.
bool runsNative(Operation *op, const WorkspaceEnv &env) {
  namespace nat = ws::native;
  if (isa<AddOp, MulOp, SubOp, BiasAddOp, ReluOp, ReluGradOp, GeluOp,
          GeluGradOp, GeluExactOp, GeluExactGradOp, SiluOp, SiluGradOp, CopyOp,
          ScaleOp, RopeOp, PosEmbeddingOp, EmbeddingOp, LayerNormOp, RmsNormOp,
          AllGatherOp, AllToAllOp, RoutedAllGatherOp, ShardSliceOp,
          SeqToHeadsOp, HeadsToSeqOp, KvGatherOp, AttentionRingOp,
          AttentionRingGradOp>(op)) {
    int first = -1;
    for (Value v : op->getOperands())
      if (isFloatBuffer(v)) {
        if (first < 0)
          first = dtypeOf(v);
        else if (!nat::uniform(first, dtypeOf(v)))
          return false;
      }
    return true;
  }
  // A kept log-sum-exp, and the keys' and values' partial gradients, are
  // f32 whatever the rest.
  if (auto a = dyn_cast<AttentionCpOp>(op))
    return nat::uniform(dtypeOf(a.getQkv()), dtypeOf(a.getKv()),
                        dtypeOf(a.getOut()));
  if (auto a = dyn_cast<AttentionCpGradOp>(op))
    return (!a.getFwdOut() || dtypeOf(a.getFwdOut()) == dtypeOf(a.getGrad())) &&
           nat::uniform(dtypeOf(a.getQkv()), dtypeOf(a.getKv()),
                        dtypeOf(a.getGrad()), dtypeOf(a.getOut()));
  if (auto r = dyn_cast<KvReduceScatterOp>(op))
    return nat::kv_reduce_scatter(dtypeOf(r.getDkv()));
  if (auto g = dyn_cast<LayerNormGradOp>(op))
    return nat::norm_grad(dtypeOf(g.getInput()), dtypeOf(g.getGamma()),
                          dtypeOf(g.getGrad()), dtypeOf(g.getInputGrad()),
                          dtypeOf(g.getGammaGrad()), dtypeOf(g.getBetaGrad()));
  if (auto g = dyn_cast<RmsNormGradOp>(op))
    return nat::norm_grad(dtypeOf(g.getInput()), dtypeOf(g.getGamma()),
                          dtypeOf(g.getGrad()), dtypeOf(g.getInputGrad()),
                          dtypeOf(g.getGammaGrad()), -1);
  if (auto g = dyn_cast<BiasGradOp>(op))
    return nat::column_sum(dtypeOf(g.getInput()), dtypeOf(g.getOut()));
  if (auto g = dyn_cast<PosEmbeddingGradOp>(op))
    return nat::column_sum(dtypeOf(g.getInput()), dtypeOf(g.getOut()));
  if (auto g = dyn_cast<EmbeddingGradOp>(op))
    return nat::embedding_grad(dtypeOf(g.getGrad()), dtypeOf(g.getOut()));
  if (auto g = dyn_cast<EmbeddingGradAddOp>(op))
    return nat::embedding_grad(dtypeOf(g.getGrad()), dtypeOf(g.getOut()));
  // Attention: the head dim from qkv's width; the kept tensors' common type
  // (-1: none kept, -2: they differ), as planrt's attention ops compute them.
  auto headDim = [](Value qkv, int64_t heads, int64_t kvHeads) {
    return dim(qkv, 2) / (heads + 2 * kvHeads);
  };
  auto kept = [](Value keep, Value stats) {
    return dtypeOf(keep) == dtypeOf(stats) ? dtypeOf(keep) : -2;
  };
  if (auto a = dyn_cast<AttentionOp>(op))
    return nat::attention(
        dtypeOf(a.getQkv()), dtypeOf(a.getOut()), -1,
        headDim(a.getQkv(), a.getNumHeads(), a.getNumKvHeads()));
  // The kept output and log-sum-exp are read as they are (cuDNN), or not
  // at all (the tiles).
  if (auto a = dyn_cast<AttentionLseOp>(op))
    return nat::attention(
        dtypeOf(a.getQkv()), dtypeOf(a.getOut()), -1,
        headDim(a.getQkv(), a.getNumHeads(), a.getNumKvHeads()));
  if (auto a = dyn_cast<AttentionGradLseOp>(op))
    return dtypeOf(a.getFwdOut()) == dtypeOf(a.getGrad()) &&
           nat::attention_grad(
               dtypeOf(a.getQkv()), dtypeOf(a.getGrad()), dtypeOf(a.getOut()),
               -1, headDim(a.getQkv(), a.getNumHeads(), a.getNumKvHeads()));
  if (auto a = dyn_cast<AttentionKeepOp>(op))
    return nat::attention(
        dtypeOf(a.getQkv()), dtypeOf(a.getOut()),
        kept(a.getKeep(), a.getStats()),
        headDim(a.getQkv(), a.getNumHeads(), a.getNumKvHeads()));
  if (auto a = dyn_cast<AttentionGradOp>(op))
    return nat::attention_grad(
        dtypeOf(a.getQkv()), dtypeOf(a.getGrad()), dtypeOf(a.getOut()), -1,
        headDim(a.getQkv(), a.getNumHeads(), a.getNumKvHeads()));
  if (auto a = dyn_cast<AttentionGradKeptOp>(op))
    return nat::attention_grad(
        dtypeOf(a.getQkv()), dtypeOf(a.getGrad()), dtypeOf(a.getOut()),
        kept(a.getKeep(), a.getStats()),
        headDim(a.getQkv(), a.getNumHeads(), a.getNumKvHeads()));
  if (auto g = dyn_cast<CrossEntropyGradOp>(op))
    return nat::loss_grad(dtypeOf(g.getLogits()), dtypeOf(g.getOut()));
  // One float type (the logits); the loss is an f32 scalar.
  if (isa<CrossEntropyInPlaceOp>(op))
    return true;
  if (auto g = dyn_cast<CeGradFromStatsOp>(op))
    return nat::loss_grad(dtypeOf(g.getLogits()), dtypeOf(g.getOut()));
  if (auto m = dyn_cast<MatmulOp>(op); m && env.cuda)
    return nat::cuda_matmul(dtypeOf(m.getLhs()), dtypeOf(m.getRhs()),
                            dtypeOf(m.getOut()));
  // The bias has out's type (its verifier): the epilogue reads it as is.
  if (auto m = dyn_cast<MatmulBiasOp>(op); m && env.cuda)
    return nat::cuda_matmul(dtypeOf(m.getLhs()), dtypeOf(m.getRhs()),
                            dtypeOf(m.getOut()));
  if (auto m = dyn_cast<MatmulBiasGeluOp>(op); m && env.cuda)
    return nat::cuda_matmul(dtypeOf(m.getLhs()), dtypeOf(m.getRhs()),
                            dtypeOf(m.getOut()));
  // pre has out's type (the verifier), so the fallback's gelu_grad is
  // native whenever the GEMM is.
  if (auto m = dyn_cast<MatmulDgeluOp>(op); m && env.cuda)
    return nat::cuda_matmul(dtypeOf(m.getLhs()), dtypeOf(m.getRhs()),
                            dtypeOf(m.getOut()));
  if (auto m = dyn_cast<MatmulBiasGradOp>(op); m && env.cuda)
    return nat::cuda_matmul(dtypeOf(m.getLhs()), dtypeOf(m.getRhs()),
                            dtypeOf(m.getOut())) &&
           nat::column_sum(dtypeOf(m.getRhs()), dtypeOf(m.getBiasGrad()));
  return false;
}
} // namespace

int64_t planc::rank::stagingBytes(Operation *op, const WorkspaceEnv &env) {
  bool staged = (isa<RuntimeCallOpInterface>(op) &&
                 !isa<CastOp, ReportLossOp, ReportGradNormOp>(op)) ||
                isa<AllReduceOp, AllReduceStartOp, AllReduceMaxOp, AllGatherOp,
                    ReduceScatterOp, ShardSliceOp>(op);
  if (!staged || runsNative(op, env))
    return 0;
  // An update's 16-bit copy of the parameter is written as it is (planrt
  // stages the other operands, then rounds the copy from the parameter).
  Value copy;
  if (auto u = dyn_cast<AdamWUpdateOp>(op))
    copy = u.getCopy();
  else if (auto u = dyn_cast<SgdUpdateOp>(op))
    copy = u.getCopy();
  int64_t bytes = 0;
  for (Value v : op->getOperands())
    if (v != copy && isFloatBuffer(v) &&
        !cast<MemRefType>(v.getType()).getElementType().isF32())
      bytes += ws::staging(cast<MemRefType>(v.getType()).getNumElements());
  return bytes;
}

namespace {
/// One model per op: `Fn` computes the bytes from the op.
template <typename OpT, int64_t (*Fn)(OpT, const WorkspaceEnv &)>
struct Model : public WorkspaceOpInterface::ExternalModel<Model<OpT, Fn>, OpT> {
  int64_t getWorkspaceBytes(Operation *op, const WorkspaceEnv &env) const {
    return Fn(cast<OpT>(op), env);
  }
};

int64_t mseLoss(MseLossOp op, const WorkspaceEnv &) {
  return ws::mse_loss(numel(op.getPrediction()));
}
int64_t sumSq(SumSqAccumulateOp op, const WorkspaceEnv &) {
  return ws::sumsq_accumulate(numel(op.getInput()));
}
int64_t lossScale(LossScaleOp op, const WorkspaceEnv &) {
  return ws::loss_scale(numel(op.getInput()), op.getInverse());
}
int64_t embedding(EmbeddingOp op, const WorkspaceEnv &) {
  return ws::index_check(numel(op.getOut()));
}
template <typename OpT> int64_t embeddingGrad(OpT op, const WorkspaceEnv &) {
  return ws::index_check(numel(op.getGrad()));
}
int64_t crossEntropy(CrossEntropyOp op, const WorkspaceEnv &env) {
  return ws::cross_entropy(leadRows(op.getLogits()), env.classifier);
}
int64_t crossEntropyInPlace(CrossEntropyInPlaceOp op, const WorkspaceEnv &env) {
  return ws::cross_entropy(leadRows(op.getLogits()), env.classifier);
}
int64_t crossEntropyGrad(CrossEntropyGradOp op, const WorkspaceEnv &) {
  return ws::index_check(leadRows(op.getLogits()));
}
int64_t ceLocalStats(CeLocalStatsOp op, const WorkspaceEnv &) {
  return ws::index_check(leadRows(op.getLogits()));
}
int64_t ceLossFromStats(CeLossFromStatsOp op, const WorkspaceEnv &env) {
  return ws::ce_loss_from_stats(numel(op.getRowmax()), env.classifier);
}
int64_t ceGradFromStats(CeGradFromStatsOp op, const WorkspaceEnv &) {
  return ws::index_check(leadRows(op.getLogits()));
}
int64_t layerNormGrad(LayerNormGradOp op, const WorkspaceEnv &env) {
  return ws::norm_grad(true, leadRows(op.getInput()), lastDim(op.getInput()),
                       env.cuda);
}
int64_t rmsNormGrad(RmsNormGradOp op, const WorkspaceEnv &env) {
  return ws::norm_grad(false, leadRows(op.getInput()), lastDim(op.getInput()),
                       env.cuda);
}
int64_t biasGrad(BiasGradOp op, const WorkspaceEnv &env) {
  int64_t n = numel(op.getOut());
  return n == 0 ? 0 : ws::bias_grad(numel(op.getInput()) / n, n, env.cuda);
}
/// What the fallback's bias_grad takes (cuBLASLt's epilogue takes none).
int64_t matmulBiasGrad(MatmulBiasGradOp op, const WorkspaceEnv &env) {
  int64_t n = numel(op.getBiasGrad());
  return n == 0 ? 0 : ws::bias_grad(numel(op.getRhs()) / n, n, env.cuda);
}
int64_t attentionGrad(AttentionGradOp op, const WorkspaceEnv &) {
  Value qkv = op.getQkv();
  return ws::attention_grad(numel(qkv),
                            dim(qkv, 0) * dim(qkv, 1) * op.getNumHeads());
}
int64_t attentionGradLse(AttentionGradLseOp op, const WorkspaceEnv &) {
  Value qkv = op.getQkv();
  return ws::attention_grad(numel(qkv),
                            dim(qkv, 0) * dim(qkv, 1) * op.getNumHeads());
}
int64_t attentionGradKept(AttentionGradKeptOp op, const WorkspaceEnv &) {
  Value qkv = op.getQkv();
  return ws::attention_grad(numel(qkv),
                            dim(qkv, 0) * dim(qkv, 1) * op.getNumHeads());
}
/// The bytes per element a moving collective stages in: its buffers' own
/// width when they share a type (16-bit values move as they are), else 4
/// (the op runs on fp32 copies).
int64_t movedBytes(Value in, Value out) {
  Type a = cast<MemRefType>(in.getType()).getElementType();
  Type b = cast<MemRefType>(out.getType()).getElementType();
  return a == b ? (a.getIntOrFloatBitWidth() + 7) / 8 : 4;
}
int64_t allGather(AllGatherOp op, const WorkspaceEnv &env) {
  return ws::all_gather(numel(op.getInput()), numel(op.getOut()),
                        outer(op.getInput(), op.getDim()),
                        env.axisSize(op.getAxis()),
                        movedBytes(op.getInput(), op.getOut()));
}
int64_t reduceScatter(ReduceScatterOp op, const WorkspaceEnv &env) {
  return ws::reduce_scatter(numel(op.getInput()),
                            outer(op.getInput(), op.getDim()),
                            env.axisSize(op.getAxis()));
}
int64_t allToAll(AllToAllOp op, const WorkspaceEnv &env) {
  return ws::all_to_all(
      numel(op.getInput()), outer(op.getInput(), op.getSplitDim()),
      outer(op.getOut(), op.getGatherDim()), env.axisSize(op.getAxis()),
      movedBytes(op.getInput(), op.getOut()));
}
int64_t kvGather(KvGatherOp op, const WorkspaceEnv &env) {
  return ws::kv_gather(numel(op.getKv()) / env.axisSize(op.getAxis()),
                       env.axisSize(op.getAxis()),
                       movedBytes(op.getQkv(), op.getKv()));
}
int64_t kvReduceScatter(KvReduceScatterOp op, const WorkspaceEnv &env) {
  int64_t g = env.axisSize(op.getAxis());
  return ws::kv_reduce_scatter(numel(op.getDkv()) / g, g);
}
/// Expert parallelism's routed collectives: blocks of `block`'s rows and
/// width over the axis; routed_all_gather moves 16-bit rows as they are,
/// routed_reduce_scatter sums in fp32 (staged).
int64_t routedAllGather(RoutedAllGatherOp op, const WorkspaceEnv &env) {
  Value in = op.getInput();
  return ws::routed_exchange(leadRows(in), lastDim(in),
                             env.axisSize(op.getAxis()),
                             movedBytes(in, op.getOut()));
}
int64_t routedReduceScatter(RoutedReduceScatterOp op, const WorkspaceEnv &env) {
  Value out = op.getOut();
  return ws::routed_exchange(leadRows(out), lastDim(out),
                             env.axisSize(op.getAxis()), 4);
}
/// Context parallelism's attentions: a block of this rank's keys and
/// values, the query rows (batch x heads x positions) and the head dim.
template <class Op>
std::tuple<int64_t, int64_t, int64_t> cpAttentionShape(Op op) {
  Value qkv = op.getQkv();
  int64_t h = op.getNumHeads(), kv = op.getNumKvHeads();
  int64_t d = dim(qkv, 2) / (h + 2 * kv);
  return {dim(qkv, 0) * dim(qkv, 1) * 2 * kv * d, dim(qkv, 0) * dim(qkv, 1) * h,
          d};
}
int64_t attentionRing(AttentionRingOp op, const WorkspaceEnv &) {
  auto [block, rows, d] = cpAttentionShape(op);
  return ws::attention_ring(block, rows, d,
                            movedBytes(op.getQkv(), op.getOut()));
}
int64_t attentionRingGrad(AttentionRingGradOp op, const WorkspaceEnv &) {
  auto [block, rows, d] = cpAttentionShape(op);
  return ws::attention_ring_grad(block, rows, d,
                                 movedBytes(op.getQkv(), op.getOut()));
}
int64_t attentionCp(AttentionCpOp op, const WorkspaceEnv &) {
  auto [block, rows, d] = cpAttentionShape(op);
  return ws::attention_cp(rows, d);
}
int64_t attentionCpGrad(AttentionCpGradOp op, const WorkspaceEnv &) {
  auto [block, rows, d] = cpAttentionShape(op);
  return ws::attention_cp_grad(rows, d);
}
template <class Op> int64_t seqHeads(Op op, const WorkspaceEnv &env) {
  return ws::seq_heads(numel(op.getInput()), env.axisSize(op.getAxis()),
                       movedBytes(op.getInput(), op.getOut()));
}
/// im2col rows (C * KH * KW) and columns (N * HO * WO) of a convolution.
std::pair<int64_t, int64_t> convCols(Value input, Value filter, Value out) {
  return {dim(input, 1) * dim(filter, 2) * dim(filter, 3),
          dim(out, 0) * dim(out, 2) * dim(out, 3)};
}
int64_t conv2d(Conv2dOp op, const WorkspaceEnv &) {
  auto [krows, cols] = convCols(op.getInput(), op.getFilter(), op.getOut());
  return ws::conv2d(krows, cols, dim(op.getOut(), 1));
}
int64_t conv2dGrad(Conv2dGradOp op, const WorkspaceEnv &) {
  auto [krows, cols] = convCols(op.getInput(), op.getFilter(), op.getGrad());
  return ws::conv2d(krows, cols, dim(op.getGrad(), 1));
}
int64_t batchNorm(BatchNormOp op, const WorkspaceEnv &env) {
  return ws::batch_norm(dim(op.getInput(), 0), dim(op.getInput(), 1),
                        groupOf(env, op.getBatchAxes()));
}
int64_t batchNormGrad(BatchNormGradOp op, const WorkspaceEnv &env) {
  return ws::batch_norm_grad(dim(op.getInput(), 0), dim(op.getInput(), 1),
                             groupOf(env, op.getBatchAxes()));
}
int64_t groupNorm(GroupNormOp op, const WorkspaceEnv &) {
  return ws::group_norm(numel(op.getInput()), dim(op.getInput(), 0),
                        op.getGroups());
}
int64_t groupNormGrad(GroupNormGradOp op, const WorkspaceEnv &) {
  return ws::group_norm_grad(dim(op.getInput(), 1), dim(op.getInput(), 0),
                             op.getGroups());
}
/// The experts' operands: n routed rows, E, d, h and d' from the weights.
template <class Op> int64_t moeExperts(Op op, const WorkspaceEnv &) {
  constexpr bool grad = std::is_same_v<Op, MoeExpertsGradOp> ||
                        std::is_same_v<Op, MoeExpertsSwigluGradOp>;
  constexpr bool gated = std::is_same_v<Op, MoeExpertsSwigluOp> ||
                         std::is_same_v<Op, MoeExpertsSwigluGradOp>;
  int64_t n = numel(op.getExperts());
  Value up = op.getUp(), down = op.getDown();
  auto f = grad ? ws::moe_experts_grad : ws::moe_experts;
  return f(n, dim(up, 0), dim(up, 1), dim(up, 2), dim(down, 2), gated);
}
/// recompute = none's experts (plan-keep-experts).
template <class Op> int64_t moeExpertsKeep(Op op, const WorkspaceEnv &) {
  return ws::moe_experts_keep(numel(op.getExperts()), dim(op.getUp(), 2));
}
template <class Op> int64_t moeExpertsGradKept(Op op, const WorkspaceEnv &) {
  return ws::moe_experts_grad_kept(numel(op.getExperts()), dim(op.getUp(), 1),
                                   dim(op.getUp(), 2));
}
/// The sequences of a [..., S, K] choice buffer and the experts.
int64_t moeSequences(Value experts) {
  return rank(experts) < 2 ? 0
                           : numel(experts) / (dim(experts, rank(experts) - 2) *
                                               lastDim(experts));
}
template <class Op> int64_t moeTopk(Op op, const WorkspaceEnv &) {
  return op.getCapacity() == 0
             ? 0
             : ws::moe_sequence_counts(moeSequences(op.getOut()),
                                       lastDim(op.getLogits()));
}
int64_t moeAuxGrad(MoeAuxGradOp op, const WorkspaceEnv &) {
  return ws::moe_sequence_counts(moeSequences(op.getExperts()),
                                 lastDim(op.getLogits()));
}
} // namespace

void planc::rank::registerWorkspaceModels(MLIRContext *ctx) {
  MseLossOp::attachInterface<Model<MseLossOp, mseLoss>>(*ctx);
  MatmulBiasGradOp::attachInterface<Model<MatmulBiasGradOp, matmulBiasGrad>>(
      *ctx);
  SumSqAccumulateOp::attachInterface<Model<SumSqAccumulateOp, sumSq>>(*ctx);
  LossScaleOp::attachInterface<Model<LossScaleOp, lossScale>>(*ctx);
  EmbeddingOp::attachInterface<Model<EmbeddingOp, embedding>>(*ctx);
  EmbeddingGradOp::attachInterface<
      Model<EmbeddingGradOp, embeddingGrad<EmbeddingGradOp>>>(*ctx);
  EmbeddingGradAddOp::attachInterface<
      Model<EmbeddingGradAddOp, embeddingGrad<EmbeddingGradAddOp>>>(*ctx);
  CrossEntropyOp::attachInterface<Model<CrossEntropyOp, crossEntropy>>(*ctx);
  CrossEntropyInPlaceOp::attachInterface<
      Model<CrossEntropyInPlaceOp, crossEntropyInPlace>>(*ctx);
  CrossEntropyGradOp::attachInterface<
      Model<CrossEntropyGradOp, crossEntropyGrad>>(*ctx);
  CeLocalStatsOp::attachInterface<Model<CeLocalStatsOp, ceLocalStats>>(*ctx);
  CeLossFromStatsOp::attachInterface<Model<CeLossFromStatsOp, ceLossFromStats>>(
      *ctx);
  CeGradFromStatsOp::attachInterface<Model<CeGradFromStatsOp, ceGradFromStats>>(
      *ctx);
  LayerNormGradOp::attachInterface<Model<LayerNormGradOp, layerNormGrad>>(*ctx);
  RmsNormGradOp::attachInterface<Model<RmsNormGradOp, rmsNormGrad>>(*ctx);
  BiasGradOp::attachInterface<Model<BiasGradOp, biasGrad>>(*ctx);
  AttentionGradOp::attachInterface<Model<AttentionGradOp, attentionGrad>>(*ctx);
  AttentionGradLseOp::attachInterface<
      Model<AttentionGradLseOp, attentionGradLse>>(*ctx);
  AttentionGradKeptOp::attachInterface<
      Model<AttentionGradKeptOp, attentionGradKept>>(*ctx);
  AllGatherOp::attachInterface<Model<AllGatherOp, allGather>>(*ctx);
  ReduceScatterOp::attachInterface<Model<ReduceScatterOp, reduceScatter>>(*ctx);
  AllToAllOp::attachInterface<Model<AllToAllOp, allToAll>>(*ctx);
  RoutedAllGatherOp::attachInterface<Model<RoutedAllGatherOp, routedAllGather>>(
      *ctx);
  RoutedReduceScatterOp::attachInterface<
      Model<RoutedReduceScatterOp, routedReduceScatter>>(*ctx);
  KvGatherOp::attachInterface<Model<KvGatherOp, kvGather>>(*ctx);
  AttentionRingOp::attachInterface<Model<AttentionRingOp, attentionRing>>(*ctx);
  AttentionRingGradOp::attachInterface<
      Model<AttentionRingGradOp, attentionRingGrad>>(*ctx);
  KvReduceScatterOp::attachInterface<Model<KvReduceScatterOp, kvReduceScatter>>(
      *ctx);
  AttentionCpOp::attachInterface<Model<AttentionCpOp, attentionCp>>(*ctx);
  AttentionCpGradOp::attachInterface<Model<AttentionCpGradOp, attentionCpGrad>>(
      *ctx);
  SeqToHeadsOp::attachInterface<Model<SeqToHeadsOp, seqHeads<SeqToHeadsOp>>>(
      *ctx);
  HeadsToSeqOp::attachInterface<Model<HeadsToSeqOp, seqHeads<HeadsToSeqOp>>>(
      *ctx);
  Conv2dOp::attachInterface<Model<Conv2dOp, conv2d>>(*ctx);
  Conv2dGradOp::attachInterface<Model<Conv2dGradOp, conv2dGrad>>(*ctx);
  BatchNormOp::attachInterface<Model<BatchNormOp, batchNorm>>(*ctx);
  BatchNormGradOp::attachInterface<Model<BatchNormGradOp, batchNormGrad>>(*ctx);
  GroupNormOp::attachInterface<Model<GroupNormOp, groupNorm>>(*ctx);
  GroupNormGradOp::attachInterface<Model<GroupNormGradOp, groupNormGrad>>(*ctx);
  MoeTopkOp::attachInterface<Model<MoeTopkOp, moeTopk<MoeTopkOp>>>(*ctx);
  MoeExpertsKeepOp::attachInterface<
      Model<MoeExpertsKeepOp, moeExpertsKeep<MoeExpertsKeepOp>>>(*ctx);
  MoeExpertsSwigluKeepOp::attachInterface<
      Model<MoeExpertsSwigluKeepOp, moeExpertsKeep<MoeExpertsSwigluKeepOp>>>(
      *ctx);
  MoeExpertsGradKeptOp::attachInterface<
      Model<MoeExpertsGradKeptOp, moeExpertsGradKept<MoeExpertsGradKeptOp>>>(
      *ctx);
  MoeExpertsSwigluGradKeptOp::attachInterface<
      Model<MoeExpertsSwigluGradKeptOp,
            moeExpertsGradKept<MoeExpertsSwigluGradKeptOp>>>(*ctx);
  MoeTopkBiasedOp::attachInterface<
      Model<MoeTopkBiasedOp, moeTopk<MoeTopkBiasedOp>>>(*ctx);
  MoeAuxGradOp::attachInterface<Model<MoeAuxGradOp, moeAuxGrad>>(*ctx);
  MoeExpertsOp::attachInterface<Model<MoeExpertsOp, moeExperts<MoeExpertsOp>>>(
      *ctx);
  MoeExpertsSwigluOp::attachInterface<
      Model<MoeExpertsSwigluOp, moeExperts<MoeExpertsSwigluOp>>>(*ctx);
  MoeExpertsGradOp::attachInterface<
      Model<MoeExpertsGradOp, moeExperts<MoeExpertsGradOp>>>(*ctx);
  MoeExpertsSwigluGradOp::attachInterface<
      Model<MoeExpertsSwigluGradOp, moeExperts<MoeExpertsSwigluGradOp>>>(*ctx);
}
