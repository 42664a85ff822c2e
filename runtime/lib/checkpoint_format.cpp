//===- checkpoint_format.cpp - manifest.json, shard headers, hashes -------===//
//
// What a checkpoint's files say: manifest.json (written by rank 0 last,
// read and checked before any tensor is loaded), the safetensors headers of
// the shard files and of --init-from files, the dtypes they may hold, the
// hashes of the plan and of the model, and the files' crc32.
// docs/checkpoints.md describes the format.
//===----------------------------------------------------------------------===//

#include "checkpoint_impl.h"
#include "planrt/dtype.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <zlib.h>

namespace planrt {
namespace internal {
namespace ckpt {

//===--- Small utilities --------------------------------------------------===//

std::string hex(uint64_t v, int digits) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%0*llx", digits, (unsigned long long)v);
  return buf;
}

std::string shape_list(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

/// Written JSON keeps its members' order.
using OJson = nlohmann::ordered_json;

/// Compact text (no spaces); a string that is not UTF-8 (a path) gets
/// U+FFFD instead of an exception.
std::string dump_json(const OJson &v) {
  return v.dump(-1, ' ', false, OJson::error_handler_t::replace);
}

uint64_t fnv1a(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

/// A float as the JSON number of its "%.9g" text: enough digits to read
/// back the same float (the closing line of a run resumed at its last step
/// prints the loss), printed as 4.88741493 rather than as the double's 17
/// digits. Not finite: null.
OJson float_json(float v) {
  if (!std::isfinite(v))
    return nullptr;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", (double)v);
  return std::strtod(buf, nullptr);
}

OJson ranges_json(const Ranges &rs) {
  OJson out = OJson::array();
  for (const auto &dim : rs) {
    OJson d = OJson::array();
    for (const auto &r : dim)
      d.push_back(OJson::array({r.first, r.second}));
    out.push_back(std::move(d));
  }
  return out;
}

/// manifest.json's text: each top-level member, and each entry of a list
/// of objects ("files", "tensors"), on a line of its own as nlohmann's
/// compact dump, so that the file reads, greps and diffs by tensor.
std::string manifest_text(const OJson &m) {
  std::string out = "{\n";
  size_t i = 0;
  for (auto it = m.begin(); it != m.end(); ++it) {
    const OJson &v = it.value();
    out += "  " + dump_json(OJson(it.key())) + ":";
    if (v.is_array() && !v.empty() && v.front().is_object()) {
      out += "[\n";
      for (size_t k = 0; k < v.size(); ++k)
        out += "    " + dump_json(v[k]) + (k + 1 < v.size() ? ",\n" : "\n");
      out += "  ]";
    } else {
      out += dump_json(v);
    }
    out += ++i < m.size() ? ",\n" : "\n";
  }
  return out + "}\n";
}

} // namespace

//===--- Hashes -----------------------------------------------------------===//

std::string model_hash(Context *ctx) {
  std::string s;
  std::vector<int64_t> zero(ctx->axis_sizes.size(), 0);
  for (const TensorRef &r : tensor_refs(ctx)) {
    ParamLayout l = param_layout(ctx, r.layout_desc, zero);
    s += r.key() + shape_list(global_shape(l, r.t->ndim)) + ";";
  }
  return hex(fnv1a(s), 16);
}

//===--- Writing ----------------------------------------------------------===//

std::string manifest_json(Context *ctx, int64_t step,
                          const std::vector<FileInfo> &files) {
  OJson m = OJson::object();
  m["format"] = "planrt-checkpoint";
  m["version"] = 1;
  m["program"] = ctx->program;
  m["plan_hash"] = plan_hash(ctx);
  m["model_hash"] = model_hash(ctx);
  m["step"] = step;
  OJson axes = OJson::array();
  for (size_t a = 0; a < ctx->axis_names.size(); ++a)
    axes.push_back(OJson::object(
        {{"name", ctx->axis_names[a]}, {"size", ctx->axis_sizes[a]}}));
  OJson mesh =
      OJson::object({{"axes", std::move(axes)}, {"world", ctx->world}});
  if (ctx->pipeline_axis >= 0)
    mesh["pipeline"] =
        OJson::object({{"axis", ctx->axis_names[(size_t)ctx->pipeline_axis]},
                       {"stages", ctx->pipeline_stages}});
  m["mesh"] = std::move(mesh);
  // The training position: everything else is a pure function of (seed,
  // step): data windows, synthetic data, initialization. There is no other
  // RNG state.
  OJson training = OJson::object(
      {{"step", step},
       {"next_step", step + 1},
       {"seed", ctx->seed},
       {"global_batch", ctx->global_batch},
       {"loss", float_json(ctx->final_loss)},
       {"rng", "counter-based: values are functions of (seed, step, index); "
               "no state"}});
  training["lr_schedule"] = OJson::object(
      {{"kind", !ctx->lr_schedule_set      ? "constant"
                : ctx->lr_kind == LrCosine ? "cosine"
                                           : "constant"},
       {"warmup_steps", ctx->lr_warmup},
       {"decay_steps", ctx->lr_decay > 0 ? ctx->lr_decay : ctx->run_steps},
       {"run_steps", ctx->run_steps}});
  // Dynamic loss scaling: the scale for the next step and its counters
  // (skipped steps also count in AdamW's bias correction).
  if (ctx->dynamic_loss_scale)
    training["loss_scale"] =
        OJson::object({{"scale", float_json(ctx->loss_scale)},
                       {"clean_steps", ctx->loss_scale_clean},
                       {"skipped_steps", ctx->loss_scale_skipped}});
  if (ctx->data_kind == DataTokenShards && ctx->tokens_open) {
    int64_t seq = 0;
    for (const InputDesc &in : ctx->inputs)
      if (in.role == RoleInput && in.t.ndim == 2)
        seq = in.t.shape[1];
    int64_t per_step = ctx->global_batch * seq, total = ctx->tokens.total;
    int64_t epoch = 0;
    if (per_step > 0 && total >= per_step + 1) {
      int64_t room = std::min<int64_t>(seq, total - 1 - per_step);
      int64_t per_epoch = (total - 1 - room) / per_step;
      epoch = step / per_epoch; // of step + 1
    }
    training["data"] = OJson::object(
        {{"kind", "tokens"},
         {"pattern", ctx->tokens.pattern},
         {"tokens", total},
         {"seq", seq},
         {"next_position",
          token_step_position(total, ctx->global_batch, seq, step + 1)},
         {"next_epoch", epoch}});
  } else {
    training["data"] = OJson::object({{"kind", "synthetic"}});
  }
  m["training"] = std::move(training);
  OJson list = OJson::array();
  for (size_t r = 0; r < files.size(); ++r)
    if (files[r].wrote)
      list.push_back(
          OJson::object({{"file", rank_file_name((int64_t)r)},
                         {"rank", (int64_t)r},
                         {"bytes", files[r].bytes},
                         {"crc32", hex((uint32_t)files[r].crc, 8)}}));
  m["files"] = std::move(list);
  OJson tensors = OJson::array();
  for (const TensorRef &r : tensor_refs(ctx)) {
    int nd = r.t->ndim;
    std::vector<int64_t> zero(ctx->axis_sizes.size(), 0);
    ParamLayout l0 = param_layout(ctx, r.layout_desc, zero);
    OJson t = OJson::object({{"name", r.name},
                             {"kind", r.kind},
                             {"dtype", "F32"},
                             {"shape", global_shape(l0, nd)},
                             {"stage", r.stage}});
    if (r.export_rows > 0)
      t["export_rows"] = r.export_rows;
    OJson shards = OJson::array();
    for (int64_t rank = 0; rank < ctx->world; ++rank) {
      std::vector<int64_t> c = rank_coords(ctx, rank);
      if (!writes(ctx, r, c))
        continue;
      ParamLayout l = param_layout(ctx, r.layout_desc, c);
      shards.push_back(
          OJson::object({{"file", rank_file_name(rank)},
                         {"ranges", ranges_json(ranges_of(l, nd))}}));
    }
    t["shards"] = std::move(shards);
    tensors.push_back(std::move(t));
  }
  m["tensors"] = std::move(tensors);
  return manifest_text(m);
}

//===--- Reading ----------------------------------------------------------===//

std::string parse_json(const char *begin, const char *end, Json &out) {
  // nlohmann reports what it could not parse with an exception (the
  // runtime is compiled with exceptions); none leaves this function.
  auto words = [](const char *what) {
    // Without the "[json.exception.parse_error.101] " prefix.
    const char *text = std::strstr(what, "] ");
    return std::string(text ? text + 2 : what);
  };
  try {
    out = Json::parse(begin, end);
    return "";
  } catch (const Json::parse_error &e) {
    // Its byte is one past the input when the input ended first.
    if (e.byte > (size_t)(end - begin))
      return "truncated JSON";
    return words(e.what());
  } catch (const Json::exception &e) { // a number out of range
    return words(e.what());
  }
}

const Json *member(const Json *j, const std::string &key) {
  if (!j || !j->is_object())
    return nullptr;
  auto it = j->find(key);
  return it == j->end() ? nullptr : &*it;
}

const std::string *string_of(const Json *j) {
  return j && j->is_string() ? j->get_ptr<const std::string *>() : nullptr;
}

bool get_int(const Json *j, int64_t &out) {
  if (!j || !j->is_number_integer())
    return false;
  if (j->is_number_unsigned() &&
      j->get<uint64_t>() > (uint64_t)std::numeric_limits<int64_t>::max())
    return false;
  out = j->get<int64_t>();
  return true;
}

/// Parses and checks manifest.json of `dir`.
std::string read_manifest(const std::string &dir, Manifest &m) {
  std::string path = join(dir, "manifest.json");
  std::string text;
  std::string error = read_whole(path, text);
  if (!error.empty())
    return error;
  error = parse_json(text.data(), text.data() + text.size(), m.root);
  auto bad = [&](const std::string &what) {
    return path + ": " + what +
           "; the manifest is damaged (resume from another checkpoint with "
           "--resume DIR/step-NNNNNN)";
  };
  if (!error.empty())
    return bad("not valid JSON (" + error + ")");
  const Json *r = &m.root;
  const std::string *fmt = string_of(member(r, "format"));
  if (!fmt || *fmt != "planrt-checkpoint")
    return bad("not a planrt checkpoint manifest (\"format\" is not "
               "\"planrt-checkpoint\")");
  int64_t version = 0;
  if (!get_int(member(r, "version"), version) || version != 1)
    return bad("unsupported manifest version (this runtime reads version 1)");
  if (!get_int(member(r, "step"), m.step) || m.step < 0)
    return bad("no valid \"step\"");
  if (const std::string *h = string_of(member(r, "plan_hash")))
    m.plan_hash = *h;
  if (const Json *axes = member(member(r, "mesh"), "axes");
      axes && axes->is_array())
    for (const Json &a : *axes) {
      const std::string *n = string_of(member(&a, "name"));
      int64_t size = 0;
      if (n && get_int(member(&a, "size"), size))
        m.mesh +=
            (m.mesh.empty() ? "" : ", ") + *n + "=" + std::to_string(size);
    }
  if (m.mesh.empty())
    m.mesh = "one rank";
  m.training = member(r, "training");
  const Json *files = member(r, "files");
  if (!files || !files->is_array())
    return bad("no \"files\" list");
  for (const Json &f : *files) {
    const std::string *name = string_of(member(&f, "file")),
                      *crc = string_of(member(&f, "crc32"));
    int64_t bytes = 0;
    if (!name || !crc || !get_int(member(&f, "bytes"), bytes) ||
        name->find('/') != std::string::npos)
      return bad("a malformed entry in \"files\"");
    m.files[*name] = {bytes, (uint32_t)std::strtoul(crc->c_str(), nullptr, 16)};
  }
  const Json *tensors = member(r, "tensors");
  if (!tensors || !tensors->is_array())
    return bad("no \"tensors\" list");
  for (const Json &t : *tensors) {
    ManifestTensor mt;
    const std::string *name = string_of(member(&t, "name")),
                      *kind = string_of(member(&t, "kind"));
    const Json *shape = member(&t, "shape"), *shards = member(&t, "shards");
    if (!name || !kind || !shape || !shape->is_array() || shape->size() > 4 ||
        !shards || !shards->is_array())
      return bad("a malformed entry in \"tensors\"");
    mt.name = *name;
    mt.kind = *kind;
    for (const Json &d : *shape) {
      int64_t v = 0;
      if (!get_int(&d, v) || v < 0)
        return bad("tensor '" + mt.name + "': a malformed shape");
      mt.shape.push_back(v);
    }
    for (const Json &s : *shards) {
      ShardRef sr;
      const std::string *file = string_of(member(&s, "file"));
      const Json *ranges = member(&s, "ranges");
      if (!file || !m.files.count(*file) || !ranges || !ranges->is_array() ||
          ranges->size() != mt.shape.size())
        return bad("tensor '" + mt.name + "': a malformed shard entry");
      sr.file = *file;
      for (size_t d = 0; d < ranges->size(); ++d) {
        const Json &dim = (*ranges)[d];
        if (!dim.is_array())
          return bad("tensor '" + mt.name + "': malformed ranges");
        sr.ranges.emplace_back();
        int64_t len = 0;
        for (const Json &rg : dim) {
          int64_t b = 0, e = 0;
          if (!rg.is_array() || rg.size() != 2 || !get_int(&rg[0], b) ||
              !get_int(&rg[1], e) || b < 0 || e < b || e > mt.shape[d])
            return bad("tensor '" + mt.name + "': a range outside its shape");
          sr.ranges.back().push_back({b, e});
          len += e - b;
        }
        sr.local_shape.push_back(len);
      }
      mt.shards.push_back(std::move(sr));
    }
    m.tensors[mt.kind + "/" + mt.name] = std::move(mt);
  }
  return "";
}

/// Parses a safetensors header from its first bytes; `data_start` is where
/// the data begins.
std::string parse_safetensors_header(const std::string &path, const char *bytes,
                                     int64_t size, Json &header,
                                     int64_t &data_start) {
  if (size < 8)
    return path + ": truncated: " + std::to_string(size) +
           " bytes, not a safetensors file";
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
  if (n > (uint64_t)size - 8)
    return path + ": truncated or not a safetensors file (its header claims " +
           std::to_string(n) + " bytes, the file has " +
           std::to_string(size - 8) + " after the length)";
  std::string error = parse_json(bytes + 8, bytes + 8 + n, header);
  if (!error.empty() || !header.is_object())
    return path + ": not a safetensors file (its header is not a JSON object" +
           (error.empty() ? "" : ": " + error) + ")";
  data_start = 8 + (int64_t)n;
  return "";
}

std::string st_entry(const std::string &path, const Json &info,
                     const std::string &name, StEntry &e) {
  const std::string *dt = string_of(member(&info, "dtype"));
  const Json *shape = member(&info, "shape"),
             *off = member(&info, "data_offsets");
  if (!dt || !shape || !shape->is_array() || !off || !off->is_array() ||
      off->size() != 2 || !get_int(&(*off)[0], e.begin) ||
      !get_int(&(*off)[1], e.end))
    return path + ": tensor '" + name + "' has a malformed header entry";
  e.dtype = *dt;
  for (const Json &d : *shape) {
    int64_t v = 0;
    if (!get_int(&d, v) || v < 0)
      return path + ": tensor '" + name + "' has a malformed shape";
    e.shape.push_back(v);
  }
  return "";
}

int64_t dtype_size(const std::string &dt) {
  return dt == "F32" ? 4 : (dt == "F16" || dt == "BF16") ? 2 : 0;
}

namespace {

float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f,
           man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { // subnormal
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        --exp;
      }
      man &= 0x3ff;
      bits = sign | (exp << 23) | (man << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

} // namespace

/// Converts n elements of `dtype` to fp32.
void to_f32(const std::string &dtype, const char *src, int64_t n, float *out) {
  if (dtype == "F32") {
    std::memcpy(out, src, (size_t)n * 4);
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    if (dtype == "BF16") {
      out[i] = planrt::float_from_bf16(h);
    } else {
      out[i] = half_to_float(h);
    }
  }
}

} // namespace ckpt

using namespace ckpt;

// zlib's: the polynomial and the values docs/checkpoints.md promises, so
// that any tool (Python's zlib.crc32, checkpoint_tool.py) checks the files.
// crc32_z takes a size_t (crc32's length is 32-bit).
uint32_t crc32(uint32_t crc, const void *data, size_t bytes) {
  return (uint32_t)::crc32_z(crc, static_cast<const Bytef *>(data), bytes);
}

std::string plan_hash(const Context *ctx) {
  std::string s = ctx->program + "|";
  for (size_t a = 0; a < ctx->axis_names.size(); ++a)
    s += ctx->axis_names[a] + "=" + std::to_string(ctx->axis_sizes[a]) + ",";
  s += "|pp" + std::to_string(ctx->pipeline_axis) + "/" +
       std::to_string(ctx->pipeline_stages);
  auto desc = [&](const char *kind, const std::string &name, const Tensor &t,
                  const std::vector<int64_t> *axes,
                  const std::vector<int64_t> *segs, int64_t stage) {
    s += std::string("|") + kind + ":" + name + ":" + shape_str(&t) + ":";
    for (int d = 0; d < 4; ++d) {
      for (int64_t a : axes[d])
        s += std::to_string(a) + ".";
      s += "/";
      for (int64_t g : segs[d])
        s += std::to_string(g) + ".";
      s += ";";
    }
    s += std::to_string(stage);
  };
  for (const ParamDesc &p : ctx->params)
    desc("param", p.name, p.t, p.shard_axes, p.segments, p.stage);
  for (const StateDesc &st : ctx->states)
    desc("state", st.name, st.t, st.shard_axes, st.segments, st.stage);
  for (const InputDesc &in : ctx->inputs) {
    s += "|input:" + in.name + ":" + shape_str(&in.t) + ":" +
         std::to_string(in.batch_axis) + ":" + std::to_string(in.t.dtype);
    if (in.inner_axis >= 0) // absent before expert parallelism
      s += ":inner" + std::to_string(in.inner_axis) + "x" +
           std::to_string(in.chunks);
  }
  s += "|seed" + std::to_string(ctx->seed) + "|batch" +
       std::to_string(ctx->global_batch) + "|data" +
       std::to_string(ctx->data_kind) + ctx->data_path;
  return hex(fnv1a(s), 16);
}

} // namespace internal
} // namespace planrt
