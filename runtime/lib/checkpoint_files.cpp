//===- checkpoint_files.cpp - Checkpoint directories and files ------------===//
//
// Paths of a checkpoint (DIR/step-NNNNNN/rank-RRRRR.safetensors), creating,
// listing and removing checkpoint directories (--keep removes a manifest
// first, so an interrupted removal never leaves a complete checkpoint with
// missing files), finding the one --resume reads, and --fresh's moving them
// aside. Atomic writes of a file are try_write_file's (data.cpp).
//===----------------------------------------------------------------------===//

#include "checkpoint_impl.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace planrt {
namespace internal {
namespace ckpt {

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

bool is_regular(const std::string &path, int64_t *size) {
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

//===--- Listing and removing ---------------------------------------------===//

namespace {

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

} // namespace

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

} // namespace ckpt
} // namespace internal
} // namespace planrt
