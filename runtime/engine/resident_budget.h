// ResidentBudget: the resident limit of T1 (ZRTIER_RESIDENT_LIMIT) and the signals around it --
// whether installing one more chunk would pass it, the evictors' wake-up when it is passed, and
// the throttle that makes a publishing writer wait while the evictors make room.
//
// "Stalled": the evictors cannot make progress (nothing evictable, or the store refuses entries);
// then nothing is throttled (faults and writers go past the limit instead of waiting forever).
//
// Thread safety: every method may be called from any thread. mu_ only pairs with the condition
// variables; the limit and the flags are atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "runtime/base/stats.h"
#include "runtime/engine/region_map.h"

namespace zrtier {

class ResidentBudget {
 public:
  // `regions` (not owned) keeps the resident count; `limit` 0 = none.
  ResidentBudget(const RegionMap* regions, size_t chunk, uint64_t limit);
  ~ResidentBudget();

  uint64_t limit() const { return limit_.load(std::memory_order_relaxed); }
  // Moves the budget (the evictors catch up in the background).
  void SetLimit(uint64_t bytes);
  // True if installing one more chunk would pass the budget (plus a slack) and the evictors can
  // still help.
  bool OverBudget() const;
  // True while resident bytes exceed the limit (work for the evictors).
  bool Exceeded() const;
  // Bytes the budget has left (UINT64_MAX without a limit). A snapshot.
  uint64_t Room() const;
  // Wakes an evictor if the limit is exceeded.
  void Kick();
  // Wakes every evictor.
  void KickAll() { evict_cv_.notify_all(); }
  // Blocks a publishing caller while OverBudget() and the evictors are making progress (at most
  // 2 s; not after Stop()).
  void WaitForRoom();

  void SetStalled(bool stalled) { stalled_.store(stalled); }
  bool stalled() const { return stalled_.load(std::memory_order_relaxed); }

  // Whether T1 keeps part of the data apart (t1_victim.h): the data (resident and stored chunks)
  // does not fit the limit and the CPU sweeps through it -- at least kSweepRestores stored chunks
  // restored for the CPU within about kCpuRestoreWindowNs (copies alone, which read stored chunks
  // without restoring them, are placed by their learned order; a few stray touches are no sweep).
  // The pager then restores a kept chunk without its store copy.
  bool keeping() const;
  // The pager's note of a stored chunk restored for the CPU (a fault or its readahead).
  void NoteCpuRestore();
  static constexpr uint64_t kSweepRestores = 128;
  static constexpr uint64_t kCpuRestoreWindowNs = 2'000'000'000;

  // The bytes that readahead keeps restored ahead of the CPU's scans now, all streams together
  // (the pager's estimate, at most an eighth of the limit). The room that a keep set leaves for
  // the chunks that cycle must hold them, or readahead's chunks leave again before the scan reads
  // them. The last estimate stays until the next scan's fault: it is read only while keeping(),
  // which needs scans.
  void SetReadaheadReach(uint64_t bytes) {
    if (reach_.exchange(bytes, std::memory_order_relaxed) != bytes)
      StatSet(Stat::readahead_reach_bytes, bytes);
  }
  uint64_t readahead_reach() const { return reach_.load(std::memory_order_relaxed); }

  // The evictors' side: sleep until kicked (or `timeout`), and tell throttled writers that room
  // was made.
  void WaitForWork(std::chrono::milliseconds timeout);
  void RoomMade() { room_cv_.notify_all(); }
  // Wakes every waiter; WaitForRoom returns at once from now on.
  void Stop();

 private:
  uint64_t Slack() const;

  const RegionMap* regions_;
  size_t chunk_;
  std::atomic<uint64_t> limit_;
  std::atomic<bool> stalled_{false};
  // CPU restores counted in windows of kCpuRestoreWindowNs (approximate under races: a hint).
  std::atomic<uint64_t> window_ns_{0};     // when the current window began
  std::atomic<uint64_t> window_count_{0};  // restores in it
  std::atomic<uint64_t> prev_count_{0};    // restores in the window before it
  std::atomic<uint64_t> reach_{0};         // SetReadaheadReach
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable evict_cv_;  // wakes evictors
  std::condition_variable room_cv_;   // wakes throttled writers
};

}  // namespace zrtier
