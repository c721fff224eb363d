#include "runtime/engine/watchdog.h"

#include <chrono>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/base/thread_name.h"

namespace zrtier {

void Watchdog::Start() {
  thread_ = std::thread([this] {
    NameThisThread("zr-watchdog");
    Loop();
  });
}

void Watchdog::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void Watchdog::PublishStats() {
  StoreUsage su = store_->Usage();
  StatSet(Stat::store_raw_bytes, su.raw_bytes);
  StatSet(Stat::store_bytes, su.payload_bytes);
  StatSet(Stat::store_used_bytes, su.used_bytes);
  StatSet(Stat::store_idle_bytes, su.idle_bytes);
  StatSet(Stat::store_limit_bytes, su.limit_bytes);
  regions_->ForEach([](const Region& r) {
    if (r.stats_row < 0) return;
    StatsRegionRow& row = Stats()->regions[r.stats_row];
    row.seq.fetch_add(1);
    row.resident_bytes.store(r.resident.load());
    row.stored_raw_bytes.store(r.stored_raw.load());
    row.stored_bytes.store(r.stored_bytes.load());
    row.seq.fetch_add(1);
  });
}

void Watchdog::Loop() {
  bool said_dead = false, said_stall = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stop_; });
      if (stop_) break;
    }
    PublishStats();
    store_->ReleaseIdle(kStoreIdleNs);
    if (pager_->failed() && !said_dead) {
      said_dead = true;
      Log(LogLevel::kError,
          "the userfaultfd fault handler thread has stopped; threads touching managed "
          "memory will hang (set ZRTIER_DISABLE=1 to run without zrtier)");
    }
    uint64_t beat = pager_->heartbeat(), now = MonotonicNs();
    uint64_t age = now > beat ? now - beat : 0;
    if (!pager_->failed() && age > 2'000'000'000ull && !said_stall) {
      said_stall = true;
      Log(LogLevel::kError, "the fault handler thread has not run for %.1f s (stalled?)",
          age / 1e9);
    } else if (age < 1'000'000'000ull) {
      said_stall = false;
    }
  }
}

}  // namespace zrtier
