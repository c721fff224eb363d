// The shim's copy paths (runtime/shim/h2d.cc, d2h.cc) against the fake CUDA runtime and a heap
// region backend: exact bytes for H2D/D2H with hits, misses, never-written chunks, partial chunks,
// unaligned offsets, copies larger than the T0 pool, stream and event ordering, and the pointer
// queries on regions.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/dma_batch.h"
#include "runtime/shim/shim.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/testutil/bytes.h"
#include "tests/testutil/heap_backend.h"
#include "tests/testutil/scoped_env.h"
#include "tests/testutil/skip.h"

namespace zrtier {
namespace {

constexpr size_t kChunk = 64 << 10;

class ShimCopyTest : public ::testing::Test {
 protected:
  void Make(size_t pool_slots, bool async_h2d = true) {
    ASSERT_TRUE(CudaApiStatus().ok()) << CudaApiStatus().ToString();
    api_ = RealCudaApi();
    auto backend = std::make_unique<testing::HeapBackend>(kChunk);
    heap_ = backend.get();
    std::unique_ptr<PinnedPool> pool;
    ASSERT_TRUE(PinnedPool::Create(api_, pool_slots * kChunk, kChunk, &pool).ok());
    ShimConfig cfg;
    cfg.min_alloc = 1 << 20;
    cfg.workers = 2;
    cfg.async_h2d = async_h2d;
    shim_ = std::make_unique<Shim>(api_, std::move(backend), std::move(pool), cfg);
    pageable0_ = fakecudaPageableAsyncCopies();
  }
  void TearDown() override {
    if (shim_) {
      EXPECT_EQ(fakecudaPageableAsyncCopies(), pageable0_) << "region memory was handed to a DMA";
      EXPECT_EQ(fakecudaCallsFromHostFunctions(), 0u);
    }
    shim_.reset();
  }
  char* Region(size_t size) {
    void* p = nullptr;
    EXPECT_EQ(shim_->HostAlloc(&p, size, 0), cudaSuccess);
    RegionInfo r;
    EXPECT_TRUE(heap_->Lookup(p, &r)) << "allocation was not managed";
    return static_cast<char*>(p);
  }
  char* Device(size_t size) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, size), cudaSuccess);
    return static_cast<char*>(p);
  }
  // Puts `data` into the region as the CPU would (the heap backend's stand-in for a WP fault).
  void CpuWrite(char* dst, const std::vector<char>& data) {
    heap_->PrepareCpuWrite(dst, data.size());
    memcpy(dst, data.data(), data.size());
  }
  // A region of `n` bytes that the CPU filled with Random(n, seed) (returned), and a device
  // buffer of `n` bytes in *d.
  std::vector<char> WrittenRegion(size_t n, uint64_t seed, char** r, char** d) {
    *r = Region(n);
    *d = Device(n);
    auto data = Random(n, seed);
    CpuWrite(*r, data);
    return data;
  }
  // The start of an asynchronous-copy test: the shim over a pool of 64 chunks with asynchronous
  // copies on, a written region of kAsyncChunks chunks (WrittenRegion) and a non-blocking stream.
  // Callers check ASSERT_FALSE(HasFailure()) after it.
  static constexpr size_t kAsyncChunks = 16;
  std::vector<char> AsyncCopyStart(uint64_t seed, char** r, char** d, cudaStream_t* s) {
    Make(64);
    EXPECT_TRUE(shim_->h2d_async());
    auto data = WrittenRegion(kAsyncChunks * kChunk, seed, r, d);
    EXPECT_EQ(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), cudaSuccess);
    return data;
  }
  static std::vector<char> Random(size_t n, uint64_t seed) { return testing::RandomBytes(n, seed); }
  std::vector<char> ReadDevice(const char* d, size_t n) {
    std::vector<char> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  std::vector<char> ReadRegion(const char* r, size_t n) {
    std::vector<char> v(n);
    bool zero = false;
    EXPECT_TRUE(heap_->Read(r, n, v.data(), &zero).ok());
    if (zero) std::fill(v.begin(), v.end(), 0);
    return v;
  }

  // Copies `chunks` chunks of `r` to `d` one chunk per copy, last to first, and waits: slot i
  // then caches chunk chunks-1-i, so that no two consecutive chunks sit in consecutive slots.
  void CacheLastToFirst(char* d, const char* r, size_t chunks, cudaStream_t s) {
    for (size_t c = chunks; c-- > 0;)
      ASSERT_EQ(
          shim_->Memcpy(d + c * kChunk, r + c * kChunk, kChunk, cudaMemcpyHostToDevice, s, false),
          cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }

  // Holds every read, then copies [r, r+n) to `d` on `s` (asynchronously) on another thread: the
  // copy must return, successfully, while its reads are held -- its pieces handed to the stream.
  // The reads stay held.
  void CopyWithReadsHeld(char* d, const char* r, size_t n, cudaStream_t s) {
    heap_->Hold();
    auto copy = std::async(std::launch::async, [&] {
      return shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false);
    });
    if (copy.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      heap_->Release();
      FAIL() << "the copy waited for its fills";
    }
    EXPECT_EQ(copy.get(), cudaSuccess);
  }

  const CudaApi* api_ = nullptr;
  testing::HeapBackend* heap_ = nullptr;
  std::unique_ptr<Shim> shim_;
  uint64_t pageable0_ = 0;
};

void ClearDevice(char* d, size_t n) {
  std::vector<char> z(n, 0x5A);
  ASSERT_EQ(cudaMemcpy(d, z.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
}

TEST_F(ShimCopyTest, H2DExactBytesThenPureHitFromT0) {
  Make(64);
  const size_t n = 1 << 20;
  char *r, *d;
  auto data = WrittenRegion(n, 1, &r, &d);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), data);

  // Unchanged data: the second copy is served from the cached T0 slots (no backend read).
  ClearDevice(d, n);
  uint64_t reads = heap_->reads();
  uint64_t ready = StatGet(Stat::copies_ready);
  uint64_t hit_bytes = StatGet(Stat::h2d_t0_hit_bytes);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyDefault, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), data);
  EXPECT_EQ(heap_->reads(), reads);
  EXPECT_EQ(StatGet(Stat::copies_ready), ready + 1);
  EXPECT_EQ(StatGet(Stat::h2d_t0_hit_bytes), hit_bytes + n);
  // A part of it starting inside a chunk: only the bytes copied count.
  hit_bytes = StatGet(Stat::h2d_t0_hit_bytes);
  ASSERT_EQ(shim_->Memcpy(d, r + 1000, kChunk + 5, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::h2d_t0_hit_bytes), hit_bytes + kChunk + 5);

  // A CPU store makes the cached copy stale: the next copy must see the new bytes (the changed
  // chunk is a miss, the rest hit).
  data[12345] ^= 0x7F;
  CpuWrite(r + 12345, std::vector<char>(1, data[12345]));
  ClearDevice(d, n);
  hit_bytes = StatGet(Stat::h2d_t0_hit_bytes);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), data);
  EXPECT_EQ(StatGet(Stat::h2d_t0_hit_bytes), hit_bytes + n - kChunk);
}

TEST_F(ShimCopyTest, CountersFollowTheCopies) {
  Make(32);
  EXPECT_GE(StatGet(Stat::pinned_pool_bytes), 32 * kChunk);
  const size_t n = 16 * kChunk;
  char* r = Region(n);
  char* d = Device(n);
  uint64_t h2d = StatGet(Stat::h2d_copies), h2d_b = StatGet(Stat::h2d_bytes);
  uint64_t d2h = StatGet(Stat::d2h_copies), d2h_b = StatGet(Stat::d2h_bytes);
  uint64_t copy_ns = StatGet(Stat::copy_ns), t0 = StatGet(Stat::t0_bytes);
  ASSERT_EQ(shim_->Memcpy(r, d, n - 10, cudaMemcpyDeviceToHost, nullptr, true), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, nullptr, true), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::d2h_copies), d2h + 1);
  EXPECT_EQ(StatGet(Stat::d2h_bytes), d2h_b + n - 10);
  EXPECT_EQ(StatGet(Stat::h2d_copies), h2d + 1);
  EXPECT_EQ(StatGet(Stat::h2d_bytes), h2d_b + n);
  EXPECT_GT(StatGet(Stat::copy_ns), copy_ns);
  // 15 whole chunks published by the D2H, the 16th (partial) cached by the H2D.
  EXPECT_EQ(StatGet(Stat::t0_bytes), t0 + n);
  void* small = nullptr;
  uint64_t pass = StatGet(Stat::passthrough_allocs);
  ASSERT_EQ(shim_->HostAlloc(&small, 4096, 0), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::passthrough_allocs), pass + 1);
  EXPECT_EQ(shim_->FreeHost(small), cudaSuccess);
}

// The DMAs of a piece whose slots are scattered go to the GPU in one cudaMemcpyBatchAsync, on the
// caller's stream -- or, for the legacy stream (which takes no batch), on the per-thread stream,
// ordered so that work a second blocking stream queues afterwards still sees the bytes.
TEST_F(ShimCopyTest, ScatteredSlotsGoInOneBatchCall) {
  Make(64);
  DmaBatch::SetEnabled(true);
  const size_t chunks = 16, n = chunks * kChunk;
  char *r, *d;
  auto data = WrittenRegion(n, 21, &r, &d);
  cudaStream_t s, other;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  char* back = nullptr;  // real pinned (the fake's), not a region
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&back), n), cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(CacheLastToFirst(d, r, chunks, s));
  for (cudaStream_t st : {s, static_cast<cudaStream_t>(nullptr)}) {
    SCOPED_TRACE(st ? "own stream" : "legacy stream");
    ClearDevice(d, n);
    const uint64_t batches = fakecudaBatchCalls(), calls = StatGet(Stat::dma_calls),
                   dmas = StatGet(Stat::h2d_dma_ops), hits = StatGet(Stat::h2d_t0_hit_bytes);
    ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, st, false), cudaSuccess);
    // Read back without synchronizing first -- after a legacy-stream copy, on another blocking
    // stream: stream order alone must put the copy's DMAs before it.
    const cudaStream_t reader = st ? st : other;
    ASSERT_EQ(cudaMemcpyAsync(back, d, n, cudaMemcpyDeviceToHost, reader), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(reader), cudaSuccess);
    EXPECT_EQ(memcmp(back, data.data(), n), 0);
    EXPECT_EQ(StatGet(Stat::h2d_t0_hit_bytes) - hits, n);  // every chunk from its cached slot
    EXPECT_EQ(StatGet(Stat::h2d_dma_ops) - dmas, chunks);  // no two slots consecutive
    // One batch call per piece (the copy's first pieces are a few chunks each).
    const uint64_t made = StatGet(Stat::dma_calls) - calls;
    EXPECT_GE(made, 1u);
    EXPECT_LE(made, chunks / 4);
    EXPECT_EQ(fakecudaBatchCalls() - batches, made);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }
  ASSERT_EQ(cudaFreeHost(back), cudaSuccess);
}

// A runtime whose batch call fails: the piece is queued copy by copy (exact bytes), the error does
// not reach the program's cudaGetLastError, and later pieces no longer try batches. So does
// ZRTIER_DMA_BATCH=0.
TEST_F(ShimCopyTest, WithoutBatchCallsEachDmaIsItsOwnCall) {
  Make(64);
  const size_t chunks = 16, n = chunks * kChunk;
  char *r, *d;
  auto data = WrittenRegion(n, 22, &r, &d);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(CacheLastToFirst(d, r, chunks, s));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round == 0 ? "batch call fails" : round == 1 ? "after the failure" : "disabled");
    if (round == 2) DmaBatch::SetEnabled(false);
    fakecudaSetBatchError(round == 0 ? cudaErrorNotSupported : cudaSuccess);
    ClearDevice(d, n);
    const uint64_t batches = fakecudaBatchCalls(), calls = StatGet(Stat::dma_calls),
                   dmas = StatGet(Stat::h2d_dma_ops);
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(ReadDevice(d, n), data);
    EXPECT_EQ(StatGet(Stat::h2d_dma_ops) - dmas, chunks);
    EXPECT_EQ(StatGet(Stat::dma_calls) - calls, chunks + (round == 0 ? 1 : 0));
    EXPECT_EQ(fakecudaBatchCalls(), batches);
  }
  fakecudaSetBatchError(cudaSuccess);
  DmaBatch::SetEnabled(true);  // also forgets the failure
  EXPECT_TRUE(DmaBatch::Active(api_));
}

TEST_F(ShimCopyTest, NeverWrittenChunksBecomeMemset) {
  Make(64);
  const size_t n = 16 * kChunk;
  char* r = Region(n);
  char* d = Device(n);
  std::vector<char> want(n, 0);
  auto part = Random(kChunk + 100, 2);  // chunk 3 entirely, 100 bytes of chunk 4
  CpuWrite(r + 3 * kChunk, part);
  memcpy(want.data() + 3 * kChunk, part.data(), part.size());
  ClearDevice(d, n);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, nullptr, true), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), want);
}

// An asynchronous H2D copy whose chunks are still being read returns anyway: its pieces wait in
// the stream on flags their fills set. Here every read is held, so the copy must return with
// every piece handed to the stream and nothing moved; once the reads go on, the GPU gets every
// byte (never-written chunks as zeros), the chunks are cached in T0 (the next copy is all hits),
// and a cudaFreeHost right after another such copy waits for its fills.
TEST_F(ShimCopyTest, AsyncCopyReturnsBeforeItsFillsAndTheStreamWaitsForThem) {
  Make(64);
  ASSERT_TRUE(shim_->h2d_async());
  const size_t n = 16 * kChunk;
  char* r = Region(n);
  char* d = Device(n);
  std::vector<char> want(n, 0);
  auto head = Random(5 * kChunk, 11), tail = Random(9 * kChunk - 300, 12);  // 5, 6 never written
  CpuWrite(r, head);
  CpuWrite(r + 7 * kChunk, tail);
  memcpy(want.data(), head.data(), head.size());
  memcpy(want.data() + 7 * kChunk, tail.data(), tail.size());
  ClearDevice(d, n);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const uint64_t deferred = StatGet(Stat::h2d_deferred_pieces), waits = fakecudaStreamWaits();
  ASSERT_NO_FATAL_FAILURE(CopyWithReadsHeld(d, r, n, s));
  const uint64_t pieces = StatGet(Stat::h2d_deferred_pieces) - deferred;
  EXPECT_GE(pieces, 2u);  // at least every piece but the first planned
  EXPECT_EQ(fakecudaStreamWaits() - waits, pieces);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  heap_->Release();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), want);

  // Published when filled: the same copy again reads nothing (the never-written chunks are not
  // cached; they read as zeros again, which reads no bytes).
  ClearDevice(d, n);
  const uint64_t reads = heap_->reads(), hit_bytes = StatGet(Stat::h2d_t0_hit_bytes);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), want);
  EXPECT_EQ(heap_->reads(), reads);
  EXPECT_EQ(StatGet(Stat::h2d_t0_hit_bytes), hit_bytes + n - 2 * kChunk);

  // New bytes, held again; the region is freed right after the copy returns: the free waits for
  // the stream, which waits for the fills.
  auto fresh = Random(n, 13);
  CpuWrite(r, fresh);
  ClearDevice(d, n);
  heap_->Hold();
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  auto release = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    heap_->Release();
  });
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
  release.get();
  EXPECT_EQ(ReadDevice(d, n), fresh);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// A deferred piece's stream flag is set once its fill is done, whatever its copy call is doing:
// here the fake driver holds every asynchronous copy call until its stream is idle (as a real one
// does while another thread's cudaHostUnregister waits for the device), so a piece whose flag
// waited for its copy call to get past its own DMA calls would hang the call and the stream
// forever.
TEST_F(ShimCopyTest, ADeferredPieceIsReleasedByItsFillNotByItsCopyCall) {
  char *r, *d;
  cudaStream_t s;
  auto data = AsyncCopyStart(31, &r, &d, &s);
  ASSERT_FALSE(HasFailure());
  const size_t n = kAsyncChunks * kChunk;
  ClearDevice(d, n);
  const uint64_t deferred = StatGet(Stat::h2d_deferred_pieces);
  fakecudaSetIssueWaitsForStream(1);
  heap_->Hold();
  auto copy = std::async(std::launch::async,
                         [&] { return shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  heap_->Release();
  if (copy.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "the copy call never returned: its stream waits on a flag only it sets";
    fflush(nullptr);
    std::_Exit(1);  // a deadlock cannot be unwound
  }
  fakecudaSetIssueWaitsForStream(0);
  EXPECT_EQ(copy.get(), cudaSuccess);
  EXPECT_GT(StatGet(Stat::h2d_deferred_pieces), deferred);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), data);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// A deferred piece's slots stay in flight until its DMAs have run, not merely until the stream
// passed its flag wait: the fake holds the stream at the first DMA of the copy, with every fill
// done and every piece finished. No slot of the copy is free then: every slot the pool hands out
// meanwhile (each filled with garbage here, as another copy's fill would) is one of the others.
// Once the stream goes on, the GPU gets the exact bytes.
TEST_F(ShimCopyTest, ADeferredPiecesSlotsStayInFlightUntilItsDmasRan) {
  char *r, *d;
  cudaStream_t s;
  auto data = AsyncCopyStart(32, &r, &d, &s);
  ASSERT_FALSE(HasFailure());
  const size_t n = kAsyncChunks * kChunk;
  ClearDevice(d, n);
  PinnedPool* pool = shim_->pool();
  const size_t free0 = pool->free_slots();
  const uint64_t deferred = StatGet(Stat::h2d_deferred_pieces);
  fakecudaHoldCopies(s, 1);
  ASSERT_NO_FATAL_FAILURE(CopyWithReadsHeld(d, r, n, s));
  EXPECT_GT(StatGet(Stat::h2d_deferred_pieces), deferred);
  heap_->Release();
  shim_->DrainDeferred();  // every fill done, every piece's end run: only the DMAs hold the slots
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (fakecudaCopiesHeld() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(fakecudaCopiesHeld(), 1u) << "the stream never got to the copy's first DMA";
  pool->Reap();
  EXPECT_EQ(pool->free_slots(), free0 - kAsyncChunks) << "slots whose DMAs have not run are free";
  std::vector<int> taken;
  for (int slot; (slot = pool->Acquire(-1)) >= 0;) {
    memset(pool->SlotPtr(slot), 0xE7, kChunk);
    taken.push_back(slot);
  }
  for (int slot : taken) {
    pool->Publish(slot, 0, 0, kNoGeneration);  // emptied: nothing cached
    pool->Unpin(slot);
  }
  fakecudaHoldCopies(s, 0);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), data);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// Stat::copies_ready_in_time: an asynchronous copy whose pieces went to the stream still filling
// counts once its fills are done, as ready in time only if the stream had not got to their DMAs
// by then (the flag's mark). With the stream busy behind a host function, the fills win: counted,
// no piece waited on. With the stream free, it reaches the first deferred piece and stalls there
// (the fake says so) until the reads go on: not counted, that piece counted as waited on. A copy
// found whole in T0 counts as ready at the call and in time. Every copy gives the exact bytes.
TEST_F(ShimCopyTest, ReadyInTimeCountsCopiesWhoseFillsBeatTheStream) {
  const size_t n = kAsyncChunks * kChunk;
  char *r, *d;
  cudaStream_t s;
  auto data = AsyncCopyStart(50, &r, &d, &s);
  ASSERT_FALSE(HasFailure());
  auto await = [](auto done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return done();
  };

  // 1. The stream is busy: the fills are done before it gets to the pieces.
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  ASSERT_EQ(cudaLaunchHostFunc(
                s, [](void* g) { static_cast<std::shared_future<void>*>(g)->wait(); }, &gate),
            cudaSuccess);
  uint64_t in_time = StatGet(Stat::copies_ready_in_time);
  uint64_t waited = StatGet(Stat::h2d_pieces_waited_on);
  uint64_t deferred = StatGet(Stat::h2d_deferred_pieces);
  ClearDevice(d, n);  // (the legacy stream: s is non-blocking)
  ASSERT_NO_FATAL_FAILURE(CopyWithReadsHeld(d, r, n, s));
  EXPECT_GT(StatGet(Stat::h2d_deferred_pieces), deferred);
  EXPECT_EQ(StatGet(Stat::copies_ready_in_time), in_time);  // its fills are held
  heap_->Release();
  shim_->DrainDeferred();  // every fill done, its piece's end run
  EXPECT_EQ(StatGet(Stat::copies_ready_in_time), in_time + 1);
  EXPECT_EQ(StatGet(Stat::h2d_pieces_waited_on), waited);
  go.set_value();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), data);

  // 2. New bytes; the stream is free and stalls at the first piece still filling.
  data = Random(n, 51);
  CpuWrite(r, data);
  ClearDevice(d, n);
  in_time = StatGet(Stat::copies_ready_in_time);
  waited = StatGet(Stat::h2d_pieces_waited_on);
  const uint64_t blocked = fakecudaStreamWaitsBlocked();
  ASSERT_NO_FATAL_FAILURE(CopyWithReadsHeld(d, r, n, s));
  ASSERT_TRUE(await([&] { return fakecudaStreamWaitsBlocked() > blocked; }));
  heap_->Release();
  shim_->DrainDeferred();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::copies_ready_in_time), in_time);
  EXPECT_GE(StatGet(Stat::h2d_pieces_waited_on), waited + 1);
  EXPECT_EQ(ReadDevice(d, n), data);

  // 3. All in T0 now: ready at the call, hence in time.
  const uint64_t ready = StatGet(Stat::copies_ready);
  ClearDevice(d, n);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::copies_ready), ready + 1);
  EXPECT_EQ(StatGet(Stat::copies_ready_in_time), in_time + 1);
  EXPECT_EQ(ReadDevice(d, n), data);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// Where the driver refuses the mark (a driver's v2 write may refuse a flag value), a
// deferred copy still returns before its fills and gives the exact bytes; it just cannot know
// whether the GPU waited, so it does not count as ready in time (the count falls back to the
// copies ready at the call).
TEST_F(ShimCopyTest, WithoutStreamWritesOnlyCopiesReadyAtTheCallCountInTime) {
  testing::ScopedEnv no_writes("FAKE_CUDA_NO_STREAM_WRITES", "1");  // the other tests need marks
  const size_t n = kAsyncChunks * kChunk;
  char *r, *d;
  cudaStream_t s;
  auto data = AsyncCopyStart(60, &r, &d, &s);
  ASSERT_FALSE(HasFailure());
  const uint64_t in_time = StatGet(Stat::copies_ready_in_time);
  const uint64_t waited = StatGet(Stat::h2d_pieces_waited_on);
  const uint64_t deferred = StatGet(Stat::h2d_deferred_pieces);
  ClearDevice(d, n);
  ASSERT_NO_FATAL_FAILURE(CopyWithReadsHeld(d, r, n, s));
  EXPECT_GT(StatGet(Stat::h2d_deferred_pieces), deferred);
  heap_->Release();
  shim_->DrainDeferred();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), data);
  EXPECT_EQ(StatGet(Stat::copies_ready_in_time), in_time);
  EXPECT_EQ(StatGet(Stat::h2d_pieces_waited_on), waited);
  // All in T0 now: ready at the call, and so in time.
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::copies_ready_in_time), in_time + 1);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// The synchronize hooks' help (Shim::HelpFillsWhile): a thread that would wait for a stream
// behind deferred pieces fills them itself. With both workers blocked in held reads, a third
// blocked read can only be the helping thread's; once the reads go on it drains every deferred
// piece.
TEST_F(ShimCopyTest, ASynchronizingThreadHelpsFillDeferredPieces) {
  Make(64);
  const size_t n = 16 * kChunk;
  char *r, *d;
  auto data = WrittenRegion(n, 40, &r, &d);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_FALSE(shim_->deferred_pending());
  ASSERT_NO_FATAL_FAILURE(CopyWithReadsHeld(d, r, n, s));
  EXPECT_TRUE(shim_->deferred_pending());
  int asked = 0;
  shim_->HelpFillsWhile([&] { return ++asked < 0; });  // nothing pending by its measure
  EXPECT_EQ(asked, 1);
  heap_->AwaitHeldReads(2);  // both workers
  auto help = std::async(std::launch::async, [&] { shim_->HelpFillsWhile([] { return true; }); });
  heap_->AwaitHeldReads(3);  // the helper too
  heap_->Release();
  help.get();
  EXPECT_FALSE(shim_->deferred_pending());
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), data);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// Copies that must not return before their fills wait for them: a synchronous one (the calling
// thread helps fill instead of sleeping in the stream), one where the driver refuses stream waits
// (FAKE_CUDA_NO_MEMOPS=1), and every one with ZRTIER_H2D_ASYNC=0. Each gives the exact bytes and
// hands no piece to the stream.
TEST_F(ShimCopyTest, CopiesThatCannotDeferWaitForTheirFills) {
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant == 0 ? "sync" : variant == 1 ? "no stream waits" : "ZRTIER_H2D_ASYNC=0");
    shim_.reset();
    Make(64, /*async_h2d=*/variant != 2);
    testing::ScopedEnv no_memops("FAKE_CUDA_NO_MEMOPS", variant == 1 ? "1" : nullptr);
    const size_t n = 16 * kChunk;
    char* r = Region(n);
    char* d = Device(n);
    auto data = Random(n, 20 + variant);
    CpuWrite(r, data);
    ClearDevice(d, n);
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const uint64_t deferred = StatGet(Stat::h2d_deferred_pieces);
    heap_->Hold();
    auto copy = std::async(std::launch::async, [&] {
      return shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, variant == 0);
    });
    heap_->AwaitHeldReads(1);
    // Held reads: the copy cannot have finished (it would be ready within this wait if it
    // returned without its fills).
    EXPECT_EQ(copy.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
    heap_->Release();
    EXPECT_EQ(copy.get(), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_EQ(ReadDevice(d, n), data);
    EXPECT_EQ(StatGet(Stat::h2d_deferred_pieces), deferred);
    ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  }
}

// A read that fails after the copy returned cannot fail the copy: the GPU gets zeros for the
// chunk (and the error is logged), nothing of it is cached, and the next copy reads it again.
TEST_F(ShimCopyTest, AFailedFillOfADeferredPieceGivesZerosAndCachesNothing) {
  Make(64);
  const size_t n = 16 * kChunk;
  char *r, *d;
  auto data = WrittenRegion(n, 30, &r, &d);
  ClearDevice(d, n);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  const uint64_t deferred = StatGet(Stat::h2d_deferred_pieces);
  heap_->FailReads(true);
  ASSERT_NO_FATAL_FAILURE(CopyWithReadsHeld(d, r, n, s));
  EXPECT_GT(StatGet(Stat::h2d_deferred_pieces), deferred);
  heap_->Release();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  // Every read failed after the copy returned (a piece filled inside the call would have failed
  // the copy): every chunk arrives as zeros.
  EXPECT_EQ(ReadDevice(d, n), std::vector<char>(n, 0));
  heap_->FailReads(false);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(d, n), data);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST_F(ShimCopyTest, D2HThenH2DSameStreamWithoutSync) {
  Make(64);
  const size_t n = 2 << 20;
  char* r = Region(n);
  char* a = Device(n);
  char* b = Device(n);
  auto data = Random(n, 3);
  ASSERT_EQ(cudaMemcpy(a, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  ClearDevice(b, n);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(r, a, n, cudaMemcpyDeviceToHost, s, false), cudaSuccess);
  // The D2H is still queued: the H2D must read its bytes in stream order.
  ASSERT_EQ(shim_->Memcpy(b, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadDevice(b, n), data);
  EXPECT_EQ(ReadRegion(r, n), data);
}

TEST_F(ShimCopyTest, TwoStreamsOrderedByEvent) {
  Make(64);
  const size_t n = 1 << 20;
  char* r = Region(n);
  char* a = Device(n);
  char* b = Device(n);
  auto data = Random(n, 4);
  ASSERT_EQ(cudaMemcpy(a, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  ClearDevice(b, n);
  cudaStream_t s1, s2;
  cudaEvent_t e;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(r, a, n, cudaMemcpyDeviceToHost, s1, false), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, s1), cudaSuccess);
  ASSERT_EQ(cudaStreamWaitEvent(s2, e, 0), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(b, r, n, cudaMemcpyHostToDevice, s2, false), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s2), cudaSuccess);
  EXPECT_EQ(ReadDevice(b, n), data);
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
}

TEST_F(ShimCopyTest, UnalignedPartialCopiesMatchAShadow) {
  Make(16);
  const size_t n = 40 * kChunk + 4096;
  char* r = Region(n);
  char* d = Device(n);
  std::vector<char> shadow(n, 0);
  std::vector<char> dev_shadow(n, 0);
  ASSERT_EQ(cudaMemcpy(d, dev_shadow.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  uint64_t seed = testing::TestSeed();
  printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  for (int it = 0; it < 60; ++it) {
    size_t off = rng() % n;
    size_t len = 1 + rng() % std::min<size_t>(n - off, 20 * kChunk);
    if (rng() % 2) {
      // D2H: device[off, off+len) -> region[off, off+len)
      ASSERT_EQ(shim_->Memcpy(r + off, d + off, len, cudaMemcpyDeviceToHost, s, false),
                cudaSuccess);
      memcpy(shadow.data() + off, dev_shadow.data() + off, len);
    } else {
      // Fresh device bytes first (a sync copy on the legacy stream orders after s's work).
      auto fresh = Random(len, rng());
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      size_t doff = rng() % (n - len + 1);
      ASSERT_EQ(cudaMemcpy(d + doff, fresh.data(), len, cudaMemcpyHostToDevice), cudaSuccess);
      memcpy(dev_shadow.data() + doff, fresh.data(), len);
      // H2D: region[off, off+len) -> device[off2, ...)
      size_t off2 = rng() % (n - len + 1);
      ASSERT_EQ(shim_->Memcpy(d + off2, r + off, len, cudaMemcpyHostToDevice, s, false),
                cudaSuccess);
      memmove(dev_shadow.data() + off2, shadow.data() + off, len);
    }
  }
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ReadRegion(r, n), shadow);
  EXPECT_EQ(ReadDevice(d, n), dev_shadow);
}

TEST_F(ShimCopyTest, CopiesLargerThanThePoolCycleSlots) {
  Make(3);  // 192 KiB of T0 for 4 MiB copies
  const size_t n = 4 << 20;
  char* r = Region(n);
  char* a = Device(n);
  char* b = Device(n);
  auto data = Random(n, 5);
  ASSERT_EQ(cudaMemcpy(a, data.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  ClearDevice(b, n);
  ASSERT_EQ(shim_->Memcpy(r + 7, a + 7, n - 7, cudaMemcpyDeviceToHost, nullptr, false),
            cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(b + 7, r + 7, n - 7, cudaMemcpyHostToDevice, nullptr, true), cudaSuccess);
  auto got = ReadDevice(b, n);
  EXPECT_EQ(memcmp(got.data() + 7, data.data() + 7, n - 7), 0);
}

TEST_F(ShimCopyTest, HostToHostAndTwoDimensional) {
  Make(16);
  const size_t n = 1 << 20;
  char* r = Region(n);
  char* r2 = Region(n);
  auto data = Random(n, 6);
  // host -> region, region -> region, region -> host, all through cudaMemcpy semantics.
  ASSERT_EQ(shim_->Memcpy(r, data.data(), n, cudaMemcpyHostToHost, nullptr, true), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(r2, r, n, cudaMemcpyDefault, nullptr, true), cudaSuccess);
  std::vector<char> out(n);
  ASSERT_EQ(shim_->Memcpy(out.data(), r2, n, cudaMemcpyDefault, nullptr, true), cudaSuccess);
  EXPECT_EQ(out, data);

  // 2D: 100 rows of 3000 bytes from pitch 5000 in the region to pitch 4096 on the device.
  char* d = Device(100 * 4096);
  ASSERT_EQ(
      shim_->Memcpy2D(d, 4096, r + 11, 5000, 3000, 100, cudaMemcpyHostToDevice, nullptr, true),
      cudaSuccess);
  auto got = ReadDevice(d, 100 * 4096);
  for (int row = 0; row < 100; ++row)
    ASSERT_EQ(memcmp(got.data() + row * 4096, data.data() + 11 + row * 5000, 3000), 0) << row;
}

TEST_F(ShimCopyTest, PointerQueriesOnRegions) {
  Make(4);
  char* r = Region(2 << 20);
  cudaPointerAttributes a;
  ASSERT_EQ(shim_->PointerGetAttributes(&a, r + 100), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  EXPECT_EQ(a.hostPointer, r + 100);
  void* dev = nullptr;
  EXPECT_EQ(shim_->HostGetDevicePointer(&dev, r, 0), cudaErrorNotSupported);
  // cudaHostGetFlags answers as the driver does for an allocation of its own with the region's
  // flags: those and mapped (unified addressing).
  unsigned flags = 99;
  EXPECT_EQ(shim_->HostGetFlags(&flags, r + 4096), cudaSuccess);
  EXPECT_EQ(flags, unsigned{cudaHostAllocMapped});
  void* portable = nullptr;
  ASSERT_EQ(shim_->HostAlloc(&portable, 2 << 20, cudaHostAllocPortable), cudaSuccess);
  EXPECT_EQ(shim_->HostGetFlags(&flags, static_cast<char*>(portable) + 100), cudaSuccess);
  EXPECT_EQ(flags, unsigned{cudaHostAllocPortable | cudaHostAllocMapped});
  EXPECT_EQ(shim_->HostGetFlags(nullptr, portable), cudaErrorInvalidValue);
  EXPECT_EQ(shim_->FreeHost(portable), cudaSuccess);
  EXPECT_EQ(shim_->HostRegister(r + 4096, 8192, 0), cudaSuccess);
  EXPECT_EQ(shim_->HostUnregister(r + 4096), cudaSuccess);
  EXPECT_EQ(shim_->HostRegister(r, 8192, cudaHostRegisterMapped), cudaErrorNotSupported);
  EXPECT_EQ(shim_->FreeHost(r + 1), cudaErrorInvalidValue);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
  RegionInfo info;
  EXPECT_FALSE(heap_->Lookup(r, &info));

  // Small and Mapped/WriteCombined allocations are real pinned memory.
  void* small = nullptr;
  void* mapped = nullptr;
  ASSERT_EQ(shim_->HostAlloc(&small, 4096, 0), cudaSuccess);
  ASSERT_EQ(shim_->HostAlloc(&mapped, 4 << 20, cudaHostAllocMapped), cudaSuccess);
  EXPECT_FALSE(heap_->Lookup(small, &info));
  EXPECT_FALSE(heap_->Lookup(mapped, &info));
  ASSERT_EQ(shim_->PointerGetAttributes(&a, mapped), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  EXPECT_EQ(shim_->HostGetDevicePointer(&dev, mapped, 0), cudaSuccess);
  EXPECT_EQ(shim_->FreeHost(small), cudaSuccess);
  EXPECT_EQ(shim_->FreeHost(mapped), cudaSuccess);
}

TEST_F(ShimCopyTest, CopyDuringStreamCaptureFailsLoudly) {
  Make(4);
  char* r = Region(1 << 20);
  char* d = Device(1 << 20);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  fakecudaSetCapturing(s, 1);
  EXPECT_EQ(shim_->Memcpy(d, r, 1 << 20, cudaMemcpyHostToDevice, s, false),
            cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(shim_->Memcpy(r, d, 1 << 20, cudaMemcpyDeviceToHost, s, false),
            cudaErrorStreamCaptureUnsupported);
  fakecudaSetCapturing(s, 0);
}

// Copies through T0 slots while another stream of the program captures a graph (in the global
// mode, PyTorch's default): their event queries and waits -- the copy thread's and the event
// watcher's -- run in the relaxed mode and invalidate nothing.
TEST_F(ShimCopyTest, CopiesThroughT0DoNotInvalidateAnotherStreamsCapture) {
  Make(64);
  const size_t n = 1 << 20;
  char *r, *d;
  auto data = WrittenRegion(n, 3, &r, &d);
  cudaStream_t s, cap;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&cap), cudaSuccess);
  fakecudaSetCapturing(cap, 1);
  EXPECT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(shim_->Memcpy(r, d, n, cudaMemcpyDeviceToHost, s, false), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_FALSE(fakecudaCaptureInvalidated());
  fakecudaSetCapturing(cap, 0);
  EXPECT_EQ(ReadDevice(d, n), data);
  EXPECT_EQ(memcmp(r, data.data(), n), 0);
}

TEST_F(ShimCopyTest, CopyCrossingARegionEndIsRejected) {
  Make(4);
  char* r = Region(1 << 20);
  char* d = Device(2 << 20);
  EXPECT_EQ(shim_->Memcpy(d, r + 4096, 1 << 20, cudaMemcpyHostToDevice, nullptr, true),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace zrtier
