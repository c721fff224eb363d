// StagingRing: a ring of memory (device memory, or pinned host memory) that host-to-device copies
// stage chunk encodings in for the GPU decode kernel (gpu_decode.h). A copy reserves room, queues
// the work that writes and reads it on its stream, then commits the reservation with that stream:
// an event recorded there frees the bytes once the work is done. Reservations are handed out in
// ring order, whatever the slot or stream; one that reaches bytes whose reader's event is pending
// waits for it, and one that reaches a reservation not yet committed is refused (its holder may
// be the caller itself) unless the caller asks to wait for it. A ring whose reservations are
// released by the host (a landing buffer the CPU reads) uses Release alone.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/event_pool.h"

namespace zrtier {

class StagingRing {
 public:
  // The ring is the `bytes` at `base` (owned by the caller, outliving this).
  StagingRing(const CudaApi* api, EventPool* events, char* base, size_t bytes);
  // REQUIRES: every reservation committed (its events are given back; their work need not be
  // done).
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  struct Span {
    char* ptr = nullptr;  // null: nothing reserved
    uint64_t id = 0;
  };
  // Reserves `bytes` (> 0, at most max_reserve()) contiguous bytes, waiting for the work that
  // last read them. Null span when bytes is 0 or too large, or when the bytes belong to a
  // reservation not yet committed -- unless `wait_uncommitted`: then it waits until that one is
  // committed or released (its holder must not be waiting on the caller).
  Span Reserve(size_t bytes, bool wait_uncommitted = false);
  // The work queued on `stream` so far (the DMAs into the span and the launch reading it) is the
  // span's last use: an event recorded on the stream frees it. Without an event (none could be
  // had or recorded) waits for the stream here instead.
  void Commit(const Span& span, cudaStream_t stream);
  // Gives back a span that no queued work reads (nothing was issued from it).
  void Release(const Span& span);

  size_t capacity() const { return bytes_; }
  // A reservation takes at most half the ring: two pieces can be staged while one is decoded.
  size_t max_reserve() const { return bytes_ / 2; }

 private:
  struct Use {
    uint64_t id;
    uint64_t begin;  // monotonic byte offset of the use's first byte (with the skipped tail)
    cudaEvent_t ev = nullptr;
    bool committed = false;
  };
  // Waits until the oldest use, committed, is done and drops it. REQUIRES: lock held, uses_ not
  // empty.
  void RetireOldest(std::unique_lock<std::mutex>& lock);
  // Records the span's last use: `ev` (null: already done).
  void Finish(const Span& span, cudaEvent_t ev);

  const CudaApi* api_;
  EventPool* events_;
  char* const base_;
  const size_t bytes_;
  std::mutex mu_;
  std::condition_variable committed_cv_;  // a use was committed or released
  uint64_t head_ = 0;     // monotonic offset of the next byte handed out (guarded by mu_)
  uint64_t next_id_ = 1;  // guarded by mu_
  std::deque<Use> uses_;  // in ring order (guarded by mu_)
};

}  // namespace zrtier
