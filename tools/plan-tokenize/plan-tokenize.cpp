//===- plan-tokenize.cpp - Text files to token shards for planrt ----------===//
//
// plan-tokenize [--val-fraction F] [--shard-tokens N] -o PREFIX input.txt...
//
// A byte-level tokenizer: every byte of the concatenated inputs is one token
// (0..255). The first fraction F of the tokens (default 0.1) goes to
// PREFIX_val_000000.bin, the rest to PREFIX_train_000000.bin, _000001, ...
// with at most N tokens per shard (default 100M). A shard is a header of 256
// little-endian int32 (20240520, 1, number of tokens, zeros) followed by the
// tokens as little-endian uint16: the format planrt reads for data_kind 1
// (set_data_path). The inputs are streamed: memory use does not depend on
// their size. Plain C++17, standard library only.
//===----------------------------------------------------------------------===//

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int32_t kMagic = 20240520;
constexpr int32_t kVersion = 1;
constexpr int kHeaderInts = 256;

const char *kUsage =
    "usage: plan-tokenize [--val-fraction F] [--shard-tokens N] -o PREFIX "
    "input.txt...\n"
    "  Byte-level tokenizer (token = byte value 0..255) over the concatenated\n"
    "  inputs. Writes PREFIX_val_000000.bin (the first F of the tokens,\n"
    "  default 0.1) and PREFIX_train_000000.bin, _000001, ... (at most N\n"
    "  tokens each, default 100000000) as token shards for planrt.\n";

[[noreturn]] void die(const std::string &message) {
  std::fprintf(stderr, "plan-tokenize: error: %s\n", message.c_str());
  std::exit(1);
}

void put_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = (unsigned char)(v >> (8 * i));
}

/// One shard being written: the header is rewritten with the final count.
class ShardWriter {
public:
  ShardWriter(std::string path) : path_(std::move(path)) {
    f_ = std::fopen(path_.c_str(), "wb");
    if (!f_)
      die("cannot write '" + path_ + "': " + std::strerror(errno) +
          "; check that the directory of the -o prefix exists and is "
          "writable");
    write_header();
  }
  void add(const unsigned char *bytes, size_t n) {
    buf_.resize(2 * n);
    for (size_t i = 0; i < n; ++i) {
      buf_[2 * i] = bytes[i]; // uint16 little-endian: byte, then 0
      buf_[2 * i + 1] = 0;
    }
    if (std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size())
      fail();
    tokens_ += (int64_t)n;
  }
  int64_t tokens() const { return tokens_; }
  const std::string &path() const { return path_; }
  void close() {
    if (tokens_ > INT32_MAX)
      die("'" + path_ + "' would hold " + std::to_string(tokens_) +
          " tokens, more than a shard header can count; use a smaller "
          "--shard-tokens");
    if (std::fseek(f_, 0, SEEK_SET) != 0)
      fail();
    write_header();
    if (std::fclose(f_) != 0) {
      f_ = nullptr;
      fail();
    }
    f_ = nullptr;
  }

private:
  void write_header() {
    unsigned char header[kHeaderInts * 4] = {};
    put_le32(header, (uint32_t)kMagic);
    put_le32(header + 4, (uint32_t)kVersion);
    put_le32(header + 8, (uint32_t)tokens_);
    if (std::fwrite(header, 1, sizeof(header), f_) != sizeof(header))
      fail();
  }
  [[noreturn]] void fail() {
    die("failed to write '" + path_ + "': " + std::strerror(errno));
  }
  std::string path_;
  FILE *f_ = nullptr;
  int64_t tokens_ = 0;
  std::vector<unsigned char> buf_;
};

std::string shard_name(const std::string &prefix, const char *split,
                       int index) {
  char num[16];
  std::snprintf(num, sizeof(num), "%06d", index);
  return prefix + "_" + split + "_" + num + ".bin";
}

} // namespace

int main(int argc, char **argv) {
  double val_fraction = 0.1;
  long long shard_tokens = 100000000;
  std::string prefix;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    bool has_value = false;
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto take = [&]() {
      if (!has_value) {
        if (i + 1 >= argc)
          die("option '" + arg + "' needs a value\n" + kUsage);
        value = argv[++i];
      }
    };
    if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else if (arg == "--val-fraction") {
      take();
      char *end = nullptr;
      val_fraction = std::strtod(value.c_str(), &end);
      if (value.empty() || *end || !(val_fraction >= 0.0) ||
          !(val_fraction < 1.0))
        die("invalid --val-fraction '" + value + "' (want a number in [0, 1))");
    } else if (arg == "--shard-tokens") {
      take();
      char *end = nullptr;
      errno = 0;
      shard_tokens = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end || errno || shard_tokens < 1 ||
          shard_tokens > INT32_MAX)
        die("invalid --shard-tokens '" + value + "' (want an integer in [1, " +
            std::to_string(INT32_MAX) + "])");
    } else if (arg == "-o" || arg == "--output") {
      take();
      if (value.empty())
        die("empty output prefix");
      prefix = value;
    } else if (arg.size() > 1 && arg[0] == '-') {
      die("unknown option '" + arg + "'\n" + kUsage);
    } else {
      inputs.push_back(argv[i]);
    }
  }
  if (prefix.empty())
    die(std::string("no output prefix (-o PREFIX)\n") + kUsage);
  if (inputs.empty())
    die(std::string("no input files\n") + kUsage);

  // Open every input first (a missing one is reported before anything is
  // written) and count the tokens: one per byte.
  std::vector<FILE *> files;
  int64_t total = 0;
  for (const std::string &path : inputs) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f)
      die("cannot read '" + path + "': " + std::strerror(errno));
    if (std::fseek(f, 0, SEEK_END) != 0)
      die("'" + path + "' is not a regular file (cannot seek)");
    long size = std::ftell(f);
    if (size < 0 || std::fseek(f, 0, SEEK_SET) != 0)
      die("cannot read '" + path + "': " + std::strerror(errno));
    total += size;
    files.push_back(f);
  }
  int64_t val_tokens = (int64_t)((double)total * val_fraction);

  ShardWriter *current = new ShardWriter(shard_name(prefix, "val", 0));
  int64_t capacity = val_tokens; // tokens left for the current shard
  bool in_val = true;
  int train_index = 0;
  std::vector<std::pair<std::string, int64_t>> written;
  auto next_shard = [&]() {
    current->close();
    written.push_back({current->path(), current->tokens()});
    delete current;
    current = new ShardWriter(shard_name(prefix, "train", train_index++));
    capacity = shard_tokens;
    in_val = false;
  };
  if (capacity == 0)
    next_shard(); // an empty val shard; the train shards start now

  std::vector<unsigned char> buf(1 << 20);
  int64_t read_total = 0;
  for (size_t k = 0; k < files.size(); ++k) {
    for (;;) {
      size_t n = std::fread(buf.data(), 1, buf.size(), files[k]);
      if (n == 0)
        break;
      read_total += (int64_t)n;
      size_t off = 0;
      while (off < n) {
        if (capacity == 0)
          next_shard();
        size_t take = (size_t)std::min<int64_t>(capacity, (int64_t)(n - off));
        current->add(buf.data() + off, take);
        off += take;
        capacity -= (int64_t)take;
      }
    }
    if (std::ferror(files[k]))
      die("cannot read '" + inputs[k] + "': " + std::strerror(errno));
    std::fclose(files[k]);
  }
  if (in_val)
    next_shard(); // every run writes at least one train shard
  current->close();
  written.push_back({current->path(), current->tokens()});
  delete current;
  if (read_total != total)
    die("the inputs changed size while they were read");

  int64_t train_total = 0;
  for (auto &w : written) {
    std::printf("wrote %s: %lld tokens\n", w.first.c_str(),
                (long long)w.second);
    if (w.first.find("_train_") != std::string::npos)
      train_total += w.second;
  }
  std::printf("plan-tokenize: %lld tokens from %zu file(s) (vocabulary 256, "
              "one token per byte): %lld val, %lld train in %d shard(s)\n",
              (long long)total, inputs.size(), (long long)(total - train_total),
              (long long)train_total, train_index);
  return 0;
}
