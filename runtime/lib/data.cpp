//===- data.cpp - Deterministic init, synthetic data, safetensors ---------===//
//
// All random values are counter-based: a value is a pure function of (seed,
// stream, coordinates), so it does not depend on how the work is split over
// ranks. The hash is a chain of splitmix64 finalizers.
//===----------------------------------------------------------------------===//

#include "context.h"
#include "planrt/internal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include <nlohmann/json.hpp>

namespace planrt {
namespace {

enum Stream : uint64_t {
  kStreamParam = 0x7061726d,   // "parm"
  kStreamData = 0x64617461,    // "data"
  kStreamTeacher = 0x74636872, // "tchr"
  kStreamClass = 0x636c6173,   // "clas"
  kStreamEval = 0x6576616c,    // "eval": held-out samples, never trained on
};

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_seq(std::initializer_list<uint64_t> values) {
  uint64_t h = 0x6a09e667f3bcc909ull;
  for (uint64_t v : values)
    h = splitmix64(h ^ v);
  return h;
}

/// Uniform in [0, 1) with 53 random bits.
double unit_double(uint64_t h) { return (double)(h >> 11) * 0x1.0p-53; }

/// Standard normal from two independent hashes (Box-Muller).
double normal_from(uint64_t h1, uint64_t h2) {
  double u1 = ((double)(h1 >> 11) + 1.0) * 0x1.0p-53; // (0, 1]
  double u2 = unit_double(h2);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

} // namespace

namespace internal {

uint64_t name_hash(const char *name) {
  // FNV-1a, 64 bit.
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)name; *p; ++p) {
    h ^= *p;
    h *= 0x100000001b3ull;
  }
  return h;
}

float init_value(int64_t seed, const char *param_name, int64_t global_index,
                 int64_t init_kind, float a, float b) {
  return init_value_hashed(seed, name_hash(param_name), global_index, init_kind,
                           a, b);
}

float init_value_hashed(int64_t seed, uint64_t param_name_hash,
                        int64_t global_index, int64_t init_kind, float a,
                        float b) {
  switch (init_kind) {
  case InitZeros:
    return 0.0f;
  case InitOnes:
    return 1.0f;
  case InitNormal: {
    uint64_t base = hash_seq({(uint64_t)seed, kStreamParam, param_name_hash,
                              (uint64_t)global_index});
    double z = normal_from(splitmix64(base ^ 1), splitmix64(base ^ 2));
    return (float)((double)a + (double)b * z);
  }
  case InitUniform: {
    uint64_t h = hash_seq({(uint64_t)seed, kStreamParam, param_name_hash,
                           (uint64_t)global_index});
    double u = unit_double(h);
    return (float)((double)a + ((double)b - (double)a) * u);
  }
  default:
    fatal("unknown init kind %lld", (long long)init_kind);
  }
}

void synthetic_inputs(int64_t seed, int64_t step, int64_t input_index,
                      int64_t row0, int64_t rows, int64_t cols, float *out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      uint64_t h =
          hash_seq({(uint64_t)seed, kStreamData, (uint64_t)step,
                    (uint64_t)input_index, (uint64_t)(row0 + r), (uint64_t)j});
      // 24 random bits: exactly representable, uniform in [-1, 1).
      out[r * cols + j] = -1.0f + 2.0f * ((float)(h >> 40) * 0x1.0p-24f);
    }
}

static void teacher_matrix(int64_t seed, int64_t in_cols, int64_t out_cols,
                           std::vector<double> &a) {
  a.resize((size_t)(in_cols * out_cols));
  double inv = 1.0 / std::sqrt((double)in_cols);
  for (int64_t k = 0; k < out_cols; ++k)
    for (int64_t j = 0; j < in_cols; ++j) {
      uint64_t base =
          hash_seq({(uint64_t)seed, kStreamTeacher, (uint64_t)k, (uint64_t)j});
      a[k * in_cols + j] =
          normal_from(splitmix64(base ^ 1), splitmix64(base ^ 2)) * inv;
    }
}

static void labels_with(const std::vector<double> &a, const float *x,
                        int64_t rows, int64_t in_cols, int64_t out_cols,
                        float *y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * in_cols;
    for (int64_t k = 0; k < out_cols; ++k) {
      const double *ak = a.data() + k * in_cols;
      double s = 0.0;
      for (int64_t j = 0; j < in_cols; ++j)
        s += ak[j] * (double)xr[j];
      y[r * out_cols + k] =
          (float)(std::tanh(s) + 0.1 * std::sin(3.0 * xr[k % in_cols]));
    }
  }
}

void synthetic_labels(int64_t seed, const float *x, int64_t rows,
                      int64_t in_cols, int64_t out_cols, float *y) {
  std::vector<double> a;
  teacher_matrix(seed, in_cols, out_cols, a);
  labels_with(a, x, rows, in_cols, out_cols, y);
}

} // namespace internal

DataPair data_pair(Context *ctx) {
  DataPair d;
  for (size_t i = 0; i < ctx->inputs.size(); ++i) {
    if (ctx->inputs[i].role == RoleInput) {
      d.x = &ctx->inputs[i];
      d.x_index = (int64_t)i;
    } else {
      d.y = &ctx->inputs[i];
    }
  }
  d.rows = d.x->t.shape[0];
  d.global_rows = d.rows * batch_ranks(ctx, *d.x);
  d.run_rows = std::max<int64_t>(1, d.rows / d.x->chunks);
  for (int64_t c = 0; c < d.x->chunks; ++c)
    d.run_row0.push_back(batch_run_row0(ctx, *d.x, c));
  return d;
}

void upload_staging(Context *ctx, const DataPair &d) {
  backend::to_device(ctx, d.x->t.data, d.x->staging.data(),
                     d.x->staging.size() * sizeof(float));
  backend::to_device(ctx, d.y->t.data, d.y->staging.data(),
                     d.y->staging.size() * sizeof(float));
}

/// Fills the staging buffers of the data_kind 0 input and label for `step`
/// (rows of this rank only) and copies them to the device.
void fill_synthetic(Context *ctx, int64_t step) {
  DataPair d = data_pair(ctx);
  InputDesc *x = d.x, *y = d.y;
  int64_t x_index = d.x_index;
  int64_t rows = d.rows, in_cols = x->t.shape[1];
  int64_t out_cols = y->t.shape[1];
  if (ctx->teacher_in != in_cols || ctx->teacher_out != out_cols) {
    internal::teacher_matrix(ctx->seed, in_cols, out_cols, ctx->teacher);
    ctx->teacher_in = in_cols;
    ctx->teacher_out = out_cols;
  }
  x->staging.resize((size_t)(rows * in_cols));
  y->staging.resize((size_t)(rows * out_cols));
  for (size_t c = 0; c < d.run_row0.size(); ++c)
    internal::synthetic_inputs(ctx->seed, step, x_index, d.run_row0[c],
                               std::min(d.run_rows, rows), in_cols,
                               x->staging.data() + c * d.run_rows * in_cols);
  internal::labels_with(ctx->teacher, x->staging.data(), rows, in_cols,
                        out_cols, y->staging.data());
  upload_staging(ctx, d);
}

namespace {
/// One oriented grating of a class pattern.
struct Grating {
  double freq, cos_t, sin_t;
  std::vector<double> weight; // per channel
};

/// Class k's two gratings: a function of the seed only.
std::vector<Grating> class_pattern(int64_t seed, int64_t k, int64_t channels) {
  std::vector<Grating> g(2);
  for (int64_t i = 0; i < 2; ++i) {
    auto u = [&](uint64_t what) {
      return unit_double(hash_seq(
          {(uint64_t)seed, kStreamClass, (uint64_t)k, (uint64_t)i, what}));
    };
    double theta = 3.141592653589793 * u(0);
    g[i].freq = 1.0 + 2.0 * u(1); // 1..3 periods across the image
    g[i].cos_t = std::cos(theta);
    g[i].sin_t = std::sin(theta);
    for (int64_t c = 0; c < channels; ++c)
      g[i].weight.push_back(-1.0 + 2.0 * u(2 + (uint64_t)c));
  }
  return g;
}
} // namespace

void fill_synthetic_images(Context *ctx, int64_t step, bool eval) {
  DataPair d = data_pair(ctx);
  InputDesc *x = d.x, *y = d.y;
  int64_t x_index = d.x_index;
  // [rows, C, H, W]; lower ranks are [rows, H, W] or [rows, W] with C = 1.
  const Tensor &t = x->t;
  int64_t rows = d.rows;
  int64_t ch = t.ndim == 4 ? t.shape[1] : 1;
  int64_t h = t.ndim >= 3 ? t.shape[t.ndim - 2] : 1;
  int64_t w = t.shape[t.ndim - 1];
  int64_t per_row = ch * h * w;
  x->staging.resize((size_t)(rows * per_row));
  y->staging.resize((size_t)rows);
  std::vector<std::vector<Grating>> patterns((size_t)ctx->classes);
  float *ids_as_float = y->staging.data();
  for (int64_t r = 0; r < rows; ++r) {
    uint64_t g = (uint64_t)d.global(r);
    uint64_t base =
        hash_seq({(uint64_t)ctx->seed, eval ? kStreamEval : kStreamData,
                  (uint64_t)step, (uint64_t)x_index, g});
    int64_t k = (int64_t)(splitmix64(base ^ 0x6b) % (uint64_t)ctx->classes);
    std::vector<Grating> &pat = patterns[(size_t)k];
    if (pat.empty())
      pat = class_pattern(ctx->seed, k, ch);
    double shift[2] = {6.283185307179586 * unit_double(splitmix64(base ^ 1)),
                       6.283185307179586 * unit_double(splitmix64(base ^ 2))};
    float *out = x->staging.data() + r * per_row;
    for (int64_t c = 0; c < ch; ++c)
      for (int64_t i = 0; i < h; ++i)
        for (int64_t j = 0; j < w; ++j) {
          double v = 0.0;
          for (int q = 0; q < 2; ++q) {
            double pos = pat[q].cos_t * (double)i / (double)h +
                         pat[q].sin_t * (double)j / (double)w;
            v += pat[q].weight[(size_t)c] *
                 std::sin(6.283185307179586 * pat[q].freq * pos + shift[q]);
          }
          uint64_t nh = hash_seq({base, (uint64_t)c, (uint64_t)i, (uint64_t)j});
          v += -0.5 + unit_double(nh);
          out[(c * h + i) * w + j] = (float)v;
        }
    int32_t id = (int32_t)k;
    std::memcpy(ids_as_float + r, &id, sizeof(id));
  }
  upload_staging(ctx, d);
}

//===--- safetensors ------------------------------------------------------===//

std::string internal::json_quote(const std::string &s) {
  // nlohmann escapes; a string that is not UTF-8 (a path) gets U+FFFD
  // instead of an exception.
  return nlohmann::json(s).dump(-1, ' ', false,
                                nlohmann::json::error_handler_t::replace);
}

namespace {
/// The temporary file being written, removed if the process is interrupted
/// (SIGINT, SIGTERM, SIGHUP, SIGXFSZ) while it is.
char g_tmp_path[4096];
struct sigaction g_old_actions[4];
const int kCleanupSignals[4] = {SIGINT, SIGTERM, SIGHUP, SIGXFSZ};

void remove_tmp_and_reraise(int sig) {
  if (g_tmp_path[0])
    ::unlink(g_tmp_path);
  for (int i = 0; i < 4; ++i)
    if (kCleanupSignals[i] == sig)
      sigaction(sig, &g_old_actions[i], nullptr);
  raise(sig);
}

/// Registers `path` for removal on those signals ("" unregisters).
void remove_on_signal(const std::string &path) {
  if (path.empty()) {
    if (!g_tmp_path[0])
      return;
    for (int i = 0; i < 4; ++i)
      sigaction(kCleanupSignals[i], &g_old_actions[i], nullptr);
    g_tmp_path[0] = 0;
    return;
  }
  std::snprintf(g_tmp_path, sizeof(g_tmp_path), "%s", path.c_str());
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = remove_tmp_and_reraise;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 4; ++i) {
    sigaction(kCleanupSignals[i], nullptr, &g_old_actions[i]);
    // Only where the signal would end the process: an ignored signal stays
    // ignored (SIGXFSZ: the write fails with EFBIG), and a handler the
    // program installed (SIGTERM during training: stop after the step and
    // write a checkpoint) stays in place, so the write completes.
    if (g_old_actions[i].sa_handler == SIG_DFL &&
        !(g_old_actions[i].sa_flags & SA_SIGINFO))
      sigaction(kCleanupSignals[i], &sa, nullptr);
  }
}
} // namespace

std::string internal::safetensors_header(
    const std::vector<NamedTensor> &tensors,
    const std::vector<std::pair<std::string, std::string>> &metadata) {
  // ordered_json: "__metadata__" first, then the tensors in data order.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto &kv : metadata)
      meta[kv.first] = kv.second;
    h["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const NamedTensor &t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape)
      n *= (uint64_t)d;
    uint64_t bytes = n * (t.bf16 ? 2 : sizeof(float));
    h[t.name] = nlohmann::ordered_json::object(
        {{"dtype", t.bf16 ? "BF16" : "F32"},
         {"shape", t.shape},
         {"data_offsets",
          nlohmann::ordered_json::array({offset, offset + bytes})}});
    offset += bytes;
  }
  std::string header =
      h.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  while (header.size() % 8)
    header += ' ';
  std::string out(8, '\0');
  uint64_t hl = header.size();
  for (int i = 0; i < 8; ++i)
    out[i] = (char)(unsigned char)(hl >> (8 * i)); // little-endian
  return out + header;
}

std::vector<internal::FilePart>
internal::safetensors_parts(const std::string &header,
                            const std::vector<NamedTensor> &tensors) {
  std::vector<FilePart> parts{{header.data(), header.size()}};
  for (const NamedTensor &t : tensors) {
    size_t n = 1;
    for (int64_t d : t.shape)
      n *= (size_t)d;
    // fp32 data is written as is: this runtime only targets little-endian
    // machines (x86-64, aarch64).
    if (n && t.bf16)
      parts.push_back({t.bf16, n * 2});
    else if (n)
      parts.push_back({t.data, n * sizeof(float)});
  }
  return parts;
}

std::string internal::try_write_safetensors(
    const std::string &path, const std::vector<NamedTensor> &tensors,
    const std::vector<std::pair<std::string, std::string>> &metadata) {
  std::string header = safetensors_header(tensors, metadata);
  return try_write_file(path, safetensors_parts(header, tensors));
}

std::string internal::try_write_file(const std::string &path,
                                     const std::vector<FilePart> &parts) {
  // Written to a temporary file in the target's directory, synced, then
  // renamed over the target: a run killed mid-write, a full disk or any
  // other error leaves the previous file (if any) untouched. A target that
  // exists and is not a regular file (/dev/null, a FIFO) is written in place.
  struct stat st;
  bool in_place = ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode) &&
                  !S_ISDIR(st.st_mode);
  std::string tmp;
  FILE *f = nullptr;
  if (in_place) {
    f = std::fopen(path.c_str(), "wb");
    if (!f)
      return "cannot open '" + path + "' for writing: " + std::strerror(errno);
  } else {
    size_t slash = path.rfind('/');
    std::string dir =
        slash == std::string::npos ? "" : path.substr(0, slash + 1);
    std::string base =
        slash == std::string::npos ? path : path.substr(slash + 1);
    tmp = dir + "." + base + ".tmp-XXXXXX";
    std::vector<char> name(tmp.begin(), tmp.end());
    name.push_back('\0');
    int fd = mkstemp(name.data());
    if (fd < 0)
      return "cannot write '" + path + "': cannot create a temporary file in " +
             (dir.empty() ? std::string("the current directory")
                          : "'" + dir + "'") +
             ": " + std::strerror(errno);
    tmp = name.data();
    remove_on_signal(tmp);
    mode_t mask = umask(0);
    umask(mask);
    fchmod(fd, 0666 & ~mask); // mkstemp creates 0600
    f = fdopen(fd, "wb");
    if (!f) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      remove_on_signal("");
      return "cannot write '" + path + "': " + std::strerror(e);
    }
  }
  errno = 0;
  bool ok = true;
  for (const FilePart &part : parts)
    if (ok && part.bytes)
      ok = std::fwrite(part.data, 1, part.bytes, f) == part.bytes;
  if (ok)
    ok = std::fflush(f) == 0;
  if (ok && !in_place)
    ok = ::fsync(fileno(f)) == 0;
  int e = ok ? 0 : (errno ? errno : EIO);
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    e = errno ? errno : EIO;
  }
  if (ok && !in_place && std::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    e = errno;
  }
  if (!ok) {
    if (!in_place)
      ::unlink(tmp.c_str());
    remove_on_signal("");
    return "cannot write '" + path + "': " + std::strerror(e) +
           (in_place ? "" : "; the previous file, if any, is unchanged");
  }
  remove_on_signal("");
  if (!in_place) { // make the rename itself durable
    size_t slash = path.rfind('/');
    std::string dir =
        slash == std::string::npos ? "." : path.substr(0, slash + 1);
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  return "";
}

void internal::write_safetensors(const std::string &path,
                                 const std::vector<NamedTensor> &tensors) {
  std::string error = try_write_safetensors(path, tensors);
  if (!error.empty())
    fatal("%s", error.c_str());
}

std::string internal::check_output_path(const std::string &path) {
  if (path.empty())
    return "the path is empty";
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      return "'" + path + "' is a directory; name a file";
    if (!S_ISREG(st.st_mode)) // a device or FIFO: written in place
      return ::access(path.c_str(), W_OK) == 0
                 ? ""
                 : "cannot write '" + path + "': " + std::strerror(errno);
  } else if (path.back() == '/') {
    return "'" + path + "' names a directory; name a file";
  }
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "."
                    : slash == 0               ? "/"
                                               : path.substr(0, slash);
  if (::stat(dir.c_str(), &st) != 0)
    return errno == ENOTDIR ? "cannot write '" + path + "': a parent of '" +
                                  dir + "' is not a directory"
                            : "cannot write '" + path + "': the directory '" +
                                  dir + "' does not exist (" +
                                  std::strerror(errno) + "); create it first";
  if (!S_ISDIR(st.st_mode))
    return "cannot write '" + path + "': '" + dir + "' is not a directory";
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return "cannot write '" + path + "': the directory '" + dir +
           "' is not writable (" + std::strerror(errno) + ")";
  return "";
}

} // namespace planrt
