//===- PlanMemory.cpp - Offsets in one arena for every buffer of a step ---===//
//
// Liveness-based memory planning at rank level, for @plan_step and
// @plan_forward. Every `rank.alloc` (except the pipeline stash, whose
// lifetimes span units in the order of the schedule) and every op's
// workspace (WorkspaceOpInterface, the bytes of planrt/workspace.h) gets an
// offset in one arena per rank:
//
// - An alloc is moved to its first use; it lives until its last use, found
//   through the views of it (rank.view / subview / rows); a buffer reduced
//   by rank.all_reduce_start lives until the matching rank.collective_wait.
//   A `rank.dealloc` ends its life, so the runtime can check that no two
//   live buffers share bytes and count live bytes by kind.
// - A workspace lives for its op only.
// - A region (a microbatch loop's body, each pipeline unit) is planned on
//   its own; in its parent it is one block, live for the op that holds it,
//   as large as its largest plan (units run one at a time, so they share it).
// - Offsets come from a best-fit allocator run over the block in program
//   order (a compile-time malloc: O(n log n), so compile time stays linear
//   in the layers), and, for blocks of up to 20000 buffers, from a
//   by-size placement (quadratic) when that gives a smaller arena.
//
// The function gets `rank.arena_bytes`: the arena's size for each pipeline
// coordinate (the highest byte any buffer of that coordinate's stages
// reaches), which the runtime checks against what it measures, and
// `rank.buffer_bytes`: the bytes of the same buffers side by side.
//===----------------------------------------------------------------------===//
#include "planc/Transforms/Passes.h"

#include "planrt/best_fit.h"
#include "planrt/workspace.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

#include <map>

namespace planc {
#define GEN_PASS_DEF_PLANMEMORY
#include "planc/Transforms/Passes.h.inc"
} // namespace planc

using namespace mlir;
using namespace planc;
namespace rk = planc::rank;

namespace {
/// The alloc a buffer is a view of (or null: a parameter, state, input or
/// stash read).
rk::AllocOp rootAlloc(Value v) {
  return rk::viewRoot(v).getDefiningOp<rk::AllocOp>();
}

bool planned(rk::AllocOp a) { return !a->hasAttr("rank.stash"); }

/// The most buffers of one block that the by-size placement (quadratic)
/// considers; larger blocks keep the program-order plan.
constexpr size_t kBySizeLimit = 20000;

int64_t bufferBytes(Type t) {
  auto m = cast<MemRefType>(t);
  int64_t width = (m.getElementTypeBitWidth() + 7) / 8;
  return planrt::workspace::round(m.getNumElements() * width);
}

/// One planned thing: an alloc, an op's workspace, or (while its parent
/// block is planned) a nested region's block.
struct Record {
  Operation *op;
  bool workspace;
  int64_t bytes;
  int64_t offset = 0;  // relative to the block being planned, then absolute
  int64_t stage = -1;  // the pipeline stage it belongs to; -1: every rank
  bool nested = false; // a nested block (stage: its pipeline coordinate)
};

struct Planner {
  rk::WorkspaceEnv env;
  int64_t pp = 1;
  /// For all_reduce_start: the position (function order) of its wait.
  DenseMap<Operation *, Operation *> waitOf;
  std::vector<Record> records;
  LogicalResult status = success();

  int64_t stageOf(Operation *op, int64_t inherited) {
    if (auto st = op->getAttrOfType<IntegerAttr>(rk::kRankStageAttr))
      return st.getInt();
    return inherited;
  }

  /// The pipeline coordinate a stage runs on (-1: every rank).
  int64_t coordOf(int64_t stage) const { return stage < 0 ? -1 : stage % pp; }

  /// Plans `block`; its records' offsets are relative to the block's base.
  /// Returns the block's size (the highest byte its plan reaches).
  int64_t planBlock(Block &block, int64_t stage);
  /// Plans the regions of `op` (each block on its own, sharing one base);
  /// returns their largest size per pipeline coordinate: a pipeline's units
  /// of one coordinate share a block (they run one at a time), other
  /// regions are one block at the holder's coordinate.
  std::map<int64_t, int64_t> planRegions(Operation *op, int64_t stage) {
    std::map<int64_t, int64_t> sizes;
    if (auto pipe = dyn_cast<rk::PipelineOp>(op)) {
      for (auto unit : pipe.getBody().front().getOps<rk::UnitOp>()) {
        int64_t &size = sizes[coordOf(unit.getStage())];
        size =
            std::max(size, planBlock(unit.getBody().front(), unit.getStage()));
      }
      return sizes;
    }
    for (Region &r : op->getRegions())
      for (Block &b : r) {
        int64_t &size = sizes[coordOf(stage)];
        size = std::max(size, planBlock(b, stage));
      }
    return sizes;
  }
  /// Places `group` (records of one block, live from `from` to `to` in its
  /// order) at offsets from 0; returns the highest byte.
  int64_t place(ArrayRef<size_t> group, ArrayRef<int64_t> from,
                ArrayRef<int64_t> to);
};

int64_t Planner::place(ArrayRef<size_t> group, ArrayRef<int64_t> from,
                       ArrayRef<int64_t> to) {
  // Two placements; the group keeps the smaller. In program order, a
  // best-fit allocator (larger buffers first among those that start
  // together: they are the hardest to fit later)...
  // `group` is in the order buffers start; ends are taken in time order.
  SmallVector<size_t> starting(group), ending(group);
  llvm::stable_sort(ending, [&](size_t a, size_t b) { return to[a] < to[b]; });
  planrt::BestFit arena;
  size_t e = 0;
  for (size_t k = 0; k < starting.size();) {
    int64_t t = from[starting[k]];
    for (; e < ending.size() && to[ending[e]] < t; ++e)
      arena.release(records[ending[e]].offset, records[ending[e]].bytes);
    size_t next = k;
    while (next < starting.size() && from[starting[next]] == t)
      ++next;
    auto at = MutableArrayRef<size_t>(starting).slice(k, next - k);
    llvm::stable_sort(at, [&](size_t a, size_t b) {
      return records[a].bytes > records[b].bytes;
    });
    for (size_t i : at)
      records[i].offset = arena.allocate(records[i].bytes);
    k = next;
  }
  // ... and by size over the whole group (TFLite's greedy-by-size): the
  // largest buffers first, each in the smallest gap among the placed ones
  // whose lifetimes overlap its own. Where one huge buffer's bytes are
  // later reused by smaller ones (the logits, a staged GEMM's copies), the
  // first is at the mercy of the order in which they come. Its scan is
  // quadratic in the group's buffers, so a group of more than
  // kBySizeLimit keeps the program-order plan: there the many layers'
  // buffers dominate and by-size saved under 0.1% (GPT, 100 and 1000
  // layers), while it took 70% of the compile time at 1000 layers.
  int64_t top = arena.highWater();
  if (group.size() > kBySizeLimit)
    return top;
  SmallVector<size_t> order(group);
  llvm::stable_sort(order, [&](size_t a, size_t b) {
    return records[a].bytes > records[b].bytes;
  });
  DenseMap<size_t, int64_t> bySize;
  SmallVector<size_t> placed;
  int64_t sizeTop = 0;
  for (size_t i : order) {
    SmallVector<std::pair<int64_t, int64_t>> busy; // (offset, end)
    for (size_t j : placed)
      if (from[j] <= to[i] && from[i] <= to[j])
        busy.push_back({bySize[j], bySize[j] + records[j].bytes});
    llvm::sort(busy);
    int64_t cursor = 0, best = -1, bestGap = 0;
    for (auto [b, e] : busy) {
      int64_t gap = b - cursor;
      if (gap >= records[i].bytes && (best < 0 || gap < bestGap)) {
        best = cursor;
        bestGap = gap;
      }
      cursor = std::max(cursor, e);
    }
    if (best < 0)
      best = cursor;
    bySize[i] = best;
    placed.push_back(i);
    sizeTop = std::max(sizeTop, best + records[i].bytes);
  }
  if (sizeTop < top) {
    for (size_t i : group)
      records[i].offset = bySize[i];
    top = sizeTop;
  }
  return top;
}

int64_t Planner::planBlock(Block &block, int64_t stage) {
  // Move each planned alloc to its first use, so that it is live from there.
  struct Live {
    rk::AllocOp alloc;
    Operation *first = nullptr, *last = nullptr;
  };
  SmallVector<Live> allocs;
  SmallVector<rk::AllocOp> blockAllocs(block.getOps<rk::AllocOp>());
  // Positions before the moves (moving an op invalidates the block's order
  // cache, and asking isBeforeInBlock after each move would be quadratic).
  size_t numOps = block.getOperations().size();
  DenseMap<Operation *, int64_t> before;
  before.reserve(numOps);
  for (auto [i, op] : llvm::enumerate(block))
    before[&op] = int64_t(i);
  for (rk::AllocOp alloc : blockAllocs) {
    if (!planned(alloc))
      continue;
    Live l{alloc};
    SmallVector<Value> worklist{alloc.getResult()};
    while (!worklist.empty()) {
      Value v = worklist.pop_back_val();
      for (Operation *user : v.getUsers()) {
        if (isa<rk::ViewOp, rk::SubviewOp, rk::RowsOp, rk::ShardViewOp>(user))
          worklist.push_back(user->getResult(0));
        SmallVector<Operation *, 2> uses{user};
        if (Operation *wait = waitOf.lookup(user))
          uses.push_back(wait);
        for (Operation *u : uses) {
          Operation *a = block.findAncestorOpInBlock(*u);
          if (!a) {
            status = user->emitError()
                     << "plan-memory: a buffer allocated in one region is "
                        "used outside it";
            continue;
          }
          if (!l.first || before[a] < before[l.first])
            l.first = a;
          if (!l.last || before[l.last] < before[a])
            l.last = a;
        }
      }
    }
    if (!l.first)
      l.first = l.last = alloc;
    allocs.push_back(l);
  }
  for (Live &l : allocs)
    if (l.first != l.alloc.getOperation())
      l.alloc->moveBefore(l.first);

  // Positions after the moves; what starts and ends at each.
  DenseMap<Operation *, int64_t> pos;
  pos.reserve(numOps);
  int64_t n = 0;
  for (Operation &op : block)
    pos[&op] = n++;
  std::vector<SmallVector<size_t>> starts(n), ends(n);
  auto add = [&](Record r, int64_t from, int64_t to) {
    starts[from].push_back(records.size());
    ends[to].push_back(records.size());
    records.push_back(r);
  };
  for (Live &l : allocs)
    add({l.alloc, false, bufferBytes(l.alloc.getType()), 0,
         stageOf(l.alloc, stage)},
        pos[l.alloc], pos[l.last]);
  // Nested blocks are planned first; their records are shifted below.
  DenseMap<Operation *, std::pair<size_t, size_t>> nestedRange;
  for (Operation &op : block) {
    int64_t opStage = stageOf(&op, stage);
    int64_t wsBytes = rk::stagingBytes(&op, env);
    if (auto ws = dyn_cast<rk::WorkspaceOpInterface>(op))
      wsBytes += ws.getWorkspaceBytes(env);
    if (wsBytes > 0)
      add({&op, true, wsBytes, 0, opStage}, pos[&op], pos[&op]);
    if (op.getNumRegions() == 0)
      continue;
    size_t begin = records.size();
    std::map<int64_t, int64_t> sizes = planRegions(&op, opStage);
    size_t end = records.size();
    nestedRange[&op] = {begin, end};
    // The nested block itself, as one record per pipeline coordinate (op =
    // the region holder).
    for (auto [coord, size] : sizes)
      if (size > 0)
        add({&op, false, size, 0, coord, /*nested=*/true}, pos[&op], pos[&op]);
  }

  // Buffers of different pipeline coordinates live on different ranks and
  // may share bytes: the buffers every rank has (stage -1) are placed first,
  // then each coordinate's above them, on its own.
  SmallVector<int64_t> from(records.size(), -1), to(records.size(), -1);
  std::map<int64_t, SmallVector<size_t>> groups; // coordinate -> records
  for (int64_t t = 0; t < n; ++t) {
    for (size_t i : starts[t]) {
      from[i] = t;
      groups[coordOf(records[i].stage)].push_back(i);
    }
    for (size_t i : ends[t])
      to[i] = t;
  }
  int64_t common = groups.count(-1) ? place(groups[-1], from, to) : 0;
  int64_t top = common;
  for (auto &[coord, group] : groups) {
    if (coord < 0)
      continue;
    top = std::max(top, common + place(group, from, to));
    for (size_t i : group)
      records[i].offset += common;
  }

  // Shift each nested block's records to where its block landed: a
  // pipeline's units to their coordinate's block, other regions to theirs.
  for (Operation &op : block) {
    auto it = nestedRange.find(&op);
    if (it == nestedRange.end())
      continue;
    std::map<int64_t, int64_t> base;
    for (size_t i = it->second.second; i < records.size(); ++i)
      if (records[i].op == &op && records[i].nested)
        base[records[i].stage] = records[i].offset;
    if (base.empty())
      continue; // nothing planned inside
    bool pipeline = isa<rk::PipelineOp>(op);
    for (size_t i = it->second.first; i < it->second.second; ++i) {
      auto b = pipeline ? base.find(coordOf(records[i].stage)) : base.begin();
      if (b == base.end())
        b = base.begin();
      records[i].offset += b->second;
    }
  }

  // Lifetimes end after the last use.
  for (Live &l : allocs) {
    OpBuilder b(l.last->getContext());
    b.setInsertionPointAfter(l.last);
    auto d = rk::DeallocOp::create(b, l.alloc.getLoc(), l.alloc.getResult());
    if (auto st = l.alloc->getAttr(rk::kRankStageAttr))
      d->setAttr(rk::kRankStageAttr, st);
  }
  return top;
}

/// The allocs whose buffers hold parameter gradients: what the optimizer
/// updates read as gradients, and what flows into them through collectives,
/// copies and sums (microbatch accumulation, tied parameters, ZeRO slices).
DenseSet<Operation *> gradientAllocs(func::FuncOp fn) {
  DenseSet<Operation *> grads;
  fn.walk([&](Operation *op) {
    Value g;
    if (auto u = dyn_cast<rk::SgdUpdateOp>(op))
      g = u.getGrad();
    else if (auto u = dyn_cast<rk::AdamWUpdateOp>(op))
      g = u.getGrad();
    if (g)
      if (auto a = rootAlloc(g))
        grads.insert(a);
  });
  bool changed = true;
  while (changed) {
    changed = false;
    fn.walk([&](Operation *op) {
      if (!isa<rk::AllGatherOp, rk::ReduceScatterOp, rk::ShardSliceOp,
               rk::AllToAllOp, rk::AddOp, rk::CopyOp>(op))
        return;
      auto out = rootAlloc(op->getOperands().back());
      if (!out || !grads.contains(out))
        return;
      for (Value in : op->getOperands().drop_back())
        if (auto a = rootAlloc(in))
          changed |= grads.insert(a).second;
    });
  }
  return grads;
}

/// The pipeline stash of each pipeline coordinate: its allocations happen
/// when a unit runs and end when the last reader of every stash entry that
/// points into them has released it (or when their unit ends, if none does),
/// in the order of the rank's timeline. The runtime runs the same best-fit
/// allocator on the same events in its stash pool, so the pool's highest
/// byte is this simulation's, which the runtime checks. Returns the bytes per
/// coordinate (0 without stash).
SmallVector<int64_t> planStash(rk::PipelineOp pipe, int64_t pp) {
  SmallVector<int64_t> bytes(pp, 0);
  SmallVector<rk::UnitOp> units(pipe.getBody().front().getOps<rk::UnitOp>());
  // What each unit does to the stash, found once: a large plan runs each
  // unit hundreds of times. `local` numbers the unit's stash allocations
  // and reads; a put names the one its buffer is a view of (-1: none).
  enum class Kind { Alloc, Get, Put, Release };
  struct Event {
    Kind kind;
    int64_t value; // Alloc: bytes; otherwise the slot
    int64_t readers = 0;
    int64_t local = -1;
  };
  std::vector<SmallVector<Event>> events(units.size());
  for (auto [i, unit] : llvm::enumerate(units)) {
    DenseMap<Value, int64_t> localOf;
    for (Operation &op : unit.getBody().front()) {
      if (auto a = dyn_cast<rk::AllocOp>(op); a && !planned(a)) {
        int64_t id = localOf.size();
        localOf[a.getResult()] = id;
        events[i].push_back({Kind::Alloc, bufferBytes(a.getType()), 0, id});
      } else if (auto get = dyn_cast<rk::StashGetOp>(op)) {
        int64_t id = localOf.size();
        localOf[get.getResult()] = id;
        events[i].push_back({Kind::Get, get.getSlot(), 0, id});
      } else if (auto put = dyn_cast<rk::StashPutOp>(op)) {
        events[i].push_back(
            {Kind::Put, put.getSlot(), put.getReaders(),
             localOf.lookup_or(rk::viewRoot(put.getBuffer()), -1)});
      } else if (auto rel = dyn_cast<rk::StashReleaseOp>(op)) {
        events[i].push_back({Kind::Release, rel.getSlot()});
      }
    }
  }
  for (auto timeline : pipe.getBody().front().getOps<rk::TimelineOp>()) {
    int64_t r = timeline.getRank();
    if (r < 0 || r >= pp)
      continue;
    struct Alloc {
      int64_t bytes, refs = 0;
      bool ended = false;
    };
    planrt::BestFit pool;
    std::map<int64_t, Alloc> live; // by offset
    std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>>
        entries; // (slot, mb) -> (off, readers)
    auto release = [&](int64_t off) {
      pool.release(off, live[off].bytes);
      live.erase(off);
    };
    SmallVector<int64_t> offsetOf; // by local number, in this run
    for (auto exec : timeline.getBody().front().getOps<rk::ExecOp>()) {
      if (exec.getUnit() < 0 || exec.getUnit() >= (int64_t)units.size())
        continue;
      int64_t mb = exec.getMb();
      offsetOf.clear();
      SmallVector<int64_t> mine;
      for (const Event &e : events[exec.getUnit()]) {
        switch (e.kind) {
        case Kind::Alloc: {
          int64_t off = pool.allocate(e.value);
          live[off] = {e.value};
          offsetOf.push_back(off);
          mine.push_back(off);
          break;
        }
        case Kind::Get: {
          auto it = entries.find({e.value, mb});
          offsetOf.push_back(it == entries.end() ? -1 : it->second.first);
          break;
        }
        case Kind::Put: {
          int64_t off = e.local < 0 ? -1 : offsetOf[e.local];
          entries[{e.value, mb}] = {off, e.readers};
          if (off >= 0)
            ++live[off].refs;
          break;
        }
        case Kind::Release: {
          auto it = entries.find({e.value, mb});
          if (it == entries.end() || --it->second.second > 0)
            break;
          int64_t off = it->second.first;
          entries.erase(it);
          if (off >= 0 && --live[off].refs == 0 && live[off].ended)
            release(off);
          break;
        }
        }
      }
      for (int64_t off : mine) {
        live[off].ended = true;
        if (live[off].refs == 0)
          release(off);
      }
    }
    bytes[r] = pool.highWater();
  }
  return bytes;
}

struct PlanMemoryPass : public planc::impl::PlanMemoryBase<PlanMemoryPass> {
  using PlanMemoryBase::PlanMemoryBase;
  void runOnOperation() override;
};
} // namespace

void PlanMemoryPass::runOnOperation() {
  ModuleOp module = getOperation();
  plan::MeshOp mesh = plan::getMesh(module);
  auto axisSize = [&](StringRef axis) -> int64_t {
    if (!mesh || mesh.getAxisIndex(axis) < 0)
      return 1;
    return mesh.getAxisSize(axis);
  };
  if (target != "host" && target != "cuda") {
    module.emitError() << "plan-memory: target must be host or cuda, got '"
                       << target << "'";
    return signalPassFailure();
  }
  int64_t pp = axisSize("pp");
  for (StringRef name : {"plan_step", "plan_forward"}) {
    auto fn = module.lookupSymbol<func::FuncOp>(name);
    if (!fn || fn.isExternal())
      continue;
    Planner p;
    p.pp = pp;
    p.env.axisSize = axisSize;
    p.env.classifier = rk::classifierClasses(module, fn) > 0;
    p.env.cuda = target == "cuda";
    // Each all_reduce_start's wait: the first wait on its slot after it.
    SmallVector<Operation *> order;
    fn.walk<WalkOrder::PreOrder>([&](Operation *op) { order.push_back(op); });
    DenseMap<int64_t, Operation *> open;
    for (Operation *op : order) {
      if (auto s = dyn_cast<rk::AllReduceStartOp>(op))
        open[s.getSlot()] = op;
      else if (auto w = dyn_cast<rk::CollectiveWaitOp>(op))
        if (Operation *s = open.lookup(w.getSlot())) {
          p.waitOf[s] = op;
          open.erase(w.getSlot());
        }
    }
    p.planBlock(fn.getBody().front(), -1);
    if (failed(p.status))
      return signalPassFailure();

    DenseSet<Operation *> grads = gradientAllocs(fn);
    SmallVector<int64_t> arena(pp, 0), buffers(pp, 0), workspace(pp, 0);
    Builder b(&getContext());
    for (const Record &r : p.records) {
      if (r.nested)
        continue; // a nested block: its contents are recorded
      for (int64_t c = 0; c < pp; ++c)
        if (r.stage < 0 || r.stage % pp == c) {
          arena[c] = std::max(arena[c], r.offset + r.bytes);
          buffers[c] += r.bytes;
          if (r.workspace)
            workspace[c] = std::max(workspace[c], r.bytes);
        }
      if (r.workspace) {
        r.op->setAttr(rk::kWorkspaceAttr,
                      b.getDenseI64ArrayAttr({r.offset, r.bytes}));
        continue;
      }
      auto alloc = cast<rk::AllocOp>(r.op);
      alloc.setOffsetAttr(b.getI64IntegerAttr(r.offset));
      alloc.setKindAttr(
          b.getStringAttr(grads.contains(alloc) ? "gradient" : "activation"));
    }
    fn->setAttr(rk::kArenaBytesAttr, b.getDenseI64ArrayAttr(arena));
    fn->setAttr(rk::kBufferBytesAttr, b.getDenseI64ArrayAttr(buffers));
    fn->setAttr(rk::kWorkspaceBytesAttr, b.getDenseI64ArrayAttr(workspace));
    SmallVector<int64_t> stash(pp, 0);
    fn.walk([&](rk::PipelineOp pipe) {
      SmallVector<int64_t> s = planStash(pipe, pp);
      for (int64_t c = 0; c < pp; ++c)
        stash[c] = std::max(stash[c], s[c]);
    });
    if (llvm::any_of(stash, [](int64_t x) { return x > 0; }))
      fn->setAttr(rk::kStashBytesAttr, b.getDenseI64ArrayAttr(stash));
  }
}
