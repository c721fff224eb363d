// EventWatcher: one thread that runs a callback on the host as soon as a CUDA event completes,
// without putting a host function into the stream. A host function stalls its stream for the
// round trip to the host (tens of microseconds on every piece); an event costs the stream nothing,
// so the device-to-host path records one per piece and lets this thread hand each landed piece to
// the fill workers while the next piece is still on the wire.
//
// The thread polls the watched events with cudaEventQuery (any of them may complete first: events
// of different streams are never waited for in order, so one stalled stream cannot hold up the
// others) and yields between rounds; it sleeps while nothing is watched. It queries each event
// with the current device of the thread that handed it over, so that a program on device N never
// gets a context on device 0 from this thread.
//
// Thread safety: Watch may be called from any thread. Callbacks run on the watcher thread, one at a
// time, and must not call Watch's owner back into CUDA synchronization; they may call any non-
// blocking code (e.g. FillWorkers::Submit). The event is the caller's: the callback gets it back.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/cuda/cuda_api.h"

namespace zrtier {

class EventWatcher {
 public:
  using Callback = std::function<void(cudaEvent_t event, cudaError_t status)>;

  explicit EventWatcher(const CudaApi* api);
  // Runs the callbacks of every event still watched (after cudaEventSynchronize), then stops.
  ~EventWatcher();
  EventWatcher(const EventWatcher&) = delete;
  EventWatcher& operator=(const EventWatcher&) = delete;

  // Calls fn(event, status) once `event` (already recorded by the caller) has completed (status
  // cudaSuccess) or failed (the error cudaEventQuery reported).
  void Watch(cudaEvent_t event, Callback fn);

 private:
  struct Item {
    cudaEvent_t event;
    Callback fn;
    int device;  // the current device of Watch's caller (-1: unknown)
  };
  void Loop();
  // Makes `device` this thread's current device (if known and not already).
  void UseDevice(int device);

  const CudaApi* api_;
  std::mutex mu_;  // guards incoming_ and stop_
  std::condition_variable wake_;
  std::vector<Item> incoming_;
  bool stop_ = false;
  int current_device_ = -1;  // the watcher thread's current device (its own thread only)
  std::thread thread_;
};

}  // namespace zrtier
