// How the cuda backend decides where 16-bit attention runs
// (runtime/lib/cuda/attention_cudnn.cpp), on a machine without a GPU: what
// PLANRT_ATTENTION and PLANRT_CUDNN_LIBRARY do, and what the user is told
// when cuDNN cannot run (the tiles then run, or, with
// PLANRT_ATTENTION=cudnn, the program stops and says why). Each case runs
// in a child process: the choice is made once per process. On a machine
// with a GPU these cases are skipped (the device suite runs cuDNN there).
#include "cuda/attention_cudnn.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

using namespace planrt;
namespace cudnn = planrt::cuda_attention::cudnn;

namespace {

kernels::AttnShape shape() {
  kernels::AttnShape a;
  a.B = 2;
  a.S = 128;
  a.H = 4;
  a.KV = 2;
  a.D = 64;
  a.scale = 0.125f;
  return a;
}

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

/// In the child: asks whether cuDNN runs the forward and the backward of
/// `a` (with attention dropout or not), prints the status line and what
/// was decided to stderr, exits 0.
[[noreturn]] void decide(const char *mode, const char *library,
                         kernels::AttnShape a = shape(), bool dropout = false) {
  if (mode)
    setenv("PLANRT_ATTENTION", mode, 1);
  else
    unsetenv("PLANRT_ATTENTION");
  if (library)
    setenv("PLANRT_CUDNN_LIBRARY", library, 1);
  bool f = cudnn::runs_forward(a, true, false, dropout);
  bool b = cudnn::runs_backward(a, true, dropout);
  std::fprintf(stderr, "forward %d backward %d held %zu: %s\n", f, b,
               cudnn::bytes_held(), cudnn::status());
  std::exit(0);
}

class AttentionCudnn : public ::testing::Test {
protected:
  void SetUp() override {
    if (has_gpu())
      GTEST_SKIP() << "a GPU is present: bench/gpu's suite runs cuDNN there";
  }
};

TEST_F(AttentionCudnn, TilesWhenTurnedOff) {
  EXPECT_EXIT(decide("tiles", nullptr), ::testing::ExitedWithCode(0),
              "forward 0 backward 0 held 0: 16-bit attention runs planrt's "
              "tiles \\(PLANRT_ATTENTION=tiles\\)");
}

TEST_F(AttentionCudnn, UnknownModeIsAnError) {
  EXPECT_EXIT(decide("flash", nullptr), ::testing::ExitedWithCode(1),
              "planrt: error: PLANRT_ATTENTION=flash: expected auto \\(cuDNN "
              "where it runs, else planrt's tiles\\), cudnn \\(fatal where "
              "cuDNN cannot run\\) or tiles");
}

#ifdef PLANRT_TEST_CUDNN_FRONTEND
TEST_F(AttentionCudnn, WhatCudnnNeverRunsIsFatalWhenRequired) {
  // Attention dropout (the host's mask) and head dims cuDNN does not take
  // stop a PLANRT_ATTENTION=cudnn run before any device work.
  EXPECT_EXIT(decide("cudnn", nullptr, shape(), true),
              ::testing::ExitedWithCode(1),
              "planrt: error: PLANRT_ATTENTION=cudnn, but cuDNN cannot run "
              "attention of bf16 B 2 S 128 H 4 KV 2 D 64: attention dropout "
              "draws planrt's own mask, which cuDNN cannot draw");
  kernels::AttnShape odd = shape();
  odd.D = 12;
  EXPECT_EXIT(decide("cudnn", nullptr, odd), ::testing::ExitedWithCode(1),
              "cuDNN cannot run attention of bf16 B 2 S 128 H 4 KV 2 D 12: "
              "cuDNN's flash attention takes head dims that are multiples of "
              "8, up to 256");
  // Not required: the tiles run them.
  EXPECT_EXIT(decide("auto", "/nonexistent/libcudnn.so.9", odd),
              ::testing::ExitedWithCode(0), "forward 0 backward 0 held 0");
}

TEST_F(AttentionCudnn, MissingLibraryRunsTheTiles) {
  EXPECT_EXIT(decide(nullptr, "/nonexistent/libcudnn.so.9"),
              ::testing::ExitedWithCode(0),
              "forward 0 backward 0 held 0: 16-bit attention runs planrt's "
              "tiles: cuDNN 9 was not found \\(/nonexistent/libcudnn.so.9: "
              ".*\\); put libcudnn.so.9 on LD_LIBRARY_PATH or name it in "
              "PLANRT_CUDNN_LIBRARY");
}

TEST_F(AttentionCudnn, MissingLibraryIsFatalWhenRequired) {
  EXPECT_EXIT(decide("cudnn", "/nonexistent/libcudnn.so.9"),
              ::testing::ExitedWithCode(1),
              "planrt: error: PLANRT_ATTENTION=cudnn, but cuDNN 9 was not "
              "found");
}

TEST_F(AttentionCudnn, NoDeviceRunsTheTiles) {
  // cuDNN loads (the CUDA install's), but without a GPU no handle is made.
  EXPECT_EXIT(decide("auto", nullptr), ::testing::ExitedWithCode(0),
              "forward 0 backward 0 held 0: 16-bit attention runs planrt's "
              "tiles: (cudnnCreate failed|loading cuDNN failed)");
}
#else
TEST_F(AttentionCudnn, BuiltWithoutTheFrontend) {
  EXPECT_EXIT(decide(nullptr, nullptr), ::testing::ExitedWithCode(0),
              "forward 0 backward 0 held 0: 16-bit attention runs planrt's "
              "tiles: this planrt was built without cuDNN's frontend");
  EXPECT_EXIT(decide("cudnn", nullptr), ::testing::ExitedWithCode(1),
              "PLANRT_ATTENTION=cudnn, but this planrt was built without "
              "cuDNN's frontend");
}
#endif

} // namespace
