// Checkpoints on a standalone single-rank host Context: the files of
// DIR/step-NNNNNN (a shard file, then the manifest that makes it complete),
// the manifest's crc32 of the shard file, the global ranges of a segmented
// tensor, and zlib's crc32.
#include "planrt/internal.h"
#include "planrt/planrt.h"

#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

using namespace planrt;

namespace {

std::string slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Checkpoint, Crc32IsZlibs) {
  EXPECT_EQ(internal::crc32(0, "123456789", 9), 0xcbf43926u);
  // Incremental = whole.
  uint32_t c = internal::crc32(0, "1234", 4);
  EXPECT_EQ(internal::crc32(c, "56789", 5), 0xcbf43926u);
}

TEST(Checkpoint, WritesShardsThenManifest) {
  char tmpl[] = "/tmp/planrt-ckpt-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string root = std::string(tmpl) + "/ckpt";
  Context *ctx = internal::create_context("ckpt_test", /*use_mpi=*/false);
  declare_mesh_axis(ctx, "tp", 1);
  declare_param(ctx, "w", 2, 4, 6, 1, 1, InitNormal, 0.0f, 1.0f);
  set_param_segments(ctx, 0, 1, 2, 2, 2);
  declare_state(ctx, "w.exp_avg", 2, 4, 6, 1, 1);
  shard_state(ctx, 0, 1, 0);
  set_state_segments(ctx, 0, 1, 2, 2, 2);
  set_checkpoint(ctx, root.c_str(), 0);
  internal::start(ctx);
  std::string dir = internal::write_checkpoint(ctx, 3);
  EXPECT_EQ(dir, root + "/step-000003");
  std::string manifest = slurp(dir + "/manifest.json");
  std::string shard = slurp(dir + "/rank-00000.safetensors");
  ASSERT_FALSE(manifest.empty());
  ASSERT_FALSE(shard.empty());
  char crc[16];
  std::snprintf(crc, sizeof(crc), "%08x",
                internal::crc32(0, shard.data(), shard.size()));
  EXPECT_NE(manifest.find("\"bytes\":" + std::to_string(shard.size()) +
                          ",\"crc32\":\"" + crc + "\""),
            std::string::npos)
      << manifest;
  EXPECT_NE(manifest.find("\n  \"step\":3,\n"), std::string::npos);
  // One tensor per line.
  EXPECT_NE(manifest.find("\n    {\"name\":\"w.exp_avg\",\"kind\":\"state\","
                          "\"dtype\":\"F32\",\"shape\":[4,6],\"stage\":-1,"
                          "\"shards\":[{\"file\":\"rank-00000.safetensors\","
                          "\"ranges\":[[[0,4]],[[0,6]]]}]}\n"),
            std::string::npos)
      << manifest;
  EXPECT_NE(shard.find("\"param/w\":{\"dtype\":\"F32\",\"shape\":[4,6]"),
            std::string::npos);
  EXPECT_NE(shard.find("\"__metadata__\":{\"format\":"
                       "\"planrt-checkpoint-shard\",\"step\":\"3\""),
            std::string::npos);
  // No temporaries left; writing the same step again replaces it.
  int entries = 0;
  DIR *d = opendir(dir.c_str());
  while (dirent *e = readdir(d))
    entries += e->d_name[0] != '.';
  closedir(d);
  EXPECT_EQ(entries, 2);
  EXPECT_EQ(internal::write_checkpoint(ctx, 3), dir);
  EXPECT_EQ(slurp(dir + "/rank-00000.safetensors"), shard);
  internal::destroy_context(ctx);
  std::string cmd = "rm -rf '" + std::string(tmpl) + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

} // namespace
