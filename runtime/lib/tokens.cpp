//===- tokens.cpp - Token shards (data_kind 1) and their batches ----------===//
//
// A shard is a header of 256 little-endian int32 (magic 20240520, version 1,
// number of tokens, the rest unused) followed by that many little-endian
// uint16 tokens. The stream is the concatenation of the shards in sorted name
// order. Only the headers are read up front; every step each rank reads the
// one contiguous span of the stream that its rows cover (rows * S + 1 tokens,
// possibly across a file boundary), so memory does not grow with the data.
//===----------------------------------------------------------------------===//

#include "context.h"
#include "planrt/context_parallel.h"
#include "planrt/internal.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace planrt {
namespace internal {
namespace {

const char *kFixShard = "write token shards with plan-tokenize (or llm.c's "
                        "data scripts)";

int32_t le_int32(const unsigned char *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                   (uint32_t)p[3] << 24);
}

std::string cwd() {
  char buf[4096];
  if (!getcwd(buf, sizeof(buf)))
    return "?";
  return buf;
}

} // namespace

std::string check_token_shard(const std::string &path, int64_t &tokens) {
  tokens = 0;
  FILE *f = std::fopen(path.c_str(), "rb");
  if (!f)
    return path + ": cannot open: " + std::strerror(errno) +
           "; check that the file exists and is readable";
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fclose(f);
    return path + ": not a regular file; the data pattern must match only "
                  "token shard files";
  }
  const int64_t header_bytes = kShardHeaderInts * 4;
  int64_t size = (int64_t)st.st_size;
  unsigned char header[kShardHeaderInts * 4];
  size_t got =
      size >= header_bytes ? std::fread(header, 1, (size_t)header_bytes, f) : 0;
  std::fclose(f);
  if (size < header_bytes || (int64_t)got != header_bytes)
    return path + ": file too short for a token shard header (" +
           std::to_string(size) + " bytes, the header alone is " +
           std::to_string(header_bytes) + "); " + kFixShard;
  int32_t magic = le_int32(header), version = le_int32(header + 4);
  int32_t claimed = le_int32(header + 8);
  if (magic != kShardMagic)
    return path + ": not a token shard: magic " + std::to_string(magic) +
           ", expected " + std::to_string(kShardMagic) + "; " + kFixShard;
  if (version != kShardVersion)
    return path + ": unsupported token shard version " +
           std::to_string(version) + " (planrt reads version " +
           std::to_string(kShardVersion) + ", uint16 tokens); " + kFixShard;
  if (claimed < 0)
    return path + ": the header claims a negative number of tokens (" +
           std::to_string(claimed) + "); " + kFixShard;
  int64_t present = (size - header_bytes) / 2;
  if (present < claimed)
    return path + ": truncated: it has " + std::to_string(present) +
           " tokens but its header claims " + std::to_string(claimed) +
           "; the file is incomplete, write or copy it again";
  tokens = claimed; // bytes after the claimed tokens are ignored
  return "";
}

std::string glob_files(const std::string &pattern,
                       std::vector<std::string> &paths, const char *hint) {
  paths.clear();
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  int rc = glob(pattern.c_str(), 0, nullptr, &g);
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i)
      paths.push_back(g.gl_pathv[i]);
  globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH)
    return pattern + ": cannot expand the data pattern (glob error " +
           std::to_string(rc) + "); check that its directories are readable";
  if (paths.empty())
    return pattern + ": no file matches the data pattern (relative to " +
           cwd() + "); run the program from the directory the pattern is " +
           "relative to, or " + hint;
  std::sort(paths.begin(), paths.end()); // byte order, not the locale's
  return "";
}

std::string open_token_shards(const std::string &pattern, TokenShards &out) {
  out = TokenShards();
  out.pattern = pattern;
  std::vector<std::string> paths;
  std::string error =
      glob_files(pattern, paths, "create the shards with plan-tokenize");
  if (!error.empty())
    return error;
  for (const std::string &p : paths) {
    int64_t n = 0;
    std::string error = check_token_shard(p, n);
    if (!error.empty())
      return error;
    TokenShard s;
    s.path = p;
    s.first = out.total;
    s.tokens = n;
    out.files.push_back(s);
    out.total += n;
  }
  return "";
}

std::string read_tokens(const TokenShards &shards, int64_t start, int64_t count,
                        int32_t *out) {
  if (start < 0 || count < 0 || start + count > shards.total)
    return shards.pattern + ": tokens [" + std::to_string(start) + ", " +
           std::to_string(start + count) + ") are outside the stream of " +
           std::to_string(shards.total) + " tokens; this is a planrt bug";
  // The first file whose range holds `start`.
  auto it = std::upper_bound(
      shards.files.begin(), shards.files.end(), start,
      [](int64_t pos, const TokenShard &s) { return pos < s.first; });
  size_t f =
      it == shards.files.begin() ? 0 : (size_t)(it - shards.files.begin()) - 1;
  std::vector<unsigned char> buf;
  while (count > 0) {
    const TokenShard &s = shards.files[f++];
    int64_t offset = start - s.first;
    int64_t n = std::min(count, s.tokens - offset);
    if (n <= 0)
      continue; // an empty shard
    FILE *fp = std::fopen(s.path.c_str(), "rb");
    if (!fp)
      return s.path + ": cannot open: " + std::strerror(errno) +
             "; the shard changed during the run";
    buf.resize((size_t)n * 2);
    bool ok =
        fseeko(fp, (off_t)(kShardHeaderInts * 4 + offset * 2), SEEK_SET) == 0 &&
        std::fread(buf.data(), 1, buf.size(), fp) == buf.size();
    std::fclose(fp);
    if (!ok)
      return s.path + ": cannot read tokens [" + std::to_string(offset) + ", " +
             std::to_string(offset + n) + "); the shard changed during the run";
    for (int64_t i = 0; i < n; ++i)
      out[i] = (int32_t)((uint32_t)buf[2 * i] | (uint32_t)buf[2 * i + 1] << 8);
    out += n;
    start += n;
    count -= n;
  }
  return "";
}

int64_t token_step_position(int64_t total, int64_t global_batch, int64_t seq,
                            int64_t step) {
  int64_t per_step = global_batch * seq;
  if (per_step <= 0 || total < per_step + 1)
    return 0;
  // pos advances by per_step within an epoch. Each epoch starts a few
  // tokens further in (epoch * 7 modulo room + 1, room = up to seq tokens
  // kept free at the end), so that a text that fits in few batches is not cut
  // into the same windows every epoch. Every window stays inside the
  // stream: offset + k * per_step + per_step + 1 <= total.
  int64_t room = std::min<int64_t>(seq, total - 1 - per_step);
  int64_t steps_per_epoch = (total - 1 - room) / per_step;
  int64_t s = step >= 1 ? step - 1 : 0;
  int64_t epoch = s / steps_per_epoch, k = s % steps_per_epoch;
  int64_t offset = room > 0 ? (epoch * 7) % (room + 1) : 0;
  return offset + k * per_step;
}

std::string token_batch(const TokenShards &shards, int64_t step,
                        int64_t global_batch, int64_t seq, int64_t row0,
                        int64_t rows, int32_t *inputs, int32_t *labels) {
  int64_t pos = token_step_position(shards.total, global_batch, seq, step);
  std::vector<int32_t> span((size_t)(rows * seq + 1));
  std::string error =
      read_tokens(shards, pos + row0 * seq, rows * seq + 1, span.data());
  if (!error.empty())
    return error;
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(span.data() + r * seq, seq, inputs + r * seq);
    std::copy_n(span.data() + r * seq + 1, seq, labels + r * seq);
  }
  return "";
}

namespace {

struct TokenIO {
  InputDesc *x = nullptr, *y = nullptr;
  /// seq: the whole sequence; local_seq: this rank's positions of it (all
  /// of them unless context parallelism splits it).
  int64_t rows = 0, seq = 0, local_seq = 0, global_rows = 0;
  kernels::SeqPart part;
};

TokenIO token_io(Context *ctx) {
  TokenIO io;
  for (auto &in : ctx->inputs)
    (in.role == RoleInput ? io.x : io.y) = &in;
  io.rows = io.x->t.shape[0];
  io.local_seq = io.x->t.shape[1];
  if (io.x->seq_axis >= 0) // the coordinate only matters once filling
    io.part = {ctx->coords.empty() ? 0 : ctx->coords[io.x->seq_axis],
               ctx->axis_sizes[io.x->seq_axis]};
  io.seq = io.local_seq * io.part.G;
  io.global_rows = io.rows * batch_ranks(ctx, *io.x);
  return io;
}

} // namespace

std::string open_training_data(Context *ctx) {
  if (ctx->data_kind == DataCifar10 && !ctx->inputs.empty())
    return open_cifar(ctx);
  if (ctx->data_kind != DataTokenShards || ctx->inputs.empty() ||
      ctx->tokens_open)
    return "";
  if (!ctx->data_path_set)
    return "(no data path): data_kind 1 (token shards) needs a glob pattern "
           "of shard files; the generated plan_setup must call set_data_path";
  TokenIO io = token_io(ctx);
  std::string error = open_token_shards(ctx->data_path, ctx->tokens);
  if (!error.empty())
    return error;
  int64_t need = io.global_rows * io.seq + 1;
  if (ctx->tokens.total < need)
    return ctx->data_path + ": the token stream has " +
           std::to_string(ctx->tokens.total) + " tokens in " +
           std::to_string(ctx->tokens.files.size()) +
           " file(s) but one step needs " + std::to_string(need) +
           " (global batch " + std::to_string(io.global_rows) + " x sequence " +
           std::to_string(io.seq) +
           " + 1); use more data or a smaller batch or sequence length";
  ctx->tokens_open = true;
  return "";
}

} // namespace internal

void fill_tokens(Context *ctx, int64_t step) {
  if (!ctx->tokens_open)
    fatal("fill_tokens: the token shards were not opened");
  internal::TokenIO io = internal::token_io(ctx);
  size_t n = (size_t)(io.rows * io.seq);
  ctx->token_inputs.resize(n);
  ctx->token_labels.resize(n);
  // The rank's rows: one run of the global batch, or with expert
  // parallelism and microbatches one per microbatch.
  int64_t runs = io.x->chunks, run_rows = io.rows / runs;
  for (int64_t c = 0; c < runs; ++c) {
    std::string error =
        internal::token_batch(ctx->tokens, step, io.global_rows, io.seq,
                              batch_run_row0(ctx, *io.x, c), run_rows,
                              ctx->token_inputs.data() + c * run_rows * io.seq,
                              ctx->token_labels.data() + c * run_rows * io.seq);
    if (!error.empty())
      fatal("%s", error.c_str());
  }
  if (ctx->token_vocab > 0) {
    // Ids outside the vocabulary are reported here, where their file and
    // position are known (the embedding kernel only sees the id).
    int64_t step0 = internal::token_step_position(ctx->tokens.total,
                                                  io.global_rows, io.seq, step);
    for (int64_t r = 0; r < io.rows; ++r)
      for (int64_t c = 0; c <= io.seq; ++c) {
        // Row r's window: inputs [r*S, r*S + S), labels one further.
        int32_t id = c < io.seq
                         ? ctx->token_inputs[(size_t)(r * io.seq + c)]
                         : ctx->token_labels[(size_t)(r * io.seq + c - 1)];
        if (id >= 0 && id < ctx->token_vocab)
          continue;
        int64_t at =
            step0 +
            (batch_run_row0(ctx, *io.x, r / run_rows) + r % run_rows) * io.seq +
            c;
        const internal::TokenShard *file = &ctx->tokens.files.front();
        for (const internal::TokenShard &f : ctx->tokens.files)
          if (f.first <= at && at < f.first + f.tokens)
            file = &f;
        fatal("%s: token %lld (counting from 0 in the file) is %d, outside "
              "the model's vocabulary [0, %lld); read for step %lld by rank "
              "%d; the data was tokenized for another vocabulary: tokenize it "
              "again or enlarge the model's vocabulary",
              file->path.c_str(), (long long)(at - file->first), (int)id,
              (long long)ctx->token_vocab, (long long)step, ctx->rank);
      }
  }
  if (io.part.G > 1) {
    // Context parallelism: this rank's positions of each row, in place
    // (position(t) >= t, so row r's local columns never overwrite what a
    // later one reads).
    for (std::vector<int32_t> *v : {&ctx->token_inputs, &ctx->token_labels})
      for (int64_t r = 0; r < io.rows; ++r)
        for (int64_t t = 0; t < io.local_seq; ++t)
          (*v)[(size_t)(r * io.local_seq + t)] =
              (*v)[(size_t)(r * io.seq + io.part.position(t, io.local_seq))];
    n = (size_t)(io.rows * io.local_seq);
  }
  backend::to_device(ctx, io.x->t.data, ctx->token_inputs.data(),
                     n * sizeof(int32_t));
  backend::to_device(ctx, io.y->t.data, ctx->token_labels.data(),
                     n * sizeof(int32_t));
}

} // namespace planrt
