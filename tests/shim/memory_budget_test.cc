// Pinned in place and the memory budget (runtime/t0/pinned_runs.h, runtime/shim/memory_budget.h)
// over the real engine and the fake CUDA runtime: with room, regions are pinned where they are and
// copies go straight from and to their pages (no T0 slot, exact bytes, CPU stores seen); a budget
// smaller than the data pins only what fits; when the machine runs short (the auto budget, from a
// scripted /proc/meminfo) the coldest runs are unpinned and pinned again once it has room; copies
// stay exact while runs are unpinned under them; freeing a pinned region unregisters it.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/engine/engine.h"
#include "runtime/shim/shim.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/testutil/bytes.h"
#include "tests/testutil/skip.h"

namespace zrtier {
namespace {

// The real kernel, except that /proc/meminfo says what the test sets.
class MeminfoOs : public Os {
 public:
  void SetAvailable(uint64_t bytes) { available_.store(bytes); }
  long Open(const char* path, int flags, mode_t mode) override {
    if (strcmp(path, "/proc/meminfo") == 0) return kFd;
    return Os::Open(path, flags, mode);
  }
  long Read(int fd, void* buf, size_t len) override {
    if (fd != kFd) return Os::Read(fd, buf, len);
    const std::string text =
        "MemTotal:       25165824 kB\nMemFree:         1000000 kB\n"
        "MemAvailable:   " +
        std::to_string(available_.load() / 1024) + " kB\n";
    const size_t n = std::min(len, text.size());
    memcpy(buf, text.data(), n);
    return static_cast<long>(n);
  }
  long Close(int fd) override { return fd == kFd ? 0 : Os::Close(fd); }

 private:
  static constexpr int kFd = 1 << 20;
  std::atomic<uint64_t> available_{64ull << 30};
};

constexpr uint64_t kMiB = 1 << 20, kGiB = 1ull << 30;

class MemoryBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZRTIER_SKIP_UNLESS_UFFD();
    ASSERT_TRUE(CudaApiStatus().ok()) << CudaApiStatus().ToString();
  }
  // A shim pinning in place with budget `memory` (0 = auto from meminfo_); `physical` sets the
  // auto reserve (max(1G, physical/16)).
  void Build(uint64_t memory, uint64_t physical = 16 * kGiB, int repin_quiet_ms = 0) {
    shim_.reset();
    Options opts;
    ASSERT_TRUE(opts.Set(Opt::kArena, "4G").ok());
    ASSERT_TRUE(opts.Set(Opt::kChunk, "64K").ok());
    std::unique_ptr<Engine> engine;
    ASSERT_TRUE(Engine::Create(opts, Os::Default(), nullptr, &engine).ok());
    engine_ = engine.get();
    std::unique_ptr<PinnedPool> pool;
    ASSERT_TRUE(PinnedPool::Create(RealCudaApi(), 64 * 65536, 65536, &pool).ok());
    ShimConfig cfg;
    cfg.workers = 2;
    cfg.pin_in_place = true;
    cfg.budget.memory = memory;
    cfg.budget.physical = physical;
    cfg.budget.pool_bytes = pool->bytes();
    cfg.budget.repin_quiet_ms = repin_quiet_ms;
    cfg.os = &meminfo_;
    shim_ = std::make_unique<Shim>(RealCudaApi(), std::move(engine), std::move(pool), cfg);
  }
  void TearDown() override { shim_.reset(); }
  char* Region(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(shim_->HostAlloc(&p, n, 0), cudaSuccess);
    return static_cast<char*>(p);
  }
  // The unfenced-copy tests' start: far from any limit (8 GiB available, no budget, no repin for a
  // minute), fencing off; a region of two runs of random bytes of `seed` and a device buffer as
  // large.
  struct Unfenced {
    size_t n;
    std::vector<char> data;
    char* p;
    char* d;
  };
  Unfenced UnfencedSetUp(uint64_t seed) {
    meminfo_.SetAvailable(8 * kGiB);
    Build(/*memory=*/0, 16 * kGiB, /*repin_quiet_ms=*/60000);
    Unfenced u{2 * PinnedRuns::kRunBytes, {}, nullptr, nullptr};
    u.p = RegionOfRandomBytes(u.n, seed, &u.data);
    u.d = testing::DeviceBuffer(u.n);
    shim_->runs()->SetFencing(false);
    return u;
  }
  // Unpinning a run, on another thread, waits until the copy `held` holds (fakecudaHoldCopies) is
  // let go; `why` says what it waits for.
  void ExpectUnpinWaitsFor(cudaStream_t held, const char* why) {
    std::atomic<size_t> unpinned{0};
    std::thread unpin([&] { unpinned = shim_->runs()->Unpin(PinnedRuns::kRunBytes); });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(unpinned.load(), 0u) << why;
    fakecudaHoldCopies(held, 0);
    unpin.join();
    EXPECT_EQ(unpinned.load(), PinnedRuns::kRunBytes);
  }
  // A region of `n` bytes written with random bytes of `seed` (also in *data).
  char* RegionOfRandomBytes(size_t n, uint64_t seed, std::vector<char>* data) {
    char* p = Region(n);
    *data = testing::RandomBytes(n, seed);
    memcpy(p, data->data(), n);
    return p;
  }
  // H2D of the whole region, compared with `want`.
  void ExpectOnDevice(const char* host, const std::vector<char>& want) {
    char* d = testing::DeviceBuffer(want.size());
    ASSERT_EQ(shim_->Memcpy(d, host, want.size(), cudaMemcpyHostToDevice, nullptr, true),
              cudaSuccess);
    EXPECT_TRUE(testing::FromDevice(d, want.size()) == want);
    cudaFree(d);
  }
  // Waits up to 5 s for `cond`, ticking the keeper.
  template <typename Cond>
  bool Eventually(Cond cond) {
    for (int i = 0; i < 500 && !cond(); ++i) {
      shim_->budget()->Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return cond();
  }

  MeminfoOs meminfo_;
  Engine* engine_ = nullptr;
  std::unique_ptr<Shim> shim_;
};

// The budget counts the RAM store: with a tier below RAM it gets half of ZRTIER_MEMORY unless the
// user set ZRTIER_STORE_LIMIT, so a budget below the compressed data spills instead of being
// exceeded; with RAM alone, or the auto budget, the option's value stands.
TEST(MemoryBudgetRuleTest, TheRamStoreGetsHalfTheBudgetWhenATierIsBelowIt) {
  const uint64_t G = 1ull << 30, forty_percent = 51 * G;
  EXPECT_EQ(MemoryBudget::RamStoreLimit(2 * G, "ram+file", forty_percent, false), G);
  EXPECT_EQ(MemoryBudget::RamStoreLimit(2 * G, "ram+zram", forty_percent, false), G);
  EXPECT_EQ(MemoryBudget::RamStoreLimit(2 * G, "ram+zram+file", forty_percent, false), G);
  EXPECT_EQ(MemoryBudget::RamStoreLimit(2 * G, "ram", forty_percent, false), forty_percent);
  EXPECT_EQ(MemoryBudget::RamStoreLimit(2 * G, "ram+file", G / 2, true), G / 2);
  EXPECT_EQ(MemoryBudget::RamStoreLimit(2 * G, "ram+file", 3 * G, true), 3 * G);
  EXPECT_EQ(MemoryBudget::RamStoreLimit(0, "ram+file", forty_percent, false), forty_percent);
  EXPECT_EQ(MemoryBudget::RamStoreLimit(8 * G, "ram+file", G, false), G);
}

TEST_F(MemoryBudgetTest, WithRoomRegionsArePinnedInPlaceAndCopiedStraight) {
  Build(/*memory=*/0);
  const size_t n = 8 * kMiB;
  char* p = Region(n);
  EXPECT_EQ(engine_->Usage().held_bytes, n) << "pinned where it is";
  EXPECT_EQ(shim_->runs()->pinned_bytes(), n);
  const uint64_t direct = StatGet(Stat::h2d_direct_bytes);
  const size_t free_slots = shim_->pool()->free_slots();
  // CPU stores reach the GPU without a fault or a slot.
  std::vector<char> data = testing::RandomBytes(n, 1);
  memcpy(p, data.data(), n);
  ExpectOnDevice(p, data);
  EXPECT_EQ(StatGet(Stat::h2d_direct_bytes) - direct, n);
  // A D2H lands in the pages themselves: the CPU reads it after the copy.
  std::vector<char> back = testing::RandomBytes(n, 2);
  char* d = testing::DeviceBuffer(n);
  ASSERT_EQ(cudaMemcpy(d, back.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(p + 4096, d, n - 8192, cudaMemcpyDeviceToHost, nullptr, true),
            cudaSuccess);
  EXPECT_EQ(memcmp(p + 4096, back.data(), n - 8192), 0);
  EXPECT_EQ(memcmp(p, data.data(), 4096), 0) << "bytes around the copy stay";
  EXPECT_EQ(shim_->pool()->free_slots(), free_slots) << "no T0 slot was used";
  EXPECT_EQ(fakecudaPageableAsyncCopies(), 0u) << "the copies read registered memory";
  cudaFree(d);
  // Freed, the region's pages are unregistered: the same range can be pinned again.
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
  EXPECT_EQ(engine_->Usage().held_bytes, 0u);
  EXPECT_EQ(shim_->runs()->pinned_bytes(), 0u);
  char* q = Region(n);
  EXPECT_EQ(shim_->runs()->pinned_bytes(), n);
  ASSERT_EQ(shim_->FreeHost(q), cudaSuccess);
}

TEST_F(MemoryBudgetTest, ABudgetSmallerThanTheDataPinsOnlyWhatFits) {
  // 256 MiB of budget, 4 MiB of pool: a 192 MiB region and a 128 MiB one cannot both stay pinned.
  Build(/*memory=*/256 * kMiB);
  char* a = Region(192 * kMiB);
  char* b = Region(128 * kMiB);
  const uint64_t limit = shim_->budget()->resident_limit();
  EXPECT_LE(limit, 256 * kMiB);
  EXPECT_LE(engine_->Usage().held_bytes, limit);
  EXPECT_LT(shim_->runs()->pinned_bytes(), 320 * kMiB) << "not everything is pinned";
  EXPECT_GT(shim_->runs()->pinned_bytes(), 0u) << "what fits is";
  // Every byte still arrives, pinned or not.
  std::vector<char> da = testing::RandomBytes(192 * kMiB, 3),
                    db = testing::RandomBytes(128 * kMiB, 4);
  memcpy(a, da.data(), da.size());
  memcpy(b, db.data(), db.size());
  ExpectOnDevice(a, da);
  ExpectOnDevice(b, db);
  // The resident limit is the budget's: the rest is compressed down to it.
  EXPECT_TRUE(Eventually([&] { return engine_->Usage().resident_bytes <= limit + 16 * kMiB; }))
      << engine_->Usage().resident_bytes << " resident, limit " << limit;
  ExpectOnDevice(a, da);
  ExpectOnDevice(b, db);
  ASSERT_EQ(shim_->FreeHost(a), cudaSuccess);
  ASSERT_EQ(shim_->FreeHost(b), cudaSuccess);
}

// Host memory zrtier pins for itself besides the pool (the GPU decode's staging ring) comes out
// of the resident limit like the pool, and goes back to it when released.
TEST_F(MemoryBudgetTest, OtherPinnedMemoryComesOutOfTheResidentLimit) {
  Build(/*memory=*/256 * kMiB);
  shim_->budget()->Tick();
  const uint64_t limit = shim_->budget()->resident_limit();
  shim_->budget()->AddPinned(64 * kMiB);
  EXPECT_EQ(shim_->budget()->other_pinned(), 64 * kMiB);
  shim_->budget()->Tick();
  EXPECT_EQ(shim_->budget()->resident_limit(), limit - 64 * kMiB);
  shim_->budget()->AddPinned(-static_cast<int64_t>(64 * kMiB));
  shim_->budget()->Tick();
  EXPECT_EQ(shim_->budget()->resident_limit(), limit);
}

TEST_F(MemoryBudgetTest, WhenTheMachineRunsShortRunsAreUnpinnedAndPinnedAgainLater) {
  // The auto budget: 16 GiB of RAM (reserve 1 GiB), 8 GiB available at first.
  meminfo_.SetAvailable(8 * kGiB);
  Build(/*memory=*/0, 16 * kGiB, /*repin_quiet_ms=*/100);
  const size_t n = 256 * kMiB;
  char* p = Region(n);
  EXPECT_EQ(shim_->runs()->pinned_bytes(), n);
  std::vector<char> data = testing::RandomBytes(n, 5);
  memcpy(p, data.data(), n);
  // Short by 200 MiB below the reserve: the budget shrinks below what is managed, runs unpin.
  meminfo_.SetAvailable(kGiB - 200 * kMiB);
  EXPECT_TRUE(Eventually([&] { return shim_->runs()->pinned_bytes() < n; }));
  EXPECT_GT(StatGet(Stat::runs_unpinned), 0u);
  EXPECT_LT(shim_->budget()->budget(), n + 64 * kMiB);
  ExpectOnDevice(p, data);
  // Room again: after the quiet time everything is pinned again.
  meminfo_.SetAvailable(8 * kGiB);
  EXPECT_TRUE(Eventually([&] { return shim_->runs()->pinned_bytes() == n; }));
  ExpectOnDevice(p, data);
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
}

// Threads copy a pinned region both ways (each in its half of it, two runs) and check every byte
// while the keeper unpins and repins its runs under them.
TEST_F(MemoryBudgetTest, CopiesStayExactWhileRunsAreUnpinnedUnderThem) {
  meminfo_.SetAvailable(8 * kGiB);
  Build(/*memory=*/0, 16 * kGiB, /*repin_quiet_ms=*/0);
  const size_t n = 4 * PinnedRuns::kRunBytes;
  std::vector<char> data;
  char* p = RegionOfRandomBytes(n, 6, &data);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      const size_t len = PinnedRuns::kRunBytes / 2;
      char* d = testing::DeviceBuffer(len);
      std::vector<char> out(len);
      uint64_t x = 77 + t;
      while (!stop.load()) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        // Each thread in its own half: a write-back never races another thread's read.
        const size_t off = t * (n / 2) + (((x >> 20) % (n / 2 - len)) & ~size_t{4095});
        if (shim_->Memcpy(d, p + off, len, cudaMemcpyHostToDevice, s, false) != cudaSuccess ||
            cudaMemcpyAsync(out.data(), d, len, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
            cudaStreamSynchronize(s) != cudaSuccess ||
            memcmp(out.data(), data.data() + off, len) != 0)
          ++mismatches;
        // And back into the region: the same bytes, so every reader's expectation holds.
        if (shim_->Memcpy(p + off, d, len, cudaMemcpyDeviceToHost, s, true) != cudaSuccess)
          ++mismatches;
      }
      cudaFree(d);
      cudaStreamDestroy(s);
    });
  }
  for (int round = 0; round < 6; ++round) {
    meminfo_.SetAvailable(round % 2 ? 8 * kGiB : kGiB - 128 * kMiB);
    for (int i = 0; i < 10; ++i) {
      shim_->budget()->Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  stop.store(true);
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_GT(StatGet(Stat::runs_unpinned), 0u);
  ExpectOnDevice(p, data);
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
}

// A region of many runs is pinned by its allocation while the keeper pins runs of it too (it sees
// the region as soon as it is listed): each run is pinned once, nothing is registered twice.
TEST_F(MemoryBudgetTest, ARegionPinnedWhileTheKeeperRepinsIsPinnedOnce) {
  Build(/*memory=*/0, 16 * kGiB, /*repin_quiet_ms=*/0);
  for (int round = 0; round < 3; ++round) {
    const size_t n = 24 * PinnedRuns::kRunBytes;
    char* p = Region(n);
    EXPECT_FALSE(shim_->runs()->broken()) << "a registration failed";
    EXPECT_TRUE(Eventually([&] { return shim_->runs()->pinned_bytes() == n; }));
    EXPECT_EQ(engine_->Usage().held_bytes, n);
    ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
  }
}

// A program on device 1 of a two-device machine: the keeper unpins and pins again, and the event
// watcher waits for copies, on device 1, never creating a context on device 0 from their threads.
TEST_F(MemoryBudgetTest, TheKeeperWorksOnTheDeviceOfTheProgram) {
  setenv("FAKE_CUDA_DEVICES", "2", 1);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  meminfo_.SetAvailable(8 * kGiB);
  Build(/*memory=*/0, 16 * kGiB, /*repin_quiet_ms=*/0);
  fakecudaResetDevicesTouched();
  const size_t n = 4 * PinnedRuns::kRunBytes;
  std::vector<char> data;
  char* p = RegionOfRandomBytes(n, 8, &data);
  ExpectOnDevice(p, data);
  // Only the keeper thread ticks from here on: the unpinning and the pinning again are its own.
  auto keeper_gets = [&](auto cond) {
    for (int i = 0; i < 500 && !cond(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return cond();
  };
  const uint64_t unpinned = StatGet(Stat::runs_unpinned);
  meminfo_.SetAvailable(kGiB - 200 * kMiB);
  EXPECT_TRUE(keeper_gets([&] { return StatGet(Stat::runs_unpinned) > unpinned; }));
  EXPECT_LT(shim_->runs()->pinned_bytes(), n);
  // A device-to-host copy into the unpinned runs lands through T0 slots: the event watcher's
  // thread waits for its pieces.
  const uint64_t via_slots = StatGet(Stat::d2h_dma_ops);
  data = testing::RandomBytes(n, 9);
  char* d = testing::DeviceBuffer(n);
  ASSERT_EQ(cudaMemcpy(d, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(p, d, n, cudaMemcpyDeviceToHost, nullptr, true), cudaSuccess);
  EXPECT_EQ(memcmp(p, data.data(), n), 0);
  EXPECT_GT(StatGet(Stat::d2h_dma_ops), via_slots);
  cudaFree(d);
  meminfo_.SetAvailable(8 * kGiB);
  EXPECT_TRUE(keeper_gets([&] { return shim_->runs()->pinned_bytes() == n; }));
  ExpectOnDevice(p, data);
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
  shim_.reset();
  EXPECT_EQ(fakecudaDevicesTouched(), 1u << 1) << "a CUDA call ran on device 0";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  unsetenv("FAKE_CUDA_DEVICES");
}

TEST(MemoryBudgetParse, MemAvailable) {
  uint64_t v = 0;
  EXPECT_TRUE(MemoryBudget::ParseMemAvailable("MemTotal: 10 kB\nMemAvailable:    2048 kB\n", &v));
  EXPECT_EQ(v, 2048u * 1024);
  EXPECT_FALSE(MemoryBudget::ParseMemAvailable("MemTotal: 10 kB\n", &v));
}

// A copy issued while its stream captures a CUDA graph is the real copy of the pages pinned in
// place: recorded without a call that would invalidate the capture, and its runs stay pinned --
// the graph may replay it at any time -- until the region is freed.
TEST_F(MemoryBudgetTest, ACopyDuringGraphCaptureKeepsItsPagesPinned) {
  Build(/*memory=*/0);
  const size_t n = 2 * PinnedRuns::kRunBytes;
  char* p = Region(n);
  ASSERT_EQ(shim_->runs()->pinned_bytes(), n);
  std::vector<char> data = testing::RandomBytes(n, 8), back = testing::RandomBytes(n / 2, 9);
  memcpy(p, data.data(), n);
  char* d = testing::DeviceBuffer(n);
  char* src = testing::DeviceBuffer(n / 2);
  ASSERT_EQ(cudaMemcpy(src, back.data(), n / 2, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  fakecudaSetCapturing(s, 1);
  // The first run whole, and a copy back into the second.
  EXPECT_EQ(shim_->Memcpy(d, p, n / 2, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  EXPECT_EQ(shim_->Memcpy(p + n / 2, src, n / 2, cudaMemcpyDeviceToHost, s, false), cudaSuccess);
  EXPECT_EQ(shim_->Memcpy(d, p, n / 2, cudaMemcpyHostToDevice, s, true),
            cudaErrorStreamCaptureUnsupported)
      << "a synchronous copy is not capturable, with zrtier or without";
  EXPECT_FALSE(fakecudaCaptureInvalidated());
  fakecudaSetCapturing(s, 0);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(testing::FromDevice(d, n / 2) ==
              std::vector<char>(data.begin(), data.begin() + n / 2));
  EXPECT_EQ(memcmp(p + n / 2, back.data(), n / 2), 0);
  EXPECT_EQ(shim_->runs()->captured_bytes(), n);
  EXPECT_EQ(StatGet(Stat::pinned_for_good_bytes), n) << "the statistic says so";
  EXPECT_EQ(shim_->runs()->Unpin(UINT64_MAX), 0u) << "captured runs stay pinned";
  EXPECT_EQ(shim_->runs()->pinned_bytes(), n);
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
  EXPECT_EQ(shim_->runs()->captured_bytes(), 0u);
  EXPECT_EQ(StatGet(Stat::pinned_for_good_bytes), 0u);
  EXPECT_EQ(shim_->runs()->pinned_bytes(), 0u);
  cudaFree(d);
  cudaFree(src);
  cudaStreamDestroy(s);
}

// A run that the budget had unpinned is pinned for a captured copy (its chunks were compressed
// meanwhile: the copy still reads every byte), from the capturing thread without invalidating
// the capture; the keeper's own calls meanwhile do not invalidate it either.
TEST_F(MemoryBudgetTest, AnUnpinnedRunIsPinnedAgainForACapturedCopy) {
  meminfo_.SetAvailable(8 * kGiB);
  Build(/*memory=*/0, 16 * kGiB, /*repin_quiet_ms=*/60000);
  const size_t n = 2 * PinnedRuns::kRunBytes;
  std::vector<char> data;
  char* p = RegionOfRandomBytes(n, 10, &data);
  ASSERT_EQ(shim_->runs()->Unpin(UINT64_MAX), n);
  ASSERT_EQ(shim_->runs()->pinned_bytes(), 0u);
  char* d = testing::DeviceBuffer(n);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  fakecudaSetCapturing(s, 1);
  EXPECT_EQ(
      shim_->Memcpy(d + 4096, p + 4096, PinnedRuns::kRunBytes, cudaMemcpyHostToDevice, s, false),
      cudaSuccess);
  // The keeper ticks meanwhile (its registrations, if any, are relaxed too).
  for (int i = 0; i < 3; ++i) shim_->budget()->Tick();
  EXPECT_FALSE(fakecudaCaptureInvalidated());
  fakecudaSetCapturing(s, 0);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(shim_->runs()->captured_bytes(), n) << "both runs the copy touches";
  EXPECT_EQ(shim_->runs()->pinned_bytes(), n);
  std::vector<char> got = testing::FromDevice(d + 4096, PinnedRuns::kRunBytes);
  EXPECT_EQ(memcmp(got.data(), data.data() + 4096, got.size()), 0);
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
  cudaFree(d);
  cudaStreamDestroy(s);
}

// Copies issued without fences (far from the limit) are waited for, when their run is unpinned, by
// synchronizing the streams they went on, not the device: a graph that another stream captures
// meanwhile stays valid. A stream the program destroyed is not synchronized (the device is).
TEST_F(MemoryBudgetTest, UnpinningWaitsForUnfencedCopiesOnTheirStreams) {
  auto [n, data, p, d] = UnfencedSetUp(12);
  cudaStream_t s, cap, gone;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking), cudaSuccess);
  // Held in the stream until released: the unpin must wait for it.
  fakecudaHoldCopies(s, 1);
  ASSERT_EQ(shim_->Memcpy(d, p, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  fakecudaSetCapturing(cap, 1);
  ExpectUnpinWaitsFor(s, "waits for the copy still in its stream");
  EXPECT_FALSE(fakecudaCaptureInvalidated()) << "a stream synchronize, not a device one";
  EXPECT_TRUE(testing::FromDevice(d, n) == data);
  fakecudaSetCapturing(cap, 0);
  // A copy on a stream destroyed since: the device is synchronized instead.
  shim_->runs()->Repin([](size_t) { return true; });
  ASSERT_EQ(shim_->runs()->pinned_bytes(), n);
  ASSERT_EQ(shim_->Memcpy(d, p, n, cudaMemcpyHostToDevice, gone, false), cudaSuccess);
  ASSERT_EQ(shim_->StreamDestroy(gone), cudaSuccess);
  fakecudaSetCapturing(cap, 1);
  EXPECT_EQ(shim_->runs()->Unpin(UINT64_MAX), n);
  EXPECT_TRUE(fakecudaCaptureInvalidated()) << "the device synchronize ends the capture";
  fakecudaSetCapturing(cap, 0);
  EXPECT_EQ(memcmp(p, data.data(), n), 0);
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
  cudaFree(d);
  cudaStreamDestroy(s);
  cudaStreamDestroy(cap);
}

// Fenced copies on streams the program destroys: each destroyed stream's fence leaves (its event
// is destroyed, so a program making a stream per task leaks none), yet the next unpin still waits
// for the copy before it.
TEST_F(MemoryBudgetTest, AStreamDestroyedWithAFencedCopyIsWaitedForOnceThenForgotten) {
  auto [n, data, p, d] = UnfencedSetUp(14);
  shim_->runs()->SetFencing(true);
  const int64_t events0 = fakecudaLiveEvents();
  for (int i = 0; i < 20; ++i) {  // streams made and destroyed, each after a fenced copy
    cudaStream_t t;
    ASSERT_EQ(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(shim_->Memcpy(d, p, n, cudaMemcpyHostToDevice, t, false), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(t), cudaSuccess);
    ASSERT_EQ(shim_->StreamDestroy(t), cudaSuccess);
  }
  EXPECT_EQ(fakecudaLiveEvents(), events0) << "the events of completed fences go with their stream";
  cudaStream_t gone;
  ASSERT_EQ(cudaStreamCreateWithFlags(&gone, cudaStreamNonBlocking), cudaSuccess);
  fakecudaHoldCopies(gone, 1);
  ASSERT_EQ(shim_->Memcpy(d, p, n, cudaMemcpyHostToDevice, gone, false), cudaSuccess);
  ASSERT_EQ(shim_->StreamDestroy(gone), cudaSuccess);
  ExpectUnpinWaitsFor(gone, "waits for the copy on the destroyed stream");
  EXPECT_TRUE(testing::FromDevice(d, n) == data);
  EXPECT_EQ(fakecudaLiveEvents(), events0) << "the destroyed streams' fence events are gone";
  EXPECT_EQ(memcmp(p, data.data(), n), 0);
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
  cudaFree(d);
}

// A copy on the per-thread default stream: the unpin, on another thread, cannot synchronize that
// stream (cudaStreamPerThread names its own there) and synchronizes the device.
TEST_F(MemoryBudgetTest, UnpinningWaitsForUnfencedCopiesOnThePerThreadStream) {
  auto [n, data, p, d] = UnfencedSetUp(13);
  fakecudaHoldCopies(cudaStreamPerThread, 1);  // this thread's per-thread stream
  ASSERT_EQ(shim_->Memcpy(d, p, n, cudaMemcpyHostToDevice, cudaStreamPerThread, false),
            cudaSuccess);
  ExpectUnpinWaitsFor(cudaStreamPerThread, "waits for the copy still in this thread's stream");
  EXPECT_TRUE(testing::FromDevice(d, n) == data);
  EXPECT_EQ(memcmp(p, data.data(), n), 0);
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
  cudaFree(d);
}

// A copy on the legacy default stream of another device than the region's first one: the unpin
// synchronizes that device's default stream, and the syncing thread keeps its current device.
TEST_F(MemoryBudgetTest, UnpinningSynchronizesTheDefaultStreamOfTheCopysDevice) {
  setenv("FAKE_CUDA_DEVICES", "2", 1);
  meminfo_.SetAvailable(8 * kGiB);
  Build(/*memory=*/0, 16 * kGiB, /*repin_quiet_ms=*/60000);
  const size_t n = 2 * PinnedRuns::kRunBytes;
  char* p = Region(n);  // on device 0
  std::vector<char> data = testing::RandomBytes(n, 14);
  memcpy(p, data.data(), n);
  char* d = testing::DeviceBuffer(n);
  shim_->runs()->SetFencing(false);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(d, p, n, cudaMemcpyHostToDevice, nullptr, false), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  size_t unpinned = 0;
  int device_after = -1;
  uint32_t touched = 0;
  std::thread unpin([&] {
    fakecudaResetDevicesTouched();
    unpinned = shim_->runs()->Unpin(PinnedRuns::kRunBytes);
    touched = fakecudaDevicesTouched();
    cudaGetDevice(&device_after);
  });
  unpin.join();
  EXPECT_EQ(unpinned, PinnedRuns::kRunBytes);
  EXPECT_TRUE(touched & 2u) << "synchronized on device 1 (devices touched: " << touched << ")";
  EXPECT_EQ(device_after, 0);
  EXPECT_TRUE(testing::FromDevice(d, n) == data);
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
  cudaFree(d);
  unsetenv("FAKE_CUDA_DEVICES");
}

// A device pointer to a region (zero-copy access) pins all of it for good and maps it for the
// device: a run pinned before is registered again with the mapping, an unpinned one is pinned.
TEST_F(MemoryBudgetTest, ADevicePointerMapsTheWholeRegionForGood) {
  meminfo_.SetAvailable(8 * kGiB);
  Build(/*memory=*/0, 16 * kGiB, /*repin_quiet_ms=*/60000);
  const size_t n = 2 * PinnedRuns::kRunBytes;
  std::vector<char> data;
  char* p = RegionOfRandomBytes(n, 11, &data);
  // The second run unpinned (its chunks compressed by then or not), the first pinned unmapped.
  ASSERT_EQ(shim_->runs()->Unpin(PinnedRuns::kRunBytes), PinnedRuns::kRunBytes);
  ASSERT_EQ(shim_->runs()->pinned_bytes(), PinnedRuns::kRunBytes);
  void* dev = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&dev, p, 0), cudaErrorInvalidValue)
      << "the fake gives no device address of a run registered without the mapping";
  ASSERT_EQ(shim_->HostGetDevicePointer(&dev, p + 4096, 0), cudaSuccess);
  EXPECT_EQ(dev, p + 4096);
  EXPECT_EQ(shim_->runs()->pinned_bytes(), n);
  EXPECT_EQ(shim_->runs()->captured_bytes(), n);
  ASSERT_EQ(cudaHostGetDevicePointer(&dev, p + n - 4096, 0), cudaSuccess) << "mapped";
  EXPECT_EQ(shim_->runs()->Unpin(UINT64_MAX), 0u) << "pinned for good";
  EXPECT_EQ(memcmp(p, data.data(), n), 0);
  ExpectOnDevice(p, data);
  ASSERT_EQ(shim_->FreeHost(p), cudaSuccess);
  EXPECT_EQ(shim_->runs()->captured_bytes(), 0u);
}

}  // namespace
}  // namespace zrtier
