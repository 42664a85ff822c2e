// Token shards (data_kind 1), input dtypes, the learning-rate schedule and
// the step line, on a standalone single-rank host Context.
#include "planrt/internal.h"
#include "planrt/planrt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <unistd.h>
#include <vector>

using namespace planrt;

namespace {

const bool kDeathStyle = [] {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return true;
}();

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/planrt_tokens_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string operator/(const std::string &name) const {
    return path + "/" + name;
  }
};

void put32(std::vector<unsigned char> &b, size_t at, int32_t v) {
  for (int i = 0; i < 4; ++i)
    b[at + i] = (unsigned char)((uint32_t)v >> (8 * i));
}

/// Writes a shard of `tokens`; the header fields can be overridden and the
/// file cut to `keep_bytes` (if >= 0).
void write_shard(const std::string &path, const std::vector<uint16_t> &tokens,
                 int32_t magic = 20240520, int32_t version = 1,
                 int64_t claimed = -1, int64_t keep_bytes = -1) {
  std::vector<unsigned char> b(1024 + 2 * tokens.size(), 0);
  put32(b, 0, magic);
  put32(b, 4, version);
  put32(b, 8, claimed >= 0 ? (int32_t)claimed : (int32_t)tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    b[1024 + 2 * i] = (unsigned char)(tokens[i] & 0xff);
    b[1024 + 2 * i + 1] = (unsigned char)(tokens[i] >> 8);
  }
  if (keep_bytes >= 0)
    b.resize((size_t)keep_bytes);
  FILE *f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fwrite(b.data(), 1, b.size(), f), b.size());
  std::fclose(f);
}

/// Token i of the test stream (uses the high byte and the top of the range).
uint16_t tok(int64_t i) { return i == 5 ? 65535 : (uint16_t)(1000 + 7 * i); }

std::vector<uint16_t> stream_range(int64_t first, int64_t n) {
  std::vector<uint16_t> v;
  for (int64_t i = 0; i < n; ++i)
    v.push_back(tok(first + i));
  return v;
}

/// Two shards (10 + 7 tokens) and a file the pattern does not match.
struct TwoShards : ::testing::Test {
  TempDir dir;
  std::string pattern;
  void SetUp() override {
    // Written in reverse order: the stream follows the sorted names.
    write_shard(dir / "tok_train_000001.bin", stream_range(10, 7));
    write_shard(dir / "tok_train_000000.bin", stream_range(0, 10));
    write_shard(dir / "tok_val_000000.bin", {1, 2, 3});
    pattern = dir / "tok_train_*.bin";
  }
};

TEST_F(TwoShards, OpenAndReadAcrossTheBoundary) {
  internal::TokenShards s;
  ASSERT_EQ(internal::open_token_shards(pattern, s), "");
  ASSERT_EQ(s.files.size(), 2u);
  EXPECT_EQ(s.files[0].path, dir / "tok_train_000000.bin");
  EXPECT_EQ(s.files[1].first, 10);
  EXPECT_EQ(s.total, 17);
  std::vector<int32_t> all(17);
  ASSERT_EQ(internal::read_tokens(s, 0, 17, all.data()), "");
  for (int64_t i = 0; i < 17; ++i)
    EXPECT_EQ(all[i], tok(i)) << i;
  std::vector<int32_t> mid(4);
  ASSERT_EQ(internal::read_tokens(s, 8, 4, mid.data()), "");
  EXPECT_EQ(mid, (std::vector<int32_t>{tok(8), tok(9), tok(10), tok(11)}));
  EXPECT_NE(internal::read_tokens(s, 15, 3, mid.data()), "");
}

TEST(TokenPositions, MatchTheWrapRule) {
  // Reference: an epoch starts at offset (epoch * 7) % (room + 1), with room
  // = min(S, total - 1 - B*S) tokens kept free, and advances by B*S while a
  // whole batch window (B*S + 1 tokens) still fits before the room.
  for (int64_t total : {7, 13, 16, 17, 18, 19, 100})
    for (int64_t b : {1, 2, 4})
      for (int64_t seq : {1, 3}) {
        int64_t per = b * seq;
        if (total < per + 1)
          continue;
        int64_t room = std::min<int64_t>(seq, total - 1 - per);
        int64_t epoch = 0, pos = 0;
        for (int64_t step = 1; step <= 40; ++step) {
          int64_t offset = room > 0 ? (epoch * 7) % (room + 1) : 0;
          int64_t got = internal::token_step_position(total, b, seq, step);
          EXPECT_EQ(got, offset + pos)
              << total << " " << b << " " << seq << " " << step;
          EXPECT_LE(got + per + 1, total);
          pos += per;
          if (total - room - pos < per + 1) {
            pos = 0;
            ++epoch;
          }
        }
      }
}

TEST_F(TwoShards, BatchWindowsCrossFilesAndWrap) {
  internal::TokenShards s;
  ASSERT_EQ(internal::open_token_shards(pattern, s), "");
  // Global batch 2, S = 3: 6 tokens per step, 3 tokens of room, 2 steps per
  // epoch (17 tokens); epochs start at offsets 0, 3, 2.
  const int64_t b = 2, seq = 3;
  for (int64_t step = 1; step <= 5; ++step) {
    std::vector<int32_t> in(b * seq), lab(b * seq);
    ASSERT_EQ(
        internal::token_batch(s, step, b, seq, 0, b, in.data(), lab.data()),
        "");
    int64_t pos = ((step - 1) / 2 * 7) % 4 + ((step - 1) % 2) * b * seq;
    for (int64_t r = 0; r < b; ++r)
      for (int64_t j = 0; j < seq; ++j) {
        EXPECT_EQ(in[r * seq + j], tok(pos + r * seq + j)) << step;
        EXPECT_EQ(lab[r * seq + j], tok(pos + r * seq + j + 1)) << step;
      }
  }
  // Step 2, row 1 is stream[9, 13): it spans both files.
  std::vector<int32_t> in(3), lab(3);
  ASSERT_EQ(internal::token_batch(s, 2, b, seq, 1, 1, in.data(), lab.data()),
            "");
  EXPECT_EQ(in, (std::vector<int32_t>{tok(9), tok(10), tok(11)}));
  EXPECT_EQ(lab, (std::vector<int32_t>{tok(10), tok(11), tok(12)}));
}

TEST_F(TwoShards, SameRowsForAnySplit) {
  internal::TokenShards s;
  ASSERT_EQ(internal::open_token_shards(pattern, s), "");
  const int64_t b = 4, seq = 2; // 8 tokens per step, 2 steps per epoch
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<int32_t> in(8), lab(8), in0(4), lab0(4), in1(4), lab1(4);
    ASSERT_EQ(
        internal::token_batch(s, step, b, seq, 0, 4, in.data(), lab.data()),
        "");
    ASSERT_EQ(
        internal::token_batch(s, step, b, seq, 0, 2, in0.data(), lab0.data()),
        "");
    ASSERT_EQ(
        internal::token_batch(s, step, b, seq, 2, 2, in1.data(), lab1.data()),
        "");
    in0.insert(in0.end(), in1.begin(), in1.end());
    lab0.insert(lab0.end(), lab1.begin(), lab1.end());
    EXPECT_EQ(in, in0) << step;
    EXPECT_EQ(lab, lab0) << step;
  }
}

TEST(TokenShardErrors, EachCase) {
  TempDir dir;
  internal::TokenShards s;
  auto open = [&](const std::string &name) {
    return internal::open_token_shards(dir / name, s);
  };
  std::string e = open("none_*.bin");
  EXPECT_EQ(e.rfind(dir / "none_*.bin: no file matches", 0), 0u) << e;
  EXPECT_NE(e.find("; "), std::string::npos) << e;

  write_shard(dir / "short.bin", {}, 20240520, 1, 0, 100);
  e = open("short.bin");
  EXPECT_EQ(e.rfind(dir / "short.bin: file too short for a token shard "
                          "header (100 bytes",
                    0),
            0u)
      << e;

  write_shard(dir / "magic.bin", {1, 2}, 12345);
  e = open("magic.bin");
  EXPECT_NE(e.find("magic.bin: not a token shard: magic 12345, expected "
                   "20240520; "),
            std::string::npos)
      << e;

  write_shard(dir / "version.bin", {1, 2}, 20240520, 2);
  e = open("version.bin");
  EXPECT_NE(e.find("version.bin: unsupported token shard version 2"),
            std::string::npos)
      << e;

  write_shard(dir / "trunc.bin", stream_range(0, 5), 20240520, 1, 10);
  e = open("trunc.bin");
  EXPECT_NE(e.find("trunc.bin: truncated: it has 5 tokens but its header "
                   "claims 10; "),
            std::string::npos)
      << e;

  // A bad file among good ones is named.
  write_shard(dir / "mix_0.bin", {1, 2, 3});
  write_shard(dir / "mix_1.bin", {1, 2}, 7);
  e = open("mix_*.bin");
  EXPECT_EQ(e.rfind(dir / "mix_1.bin: not a token shard", 0), 0u) << e;
}

/// A context with one I32 input and label [rows, seq] over no mesh.
Context *token_context(const std::string &pattern, int64_t rows, int64_t seq) {
  Context *ctx = internal::create_context("tokens", false);
  declare_input(ctx, "x", RoleInput, 2, rows, seq, 1, 1, -1);
  set_input_dtype(ctx, 0, I32);
  declare_input(ctx, "y", RoleLabel, 2, rows, seq, 1, 1, -1);
  set_input_dtype(ctx, 1, I32);
  set_training(ctx, 3, 1, rows, DataTokenShards);
  if (!pattern.empty())
    set_data_path(ctx, pattern.c_str());
  return ctx;
}

TEST_F(TwoShards, ContextFillsInputsEveryStep) {
  Context *ctx = token_context(pattern, 2, 3);
  ASSERT_EQ(internal::open_training_data(ctx), "");
  internal::start(ctx);
  EXPECT_EQ(input(ctx, 0)->dtype, I32);
  for (int64_t step = 1; step <= 3; ++step) {
    internal::begin_step(ctx, step);
    auto x = internal::to_host_ids(ctx, input(ctx, 0));
    auto y = internal::to_host_ids(ctx, input(ctx, 1));
    int64_t pos = ((step - 1) / 2 * 7) % 4 + ((step - 1) % 2) * 6;
    for (int64_t i = 0; i < 6; ++i) {
      EXPECT_EQ(x[i], tok(pos + i)) << step;
      EXPECT_EQ(y[i], tok(pos + i + 1)) << step;
    }
  }
  internal::destroy_context(ctx);
}

TEST_F(TwoShards, TrainingDataErrors) {
  // 17 tokens: a batch of 4 x 4 needs 17 (fits), 4 x 5 needs 21.
  Context *ok = token_context(pattern, 4, 4);
  EXPECT_EQ(internal::open_training_data(ok), "");
  internal::destroy_context(ok);
  Context *big = token_context(pattern, 4, 5);
  std::string e = internal::open_training_data(big);
  EXPECT_EQ(e.rfind(pattern + ": the token stream has 17 tokens in 2 file(s) "
                              "but one step needs 21",
                    0),
            0u)
      << e;
  internal::destroy_context(big);
  Context *nopath = token_context("", 2, 3);
  e = internal::open_training_data(nopath);
  EXPECT_NE(e.find("set_data_path"), std::string::npos) << e;
  internal::destroy_context(nopath);
  // start() reports it as a fatal error.
  EXPECT_DEATH(
      {
        Context *c = token_context(dir / "missing_*.bin", 2, 3);
        internal::start(c);
      },
      "planrt: error: .*missing_\\*\\.bin: no file matches");
}

TEST(TokenDescription, DtypesMustMatchTheDataKind) {
  auto start_with = [](void (*setup)(Context *)) {
    Context *ctx = internal::create_context("bad", false);
    setup(ctx);
    internal::start(ctx);
  };
  EXPECT_DEATH(start_with([](Context *c) {
                 declare_input(c, "x", RoleInput, 2, 2, 3, 1, 1, -1);
                 declare_input(c, "y", RoleLabel, 2, 2, 3, 1, 1, -1);
                 set_training(c, 1, 1, 2, DataTokenShards);
               }),
               "data_kind 1 \\(token shards\\) needs an i32 input; 'x' is f32");
  EXPECT_DEATH(start_with([](Context *c) {
                 declare_input(c, "x", RoleInput, 2, 2, 3, 1, 1, -1);
                 set_input_dtype(c, 0, I32);
                 declare_input(c, "y", RoleLabel, 2, 2, 1, 1, 1, -1);
                 set_training(c, 1, 1, 2, DataSynthetic);
               }),
               "data_kind 0 \\(synthetic regression\\) needs an f32 input");
  // Synthetic images: class-id labels [rows], and the number of classes.
  EXPECT_DEATH(start_with([](Context *c) {
                 declare_input(c, "x", RoleInput, 4, 2, 3, 4, 4, -1);
                 declare_input(c, "y", RoleLabel, 1, 2, 1, 1, 1, -1);
                 set_input_dtype(c, 1, I32);
                 set_training(c, 1, 1, 2, DataSyntheticImages);
               }),
               "data_kind 2 \\(synthetic images\\) needs the number of "
               "classes");
  EXPECT_DEATH(start_with([](Context *c) {
                 declare_input(c, "x", RoleInput, 4, 2, 3, 4, 4, -1);
                 declare_input(c, "y", RoleLabel, 1, 2, 1, 1, 1, -1);
                 set_training(c, 1, 1, 2, DataSyntheticImages);
                 set_classes(c, 10);
               }),
               "data_kind 2 \\(synthetic images\\) needs an i32 label; 'y' "
               "is f32");
  EXPECT_DEATH(start_with([](Context *c) {
                 declare_input(c, "x", RoleInput, 2, 2, 3, 1, 1, -1);
                 set_input_dtype(c, 0, I32);
                 declare_input(c, "y", RoleLabel, 2, 2, 4, 1, 1, -1);
                 set_input_dtype(c, 1, I32);
                 set_training(c, 1, 1, 2, DataTokenShards);
               }),
               "must have the same shape");
  EXPECT_DEATH(start_with([](Context *c) {
                 declare_input(c, "x", RoleInput, 2, 2, 3, 1, 1, -1);
                 set_input_dtype(c, 0, 5);
               }),
               "unknown dtype 5");
  EXPECT_DEATH(start_with([](Context *c) { set_input_dtype(c, 0, I32); }),
               "input index 0 out of range");
}

//===--- Learning-rate schedule -------------------------------------------===//

double formula(int64_t warmup, double min_lr, int64_t decay, double base,
               int64_t s) {
  if (s <= warmup)
    return base * s / warmup;
  double p = std::min(1.0, (double)(s - warmup) /
                               std::max<int64_t>(1, decay - warmup));
  return min_lr + 0.5 * (1 + std::cos(M_PI * p)) * (base - min_lr);
}

TEST(LrSchedule, CosineWithWarmup) {
  // warmup 10, decay to step 110, base 1e-3, min 1e-4.
  auto lr = [](int64_t s) {
    return internal::scheduled_lr(LrCosine, 10, 1e-4, 110, 500, 1e-3, s);
  };
  EXPECT_DOUBLE_EQ(lr(1), 1e-4);                 // warmup start: L / W
  EXPECT_DOUBLE_EQ(lr(10), 1e-3);                // warmup end: L
  EXPECT_NEAR(lr(60), 1e-4 + 0.5 * 9e-4, 1e-15); // mid-decay (p = 1/2)
  EXPECT_NEAR(lr(35), formula(10, 1e-4, 110, 1e-3, 35), 1e-15);
  EXPECT_NEAR(lr(110), 1e-4, 1e-15); // the end of the decay
  EXPECT_NEAR(lr(400), 1e-4, 1e-15); // and after it
  for (int64_t s = 1; s <= 120; ++s)
    EXPECT_NEAR(lr(s), formula(10, 1e-4, 110, 1e-3, s), 1e-15) << s;
  // decay_steps 0 = the steps of the run; no warmup.
  EXPECT_DOUBLE_EQ(internal::scheduled_lr(LrCosine, 0, 0.0, 0, 20, 2.0, 20),
                   0.0);
  EXPECT_NEAR(internal::scheduled_lr(LrCosine, 0, 0.0, 0, 20, 2.0, 10), 1.0,
              1e-12);
  // Constant: the warmup ramp, then L.
  EXPECT_DOUBLE_EQ(internal::scheduled_lr(LrConstant, 4, 0.0, 0, 20, 2.0, 2),
                   1.0);
  EXPECT_DOUBLE_EQ(internal::scheduled_lr(LrConstant, 4, 0.0, 0, 20, 2.0, 9),
                   2.0);
}

void sgd_step(Context *ctx) {
  Tensor *g = alloc(ctx, 1, 2, 1, 1, 1);
  fill(ctx, g, 1.0f);
  sgd_update(ctx, param(ctx, 0), g, 0.5f);
}

TEST(LrSchedule, OptimizersUseTheScheduledLr) {
  Context *ctx = internal::create_context("sched", false);
  declare_param(ctx, "w", 1, 2, 1, 1, 1, InitZeros, 0.0f, 0.0f);
  set_training(ctx, 4, 1, 0, 0);
  set_lr_schedule(ctx, LrCosine, 2, 0.1f, 0);
  internal::start(ctx);
  internal::train(ctx, sgd_step, 4, /*quiet=*/true);
  // lr at steps 1..4 over a run of 4 steps: 0.25, 0.5, then cosine to 0.1.
  double want = 0;
  for (int64_t s = 1; s <= 4; ++s)
    want -= (float)formula(2, 0.1f, 4, 0.5, s);
  auto w = internal::to_host(ctx, param(ctx, 0));
  EXPECT_NEAR(w[0], want, 1e-6);
  std::string line = internal::step_line(ctx, 4, 4, 2.0);
  EXPECT_TRUE(std::regex_match(
      line, std::regex(R"(step 4/4 \| loss \S+ \| 2\.00 ms \| lr 1\.000e-01)")))
      << line;
  internal::destroy_context(ctx);
}

TEST(StepLine, FormsWithAndWithoutTokens) {
  // No schedule, no I32 input: the original line.
  Context *plain = internal::create_context("plain", false);
  declare_param(plain, "w", 1, 2, 1, 1, 1, InitZeros, 0.0f, 0.0f);
  internal::start(plain);
  internal::train(plain, sgd_step, 1, true);
  EXPECT_TRUE(
      std::regex_match(internal::step_line(plain, 1, 1, 1.5),
                       std::regex(R"(step 1/1 \| loss \S+ \| 1\.50 ms)")))
      << internal::step_line(plain, 1, 1, 1.5);
  internal::destroy_context(plain);
}

TEST_F(TwoShards, StepLineWithTokens) {
  // An I32 input [2, 8] over no mesh: 16 tokens per step; 16 tokens in 2 ms
  // are 8000 tok/s.
  Context *ctx = token_context(pattern, 2, 8);
  declare_param(ctx, "w", 1, 2, 1, 1, 1, InitZeros, 0.0f, 0.0f);
  internal::start(ctx);
  internal::begin_step(ctx, 1);
  sgd_step(ctx);
  std::string line = internal::step_line(ctx, 1, 5, 2.0);
  EXPECT_TRUE(std::regex_match(
      line,
      std::regex(
          R"(step 1/5 \| loss \S+ \| 2\.00 ms \| lr 5\.000e-01 \| 8000 tok/s)")))
      << line;
  // compare_runs.py's pattern still matches.
  EXPECT_TRUE(std::regex_search(
      line, std::regex(R"(step (\d+)/\d+ \| loss (\S+) \|)")));
  internal::destroy_context(ctx);
}

} // namespace
