//===- checkpoint.cpp - Checkpoints, --resume, --init-from, stop signals --===//
//
// A checkpoint is a directory DIR/step-NNNNNN/ holding one safetensors file
// per rank that holds a distinct block of some tensor (rank-RRRRR.safetensors:
// its local shards of parameters and optimizer state, as they are in
// memory) and manifest.json, written by rank 0 last, after every rank's file
// is on disk: a directory without a manifest is incomplete and ignored. The
// manifest gives every tensor's global shape and which global index ranges
// each file holds, so a run under another plan (other dp / tp / pp / ZeRO)
// reads the slices overlapping its own shards. docs/checkpoints.md
// describes the format.
//===----------------------------------------------------------------------===//

#include "checkpoint.h"
#include "planrt/dtype.h"

#include "planrt/internal.h"

#include "control.h"

#include "watchdog.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>

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

void set_checkpoint(Context *ctx, const char *dir, int64_t every) {
  if (!ctx)
    fatal("set_checkpoint: null context");
  if (!dir || !*dir)
    fatal("set_checkpoint: empty directory");
  if (every < 0)
    fatal("set_checkpoint: every must be >= 0 (0: only on SIGTERM / "
          "SIGUSR1), got %lld",
          (long long)every);
  ctx->checkpoint_dir = dir;
  ctx->checkpoint_every = every;
}

namespace internal {
namespace {

//===--- Small utilities --------------------------------------------------===//

std::string strip_slashes(std::string dir) {
  while (dir.size() > 1 && dir.back() == '/')
    dir.pop_back();
  return dir;
}

std::string join(const std::string &dir, const std::string &name) {
  if (dir.empty())
    return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%06lld", (long long)step);
  return buf;
}

std::string rank_file_name(int64_t rank) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "rank-%05lld.safetensors", (long long)rank);
  return buf;
}

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

std::string json_str(const std::string &s) { return internal::json_quote(s); }

/// mkdir -p; "" or why not.
std::string make_dirs(const std::string &dir) {
  std::string path;
  size_t at = 0;
  while (at <= dir.size()) {
    size_t slash = dir.find('/', at);
    if (slash == std::string::npos)
      slash = dir.size();
    path = dir.substr(0, slash);
    at = slash + 1;
    if (path.empty() || path == "." || path == "..")
      continue;
    if (::mkdir(path.c_str(), 0777) != 0 && errno != EEXIST)
      return "cannot create the directory '" + path +
             "': " + std::strerror(errno);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      return "'" + path + "' is not a directory";
  }
  return "";
}

void fsync_dir(const std::string &dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

bool is_regular(const std::string &path, int64_t *size = nullptr) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return false;
  if (size)
    *size = (int64_t)st.st_size;
  return true;
}

/// The whole file, or an error.
std::string read_whole(const std::string &path, std::string &out) {
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    return "cannot open '" + path + "': " + std::strerror(errno);
  out.clear();
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0)
    out.append(buf, n);
  bool bad = std::ferror(f);
  int e = errno;
  std::fclose(f);
  if (bad)
    return "cannot read '" + path + "': " + std::strerror(e);
  return "";
}

const char *signal_name(int sig) {
  return sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

bool multi(const Context *ctx) { return ctx->use_mpi && ctx->world > 1; }

/// Every rank passes its error ("" if none). If any rank has one, each
/// prints one line (its own error, or that another rank failed) and the
/// program exits with code 1. Collective.
void agree_or_exit(Context *ctx, const std::string &error, const char *what) {
  int bad = error.empty() ? 0 : 1, any = bad;
  if (multi(ctx))
    watchdog::allreduce(ctx, &bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD,
                        watchdog::group_op("the checkpoint checks", -1));
  if (!any)
    return;
  std::string who =
      multi(ctx) ? "rank " + std::to_string(ctx->rank) + ": " : std::string();
  if (bad)
    std::fprintf(stderr, "planrt: error: %s%s\n", who.c_str(), error.c_str());
  else
    std::fprintf(stderr,
                 "planrt: error: %s%s failed on another rank (see its "
                 "message)\n",
                 who.c_str(), what);
  std::fflush(stderr);
  std::fflush(stdout);
  if (ctx->use_mpi)
    MPI_Finalize();
  std::exit(1);
}

//===--- JSON (manifests, safetensors headers) ----------------------------===//

struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  bool b = false;
  double num = 0;
  int64_t inum = 0;
  bool integer = false;
  std::string str;
  std::vector<Json> arr;
  std::vector<std::pair<std::string, Json>> obj;

  const Json *get(const std::string &key) const {
    if (kind != Object)
      return nullptr;
    for (auto &kv : obj)
      if (kv.first == key)
        return &kv.second;
    return nullptr;
  }
  bool is_int() const { return kind == Number && integer; }
};

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

//===--- Tensors and their layouts ----------------------------------------===//

/// A parameter or a state tensor, with what its layout needs.
struct TensorRef {
  const char *kind; // "param" or "state"
  std::string name;
  ParamDesc layout_desc; // shard axes, segments, local shape (for layouts)
  Tensor *t;
  int64_t stage;
  int64_t export_rows;
  std::string key() const { return std::string(kind) + "/" + name; }
};

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
using Ranges = std::vector<std::vector<std::pair<int64_t, int64_t>>>;
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

//===--- Hashes -----------------------------------------------------------===//

uint64_t fnv1a(const std::string &s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string model_hash(Context *ctx) {
  std::string s;
  std::vector<int64_t> zero(ctx->axis_sizes.size(), 0);
  for (const TensorRef &r : tensor_refs(ctx)) {
    ParamLayout l = param_layout(ctx, r.layout_desc, zero);
    s += r.key() + shape_list(global_shape(l, r.t->ndim)) + ";";
  }
  return hex(fnv1a(s), 16);
}

//===--- Stop signals -----------------------------------------------------===//

volatile sig_atomic_t g_stop_signal = 0;
struct sigaction g_prev_term, g_prev_usr1;
bool g_handlers_installed = false;

void on_stop_signal(int sig) { g_stop_signal = sig; }

//===--- Writing ----------------------------------------------------------===//

/// Removes one checkpoint directory: the manifest first (a kill during the
/// removal leaves an incomplete checkpoint, never a damaged complete one),
/// then our files, then the directory. "" or why not.
std::string remove_checkpoint(const std::string &dir) {
  std::string manifest = join(dir, "manifest.json");
  if (::unlink(manifest.c_str()) != 0 && errno != ENOENT)
    return "cannot remove '" + manifest + "': " + std::strerror(errno);
  fsync_dir(dir);
  DIR *d = ::opendir(dir.c_str());
  if (!d)
    return "cannot list '" + dir + "': " + std::strerror(errno);
  std::vector<std::string> names;
  while (dirent *e = ::readdir(d)) {
    std::string n = e->d_name;
    bool ours =
        (n.rfind("rank-", 0) == 0 && n.size() > 12 &&
         n.compare(n.size() - 12, 12, ".safetensors") == 0) ||
        (n.size() > 1 && n[0] == '.' && n.find(".tmp-") != std::string::npos);
    if (ours)
      names.push_back(n);
  }
  ::closedir(d);
  for (const std::string &n : names)
    ::unlink(join(dir, n).c_str());
  if (::rmdir(dir.c_str()) != 0)
    return "cannot remove the directory '" + dir +
           "': " + std::strerror(errno) + " (files other than a checkpoint's?)";
  return "";
}

/// The step-NNNNNN directories of `root`: step -> complete (has a manifest).
std::map<int64_t, bool> list_checkpoints(const std::string &root) {
  std::map<int64_t, bool> out;
  DIR *d = ::opendir(root.c_str());
  if (!d)
    return out;
  while (dirent *e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind("step-", 0) != 0 || n.size() <= 5)
      continue;
    bool digits = true;
    for (size_t i = 5; i < n.size(); ++i)
      digits &= n[i] >= '0' && n[i] <= '9';
    if (!digits || n.size() > 5 + 12)
      continue;
    int64_t step = std::strtoll(n.c_str() + 5, nullptr, 10);
    out[step] = is_regular(join(join(root, n), "manifest.json"));
  }
  ::closedir(d);
  return out;
}

/// --keep N: removes the complete checkpoints older than the N newest and
/// incomplete ones older than the newest complete one. Rank 0. Warnings only.
void prune(Context *ctx, const std::string &root) {
  std::map<int64_t, bool> all = list_checkpoints(root);
  std::vector<int64_t> complete;
  for (auto &kv : all)
    if (kv.second)
      complete.push_back(kv.first);
  if (complete.empty())
    return;
  int64_t newest = complete.back();
  size_t keep = (size_t)ctx->checkpoint_keep;
  for (auto &kv : all) {
    bool drop = kv.second
                    ? (size_t)(std::lower_bound(complete.begin(),
                                                complete.end(), kv.first) -
                               complete.begin()) +
                              keep <
                          complete.size()
                    : kv.first < newest;
    if (!drop)
      continue;
    std::string dir = join(root, step_dir_name(kv.first));
    std::string why = remove_checkpoint(dir);
    if (!why.empty())
      std::fprintf(stderr, "planrt: warning: --keep %lld: %s\n",
                   (long long)ctx->checkpoint_keep, why.c_str());
  }
  fsync_dir(root);
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

struct FileInfo {
  int64_t wrote = 0, crc = 0, bytes = 0;
};

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

} // namespace

uint32_t crc32(uint32_t crc, const void *data, size_t bytes) {
  static uint32_t table[256];
  static bool ready = false;
  if (!ready) {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k)
        c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
      table[i] = c;
    }
    ready = true;
  }
  const unsigned char *p = (const unsigned char *)data;
  crc = ~crc;
  for (size_t i = 0; i < bytes; ++i)
    crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
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

std::string write_checkpoint(Context *ctx, int64_t step) {
  auto t0 = std::chrono::steady_clock::now();
  std::string root = strip_slashes(ctx->checkpoint_dir);
  std::string dir = join(root, step_dir_name(step));
  // Rank 0 makes the directory and removes an old manifest: from here until
  // the new manifest is renamed into place the checkpoint is incomplete.
  std::string error;
  if (ctx->rank == 0) {
    error = make_dirs(dir);
    std::string manifest = join(dir, "manifest.json");
    if (error.empty() && ::unlink(manifest.c_str()) != 0 && errno != ENOENT)
      error =
          "cannot remove the old '" + manifest + "': " + std::strerror(errno);
    if (error.empty()) {
      fsync_dir(dir);
      fsync_dir(root);
    }
    if (!error.empty())
      error = "checkpoint of step " + std::to_string(step) + ": " + error;
  }
  if (multi(ctx)) {
    int bad = error.empty() ? 0 : 1;
    watchdog::bcast(ctx, &bad, 1, MPI_INT, 0, MPI_COMM_WORLD,
                    watchdog::group_op("a checkpoint", -1));
    if (bad && ctx->rank != 0)
      error = "checkpoint of step " + std::to_string(step) +
              ": rank 0 could not prepare '" + dir + "' (see its message)";
  }
  agree_or_exit(ctx, error, "writing the checkpoint");

  // This rank's blocks: host copies in the file's order.
  std::vector<TensorRef> refs = tensor_refs(ctx);
  std::vector<std::vector<float>> host;
  std::vector<NamedTensor> named;
  host.reserve(refs.size());
  for (const TensorRef &r : refs) {
    if (!r.t->data || !writes(ctx, r, ctx->coords))
      continue;
    host.push_back(to_host(ctx, r.t));
    named.push_back(NamedTensor{
        r.key(), std::vector<int64_t>(r.t->shape, r.t->shape + r.t->ndim),
        host.back().data()});
  }
  FileInfo mine;
  if (!named.empty()) {
    std::vector<std::pair<std::string, std::string>> meta = {
        {"format", "planrt-checkpoint-shard"},
        {"step", std::to_string(step)},
        {"rank", std::to_string(ctx->rank)},
        {"plan_hash", plan_hash(ctx)}};
    std::string header = safetensors_header(named, meta);
    std::vector<FilePart> parts = safetensors_parts(header, named);
    uint32_t crc = 0;
    for (const FilePart &part : parts) {
      crc = crc32(crc, part.data, part.bytes);
      mine.bytes += (int64_t)part.bytes;
    }
    mine.crc = crc;
    mine.wrote = 1;
    std::string path = join(dir, rank_file_name(ctx->rank));
    error = try_write_file(path, parts);
    if (!error.empty())
      error = "checkpoint of step " + std::to_string(step) + ": " + error;
  }
  agree_or_exit(ctx, error, "writing the checkpoint");

  // Every file is on disk: rank 0 writes the manifest, the checkpoint is
  // complete once it is renamed into place.
  std::vector<FileInfo> files((size_t)ctx->world);
  if (multi(ctx))
    watchdog::gather(ctx, &mine, 3, MPI_INT64_T, files.data(), 0,
                     MPI_COMM_WORLD, watchdog::group_op("a checkpoint", -1));
  else
    files[0] = mine;
  if (ctx->rank == 0) {
    std::string text = manifest_json(ctx, step, files);
    error = try_write_file(join(dir, "manifest.json"),
                           {FilePart{text.data(), text.size()}});
    if (!error.empty())
      error = "checkpoint of step " + std::to_string(step) + ": " + error;
    else if (ctx->checkpoint_keep > 0)
      prune(ctx, root);
  }
  if (multi(ctx)) {
    int bad = error.empty() ? 0 : 1;
    watchdog::bcast(ctx, &bad, 1, MPI_INT, 0, MPI_COMM_WORLD,
                    watchdog::group_op("a checkpoint", -1));
    if (bad && ctx->rank != 0)
      error = "checkpoint of step " + std::to_string(step) +
              ": rank 0 could not write '" + join(dir, "manifest.json") +
              "' (see its message)";
  }
  agree_or_exit(ctx, error, "writing the checkpoint");
  if (ctx->rank == 0) {
    int64_t bytes = 0, count = 0;
    for (const FileInfo &f : files) {
      bytes += f.bytes;
      count += f.wrote;
    }
    double ms = std::chrono::duration<double, std::milli>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
    std::printf(
        "checkpoint: step %lld written to %s/ (%lld shard files, %lld B, "
        "%.0f ms)\n",
        (long long)step, dir.c_str(), (long long)count, (long long)bytes, ms);
    std::fflush(stdout);
  }
  return dir;
}

//===--- Options ----------------------------------------------------------===//

bool parse_checkpoint_option(Context *ctx, CheckpointOptions &opts,
                             OptionArg &opt) {
  const std::string &arg = opt.name;
  std::string &value = opt.value;
  if (arg == "--resume") {
    opts.resume = true;
    // The directory is optional: the next argument if it is not an option.
    if (opt.take_optional()) {
      opts.resume_dir = value;
      if (value.empty())
        opt.error = "empty directory for --resume";
    }
    return true;
  }
  if (arg == "--fresh" && !opt.has_value) {
    opts.fresh = true;
    return true;
  }
  if (arg == "--init-from") {
    if (opt.take() && value.empty())
      opt.error = "empty path for --init-from";
    opts.init_from = value;
    return true;
  }
  if (arg == "--checkpoint-dir") {
    if (opt.take() && value.empty())
      opt.error = "empty path for --checkpoint-dir";
    ctx->checkpoint_dir = value;
    opts.dir_set = true;
    return true;
  }
  if (arg == "--checkpoint-every") {
    opt.take_int(0, ctx->checkpoint_every);
    opts.every_set = true;
    return true;
  }
  if (arg == "--keep") {
    opt.take_int(1, ctx->checkpoint_keep);
    opts.keep_set = true;
    return true;
  }
  return false;
}

std::string checkpoint_usage() {
  return "  --checkpoint-dir DIR\n"
         "                     write checkpoints to DIR/step-NNNNNN/ (default: "
         "the plan's\n"
         "                     train { checkpoint = \"DIR\" }); when DIR "
         "already holds a\n"
         "                     complete checkpoint, the run continues from "
         "the newest one\n"
         "                     (the same command starts and requeues a job)\n"
         "  --checkpoint-every N\n"
         "                     a checkpoint every N steps (0: only when "
         "stopped by\n"
         "                     SIGTERM or SIGUSR1; default: checkpoint_every)\n"
         "  --keep N           keep only the N newest complete checkpoints\n"
         "  --fresh            start at step 1 even if the checkpoint "
         "directory holds\n"
         "                     checkpoints; they are moved to "
         "DIR/superseded-<time>/\n"
         "  --resume [DIR]     continue from the newest complete checkpoint "
         "in DIR (default:\n"
         "                     the checkpoint directory) or from DIR itself "
         "if it holds a\n"
         "                     manifest.json; an error if there is none. "
         "--steps N is still\n"
         "                     the last step. Works across plans (dp, tp, pp, "
         "ZeRO): each\n"
         "                     rank reads the slices it needs\n"
         "  --init-from FILE   before step 1, load the parameters from FILE "
         "(safetensors, whole\n"
         "                     tensors by name: --save's names or Hugging "
         "Face GPT-2's, e.g.\n"
         "                     transformer.h.0.attn.c_attn.weight); not read "
         "when the run\n"
         "                     continues from a checkpoint\n"
         "SIGTERM or SIGUSR1 (Slurm before preemption) stops training after "
         "the current\n"
         "step, writes a checkpoint if a checkpoint directory is set, and "
         "exits with 0.\n";
}

std::string check_checkpoint_usage(const Context *ctx,
                                   const CheckpointOptions &opts, int64_t steps,
                                   bool dump_step0) {
  (void)steps;
  if (opts.resume && opts.fresh)
    return "--resume continues from a checkpoint and --fresh starts at step "
           "1; use one";
  if (opts.resume && !opts.init_from.empty())
    return "--resume and --init-from both set the starting weights; use one";
  if (opts.resume && dump_step0)
    return "--dump-step0 writes what step 1 observed but --resume starts "
           "after a checkpoint; drop one of them";
  if (opts.resume && opts.resume_dir.empty() && ctx->checkpoint_dir.empty())
    return "--resume without a directory needs a checkpoint directory: the "
           "plan's train { checkpoint = \"DIR\" } or --checkpoint-dir DIR; or "
           "give it: --resume DIR";
  if (opts.keep_set && ctx->checkpoint_dir.empty())
    return "--keep needs a checkpoint directory (train { checkpoint = "
           "\"DIR\" } or --checkpoint-dir DIR)";
  if (opts.every_set && ctx->checkpoint_dir.empty() &&
      ctx->checkpoint_every > 0)
    return "--checkpoint-every needs a checkpoint directory (train { "
           "checkpoint = \"DIR\" } or --checkpoint-dir DIR)";
  return "";
}

//===--- Reading ----------------------------------------------------------===//

namespace {

/// One shard of a tensor in a checkpoint: its file and global ranges.
struct ShardRef {
  std::string file;
  Ranges ranges;
  std::vector<int64_t> local_shape; // per dim: sum of the range lengths
};
struct ManifestTensor {
  std::string name, kind;
  std::vector<int64_t> shape;
  std::vector<ShardRef> shards;
};
struct Manifest {
  int64_t step = 0;
  std::string plan_hash, mesh;
  std::map<std::string, std::pair<int64_t, uint32_t>> files; // bytes, crc
  std::map<std::string, ManifestTensor> tensors;             // by key
  const Json *training = nullptr;
  Json root;
};

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

/// The checkpoint --resume reads: DIR itself if it has a manifest, else its
/// newest complete step-NNNNNN.
std::string find_checkpoint(const std::string &root, std::string &dir) {
  struct stat st;
  if (::stat(root.c_str(), &st) != 0)
    return "--resume: the checkpoint directory '" + root +
           "' does not "
           "exist (" +
           std::strerror(errno) + ")";
  if (!S_ISDIR(st.st_mode))
    return "--resume: '" + root + "' is not a directory";
  if (is_regular(join(root, "manifest.json"))) {
    dir = root;
    return "";
  }
  std::map<int64_t, bool> all = list_checkpoints(root);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (it->second) {
      dir = join(root, step_dir_name(it->first));
      return "";
    }
  return "--resume: no complete checkpoint in '" + root +
         "' (a complete checkpoint is a step-NNNNNN directory with a "
         "manifest.json" +
         (all.empty() ? ""
                      : "; those present are incomplete: a run stopped "
                        "while writing them") +
         ")";
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

/// A tensor entry of a safetensors header: dtype, shape, byte range.
struct StEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
};
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

Manifest g_manifest; // the checkpoint --resume reads (prepare -> load)

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
  if (problems.empty())
    return "";
  std::string out = problems.front();
  if (problems.size() > 1)
    out += " (and " + std::to_string(problems.size() - 1) + " more problems)";
  return out;
}

/// Reads this rank's tensors from the checkpoint (after start).
std::string load_resume(Context *ctx, const std::string &dir,
                        const Manifest &m) {
  if (ctx->dynamic_loss_scale) {
    const Json *ls = m.training ? m.training->get("loss_scale") : nullptr;
    const Json *scale = ls ? ls->get("scale") : nullptr;
    int64_t clean = 0, skipped = 0;
    if (!scale || scale->kind != Json::Number || !(scale->num > 0) ||
        !get_int(ls->get("clean_steps"), clean) ||
        !get_int(ls->get("skipped_steps"), skipped) || clean < 0 ||
        skipped < 0 || skipped > m.step)
      return dir + "/manifest.json: no valid \"loss_scale\" in \"training\" "
                   "(the program scales its loss dynamically; the checkpoint "
                   "was written by a program that does not)";
    ctx->loss_scale = (float)scale->num;
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
    const Json *meta = header.get("__metadata__");
    const Json *step = meta ? meta->get("step") : nullptr;
    if (!step || step->kind != Json::String ||
        step->str != std::to_string(m.step))
      return path + ": the file belongs to another checkpoint (its step is " +
             (step && step->kind == Json::String ? step->str : "missing") +
             ", the manifest's " + std::to_string(m.step) + ")";
    for (auto &[i, shard] : uses) {
      const TensorRef &r = mine[i];
      const Json *info = header.get(r.key());
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

struct InitFile {
  Json header;
  int64_t data_start = 0, size = 0;
  std::map<std::string, std::string> found; // our name -> the file's name
  int64_t ignored = 0;
};
InitFile g_init;

/// Our name's candidates in the file: ours, then Hugging Face GPT-2's
/// (GPT2LMHeadModel's state dict prefixes the model's names with
/// "transformer."; our export names are GPT2Model's).
std::vector<std::string> init_names(const std::string &name) {
  return {name, "transformer." + name, "model." + name};
}

std::string check_init_from(Context *ctx, const std::string &path) {
  std::string ioerr;
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    return "--init-from: cannot open '" + path + "': " + std::strerror(errno);
  struct stat st;
  if (::fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fclose(f);
    return "--init-from: '" + path + "' is not a regular file";
  }
  g_init.size = (int64_t)st.st_size;
  char len[8] = {0};
  size_t got = std::fread(len, 1, 8, f);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= (uint64_t)(unsigned char)len[i] << (8 * i);
  std::string head(len, got);
  if (got == 8 && n <= (uint64_t)g_init.size - 8 && n < (1ull << 30)) {
    head.resize(8 + (size_t)n);
    if (std::fread(&head[8], 1, (size_t)n, f) != n)
      head.resize(8);
  }
  std::fclose(f);
  std::string error;
  if (got == 8 && n <= (uint64_t)g_init.size - 8 && head.size() != 8 + n)
    error =
        path + ": cannot read its header of " + std::to_string(n) + " bytes";
  else
    error = parse_safetensors_header(path, head.data(),
                                     got < 8 ? (int64_t)got : g_init.size,
                                     g_init.header, g_init.data_start);
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
      if (g_init.header.get(cand)) {
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
    error = st_entry(path, *g_init.header.get(key), key, e);
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
        g_init.data_start + e.end > g_init.size) {
      problems.push_back("--init-from: " + path + ": tensor '" + key +
                         "' lies outside the file (truncated? the file has " +
                         std::to_string(g_init.size) + " bytes)");
      continue;
    }
    g_init.found[p.name] = key;
  }
  for (auto &kv : g_init.header.obj)
    if (kv.first != "__metadata__" && !used.count(kv.first))
      ++g_init.ignored;
  if (problems.empty())
    return "";
  std::string out = problems.front();
  if (problems.size() > 1)
    out += " (and " + std::to_string(problems.size() - 1) + " more problems)";
  return out;
}

std::string load_init_from(Context *ctx, const std::string &path) {
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    return "--init-from: cannot open '" + path + "': " + std::strerror(errno);
  std::unique_ptr<FILE, int (*)(FILE *)> closer(f, std::fclose);
  std::deque<ParamDesc> keep;
  for (ParamDesc *pp : model_tensors(ctx, keep)) {
    ParamDesc &p = *pp;
    if (!p.t.data)
      continue; // another pipeline rank's stage
    const std::string &key = g_init.found.at(p.name);
    StEntry e;
    st_entry(path, *g_init.header.get(key), key, e);
    int64_t es = dtype_size(e.dtype), elems = (e.end - e.begin) / es;
    std::vector<char> raw((size_t)(e.end - e.begin));
    if (std::fseek(f, (long)(g_init.data_start + e.begin), SEEK_SET) != 0 ||
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

} // namespace

namespace {

/// --fresh: moves the step-NNNNNN directories of `root` into
/// root/superseded-YYYYmmdd-HHMMSS/, so that the new run's checkpoints are
/// the only ones a later start continues from, and nothing is deleted.
/// Rank 0. "" or why not.
std::string supersede(const std::string &root, CheckpointOptions &opts) {
  std::map<int64_t, bool> all = list_checkpoints(root);
  if (all.empty())
    return "";
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(stamp, sizeof(stamp), "superseded-%Y%m%d-%H%M%S", &tm);
  std::string to = join(root, stamp);
  for (int n = 2; ::access(to.c_str(), F_OK) == 0; ++n)
    to = join(root, std::string(stamp) + "-" + std::to_string(n));
  if (::mkdir(to.c_str(), 0777) != 0)
    return "--fresh: cannot create '" + to + "': " + std::strerror(errno);
  for (auto &kv : all) {
    std::string name = step_dir_name(kv.first);
    if (::rename(join(root, name).c_str(), join(to, name).c_str()) != 0)
      return "--fresh: cannot move '" + join(root, name) + "' to '" + to +
             "/': " + std::strerror(errno);
    opts.superseded += kv.second;
  }
  fsync_dir(to);
  fsync_dir(root);
  opts.superseded_dir = to;
  return "";
}

/// Whether every rank sees the same (min == max); collective.
bool same_on_every_rank(Context *ctx, int64_t v) {
  int64_t lo = v, hi = v;
  if (multi(ctx)) {
    watchdog::allreduce(ctx, &v, &lo, 1, MPI_INT64_T, MPI_MIN, MPI_COMM_WORLD,
                        watchdog::group_op("the checkpoint checks", -1));
    watchdog::allreduce(ctx, &v, &hi, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD,
                        watchdog::group_op("the checkpoint checks", -1));
  }
  return lo == hi;
}

} // namespace

void prepare_checkpoints(Context *ctx, CheckpointOptions &opts, int64_t steps) {
  check_layouts(ctx);
  std::string error;
  std::string root = strip_slashes(ctx->checkpoint_dir);
  // The directory checkpoints go to: created now, so that a run learns at
  // once, not at its first checkpoint, that it cannot write there.
  if (!ctx->checkpoint_dir.empty() && steps > 0) {
    error = make_dirs(root);
    if (error.empty() && ::access(root.c_str(), W_OK | X_OK) != 0)
      error = "the directory '" + root + "' is not writable (" +
              std::strerror(errno) + ")";
    if (!error.empty())
      error = "checkpoint directory: " + error;
    if (error.empty() && opts.fresh && ctx->rank == 0)
      error = supersede(root, opts);
  }
  agree_or_exit(ctx, error, "preparing the checkpoint directory");
  // Without --resume or --fresh, a complete checkpoint in the directory
  // means this is the same job started again (requeued, resubmitted): it
  // continues from the newest one (--init-from gave its step-1 weights).
  if (!opts.resume && !opts.fresh && !ctx->checkpoint_dir.empty() &&
      steps > 0) {
    std::map<int64_t, bool> all = list_checkpoints(root);
    int64_t newest = 0;
    for (auto &kv : all)
      if (kv.second)
        newest = kv.first;
      else
        ++opts.incomplete;
    if (!same_on_every_rank(ctx, newest))
      error = "the ranks see different checkpoints in '" + root +
              "'; the checkpoint directory must be one directory shared by "
              "every node";
    agree_or_exit(ctx, error, "checking the checkpoint directory");
    if (newest > 0) {
      opts.resume = opts.automatic = true;
      opts.incomplete = 0;
      if (opts.dump_step0)
        error = "--dump-step0 writes what step 1 observed, but '" + root +
                "' holds the checkpoint of step " + std::to_string(newest) +
                " and the run would continue from it; add --fresh to start "
                "at step 1";
    }
  }
  if (error.empty() && opts.resume) {
    std::string from =
        opts.automatic || opts.resume_dir.empty() ? root
                                                  : strip_slashes(
                                                        opts.resume_dir);
    error = find_checkpoint(from, opts.resume_step_dir);
    if (error.empty())
      error = read_manifest(opts.resume_step_dir, g_manifest);
    if (error.empty())
      error = check_resume(ctx, opts.resume_step_dir, g_manifest, steps);
    if (!error.empty() && opts.automatic)
      error += " (the run continues from the newest checkpoint of its "
               "checkpoint directory; --fresh starts at step 1 instead)";
  }
  if (error.empty() && !opts.init_from.empty() && !opts.resume)
    error = check_init_from(ctx, opts.init_from);
  agree_or_exit(ctx, error, "checking the checkpoint options");
  if (!opts.resume)
    return;
  // Every rank must have picked the same checkpoint.
  int64_t step = g_manifest.step;
  if (!same_on_every_rank(ctx, step))
    error = "--resume: the ranks found different newest checkpoints; is "
            "the checkpoint directory shared by all nodes?";
  agree_or_exit(ctx, error, "checking the checkpoint options");
  opts.resume_step = step;
  ctx->first_step = step + 1;
  ctx->final_step = step;
  const Json *tr = g_manifest.training;
  const Json *loss = tr ? tr->get("loss") : nullptr;
  if (loss && loss->kind == Json::Number)
    ctx->final_loss = (float)loss->num;
}

void load_checkpoints(Context *ctx, const CheckpointOptions &opts) {
  std::string error;
  auto t0 = std::chrono::steady_clock::now();
  if (opts.resume)
    error = load_resume(ctx, opts.resume_step_dir, g_manifest);
  else if (!opts.init_from.empty())
    error = load_init_from(ctx, opts.init_from);
  agree_or_exit(ctx, error, opts.resume ? "--resume" : "--init-from");
  if (ctx->use_mpi)
    backend::synchronize(ctx);
  if (ctx->rank != 0)
    return;
  double ms = std::chrono::duration<double, std::milli>(
                  std::chrono::steady_clock::now() - t0)
                  .count();
  std::string root = strip_slashes(ctx->checkpoint_dir);
  if (!opts.resume && !root.empty()) { // a fresh start, and why
    std::printf("start: step 1");
    if (opts.superseded_dir.size())
      std::printf(" (--fresh): the checkpoints of %s/ moved to %s/",
                  root.c_str(), opts.superseded_dir.c_str());
    else if (opts.fresh)
      std::printf(" (--fresh): no checkpoint in %s/", root.c_str());
    else if (opts.incomplete)
      std::printf("; no complete checkpoint in %s/ (%lld incomplete: a run "
                  "stopped while writing them)",
                  root.c_str(), (long long)opts.incomplete);
    else
      std::printf("; no checkpoint in %s/ yet", root.c_str());
    std::printf("\n");
  }
  if (!opts.resume) {
    if (!opts.init_from.empty()) {
      std::printf("init-from: %zu parameters loaded from %s",
                  g_init.found.size(), opts.init_from.c_str());
      if (g_init.ignored > 0)
        std::printf(" (%lld other tensors ignored)", (long long)g_init.ignored);
      std::printf("\n");
    }
    std::fflush(stdout);
    return;
  }
  std::string mesh;
  for (size_t a = 0; a < ctx->axis_names.size(); ++a)
    mesh += (a ? ", " : "") + ctx->axis_names[a] + "=" +
            std::to_string(ctx->axis_sizes[a]);
  if (mesh.empty())
    mesh = "one rank";
  std::printf("resume: step %lld from %s/ (%.0f ms)",
              (long long)opts.resume_step, opts.resume_step_dir.c_str(), ms);
  if (opts.automatic)
    std::printf(", the newest checkpoint of %s/%s", root.c_str(),
                opts.init_from.empty() ? "" : " (--init-from not read)");
  if (g_manifest.plan_hash != plan_hash(ctx))
    std::printf("; written under another plan (mesh %s; this run: %s), "
                "read by global slices",
                g_manifest.mesh.c_str(), mesh.c_str());
  std::printf("\n");
  std::fflush(stdout);
  // What makes the continuation differ from an uninterrupted run.
  const Json *tr = g_manifest.training;
  int64_t v = 0;
  if (tr && get_int(tr->get("seed"), v) && v != ctx->seed)
    std::fprintf(stderr,
                 "planrt: warning: resuming: the checkpoint was "
                 "trained with seed %lld, this program uses %lld: the data "
                 "from here on differs\n",
                 (long long)v, (long long)ctx->seed);
  if (tr && get_int(tr->get("global_batch"), v) && v != ctx->global_batch)
    std::fprintf(stderr,
                 "planrt: warning: resuming: the checkpoint was "
                 "trained with a global batch of %lld, this program uses "
                 "%lld\n",
                 (long long)v, (long long)ctx->global_batch);
  const Json *data = tr ? tr->get("data") : nullptr;
  if (data && ctx->tokens_open && get_int(data->get("tokens"), v) &&
      v != ctx->tokens.total)
    std::fprintf(stderr,
                 "planrt: warning: resuming: the checkpoint was "
                 "trained on %lld tokens, the data files now hold %lld: the "
                 "batches from here on differ\n",
                 (long long)v, (long long)ctx->tokens.total);
  const Json *lr = tr ? tr->get("lr_schedule") : nullptr;
  const Json *kind = lr ? lr->get("kind") : nullptr;
  if (kind && kind->kind == Json::String && kind->str == "cosine" &&
      ctx->lr_schedule_set && ctx->lr_kind == LrCosine && ctx->lr_decay <= 0 &&
      get_int(lr->get("decay_steps"), v) && v != ctx->run_steps)
    std::fprintf(stderr,
                 "planrt: warning: resuming: the cosine schedule "
                 "decayed over %lld steps (the --steps of that run) and now "
                 "decays over %lld; set decay_steps in the plan to keep it\n",
                 (long long)v, (long long)ctx->run_steps);
  std::fflush(stderr);
}

//===--- Training loop hooks ----------------------------------------------===//

void begin_training(Context *ctx) {
  (void)ctx;
  g_stop_signal = 0;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &g_prev_term);
  sigaction(SIGUSR1, &sa, &g_prev_usr1);
  g_handlers_installed = true;
}

void end_training(Context *ctx) {
  (void)ctx;
  if (!g_handlers_installed)
    return;
  sigaction(SIGTERM, &g_prev_term, nullptr);
  sigaction(SIGUSR1, &g_prev_usr1, nullptr);
  g_handlers_installed = false;
}

bool after_step(Context *ctx, int64_t step, int64_t steps) {
  int mine = g_handlers_installed ? (int)g_stop_signal : 0, any = mine;
  if (multi(ctx))
    watchdog::allreduce(ctx, &mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD,
                        watchdog::group_op("the stop-signal check", -1));
  bool due = !ctx->checkpoint_dir.empty() && ctx->checkpoint_every > 0 &&
             step % ctx->checkpoint_every == 0;
  if (!any) {
    if (due)
      write_checkpoint(ctx, step);
    return false;
  }
  ctx->stop_signal = any;
  if (!ctx->checkpoint_dir.empty()) {
    std::string dir = write_checkpoint(ctx, step);
    if (ctx->rank == 0)
      std::printf("stopped by %s after step %lld/%lld; checkpoint %s/: "
                  "the same command continues from it\n",
                  signal_name(any), (long long)step, (long long)steps,
                  dir.c_str());
  } else if (ctx->rank == 0) {
    std::printf("stopped by %s after step %lld/%lld\n", signal_name(any),
                (long long)step, (long long)steps);
    std::fprintf(stderr,
                 "planrt: warning: stopped by %s after step %lld without a "
                 "checkpoint: no checkpoint directory is set (train { "
                 "checkpoint = \"DIR\" } or --checkpoint-dir DIR)\n",
                 signal_name(any), (long long)step);
  }
  std::fflush(stdout);
  std::fflush(stderr);
  return true;
}

} // namespace internal
} // namespace planrt
