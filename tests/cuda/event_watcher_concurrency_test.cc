// Covers EventWatcher over the fake CUDA runtime: a callback runs once its event completes, events
// of a stalled stream do not hold up another stream's, a failed record is reported, and the
// destructor runs the callbacks still pending.
#include "runtime/cuda/event_watcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <cuda_runtime_api.h>

#include "runtime/cuda/cuda_api.h"

namespace zrtier {
namespace {

using std::chrono::milliseconds;

void CUDART_CB Gate(void* p) {
  auto* open = static_cast<std::atomic<bool>*>(p);
  while (!open->load()) std::this_thread::sleep_for(milliseconds(1));
}

bool WaitFor(const std::atomic<int>& v, int want) {
  for (int i = 0; i < 5000 && v.load() != want; ++i) std::this_thread::sleep_for(milliseconds(1));
  return v.load() == want;
}

class EventWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(CudaApiStatus().ok()) << CudaApiStatus().ToString();
    api_ = RealCudaApi();
    ASSERT_EQ(cudaStreamCreateWithFlags(&a_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(api_->cudaEventCreateWithFlags(&ea_, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(api_->cudaEventCreateWithFlags(&eb_, cudaEventDisableTiming), cudaSuccess);
  }
  void TearDown() override {
    api_->cudaDeviceSynchronize();
    api_->cudaEventDestroy(ea_);
    api_->cudaEventDestroy(eb_);
    cudaStreamDestroy(a_);
    cudaStreamDestroy(b_);
  }
  const CudaApi* api_ = nullptr;
  cudaStream_t a_ = nullptr, b_ = nullptr;
  cudaEvent_t ea_ = nullptr, eb_ = nullptr;
};

TEST_F(EventWatcherTest, AStalledStreamDoesNotHoldUpAnother) {
  std::atomic<bool> open{false};
  std::atomic<int> a_done{0}, b_done{0};
  {
    EventWatcher w(api_);
    ASSERT_EQ(api_->cudaLaunchHostFunc(a_, Gate, &open), cudaSuccess);
    ASSERT_EQ(api_->cudaEventRecord(ea_, a_), cudaSuccess);
    ASSERT_EQ(api_->cudaEventRecord(eb_, b_), cudaSuccess);
    w.Watch(ea_, [&](cudaEvent_t e, cudaError_t st) {
      EXPECT_EQ(e, ea_);
      EXPECT_EQ(st, cudaSuccess);
      a_done.fetch_add(1);
    });
    w.Watch(eb_, [&](cudaEvent_t e, cudaError_t st) {
      EXPECT_EQ(e, eb_);
      EXPECT_EQ(st, cudaSuccess);
      b_done.fetch_add(1);
    });
    EXPECT_TRUE(WaitFor(b_done, 1)) << "stream b's event was held up by stalled stream a";
    std::this_thread::sleep_for(milliseconds(20));
    EXPECT_EQ(a_done.load(), 0) << "callback ran before its event completed";
    open = true;
    EXPECT_TRUE(WaitFor(a_done, 1));
  }
  EXPECT_EQ(a_done.load(), 1);
  EXPECT_EQ(b_done.load(), 1);
}

TEST_F(EventWatcherTest, DestructorRunsPendingCallbacks) {
  std::atomic<bool> open{false};
  std::atomic<int> done{0};
  std::thread opener;
  {
    EventWatcher w(api_);
    ASSERT_EQ(api_->cudaLaunchHostFunc(a_, Gate, &open), cudaSuccess);
    ASSERT_EQ(api_->cudaEventRecord(ea_, a_), cudaSuccess);
    w.Watch(ea_, [&](cudaEvent_t, cudaError_t st) {
      EXPECT_EQ(st, cudaSuccess);
      done.fetch_add(1);
    });
    opener = std::thread([&] {
      std::this_thread::sleep_for(milliseconds(30));
      open = true;
    });
  }
  EXPECT_EQ(done.load(), 1) << "the destructor returned before the pending callback ran";
  opener.join();
}

TEST_F(EventWatcherTest, ManyEventsEachCallbackOnce) {
  std::atomic<int> done{0};
  std::vector<cudaEvent_t> evs(64);
  {
    EventWatcher w(api_);
    for (size_t i = 0; i < evs.size(); ++i) {
      ASSERT_EQ(api_->cudaEventCreateWithFlags(&evs[i], cudaEventDisableTiming), cudaSuccess);
      ASSERT_EQ(api_->cudaEventRecord(evs[i], i % 2 ? a_ : b_), cudaSuccess);
      w.Watch(evs[i], [&](cudaEvent_t, cudaError_t st) {
        EXPECT_EQ(st, cudaSuccess);
        done.fetch_add(1);
      });
    }
    EXPECT_TRUE(WaitFor(done, static_cast<int>(evs.size())));
  }
  EXPECT_EQ(done.load(), static_cast<int>(evs.size()));
  for (cudaEvent_t e : evs) api_->cudaEventDestroy(e);
}

}  // namespace
}  // namespace zrtier
