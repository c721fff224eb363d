// The shim over the real Engine (userfaultfd regions, the codec, the RAM store) and the fake CUDA
// runtime: exact bytes through H2D/D2H with the data in every tier -- T0 hit, T1 resident, T2
// compressed after eviction, never written -- CPU access to what a D2H published, and owned slots
// written back once H2D copies read them every cycle.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/engine/engine.h"
#include "runtime/shim/shim.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/testutil/bytes.h"
#include "tests/testutil/faulty_os.h"
#include "tests/testutil/scoped_env.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

// What the owned slots of a D2H-filled cycle did (ShimEngineTest::CycleOwnedLayers).
struct OwnedCycle {
  uint64_t owned_after_fill = 0, owned_after = 0, written_back = 0, stored_more = 0;
  double hit_ratio = 0;
};

class ShimEngineTest : public ::testing::Test {
 protected:
  // The owned-cycle tests' shim: a pool of kOwnedPoolChunks, placement only (no prefetch),
  // `workers` fill threads.
  static constexpr size_t kOwnedPoolChunks = 512;
  void BuildForOwnedCycle(const char* workers) {
    Options policy;
    ASSERT_TRUE(policy.Set(Opt::kPrefetchAhead, "0").ok());
    ASSERT_TRUE(policy.Set(Opt::kWorkers, workers).ok());
    Build(kOwnedPoolChunks, &policy);
  }
  // Fills `layers` layers (twice that pool) by D2H and reads them by H2D for 6 passes (below).
  void CycleOwnedLayers(uint64_t resident_limit, OwnedCycle* out, size_t layers = 8,
                        bool stop_at_writeback = false);
  void SetUp() override {
    ZRTIER_SKIP_UNLESS_UFFD();
    ASSERT_TRUE(CudaApiStatus().ok()) << CudaApiStatus().ToString();
    Build(16, nullptr);
  }
  // (Re)creates the engine and the shim: a pool of `pool_chunks` slots; `prefetch`: the policy
  // layer's options (ShimConfig::policy), null for none.
  void Build(size_t pool_chunks, const Options* prefetch) {
    shim_.reset();
    Options opts;
    ASSERT_TRUE(opts.Set(Opt::kArena, "4G").ok());
    // The piece sizes and DMA counts these tests expect are those of 64 KiB chunks.
    ASSERT_TRUE(opts.Set(Opt::kChunk, "64K").ok());
    ASSERT_TRUE(opts.Set(Opt::kResidentLimit, "0").ok());
    // The CPU-fault counts these tests read are one per chunk touched: no readahead.
    ASSERT_TRUE(opts.Set(Opt::kReadahead, "0").ok());
    // The engine's restore and eviction threads as on a two-core machine, wherever the tests run:
    // the fault counts they bound depend on the thread counts (CpuCyclesAreLearnedForT1's lru run:
    // 769 missing faults on a 16-core machine, 704 on a two-core one).
    ASSERT_TRUE(opts.Set(Opt::kWorkers, "2").ok());
    std::unique_ptr<Engine> engine;
    Status st = Engine::Create(opts, &os_, nullptr, &engine);
    ASSERT_TRUE(st.ok()) << st.ToString();
    engine_ = engine.get();
    chunk_ = engine->chunk_size();
    std::unique_ptr<PinnedPool> pool;
    ASSERT_TRUE(PinnedPool::Create(RealCudaApi(), pool_chunks * chunk_, chunk_, &pool).ok());
    ShimConfig cfg;
    cfg.workers = 2;
    cfg.policy = prefetch;
    shim_ = std::make_unique<Shim>(RealCudaApi(), std::move(engine), std::move(pool), cfg);
  }
  void TearDown() override {
    if (shim_) {
      EXPECT_EQ(fakecudaPageableAsyncCopies(), 0u) << "region memory reached a DMA";
    }
    shim_.reset();
  }
  char* Region(size_t n) {
    void* p = nullptr;
    EXPECT_EQ(shim_->HostAlloc(&p, n, 0), cudaSuccess);
    RegionInfo r;
    EXPECT_TRUE(engine_->Lookup(p, &r));
    return static_cast<char*>(p);
  }
  char* Device(size_t n) { return testing::DeviceBuffer(n); }
  std::vector<char> FromDevice(const char* d, size_t n) { return testing::FromDevice(d, n); }
  void Junk(char* d, size_t n) {
    std::vector<char> j(n, 0x6B);
    ASSERT_EQ(cudaMemcpy(d, j.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  }

  FaultyOs os_;  // the real kernel, counting calls
  Engine* engine_ = nullptr;
  size_t chunk_ = 0;
  std::unique_ptr<Shim> shim_;
};

// Issue #40 row 10: a region allocated through the shim is counted once (regions, region_bytes),
// and freeing it takes exactly that back.
TEST_F(ShimEngineTest, ARegionIsCountedOnce) {
  const uint64_t regions = StatGet(Stat::regions), bytes = StatGet(Stat::region_bytes);
  char* a = Region(64 * chunk_);
  char* b = Region(96 * chunk_ + 777);
  RegionInfo ra, rb;
  ASSERT_TRUE(engine_->Lookup(a, &ra));
  ASSERT_TRUE(engine_->Lookup(b, &rb));
  EXPECT_EQ(StatGet(Stat::regions) - regions, 2u);
  EXPECT_EQ(StatGet(Stat::region_bytes) - bytes, ra.size + rb.size);
  ASSERT_EQ(shim_->FreeHost(a), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::regions) - regions, 1u);
  EXPECT_EQ(StatGet(Stat::region_bytes) - bytes, rb.size);
  ASSERT_EQ(shim_->FreeHost(b), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::regions), regions);
  EXPECT_EQ(StatGet(Stat::region_bytes), bytes);
}

TEST_F(ShimEngineTest, ExactBytesFromEveryTier) {
  const size_t n = 64 * chunk_ + 777;
  char* r = Region(n);
  char* d = Device(n);
  std::vector<char> data(n);
  FillSample(SampleKind::kBf16Gaussian, 7, data.data(), n);
  // Leave chunks 10..13 never written.
  memcpy(r, data.data(), 10 * chunk_);
  memcpy(r + 14 * chunk_, data.data() + 14 * chunk_, n - 14 * chunk_);
  memset(data.data() + 10 * chunk_, 0, 4 * chunk_);

  // T1 resident.
  Junk(d, n);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, nullptr, true), cudaSuccess);
  EXPECT_EQ(FromDevice(d, n), data);

  // T0: a copy of the last 16 chunks (49..64) leaves exactly them in the 16-slot pool (which of
  // them the 65-chunk copy above left cached depends on how its pieces were timed), so the same
  // copy again is all hits.
  size_t tail = n - 49 * chunk_;
  ASSERT_EQ(
      shim_->Memcpy(d + 49 * chunk_, r + 49 * chunk_, tail, cudaMemcpyHostToDevice, nullptr, true),
      cudaSuccess);
  uint64_t ready = StatGet(Stat::copies_ready);
  Junk(d, n);
  ASSERT_EQ(
      shim_->Memcpy(d + 49 * chunk_, r + 49 * chunk_, tail, cudaMemcpyHostToDevice, nullptr, true),
      cudaSuccess);
  auto got = FromDevice(d, n);
  EXPECT_EQ(memcmp(got.data() + 49 * chunk_, data.data() + 49 * chunk_, tail), 0);
  EXPECT_EQ(StatGet(Stat::copies_ready), ready + 1);

  // T2: evict everything to the compressed store; the copy decodes into T0 slots.
  RegionInfo info;
  ASSERT_TRUE(engine_->Lookup(r, &info));
  shim_->pool()->DropRegion(info.id);
  ASSERT_TRUE(engine_->EvictTo(0).ok());
  EngineUsage u = engine_->Usage();
  EXPECT_EQ(u.resident_bytes, 0u);
  EXPECT_GT(u.stored_raw_bytes, 0u);
  Junk(d, n);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, nullptr, true), cudaSuccess);
  EXPECT_EQ(FromDevice(d, n), data);
  EXPECT_EQ(engine_->Usage().resident_bytes, 0u) << "the copy should decode into T0, not install";
  // And the CPU still sees everything.
  EXPECT_EQ(memcmp(r, data.data(), n), 0);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
}

// An H2D of CPU-written (writable) chunks protects them for caching with one ioctl per piece of
// the copy, not one per chunk (Engine::PrepareRead), and a D2H into chunks an H2D has just read
// adopts its slots: no protection change and no copy at all, only their pages dropped (one madvise
// per piece). Every byte stays exact.
TEST_F(ShimEngineTest, ProtectionChangesAreBatchedPerPiece) {
  const size_t chunks = 64, n = chunks * chunk_;
  char* r = Region(n);
  char* d = Device(n);
  std::vector<char> data(n), other(n);
  FillSample(SampleKind::kBf16Gaussian, 9, data.data(), n);
  FillSample(SampleKind::kBf16Relu, 10, other.data(), n);
  memcpy(r, data.data(), n);  // CPU stores: every chunk writable
  const uint64_t cleaned = StatGet(Stat::chunks_cleaned);
  int ioctls = os_.Count(OsCall::kIoctl);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, nullptr, true), cudaSuccess);
  EXPECT_EQ(FromDevice(d, n), data);
  EXPECT_EQ(StatGet(Stat::chunks_cleaned) - cleaned, chunks);
  // The 16-slot pool makes pieces of at most 4 chunks: 16 ioctls, against 64 one per chunk.
  EXPECT_LE(os_.Count(OsCall::kIoctl) - ioctls, static_cast<int>(chunks / 2));
  // Half the pool (more would be written back into the region, one UFFDIO_COPY per chunk).
  const size_t half = 8 * chunk_;
  ASSERT_EQ(cudaMemcpy(d, other.data(), half, cudaMemcpyHostToDevice), cudaSuccess);
  ioctls = os_.Count(OsCall::kIoctl);
  const int madvises = os_.Count(OsCall::kMadvise);
  const uint64_t owned = StatGet(Stat::t0_owned_bytes);
  ASSERT_EQ(shim_->Memcpy(r, d, half, cudaMemcpyDeviceToHost, nullptr, true), cudaSuccess);
  EXPECT_EQ(os_.Count(OsCall::kIoctl) - ioctls, 0);
  // Pieces of 1, 2, 2, 1, 1 and 1 chunks (they grow, then halve towards the end): one madvise
  // each, not one per chunk.
  EXPECT_LE(os_.Count(OsCall::kMadvise) - madvises, 6);
  EXPECT_EQ(StatGet(Stat::t0_owned_bytes) - owned, half);
  EXPECT_EQ(memcmp(r, other.data(), half), 0);  // CPU faults install from the owned slots
  EXPECT_EQ(memcmp(r + half, data.data() + half, n - half), 0);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::t0_owned_bytes), owned);
}

// D2H copies leave their whole chunks in the slots they landed in (owned: no copy into the
// region) while the owned slots stay within half the pool; a copy that does not fit is written
// into the region instead. A repeated D2H supersedes the owned copies of the last; an H2D of owned
// chunks is a T0 hit, also after a CPU load installed one (its slot stays cached, no longer owned);
// zrtier_t0_drop writes owned slots back before it drops; the CPU, Read and a partial D2H see the
// newest bytes throughout.
TEST_F(ShimEngineTest, D2HSlotsAreOwnedWhileTheyFitInHalfThePool) {
  const size_t chunks = 64, n = chunks * chunk_;
  char* r = Region(n);
  char* d = Device(n);
  char* back = Device(n);
  std::vector<char> a(n), b(n);
  FillSample(SampleKind::kBf16Gaussian, 21, a.data(), n);
  FillSample(SampleKind::kFp32Gaussian, 22, b.data(), n);
  RegionInfo info;
  ASSERT_TRUE(engine_->Lookup(r, &info));
  const uint64_t owned0 = StatGet(Stat::t0_owned_bytes);
  const uint64_t wb0 = StatGet(Stat::t0_writebacks);
  ASSERT_EQ(cudaMemcpy(d, a.data(), n, cudaMemcpyHostToDevice), cudaSuccess);

  // 64 chunks through a 16-slot pool do not fit: written into the region, nothing owned.
  ASSERT_EQ(shim_->Memcpy(r, d, n, cudaMemcpyDeviceToHost, nullptr, true), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::t0_owned_bytes), owned0);
  EXPECT_EQ(engine_->Usage().external_bytes, 0u);
  std::vector<char> want = a;

  // The last 8 chunks (half the pool) fit: owned. 4 more do not fit beside them: written.
  const size_t tail = 8 * chunk_, at = n - tail;
  ASSERT_EQ(cudaMemcpy(d + at, b.data() + at, tail, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(r + at, d + at, tail, cudaMemcpyDeviceToHost, nullptr, true),
            cudaSuccess);
  memcpy(want.data() + at, b.data() + at, tail);
  EXPECT_EQ(StatGet(Stat::t0_owned_bytes) - owned0, tail);
  EXPECT_EQ(engine_->Usage().external_bytes, tail);
  ASSERT_EQ(cudaMemcpy(d, b.data(), 4 * chunk_, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(r, d, 4 * chunk_, cudaMemcpyDeviceToHost, nullptr, true), cudaSuccess);
  memcpy(want.data(), b.data(), 4 * chunk_);
  EXPECT_EQ(StatGet(Stat::t0_owned_bytes) - owned0, tail);

  // Read (no fault) and an H2D see every byte; the owned tail is a T0 hit.
  std::vector<char> got(n);
  bool zero = true;
  ASSERT_TRUE(shim_->backend()->Read(r, n, got.data(), &zero).ok());
  EXPECT_FALSE(zero);
  EXPECT_EQ(got, want);
  const uint64_t ready = StatGet(Stat::copies_ready);
  ASSERT_EQ(shim_->Memcpy(back + at, r + at, tail, cudaMemcpyHostToDevice, nullptr, true),
            cudaSuccess);
  EXPECT_EQ(StatGet(Stat::copies_ready), ready + 1);
  ASSERT_EQ(shim_->Memcpy(back, r, n, cudaMemcpyHostToDevice, nullptr, true), cudaSuccess);
  EXPECT_EQ(FromDevice(back, n), want);
  // A CPU load installs an owned chunk from its slot, which stays as a plain cached copy.
  EXPECT_EQ(static_cast<volatile char*>(r)[at + 3 * chunk_ + 5], want[at + 3 * chunk_ + 5]);
  EXPECT_EQ(StatGet(Stat::t0_owned_bytes) - owned0, tail - chunk_);
  ASSERT_EQ(shim_->Memcpy(back + at, r + at, tail, cudaMemcpyHostToDevice, nullptr, true),
            cudaSuccess);
  EXPECT_EQ(StatGet(Stat::copies_ready), ready + 2);

  // A repeated D2H of the tail supersedes its owned copies (no growth, no write-back).
  ASSERT_EQ(cudaMemcpy(d + at, a.data() + at, tail, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(r + at, d + at, tail, cudaMemcpyDeviceToHost, nullptr, true),
            cudaSuccess);
  memcpy(want.data() + at, a.data() + at, tail);
  EXPECT_EQ(StatGet(Stat::t0_owned_bytes) - owned0, tail);
  EXPECT_EQ(StatGet(Stat::t0_writebacks), wb0);

  // A partial D2H (half a chunk inside an owned chunk) merges with the owned copy.
  const size_t mid = at + chunk_ + chunk_ / 4;
  ASSERT_EQ(shim_->Memcpy(r + mid, d, chunk_ / 2, cudaMemcpyDeviceToHost, nullptr, true),
            cudaSuccess);
  memcpy(want.data() + mid, b.data(), chunk_ / 2);
  ASSERT_EQ(shim_->Memcpy(back, r, n, cudaMemcpyHostToDevice, nullptr, true), cudaSuccess);
  EXPECT_EQ(FromDevice(back, n), want);

  // zrtier_t0_drop: owned slots are written back first, nothing is lost.
  shim_->DropT0(info.id);
  EXPECT_GE(StatGet(Stat::t0_writebacks) - wb0, 1u);
  EXPECT_EQ(engine_->Usage().external_bytes, 0u);
  EXPECT_EQ(StatGet(Stat::t0_owned_bytes), owned0);
  EXPECT_EQ(memcmp(r, want.data(), n), 0);  // the CPU (faults or resident pages)
  ASSERT_EQ(shim_->Memcpy(back, r, n, cudaMemcpyHostToDevice, nullptr, true), cudaSuccess);
  EXPECT_EQ(FromDevice(back, n), want);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
}

// D2H copies into one buffer again and again (the bench's T0 case, a buffer written every step):
// every copy's pieces land in runs of consecutive slots, one DMA per piece, although each copy
// frees the previous one's slots -- lower ones every other copy -- while its later pieces are still
// being planned (a slow issuing thread: each event record sleeps, so every piece is published
// before the next one is planned). The copy's own owned chunks are counted per region (no lookup
// per chunk), so a copy of more than the pool's free half still adopts. The bytes arrive every
// time.
TEST_F(ShimEngineTest, RepeatedD2HIntoOneBufferIssuesOneDmaPerPiece) {
  Build(512, nullptr);  // pieces of 16, 32, 64, 40, 20 and 20 chunks for 192 chunks
  testing::ScopedEnv slow_records("FAKE_CUDA_RECORD_DELAY_US", "3000");
  const size_t chunks = 192, n = chunks * chunk_;
  char* r = Region(n);
  char* d = Device(n);
  char* back = Device(n);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  const uint64_t owned0 = StatGet(Stat::t0_owned_bytes);
  for (int round = 0; round < 6; ++round) {
    SCOPED_TRACE(round);
    std::vector<char> data(n);
    FillSample(SampleKind::kBf16Gaussian, 60 + round, data.data(), n);
    ASSERT_EQ(cudaMemcpy(d, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    const uint64_t dmas = StatGet(Stat::d2h_dma_ops);
    ASSERT_EQ(shim_->Memcpy(r, d, n, cudaMemcpyDeviceToHost, s, false), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    if (round > 0) {
      EXPECT_EQ(StatGet(Stat::d2h_dma_ops) - dmas, 6u);
    }
    EXPECT_EQ(StatGet(Stat::t0_owned_bytes) - owned0, n) << "adopted, superseding the last copy";
    ASSERT_EQ(shim_->Memcpy(back, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
    EXPECT_EQ(FromDevice(back, n), data);
  }
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
}

TEST_F(ShimEngineTest, D2HPublishesForTheCpuAndLaterCopies) {
  const size_t n = 40 * chunk_;
  char* r = Region(n);
  char* a = Device(n);
  char* b = Device(n);
  std::vector<char> data(n), want(n, 0);
  FillSample(SampleKind::kBf16Relu, 8, data.data(), n);
  ASSERT_EQ(cudaMemcpy(a, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  // Two overlapping partial D2H copies queued back to back, then an H2D, without a sync.
  ASSERT_EQ(shim_->Memcpy(r + 100, a + 100, 20 * chunk_, cudaMemcpyDeviceToHost, s, false),
            cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(r + 5 * chunk_ + 3, a, 30 * chunk_, cudaMemcpyDeviceToHost, s, false),
            cudaSuccess);
  memcpy(want.data() + 100, data.data() + 100, 20 * chunk_);
  memcpy(want.data() + 5 * chunk_ + 3, data.data(), 30 * chunk_);
  Junk(b, n);
  ASSERT_EQ(shim_->Memcpy(b, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(FromDevice(b, n), want);
  EXPECT_EQ(memcmp(r, want.data(), n), 0);
  // Evicted and copied again.
  ASSERT_TRUE(engine_->EvictTo(0).ok());
  Junk(b, n);
  ASSERT_EQ(shim_->Memcpy(b, r, n, cudaMemcpyHostToDevice, s, true), cudaSuccess);
  EXPECT_EQ(FromDevice(b, n), want);
  EXPECT_EQ(fakecudaCallsFromHostFunctions(), 0u);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
}

// A D2H copy's stream goes on only once the copy is published. Where the driver offers stream
// waits on host memory the copy ends with one (no host function); where it refuses them
// (FAKE_CUDA_NO_MEMOPS=1) with a host function. Either way the CPU and the next H2D on the stream
// (queued before any synchronize) see every byte.
TEST_F(ShimEngineTest, D2HCopiesEndOnAStreamFlagOrElseAHostFunction) {
  const size_t n = 24 * chunk_;
  char* r = Region(n);
  char* a = Device(n);
  char* b = Device(n);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  testing::ScopedEnv no_memops("FAKE_CUDA_NO_MEMOPS", nullptr);
  for (int memops : {1, 0}) {
    SCOPED_TRACE(memops ? "stream waits" : "host functions");
    no_memops.Set(memops ? nullptr : "1");
    for (int round = 0; round < 3; ++round) {
      std::vector<char> data(n);
      FillSample(SampleKind::kBf16Gaussian, 40 + round + 10 * memops, data.data(), n);
      ASSERT_EQ(cudaMemcpy(a, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
      Junk(b, n);
      const uint64_t fns = fakecudaHostFunctionsLaunched(), waits = fakecudaStreamWaits();
      const uint64_t dmas = StatGet(Stat::d2h_dma_ops);
      ASSERT_EQ(shim_->Memcpy(r + 7, a + 7, n - 7, cudaMemcpyDeviceToHost, s, false), cudaSuccess);
      // At least one DMA, at most one per chunk (runs of consecutive slots share one).
      EXPECT_GE(StatGet(Stat::d2h_dma_ops) - dmas, 1u);
      EXPECT_LE(StatGet(Stat::d2h_dma_ops) - dmas, n / chunk_);
      EXPECT_EQ(fakecudaStreamWaits() - waits, memops ? 1u : 0u);
      EXPECT_EQ(fakecudaHostFunctionsLaunched() - fns, memops ? 0u : 1u);
      ASSERT_EQ(shim_->Memcpy(b + 7, r + 7, n - 7, cudaMemcpyHostToDevice, s, false), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_EQ(memcmp(r + 7, data.data() + 7, n - 7), 0);
      std::vector<char> got = FromDevice(b, n);
      EXPECT_EQ(memcmp(got.data() + 7, data.data() + 7, n - 7), 0);
    }
  }
  EXPECT_EQ(fakecudaCallsFromHostFunctions(), 0u);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
}

// T0 holds copies of chunks a D2H published or an H2D read. A CPU store to such a chunk must reach
// the next H2D, whether the chunk was published by a D2H, or written by the CPU before (its pages
// writable, so later stores take no fault).
TEST_F(ShimEngineTest, CpuStoresAfterT0CopiesReachTheNextH2D) {
  const size_t n = 24 * chunk_;
  char* r = Region(n);
  char* a = Device(n);
  char* b = Device(n);
  std::vector<char> data(n);
  FillSample(SampleKind::kBf16Gaussian, 9, data.data(), n);
  ASSERT_EQ(cudaMemcpy(a, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  RegionInfo info;
  ASSERT_TRUE(engine_->Lookup(r, &info));
  // Which chunks the 16-slot pool caches at their current generation. Which 16 of the 24 stayed
  // depends on the order in which the copy's pieces were published (two workers), not only on
  // the order of the copy.
  auto cached = [&] {
    std::vector<bool> in(n / chunk_, false);
    for (size_t c = 0; c < in.size(); ++c) {
      int slot = shim_->pool()->PinCached(info.id, c, engine_->Generation(r + c * chunk_));
      if (slot < 0) continue;
      shim_->pool()->Unpin(slot);
      in[c] = true;
    }
    return in;
  };
  // Chunk by chunk, the cached ones first (`cached_first`; else in order), so that no miss evicts
  // a cached chunk before it is read; returns how many were T0 hits.
  auto h2d = [&](bool cached_first) {
    const std::vector<bool> in = cached_first ? cached() : std::vector<bool>(n / chunk_, false);
    if (cached_first) {
      EXPECT_EQ(std::count(in.begin(), in.end(), true), 16);  // the whole pool
    }
    std::vector<size_t> order;
    for (size_t c = 0; c < in.size(); ++c)
      if (in[c]) order.push_back(c);
    for (size_t c = 0; c < in.size(); ++c)
      if (!in[c]) order.push_back(c);
    Junk(b, n);
    uint64_t ready0 = StatGet(Stat::copies_ready);
    for (size_t c : order) {
      const size_t i = c * chunk_;
      EXPECT_EQ(shim_->Memcpy(b + i, r + i, chunk_, cudaMemcpyHostToDevice, s, false), cudaSuccess);
    }
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    return StatGet(Stat::copies_ready) - ready0;
  };
  auto cpu_store = [&](uint8_t x) {
    for (size_t i = 0; i < n; i += 4096) r[i + 7] ^= x;  // every page
  };

  ASSERT_EQ(shim_->Memcpy(r, a, n, cudaMemcpyDeviceToHost, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ASSERT_EQ(memcmp(r, data.data(), n), 0);  // the CPU sees the D2H
  // Unchanged since the D2H: the chunks still in T0 are hits.
  EXPECT_GE(h2d(/*cached_first=*/true), 16u);
  EXPECT_EQ(FromDevice(b, n), data);

  cpu_store(0x5A);
  std::vector<char> want(r, r + n);
  EXPECT_EQ(h2d(/*cached_first=*/false), 0u);  // every chunk changed: no T0 copy may be used
  EXPECT_EQ(FromDevice(b, n), want);

  // The H2D above read them from T1 and cached them (protecting them again): unchanged, they hit.
  EXPECT_GE(h2d(/*cached_first=*/true), 16u);
  EXPECT_EQ(FromDevice(b, n), want);
  // Stores again, then copies.
  cpu_store(0x33);
  want.assign(r, r + n);
  EXPECT_EQ(h2d(/*cached_first=*/false), 0u);
  EXPECT_EQ(FromDevice(b, n), want);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
}

// Weights filled by D2H copies (the stream benchmark, an offload from the GPU) leave their last
// layers in owned slots; then H2D copies read all layers cycle after cycle. Returns what the
// owned slots did: how many after the fill and after the passes, how many were written back (in
// all), the last pass's T0 hit ratio and how many more chunks the store holds. Checks every byte.
// `stop_at_writeback`: stops copying after the first copy that wrote anything back, then waits
// until the write-back has stopped.
void ShimEngineTest::CycleOwnedLayers(uint64_t resident_limit, OwnedCycle* out, size_t kLayers,
                                      bool stop_at_writeback) {
  const size_t chunk = chunk_, kLayerChunks = 2 * kOwnedPoolChunks / kLayers;
  const size_t layer = kLayerChunks * chunk;
  engine_->SetResidentLimit(resident_limit);
  std::vector<char*> regions;
  std::vector<std::vector<char> > want;
  char* d = Device(layer);
  for (size_t l = 0; l < kLayers; ++l) {
    regions.push_back(Region(layer));
    want.emplace_back(layer);
    FillSample(SampleKind::kBf16Gaussian, 40 + l, want[l].data(), layer);
    ASSERT_EQ(cudaMemcpy(d, want[l].data(), layer, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(shim_->Memcpy(regions[l], d, layer, cudaMemcpyDeviceToHost, nullptr, true),
              cudaSuccess);
  }
  out->owned_after_fill = StatGet(Stat::t0_owned_bytes) / chunk;
  const uint64_t wb0 = StatGet(Stat::t0_writebacks);
  const uint64_t stored0 = engine_->Usage().stored_raw_bytes;
  const int kPasses = 6;
  uint64_t hit_last = 0;
  bool stopped = false;
  for (int pass = 0; pass < kPasses; ++pass) {
    const uint64_t hit0 = StatGet(Stat::h2d_t0_hit_bytes);
    for (size_t l = 0; l < kLayers; ++l) {
      Junk(d, layer);
      ASSERT_EQ(shim_->Memcpy(d, regions[l], layer, cudaMemcpyHostToDevice, nullptr, true),
                cudaSuccess);
      ASSERT_TRUE(FromDevice(d, layer) == want[l]) << "pass " << pass << " layer " << l;
      if (stop_at_writeback && StatGet(Stat::t0_writebacks) > wb0) {
        stopped = true;
        break;
      }
      fprintf(stderr, "DBG pass %d layer %zu wb %llu\n", pass, l,
              (unsigned long long)(StatGet(Stat::t0_writebacks) - wb0));
    }
    hit_last = StatGet(Stat::h2d_t0_hit_bytes) - hit0;
    if (stopped) break;
  }
  shim_->WaitForWriteBack();
  if (stopped) {
    // Nothing copies any more: what leaves from now on is written back by idle fill workers.
    // Waits until the count has not moved for 200 ms (at most 5 s).
    uint64_t last = StatGet(Stat::t0_writebacks);
    for (int i = 0, still = 0; i < 500 && still < 20; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      const uint64_t now = StatGet(Stat::t0_writebacks);
      still = now == last ? still + 1 : 0;
      last = now;
    }
  }
  out->owned_after = StatGet(Stat::t0_owned_bytes) / chunk;
  out->written_back = StatGet(Stat::t0_writebacks) - wb0;
  out->hit_ratio = double(hit_last) / double(kLayers * layer);
  out->stored_more = (engine_->Usage().stored_raw_bytes - stored0) / chunk;
  printf(
      "resident limit %llu: owned slots %llu after the fill, %llu after %d passes; %llu written "
      "back; last pass hit ratio %.3f; stored %llu chunks more\n",
      static_cast<unsigned long long>(resident_limit),
      static_cast<unsigned long long>(out->owned_after_fill),
      static_cast<unsigned long long>(out->owned_after), kPasses,
      static_cast<unsigned long long>(out->written_back), out->hit_ratio,
      static_cast<unsigned long long>(out->stored_more));
  // The CPU sees every byte (written-back chunks fault in from the store).
  for (size_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(memcmp(regions[l], want[l].data(), layer), 0) << "layer " << l;
    EXPECT_EQ(shim_->FreeHost(regions[l]), cudaSuccess);
  }
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

// With T1 full, the owned slots the spread samples out are written back -- encoded straight into
// the store -- and become plain cached copies that placement may evict: the owned prefix
// dissolves, every byte stays exact.
TEST_F(ShimEngineTest, OwnedSlotsReadEveryCycleAreWrittenBackToTheStore) {
  BuildForOwnedCycle("2");
  OwnedCycle r;
  CycleOwnedLayers(4 * chunk_, &r);  // T1 full: misses decode, write-backs encode
  if (HasFatalFailure()) return;
  EXPECT_GE(r.owned_after_fill, kOwnedPoolChunks / 4) << "the fill left no layer in owned slots";
  EXPECT_LT(r.owned_after, r.owned_after_fill * 3 / 4) << "the owned slots did not leave";
  EXPECT_GT(r.written_back, 0u);
  EXPECT_GT(r.stored_more, 0u) << "written back into T1, not the store";
  // Belady: 0.5; LRU: 0. 0.375 on an idle machine; 0.25 in some runs on a loaded one (the fake
  // GPU's stream thread lags, more of the copies' pieces are in flight and their slots evict
  // kept chunks).
  EXPECT_GE(r.hit_ratio, 0.2);
}

// Once the cycle is learned, the copy of the layer left owned by the fill (half the pool) asks
// its slots to leave. A copy's write-back job takes Shim::kWantedPerItem per worker; the rest is
// written back by the fill workers while they are idle (WriteBack::Idle), without waiting
// for more copies: here no copy follows, and every wanted slot still leaves.
TEST_F(ShimEngineTest, IdleWorkersWriteBackWhatTheJobLeft) {
  BuildForOwnedCycle("1");
  OwnedCycle r;
  CycleOwnedLayers(4 * chunk_, &r, /*layers=*/4, /*stop_at_writeback=*/true);
  if (HasFatalFailure()) return;
  EXPECT_GT(r.written_back, 2 * Shim::kWantedPerItem) << "no more than the copy's job wrote";
}

// With room in T1 the owned slots stay: a resident chunk is filled by a memcpy, so spreading its
// reads buys nothing that the owned copy's hits do not, and writing it back would grow T1.
TEST_F(ShimEngineTest, OwnedSlotsStayWhileT1HasRoom) {
  BuildForOwnedCycle("2");
  OwnedCycle r;
  CycleOwnedLayers(0, &r);  // no resident limit
  if (HasFatalFailure()) return;
  EXPECT_GE(r.owned_after_fill, kOwnedPoolChunks / 4) << "the fill left no layer in owned slots";
  EXPECT_EQ(r.written_back, 0u);
  EXPECT_EQ(r.owned_after, r.owned_after_fill);
  EXPECT_GE(r.hit_ratio, 0.3);
}

// The shim hands its predictor to the engine: the CPU's faults are learned (Engine::
// SetFaultObserver) and T1 keeps what they will need soonest (Engine::SetPlacementOracle). CPU
// loads cycling over twice the resident limit, which by recency would fault on every chunk, fault
// on far fewer with ZRTIER_POLICY=lru (CLOCK) and with reuse: T1 keeps part of data that does not
// fit. Checks every byte.
TEST_F(ShimEngineTest, CpuCyclesAreLearnedForT1) {
  const size_t kChunks = 256;  // 16 kept groups (VictimPolicy::kKeepGroup): a share near the asked
  const int kCycles = 8, kMeasured = 4;
  auto faults = [&](const char* policy_name) -> uint64_t {
    Options policy;
    EXPECT_TRUE(policy.Set(Opt::kPolicy, policy_name).ok());
    EXPECT_TRUE(policy.Set(Opt::kPrefetchAhead, "0").ok());
    Build(16, &policy);
    char* r = Region(kChunks * chunk_);
    std::vector<char> data(kChunks * chunk_), buf(chunk_);
    FillSample(SampleKind::kBf16Gaussian, 21, data.data(), data.size());
    memcpy(r, data.data(), data.size());
    EXPECT_TRUE(engine_->EvictTo(0).ok());
    engine_->SetResidentLimit(kChunks / 2 * chunk_);
    uint64_t n = 0;
    for (int c = 0; c < kCycles; ++c) {
      const uint64_t f0 = StatGet(Stat::faults_missing);
      for (size_t i = 0; i < kChunks; ++i) {
        memcpy(buf.data(), r + i * chunk_, chunk_);
        EXPECT_EQ(memcmp(buf.data(), data.data() + i * chunk_, chunk_), 0) << c << " " << i;
      }
      if (c >= kCycles - kMeasured) n += StatGet(Stat::faults_missing) - f0;
    }
    EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
    return n;
  };
  const uint64_t lru = faults("lru"), reuse = faults("reuse");
  printf("missing faults over %d cycles of %zu chunks, T1 = half: lru (CLOCK) %llu, reuse %llu\n",
         kMeasured, kChunks, static_cast<unsigned long long>(lru),
         static_cast<unsigned long long>(reuse));
  EXPECT_LE(lru, kMeasured * kChunks * 3 / 4);
  EXPECT_LE(reuse, kMeasured * kChunks * 3 / 4);
}

}  // namespace
}  // namespace zrtier
