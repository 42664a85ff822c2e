//===- checkpoint_layout.cpp - Tensors and their blocks in a checkpoint ---===//
//
// The description calls of state tensors' layouts (shard_state,
// set_state_buffer, set_state_segments), which rank writes which block of a
// parameter or state tensor (each distinct block once), the global index
// ranges of a block, and copying the part of a block that overlaps this
// rank's tensor: what lets a run under another plan read a checkpoint.
//===----------------------------------------------------------------------===//

#include "checkpoint_impl.h"

#include <string>
#include <utility>
#include <vector>

namespace planrt {

//===--- Description calls ------------------------------------------------===//

static StateDesc &state_desc(Context *ctx, const char *op, int64_t index) {
  if (!ctx)
    fatal("%s: null context", op);
  if (ctx->started)
    fatal("%s: called after the program started", op);
  if (index < 0 || index >= (int64_t)ctx->states.size())
    fatal("%s: state index %lld out of range (%zu state tensors declared)", op,
          (long long)index, ctx->states.size());
  return ctx->states[(size_t)index];
}

void shard_state(Context *ctx, int64_t state_index, int64_t dim,
                 int64_t mesh_axis) {
  StateDesc &st = state_desc(ctx, "shard_state", state_index);
  if (dim < 0 || dim >= st.t.ndim)
    fatal("shard_state '%s': dimension %lld out of range for rank %d",
          st.name.c_str(), (long long)dim, st.t.ndim);
  if (mesh_axis < 0)
    fatal("shard_state '%s': invalid mesh axis %lld", st.name.c_str(),
          (long long)mesh_axis);
  for (int d = 0; d < 4; ++d)
    for (int64_t ax : st.shard_axes[d])
      if (ax == mesh_axis)
        fatal("shard_state '%s': axis %lld already splits dimension %d",
              st.name.c_str(), (long long)mesh_axis, d);
  st.shard_axes[dim].push_back(mesh_axis);
}

void set_state_buffer(Context *ctx, int64_t state_index, int64_t init_kind,
                      float a, float b) {
  StateDesc &st = state_desc(ctx, "set_state_buffer", state_index);
  if (init_kind < InitZeros || init_kind > InitUniform)
    fatal("set_state_buffer '%s': unknown init kind %lld", st.name.c_str(),
          (long long)init_kind);
  st.buffer = true;
  st.init_kind = init_kind;
  st.a = a;
  st.b = b;
}

void set_state_segments(Context *ctx, int64_t state_index, int64_t dim,
                        int64_t s0, int64_t s1, int64_t s2) {
  const char *op = "set_state_segments";
  StateDesc &st = state_desc(ctx, op, state_index);
  if (dim < 0 || dim >= st.t.ndim)
    fatal("%s '%s': dimension %lld out of range for rank %d", op,
          st.name.c_str(), (long long)dim, st.t.ndim);
  if (!st.segments[dim].empty())
    fatal("%s '%s': the segments of dimension %lld are already set", op,
          st.name.c_str(), (long long)dim);
  int64_t s[3] = {s0, s1, s2};
  std::vector<int64_t> segs;
  for (int k = 0; k < 3; ++k) {
    if (s[k] < 0)
      fatal("%s '%s': segment %d has negative size %lld", op, st.name.c_str(),
            k, (long long)s[k]);
    if (s[k] == 0) {
      for (int j = k + 1; j < 3; ++j)
        if (s[j] != 0)
          fatal("%s '%s': segment %d is 0, which ends the list, but segment "
                "%d is %lld",
                op, st.name.c_str(), k, j, (long long)s[j]);
      break;
    }
    segs.push_back(s[k]);
  }
  if (segs.empty())
    fatal("%s '%s': at least one segment size must be > 0", op,
          st.name.c_str());
  st.segments[dim] = segs;
}

namespace internal {
namespace ckpt {

//===--- Tensors and their layouts ----------------------------------------===//

std::vector<TensorRef> tensor_refs(Context *ctx) {
  std::vector<TensorRef> out;
  for (ParamDesc &p : ctx->params) {
    TensorRef r{"param", p.name, p, &p.t, p.stage, p.export_rows};
    out.push_back(r);
  }
  for (StateDesc &st : ctx->states) {
    TensorRef r{"state", st.name, state_as_param(st), &st.t, st.stage, 0};
    out.push_back(r);
  }
  return out;
}

/// Checks a state tensor's layout (its shard axes and segments), as
/// validate() does for parameters; fatal: a code generator bug.
void check_layouts(Context *ctx) {
  for (const TensorRef &r : tensor_refs(ctx))
    if (std::string(r.kind) == "state")
      validate_layout(ctx, r.layout_desc, "state");
}

/// Whether the rank with `coords` holds `r` at all (its pipeline stage).
bool holds(const Context *ctx, const TensorRef &r,
           const std::vector<int64_t> &coords) {
  if (r.stage < 0 || ctx->pipeline_axis < 0)
    return true;
  return stage_owner(ctx, r.stage) == coords[(size_t)ctx->pipeline_axis];
}

/// Whether the rank with `coords` writes its block of `r` to a checkpoint:
/// it holds it and has coordinate 0 on every axis that does not split it
/// (on the pipeline axis for a tensor of one stage: the stage's owner), so
/// each distinct block is written once.
bool writes(const Context *ctx, const TensorRef &r,
            const std::vector<int64_t> &coords) {
  if (!holds(ctx, r, coords))
    return false;
  int64_t mask = param_shard_mask(r.layout_desc);
  for (size_t a = 0; a < coords.size(); ++a) {
    if (mask & (int64_t(1) << a))
      continue;
    if ((int64_t)a == ctx->pipeline_axis && r.stage >= 0)
      continue; // holds() checked the owner
    if (coords[a] != 0)
      return false;
  }
  return true;
}

/// Per dim: the global index ranges [begin, end) whose concatenation is the
/// local dim on the rank with `coords`.
Ranges ranges_of(const ParamLayout &l, int ndim) {
  Ranges out((size_t)ndim);
  for (int d = 0; d < ndim; ++d)
    for (int64_t g : l.index[d]) {
      auto &v = out[(size_t)d];
      if (!v.empty() && v.back().second == g)
        ++v.back().second;
      else
        v.push_back({g, g + 1});
    }
  return out;
}

std::vector<int64_t> global_shape(const ParamLayout &l, int ndim) {
  return std::vector<int64_t>(l.global, l.global + ndim);
}

//===--- Overlaps ---------------------------------------------------------===//

/// Copies the elements of a block (global index ranges `ranges`, data
/// `src` with its local shape) that fall in this rank's tensor (layout `l`,
/// local shape `ls`, host copy `dst`); counts them in `copied`.
void copy_overlap(const Ranges &ranges, const std::vector<int64_t> &shard_shape,
                  const float *src, const ParamLayout &l, const int64_t *ls,
                  int nd, float *dst, int64_t &copied) {
  // Per dim: (local index, position in the shard) of the common indices.
  std::vector<std::pair<int64_t, int64_t>> pairs[4];
  int64_t ss[4] = {1, 1, 1, 1};
  for (int d = 0; d < 4; ++d) {
    if (d >= nd) {
      pairs[d].push_back({0, 0});
      continue;
    }
    ss[d] = shard_shape[(size_t)d];
    std::vector<int64_t> pos((size_t)l.global[d], -1);
    int64_t at = 0;
    for (auto &rg : ranges[(size_t)d])
      for (int64_t g = rg.first; g < rg.second; ++g)
        if (g < (int64_t)pos.size())
          pos[(size_t)g] = at++;
        else
          ++at;
    for (int64_t i = 0; i < ls[d]; ++i) {
      int64_t p = pos[(size_t)l.index[d][(size_t)i]];
      if (p >= 0)
        pairs[d].push_back({i, p});
    }
    if (pairs[d].empty())
      return;
  }
  for (auto &a : pairs[0])
    for (auto &b : pairs[1])
      for (auto &c : pairs[2]) {
        int64_t dbase = ((a.first * ls[1] + b.first) * ls[2] + c.first) * ls[3];
        int64_t sbase =
            ((a.second * ss[1] + b.second) * ss[2] + c.second) * ss[3];
        for (auto &e : pairs[3])
          dst[dbase + e.first] = src[sbase + e.second];
        copied += (int64_t)pairs[3].size();
      }
}

bool overlaps(const Ranges &ranges, const ParamLayout &l, int nd) {
  for (int d = 0; d < nd; ++d) {
    bool any = false;
    for (auto &rg : ranges[(size_t)d]) {
      for (int64_t g : l.index[d])
        if (g >= rg.first && g < rg.second) {
          any = true;
          break;
        }
      if (any)
        break;
    }
    if (!any)
      return false;
  }
  return true;
}

/// The tensors this rank holds (its pipeline stages).
std::vector<TensorRef> held(Context *ctx) {
  std::vector<int64_t> coords = rank_coords(ctx, ctx->rank);
  std::vector<TensorRef> out;
  for (const TensorRef &r : tensor_refs(ctx))
    if (holds(ctx, r, coords))
      out.push_back(r);
  return out;
}

} // namespace ckpt
} // namespace internal
} // namespace planrt
