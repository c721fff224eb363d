#include "runtime/shim/memory_budget.h"

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "runtime/base/stats.h"
#include "runtime/base/thread_name.h"

namespace zrtier {
namespace {

constexpr uint64_t kGiB = 1ull << 30, kMiB = 1ull << 20;

// The auto budget leaves the machine this much: enough for the program's own growth and for the
// rest of the system, so that zrtier shrinks before the kernel reclaims or kills anything.
uint64_t AutoReserve(uint64_t physical) {
  return std::max<uint64_t>(kGiB, physical / 16);
}

// The resident limit never goes below this (0 would mean "no limit" to the backend).
constexpr uint64_t kMinLimit = 16 * kMiB;

}  // namespace

MemoryBudget::MemoryBudget(const Config& cfg, Os* os, RegionBackend* backend, PinnedRuns* runs)
    : cfg_(cfg), os_(os), backend_(backend), runs_(runs) {}

MemoryBudget::~MemoryBudget() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (keeper_.joinable()) keeper_.join();
}

void MemoryBudget::Start() {
  Tick();
  keeper_ = std::thread([this] {
    NameThisThread("zr-keeper");
    Loop();
  });
}

bool MemoryBudget::ParseMemAvailable(const char* meminfo, uint64_t* out) {
  const char* p = strstr(meminfo, "MemAvailable:");
  if (!p) return false;
  p += strlen("MemAvailable:");
  char* end = nullptr;
  const unsigned long long kb = strtoull(p, &end, 10);
  if (end == p) return false;
  *out = static_cast<uint64_t>(kb) * 1024;
  return true;
}

uint64_t MemoryBudget::RamStoreLimit(uint64_t memory, const std::string& backend, uint64_t limit,
                                     bool limit_set) {
  if (!memory || limit_set || backend == "ram") return limit;
  const uint64_t half = std::max<uint64_t>(memory / 2, 1);
  return limit ? std::min(limit, half) : half;
}

uint64_t MemoryBudget::ComputeBudget(const BackendMemory& m) const {
  if (cfg_.memory) return cfg_.memory;
  char buf[4096];
  long fd = os_->Open("/proc/meminfo", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return UINT64_MAX;  // nothing to go by: no limit
  const long n = os_->Read(static_cast<int>(fd), buf, sizeof(buf) - 1);
  os_->Close(static_cast<int>(fd));
  uint64_t avail = 0;
  if (n <= 0) return UINT64_MAX;
  buf[n] = '\0';
  if (!ParseMemAvailable(buf, &avail)) return UINT64_MAX;
  const uint64_t managed = m.resident + m.store + cfg_.pool_bytes + other_pinned();
  const uint64_t reserve = AutoReserve(cfg_.physical);
  if (avail >= reserve) return managed + (avail - reserve);
  const uint64_t short_by = reserve - avail;
  return managed > short_by ? managed - short_by : 0;
}

uint64_t MemoryBudget::Headroom(uint64_t limit) const {
  return std::min(limit, std::max<uint64_t>(limit / 16, 64 * kMiB));
}

bool MemoryBudget::RoomToPin(uint64_t bytes) const {
  const uint64_t limit = limit_.load(std::memory_order_relaxed);
  const uint64_t headroom = Headroom(limit);
  const BackendMemory m = backend_->Memory();
  return !m.keeping && m.held + bytes + headroom <= limit;
}

void MemoryBudget::Tick() {
  std::lock_guard<std::mutex> l(tick_mu_);
  const BackendMemory m = backend_->Memory();
  const uint64_t budget = ComputeBudget(m);
  budget_.store(budget, std::memory_order_relaxed);
  StatSet(Stat::memory_budget_bytes, budget == UINT64_MAX ? 0 : budget);
  const uint64_t others = m.store + cfg_.pool_bytes + other_pinned();
  uint64_t limit = budget > others + kMinLimit ? budget - others : kMinLimit;
  if (cfg_.resident_cap) limit = std::min(limit, cfg_.resident_cap);
  // The backend hears of a new limit when it moved by more than 1/64 (the auto budget moves a
  // little with every page the machine uses).
  const uint64_t old = limit_.load(std::memory_order_relaxed);
  if (old == UINT64_MAX || limit > old + old / 64 || limit + old / 64 < old) {
    limit_.store(limit, std::memory_order_relaxed);
    backend_->SetResidentLimit(limit == UINT64_MAX ? 0 : limit);
  }
  const uint64_t headroom = Headroom(limit);
  // While the data does not fit, nothing stays pinned in place: a pinned run can be neither
  // compressed nor kept by T1's choice (with its regions' untouched tails populated), and the
  // budget it takes leaves T1 keeping less (docs/decisions.md, "T1 keeps part of a sweep").
  const uint64_t target = m.keeping ? 0 : limit > headroom ? limit - headroom : 0;
  const uint64_t now = MonotonicNs();
  // Copies fence their runs once an unpin may come: within an eighth of the budget of the target.
  runs_->SetFencing(m.held + budget / 8 > target || budget < m.resident + m.store);
  if (m.held > target) {
    if (runs_->Unpin(m.held - target) > 0) last_unpin_ns_ = now;
    return;
  }
  if (runs_->all_pinned() ||
      now - last_unpin_ns_ < static_cast<uint64_t>(cfg_.repin_quiet_ms) * 1'000'000ull)
    return;
  // Pinned again only with a headroom's margin left, so that the next tick does not undo it.
  uint64_t held = m.held;
  runs_->Repin([&](size_t len) {
    if (held + len + headroom > target) return false;
    held += len;
    return true;
  });
}

void MemoryBudget::Kick() {
  std::lock_guard<std::mutex> l(mu_);
  kicked_ = true;
  cv_.notify_all();
}

void MemoryBudget::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, std::chrono::milliseconds(kTickMs), [&] { return stop_ || kicked_; });
    if (stop_) break;
    kicked_ = false;
    l.unlock();
    runs_->BindDevice();
    Tick();
    if (housekeeping_) housekeeping_();
    l.lock();
  }
}

}  // namespace zrtier
