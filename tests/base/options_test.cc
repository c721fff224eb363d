// Covers the ZRTIER_* option table: defaults, size syntax, validation, environment parsing.
#include "zrtier/options.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <map>

namespace zrtier {
namespace {

TEST(Options, EveryDefaultParses) {
  Options opts;
  for (int i = 0; i < kOptionCount; ++i) {
    const OptionInfo& info = OptionAt(i);
    EXPECT_TRUE(opts.Set(info.id, info.default_text).ok()) << info.name;
  }
  EXPECT_EQ(opts.Size(Opt::kChunk), 256u << 10);
  EXPECT_EQ(opts.Size(Opt::kMinAlloc), 1u << 20);
  EXPECT_EQ(opts.String(Opt::kStoreBackend), "ram");
}

TEST(Options, Sizes) {
  uint64_t v = 0;
  ASSERT_TRUE(ParseSize("65536", &v).ok());
  EXPECT_EQ(v, 65536u);
  ASSERT_TRUE(ParseSize("64K", &v).ok());
  EXPECT_EQ(v, 65536u);
  ASSERT_TRUE(ParseSize("1.5g", &v).ok());
  EXPECT_EQ(v, 3ull << 29);
  ASSERT_TRUE(ParseSize("2TiB", &v).ok());
  EXPECT_EQ(v, 2ull << 40);
  ASSERT_TRUE(ParseSize("50%", &v).ok());
  EXPECT_NEAR(static_cast<double>(v), PhysicalMemoryBytes() / 2.0, 4096.0);
  EXPECT_FALSE(ParseSize("12Q", &v).ok());
  EXPECT_FALSE(ParseSize("-1G", &v).ok());
  EXPECT_FALSE(ParseSize("", &v).ok());
  EXPECT_FALSE(ParseSize("1.5", &v).ok());
  EXPECT_FALSE(ParseSize("101%", &v).ok());
  EXPECT_EQ(FormatSize(64 << 10), "64K");
  EXPECT_EQ(FormatSize(3ull << 29), "1.5G");
}

TEST(Options, BadValueNamesVariableAndKeepsValue) {
  Options opts;
  Status s = opts.Set(Opt::kChunk, "3000");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ZRTIER_CHUNK='3000'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("power of two"), std::string::npos) << s.message();
  EXPECT_EQ(opts.Size(Opt::kChunk), 256u << 10);
  EXPECT_FALSE(opts.Set(Opt::kCodec, "lz4").ok());
  EXPECT_FALSE(opts.Set(Opt::kStoreBackend, "ram+tape").ok());
  EXPECT_TRUE(opts.Set(Opt::kStoreBackend, "ram+zram+file").ok());
  // Issue #40 row 10: stacks the store refuses are bad values here, not a disabled zrtier later.
  for (const char* bad : {"", "file", "zram", "ram+ram", "ram+file+zram", "ram+file+file",
                          "zram+ram", "ram+", "+ram"}) {
    Status st = opts.Set(Opt::kStoreBackend, bad);
    EXPECT_EQ(st.code(), EINVAL) << bad;
    EXPECT_NE(st.message().find("ZRTIER_STORE_BACKEND"), std::string::npos) << st.message();
  }
  EXPECT_EQ(opts.String(Opt::kStoreBackend), "ram+zram+file");
  for (const char* good : {"ram", "ram+zram", "ram+file", "ram+zram+file"})
    EXPECT_TRUE(opts.Set(Opt::kStoreBackend, good).ok()) << good;
}

// Issue #40 row 10: the default spill folder is per user ("%u" = the effective uid), so the first
// user to spill does not lock the others out of a shared /var/tmp/zrtier.
TEST(OptionsTest, SpillDirIsPerUser) {
  Options opts;
  const std::string uid = std::to_string(geteuid());
  EXPECT_EQ(opts.SpillDir(), "/var/tmp/zrtier-" + uid);
  ASSERT_TRUE(opts.Set(Opt::kSpillDir, "/nvme/%u/zr-%u").ok());
  EXPECT_EQ(opts.SpillDir(), "/nvme/" + uid + "/zr-" + uid);
  ASSERT_TRUE(opts.Set(Opt::kSpillDir, "/nvme/spill").ok());
  EXPECT_EQ(opts.SpillDir(), "/nvme/spill");
  EXPECT_FALSE(opts.Set(Opt::kVerify, "maybe").ok());
  EXPECT_TRUE(opts.Set(Opt::kVerify, "yes").ok());
  EXPECT_TRUE(opts.Bool(Opt::kVerify));
}

TEST(Options, FromEnvironmentWarnsAndKeepsDefault) {
  std::map<std::string, std::string> env = {{"ZRTIER_CHUNK", "128K"},
                                            {"ZRTIER_PINNED_POOL", "12Q"}};
  std::vector<std::string> warnings;
  Options opts = Options::FromEnvironment([&](const std::string& w) { warnings.push_back(w); },
                                          [&](const char* name) -> const char* {
                                            auto it = env.find(name);
                                            return it == env.end() ? nullptr : it->second.c_str();
                                          });
  EXPECT_EQ(opts.Size(Opt::kChunk), 128u << 10);
  EXPECT_EQ(opts.Size(Opt::kPinnedPool), 0u) << "the default (auto) is kept";
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ZRTIER_PINNED_POOL='12Q'"), std::string::npos) << warnings[0];
}

TEST(Options, FindByNameOrFlag) {
  EXPECT_EQ(FindOption("ZRTIER_CHUNK"), Opt::kChunk);
  EXPECT_EQ(FindOption("CHUNK"), Opt::kChunk);
  EXPECT_EQ(FindOption("pool"), Opt::kPinnedPool);
  EXPECT_FALSE(FindOption("NOPE").has_value());
}

}  // namespace
}  // namespace zrtier
