//===- checkpoint_read.cpp - --resume and --init-from ---------------------===//
//
// Reading a checkpoint into this rank's tensors: the manifest is checked
// against the tensors this rank holds and the files it needs before start()
// (check_resume), then each file overlapping its shards is read once, its
// size, crc32 and step verified, and the overlapping elements copied
// (load_resume). --init-from reads whole tensors by name from one
// safetensors file (--save's, or Hugging Face GPT-2's).
//===----------------------------------------------------------------------===//

#include "checkpoint_impl.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace planrt {
namespace internal {
namespace ckpt {

//===--- --resume ---------------------------------------------------------===//

/// The first of `problems` and how many more there are; "" if none.
static std::string first_of(const std::vector<std::string> &problems) {
  if (problems.empty())
    return "";
  std::string out = problems.front();
  if (problems.size() > 1)
    out += " (and " + std::to_string(problems.size() - 1) + " more problems)";
  return out;
}

/// Checks the manifest against this rank's tensors and the files it needs.
std::string check_resume(Context *ctx, const std::string &dir,
                         const Manifest &m, int64_t steps) {
  std::vector<int64_t> coords = rank_coords(ctx, ctx->rank);
  std::string mpath = join(dir, "manifest.json");
  if (m.step > steps)
    return mpath + ": the checkpoint is at step " + std::to_string(m.step) +
           " but this run ends at step " + std::to_string(steps) +
           " (--steps is the last step, not a count); use --steps " +
           std::to_string(m.step) + " or more";
  std::vector<std::string> problems;
  for (const TensorRef &r : held(ctx)) {
    auto it = m.tensors.find(r.key());
    ParamLayout l = param_layout(ctx, r.layout_desc, coords);
    std::vector<int64_t> shape = global_shape(l, r.t->ndim);
    if (it == m.tensors.end()) {
      problems.push_back(
          mpath + ": the checkpoint has no " + r.kind + " '" + r.name + "' " +
          shape_list(shape) + " that this program needs" +
          (std::string(r.kind) == "state" ? " (written with another optimizer?)"
                                          : " (written by another model?)"));
      continue;
    }
    if (it->second.shape != shape) {
      problems.push_back(mpath + ": " + r.kind + " '" + r.name + "' is " +
                         shape_list(it->second.shape) +
                         " in the checkpoint but " + shape_list(shape) +
                         " in this program");
      continue;
    }
    for (const ShardRef &s : it->second.shards) {
      if (!overlaps(s.ranges, l, r.t->ndim))
        continue;
      std::string file = join(dir, s.file);
      int64_t size = 0;
      int64_t want = m.files.at(s.file).first;
      if (!is_regular(file, &size))
        problems.push_back(file + ": missing (" +
                           (::access(file.c_str(), F_OK) == 0
                                ? std::string("not a regular file")
                                : std::strerror(errno)) +
                           "); the manifest lists it, so the checkpoint is "
                           "damaged: resume from another one with --resume "
                           "DIR/step-NNNNNN");
      else if (size != want)
        problems.push_back(file + ": " + std::to_string(size) +
                           " bytes but the manifest says " +
                           std::to_string(want) +
                           (size < want ? " (truncated)" : "") +
                           "; the checkpoint is damaged: resume from another "
                           "one with --resume DIR/step-NNNNNN");
    }
  }
  std::sort(problems.begin(), problems.end());
  problems.erase(std::unique(problems.begin(), problems.end()), problems.end());
  return first_of(problems);
}

/// Reads this rank's tensors from the checkpoint (after start).
std::string load_resume(Context *ctx, const std::string &dir,
                        const Manifest &m) {
  if (ctx->dynamic_loss_scale) {
    const Json *ls = member(m.training, "loss_scale");
    const Json *scale = member(ls, "scale");
    int64_t clean = 0, skipped = 0;
    if (!scale || !scale->is_number() || !(scale->get<double>() > 0) ||
        !get_int(member(ls, "clean_steps"), clean) ||
        !get_int(member(ls, "skipped_steps"), skipped) || clean < 0 ||
        skipped < 0 || skipped > m.step)
      return dir + "/manifest.json: no valid \"loss_scale\" in \"training\" "
                   "(the program scales its loss dynamically; the checkpoint "
                   "was written by a program that does not)";
    ctx->loss_scale = (float)scale->get<double>();
    ctx->loss_scale_clean = clean;
    ctx->loss_scale_skipped = skipped;
  }
  std::vector<TensorRef> mine = held(ctx);
  std::vector<std::vector<float>> host(mine.size());
  std::vector<int64_t> copied(mine.size(), 0);
  std::vector<ParamLayout> layouts;
  // file -> (tensor index, shard) pairs it serves.
  std::map<std::string, std::vector<std::pair<size_t, const ShardRef *>>> plan;
  for (size_t i = 0; i < mine.size(); ++i) {
    const TensorRef &r = mine[i];
    layouts.push_back(param_layout(ctx, r.layout_desc, ctx->coords));
    host[i].assign((size_t)r.t->numel(), 0.0f);
    for (const ShardRef &s : m.tensors.at(r.key()).shards)
      if (overlaps(s.ranges, layouts.back(), r.t->ndim))
        plan[s.file].push_back({i, &s});
  }
  std::string bytes;
  for (auto &[name, uses] : plan) {
    std::string path = join(dir, name);
    std::string error = read_whole(path, bytes);
    if (!error.empty())
      return error;
    auto [want_bytes, want_crc] = m.files.at(name);
    if ((int64_t)bytes.size() != want_bytes)
      return path + ": " + std::to_string(bytes.size()) +
             " bytes but the manifest says " + std::to_string(want_bytes) +
             "; the checkpoint is damaged: resume from another one with "
             "--resume DIR/step-NNNNNN";
    uint32_t crc = crc32(0, bytes.data(), bytes.size());
    if (crc != want_crc)
      return path + ": checksum mismatch (crc32 " + hex(crc, 8) +
             ", the manifest says " + hex(want_crc, 8) +
             "); the file is damaged: resume from another checkpoint with "
             "--resume DIR/step-NNNNNN";
    Json header;
    int64_t data_start = 0;
    error = parse_safetensors_header(path, bytes.data(), (int64_t)bytes.size(),
                                     header, data_start);
    if (!error.empty())
      return error;
    const std::string *step =
        string_of(member(member(&header, "__metadata__"), "step"));
    if (!step || *step != std::to_string(m.step))
      return path + ": the file belongs to another checkpoint (its step is " +
             (step ? *step : "missing") + ", the manifest's " +
             std::to_string(m.step) + ")";
    for (auto &[i, shard] : uses) {
      const TensorRef &r = mine[i];
      const Json *info = member(&header, r.key());
      if (!info)
        return path + ": no tensor '" + r.key() +
               "', which the manifest says it holds";
      StEntry e;
      error = st_entry(path, *info, r.key(), e);
      if (!error.empty())
        return error;
      int64_t n = 1;
      for (int64_t d : shard->local_shape)
        n *= d;
      if (e.dtype != "F32" || e.shape != shard->local_shape ||
          e.end - e.begin != n * 4 || e.begin < 0 ||
          data_start + e.end > (int64_t)bytes.size())
        return path + ": tensor '" + r.key() + "' is " + e.dtype + " " +
               shape_list(e.shape) + " but the manifest says F32 " +
               shape_list(shard->local_shape);
      std::vector<float> src((size_t)n);
      std::memcpy(src.data(), bytes.data() + data_start + e.begin,
                  (size_t)n * 4);
      copy_overlap(shard->ranges, shard->local_shape, src.data(), layouts[i],
                   r.t->shape, r.t->ndim, host[i].data(), copied[i]);
    }
  }
  ctx->copies_stale = true; // parameters' 16-bit copies: rounded again
  for (size_t i = 0; i < mine.size(); ++i) {
    if (copied[i] != mine[i].t->numel())
      return join(dir, "manifest.json") + ": the shards of " + mine[i].kind +
             " '" + mine[i].name + "' cover " + std::to_string(copied[i]) +
             " of this rank's " + std::to_string(mine[i].t->numel()) +
             " elements; the manifest is damaged";
    if (mine[i].t->data)
      from_host(ctx, mine[i].t, host[i]);
  }
  return "";
}

//===--- --init-from ------------------------------------------------------===//

namespace {

/// Our name's candidates in the file: ours, then Hugging Face GPT-2's
/// (GPT2LMHeadModel's state dict prefixes the model's names with
/// "transformer."; our export names are GPT2Model's).
std::vector<std::string> init_names(const std::string &name) {
  return {name, "transformer." + name, "model." + name};
}

} // namespace

std::string check_init_from(Context *ctx, const std::string &path,
                            InitFile &init) {
  std::string ioerr;
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    return "--init-from: cannot open '" + path + "': " + std::strerror(errno);
  struct stat st;
  if (::fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fclose(f);
    return "--init-from: '" + path + "' is not a regular file";
  }
  init.size = (int64_t)st.st_size;
  char len[8] = {0};
  size_t got = std::fread(len, 1, 8, f);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= (uint64_t)(unsigned char)len[i] << (8 * i);
  std::string head(len, got);
  if (got == 8 && n <= (uint64_t)init.size - 8 && n < (1ull << 30)) {
    head.resize(8 + (size_t)n);
    if (std::fread(&head[8], 1, (size_t)n, f) != n)
      head.resize(8);
  }
  std::fclose(f);
  std::string error;
  if (got == 8 && n <= (uint64_t)init.size - 8 && head.size() != 8 + n)
    error =
        path + ": cannot read its header of " + std::to_string(n) + " bytes";
  else
    error = parse_safetensors_header(path, head.data(),
                                     got < 8 ? (int64_t)got : init.size,
                                     init.header, init.data_start);
  if (!error.empty())
    return "--init-from: " + error;
  std::vector<std::string> problems;
  std::map<std::string, bool> used;
  std::deque<ParamDesc> keep;
  size_t num_params = ctx->params.size(), index = 0;
  for (ParamDesc *pp : model_tensors(ctx, keep)) {
    ParamDesc &p = *pp;
    const char *what = index++ < num_params ? "parameter" : "running statistic";
    std::string key;
    for (const std::string &cand : init_names(p.name))
      if (member(&init.header, cand)) {
        key = cand;
        break;
      }
    std::vector<int64_t> zero(ctx->axis_sizes.size(), 0);
    std::vector<int64_t> shape =
        global_shape(param_layout(ctx, p, zero), p.t.ndim);
    if (key.empty()) {
      problems.push_back("--init-from: " + path + ": no tensor '" + p.name +
                         "' (the model's " + what + " " + shape_list(shape) +
                         "; also looked for 'transformer." + p.name + "')");
      continue;
    }
    used[key] = true;
    StEntry e;
    error = st_entry(path, *member(&init.header, key), key, e);
    if (!error.empty()) {
      problems.push_back("--init-from: " + error);
      continue;
    }
    int64_t es = dtype_size(e.dtype);
    std::vector<int64_t> accept = shape;
    if (p.export_rows > 0 && !accept.empty() && p.export_rows < accept[0])
      accept[0] = p.export_rows; // the padded vocabulary is not in files
    if (e.shape != shape && e.shape != accept) {
      problems.push_back("--init-from: " + path + ": tensor '" + key +
                         "' has shape " + shape_list(e.shape) +
                         " but the model's " + what + " '" + p.name + "' is " +
                         shape_list(accept));
      continue;
    }
    int64_t elems = 1;
    for (int64_t d : e.shape)
      elems *= d;
    if (es == 0) {
      problems.push_back("--init-from: " + path + ": tensor '" + key +
                         "' has dtype " + e.dtype +
                         "; F32, F16 and BF16 can be loaded");
      continue;
    }
    if (e.begin < 0 || e.end - e.begin != elems * es ||
        init.data_start + e.end > init.size) {
      problems.push_back("--init-from: " + path + ": tensor '" + key +
                         "' lies outside the file (truncated? the file has " +
                         std::to_string(init.size) + " bytes)");
      continue;
    }
    init.found[p.name] = key;
  }
  for (auto &kv : init.header.items())
    if (kv.key() != "__metadata__" && !used.count(kv.key()))
      ++init.ignored;
  return first_of(problems);
}

std::string load_init_from(Context *ctx, const std::string &path,
                           const InitFile &init) {
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    return "--init-from: cannot open '" + path + "': " + std::strerror(errno);
  std::unique_ptr<FILE, int (*)(FILE *)> closer(f, std::fclose);
  std::deque<ParamDesc> keep;
  ctx->copies_stale = true; // parameters' 16-bit copies: rounded again
  for (ParamDesc *pp : model_tensors(ctx, keep)) {
    ParamDesc &p = *pp;
    if (!p.t.data)
      continue; // another pipeline rank's stage
    const std::string &key = init.found.at(p.name);
    StEntry e;
    st_entry(path, *member(&init.header, key), key, e);
    int64_t es = dtype_size(e.dtype), elems = (e.end - e.begin) / es;
    std::vector<char> raw((size_t)(e.end - e.begin));
    if (std::fseek(f, (long)(init.data_start + e.begin), SEEK_SET) != 0 ||
        std::fread(raw.data(), 1, raw.size(), f) != raw.size())
      return "--init-from: " + path + ": cannot read tensor '" + key +
             "' (truncated?)";
    std::vector<float> whole((size_t)elems);
    to_f32(e.dtype, raw.data(), elems, whole.data());
    ParamLayout l = param_layout(ctx, p, ctx->coords);
    std::vector<float> local = to_host(ctx, &p.t); // keeps padding rows
    int64_t row_elems = 1;
    for (int d = 1; d < p.t.ndim; ++d)
      row_elems *= l.global[d];
    int64_t rows = p.t.ndim > 0 ? elems / std::max<int64_t>(1, row_elems) : 1;
    for (int64_t i = 0; i < p.t.numel(); ++i) {
      int64_t g = l.global_flat(p.t.shape, i);
      if (p.t.ndim == 0 || g / row_elems < rows)
        local[(size_t)i] = whole[(size_t)g];
    }
    from_host(ctx, &p.t, local);
  }
  return "";
}

} // namespace ckpt
} // namespace internal
} // namespace planrt
