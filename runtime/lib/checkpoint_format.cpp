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

std::string json_str(const std::string &s) { return internal::json_quote(s); }

//===--- JSON (manifests, safetensors headers) ----------------------------===//

class JsonParser {
public:
  JsonParser(const char *p, const char *end) : p(p), end(end) {}
  /// Parses one value followed only by whitespace; "" or the error.
  std::string parse(Json &out) {
    if (!value(out, 0))
      return err;
    ws();
    if (p != end)
      return "unexpected text after the JSON value";
    return "";
  }

private:
  const char *p, *end;
  std::string err;
  bool fail(const std::string &what) {
    if (err.empty())
      err = what;
    return false;
  }
  void ws() {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
      ++p;
  }
  /// The items of an object or array after its opening bracket (at *p):
  /// `item` parses one; they are separated by ',' and end with `close`.
  template <typename Item> bool items(char close, const char *what, Item item) {
    ++p;
    ws();
    if (p < end && *p == close) {
      ++p;
      return true;
    }
    for (;;) {
      ws();
      if (!item())
        return false;
      ws();
      if (p < end && *p == ',') {
        ++p;
        continue;
      }
      if (p < end && *p == close) {
        ++p;
        return true;
      }
      return fail(std::string("expected ',' or '") + close + "' in a JSON " +
                  what);
    }
  }

  bool value(Json &out, int depth) {
    if (depth > 64)
      return fail("JSON nested too deeply");
    ws();
    if (p >= end)
      return fail("truncated JSON");
    char c = *p;
    if (c == '{') {
      out.kind = Json::Object;
      return items('}', "object", [&] {
        std::string key;
        if (p >= end || *p != '"' || !string(key))
          return fail("expected a string key in a JSON object");
        ws();
        if (p >= end || *p != ':')
          return fail("expected ':' in a JSON object");
        ++p;
        out.obj.emplace_back(key, Json());
        return value(out.obj.back().second, depth + 1);
      });
    }
    if (c == '[') {
      out.kind = Json::Array;
      return items(']', "array", [&] {
        out.arr.emplace_back();
        return value(out.arr.back(), depth + 1);
      });
    }
    if (c == '"') {
      out.kind = Json::String;
      return string(out.str) || fail("bad JSON string");
    }
    if (literal("true")) {
      out.kind = Json::Bool;
      out.b = true;
      return true;
    }
    if (literal("false")) {
      out.kind = Json::Bool;
      return true;
    }
    if (literal("null"))
      return true;
    const char *start = p;
    if (p < end && (*p == '-' || *p == '+'))
      ++p;
    bool integer = true;
    while (p < end && ((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' ||
                       *p == 'E' || *p == '-' || *p == '+')) {
      if (*p == '.' || *p == 'e' || *p == 'E')
        integer = false;
      ++p;
    }
    if (p == start)
      return fail("unexpected character in JSON");
    std::string text(start, p);
    char *stop = nullptr;
    out.kind = Json::Number;
    out.num = std::strtod(text.c_str(), &stop);
    if (!stop || *stop)
      return fail("bad JSON number '" + text + "'");
    out.integer = integer;
    if (integer) {
      errno = 0;
      out.inum = std::strtoll(text.c_str(), &stop, 10);
      if (errno)
        return fail("JSON integer out of range '" + text + "'");
    }
    return true;
  }
  bool literal(const char *word) {
    size_t n = std::strlen(word);
    if ((size_t)(end - p) >= n && std::strncmp(p, word, n) == 0) {
      p += n;
      return true;
    }
    return false;
  }
  bool string(std::string &out) {
    ++p; // '"'
    while (p < end && *p != '"') {
      if (*p != '\\') {
        out += *p++;
        continue;
      }
      if (++p >= end)
        return false;
      char e = *p++;
      switch (e) {
      case '"':
      case '\\':
      case '/':
        out += e;
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'u': {
        if (end - p < 4)
          return false;
        unsigned v =
            (unsigned)std::strtoul(std::string(p, p + 4).c_str(), nullptr, 16);
        p += 4;
        if (v < 0x80) {
          out += (char)v;
        } else if (v < 0x800) {
          out += (char)(0xc0 | (v >> 6));
          out += (char)(0x80 | (v & 0x3f));
        } else {
          out += (char)(0xe0 | (v >> 12));
          out += (char)(0x80 | ((v >> 6) & 0x3f));
          out += (char)(0x80 | (v & 0x3f));
        }
        break;
      }
      default:
        return false;
      }
    }
    if (p >= end)
      return false;
    ++p; // '"'
    return true;
  }
};

uint64_t fnv1a(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

/// The step's loss for the manifest: enough digits to read back the same
/// float (the closing line of a run resumed at its last step prints it).
std::string loss_json(float loss) {
  if (!std::isfinite(loss))
    return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", (double)loss);
  return buf;
}

std::string ranges_json(const Ranges &rs) {
  std::string s = "[";
  for (size_t d = 0; d < rs.size(); ++d) {
    s += d ? ", [" : "[";
    for (size_t k = 0; k < rs[d].size(); ++k)
      s += (k ? ", [" : "[") + std::to_string(rs[d][k].first) + ", " +
           std::to_string(rs[d][k].second) + "]";
    s += "]";
  }
  return s + "]";
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
  std::string j = "{\n";
  j += "  \"format\": \"planrt-checkpoint\",\n  \"version\": 1,\n";
  j += "  \"program\": " + json_str(ctx->program) + ",\n";
  j += "  \"plan_hash\": " + json_str(plan_hash(ctx)) + ",\n";
  j += "  \"model_hash\": " + json_str(model_hash(ctx)) + ",\n";
  j += "  \"step\": " + std::to_string(step) + ",\n";
  j += "  \"mesh\": {\"axes\": [";
  for (size_t a = 0; a < ctx->axis_names.size(); ++a)
    j += (a ? ", " : "") + std::string("{\"name\": ") +
         json_str(ctx->axis_names[a]) +
         ", \"size\": " + std::to_string(ctx->axis_sizes[a]) + "}";
  j += "], \"world\": " + std::to_string(ctx->world);
  if (ctx->pipeline_axis >= 0)
    j += ", \"pipeline\": {\"axis\": " +
         json_str(ctx->axis_names[(size_t)ctx->pipeline_axis]) +
         ", \"stages\": " + std::to_string(ctx->pipeline_stages) + "}";
  j += "},\n";
  // The training position: everything else is a pure function of (seed,
  // step): data windows, synthetic data, initialization. There is no other
  // RNG state.
  j += "  \"training\": {\"step\": " + std::to_string(step) +
       ", \"next_step\": " + std::to_string(step + 1) +
       ", \"seed\": " + std::to_string(ctx->seed) +
       ", \"global_batch\": " + std::to_string(ctx->global_batch) +
       ", \"loss\": " + loss_json(ctx->final_loss) +
       ", \"rng\": \"counter-based: values are functions of (seed, step, "
       "index); no state\"";
  j += ", \"lr_schedule\": {\"kind\": \"" +
       std::string(!ctx->lr_schedule_set      ? "constant"
                   : ctx->lr_kind == LrCosine ? "cosine"
                                              : "constant") +
       "\", \"warmup_steps\": " + std::to_string(ctx->lr_warmup) +
       ", \"decay_steps\": " +
       std::to_string(ctx->lr_decay > 0 ? ctx->lr_decay : ctx->run_steps) +
       ", \"run_steps\": " + std::to_string(ctx->run_steps) + "}";
  // Dynamic loss scaling: the scale for the next step and its counters
  // (skipped steps also count in AdamW's bias correction).
  if (ctx->dynamic_loss_scale) {
    char scale[64];
    std::snprintf(scale, sizeof(scale), "%.9g", (double)ctx->loss_scale);
    j += std::string(", \"loss_scale\": {\"scale\": ") + scale +
         ", \"clean_steps\": " + std::to_string(ctx->loss_scale_clean) +
         ", \"skipped_steps\": " + std::to_string(ctx->loss_scale_skipped) +
         "}";
  }
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
    j += ", \"data\": {\"kind\": \"tokens\", \"pattern\": " +
         json_str(ctx->tokens.pattern) +
         ", \"tokens\": " + std::to_string(total) +
         ", \"seq\": " + std::to_string(seq) + ", \"next_position\": " +
         std::to_string(
             token_step_position(total, ctx->global_batch, seq, step + 1)) +
         ", \"next_epoch\": " + std::to_string(epoch) + "}";
  } else {
    j += ", \"data\": {\"kind\": \"synthetic\"}";
  }
  j += "},\n  \"files\": [";
  bool first = true;
  for (size_t r = 0; r < files.size(); ++r) {
    if (!files[r].wrote)
      continue;
    j += std::string(first ? "\n" : ",\n") +
         "    {\"file\": " + json_str(rank_file_name((int64_t)r)) +
         ", \"rank\": " + std::to_string(r) +
         ", \"bytes\": " + std::to_string(files[r].bytes) + ", \"crc32\": \"" +
         hex((uint32_t)files[r].crc, 8) + "\"}";
    first = false;
  }
  j += "\n  ],\n  \"tensors\": [";
  std::vector<TensorRef> refs = tensor_refs(ctx);
  for (size_t i = 0; i < refs.size(); ++i) {
    const TensorRef &r = refs[i];
    int nd = r.t->ndim;
    std::vector<int64_t> zero(ctx->axis_sizes.size(), 0);
    ParamLayout l0 = param_layout(ctx, r.layout_desc, zero);
    j += std::string(i ? ",\n" : "\n") + "    {\"name\": " + json_str(r.name) +
         ", \"kind\": \"" + r.kind + "\", \"dtype\": \"F32\", \"shape\": " +
         shape_list(global_shape(l0, nd)) +
         ", \"stage\": " + std::to_string(r.stage);
    if (r.export_rows > 0)
      j += ", \"export_rows\": " + std::to_string(r.export_rows);
    j += ", \"shards\": [";
    bool firstShard = true;
    for (int64_t rank = 0; rank < ctx->world; ++rank) {
      std::vector<int64_t> c = rank_coords(ctx, rank);
      if (!writes(ctx, r, c))
        continue;
      ParamLayout l = param_layout(ctx, r.layout_desc, c);
      j += std::string(firstShard ? "" : ", ") +
           "{\"file\": " + json_str(rank_file_name(rank)) +
           ", \"ranges\": " + ranges_json(ranges_of(l, nd)) + "}";
      firstShard = false;
    }
    j += "]}";
  }
  j += "\n  ]\n}\n";
  return j;
}

//===--- Reading ----------------------------------------------------------===//

bool get_int(const Json *j, int64_t &out) {
  if (!j || !j->is_int())
    return false;
  out = j->inum;
  return true;
}

/// Parses and checks manifest.json of `dir`.
std::string read_manifest(const std::string &dir, Manifest &m) {
  std::string path = join(dir, "manifest.json");
  std::string text;
  std::string error = read_whole(path, text);
  if (!error.empty())
    return error;
  error = JsonParser(text.data(), text.data() + text.size()).parse(m.root);
  auto bad = [&](const std::string &what) {
    return path + ": " + what +
           "; the manifest is damaged (resume from another checkpoint with "
           "--resume DIR/step-NNNNNN)";
  };
  if (!error.empty())
    return bad("not valid JSON (" + error + ")");
  const Json &r = m.root;
  const Json *fmt = r.get("format");
  if (!fmt || fmt->kind != Json::String || fmt->str != "planrt-checkpoint")
    return bad("not a planrt checkpoint manifest (\"format\" is not "
               "\"planrt-checkpoint\")");
  int64_t version = 0;
  if (!get_int(r.get("version"), version) || version != 1)
    return bad("unsupported manifest version (this runtime reads version 1)");
  if (!get_int(r.get("step"), m.step) || m.step < 0)
    return bad("no valid \"step\"");
  if (const Json *h = r.get("plan_hash"); h && h->kind == Json::String)
    m.plan_hash = h->str;
  if (const Json *mesh = r.get("mesh"))
    if (const Json *axes = mesh->get("axes"); axes && axes->kind == Json::Array)
      for (const Json &a : axes->arr) {
        const Json *n = a.get("name");
        int64_t size = 0;
        if (n && n->kind == Json::String && get_int(a.get("size"), size))
          m.mesh += (m.mesh.empty() ? "" : ", ") + n->str + "=" +
                    std::to_string(size);
      }
  if (m.mesh.empty())
    m.mesh = "one rank";
  m.training = r.get("training");
  const Json *files = r.get("files");
  if (!files || files->kind != Json::Array)
    return bad("no \"files\" list");
  for (const Json &f : files->arr) {
    const Json *name = f.get("file"), *crc = f.get("crc32");
    int64_t bytes = 0;
    if (!name || name->kind != Json::String || !crc ||
        crc->kind != Json::String || !get_int(f.get("bytes"), bytes) ||
        name->str.find('/') != std::string::npos)
      return bad("a malformed entry in \"files\"");
    m.files[name->str] = {
        bytes, (uint32_t)std::strtoul(crc->str.c_str(), nullptr, 16)};
  }
  const Json *tensors = r.get("tensors");
  if (!tensors || tensors->kind != Json::Array)
    return bad("no \"tensors\" list");
  for (const Json &t : tensors->arr) {
    ManifestTensor mt;
    const Json *name = t.get("name"), *kind = t.get("kind"),
               *shape = t.get("shape"), *shards = t.get("shards");
    if (!name || name->kind != Json::String || !kind ||
        kind->kind != Json::String || !shape || shape->kind != Json::Array ||
        shape->arr.size() > 4 || !shards || shards->kind != Json::Array)
      return bad("a malformed entry in \"tensors\"");
    mt.name = name->str;
    mt.kind = kind->str;
    for (const Json &d : shape->arr) {
      if (!d.is_int() || d.inum < 0)
        return bad("tensor '" + mt.name + "': a malformed shape");
      mt.shape.push_back(d.inum);
    }
    for (const Json &s : shards->arr) {
      ShardRef sr;
      const Json *file = s.get("file"), *ranges = s.get("ranges");
      if (!file || file->kind != Json::String || !m.files.count(file->str) ||
          !ranges || ranges->kind != Json::Array ||
          ranges->arr.size() != mt.shape.size())
        return bad("tensor '" + mt.name + "': a malformed shard entry");
      sr.file = file->str;
      for (size_t d = 0; d < ranges->arr.size(); ++d) {
        const Json &dim = ranges->arr[d];
        if (dim.kind != Json::Array)
          return bad("tensor '" + mt.name + "': malformed ranges");
        sr.ranges.emplace_back();
        int64_t len = 0;
        for (const Json &rg : dim.arr) {
          if (rg.kind != Json::Array || rg.arr.size() != 2 ||
              !rg.arr[0].is_int() || !rg.arr[1].is_int() ||
              rg.arr[0].inum < 0 || rg.arr[1].inum < rg.arr[0].inum ||
              rg.arr[1].inum > mt.shape[d])
            return bad("tensor '" + mt.name + "': a range outside its shape");
          sr.ranges.back().push_back({rg.arr[0].inum, rg.arr[1].inum});
          len += rg.arr[1].inum - rg.arr[0].inum;
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
  std::string error = JsonParser(bytes + 8, bytes + 8 + n).parse(header);
  if (!error.empty() || header.kind != Json::Object)
    return path + ": not a safetensors file (its header is not a JSON object" +
           (error.empty() ? "" : ": " + error) + ")";
  data_start = 8 + (int64_t)n;
  return "";
}

std::string st_entry(const std::string &path, const Json &info,
                     const std::string &name, StEntry &e) {
  const Json *dt = info.get("dtype"), *shape = info.get("shape"),
             *off = info.get("data_offsets");
  if (!dt || dt->kind != Json::String || !shape || shape->kind != Json::Array ||
      !off || off->kind != Json::Array || off->arr.size() != 2 ||
      !off->arr[0].is_int() || !off->arr[1].is_int())
    return path + ": tensor '" + name + "' has a malformed header entry";
  e.dtype = dt->str;
  for (const Json &d : shape->arr) {
    if (!d.is_int() || d.inum < 0)
      return path + ": tensor '" + name + "' has a malformed shape";
    e.shape.push_back(d.inum);
  }
  e.begin = off->arr[0].inum;
  e.end = off->arr[1].inum;
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
  for (const InputDesc &in : ctx->inputs)
    s += "|input:" + in.name + ":" + shape_str(&in.t) + ":" +
         std::to_string(in.batch_axis) + ":" + std::to_string(in.t.dtype);
  s += "|seed" + std::to_string(ctx->seed) + "|batch" +
       std::to_string(ctx->global_batch) + "|data" +
       std::to_string(ctx->data_kind) + ctx->data_path;
  return hex(fnv1a(s), 16);
}

} // namespace internal
} // namespace planrt
