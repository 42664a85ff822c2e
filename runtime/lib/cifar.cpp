//===- cifar.cpp - CIFAR-10 binary batches as training data ---------------===//
//
// data_kind 3 (planrt.h): records of 1 class byte and 3072 pixel bytes (the
// red, green and blue 32x32 planes), as the "binary version" of CIFAR-10
// ships them. Each rank reads only its rows' records, by position, so every
// plan sees the same images in the same order.
//===----------------------------------------------------------------------===//

#include "context.h"
#include "planrt/internal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace planrt {
namespace internal {
namespace {
constexpr int64_t kSide = 32, kPlane = kSide * kSide, kRecord = 1 + 3 * kPlane;
// CIFAR-10's per-channel mean and standard deviation of p / 255.
constexpr float kMean[3] = {0.4914f, 0.4822f, 0.4465f};
constexpr float kStd[3] = {0.2470f, 0.2435f, 0.2616f};

/// Reads `n` bytes at `offset` of `path`; "" or an error message.
std::string read_at(const std::string &path, int64_t offset, unsigned char *out,
                    int64_t n) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    return path + ": cannot open: " + std::strerror(errno);
  int64_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, out + done, (size_t)(n - done), offset + done);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      std::string why = r < 0 ? std::strerror(errno) : "unexpected end of file";
      ::close(fd);
      return path + ": cannot read record bytes at offset " +
             std::to_string(offset + done) + ": " + why;
    }
    done += r;
  }
  ::close(fd);
  return "";
}
} // namespace

std::string
open_cifar_files(const std::string &pattern,
                 std::vector<std::pair<std::string, int64_t>> &files,
                 int64_t &records, const char *hint) {
  std::vector<std::string> paths;
  std::string error = glob_files(pattern, paths, hint);
  if (!error.empty())
    return error;
  files.clear();
  records = 0;
  for (const std::string &p : paths) {
    struct stat st;
    if (::stat(p.c_str(), &st) != 0)
      return p + ": cannot read: " + std::strerror(errno);
    if (!S_ISREG(st.st_mode))
      return p + ": not a regular file";
    int64_t size = (int64_t)st.st_size;
    if (size == 0 || size % kRecord != 0)
      return p + ": not a CIFAR-10 binary batch: its size, " +
             std::to_string(size) + " bytes, is not a positive multiple of " +
             std::to_string(kRecord) +
             " (records of 1 class byte and 3x32x32 pixels)";
    files.push_back({p, size / kRecord});
    records += size / kRecord;
  }
  return "";
}

std::string open_cifar(Context *ctx) {
  if (!ctx->data_path_set)
    return "(no data path): data_kind 3 (CIFAR-10) needs a glob pattern of "
           "its binary batch files; the generated plan_setup must call "
           "set_data_path";
  return open_cifar_files(ctx->data_path, ctx->cifar_files, ctx->cifar_records,
                          "download CIFAR-10's binary version "
                          "(data_batch_1.bin ... data_batch_5.bin)");
}

void fill_cifar(Context *ctx, int64_t step, bool eval) {
  const auto &files = eval ? ctx->cifar_eval_files : ctx->cifar_files;
  int64_t records = eval ? ctx->cifar_eval_records : ctx->cifar_records;
  DataPair d = data_pair(ctx);
  InputDesc *x = d.x, *y = d.y;
  int64_t rows = d.rows, global = d.global_rows;
  x->staging.resize((size_t)(rows * 3 * kPlane));
  y->staging.resize((size_t)rows);
  unsigned char rec[kRecord];
  for (int64_t r = 0; r < rows; ++r) {
    int64_t index = ((step - 1) * global + d.global(r)) % records;
    size_t f = 0;
    while (index >= files[f].second)
      index -= files[f++].second;
    const std::string &path = files[f].first;
    std::string error = read_at(path, index * kRecord, rec, kRecord);
    if (!error.empty())
      fatal("step %lld: %s", (long long)step, error.c_str());
    if ((int64_t)rec[0] >= ctx->classes)
      fatal("%s: record %lld has class %d but the classifier has %lld "
            "classes; is this a CIFAR-10 file?",
            path.c_str(), (long long)index, (int)rec[0],
            (long long)ctx->classes);
    int32_t id = rec[0];
    std::memcpy(&y->staging[(size_t)r], &id, sizeof(id));
    float *out = x->staging.data() + r * 3 * kPlane;
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < kPlane; ++i)
        out[c * kPlane + i] =
            ((float)rec[1 + c * kPlane + i] / 255.0f - kMean[c]) / kStd[c];
  }
  upload_staging(ctx, d);
}

} // namespace internal
} // namespace planrt
