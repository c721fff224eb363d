// End to end through LD_PRELOAD=libzrtier.so, exactly as users run it: this program knows nothing
// of zrtier (it links only the fake libcudart.so.13) and checks exact bytes through pinned
// allocations, copies in both directions, stream order, host functions, threads, the pointer
// queries, the pass-through cases, ZRTIER_DISABLE=1, the init fallback, ZRTIER_REQUIRE=1's exit
// instead of a fallback, and ZRTIER_CRASH_REPORT=1's report of a crash. ctest runs it several
// times with different environments and gtest filters (tests/shim/CMakeLists.txt).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/fake_cuda/fake_cuda.h"
#include "tests/testutil/bytes.h"

extern "C" cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count,
                                            cudaMemcpyKind kind, cudaStream_t stream);

namespace {

std::vector<char> Random(size_t n, uint64_t seed) {
  return zrtier::testing::RandomBytes(n, seed);
}

// Allocates pinned memory; *managed says whether zrtier took it (the real runtime -- the fake --
// does not know the pointer).
char* PinnedAlloc(size_t n, unsigned flags, bool* managed) {
  void* p = nullptr;
  EXPECT_EQ(cudaHostAlloc(&p, n, flags), cudaSuccess);
  *managed = p && !fakecudaAllocated(p);
  return static_cast<char*>(p);
}

char* Device(size_t n) {
  return zrtier::testing::DeviceBuffer(n);
}
using zrtier::testing::FromDevice;

// Captures what the process writes to stderr while `fn` runs.
template <typename Fn>
std::string CaptureStderr(Fn fn) {
  char path[] = "/tmp/zrtier-stderr-XXXXXX";
  int fd = mkstemp(path);
  fflush(stderr);
  int saved = dup(2);
  dup2(fd, 2);
  fn();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string out;
  char buf[4096];
  ssize_t n;
  lseek(fd, 0, SEEK_SET);
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  unlink(path);
  fputs(out.c_str(), stderr);
  return out;
}

bool Preloaded() {
  const char* p = getenv("LD_PRELOAD");
  return p && strstr(p, "libzrtier");
}

// ---- zrtier active ----

TEST(Preload, RegionRoundTripExactBytes) {
  ASSERT_TRUE(Preloaded()) << "run through ctest (LD_PRELOAD=libzrtier.so)";
  const size_t n = (6 << 20) + 12345;
  bool managed = false;
  char* r = PinnedAlloc(n, 0, &managed);
  ASSERT_TRUE(managed) << "a 6 MiB cudaHostAlloc was not taken by zrtier";
  cudaPointerAttributes a;
  ASSERT_EQ(cudaPointerGetAttributes(&a, r + 77), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost) << "tensor.is_pinned() would be false";
  EXPECT_EQ(a.hostPointer, r + 77);

  // Never written: reads as zeros through the GPU (memset path) and the CPU.
  char* d = Device(n);
  std::vector<char> junk(n, 0x33);
  ASSERT_EQ(cudaMemcpy(d, junk.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, r, n, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(FromDevice(d, n), std::vector<char>(n, 0));

  // CPU writes (page faults resolved by zrtier), then H2D on a stream, twice (second from T0).
  auto data = Random(n, 1);
  memcpy(r, data.data(), n);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(cudaMemcpy(d, junk.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(d, r, n, cudaMemcpyHostToDevice, s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(FromDevice(d, n), data) << "pass " << i;
  }

  // D2H at an unaligned offset into the region; the CPU then reads the published bytes.
  auto fresh = Random(n, 2);
  ASSERT_EQ(cudaMemcpy(d, fresh.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(r + 4099, d + 4099, n - 9000, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  memcpy(data.data() + 4099, fresh.data() + 4099, n - 9000);
  EXPECT_EQ(memcmp(r, data.data(), n), 0);
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(fakecudaPageableAsyncCopies(), 0u) << "region memory was handed to a DMA";
  EXPECT_EQ(fakecudaCallsFromHostFunctions(), 0u);
}

TEST(Preload, D2HThenH2DSameStreamAndHostFunctionSeesData) {
  const size_t n = 4 << 20;
  bool managed = false;
  char* r = PinnedAlloc(n, 0, &managed);
  ASSERT_TRUE(managed);
  char* a = Device(n);
  char* b = Device(n);
  auto data = Random(n, 3);
  ASSERT_EQ(cudaMemcpy(a, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(r, a, n, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(b, r, n, cudaMemcpyHostToDevice, s), cudaSuccess);
  // A host function queued after the D2H sees the bytes in the region (stream order).
  struct Check {
    const char* r;
    const std::vector<char>* want;
    bool ok = false;
  } check{r, &data};
  ASSERT_EQ(cudaLaunchHostFunc(
                s,
                [](void* p) {
                  auto* c = static_cast<Check*>(p);
                  c->ok = memcmp(c->r, c->want->data(), c->want->size()) == 0;
                },
                &check),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(check.ok);
  EXPECT_EQ(FromDevice(b, n), data);
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
}

TEST(Preload, CopiesLargerThanThePoolAndPerThreadStream) {
  // ZRTIER_PINNED_POOL is 512K in this run: a 9 MiB copy cycles the slots.
  const size_t n = 9 << 20;
  bool managed = false;
  char* r = PinnedAlloc(n, 0, &managed);
  ASSERT_TRUE(managed);
  char* a = Device(n);
  char* b = Device(n);
  auto data = Random(n, 4);
  ASSERT_EQ(cudaMemcpy(a, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync_ptsz(r + 1, a + 1, n - 1, cudaMemcpyDeviceToHost, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync_ptsz(b + 1, r + 1, n - 1, cudaMemcpyDefault, nullptr), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
  auto got = FromDevice(b, n);
  EXPECT_EQ(memcmp(got.data() + 1, data.data() + 1, n - 1), 0);
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
}

TEST(Preload, BatchAnd2DCopies) {
  const size_t n = 3 << 20;
  bool managed = false;
  char* r = PinnedAlloc(n, 0, &managed);
  ASSERT_TRUE(managed);
  char* d = Device(n);
  char* d2 = Device(n);
  auto data = Random(n, 6);
  memcpy(r, data.data(), n);
  std::vector<char> host(n);
  // A batch mixing a region copy (H2D), a device-to-device copy and a copy to pageable memory.
  void* dsts[3] = {d, d2, host.data()};
  const void* srcs[3] = {r, d, r + 5};
  size_t sizes[3] = {n, n, n - 5};
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t idx = 0;
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyBatchAsync(dsts, srcs, sizes, 3, &attr, &idx, 1, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(FromDevice(d2, n), data);
  EXPECT_EQ(memcmp(host.data(), data.data() + 5, n - 5), 0);
  // 2D: 64 rows of 10000 bytes at pitch 40000 out of the region, and back into it at pitch 20000.
  ASSERT_EQ(cudaMemcpy2DAsync(d, 10000, r + 3, 40000, 10000, 64, cudaMemcpyHostToDevice, s),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy2D(r + 100, 20000, d, 10000, 10000, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (int row = 0; row < 64; ++row)
    memcpy(data.data() + 100 + row * 20000, data.data() + 3 + row * 40000, 10000);
  EXPECT_EQ(memcmp(r, data.data(), n), 0);
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
}

TEST(Preload, ColdDataBeyondTheResidentLimit) {
  // ZRTIER_RESIDENT_LIMIT is 2M in this run: most of 24 MiB written by the CPU gets evicted to the
  // compressed store; the H2D copies read it back (decode into T0 slots).
  const size_t n = 24 << 20;
  bool managed = false;
  char* r = PinnedAlloc(n, 0, &managed);
  ASSERT_TRUE(managed);
  auto data = Random(n, 5);
  for (size_t i = 0; i < n; i += 64) data[i] = 0;  // a little compressible structure
  memcpy(r, data.data(), n);
  usleep(200 * 1000);  // let the evictor catch up
  char* d = Device(n);
  ASSERT_EQ(cudaMemcpy(d, r, n, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(FromDevice(d, n), data);
  EXPECT_EQ(memcmp(r, data.data(), n), 0);
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
}

TEST(Preload, ThreadsAndStreams) {
  const int kThreads = 4;
  std::vector<std::thread> th;
  std::atomic<int> bad{0};
  for (int t = 0; t < kThreads; ++t) {
    th.emplace_back([t, &bad] {
      const size_t n = (2 << 20) + 100 * t;
      bool managed = false;
      char* r = PinnedAlloc(n, 0, &managed);
      char* a = Device(n);
      char* b = Device(n);
      cudaStream_t s;
      cudaStreamCreate(&s);
      for (int it = 0; it < 8; ++it) {
        auto data = Random(n, t * 100 + it);
        cudaMemcpyAsync(a, data.data(), n, cudaMemcpyHostToDevice, s);
        cudaStreamSynchronize(s);
        cudaMemcpyAsync(r, a, n, cudaMemcpyDeviceToHost, s);
        cudaMemcpyAsync(b, r, n, cudaMemcpyHostToDevice, s);
        cudaStreamSynchronize(s);
        if (FromDevice(b, n) != data || memcmp(r, data.data(), n) != 0) ++bad;
      }
      if (!managed) ++bad;
      cudaFreeHost(r);
      cudaFree(a);
      cudaFree(b);
    });
  }
  for (auto& x : th) x.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(Preload, PassThroughCases) {
  bool managed = true;
  char* small = PinnedAlloc(64 << 10, 0, &managed);
  EXPECT_FALSE(managed) << "allocations below ZRTIER_MIN_ALLOC are real pinned memory";
  char* mapped = PinnedAlloc(4 << 20, cudaHostAllocMapped, &managed);
  EXPECT_FALSE(managed) << "Mapped allocations must be real (zero-copy)";
  char* wc = PinnedAlloc(4 << 20, cudaHostAllocWriteCombined, &managed);
  EXPECT_FALSE(managed) << "WriteCombined allocations must be real";
  void* dev = nullptr;
  EXPECT_EQ(cudaHostGetDevicePointer(&dev, mapped, 0), cudaSuccess);
  EXPECT_EQ(dev, mapped);
  EXPECT_EQ(cudaFreeHost(small), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(mapped), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(wc), cudaSuccess);
}

// cudaStreamDestroy is interposed (zrtier forgets the stream) and reaches the runtime.
TEST(Preload, StreamDestroyReachesTheRuntime) {
  bool managed = false;
  const size_t n = 2 << 20;
  char* r = PinnedAlloc(n, 0, &managed);
  ASSERT_TRUE(managed);
  char* d = Device(n);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d, r, n, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorInvalidResourceHandle) << "the fake destroyed it";
  cudaGetLastError();
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
}

TEST(Preload, HooksKeepErrno) {
  bool managed = false;
  errno = 4242;
  char* r = PinnedAlloc(2 << 20, 0, &managed);
  EXPECT_EQ(errno, 4242);
  ASSERT_TRUE(managed);
  cudaPointerAttributes a;
  errno = 4343;
  EXPECT_EQ(cudaPointerGetAttributes(&a, r), cudaSuccess);
  EXPECT_EQ(errno, 4343);
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
  EXPECT_EQ(errno, 4343);
}

TEST(Preload, ForkedChildReadsTheParentsBytes) {
  // DESIGN.md section 8: a child reads the parent's bytes, as with real pinned memory: each chunk
  // fetched from the parent at the child's first touch (runtime/engine/fork.h), whether it is in
  // the region's pages or evicted (ZRTIER_RESIDENT_LIMIT=2M here: most of 8 MiB is compressed);
  // its writes stay its own.
  const size_t n = 8 << 20;
  bool managed = false;
  char* r = PinnedAlloc(n, 0, &managed);
  ASSERT_TRUE(managed);
  auto data = Random(n, 21);
  memcpy(r, data.data(), n);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(30);
    int bad = memcmp(r, data.data(), n) != 0;
    memset(r, 0x11, n);
    _exit(bad ? 11 : (r[n - 1] == 0x11 ? 10 : 12));
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 10)
      << (WIFSIGNALED(status) ? "child killed by a signal"
                              : "child exited with " + std::to_string(WEXITSTATUS(status)) +
                                    " (11 = it read other bytes)");
  EXPECT_EQ(memcmp(r, data.data(), n), 0) << "the child's writes reached the parent";
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
}

// Zero-copy access (vLLM's CPU offload takes a device pointer to pinned weights): the region is
// pinned in place and mapped for the device, whatever the resident limit; its bytes stay.
TEST(Preload, ZeroCopyOnARegionMapsItForTheDevice) {
  bool managed = false;
  const size_t n = 4 << 20;  // above the resident limit of this test's environment
  char* r = PinnedAlloc(n, 0, &managed);
  ASSERT_TRUE(managed);
  memset(r, 0x5d, n);
  cudaPointerAttributes attr;
  ASSERT_EQ(cudaPointerGetAttributes(&attr, r + 8192), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(attr.devicePointer, nullptr) << "not mapped yet: no device address to use";
  void* dev = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&dev, r + 4096, 0), cudaSuccess);
  EXPECT_EQ(dev, r + 4096) << "the fake's device address of mapped host memory is its own";
  // Mapped now: the attributes carry the device address, as for memory the driver mapped.
  ASSERT_EQ(cudaPointerGetAttributes(&attr, r + 8192), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(attr.hostPointer, r + 8192);
  EXPECT_EQ(attr.devicePointer, r + 8192);
  EXPECT_EQ(cudaHostRegister(r, 4096, 0), cudaSuccess);  // inside a region: pins nothing
  EXPECT_EQ(cudaHostUnregister(r), cudaSuccess);
  EXPECT_EQ(cudaHostRegister(r, 4096, cudaHostRegisterMapped), cudaSuccess);
  for (size_t i = 0; i < n; i += 4096) ASSERT_EQ(r[i], 0x5d) << i;
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
}

// With pinning in place off, zero-copy access to a region cannot be given: a clear error.
TEST(NoPinInPlace, ZeroCopyOnARegionFailsClearly) {
  bool managed = false;
  char* r = PinnedAlloc(2 << 20, 0, &managed);
  ASSERT_TRUE(managed);
  void* dev = nullptr;
  std::string err = CaptureStderr(
      [&] { EXPECT_EQ(cudaHostGetDevicePointer(&dev, r, 0), cudaErrorNotSupported); });
  EXPECT_NE(err.find("zero-copy"), std::string::npos) << err;
  EXPECT_EQ(cudaHostRegister(r, 4096, cudaHostRegisterMapped), cudaErrorNotSupported);
  EXPECT_EQ(cudaHostRegister(r, 4096, 0), cudaSuccess);  // inside a region: pins nothing
  EXPECT_EQ(cudaHostUnregister(r), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
}

// ---- ZRTIER_DISABLE=1 / init fallback: everything goes to the real runtime ----

void ExpectRealPinnedWorks() {
  const size_t n = 4 << 20;
  bool managed = true;
  char* r = PinnedAlloc(n, 0, &managed);
  EXPECT_FALSE(managed);
  char* d = Device(n);
  auto data = Random(n, 9);
  memcpy(r, data.data(), n);
  ASSERT_EQ(cudaMemcpy(d, r, n, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(FromDevice(d, n), data);
  EXPECT_EQ(cudaFreeHost(r), cudaSuccess);
}

TEST(Disabled, EverythingPassesThrough) {
  ASSERT_TRUE(Preloaded());
  ASSERT_STREQ(getenv("ZRTIER_DISABLE"), "1");
  std::string err = CaptureStderr([] { ExpectRealPinnedWorks(); });
  EXPECT_EQ(err.find("zrtier"), std::string::npos) << "ZRTIER_DISABLE=1 should be silent: " << err;
}

TEST(Fallback, InitFailureFallsBackWithOneLine) {
  ASSERT_TRUE(Preloaded());
  ASSERT_NE(getenv("ZRTIER_TEST_FAIL_INIT"), nullptr);
  std::string err = CaptureStderr([] {
    ExpectRealPinnedWorks();
    ExpectRealPinnedWorks();
  });
  size_t first = err.find("disabled, every CUDA call goes to the real runtime");
  EXPECT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("disabled", first + 1), std::string::npos) << "said more than once: " << err;
}

// ZRTIER_REQUIRE=1 with a start-up that fails: the first allocation zrtier would manage ends the
// program with status 69 and the reason, instead of passing through.
TEST(Require, InitFailureExitsWithTheReason) {
  ASSERT_TRUE(Preloaded());
  ASSERT_STREQ(getenv("ZRTIER_REQUIRE"), "1");
  ASSERT_NE(getenv("ZRTIER_TEST_FAIL_INIT"), nullptr);
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the fake runtime runs a thread
  // Below the threshold nothing starts: the program goes on.
  bool managed = true;
  char* small = PinnedAlloc(4096, 0, &managed);
  EXPECT_FALSE(managed);
  EXPECT_EQ(cudaFreeHost(small), cudaSuccess);
  EXPECT_EXIT(
      {
        bool m = false;
        PinnedAlloc(4 << 20, 0, &m);
        fprintf(stderr, "still running\n");
        _exit(0);
      },
      ::testing::ExitedWithCode(69), "cannot start and ZRTIER_REQUIRE=1.*userfaultfd unavailable");
}

// ZRTIER_CRASH_REPORT=1: a process that dies of SIGSEGV after zrtier started prints the report
// (signal, thread, native stack) and still dies of the signal.
TEST(CrashReport, ASegfaultIsReportedAndStillKills) {
  ASSERT_TRUE(Preloaded());
  ASSERT_STREQ(getenv("ZRTIER_CRASH_REPORT"), "1");
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the fake runtime runs a thread
  EXPECT_EXIT(
      {
        bool m = false;
        char* p = PinnedAlloc(4 << 20, 0, &m);  // zrtier starts here
        if (!m) _exit(3);
        p[0] = 1;
        *static_cast<volatile int*>(nullptr) = 1;
        _exit(0);
      },
      ::testing::KilledBySignal(SIGSEGV),
      "crash report: signal 11 .* at address \\(nil\\) in thread .*native stack:(.|\n)*end of "
      "crash report");
}

}  // namespace
