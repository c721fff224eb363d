// Covers the GPU NUMA node lookup against a fake sysfs tree built in a temp dir: bus-id forms,
// missing/-1/malformed entries, and the ZRTIER_NUMA_NODE override.
#include "runtime/store/numa.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/testutil/temp_dir.h"

namespace zrtier {
namespace {

namespace fs = std::filesystem;

class NumaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("/tmp/zrtier-numa-test-");
    ASSERT_FALSE(root_.empty());
    Device("0000:3b:00.0", "1\n");
    Device("0000:af:00.0", "-1\n");
    Device("0001:02:00.1", "3");
    Device("0000:5e:00.0", "garbage\n");
    fs::create_directories(root_ + "/bus/pci/devices/0000:d8:00.0");  // no numa_node file
  }
  void TearDown() override { fs::remove_all(root_); }
  void Device(const std::string& id, const std::string& node) {
    std::string dir = root_ + "/bus/pci/devices/" + id;
    fs::create_directories(dir);
    std::ofstream(dir + "/numa_node") << node;
  }
  std::string root_;
};

TEST_F(NumaTest, ReadsTheNodeOfTheGpu) {
  EXPECT_EQ(GpuNumaNode(root_, "0000:3b:00.0"), 1);
  EXPECT_EQ(GpuNumaNode(root_, "0000:3B:00.0"), 1) << "cudaDeviceGetPCIBusId's upper case";
  EXPECT_EQ(GpuNumaNode(root_, "00000000:3B:00.0"), 1) << "nvidia-smi's 8-digit domain";
  EXPECT_EQ(GpuNumaNode(root_, "0001:02:00.1"), 3);
}

TEST_F(NumaTest, NoPreferenceWhenUnknown) {
  EXPECT_EQ(GpuNumaNode(root_, "0000:af:00.0"), -1) << "-1 in sysfs";
  EXPECT_EQ(GpuNumaNode(root_, "0000:5e:00.0"), -1) << "malformed";
  EXPECT_EQ(GpuNumaNode(root_, "0000:d8:00.0"), -1) << "no numa_node file";
  EXPECT_EQ(GpuNumaNode(root_, "0000:01:00.0"), -1) << "no such device";
  EXPECT_EQ(GpuNumaNode(root_, "not a bus id"), -1);
  EXPECT_EQ(GpuNumaNode(root_, ""), -1);
  EXPECT_EQ(GpuNumaNode(root_ + "/nowhere", "0000:3b:00.0"), -1);
}

TEST_F(NumaTest, NormalizesBusIds) {
  EXPECT_EQ(NormalizePciBusId("0000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("0:3b:0.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("0000:3b:00"), "");
  EXPECT_EQ(NormalizePciBusId("0000:3b:00.9"), "");
  EXPECT_EQ(NormalizePciBusId("zz00:3b:00.0"), "");
}

TEST_F(NumaTest, OptionOverridesTheGpuNode) {
  Options opts;
  ASSERT_TRUE(opts.Set(Opt::kNumaNode, "2").ok());
  EXPECT_EQ(ResolveNumaNode(opts, "0000:3b:00.0"), 2);
  ASSERT_TRUE(opts.Set(Opt::kNumaNode, "-1").ok());
  // With -1 the real /sys decides; a bus id that exists nowhere gives no preference.
  EXPECT_EQ(ResolveNumaNode(opts, "ffff:ff:1f.7"), -1);
}

}  // namespace
}  // namespace zrtier
