//===- checkpoint_impl.h - What the checkpoint sources share --------------===//
//
// Private to runtime/lib/checkpoint_*.cpp; checkpoint.h is what the rest of
// the runtime calls. A checkpoint's pieces, one concern per file:
//   checkpoint_layout.cpp   which rank writes which block of a tensor, its
//                           global index ranges, copying overlaps
//   checkpoint_format.cpp   manifest.json, safetensors headers, hashes
//   checkpoint_files.cpp    paths, directories, listing, --keep, --fresh
//   checkpoint_read.cpp     --resume and --init-from into this rank's tensors
//   checkpoint_run.cpp      writing a checkpoint, the run's hooks, signals
//   checkpoint_options.cpp  the command-line options
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CHECKPOINT_IMPL_H
#define PLANRT_LIB_CHECKPOINT_IMPL_H

#include "checkpoint.h"
#include "context.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace planrt {
namespace internal {
namespace ckpt {

//===--- Layouts (checkpoint_layout.cpp) ----------------------------------===//

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

std::vector<TensorRef> tensor_refs(Context *ctx);
/// Checks a state tensor's layout (its shard axes and segments), as
/// validate() does for parameters; fatal: a code generator bug.
void check_layouts(Context *ctx);
/// Whether the rank with `coords` holds `r` at all (its pipeline stage).
bool holds(const Context *ctx, const TensorRef &r,
           const std::vector<int64_t> &coords);
/// Whether the rank with `coords` writes its block of `r` to a checkpoint:
/// it holds it and has coordinate 0 on every axis that does not split it
/// (on the pipeline axis for a tensor of one stage: the stage's owner), so
/// each distinct block is written once.
bool writes(const Context *ctx, const TensorRef &r,
            const std::vector<int64_t> &coords);
/// Per dim: the global index ranges [begin, end) whose concatenation is the
/// local dim on the rank with `coords`.
using Ranges = std::vector<std::vector<std::pair<int64_t, int64_t>>>;
Ranges ranges_of(const ParamLayout &l, int ndim);
std::vector<int64_t> global_shape(const ParamLayout &l, int ndim);
/// Copies the elements of a block (global index ranges `ranges`, data
/// `src` with its local shape) that fall in this rank's tensor (layout `l`,
/// local shape `ls`, host copy `dst`); counts them in `copied`.
void copy_overlap(const Ranges &ranges, const std::vector<int64_t> &shard_shape,
                  const float *src, const ParamLayout &l, const int64_t *ls,
                  int nd, float *dst, int64_t &copied);
bool overlaps(const Ranges &ranges, const ParamLayout &l, int nd);
/// The tensors this rank holds (its pipeline stages).
std::vector<TensorRef> held(Context *ctx);

//===--- Format (checkpoint_format.cpp) -----------------------------------===//

std::string hex(uint64_t v, int digits);
std::string shape_list(const std::vector<int64_t> &shape);

/// Parsed JSON (manifests, safetensors headers): nlohmann's.
using Json = nlohmann::json;

/// Parses [begin, end), one value and only whitespace after it; "" or the
/// error ("truncated JSON" when the input ends first).
std::string parse_json(const char *begin, const char *end, Json &out);
/// j's member `key`, or null when j is null, not an object or has none.
const Json *member(const Json *j, const std::string &key);
/// j's string, or null when j is null or not a string.
const std::string *string_of(const Json *j);

std::string model_hash(Context *ctx);

/// What a rank tells rank 0 about its shard file (3 int64 for a gather).
struct FileInfo {
  int64_t wrote = 0, crc = 0, bytes = 0;
};
/// manifest.json of the checkpoint of `step` (files: one per rank).
std::string manifest_json(Context *ctx, int64_t step,
                          const std::vector<FileInfo> &files);

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

/// An integer that fits int64_t; false for anything else.
bool get_int(const Json *j, int64_t &out);
/// Parses and checks manifest.json of `dir`.
std::string read_manifest(const std::string &dir, Manifest &m);

/// Parses a safetensors header from its first bytes; `data_start` is where
/// the data begins.
std::string parse_safetensors_header(const std::string &path, const char *bytes,
                                     int64_t size, Json &header,
                                     int64_t &data_start);
/// A tensor entry of a safetensors header: dtype, shape, byte range.
struct StEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
};
std::string st_entry(const std::string &path, const Json &info,
                     const std::string &name, StEntry &e);
int64_t dtype_size(const std::string &dt);
/// Converts n elements of `dtype` to fp32.
void to_f32(const std::string &dtype, const char *src, int64_t n, float *out);

//===--- Files (checkpoint_files.cpp) -------------------------------------===//

std::string strip_slashes(std::string dir);
std::string join(const std::string &dir, const std::string &name);
std::string step_dir_name(int64_t step);
std::string rank_file_name(int64_t rank);
/// mkdir -p; "" or why not.
std::string make_dirs(const std::string &dir);
void fsync_dir(const std::string &dir);
bool is_regular(const std::string &path, int64_t *size = nullptr);
/// The whole file, or an error.
std::string read_whole(const std::string &path, std::string &out);
/// The step-NNNNNN directories of `root`: step -> complete (has a manifest).
std::map<int64_t, bool> list_checkpoints(const std::string &root);
/// --keep N: removes the complete checkpoints older than the N newest and
/// incomplete ones older than the newest complete one. Rank 0. Warnings only.
void prune(Context *ctx, const std::string &root);
/// The checkpoint --resume reads: DIR itself if it has a manifest, else its
/// newest complete step-NNNNNN.
std::string find_checkpoint(const std::string &root, std::string &dir);
/// --fresh: moves the step-NNNNNN directories of `root` into
/// root/superseded-YYYYmmdd-HHMMSS/, so that the new run's checkpoints are
/// the only ones a later start continues from, and nothing is deleted.
/// Rank 0. "" or why not.
std::string supersede(const std::string &root, CheckpointOptions &opts);

//===--- Reading (checkpoint_read.cpp) ------------------------------------===//

/// Checks the manifest against this rank's tensors and the files it needs.
std::string check_resume(Context *ctx, const std::string &dir,
                         const Manifest &m, int64_t steps);
/// Reads this rank's tensors from the checkpoint (after start).
std::string load_resume(Context *ctx, const std::string &dir,
                        const Manifest &m);

/// The --init-from file, checked before start() and read after it.
struct InitFile {
  Json header;
  int64_t data_start = 0, size = 0;
  std::map<std::string, std::string> found; // our name -> the file's name
  int64_t ignored = 0;
};
/// Checks the file's header against the model's tensors (into `init`).
std::string check_init_from(Context *ctx, const std::string &path,
                            InitFile &init);
/// Reads the parameters found by check_init_from.
std::string load_init_from(Context *ctx, const std::string &path,
                           const InitFile &init);

//===--- Collectives (checkpoint_run.cpp) ---------------------------------===//

bool multi(const Context *ctx);
/// Every rank passes its error ("" if none). If any rank has one, each
/// prints one line (its own error, or that another rank failed) and the
/// program exits with code 1. Collective.
void agree_or_exit(Context *ctx, const std::string &error, const char *what);

} // namespace ckpt
} // namespace internal
} // namespace planrt

#endif // PLANRT_LIB_CHECKPOINT_IMPL_H
