// StagingRing (runtime/shim/staging_ring.h) over the fake CUDA runtime: reservations are packed
// in ring order and never wrap; one that reaches bytes
// still read by queued stream work waits for that work's event; one that reaches a reservation not
// yet committed, or too large a one, is refused; a released span is free at once.
#include "runtime/shim/staging_ring.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/event_pool.h"
#include "tests/fake_cuda/fake_cuda.h"

namespace zrtier {
namespace {

using namespace std::chrono_literals;

// Blocks the stream's worker until *gate is set.
void CUDART_CB WaitForGate(void* gate) {
  while (!static_cast<std::atomic<bool>*>(gate)->load()) std::this_thread::sleep_for(1ms);
}

class StagingRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(CudaApiStatus().ok()) << CudaApiStatus().ToString();
    api_ = RealCudaApi();
    events_ = std::make_unique<EventPool>(api_);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&base_), kBytes), cudaSuccess);
    ring_ = std::make_unique<StagingRing>(api_, events_.get(), base_, kBytes);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamSynchronize(stream_);
    ring_.reset();
    events_.reset();
    if (stream_) cudaStreamDestroy(stream_);
    if (base_) cudaFree(base_);
  }
  static constexpr size_t kBytes = 1 << 20;
  const CudaApi* api_ = nullptr;
  std::unique_ptr<EventPool> events_;
  char* base_ = nullptr;
  std::unique_ptr<StagingRing> ring_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(StagingRingTest, PacksInOrderAndRefusesWhatDoesNotFit) {
  EXPECT_EQ(ring_->Reserve(0).ptr, nullptr);
  EXPECT_EQ(ring_->Reserve(kBytes / 2 + 16).ptr, nullptr);
  StagingRing::Span a = ring_->Reserve(300 << 10);
  ring_->Commit(a, stream_);
  StagingRing::Span b = ring_->Reserve(300 << 10);
  ring_->Commit(b, stream_);
  StagingRing::Span c = ring_->Reserve(300 << 10);
  ring_->Commit(c, stream_);
  EXPECT_EQ(a.ptr, base_);
  EXPECT_EQ(b.ptr, base_ + (300 << 10));
  EXPECT_EQ(c.ptr, base_ + (600 << 10));
  // 300 KiB more would cross the end: it starts at the base again (once `a`'s work is done).
  StagingRing::Span d = ring_->Reserve(300 << 10);
  EXPECT_EQ(d.ptr, base_);
  ring_->Commit(d, stream_);
}

TEST_F(StagingRingTest, ReuseWaitsForTheStreamWorkThatReadsTheBytes) {
  std::atomic<bool> gate{false};
  ASSERT_EQ(cudaLaunchHostFunc(stream_, &WaitForGate, &gate), cudaSuccess);
  StagingRing::Span a = ring_->Reserve(kBytes / 2);
  ring_->Commit(a, stream_);  // its event is behind the gate
  StagingRing::Span b = ring_->Reserve(kBytes / 2);
  ring_->Commit(b, stream_);
  ASSERT_NE(a.ptr, nullptr);
  ASSERT_NE(b.ptr, nullptr);
  auto again = std::async(std::launch::async, [&] { return ring_->Reserve(kBytes / 2); });
  EXPECT_EQ(again.wait_for(200ms), std::future_status::timeout) << "reused bytes still in use";
  gate = true;
  ASSERT_EQ(again.wait_for(10s), std::future_status::ready);
  StagingRing::Span c = again.get();
  EXPECT_EQ(c.ptr, a.ptr);
  ring_->Commit(c, stream_);
}

TEST_F(StagingRingTest, AnUncommittedReservationIsNotWaitedForAndReleaseFreesAtOnce) {
  StagingRing::Span a = ring_->Reserve(kBytes / 2);
  StagingRing::Span b = ring_->Reserve(kBytes / 2);
  ring_->Commit(b, stream_);
  ASSERT_NE(a.ptr, nullptr);
  // The next bytes are a's, not committed (its holder may be this very thread): refused at once.
  EXPECT_EQ(ring_->Reserve(kBytes / 2).ptr, nullptr);
  ring_->Release(a);  // nothing was queued from it
  StagingRing::Span c = ring_->Reserve(kBytes / 2);
  EXPECT_EQ(c.ptr, a.ptr);
  ring_->Commit(c, stream_);
}

}  // namespace
}  // namespace zrtier
