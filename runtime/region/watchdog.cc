// The watchdog thread: every 200 ms it refreshes the per-region stats rows and the store gauges,
// and reports on stderr a pager that has exited or has not run for 2 s. See docs/ARCHITECTURE.md
// ("Watchdog").

#include "runtime/base/log.h"
#include "runtime/region/engine_impl.h"

namespace zrtier {

void Engine::Impl::PublishStats() {
  StoreUsage su = store_->Usage();
  StatSet(Stat::store_raw_bytes, su.raw_bytes);
  StatSet(Stat::store_bytes, su.payload_bytes);
  StatSet(Stat::store_used_bytes, su.used_bytes);
  StatSet(Stat::store_limit_bytes, su.limit_bytes);
  std::shared_lock<std::shared_mutex> lock(regions_mu_);
  for (auto& [base, r] : regions_) {
    if (r->stats_row < 0) continue;
    StatsRegionRow& row = Stats()->regions[r->stats_row];
    row.seq.fetch_add(1);
    row.resident_bytes.store(r->resident.load());
    row.stored_raw_bytes.store(r->stored_raw.load());
    row.stored_bytes.store(r->stored_bytes.load());
    row.seq.fetch_add(1);
  }
}

void Engine::Impl::WatchdogLoop() {
  bool said_dead = false, said_stall = false;
  while (!stop_.load()) {
    {
      std::unique_lock<std::mutex> lock(evict_mu_);
      room_cv_.wait_for(lock, std::chrono::milliseconds(200));
    }
    if (stop_.load()) break;
    PublishStats();
    if (pager_failed_.load() && !said_dead) {
      said_dead = true;
      Log(LogLevel::kError,
          "the userfaultfd fault handler thread has stopped; threads touching managed "
          "memory will hang (set ZRTIER_DISABLE=1 to run without zrtier)");
    }
    uint64_t beat = heartbeat_.load(), now = MonotonicNs();
    uint64_t age = now > beat ? now - beat : 0;
    if (!pager_failed_.load() && age > 2'000'000'000ull && !said_stall) {
      said_stall = true;
      Log(LogLevel::kError, "the fault handler thread has not run for %.1f s (stalled?)",
          age / 1e9);
    } else if (age < 1'000'000'000ull) {
      said_stall = false;
    }
  }
}

}  // namespace zrtier
