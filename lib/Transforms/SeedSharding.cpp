//===- SeedSharding.cpp - The plan's strategy as a few sharding seeds -----===//
//
// Propagation needs only a few layouts to start from; this pass writes them
// on the model's arguments, each with its origin (which sets its priority):
//  - data:   inputs and labels split along the batch over `dp` and, with
//            context parallelism, along the sequence (dimension 1) over
//            `cp`;
//  - policy: with `tensor = megatron` and tp > 1, the first linear of each
//            layer split by columns over `tp` (the packed q/k/v projection
//            by heads: three segments), embedding tables by rows and the
//            LM head by columns (vocab-parallel). Everything else (biases, the
//            row-parallel second linears, gradients) follows by propagation.
// A parameter the user annotated with shard(...) keeps its annotation.
// Being a pass over the IR, the same seeds can come from a planner later.
//===----------------------------------------------------------------------===//
#include "ArgAttrBatch.h"
#include "ShardingAnalysis.h"
#include "planc/Transforms/Passes.h"
#include "llvm/ADT/ScopeExit.h"

namespace planc {
#define GEN_PASS_DEF_SEEDSHARDING
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
using namespace planc::plan;

static constexpr const char *kExpertAxis = OpShardingRule::kExpertAxis;

namespace {
struct SeedShardingPass
    : public planc::impl::SeedShardingBase<SeedShardingPass> {
  using SeedShardingBase::SeedShardingBase;
  void runOnOperation() override;

  /// Splits dimension `dim` of argument `arg` over `axis` unless the
  /// argument already has a layout.
  void seed(func::FuncOp f, BlockArgument arg, int64_t dim,
            ArrayRef<StringRef> axis, StringRef origin,
            ArrayRef<int64_t> segments = {}, ArrayRef<StringRef> seqAxis = {}) {
    unsigned i = arg.getArgNumber();
    if (hasLayout(arg))
      return;
    auto type = cast<RankedTensorType>(arg.getType());
    int64_t n = 1;
    for (StringRef a : axis)
      n *= mesh.getAxisSize(a);
    bool divides =
        segments.empty()
            ? type.getDimSize(dim) % n == 0
            : llvm::all_of(segments, [&](int64_t s) { return s % n == 0; });
    if (!divides)
      return; // the frontend reported it where the layer is written
    Builder b(f.getContext());
    SmallVector<Attribute> dims(type.getRank(), b.getArrayAttr({}));
    dims[dim] = b.getStrArrayAttr(axis);
    if (!seqAxis.empty() && type.getRank() >= 2 &&
        type.getDimSize(1) % mesh.getAxisSize(seqAxis[0]) == 0)
      dims[1] = b.getStrArrayAttr(seqAxis);
    SmallVector<Attribute> seg;
    if (!segments.empty()) {
      seg.assign(type.getRank(), b.getDenseI64ArrayAttr({}));
      seg[dim] = b.getDenseI64ArrayAttr(segments);
    }
    batch->set(i, kShardingAttr,
               ShardingAttr::get(f.getContext(),
                                 FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
                                 b.getArrayAttr(dims), b.getArrayAttr({}),
                                 b.getArrayAttr(seg)));
    batch->set(i, kShardingOriginAttr, b.getStringAttr(origin));
    seeded.insert(i);
  }

  /// Whether `arg` has a layout, given or seeded (the seeds are written to
  /// the function once, at the end).
  bool hasLayout(BlockArgument arg) {
    return getSharding(arg) || seeded.contains(arg.getArgNumber());
  }
  std::optional<ArgAttrBatch> batch;
  DenseSet<unsigned> seeded;

  /// The parameter argument a matmul multiplies by (its rhs), if any.
  static BlockArgument weightOf(MatmulOp mm) {
    auto arg = dyn_cast<BlockArgument>(mm.getRhs());
    if (!arg)
      return {};
    auto f = cast<func::FuncOp>(arg.getOwner()->getParentOp());
    auto kind = f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kKindAttr);
    return kind && kind.getValue() == "param" ? arg : BlockArgument();
  }

  /// The matmul that produces `v`, looking through a bias.
  static MatmulOp producer(Value v) {
    if (auto rope = v.getDefiningOp<RopeOp>()) // attention's rotated qkv
      v = rope.getQkv();
    if (auto ba = v.getDefiningOp<BiasAddOp>())
      v = ba.getInput();
    return v.getDefiningOp<MatmulOp>();
  }

  /// Column-parallel: the output features of `mm` over tp.
  void column(func::FuncOp f, MatmulOp mm, ArrayRef<int64_t> segments = {}) {
    if (!mm)
      return;
    if (BlockArgument w = weightOf(mm))
      if (cast<RankedTensorType>(w.getType()).getRank() == 2)
        seed(f, w, mm.getTransposeRhs() ? 0 : 1, {"tp"}, "policy", segments);
  }

  /// Sequence parallelism: what enters a norm is split along the sequence
  /// over tp. Propagation carries the split through the residual stream;
  /// at the column-parallel weights (which keep tp) the sequence is
  /// gathered, and the row-parallel sums are reduce-scattered back.
  LogicalResult seedSequence(func::FuncOp f) {
    LogicalResult result = success();
    int64_t tp = mesh.getAxisSize("tp");
    // With context parallelism, each cp rank's part of the sequence is
    // split further over tp.
    bool cp = mesh.getAxisIndex(OpShardingRule::kContextAxis) >= 0;
    int64_t cpSize = cp ? mesh.getAxisSize(OpShardingRule::kContextAxis) : 1;
    f.walk([&](Operation *op) {
      if (!isa<LayerNormOp, RmsNormOp>(op))
        return;
      Value x = op->getOperand(0);
      auto type = cast<RankedTensorType>(x.getType());
      if (type.getRank() != 3)
        return;
      if (type.getDimSize(1) % (tp * cpSize) != 0) {
        InFlightDiagnostic d = op->emitError();
        d << "sequence parallelism splits the sequence (" << type.getDimSize(1)
          << " positions) over tp = " << tp;
        if (cp)
          d << " within each of the cp = " << cpSize << " parts";
        d << ", which does not divide it; choose a sequence length that "
          << tp * cpSize << " divides";
        result = failure();
        return;
      }
      OpBuilder b(op);
      SmallVector<Attribute> dims(3, b.getArrayAttr({}));
      SmallVector<StringRef> batch = batchAxes();
      dims[0] = b.getStrArrayAttr(batch);
      dims[1] = cp ? b.getStrArrayAttr({OpShardingRule::kContextAxis, "tp"})
                   : b.getStrArrayAttr({"tp"});
      auto sharding = ShardingAttr::get(
          f.getContext(), FlatSymbolRefAttr::get(mesh.getSymNameAttr()),
          b.getArrayAttr(dims), b.getArrayAttr({}));
      auto c = ShardingConstraintOp::create(b, op->getLoc(), type, x, sharding);
      c->setAttr(kShardingOriginAttr, b.getStringAttr("policy"));
      // Part of the norm's layer (pipeline stages follow layers).
      if (Attribute layer = op->getAttr(kLayerAttr))
        c->setAttr(kLayerAttr, layer);
      op->setOperand(0, c.getResult());
    });
    return result;
  }

  /// Samples over the data-parallel axis (kept even when dp = 1, so that
  /// every plan's inputs are declared alike), then over microbatches, then
  /// over the expert-parallel ranks (data-parallel for all but the
  /// experts). ep is the minor split so that the experts' gather over it
  /// takes each microbatch's rows from the ep group's ranks: gathering a
  /// split that is not the last would move rows between microbatches.
  SmallVector<StringRef> batchAxes() {
    SmallVector<StringRef> axes;
    if (mesh.getAxisIndex("dp") >= 0)
      axes.push_back("dp");
    if (mesh.isSequential("mb"))
      axes.push_back("mb");
    if (mesh.getAxisIndex(kExpertAxis) >= 0)
      axes.push_back(kExpertAxis);
    return axes;
  }

  /// Expert parallelism: each mixture-of-experts weight [E, ...] split by
  /// experts over ep. Where the tokens meet them, the experts' claim wins
  /// (a parameter's), so the tokens are gathered over ep for the experts
  /// and their outputs, pending sums over ep, are reduce-scattered back.
  void seedExperts(func::FuncOp f) {
    if (mesh.getAxisIndex(kExpertAxis) < 0)
      return;
    f.walk([&](MoeExpertsOp m) {
      for (Value w : {m.getUp(), m.getDown(), m.getGate()})
        if (auto arg = dyn_cast_or_null<BlockArgument>(w))
          seed(f, arg, 0, {kExpertAxis}, "policy");
    });
  }

  MeshOp mesh;
};
} // namespace

void SeedShardingPass::runOnOperation() {
  ModuleOp module = getOperation();
  mesh = getMesh(module);
  if (!mesh) {
    module.emitError() << "expected a plan.mesh op";
    return signalPassFailure();
  }
  ParallelOp par;
  for (auto p : module.getOps<ParallelOp>())
    par = p;
  // The options, when given, replace the plan's settings (so that a planner
  // or a test can try strategies on the same IR).
  std::string policy = !tensorPolicy.empty() ? std::string(tensorPolicy)
                       : par                 ? par.getTensorPolicy().str()
                                             : "none";
  if (policy != "none" && policy != "megatron") {
    module.emitError() << "unknown tensor-policy '" << policy
                       << "'; expected none or megatron";
    return signalPassFailure();
  }
  bool sequence = sequenceParallel.empty()
                      ? par && par.getSequenceParallel()
                      : StringRef(sequenceParallel) == "true";
  bool megatron = policy == "megatron" && mesh.getAxisSize("tp") > 1;
  // Microbatches are a sequential mesh axis "mb": each rank's samples are
  // split over it like over dp, and processed one block after the other
  // (the pipeline schedules its own microbatches).
  int64_t microbatches = microbatchCount > 0 ? (int64_t)microbatchCount
                         : par               ? par.getMicrobatches()
                                             : 1;
  // A pipeline always has the axis (even with one microbatch): its stages
  // run microbatch by microbatch, and gradients accumulate over it.
  bool pipelined = mesh.getAxisIndex("pp") >= 0 && mesh.getAxisSize("pp") > 1;
  if ((microbatches > 1 || pipelined) && mesh.getAxisIndex("mb") < 0) {
    OpBuilder b(mesh);
    SmallVector<Attribute> axes(mesh.getAxes().begin(), mesh.getAxes().end());
    axes.push_back(b.getStringAttr("mb"));
    SmallVector<int64_t> shape(mesh.getShape());
    shape.push_back(microbatches);
    auto seq = MeshOp::create(
        b, mesh.getLoc(), mesh.getSymName(), b.getArrayAttr(axes),
        b.getDenseI64ArrayAttr(shape), b.getStrArrayAttr({"mb"}));
    mesh.erase();
    mesh = seq;
  }
  for (auto f : module.getOps<func::FuncOp>()) {
    if (!f->hasAttr(kModelAttr))
      continue;
    batch.emplace(f);
    seeded.clear();
    llvm::scope_exit commit([&] { batch->commit(); });
    SmallVector<StringRef> batchAxes = this->batchAxes();
    // Context parallelism: sequences (dimension 1) over cp.
    SmallVector<StringRef> seqAxis;
    if (mesh.getAxisIndex(OpShardingRule::kContextAxis) >= 0)
      seqAxis.push_back(OpShardingRule::kContextAxis);
    if (!batchAxes.empty())
      for (BlockArgument arg : f.getArguments()) {
        auto kind =
            f.getArgAttrOfType<StringAttr>(arg.getArgNumber(), kKindAttr);
        if (kind && (kind.getValue() == "input" || kind.getValue() == "label"))
          seed(f, arg, 0, batchAxes, "data", {}, seqAxis);
      }
    seedExperts(f);
    if (!megatron)
      continue;
    if (sequence && failed(seedSequence(f)))
      return signalPassFailure();
    f.walk([&](Operation *op) {
      if (auto at = dyn_cast<AttentionOp>(op)) {
        int64_t dh = at.getHeadDim(), h = at.getNumHeads(),
                kv = at.getNumKvHeads();
        column(f, producer(at.getQkv()), {h * dh, kv * dh, kv * dh});
      } else if (isa<GeluOp, ReluOp, SiluOp>(op)) {
        // The first linear of an MLP feeds its activation.
        column(f, producer(op->getOperand(0)));
      } else if (auto ce = dyn_cast<CrossEntropyOp>(op)) {
        // An untied LM head: vocab-parallel output columns, when tp divides
        // them (the frontend checks the layers' sizes, not the head's).
        MatmulOp head = producer(ce.getLogits());
        BlockArgument w = head ? weightOf(head) : BlockArgument();
        int64_t classes =
            cast<RankedTensorType>(ce.getLogits().getType()).getShape().back();
        if (w && f->hasAttr(kModelAttr) && !hasLayout(w) &&
            classes % mesh.getAxisSize("tp") != 0)
          mlir::emitRemark(head.getLoc())
              << "the LM head's " << classes
              << " output columns are not divisible by tp = "
              << mesh.getAxisSize("tp")
              << ": it stays whole on every rank (not vocab-parallel); "
                 "make the vocabulary a multiple of tp to split it";
        column(f, head);
      } else if (auto e = dyn_cast<EmbeddingOp>(op)) {
        if (auto table = dyn_cast<BlockArgument>(e.getTable()))
          seed(f, table, 0, {"tp"}, "policy");
      }
    });
  }
}
