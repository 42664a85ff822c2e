// planrt::observe and --dump-step0 (internal::set_dump_step0): what step 1
// observes is written after step 1 as safetensors, and nothing otherwise.
// Also set_forward, which only records the function.
#include "planrt/internal.h"
#include "planrt/planrt.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

using namespace planrt;

namespace {

const bool kDeathStyle = [] {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return true;
}();

std::string temp_path(const char *tag) {
  return testing::TempDir() + "planrt_" + tag + "_" + std::to_string(getpid()) +
         ".safetensors";
}

bool file_exists(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return f.good();
}

/// The JSON header (trailing padding removed) and the data section.
struct SafetensorsFile {
  std::string header;
  std::vector<float> data;
};

SafetensorsFile read_safetensors(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  SafetensorsFile out;
  if (bytes.size() < 8)
    return out;
  uint64_t hl = 0;
  for (int i = 0; i < 8; ++i)
    hl |= (uint64_t)(unsigned char)bytes[i] << (8 * i);
  std::string header = bytes.substr(8, hl);
  out.header = header.substr(0, header.find_last_not_of(' ') + 1);
  out.data.resize((bytes.size() - 8 - hl) / 4);
  std::memcpy(out.data.data(), bytes.data() + 8 + hl, out.data.size() * 4);
  return out;
}

// One parameter w [2, 3]. Each step observes w as "w" and "dup", subtracts
// 0.5 from it (sgd with a gradient of ones), observes it again as "dup",
// and observes a scalar "s" = the step number.
void setup(Context *ctx) {
  declare_param(ctx, "w", 2, 2, 3, 1, 1, InitNormal, 0.0f, 1.0f);
}

void step(Context *ctx) {
  Tensor *w = param(ctx, 0);
  observe(ctx, w, "w");
  observe(ctx, w, "dup");
  Tensor *g = alloc(ctx, 2, 2, 3, 1, 1);
  fill(ctx, g, 1.0f);
  sgd_update(ctx, w, g, 0.5f);
  observe(ctx, w, "dup");
  Tensor *s = alloc(ctx, 0, 1, 1, 1, 1);
  fill(ctx, s, 0.0f);
  observe(ctx, s, "s");
  Tensor *loss = alloc(ctx, 0, 1, 1, 1, 1);
  fill(ctx, loss, 1.0f);
  report_loss(ctx, loss);
}

TEST(Observe, NoOpWithoutDumpStep0) {
  std::string path = temp_path("observe_off");
  std::remove(path.c_str());
  Context *ctx = internal::create_context("observe", false);
  setup(ctx);
  internal::start(ctx);
  internal::train(ctx, step, 2, /*quiet=*/true);
  EXPECT_EQ(internal::write_observed(ctx, path), 0u); // nothing recorded
  std::remove(path.c_str());
  internal::destroy_context(ctx);
}

TEST(Observe, DumpsStep1AfterStep1) {
  std::string path = temp_path("observe_on");
  std::remove(path.c_str());
  Context *ctx = internal::create_context("observe", false);
  setup(ctx);
  internal::start(ctx);
  std::vector<float> w0 = internal::to_host(ctx, param(ctx, 0));
  internal::set_dump_step0(ctx, path);
  internal::train(ctx, step, 3, /*quiet=*/true);
  ASSERT_TRUE(file_exists(path));
  SafetensorsFile st = read_safetensors(path);
  std::remove(path.c_str());
  // In order of first observation; "dup" keeps its later contents.
  EXPECT_EQ(st.header, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                       "\"data_offsets\":[0,24]},"
                       "\"dup\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                       "\"data_offsets\":[24,48]},"
                       "\"s\":{\"dtype\":\"F32\",\"shape\":[],"
                       "\"data_offsets\":[48,52]}}");
  ASSERT_EQ(st.data.size(), 13u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(st.data[i], w0[i]) << i; // step 1's weights, not step 3's
    EXPECT_EQ(st.data[6 + i], w0[i] - 0.5f) << i;
  }
  EXPECT_EQ(st.data[12], 0.0f);
  // Later steps record nothing.
  EXPECT_EQ(internal::write_observed(ctx, path), 0u);
  std::remove(path.c_str());
  internal::destroy_context(ctx);
}

void observe_nothing(Context *ctx) {
  Tensor *loss = alloc(ctx, 0, 1, 1, 1, 1);
  fill(ctx, loss, 2.0f);
  report_loss(ctx, loss);
}

TEST(Observe, NothingObservedWritesAnEmptyFile) {
  std::string path = temp_path("observe_empty");
  Context *ctx = internal::create_context("observe", false);
  internal::start(ctx);
  internal::set_dump_step0(ctx, path);
  testing::internal::CaptureStderr();
  internal::train(ctx, observe_nothing, 1, /*quiet=*/true);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("planrt: warning: --dump-step0: the program observed no "
                     "tensor in step 1"),
            std::string::npos)
      << err;
  SafetensorsFile st = read_safetensors(path);
  std::remove(path.c_str());
  EXPECT_EQ(st.header, "{}");
  EXPECT_TRUE(st.data.empty());
  internal::destroy_context(ctx);
}

void observe_ids(Context *ctx) {
  Tensor *ids = alloc(ctx, 1, 4, 1, 1, 1);
  ids->dtype = I32;
  const int32_t values[4] = {3, 0, 7, 1 << 24};
  std::memcpy(ids->data, values, sizeof(values)); // host backend
  observe(ctx, ids, "ids");
}

// Token and class ids are written as f32 values, exact below 2^24.
TEST(Observe, WritesIdsAsF32Values) {
  std::string path = temp_path("observe_ids");
  Context *ctx = internal::create_context("observe", false);
  internal::start(ctx);
  internal::set_dump_step0(ctx, path);
  internal::train(ctx, observe_ids, 1, /*quiet=*/true);
  SafetensorsFile st = read_safetensors(path);
  std::remove(path.c_str());
  EXPECT_EQ(st.header, "{\"ids\":{\"dtype\":\"F32\",\"shape\":[4],"
                       "\"data_offsets\":[0,16]}}");
  ASSERT_EQ(st.data.size(), 4u);
  EXPECT_EQ(st.data[0], 3.0f);
  EXPECT_EQ(st.data[1], 0.0f);
  EXPECT_EQ(st.data[2], 7.0f);
  EXPECT_EQ(st.data[3], 16777216.0f);
  internal::destroy_context(ctx);
}

TEST(ObserveDeathTest, RejectsBadArguments) {
  Context *ctx = internal::create_context("observe", false);
  internal::start(ctx);
  internal::set_dump_step0(ctx, temp_path("observe_bad"));
  internal::begin_step(ctx, 1);
  EXPECT_DEATH(observe(ctx, nullptr, "t"), "observe");
  EXPECT_DEATH(observe(nullptr, nullptr, "t"), "observe: null context");
  internal::destroy_context(ctx);
}

TEST(SetForward, KeepsTheFunction) {
  Context *ctx = internal::create_context("forward", false);
  EXPECT_EQ(internal::forward_fn(ctx), nullptr);
  set_forward(ctx, observe_nothing);
  EXPECT_EQ(internal::forward_fn(ctx), &observe_nothing);
  internal::destroy_context(ctx);
}

} // namespace
