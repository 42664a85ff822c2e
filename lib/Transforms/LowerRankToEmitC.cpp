//===- LowerRankToEmitC.cpp - Rank level to EmitC calls into planrt -------===//
#include "planc/Transforms/Passes.h"

#include <cstring>

namespace planc {
#define GEN_PASS_DEF_LOWERRANKTOEMITC
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;
namespace ec = mlir::emitc;

namespace {
struct LowerRankToEmitCPass
    : public planc::impl::LowerRankToEmitCBase<LowerRankToEmitCPass> {
  void runOnOperation() override;
};

/// Builds `planrt::` calls with the context as first argument.
class CallBuilder {
public:
  CallBuilder(OpBuilder &b, Value ctx) : b(b), ctx(ctx) {}

  /// Emits `callee(ctx, operands..., attrs...)`; returns its result if
  /// `resultType` is set.
  Value call(Location loc, StringRef callee, ValueRange operands,
             ArrayRef<Attribute> attrs, Type resultType = {}) {
    SmallVector<Value> args{ctx};
    args.append(operands.begin(), operands.end());
    SmallVector<Attribute> argAttrs;
    for (unsigned i = 0; i < args.size(); ++i)
      argAttrs.push_back(index(i));
    argAttrs.append(attrs.begin(), attrs.end());
    TypeRange results = resultType ? TypeRange(resultType) : TypeRange();
    auto op =
        ec::CallOpaqueOp::create(b, loc, results, name(callee),
                                 b.getArrayAttr(argAttrs), ArrayAttr(), args);
    return resultType ? op.getResult(0) : Value();
  }

  /// Emits `callee(ctx, args...)` where an IndexAttr i in `args` stands for
  /// operands[i] and any other attribute is passed as is.
  Value callMixed(Location loc, StringRef callee, ValueRange operands,
                  ArrayRef<Attribute> args, Type resultType = {}) {
    SmallVector<Value> values{ctx};
    values.append(operands.begin(), operands.end());
    SmallVector<Attribute> argAttrs{index(0)};
    for (Attribute a : args)
      if (auto i = dyn_cast<IntegerAttr>(a); i && i.getType().isIndex())
        argAttrs.push_back(index(i.getInt() + 1));
      else
        argAttrs.push_back(a);
    TypeRange results = resultType ? TypeRange(resultType) : TypeRange();
    auto op =
        ec::CallOpaqueOp::create(b, loc, results, name(callee),
                                 b.getArrayAttr(argAttrs), ArrayAttr(), values);
    return resultType ? op.getResult(0) : Value();
  }
  Attribute operand(int64_t i) { return index(i); }
  /// Index attributes, made once (a large step makes millions of calls).
  Attribute index(unsigned i) {
    while (indices.size() <= i)
      indices.push_back(b.getIndexAttr(indices.size()));
    return indices[i];
  }

  Attribute str(StringRef s) {
    return ec::OpaqueAttr::get(b.getContext(), quoted(s));
  }
  /// `s` as a C++ string literal.
  static std::string quoted(StringRef s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\')
        out += '\\';
      out += c;
    }
    return out + "\"";
  }
  /// A finite f32 as the C++ emitter spells it (the same digits).
  static std::string f32Text(float f) {
    SmallString<32> text;
    APFloat(f).toString(text, 0, 0, false);
    text += 'f';
    return std::string(text);
  }
  /// Numbers are passed as their C++ literal (an opaque attribute, made
  /// once per value): a large step passes millions of shapes, offsets and
  /// hyperparameters, the context's uniquer is slower than a map, and the
  /// C++ emitter would convert an integer or float attribute to decimal
  /// at every use.
  Attribute i64(int64_t v) {
    auto [it, fresh] = i64s.try_emplace(v);
    if (fresh)
      it->second = ec::OpaqueAttr::get(b.getContext(), std::to_string(v));
    return it->second;
  }
  /// As the C++ emitter prints an f32 attribute (the same digits); NaN and
  /// infinities stay attributes, which it spells as C macros.
  Attribute f32(double v) {
    float f = float(v);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    auto [it, fresh] = f32s.try_emplace(bits);
    if (fresh) {
      if (std::isfinite(f)) {
        it->second = ec::OpaqueAttr::get(b.getContext(), f32Text(f));
      } else {
        it->second = b.getF32FloatAttr(f);
      }
    }
    return it->second;
  }
  /// An attribute of a rank op as a call argument: i64 and f32 numbers
  /// through the caches above, anything else as it is.
  Attribute literal(Attribute a) {
    if (auto i = dyn_cast<IntegerAttr>(a); i && i.getType().isInteger(64))
      return i64(i.getInt());
    if (auto f = dyn_cast<FloatAttr>(a); f && f.getType().isF32())
      return f32(f.getValueAsDouble());
    return a;
  }
  /// A callee's name, interned once.
  StringAttr name(StringRef callee) {
    StringAttr &n = names[callee];
    if (!n)
      n = b.getStringAttr(callee);
    return n;
  }

  /// `ndim, d0, d1, d2, d3` of a buffer type (trailing dims padded with 1).
  SmallVector<Attribute> shape(MemRefType t) {
    SmallVector<Attribute> out{i64(t.getRank())};
    for (int64_t d = 0; d < 4; ++d)
      out.push_back(i64(d < t.getRank() ? t.getDimSize(d) : 1));
    return out;
  }
  /// shape(t) and, for a 16-bit or i32 buffer, its planrt::DType (the
  /// allocating calls default to F32).
  SmallVector<Attribute> allocShape(MemRefType t) {
    SmallVector<Attribute> out = shape(t);
    Type e = t.getElementType();
    if (e.isInteger(32)) // a mixture of experts' choices
      out.push_back(i64(1));
    else if (e.isBF16())
      out.push_back(i64(2));
    else if (e.isF16())
      out.push_back(i64(3));
    return out;
  }

private:
  /// DenseMapInfo<int64_t> hashes v * 37, whose low bits repeat for
  /// offsets and shapes that are multiples of a power of two (a map keyed
  /// by it was slower than the uniquer): mix all bits.
  struct MixedI64 : DenseMapInfo<int64_t> {
    static unsigned getHashValue(int64_t v) {
      uint64_t x = uint64_t(v) * 0x9e3779b97f4a7c15ull;
      return unsigned(x >> 32) ^ unsigned(x);
    }
  };
  OpBuilder &b;
  Value ctx;
  SmallVector<Attribute> indices;
  DenseMap<int64_t, Attribute, MixedI64> i64s;
  DenseMap<uint32_t, Attribute> f32s;
  llvm::StringMap<StringAttr> names;
};
} // namespace

static const char *initKindCode(StringRef kind) {
  // Values of planrt::InitKind.
  if (kind == "ones")
    return "1";
  if (kind == "normal")
    return "2";
  if (kind == "uniform")
    return "3";
  return "0";
}

/// The functions plan-memory plans, by the index planrt knows them by.
static constexpr StringLiteral kPlanned[] = {"plan_step", "plan_forward"};

void LowerRankToEmitCPass::runOnOperation() {
  ModuleOp module = getOperation();
  MLIRContext *ctx = &getContext();
  plan::MeshOp mesh = plan::getMesh(module);
  auto trains = module.getOps<plan::TrainOp>();
  func::FuncOp step = module.lookupSymbol<func::FuncOp>("plan_step");
  if (!mesh || trains.empty() || !step) {
    module.emitError() << "expected plan.mesh, plan.train and @plan_step; run "
                          "plan-lower-to-rank first";
    return signalPassFailure();
  }
  plan::TrainOp train = *trains.begin();
  // Set by a setting the runtime cannot take (reported where it is found).
  bool refused = false;
  auto name = module.getSymName();
  std::string programName = name ? name->str() : "plan";

  Type ctxType =
      ec::PointerType::get(ec::OpaqueType::get(ctx, "planrt::Context"));
  Type tensorType =
      ec::PointerType::get(ec::OpaqueType::get(ctx, "planrt::Tensor"));
  OpBuilder b(ctx);
  b.setInsertionPointToStart(module.getBody());
  ec::IncludeOp::create(b, module.getLoc(), "planrt/planrt.h", false);
  auto staticFunc = [&](StringRef fname, Location loc) {
    auto f =
        ec::FuncOp::create(b, loc, fname, b.getFunctionType({ctxType}, {}));
    f.setSpecifiersAttr(b.getStrArrayAttr({"static"}));
    Block *entry = f.addEntryBlock();
    return std::make_pair(f, entry);
  };

  // plan_setup: the program description.
  auto [setup, setupBody] = staticFunc("plan_setup", module.getLoc());
  {
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(setupBody);
    CallBuilder c(b, setup.getArgument(0));
    // Sequential axes (microbatches) are loops, not ranks.
    for (auto [axis, size] : llvm::zip(mesh.getAxes(), mesh.getShape()))
      if (!mesh.isSequential(cast<StringAttr>(axis).getValue()))
        c.call(mesh.getLoc(), "planrt::declare_mesh_axis", {},
               {c.str(cast<StringAttr>(axis).getValue()), c.i64(size)});
    // A pipeline: its axis and stages, each rank's order of units, and
    // where parameters and state live.
    rk::PipelineOp pipe;
    step.walk([&](rk::PipelineOp p) { pipe = p; });
    if (pipe) {
      c.call(
          pipe.getLoc(), "planrt::declare_pipeline", {},
          {c.i64(mesh.getAxisIndex(pipe.getAxis())), c.i64(pipe.getStages())});
      // The order as one static table of (rank, unit, microbatch): a call
      // per entry would be tens of thousands of statements in a large plan.
      SmallVector<int64_t> table;
      for (auto t : pipe.getBody().front().getOps<rk::TimelineOp>())
        for (auto e : t.getBody().front().getOps<rk::ExecOp>())
          table.append(
              {int64_t(t.getRank()), int64_t(e.getUnit()), int64_t(e.getMb())});
      if (!table.empty()) {
        auto arrayType =
            ec::ArrayType::get({int64_t(table.size())}, b.getI64Type());
        auto tensorOf =
            RankedTensorType::get({int64_t(table.size())}, b.getI64Type());
        OpBuilder gb(setup);
        auto global = ec::GlobalOp::create(
            gb, pipe.getLoc(), "plan_schedule", arrayType,
            DenseIntElementsAttr::get(tensorOf, ArrayRef<int64_t>(table)),
            /*extern_specifier=*/false, /*static_specifier=*/true,
            /*const_specifier=*/true);
        Value ref = ec::GetGlobalOp::create(b, pipe.getLoc(), arrayType,
                                            global.getSymName());
        c.call(pipe.getLoc(), "planrt::schedule_table", {ref},
               {c.i64(int64_t(table.size()) / 3)});
      }
    }
    auto stageAttr = [](Operation *op) -> std::optional<int64_t> {
      if (auto s = op->getAttrOfType<IntegerAttr>(rk::kRankStageAttr))
        return s.getInt();
      return std::nullopt;
    };
    // Parameters and state are declared from static tables, a row each
    // (planrt::declare_params/declare_states); what only some have (a
    // split, a stage, ...) follows as calls by index.
    auto declareTable = [&](StringRef global, StringRef rowType,
                            StringRef callee, ArrayRef<std::string> rows,
                            Location loc) {
      if (rows.empty())
        return;
      std::string init = "{\n";
      for (const std::string &row : rows)
        init += "  {" + row + "},\n";
      init += "}";
      auto arrayType = ec::ArrayType::get({int64_t(rows.size())},
                                          ec::OpaqueType::get(ctx, rowType));
      OpBuilder gb(setup);
      auto g = ec::GlobalOp::create(gb, loc, global, arrayType,
                                    ec::OpaqueAttr::get(ctx, init),
                                    /*extern_specifier=*/false,
                                    /*static_specifier=*/true,
                                    /*const_specifier=*/true);
      Value ref = ec::GetGlobalOp::create(b, loc, arrayType, g.getSymName());
      c.call(loc, callee, {ref}, {c.i64(int64_t(rows.size()))});
    };
    // CallBuilder's shape arguments (C++ literals), as a row's text.
    auto shapeText = [&](MemRefType t) {
      std::string out;
      for (Attribute a : c.shape(t))
        out += (out.empty() ? "" : ", ") +
               cast<ec::OpaqueAttr>(a).getValue().str();
      return out;
    };
    {
      SmallVector<std::string> rows;
      for (auto p : module.getOps<rk::ParamDeclOp>()) {
        plan::InitAttr init = p.getInit();
        rows.push_back(
            CallBuilder::quoted(p.getSymName()) + ", " +
            shapeText(p.getType()) + ", " + initKindCode(init.getKind()) +
            ", " + CallBuilder::f32Text(float(init.getA().convertToDouble())) +
            ", " + CallBuilder::f32Text(float(init.getB().convertToDouble())));
      }
      declareTable("plan_params", "planrt::ParamDecl", "planrt::declare_params",
                   rows, module.getLoc());
      rows.clear();
      for (auto st : module.getOps<rk::StateDeclOp>())
        rows.push_back(CallBuilder::quoted(st.getSymName()) + ", " +
                       shapeText(st.getType()));
      declareTable("plan_states", "planrt::StateDecl", "planrt::declare_states",
                   rows, module.getLoc());
    }
    int64_t declared = 0;
    for (auto p : module.getOps<rk::ParamDeclOp>()) {
      // A sharded parameter: which axes split each dimension (outer
      // first), and the segments a dimension is split by one at a time.
      if (auto s = p.getShardingAttr()) {
        int64_t index = declared;
        for (int64_t d = 0; d < s.getRank(); ++d) {
          for (StringRef axis : s.getDimAxes(d))
            c.call(p.getLoc(), "planrt::shard_param", {},
                   {c.i64(index), c.i64(d), c.i64(mesh.getAxisIndex(axis))});
          ArrayRef<int64_t> seg = s.getDimSegments(d);
          if (seg.empty())
            continue;
          if (seg.size() > 3) {
            p.emitError() << "planrt takes at most 3 segments per dimension";
            refused = true;
          }
          SmallVector<Attribute> args{c.i64(index), c.i64(d)};
          for (int i = 0; i < 3; ++i)
            args.push_back(c.i64(i < (int)seg.size() ? seg[i] : 0));
          c.call(p.getLoc(), "planrt::set_param_segments", {}, args);
        }
      }
      if (auto rows = p.getExportRowsAttr())
        c.call(p.getLoc(), "planrt::set_param_export_rows", {},
               {c.i64(declared), c.i64(rows.getInt())});
      if (auto copy = p.getCopyAttr()) {
        StringRef dtype =
            copy.getValue().isBF16() ? "planrt::BF16" : "planrt::F16";
        c.call(p.getLoc(), "planrt::set_param_copy", {},
               {c.i64(declared), ec::OpaqueAttr::get(ctx, dtype)});
      }
      if (auto st = stageAttr(p))
        c.call(p.getLoc(), "planrt::set_param_stage", {},
               {c.i64(declared), c.i64(*st)});
      ++declared;
    }
    // State: optimizer moments (zero at the start) and model buffers, this
    // rank's shard.
    int64_t states = 0;
    for (auto st : module.getOps<rk::StateDeclOp>()) {
      // Model state (batch norm's running statistics): its initializer,
      // and it is exported with the parameters.
      if (st.getBuffer()) {
        plan::InitAttr init = st.getInitAttr();
        if (!init)
          init = plan::InitAttr::get(ctx, "zeros", 0, 0);
        c.call(st.getLoc(), "planrt::set_state_buffer", {},
               {c.i64(states),
                ec::OpaqueAttr::get(ctx, initKindCode(init.getKind())),
                c.f32(init.getA().convertToDouble()),
                c.f32(init.getB().convertToDouble())});
      }
      // Where this rank's shard sits in the global tensor (checkpoints
      // write and read state by global slices, across plans).
      if (auto s = st.getShardingAttr())
        for (int64_t d = 0; d < s.getRank(); ++d) {
          for (StringRef axis : s.getDimAxes(d))
            c.call(st.getLoc(), "planrt::shard_state", {},
                   {c.i64(states), c.i64(d), c.i64(mesh.getAxisIndex(axis))});
          ArrayRef<int64_t> seg = s.getDimSegments(d);
          if (seg.empty())
            continue;
          if (seg.size() > 3) {
            st.emitError() << "planrt takes at most 3 segments per dimension";
            refused = true;
          }
          SmallVector<Attribute> args{c.i64(states), c.i64(d)};
          for (int i = 0; i < 3; ++i)
            args.push_back(c.i64(i < (int)seg.size() ? seg[i] : 0));
          c.call(st.getLoc(), "planrt::set_state_segments", {}, args);
        }
      if (auto stage = stageAttr(st))
        c.call(st.getLoc(), "planrt::set_state_stage", {},
               {c.i64(states), c.i64(*stage)});
      ++states;
    }
    for (auto [index, in] : llvm::enumerate(module.getOps<rk::InputDeclOp>())) {
      SmallVector<Attribute> a{c.str(in.getSymName()),
                               c.i64(in.getRole() == "label" ? 1 : 0)};
      append_range(a, c.shape(in.getType()));
      auto axis = in.getBatchAxis();
      a.push_back(c.i64(axis ? mesh.getAxisIndex(*axis) : -1));
      c.call(in.getLoc(), "planrt::declare_input", {}, a);
      // Token ids are int32 (planrt::I32).
      if (in.getType().getElementType().isInteger(32))
        c.call(in.getLoc(), "planrt::set_input_dtype", {},
               {c.i64(index), c.i64(1)});
      if (auto inner = in.getBatchInnerAxis())
        c.call(in.getLoc(), "planrt::set_input_inner_axis", {},
               {c.i64(index), c.i64(mesh.getAxisIndex(*inner)),
                c.i64(in.getBatchRuns().value_or(1))});
      if (auto seq = in.getSeqAxis())
        c.call(in.getLoc(), "planrt::set_input_seq_axis", {},
               {c.i64(index), c.i64(mesh.getAxisIndex(*seq))});
    }
    // Data sources: 0 = synthetic regression, 1 = token shards, 2 =
    // synthetic classification (class-id labels without an embedding: the
    // classes are the classifier's width), 3 = CIFAR-10 files.
    bool shards = train.getData() == "shards";
    bool cifar = train.getData() == "cifar10";
    int64_t classes = rk::classifierClasses(module, step);
    if (cifar && !classes) {
      train.emitError() << "data = cifar10(...) trains a classifier: the loss "
                           "must be cross_entropy over class logits with "
                           "i32 labels [batch]";
      return signalPassFailure();
    }
    // Synthetic data is f32 features (and targets or class ids), so a
    // program reading token ids from it refuses to start. A warning, not an
    // error: such plans are compiled for --report and --emit alone.
    if (!shards && !cifar)
      for (auto in : module.getOps<rk::InputDeclOp>())
        if (in.getRole() != "label" &&
            in.getType().getElementType().isInteger(32)) {
          train.emitWarning()
              << "data = synthetic makes f32 inputs, but input '"
              << in.getSymName()
              << "' is i32 token ids: the program will refuse to train; "
                 "train on token shards made by plan-tokenize: data = "
                 "shards(\"data/train_*.bin\")";
          break;
        }
    c.call(train.getLoc(), "planrt::set_training", {},
           {c.i64(train.getSteps()), c.i64(train.getSeed()),
            c.i64(train.getGlobalBatch()),
            c.i64(shards    ? 1
                  : cifar   ? 3
                  : classes ? 2
                            : 0)});
    if (train.getLossScale() == "dynamic")
      c.call(train.getLoc(), "planrt::set_dynamic_loss_scale", {}, {});
    if (classes)
      c.call(train.getLoc(), "planrt::set_classes", {}, {c.i64(classes)});
    if (shards || cifar)
      c.call(train.getLoc(), "planrt::set_data_path", {},
             {c.str(train.getDataPath().value_or(""))});
    // Checkpoints: the directory (relative to the current directory) and
    // the interval (0: only when SIGTERM or SIGUSR1 stops the run).
    if (auto dir = train.getCheckpointDir())
      c.call(train.getLoc(), "planrt::set_checkpoint", {},
             {c.str(*dir), c.i64(train.getCheckpointEvery())});
    if (train.getLrSchedule() == "cosine")
      c.call(
          train.getLoc(), "planrt::set_lr_schedule", {},
          {c.i64(1), c.i64(train.getWarmupSteps()),
           c.f32(train.getMinLr() ? train.getMinLr()->convertToDouble() : 0.0),
           c.i64(train.getDecaySteps().value_or(0))});
    // The token vocabulary (rows of the embedding table, padding
    // excluded): the runtime checks every batch and --prompt against it.
    int64_t vocab = 0, valid = 0;
    step.walk([&](Operation *op) {
      if (auto emb = dyn_cast<rk::EmbeddingOp>(op); emb && !vocab) {
        vocab = cast<MemRefType>(emb.getTable().getType()).getDimSize(0);
        if (!emb.getVocabAxis().empty())
          vocab *= mesh.getShape()[mesh.getAxisIndex(emb.getVocabAxis())];
      }
      auto classes = op->getAttrOfType<IntegerAttr>("valid_classes");
      if (isa<rk::CrossEntropyOp, rk::CrossEntropyInPlaceOp,
              rk::CeLocalStatsOp>(op) &&
          classes && classes.getInt() > 0)
        valid = classes.getInt();
    });
    if (vocab > 0)
      c.call(step.getLoc(), "planrt::set_token_vocab", {},
             {c.i64(valid > 0 ? std::min(vocab, valid) : vocab)});
    // What the runtime's MFU needs: the step's FLOPs per rank and the
    // cluster's GPU (its peak is the runtime's table, docs/runtime.md).
    if (auto flops = step->getAttrOfType<FloatAttr>(rk::kStepFlopsAttr)) {
      char text[64];
      std::snprintf(text, sizeof(text), "%.9e",
                    flops.getValue().convertToDouble());
      c.call(step.getLoc(), "planrt::set_step_flops", {},
             {ec::OpaqueAttr::get(ctx, text)});
    }
    for (auto cluster : module.getOps<plan::ClusterOp>())
      c.call(cluster.getLoc(), "planrt::set_cluster_gpu", {},
             {c.str(cluster.getGpu())});
    // Which of the GPU's peaks is the MFU's (fp32 is the default).
    for (auto train : module.getOps<plan::TrainOp>())
      if (train.getPrecision() != "fp32")
        c.call(train.getLoc(), "planrt::set_compute_precision", {},
               {c.str(train.getPrecision())});
    // The memory plan: the arena each function needs per pipeline
    // coordinate (plan-memory).
    for (auto [index, fnName] : llvm::enumerate(kPlanned)) {
      auto fn = module.lookupSymbol<func::FuncOp>(fnName);
      auto arena =
          fn ? fn->getAttrOfType<DenseI64ArrayAttr>(rk::kArenaBytesAttr)
             : DenseI64ArrayAttr();
      auto buffers =
          fn ? fn->getAttrOfType<DenseI64ArrayAttr>(rk::kBufferBytesAttr)
             : DenseI64ArrayAttr();
      if (!arena || !buffers || buffers.size() != arena.size())
        continue;
      for (int64_t k = 0; k < arena.size(); ++k)
        c.call(fn.getLoc(), "planrt::plan_arena", {},
               {c.i64(index), c.i64(k), c.i64(arena[k]), c.i64(buffers[k])});
    }
    // The stash pool: the most either function needs per coordinate.
    {
      SmallVector<int64_t> stash;
      for (StringRef fnName : kPlanned)
        if (auto fn = module.lookupSymbol<func::FuncOp>(fnName))
          if (auto st =
                  fn->getAttrOfType<DenseI64ArrayAttr>(rk::kStashBytesAttr)) {
            stash.resize(std::max<size_t>(stash.size(), st.size()), 0);
            for (int64_t k = 0; k < st.size(); ++k)
              stash[k] = std::max(stash[k], st[k]);
          }
      for (auto [k, bytes] : llvm::enumerate(stash))
        c.call(step.getLoc(), "planrt::plan_stash", {},
               {c.i64(k), c.i64(bytes)});
    }
    if (auto bytes =
            step->getAttrOfType<DenseI64ArrayAttr>(rk::kExpectedBytesAttr);
        bytes && bytes.size() == 3 && !pipe)
      c.call(step.getLoc(), "planrt::expect_bytes", {},
             {c.i64(bytes[0]), c.i64(bytes[1]), c.i64(bytes[2])});
    else if (bytes && pipe)
      for (int64_t k = 0; k + 2 < bytes.size(); k += 3)
        c.call(step.getLoc(), "planrt::expect_pipeline_bytes", {},
               {c.i64(k / 3), c.i64(bytes[k]), c.i64(bytes[k + 1]),
                c.i64(bytes[k + 2])});
    ec::ReturnOp::create(b, module.getLoc(), Value());
  }
  if (refused)
    return signalPassFailure();

  // Indices of declarations, in declaration order.
  llvm::StringMap<int64_t> paramIdx, inputIdx, stateIdx;
  for (auto p : module.getOps<rk::ParamDeclOp>())
    paramIdx[p.getSymName()] = paramIdx.size();
  for (auto st : module.getOps<rk::StateDeclOp>())
    stateIdx[st.getSymName()] = stateIdx.size();
  for (auto in : module.getOps<rk::InputDeclOp>())
    inputIdx[in.getSymName()] = inputIdx.size();

  // plan_step and plan_forward: one call per rank op.
  auto translate = [&](func::FuncOp src, StringRef name) -> ec::FuncOp {
    auto [emitFn, fnBody] = staticFunc(name, src.getLoc());
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(fnBody);
    CallBuilder c(b, emitFn.getArgument(0));
    DenseMap<Value, Value> vals;
    auto operands = [&](Operation *op) {
      SmallVector<Value> out;
      for (Value v : op->getOperands())
        out.push_back(vals.lookup(v));
      return out;
    };
    // One call per op; a microbatch loop becomes a C++ for loop whose body
    // runs in the scratch memory of one iteration.
    Type i64 = b.getI64Type();
    auto constant = [&](Location loc, int64_t v) {
      return ec::ConstantOp::create(b, loc, i64, b.getI64IntegerAttr(v))
          .getResult();
    };
    // `if (cond) { }`: the terminator to insert the body before.
    auto thenOf = [&](Location loc, Value cond) -> Operation * {
      auto ifOp = ec::IfOp::create(b, loc, cond, /*addThenBlock=*/true,
                                   /*addElseBlock=*/false);
      OpBuilder::InsertionGuard g(b);
      b.setInsertionPointToEnd(&ifOp.getThenRegion().front());
      return ec::YieldOp::create(b, loc);
    };
    // A planned function runs in the memory plan's arena.
    bool planned = src->hasAttr(rk::kArenaBytesAttr);
    if (planned)
      c.call(src.getLoc(), "planrt::arena_begin", {},
             {c.i64(name == "plan_step" ? 0 : 1)});
    // The microbatch of the unit being emitted.
    Value unitMb;
    std::function<LogicalResult(Block &)> emitBlock;
    std::function<LogicalResult(Operation &)> emitOp;
    emitBlock = [&](Block &block) {
      for (Operation &op : block) {
        // Outside the pipeline's units, an op of one stage runs only on the
        // ranks that hold the stage (values it makes are null elsewhere).
        auto stage = op.getAttrOfType<IntegerAttr>(rk::kRankStageAttr);
        if (stage && op.getNumResults() == 0) {
          Value own = c.call(op.getLoc(), "planrt::owns_stage", {},
                             {c.i64(stage.getInt())}, i64);
          Value zero = constant(op.getLoc(), 0);
          Value cond = ec::CmpOp::create(b, op.getLoc(), b.getI1Type(),
                                         ec::CmpPredicate::ne, own, zero);
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPoint(thenOf(op.getLoc(), cond));
          if (failed(emitOp(op)))
            return failure();
          continue;
        }
        if (failed(emitOp(op)))
          return failure();
      }
      return success();
    };
    // One unit for microbatch `mb`, between unit_begin and unit_end.
    auto emitUnit = [&](rk::UnitOp unit, Value mb) -> LogicalResult {
      StringRef ph = unit.getPhase();
      c.callMixed(unit.getLoc(), "planrt::unit_begin", {mb},
                  {c.i64(unit.getStage()),
                   c.i64(ph == "F"   ? 0
                         : ph == "B" ? 1
                                     : 2),
                   c.operand(0), c.i64(unit.getLast() ? 1 : 0)});
      Block &body = unit.getBody().front();
      vals[body.getArgument(0)] = mb;
      Value saved = unitMb;
      unitMb = mb;
      if (failed(emitBlock(body)))
        return failure();
      unitMb = saved;
      c.call(unit.getLoc(), "planrt::unit_end", {}, {});
      return success();
    };
    emitOp = [&](Operation &op) -> LogicalResult {
      {
        Location loc = op.getLoc();
        if (auto pipe = dyn_cast<rk::PipelineOp>(op);
            pipe && name == "plan_forward") {
          // The forward (generation, one microbatch): each pipeline rank's
          // timeline, unrolled.
          SmallVector<rk::UnitOp> units(
              pipe.getBody().front().getOps<rk::UnitOp>());
          Value coord = c.call(loc, "planrt::mesh_coord", {},
                               {c.i64(mesh.getAxisIndex(pipe.getAxis()))}, i64);
          for (auto t : pipe.getBody().front().getOps<rk::TimelineOp>()) {
            Value cond =
                ec::CmpOp::create(b, loc, b.getI1Type(), ec::CmpPredicate::eq,
                                  coord, constant(loc, t.getRank()));
            OpBuilder::InsertionGuard g(b);
            b.setInsertionPoint(thenOf(loc, cond));
            for (auto e : t.getBody().front().getOps<rk::ExecOp>()) {
              if (failed(
                      emitUnit(units[e.getUnit()], constant(loc, e.getMb()))))
                return failure();
            }
          }
          return success();
        }
        if (auto pipe = dyn_cast<rk::PipelineOp>(op)) {
          // for (i < schedule_length) { u = unit(i); mb = mb(i);
          //   if (u == 0) { unit 0 } if (u == 1) { unit 1 } ... }
          Value n = c.call(loc, "planrt::schedule_length", {}, {}, i64);
          auto forOp =
              ec::ForOp::create(b, loc, constant(loc, 0), n, constant(loc, 1));
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(forOp.getBody());
          Value i = forOp.getInductionVar();
          Value u = c.call(loc, "planrt::schedule_unit", {i}, {}, i64);
          Value mb = c.call(loc, "planrt::schedule_mb", {i}, {}, i64);
          int64_t k = 0;
          for (auto unit : pipe.getBody().front().getOps<rk::UnitOp>()) {
            Value cond = ec::CmpOp::create(b, unit.getLoc(), b.getI1Type(),
                                           ec::CmpPredicate::eq, u,
                                           constant(unit.getLoc(), k++));
            OpBuilder::InsertionGuard g2(b);
            b.setInsertionPoint(thenOf(unit.getLoc(), cond));
            if (failed(emitUnit(unit, mb)))
              return failure();
          }
          return success();
        }
        int64_t ppIndex = mesh.getAxisIndex("pp");
        int64_t ppSize = mesh.getAxisSize("pp");
        if (auto send = dyn_cast<rk::SendOp>(op)) {
          c.call(loc, "planrt::send", operands(&op),
                 {c.i64(ppIndex), c.i64(send.getToStage() % ppSize)});
          return success();
        }
        if (auto recv = dyn_cast<rk::RecvOp>(op)) {
          c.call(loc, "planrt::recv", operands(&op),
                 {c.i64(ppIndex), c.i64(recv.getFromStage() % ppSize)});
          return success();
        }
        if (auto put = dyn_cast<rk::StashPutOp>(op)) {
          c.callMixed(loc, "planrt::stash_put",
                      {vals.lookup(put.getBuffer()), unitMb},
                      {c.operand(0), c.i64(put.getSlot()), c.operand(1),
                       c.i64(put.getReaders())});
          return success();
        }
        if (auto get = dyn_cast<rk::StashGetOp>(op)) {
          vals[get] =
              c.callMixed(loc, "planrt::stash_get", {unitMb},
                          {c.i64(get.getSlot()), c.operand(0)}, tensorType);
          return success();
        }
        if (auto rel = dyn_cast<rk::StashReleaseOp>(op)) {
          c.callMixed(loc, "planrt::stash_release", {unitMb},
                      {c.i64(rel.getSlot()), c.operand(0)});
          return success();
        }
      }
      for (Operation *opp : {&op}) {
        Operation &op = *opp;
        Location loc = op.getLoc();
        // The op's temporaries, where the memory plan put them.
        if (auto ws = op.getAttrOfType<DenseI64ArrayAttr>(rk::kWorkspaceAttr);
            ws && ws.size() == 2)
          c.call(loc, "planrt::op_workspace", {}, {c.i64(ws[0]), c.i64(ws[1])});
        if (auto loop = dyn_cast<rk::MicrobatchLoopOp>(op)) {
          // int64_t, as planrt takes it.
          Type idx = b.getI64Type();
          Value lb =
              ec::ConstantOp::create(b, loc, idx, b.getI64IntegerAttr(0));
          Value ub = ec::ConstantOp::create(
              b, loc, idx, b.getI64IntegerAttr(loop.getCount()));
          Value one =
              ec::ConstantOp::create(b, loc, idx, b.getI64IntegerAttr(1));
          auto forOp = ec::ForOp::create(b, loc, lb, ub, one);
          Block &loopBody = loop.getBody().front();
          vals[loopBody.getArgument(0)] = forOp.getInductionVar();
          OpBuilder::InsertionGuard g(b);
          b.setInsertionPointToStart(forOp.getBody());
          Value mark =
              c.call(loc, "planrt::arena_mark", {}, {}, b.getI64Type());
          c.call(loc, "planrt::set_microbatch", {forOp.getInductionVar()}, {});
          if (failed(emitBlock(loopBody)))
            return failure();
          c.call(loc, "planrt::arena_release", {mark}, {});
          continue;
        }
        if (auto sv = dyn_cast<rk::SubviewOp>(op)) {
          SmallVector<Attribute> a{c.i64(sv.getOffset())};
          append_range(a, c.shape(sv.getType()));
          vals[sv] =
              c.call(loc, "planrt::subview", operands(&op), a, tensorType);
          continue;
        }
        if (auto w = dyn_cast<rk::CollectiveWaitOp>(op)) {
          c.call(loc, "planrt::collective_wait", {}, {c.i64(w.getSlot())});
          continue;
        }
        if (auto sv = dyn_cast<rk::ShardViewOp>(op)) {
          int64_t axis = mesh.getAxisIndex(sv.getAxis());
          if (axis < 0) {
            op.emitError() << "unknown mesh axis '" << sv.getAxis() << "'";
            return failure();
          }
          vals[sv] = c.call(loc, "planrt::shard_view", operands(&op),
                            {c.i64(axis)}, tensorType);
          continue;
        }
        if (auto rows = dyn_cast<rk::RowsOp>(op)) {
          vals[rows] = c.call(loc, "planrt::rows", operands(&op),
                              {c.i64(rows.getCount())}, tensorType);
          continue;
        }
        if (auto p = dyn_cast<rk::ParamOp>(op)) {
          vals[p] = c.call(loc, "planrt::param", {},
                           {c.i64(paramIdx.lookup(p.getName()))}, tensorType);
        } else if (auto p = dyn_cast<rk::ParamCopyOp>(op)) {
          vals[p] = c.call(loc, "planrt::param_copy", {},
                           {c.i64(paramIdx.lookup(p.getName()))}, tensorType);
        } else if (auto st = dyn_cast<rk::StateOp>(op)) {
          vals[st] = c.call(loc, "planrt::state", {},
                            {c.i64(stateIdx.lookup(st.getName()))}, tensorType);
        } else if (auto in = dyn_cast<rk::InputOp>(op)) {
          vals[in] = c.call(loc, "planrt::input", {},
                            {c.i64(inputIdx.lookup(in.getName()))}, tensorType);
        } else if (auto alloc = dyn_cast<rk::AllocOp>(op)) {
          auto offset = alloc.getOffsetAttr();
          if (offset && !alloc->hasAttr("rank.stash")) {
            SmallVector<Attribute> a{
                c.i64(offset.getInt()),
                c.i64(alloc.getKind() == "gradient" ? 1 : 0)};
            append_range(a, c.allocShape(alloc.getType()));
            if (auto st =
                    alloc->getAttrOfType<IntegerAttr>(rk::kRankStageAttr)) {
              a.insert(a.begin(), c.i64(st.getInt()));
              vals[alloc] =
                  c.call(loc, "planrt::alloc_at_on_stage", {}, a, tensorType);
            } else {
              vals[alloc] = c.call(loc, "planrt::alloc_at", {}, a, tensorType);
            }
          } else if (alloc->hasAttr("rank.stash")) {
            vals[alloc] = c.call(loc, "planrt::alloc_stash", {},
                                 c.allocShape(alloc.getType()), tensorType);
          } else if (auto st = alloc->getAttrOfType<IntegerAttr>(
                         rk::kRankStageAttr)) {
            SmallVector<Attribute> a{c.i64(st.getInt())};
            append_range(a, c.allocShape(alloc.getType()));
            vals[alloc] =
                c.call(loc, "planrt::alloc_on_stage", {}, a, tensorType);
          } else {
            vals[alloc] = c.call(loc, "planrt::alloc", {},
                                 c.allocShape(alloc.getType()), tensorType);
          }
        } else if (auto d = dyn_cast<rk::DeallocOp>(op)) {
          c.call(loc, "planrt::dealloc", operands(&op), {});
        } else if (auto obs = dyn_cast<rk::ObserveOp>(op)) {
          c.call(loc, "planrt::observe", operands(&op), {c.str(obs.getName())});
        } else if (auto view = dyn_cast<rk::ViewOp>(op)) {
          vals[view] = c.call(loc, "planrt::view", operands(&op),
                              c.shape(view.getType()), tensorType);
        } else if (isa<rk::AllReduceOp, rk::AllReduceMaxOp,
                       rk::AllReduceStartOp>(op)) {
          int64_t mask = 0;
          for (Attribute a : op.getAttrOfType<ArrayAttr>("axes")) {
            int64_t i = mesh.getAxisIndex(cast<StringAttr>(a).getValue());
            if (i < 0) {
              op.emitError() << "unknown mesh axis " << a;
              return failure();
            }
            mask |= int64_t(1) << i;
          }
          if (auto start = dyn_cast<rk::AllReduceStartOp>(op))
            c.call(loc, "planrt::all_reduce_sum_start", operands(&op),
                   {c.i64(mask), c.i64(start.getSlot())});
          else
            c.call(loc,
                   isa<rk::AllReduceOp>(op) ? "planrt::all_reduce_sum"
                                            : "planrt::all_reduce_max",
                   operands(&op), {c.i64(mask)});
        } else if (auto callOp = dyn_cast<rk::RuntimeCallOpInterface>(op)) {
          SmallVector<Attribute> attrs;
          for (StringRef attrName : callOp.getRuntimeAttrNames()) {
            Attribute a = op.getAttr(attrName);
            // Mesh axes are passed by index; none is -1.
            if (attrName.ends_with("axis") && (!a || isa<StringAttr>(a))) {
              StringRef axis = a ? cast<StringAttr>(a).getValue() : "";
              int64_t i = axis.empty() ? -1 : mesh.getAxisIndex(axis);
              if (!axis.empty() && i < 0) {
                op.emitError() << "unknown mesh axis '" << axis << "'";
                return failure();
              }
              attrs.push_back(c.i64(i));
              continue;
            }
            // Several axes are passed as an axis mask (0: none, or absent).
            if (attrName.ends_with("axes") && (!a || isa<ArrayAttr>(a))) {
              int64_t mask = 0;
              ArrayRef<Attribute> axes;
              if (a)
                axes = cast<ArrayAttr>(a).getValue();
              for (Attribute axis : axes) {
                int64_t i =
                    mesh.getAxisIndex(cast<StringAttr>(axis).getValue());
                if (i < 0) {
                  op.emitError() << "unknown mesh axis " << axis;
                  return failure();
                }
                mask |= int64_t(1) << i;
              }
              attrs.push_back(c.i64(mask));
              continue;
            }
            if (!a) {
              op.emitError() << "lacks attribute '" << attrName << "'";
              return failure();
            }
            // Arrays ([height, width]) are passed element by element, names
            // as C string literals.
            if (auto arr = dyn_cast<DenseI64ArrayAttr>(a)) {
              for (int64_t v : arr.asArrayRef())
                attrs.push_back(c.i64(v));
              continue;
            }
            if (auto str = dyn_cast<StringAttr>(a)) {
              attrs.push_back(ec::OpaqueAttr::get(
                  b.getContext(), "\"" + str.getValue().str() + "\""));
              continue;
            }
            attrs.push_back(c.literal(a));
          }
          c.call(loc, callOp.getRuntimeCallee(), operands(&op), attrs);
        } else if (isa<func::ReturnOp>(op)) {
          if (planned)
            c.call(loc, "planrt::arena_end", {}, {});
          ec::ReturnOp::create(b, loc, Value());
        } else {
          op.emitError() << "no EmitC lowering for '" << op.getName() << "'";
          return failure();
        }
      }
      return success();
    };
    if (failed(emitBlock(src.getBody().front())))
      return ec::FuncOp();
    return emitFn;
  };
  func::FuncOp forward = module.lookupSymbol<func::FuncOp>("plan_forward");
  ec::FuncOp emitForward;
  if (forward && !(emitForward = translate(forward, "plan_forward")))
    return signalPassFailure();
  ec::FuncOp emitStep = translate(step, "plan_step");
  if (!emitStep)
    return signalPassFailure();
  // The setup refers to plan_forward, so it comes after it.
  setup->moveAfter(emitStep);
  if (emitForward) {
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPoint(setupBody->getTerminator());
    CallBuilder c(b, setup.getArgument(0));
    c.call(forward.getLoc(), "planrt::set_forward", {},
           {ec::OpaqueAttr::get(ctx, "plan_forward")});
    // A padded vocabulary is never sampled.
    forward.walk([&](Operation *op) {
      auto valid = op->getAttrOfType<IntegerAttr>("valid_classes");
      if (isa<rk::CrossEntropyOp, rk::CeLocalStatsOp>(op) && valid &&
          valid.getInt() > 0)
        c.call(op->getLoc(), "planrt::set_generation_classes", {},
               {c.i64(valid.getInt())});
    });
  }

  // main: hand both functions to the runtime's driver.
  auto charPP = ec::PointerType::get(
      ec::PointerType::get(ec::OpaqueType::get(ctx, "char")));
  auto mainFn = ec::FuncOp::create(
      b, module.getLoc(), "main",
      b.getFunctionType({b.getI32Type(), charPP}, {b.getI32Type()}));
  Block *mainBody = mainFn.addEntryBlock();
  {
    OpBuilder::InsertionGuard g(b);
    b.setInsertionPointToStart(mainBody);
    CallBuilder c(b, mainFn.getArgument(0));
    auto rc = ec::CallOpaqueOp::create(
        b, module.getLoc(), TypeRange{b.getI32Type()}, "planrt::run",
        ValueRange{mainFn.getArgument(0), mainFn.getArgument(1)},
        b.getArrayAttr({b.getIndexAttr(0), b.getIndexAttr(1),
                        c.str(programName),
                        ec::OpaqueAttr::get(ctx, "plan_setup"),
                        ec::OpaqueAttr::get(ctx, "plan_step")}));
    ec::ReturnOp::create(b, module.getLoc(), rc.getResult(0));
  }

  // Everything else has been turned into the three functions above (and
  // the schedule's table).
  for (Operation &op :
       llvm::make_early_inc_range(module.getBody()->getOperations()))
    if (!isa<ec::IncludeOp, ec::FuncOp, ec::GlobalOp>(op))
      op.erase();
}
