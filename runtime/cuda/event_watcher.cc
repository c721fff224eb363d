#include "runtime/cuda/event_watcher.h"

#include <sched.h>

#include <chrono>
#include <optional>
#include <thread>

#include "runtime/base/thread_name.h"
#include "runtime/cuda/capture_mode.h"

namespace zrtier {

EventWatcher::EventWatcher(const CudaApi* api) : api_(api) {
  thread_ = std::thread([this] {
    NameThisThread("zr-events");
    Loop();
  });
}

EventWatcher::~EventWatcher() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void EventWatcher::Watch(cudaEvent_t event, Callback fn) {
  int device = -1;
  if (api_->cudaGetDevice(&device) != cudaSuccess) device = -1;
  bool was_empty;
  {
    std::lock_guard<std::mutex> l(mu_);
    was_empty = incoming_.empty();
    incoming_.push_back(Item{event, std::move(fn), device});
  }
  if (was_empty) wake_.notify_one();
}

void EventWatcher::UseDevice(int device) {
  if (device < 0 || device == current_device_ || !api_->cudaSetDevice) return;
  if (api_->cudaSetDevice(device) == cudaSuccess) current_device_ = device;
}

void EventWatcher::Loop() {
  // The thread's queries and waits never fail or invalidate a graph the program captures
  // meanwhile. Set once the thread has a device, on the first event: no call of this thread's
  // makes a context on a device the program does not use.
  std::optional<CaptureModeRelaxed> relaxed;
  std::vector<Item> watched;
  auto last = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      if (watched.empty()) wake_.wait(l, [&] { return stop_ || !incoming_.empty(); });
      for (Item& it : incoming_) watched.push_back(std::move(it));
      incoming_.clear();
      if (stop_ && watched.empty()) return;
      if (stop_) {
        // Shutting down: wait for the rest in order (nothing new can be queued behind them).
        l.unlock();
        for (Item& it : watched) {
          UseDevice(it.device);
          if (!relaxed) relaxed.emplace(api_);
          it.fn(it.event, api_->cudaEventSynchronize(it.event));
        }
        watched.clear();
        continue;
      }
    }
    bool any = false;
    for (size_t i = 0; i < watched.size();) {
      UseDevice(watched[i].device);
      if (!relaxed) relaxed.emplace(api_);
      cudaError_t e = api_->cudaEventQuery(watched[i].event);
      if (e == cudaErrorNotReady) {
        ++i;
        continue;
      }
      Item it = std::move(watched[i]);
      watched.erase(watched.begin() + static_cast<long>(i));
      it.fn(it.event, e);
      any = true;
    }
    // Pieces land every few tens of microseconds while a copy streams: poll, yielding the core;
    // after a quiet spell (a long copy, a busy GPU) poll at a gentler pace.
    auto now = std::chrono::steady_clock::now();
    if (any) {
      last = now;
    } else if (now - last < std::chrono::microseconds(500)) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace zrtier
