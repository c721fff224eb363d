// GPU decode of host-to-device copies (runtime/shim/gpu_decode.h) and GPU encode of
// device-to-host ones (gpu_encode.h) over the fake CUDA runtime and
// the stand-in libcuda.so.1 (tests/gpu/fake_libcuda.cc, which runs the kernel's body on the
// stream's worker): chunks stored in the GPU format reach the destination decoded, in stream
// order behind earlier work and before later work (with slow launches), exact to the byte, with
// resident, zero and partial chunks mixed in; encodings sent straight from the pinned RAM store;
// with the auto codec, chunks the CPU does not reuse stored in the GPU format once the kernel
// loads (at the first allocation); a kernel that does not load or launch leaves the copy to the CPU
// with the same bytes; and ZRTIER_GPU_DECODE=0 keeps the CPU path. Device-to-host copies bound for
// the store are encoded in stream order and stored as they land, or cross raw when the kernel
// cannot load or launch.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/engine/engine.h"
#include "runtime/gpu/cuda_driver.h"
#include "runtime/gpu/decode_module.h"
#include "runtime/shim/shim.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/testutil/bytes.h"
#include "tests/testutil/scoped_env.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

// Sleeps on the stream's worker: the work queued behind it runs later than the call that queued
// it, so work run at call time instead of in stream order shows.
void CUDART_CB SleepOnStream(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

class GpuDecodeCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZRTIER_SKIP_UNLESS_UFFD();
    ASSERT_TRUE(CudaApiStatus().ok()) << CudaApiStatus().ToString();
    ASSERT_TRUE(gpu::DecodeKernelBuilt()) << "this test is registered only with the kernel built";
    const gpu::CudaDriver* d = nullptr;
    Status st = gpu::CudaDriver::Load(&d);
    ASSERT_TRUE(st.ok()) << st.ToString() << " (run with LD_LIBRARY_PATH at the fake libcuda)";
  }
  // `store_limit` (the RAM store's extents are 1/16 of it), `pinned`: ZRTIER_GPU_STORE_PINNED,
  // `keeper`: run the memory budget's keeper (the auto budget), `codec`: ZRTIER_CODEC, `encode`:
  // ZRTIER_GPU_ENCODE, `resident`: ZRTIER_RESIDENT_LIMIT ("0": none).
  void Build(bool gpu_decode, const char* store_limit = nullptr, bool pinned = true,
             bool keeper = false, const char* codec = "gpu", bool encode = false,
             const char* resident = "0") {
    shim_.reset();
    Options opts;
    if (store_limit) {
      ASSERT_TRUE(opts.Set(Opt::kStoreLimit, store_limit).ok());
    }
    ASSERT_TRUE(opts.Set(Opt::kArena, "4G").ok());
    ASSERT_TRUE(opts.Set(Opt::kChunk, "64K").ok());
    ASSERT_TRUE(opts.Set(Opt::kResidentLimit, resident).ok());
    ASSERT_TRUE(opts.Set(Opt::kCodec, codec).ok());
    std::unique_ptr<Engine> engine;
    Status st = Engine::Create(opts, Os::Default(), nullptr, &engine);
    ASSERT_TRUE(st.ok()) << st.ToString();
    engine_ = engine.get();
    chunk_ = engine->chunk_size();
    std::unique_ptr<PinnedPool> pool;
    ASSERT_TRUE(PinnedPool::Create(RealCudaApi(), 16 * chunk_, chunk_, &pool).ok());
    ShimConfig cfg;
    cfg.workers = 2;
    cfg.gpu_decode = gpu_decode;
    cfg.gpu_store_pinned = pinned;
    cfg.keep_budget = keeper;
    cfg.gpu_encode = encode;
    shim_ = std::make_unique<Shim>(RealCudaApi(), std::move(engine), std::move(pool), cfg);
  }
  void TearDown() override { shim_.reset(); }

  // A region of `chunks` chunks of bf16 data (chunk 3 never written), evicted to the store but
  // chunk 5, which stays resident; its expected bytes in *want.
  char* StoredRegion(size_t chunks, std::vector<char>* want) {
    const size_t n = chunks * chunk_;
    void* p = nullptr;
    EXPECT_EQ(shim_->HostAlloc(&p, n, 0), cudaSuccess);
    char* r = static_cast<char*>(p);
    want->assign(n, 0);
    FillSample(SampleKind::kBf16Gaussian, 11, want->data(), n);
    memset(want->data() + 3 * chunk_, 0, chunk_);
    memcpy(r, want->data(), 3 * chunk_);
    memcpy(r + 4 * chunk_, want->data() + 4 * chunk_, n - 4 * chunk_);
    RegionInfo info;
    EXPECT_TRUE(engine_->Lookup(r, &info));
    shim_->pool()->DropRegion(info.id);
    EXPECT_TRUE(engine_->EvictTo(0).ok());
    EXPECT_EQ(memcmp(r + 5 * chunk_, want->data() + 5 * chunk_, chunk_), 0);  // back in T1
    return r;
  }

  // A copy of a stored region that the CPU must decode: exact bytes, nothing decoded on the GPU.
  void CopyOnTheCpu() {
    const size_t chunks = 24, n = chunks * chunk_;
    std::vector<char> want;
    char* r = StoredRegion(chunks, &want);
    char* d = testing::DeviceBuffer(n);
    const uint64_t decoded = StatGet(Stat::h2d_gpu_decoded_bytes);
    ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, nullptr, false), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(testing::FromDevice(d, n), want);
    EXPECT_EQ(StatGet(Stat::h2d_gpu_decoded_bytes), decoded);
    EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
  }

  // A device-to-host copy on a stream, after a sleep and the work that writes its source, of
  // kRoundTripChunks chunks less a page (bf16, chunk 9 zero, chunk 13 random bytes) into a new
  // region, then back to the GPU: exact bytes there and on the CPU. Returns the bytes the GPU
  // encoded (d2h_gpu_encoded_bytes); *cpu_encoded (if set): the bytes the CPU encoded meanwhile,
  // up to the device-to-host copy's end.
  static constexpr size_t kRoundTripChunks = 48;
  uint64_t DeviceToHostAndBack(uint64_t* cpu_encoded = nullptr) {
    const size_t chunks = kRoundTripChunks, n = chunks * chunk_ - 4096;
    std::vector<char> want(chunks * chunk_);
    FillSample(SampleKind::kBf16Gaussian, 21, want.data(), want.size());
    memset(want.data() + 9 * chunk_, 0, chunk_);
    FillSample(SampleKind::kRandom, 22, want.data() + 13 * chunk_, chunk_);
    want.resize(n);
    char* src = testing::DeviceBuffer(n);
    void* p = nullptr;
    EXPECT_EQ(shim_->HostAlloc(&p, chunks * chunk_, 0), cudaSuccess);
    char* r = static_cast<char*>(p);
    cudaStream_t s;
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    const uint64_t gpu0 = StatGet(Stat::d2h_gpu_encoded_bytes);
    const uint64_t cpu0 = StatGet(Stat::bytes_encoded);
    EXPECT_EQ(cudaMemsetAsync(src, 0x77, n, s), cudaSuccess);
    EXPECT_EQ(cudaLaunchHostFunc(s, SleepOnStream, nullptr), cudaSuccess);
    EXPECT_EQ(cudaMemcpyAsync(src, want.data(), n, cudaMemcpyHostToDevice, s), cudaSuccess);
    EXPECT_EQ(shim_->Memcpy(r, src, n, cudaMemcpyDeviceToHost, s, false), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    const uint64_t on_gpu = StatGet(Stat::d2h_gpu_encoded_bytes) - gpu0;
    if (cpu_encoded) *cpu_encoded = StatGet(Stat::bytes_encoded) - cpu0;
    // Back to the GPU (decoded there where stored in the GPU format), then read by the CPU.
    char* back = testing::DeviceBuffer(n);
    EXPECT_EQ(shim_->Memcpy(back, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    EXPECT_TRUE(testing::FromDevice(back, n) == want);
    EXPECT_EQ(memcmp(r, want.data(), n), 0);
    EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
    EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
    return on_gpu;
  }

  Engine* engine_ = nullptr;
  // `n` bytes of bf16 samples (seed `seed`, also in *want) in a new device buffer (*src), and a new
  // region of n bytes (returned; null, with a failure, if it cannot be had).
  char* BF16OnDeviceAndRegion(size_t n, uint64_t seed, std::vector<char>* want, char** src) {
    want->resize(n);
    FillSample(SampleKind::kBf16Gaussian, seed, want->data(), n);
    *src = testing::DeviceBuffer(n);
    EXPECT_EQ(cudaMemcpy(*src, want->data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    void* p = nullptr;
    EXPECT_EQ(shim_->HostAlloc(&p, n, 0), cudaSuccess);
    return static_cast<char*>(p);
  }

  size_t chunk_ = 0;
  std::unique_ptr<Shim> shim_;
};

TEST_F(GpuDecodeCopyTest, StoredChunksDecodeOnTheGpuInStreamOrder) {
  // Slow launches: work queued on the stream after the copy that did not wait for its decodes
  // would read the destination before them.
  testing::ScopedEnv slow("FAKE_LIBCUDA_LAUNCH_SLEEP_MS", "20");
  Build(true);
  const size_t chunks = 24, n = chunks * chunk_;
  std::vector<char> want;
  char* r = StoredRegion(chunks, &want);
  char* d = testing::DeviceBuffer(n);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  const uint64_t decoded = StatGet(Stat::h2d_gpu_decoded_bytes);
  const uint64_t sent = StatGet(Stat::h2d_gpu_encoded_bytes);
  // Behind a slow host function and a memset of the destination: a decode that ran when the copy
  // was issued would be overwritten by the memset.
  ASSERT_EQ(cudaLaunchHostFunc(s, &SleepOnStream, nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0x5A, n, s), cudaSuccess);
  // The whole region, then a copy that starts and ends inside chunks (partial chunks: CPU path).
  const uint64_t dmas = StatGet(Stat::h2d_dma_ops);
  ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, s, false), cudaSuccess);
  // A piece's encodings are packed and go in one DMA: fewer DMAs than chunks (22 encodings and
  // the resident chunk in pieces of at most 4 misses: 7 or so).
  EXPECT_LE(StatGet(Stat::h2d_dma_ops) - dmas, 12u);
  std::vector<char> got(n), got2(n - 1000);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), d, n, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(d, 0x5A, n, s), cudaSuccess);
  ASSERT_EQ(shim_->Memcpy(d + 16, r + 500, n - 1000, cudaMemcpyHostToDevice, s, false),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(got2.data(), d + 16, n - 1000, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(memcmp(got.data(), want.data(), n), 0);
  EXPECT_EQ(memcmp(got2.data(), want.data() + 500, n - 1000), 0);
  // The stored chunks of the first copy (all but the resident and the zero chunk) went encoded;
  // the second copy is not 16-byte aligned relative to its source: all on the CPU.
  EXPECT_EQ(StatGet(Stat::h2d_gpu_decoded_bytes) - decoded, (chunks - 2) * chunk_);
  const uint64_t enc = StatGet(Stat::h2d_gpu_encoded_bytes) - sent;
  EXPECT_GT(enc, 0u);
  EXPECT_LT(enc, (chunks - 2) * chunk_);  // bf16 compresses: fewer bytes crossed the link
  // The CPU still reads every byte, and the chunks are still stored (not installed by the copy).
  EXPECT_EQ(memcmp(r, want.data(), n), 0);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
}

// With the RAM store's memory registered for DMA (ZRTIER_GPU_STORE_PINNED, the default with GPU
// decode), encodings in sealed store extents go to the GPU straight from the store (leases), a
// clean resident chunk's store copy too, the rest packed by the fills: exact bytes, again after the
// CPU rewrote a chunk (its store copy freed while leases may still hold it); freeing the region
// releases the registered extents. Without it nothing is leased.
TEST_F(GpuDecodeCopyTest, EncodingsGoStraightFromThePinnedStore) {
  for (bool pinned : {true, false}) {
    SCOPED_TRACE(pinned ? "pinned store" : "staging only");
    shim_.reset();
    const uint64_t pinned0 = StatGet(Stat::store_pinned_bytes);
    // 1 MiB store extents: most entries lie in sealed ones. The keeper reaps released extents.
    Build(true, "16M", pinned, /*keeper=*/true);
    const size_t chunks = 96, n = chunks * chunk_;
    std::vector<char> want;
    char* r = StoredRegion(chunks, &want);
    char* d = testing::DeviceBuffer(n);
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE(round);
      const uint64_t leased = StatGet(Stat::h2d_gpu_leased_bytes);
      const uint64_t sent = StatGet(Stat::h2d_gpu_encoded_bytes);
      const uint64_t decoded = StatGet(Stat::h2d_gpu_decoded_bytes);
      ASSERT_EQ(cudaMemsetAsync(d, 0x5A, n, nullptr), cudaSuccess);
      ASSERT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, nullptr, false), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(testing::FromDevice(d, n), want);
      const uint64_t l = StatGet(Stat::h2d_gpu_leased_bytes) - leased;
      const uint64_t e = StatGet(Stat::h2d_gpu_encoded_bytes) - sent;
      // Every chunk but the zero one went encoded; in the first round chunk 5 is resident (clean,
      // its store copy current): leased too where the store is pinned, else copied from T1.
      const size_t cpu_chunks = round == 0 && !pinned ? 2 : 1;
      EXPECT_EQ(StatGet(Stat::h2d_gpu_decoded_bytes) - decoded, (chunks - cpu_chunks) * chunk_);
      if (pinned) {
        EXPECT_GT(l, e / 2) << "most encodings from the store, " << l << " of " << e;
        EXPECT_LE(l, e);
        EXPECT_GT(StatGet(Stat::store_pinned_bytes), pinned0);
      } else {
        EXPECT_EQ(l, 0u);
        EXPECT_GT(e, 0u);
        EXPECT_EQ(StatGet(Stat::store_pinned_bytes), pinned0);
      }
      // The CPU rewrites a stored chunk, then it goes back to the store with new bytes.
      FillSample(SampleKind::kBf16Gaussian, 50 + round, want.data() + 7 * chunk_, chunk_);
      memcpy(r + 7 * chunk_, want.data() + 7 * chunk_, chunk_);
      RegionInfo info;
      ASSERT_TRUE(engine_->Lookup(r, &info));
      shim_->pool()->DropRegion(info.id);
      ASSERT_TRUE(engine_->EvictTo(0).ok());
    }
    EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
    // The last copy's leases end, and the region's extents are released to the pinning and
    // unregistered and unmapped, by the keeper (no copy comes to do it). A reap in progress has
    // unregistered an extent before it unmaps it and counts it off the queue.
    auto reaped = [&] {
      return StatGet(Stat::store_pinned_bytes) == pinned0 &&
             (!pinned || shim_->pinning()->queued_bytes() == 0);
    };
    for (int i = 0; i < 200 && !reaped(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(StatGet(Stat::store_pinned_bytes), pinned0) << "every registered extent released";
    if (pinned) {
      EXPECT_EQ(shim_->pinning()->queued_bytes(), 0u) << "every released extent unmapped";
    }
  }
}

// With ZRTIER_GPU_ENCODE and a resident budget far below the copy, a device-to-host copy's whole
// chunks are encoded on the GPU, in stream order after the work that wrote the source (slow
// launches, a sleep before that work), and stored as they land: a GPU-decoded copy back and the
// CPU read every byte; a zero chunk and one that does not shrink (random bytes, raw from the
// kernel) are among them, and a partial chunk at the end crosses raw. The CPU encodes none of the
// chunks the GPU did. Without the option, nothing is encoded on the GPU.
TEST_F(GpuDecodeCopyTest, DeviceToHostChunksBoundForTheStoreAreEncodedOnTheGpu) {
  testing::ScopedEnv slow("FAKE_LIBCUDA_LAUNCH_SLEEP_MS", "20");
  for (bool encode : {true, false}) {
    SCOPED_TRACE(encode ? "encode" : "no encode");
    Build(true, nullptr, true, false, "gpu", encode, "256K");
    const uint64_t launches0 = StatGet(Stat::d2h_gpu_launches);
    uint64_t cpu = 0;
    const uint64_t on_gpu = DeviceToHostAndBack(&cpu);
    if (encode) {
      // Every whole chunk but the random one; the CPU encodes that one and the partial one at most.
      EXPECT_EQ(on_gpu, (kRoundTripChunks - 2) * chunk_);
      EXPECT_LE(cpu, 2 * chunk_);
      // One launch for the whole chunks: an encoded piece is not bounded by the T0 pool (16 chunks
      // here, 4 a piece), only by the landing room.
      EXPECT_EQ(StatGet(Stat::d2h_gpu_launches) - launches0, 1u);
    } else {
      EXPECT_EQ(on_gpu, 0u);
      // The publish encodes on the CPU what goes past the resident budget.
      EXPECT_GE(cpu, (kRoundTripChunks - 8) * chunk_);
    }
  }
}

// A chunk the CPU read back after a device-to-host copy stored it is not encoded on the GPU by the
// next copy into it (the CPU's faults would decode the GPU format); the others still are.
TEST_F(GpuDecodeCopyTest, ChunksTheCpuReadsBackAreNotEncodedOnTheGpu) {
  Build(true, nullptr, true, false, "gpu", /*encode=*/true, "256K");
  const size_t n = 32 * chunk_;
  std::vector<char> want;
  char* src = nullptr;
  char* r = BF16OnDeviceAndRegion(n, 41, &want, &src);
  auto d2h = [&] {
    const uint64_t gpu0 = StatGet(Stat::d2h_gpu_encoded_bytes);
    EXPECT_EQ(shim_->Memcpy(r, src, n, cudaMemcpyDeviceToHost, nullptr, false), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return StatGet(Stat::d2h_gpu_encoded_bytes) - gpu0;
  };
  EXPECT_EQ(d2h(), n);
  EXPECT_EQ(memcmp(r + 3 * chunk_, want.data() + 3 * chunk_, chunk_), 0);  // the CPU reads chunk 3
  const uint64_t again = d2h();
  EXPECT_GT(again, 0u);
  EXPECT_LT(again, n);
  EXPECT_EQ(memcmp(r, want.data(), n), 0);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
}

// A device-to-host copy of more pieces than the landing room holds: its pieces take the landing
// room in turn (the last waits for the first's publish), each piece's outputs land in runs of 32
// chunks (a DMA each, published as it lands), and every byte arrives.
TEST_F(GpuDecodeCopyTest, DeviceToHostCopiesLargerThanTheLandingRoomAreEncodedPieceByPiece) {
  Build(true, nullptr, true, false, "gpu", /*encode=*/true, "256K");
  const size_t piece = std::min(GpuEncode::kRecordChunks * chunk_, GpuEncode::kLandingBytes / 2);
  const size_t pieces = GpuEncode::kLandingBytes / piece + 1;
  const size_t n = pieces * piece + chunk_ / 2;
  std::vector<char> want;
  char* src = nullptr;
  char* r = BF16OnDeviceAndRegion(n, 31, &want, &src);
  const uint64_t launches0 = StatGet(Stat::d2h_gpu_launches);
  const uint64_t gpu0 = StatGet(Stat::d2h_gpu_encoded_bytes);
  const uint64_t copies0 = fakecudaCopies();
  EXPECT_EQ(shim_->Memcpy(r, src, n, cudaMemcpyDeviceToHost, nullptr, false), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(StatGet(Stat::d2h_gpu_launches) - launches0, pieces);
  EXPECT_GE(fakecudaCopies() - copies0, pieces * (piece / chunk_ / 32));
  EXPECT_EQ(StatGet(Stat::d2h_gpu_encoded_bytes) - gpu0, pieces * piece);
  char* back = testing::DeviceBuffer(n);
  EXPECT_EQ(shim_->Memcpy(back, r, n, cudaMemcpyHostToDevice, nullptr, false), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(testing::FromDevice(back, n) == want);
  EXPECT_EQ(memcmp(r, want.data(), n), 0);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
}

// With the auto codec, chunks are stored in the GPU format once the decode kernel is loaded (at
// the first allocation), except the chunks the CPU touches again after their first write: those
// are stored in the auto format when written again and their copies decode on the CPU. Every
// copy delivers the exact bytes.
TEST_F(GpuDecodeCopyTest, TheAutoCodecStoresForTheGpuWhatTheCpuDoesNotReuse) {
  Build(true, nullptr, true, /*keeper=*/true, "auto");
  ASSERT_NE(shim_->budget(), nullptr);
  EXPECT_EQ(shim_->budget()->other_pinned(), 0u);
  const size_t chunks = 24, n = chunks * chunk_;
  char* d = testing::DeviceBuffer(n);
  auto copy = [&](char* r, const std::vector<char>& want) {
    const uint64_t decoded = StatGet(Stat::h2d_gpu_decoded_bytes);
    EXPECT_EQ(shim_->Memcpy(d, r, n, cudaMemcpyHostToDevice, nullptr, false), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(testing::FromDevice(d, n), want);
    return StatGet(Stat::h2d_gpu_decoded_bytes) - decoded;
  };
  auto evict = [&](char* r) {
    RegionInfo info;
    ASSERT_TRUE(engine_->Lookup(r, &info));
    shim_->pool()->DropRegion(info.id);
    ASSERT_TRUE(engine_->EvictTo(0).ok());
  };
  EXPECT_FALSE(engine_->GpuEncoded());
  // Written, then stored: the GPU format (all but the resident and the zero chunk go encoded).
  std::vector<char> want;
  char* r = StoredRegion(chunks, &want);
  EXPECT_TRUE(engine_->GpuEncoded());
  EXPECT_EQ(copy(r, want), (chunks - 2) * chunk_);
  // The staging ring set up by that copy is counted in the memory budget.
  EXPECT_GE(shim_->budget()->other_pinned(), GpuDecode::kHostStagingBytes);
  // The CPU reads chunk 8 and rewrites chunk 9 (stored: both fault), then they (and chunk 5, which
  // StoredRegion read back) are stored again: chunk 9 re-encoded in the auto format, chunks 5 and
  // 8 dropped, their store copies current.
  EXPECT_EQ(memcmp(r + 8 * chunk_, want.data() + 8 * chunk_, chunk_), 0);
  FillSample(SampleKind::kBf16Gaussian, 77, want.data() + 9 * chunk_, chunk_);
  memcpy(r + 9 * chunk_, want.data() + 9 * chunk_, chunk_);
  evict(r);
  EXPECT_EQ(copy(r, want), (chunks - 2) * chunk_);
  // A rewrite of chunk 8, which the CPU reused: stored in the auto format too.
  FillSample(SampleKind::kBf16Gaussian, 78, want.data() + 8 * chunk_, chunk_);
  memcpy(r + 8 * chunk_, want.data() + 8 * chunk_, chunk_);
  evict(r);
  EXPECT_EQ(copy(r, want), (chunks - 3) * chunk_);
  EXPECT_EQ(shim_->FreeHost(r), cudaSuccess);
}

// The kernel fails to load in the context (no binary for the GPU), or its launches fail: every
// copy still delivers the exact bytes, decoded by the CPU.
TEST_F(GpuDecodeCopyTest, AKernelThatCannotLoadOrLaunchLeavesTheCopyToTheCpu) {
  for (const char* knob : {"FAKE_LIBCUDA_NO_MODULE", "FAKE_LIBCUDA_LAUNCH_FAIL"}) {
    SCOPED_TRACE(knob);
    testing::ScopedEnv fail(knob, "1");
    Build(true);
    CopyOnTheCpu();
    // The encode kernel likewise: the device-to-host copy's bytes cross raw.
    Build(true, nullptr, true, false, "gpu", /*encode=*/true, "256K");
    EXPECT_EQ(DeviceToHostAndBack(), 0u);
  }
}

TEST_F(GpuDecodeCopyTest, OffKeepsTheCpuPath) {
  Build(false);
  CopyOnTheCpu();
}

}  // namespace
}  // namespace zrtier
