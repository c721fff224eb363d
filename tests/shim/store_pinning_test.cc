// StorePinning (runtime/shim/store_pinning.h) over the fake CUDA runtime: Pin registers a mapping;
// Release only queues it (no driver call from the releasing thread) and Reap -- or the next Pin --
// unregisters and unmaps it; Unpin unregisters and keeps the mapping; after one refused
// registration nothing more is registered, and the driver is not asked again.
#include "runtime/shim/store_pinning.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/cuda/cuda_api.h"
#include "tests/fake_cuda/fake_cuda.h"

namespace zrtier {
namespace {

constexpr size_t kBytes = 1 << 20;

// A populated anonymous mapping (the fake, like the driver on such memory, registers it).
char* Mapping() {
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  memset(p, 1, kBytes);
  return static_cast<char*>(p);
}

bool Mapped(const char* p) {
  unsigned char v;
  return mincore(const_cast<char*>(p), 4096, &v) == 0 || errno != ENOMEM;
}

int g_refusals = 0;
cudaError_t g_refusal = cudaErrorMemoryAllocation;
cudaError_t RefuseRegister(void*, size_t, unsigned) {
  ++g_refusals;
  return g_refusal;
}

class StorePinningTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(CudaApiStatus().ok()) << CudaApiStatus().ToString(); }
};

TEST_F(StorePinningTest, ReleasedMappingsAreUnregisteredAndUnmappedByReap) {
  StorePinning pinning(RealCudaApi(), Os::Default());
  const uint64_t gauge = StatGet(Stat::store_pinned_bytes);
  char* a = Mapping();
  char* b = Mapping();
  ASSERT_TRUE(pinning.Pin(a, kBytes));
  ASSERT_TRUE(pinning.Pin(b, kBytes));
  EXPECT_TRUE(fakecudaOwns(a));
  EXPECT_EQ(StatGet(Stat::store_pinned_bytes) - gauge, 2 * kBytes);
  pinning.Release(a, kBytes);
  EXPECT_EQ(pinning.queued_bytes(), kBytes);
  EXPECT_TRUE(fakecudaOwns(a)) << "Release alone calls no driver";
  EXPECT_TRUE(Mapped(a));
  EXPECT_EQ(StatGet(Stat::store_pinned_bytes) - gauge, 2 * kBytes) << "registered until reaped";
  pinning.Reap();
  EXPECT_EQ(pinning.queued_bytes(), 0u);
  EXPECT_EQ(StatGet(Stat::store_pinned_bytes) - gauge, kBytes);
  EXPECT_FALSE(fakecudaOwns(a));
  EXPECT_FALSE(Mapped(a));
  // The next Pin reaps what was released since.
  pinning.Release(b, kBytes);
  char* c = Mapping();
  ASSERT_TRUE(pinning.Pin(c, kBytes));
  EXPECT_FALSE(fakecudaOwns(b));
  EXPECT_FALSE(Mapped(b));
  // Unpin unregisters and leaves the mapping to its owner.
  pinning.Unpin(c, kBytes);
  EXPECT_FALSE(fakecudaOwns(c));
  EXPECT_TRUE(Mapped(c));
  EXPECT_EQ(StatGet(Stat::store_pinned_bytes), gauge);
  munmap(c, kBytes);
}

TEST_F(StorePinningTest, ARefusedRegistrationStopsRegistering) {
  CudaApi api = *RealCudaApi();
  api.cudaHostRegister = &RefuseRegister;
  StorePinning pinning(&api, Os::Default());
  char* a = Mapping();
  g_refusals = 0;
  EXPECT_FALSE(pinning.Pin(a, kBytes));
  EXPECT_FALSE(pinning.Pin(a, kBytes));
  EXPECT_EQ(g_refusals, 1) << "the driver is asked once";
  EXPECT_FALSE(fakecudaOwns(a));
  munmap(a, kBytes);
}

// A refusal says so once on stderr, except the runtime's unloading (the process is exiting).
TEST_F(StorePinningTest, ARefusalIsReportedUnlessTheRuntimeIsUnloading) {
  CudaApi api = *RealCudaApi();
  api.cudaHostRegister = &RefuseRegister;
  char* a = Mapping();
  for (cudaError_t refusal : {cudaErrorMemoryAllocation, cudaErrorCudartUnloading}) {
    g_refusal = refusal;
    StorePinning pinning(&api, Os::Default());
    testing::internal::CaptureStderr();
    EXPECT_FALSE(pinning.Pin(a, kBytes));
    const std::string said = testing::internal::GetCapturedStderr();
    if (refusal == cudaErrorCudartUnloading) {
      EXPECT_EQ(said.find("cudaHostRegister"), std::string::npos) << said;
    } else {
      EXPECT_NE(said.find("cudaHostRegister: 2"), std::string::npos) << said;
    }
  }
  g_refusal = cudaErrorMemoryAllocation;
  munmap(a, kBytes);
}

}  // namespace
}  // namespace zrtier
