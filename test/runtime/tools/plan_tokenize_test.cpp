// Runs the plan-tokenize tool (PLAN_TOKENIZE = its path) on small texts and
// checks the shards it writes byte by byte and through planrt's reader.
#include "planrt/internal.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/plan_tokenize_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string operator/(const std::string &name) const {
    return path + "/" + name;
  }
};

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write(const std::string &path, const std::string &text) {
  std::ofstream(path, std::ios::binary) << text;
}

/// Runs the tool with `args`; returns its exit status, output in `out`.
int tokenize(const TempDir &dir, const std::string &args, std::string &out) {
  std::string log = dir / "log.txt";
  std::string cmd =
      std::string("'") + PLAN_TOKENIZE + "' " + args + " > '" + log + "' 2>&1";
  int rc = std::system(cmd.c_str());
  out = slurp(log);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int32_t le32(const std::string &b, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= (uint32_t)(unsigned char)b[at + i] << (8 * i);
  return (int32_t)v;
}

/// Checks the header of a shard and returns its tokens.
std::vector<int> shard_tokens(const std::string &path) {
  std::string b = slurp(path);
  EXPECT_GE(b.size(), 1024u) << path;
  if (b.size() < 1024)
    return {};
  EXPECT_EQ(le32(b, 0), 20240520) << path;
  EXPECT_EQ(le32(b, 4), 1) << path;
  for (size_t i = 12; i < 1024; i += 4)
    EXPECT_EQ(le32(b, i), 0) << path << " header int " << i / 4;
  int32_t n = le32(b, 8);
  EXPECT_EQ(b.size(), 1024u + 2u * (size_t)n) << path;
  std::vector<int> tokens;
  for (int32_t i = 0; i < n && 1024 + 2 * (size_t)i + 1 < b.size(); ++i)
    tokens.push_back((unsigned char)b[1024 + 2 * i] |
                     (unsigned char)b[1024 + 2 * i + 1] << 8);
  return tokens;
}

std::vector<int> bytes_of(const std::string &s) {
  std::vector<int> v;
  for (unsigned char c : s)
    v.push_back(c);
  return v;
}

TEST(PlanTokenize, ValAndTrainShards) {
  TempDir dir;
  // 20 + 12 bytes, with a byte >= 128.
  std::string a = "Hello, planrt!\nabc\xff\n", b = "second file.";
  write(dir / "a.txt", a);
  write(dir / "b.txt", b);
  std::string out;
  ASSERT_EQ(tokenize(dir,
                     "--val-fraction 0.25 --shard-tokens 10 -o '" +
                         (dir / "tiny") + "' '" + (dir / "a.txt") + "' '" +
                         (dir / "b.txt") + "'",
                     out),
            0)
      << out;
  std::vector<int> all = bytes_of(a + b);
  ASSERT_EQ(all.size(), 32u);
  // val: the first 8 tokens; train: 24 in shards of 10, 10, 4.
  EXPECT_EQ(shard_tokens(dir / "tiny_val_000000.bin"),
            std::vector<int>(all.begin(), all.begin() + 8));
  EXPECT_EQ(shard_tokens(dir / "tiny_train_000000.bin"),
            std::vector<int>(all.begin() + 8, all.begin() + 18));
  EXPECT_EQ(shard_tokens(dir / "tiny_train_000001.bin"),
            std::vector<int>(all.begin() + 18, all.begin() + 28));
  EXPECT_EQ(shard_tokens(dir / "tiny_train_000002.bin"),
            std::vector<int>(all.begin() + 28, all.end()));
  EXPECT_EQ(access((dir / "tiny_train_000003.bin").c_str(), F_OK), -1);
  EXPECT_NE(out.find("tiny_val_000000.bin: 8 tokens"), std::string::npos)
      << out;
  EXPECT_NE(out.find("tiny_train_000002.bin: 4 tokens"), std::string::npos)
      << out;
  EXPECT_NE(out.find("32 tokens from 2 file(s)"), std::string::npos) << out;

  // planrt reads the train stream back.
  planrt::internal::TokenShards s;
  ASSERT_EQ(planrt::internal::open_token_shards(dir / "tiny_train_*.bin", s),
            "");
  EXPECT_EQ(s.total, 24);
  std::vector<int32_t> got(24);
  ASSERT_EQ(planrt::internal::read_tokens(s, 0, 24, got.data()), "");
  EXPECT_EQ(std::vector<int>(got.begin(), got.end()),
            std::vector<int>(all.begin() + 8, all.end()));
}

TEST(PlanTokenize, DefaultsAndEmptyVal) {
  TempDir dir;
  std::string text(95, 'x');
  text += "0123";
  write(dir / "t.txt", text);
  std::string out;
  ASSERT_EQ(
      tokenize(dir, "-o '" + (dir / "d") + "' '" + (dir / "t.txt") + "'", out),
      0)
      << out;
  EXPECT_EQ(shard_tokens(dir / "d_val_000000.bin").size(), 9u); // 10% of 99
  EXPECT_EQ(shard_tokens(dir / "d_train_000000.bin").size(), 90u);
  ASSERT_EQ(tokenize(dir,
                     "--val-fraction=0 -o '" + (dir / "z") + "' '" +
                         (dir / "t.txt") + "'",
                     out),
            0)
      << out;
  EXPECT_EQ(shard_tokens(dir / "z_val_000000.bin").size(), 0u);
  EXPECT_EQ(shard_tokens(dir / "z_train_000000.bin"), bytes_of(text));
}

TEST(PlanTokenize, Errors) {
  TempDir dir;
  write(dir / "t.txt", "abc");
  std::string out;
  EXPECT_EQ(tokenize(dir,
                     "-o '" + (dir / "x") + "' '" + (dir / "nope.txt") + "'",
                     out),
            1);
  EXPECT_NE(out.find("plan-tokenize: error: cannot read '" +
                     (dir / "nope.txt") + "': No such file"),
            std::string::npos)
      << out;
  EXPECT_EQ(
      tokenize(dir,
               "-o '" + (dir / "no/such/dir/x") + "' '" + (dir / "t.txt") + "'",
               out),
      1);
  EXPECT_NE(out.find("plan-tokenize: error: cannot write '" +
                     (dir / "no/such/dir/x") + "_val_000000.bin'"),
            std::string::npos)
      << out;
  EXPECT_EQ(tokenize(dir, "'" + (dir / "t.txt") + "'", out), 1);
  EXPECT_NE(out.find("no output prefix"), std::string::npos) << out;
  EXPECT_EQ(
      tokenize(dir, "--val-fraction 1.5 -o x '" + (dir / "t.txt") + "'", out),
      1);
  EXPECT_NE(out.find("invalid --val-fraction '1.5'"), std::string::npos) << out;
}

} // namespace
