// The store stack with its mover and prefetch threads (see tiered_store.h).
#include "runtime/store/tiered_store.h"

#include <cstring>

#include <algorithm>
#include <chrono>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/base/thread_name.h"

namespace zrtier {
namespace {

constexpr uint64_t kCacheBytes = 64ull << 20;  // prefetched copies waiting for their Get
constexpr size_t kMoveBatch = 256;             // entries per mover scan
constexpr size_t kPrefetchBatch = 32;          // entries per prefetch submission (one group)
constexpr size_t kPrefetchMinBatch = 8;        // a prefetcher waits up to 200 us for this many
constexpr uint64_t kBackoffNs = 200'000'000;   // after a failed move
// Prefetch threads, each with one batch in flight: 4 read spilled chunks back faster than 2
// (docs/decisions.md, "Four prefetch threads, 32-entry batches").
constexpr int kPrefetchThreads = 4;
static_assert(TieredStore::kSpareBuffers >= 4 * kPrefetchThreads * kPrefetchBatch,
              "spare read buffers: a few batches' worth of every prefetch thread");

}  // namespace

TieredStore::TieredStore(std::unique_ptr<RamStore> ram,
                         std::vector<std::unique_ptr<ExtentStore>> lower)
    : ram_(std::move(ram)), lower_(std::move(lower)) {
  name_ = ram_->name();
  for (auto& l : lower_) name_ += std::string("+") + l->name();
  uint64_t limit = ram_->Usage().limit_bytes;
  if (limit) {
    high_ = limit / 10 * 9;
    low_ = limit / 4 * 3;
  }
  mover_ = std::thread([this] {
    NameThisThread("zr-store-mover");
    MoverLoop();
  });
  for (int i = 0; i < kPrefetchThreads; ++i)
    prefetchers_.emplace_back([this] {
      NameThisThread("zr-store-read");
      PrefetchLoop();
    });
}

TieredStore::~TieredStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  mover_cv_.notify_all();
  prefetch_cv_.notify_all();
  mover_.join();
  for (auto& t : prefetchers_) t.join();
  // Each tier releases its own entries (memory unmapped, spill files deleted, zram reset).
}

ChunkStore* TieredStore::TierStore(int tier) const {
  return tier == 0 ? static_cast<ChunkStore*>(ram_.get()) : lower_[tier - 1].get();
}

uint64_t TieredStore::RamHeldBytes() const {
  const StoreUsage u = ram_->Usage();
  return u.used_bytes - u.idle_bytes;
}

bool TieredStore::RamPastHigh() const {
  return high_ && RamHeldBytes() > high_;
}

void TieredStore::ReleaseInner(int tier, StoreHandle inner) {
  TierStore(tier)->Free(inner);
}

Status TieredStore::Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) {
  StoreHandle inner = 0;
  int tier = 0;
  Status s = ram_->Put(data, len, raw_len, &inner);
  if (!s.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      kicked_ = true;
    }
    mover_cv_.notify_one();
    bool all_full = s.code() == ENOSPC;
    Status last = s;
    for (size_t t = 0; t < lower_.size(); ++t) {
      Status ls = lower_[t]->Put(data, len, raw_len, &inner);
      if (ls.ok()) {
        tier = static_cast<int>(t + 1);
        break;
      }
      all_full = all_full && ls.code() == ENOSPC;
      last = ls;
    }
    if (tier == 0)
      return Status::Error(all_full ? ENOSPC : last.code(),
                           name_ + ": no tier could take the chunk (" + s.message() +
                               "; last tier: " + last.message() + ")");
  }
  bool kick = tier == 0 && RamPastHigh();
  {
    std::lock_guard<std::mutex> lock(mu_);
    StoreHandle h = next_++;
    Entry& e = entries_[h];
    e.tier = tier;
    e.inner = inner;
    e.raw_len = raw_len;
    e.last_use = ++clock_;
    if (kick) kicked_ = true;
    *out = h;
  }
  if (kick) mover_cv_.notify_one();
  return Status::Ok();
}

Status TieredStore::Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) {
  std::unique_lock<std::mutex> lock(mu_);
  // Hands a copy read ahead to `fn` (called without the lock), then keeps its buffer for the next
  // reads.
  auto serve = [&](std::vector<unsigned char>& bytes) {
    Status s = fn(bytes.data(), bytes.size());
    lock.lock();
    KeepSpareLocked(std::move(bytes));
    return s;
  };
  bool help = false;
  for (;;) {
    auto pf = prefetch_inflight_.find(h);
    if (pf == prefetch_inflight_.end()) break;
    if (!pf->second) {  // only queued: read it now, with the queued entries behind it
      help = true;
      break;
    }
    prefetch_cv_.wait(lock);  // being read right now: its copy is about to land in the cache
  }
  auto it = entries_.find(h);
  if (it == entries_.end()) return Status::Error(ENOENT, name_ + ": no such entry");
  Entry& e = it->second;
  e.last_use = ++clock_;
  auto c = cache_.find(h);
  if (c != cache_.end()) {
    std::vector<unsigned char> bytes = std::move(c->second);
    cache_.erase(c);
    cache_bytes_ -= bytes.size();
    lock.unlock();
    return serve(bytes);
  }
  if (help) {
    // The caller is ahead of the prefetch threads: do their work in this thread (no hand-off),
    // one submission for this entry and the queued ones after it.
    prefetch_inflight_[h] = true;
    e.prefetching = true;
    std::vector<FetchItem> items;
    items.push_back(FetchItem{h, e.tier, e.inner, TakeSpareLocked(), Status()});
    TakeQueuedLocked(&items);
    lock.unlock();
    ReadItems(&items);
    std::vector<std::pair<int, StoreHandle>> release;
    lock.lock();
    prefetch_inflight_.erase(h);
    entries_[h].prefetching = false;
    PublishLocked(&items, 1, &release);
    lock.unlock();
    for (auto& [tier, inner] : release) ReleaseInner(tier, inner);
    if (items[0].status.ok()) return serve(items[0].bytes);
    lock.lock();  // the batch read failed: read it alone below (reports the tier's error)
    // The lock was dropped: the entry may have been freed (and PublishLocked released it), and
    // `it` may be stale. A freed entry is not read (its inner handle may be reused by now).
    it = entries_.find(h);
    if (it == entries_.end() || it->second.freed) return items[0].status;
  }
  Entry& e2 = it->second;
  e2.readers++;
  int tier = e2.tier;
  StoreHandle inner = e2.inner;
  lock.unlock();
  Status s = TierStore(tier)->Get(inner, fn);
  lock.lock();
  auto done = entries_.find(h);
  if (done != entries_.end() && --done->second.readers == 0) readers_cv_.notify_all();
  return s;
}

void TieredStore::Free(StoreHandle h) {
  int tier;
  StoreHandle inner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(h);
    if (it == entries_.end()) return;
    auto c = cache_.find(h);
    if (c != cache_.end()) {
      cache_bytes_ -= c->second.size();
      cache_.erase(c);
    }
    auto pf = prefetch_inflight_.find(h);
    if (pf != prefetch_inflight_.end() && !pf->second) prefetch_inflight_.erase(pf);
    Entry& e = it->second;
    if (e.moving || e.prefetching) {
      e.freed = true;  // the thread working on it frees it
      return;
    }
    tier = e.tier;
    inner = e.inner;
    entries_.erase(it);
  }
  ReleaseInner(tier, inner);
}

Status TieredStore::Lease(StoreHandle h, StoreLease* out, bool may_register) {
  StoreHandle inner;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(h);
    if (it == entries_.end()) return Status::Error(ENOENT, name_ + ": no such entry");
    const Entry& e = it->second;
    if (e.tier != 0 || e.moving || e.freed)
      return Status::Error(EAGAIN, name_ + ": entry not in the RAM tier");
    inner = e.inner;
  }
  // Moved down and freed in the RAM tier meanwhile: ENOENT there (the caller uses Get).
  Status s = ram_->Lease(inner, out, may_register);
  return s.code() == ENOENT ? Status::Error(EAGAIN, name_ + ": entry left the RAM tier") : s;
}

void TieredStore::Unlease(const StoreLease& lease) {
  ram_->Unlease(lease);
}

void TieredStore::UnleaseBatch(const StoreHandle* tokens, size_t n) {
  ram_->UnleaseBatch(tokens, n);
}

void TieredStore::SetPinner(StorePinner* pinner) {
  ram_->SetPinner(pinner);
}

void TieredStore::Prefetch(StoreHandle h) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(h);
    if (it == entries_.end() || it->second.tier == 0 || it->second.freed) return;
    if (cache_.count(h) || prefetch_inflight_.count(h)) return;
    if (cache_bytes_ >= kCacheBytes) return;  // nobody is consuming: drop the hint
    prefetch_inflight_.emplace(h, false);
    prefetch_queue_.push_back(h);
    wake = prefetch_queue_.size() == 1 || prefetch_queue_.size() == kPrefetchMinBatch;
  }
  if (wake) prefetch_cv_.notify_all();
}

void TieredStore::SetReuseHint(StoreHandle h, uint64_t distance) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(h);
  if (it != entries_.end()) it->second.hint = distance;
}

void TieredStore::TakeQueuedLocked(std::vector<FetchItem>* items) {
  while (!prefetch_queue_.empty() && items->size() < kPrefetchBatch) {
    StoreHandle h = prefetch_queue_.front();
    prefetch_queue_.pop_front();
    auto pf = prefetch_inflight_.find(h);
    if (pf == prefetch_inflight_.end() || pf->second) continue;  // taken by a Get, or a dup
    auto it = entries_.find(h);
    if (it == entries_.end() || it->second.tier == 0 || it->second.freed) {
      prefetch_inflight_.erase(pf);
      continue;
    }
    pf->second = true;
    it->second.prefetching = true;
    items->push_back(FetchItem{h, it->second.tier, it->second.inner, TakeSpareLocked(), Status()});
  }
}

size_t TieredStore::spare_buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spare_.size();
}

std::vector<unsigned char> TieredStore::TakeSpareLocked() {
  if (spare_.empty()) return {};
  std::vector<unsigned char> b = std::move(spare_.back());
  spare_.pop_back();
  return b;
}

void TieredStore::KeepSpareLocked(std::vector<unsigned char>&& b) {
  if (spare_.size() < kSpareBuffers && b.capacity() > 0) spare_.push_back(std::move(b));
}

void TieredStore::ReadItems(std::vector<FetchItem>* items) {
  for (size_t t = 1; t <= lower_.size(); ++t) {
    std::vector<ExtentStore::GetReq> reqs;
    std::vector<size_t> idx;
    for (size_t i = 0; i < items->size(); ++i) {
      if ((*items)[i].tier != static_cast<int>(t)) continue;
      ExtentStore::GetReq r;
      r.h = (*items)[i].inner;
      r.out = &(*items)[i].bytes;
      reqs.push_back(r);
      idx.push_back(i);
    }
    if (reqs.empty()) continue;
    lower_[t - 1]->GetBatch(reqs.data(), reqs.size());
    for (size_t k = 0; k < reqs.size(); ++k) (*items)[idx[k]].status = reqs[k].status;
  }
}

void TieredStore::PublishLocked(std::vector<FetchItem>* items, size_t from,
                                std::vector<std::pair<int, StoreHandle>>* release) {
  for (size_t i = from; i < items->size(); ++i) {
    FetchItem& item = (*items)[i];
    prefetch_inflight_.erase(item.h);
    Entry& e = entries_[item.h];
    e.prefetching = false;
    if (e.freed) {
      release->emplace_back(e.tier, e.inner);
      entries_.erase(item.h);
    } else if (item.status.ok() && cache_bytes_ + item.bytes.size() <= kCacheBytes) {
      cache_bytes_ += item.bytes.size();
      cache_[item.h] = std::move(item.bytes);
    }
  }
  prefetch_cv_.notify_all();
}

void TieredStore::PrefetchLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    prefetch_cv_.wait(lock, [&] { return stop_ || !prefetch_queue_.empty(); });
    // Let a batch build up for a moment: one submission of many reads beats many of one.
    if (!stop_ && prefetch_queue_.size() < kPrefetchMinBatch)
      prefetch_cv_.wait_for(lock, std::chrono::microseconds(200),
                            [&] { return stop_ || prefetch_queue_.size() >= kPrefetchMinBatch; });
    if (stop_) return;
    prefetch_busy_++;
    std::vector<FetchItem> items;
    TakeQueuedLocked(&items);
    lock.unlock();
    ReadItems(&items);
    std::vector<std::pair<int, StoreHandle>> release;
    lock.lock();
    PublishLocked(&items, 0, &release);
    if (!release.empty()) {
      lock.unlock();
      for (auto& [tier, inner] : release) ReleaseInner(tier, inner);
      lock.lock();
    }
    prefetch_busy_--;
    if (prefetch_queue_.empty() && prefetch_busy_ == 0) idle_cv_.notify_all();
  }
}

void TieredStore::MoverLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    mover_cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_ || kicked_; });
    bool kicked = kicked_;
    kicked_ = false;
    if (stop_) break;
    if (MonotonicNs() < backoff_until_ns_) continue;
    if (!kicked && !RamPastHigh()) continue;
    mover_busy_ = true;
    lock.unlock();
    while (high_ && RamHeldBytes() > low_) {
      if (!MoveBatch()) {
        std::lock_guard<std::mutex> l(mu_);
        backoff_until_ns_ = MonotonicNs() + kBackoffNs;  // nothing movable or a tier failed
        break;
      }
      std::lock_guard<std::mutex> l(mu_);
      if (stop_) break;
    }
    lock.lock();
    mover_busy_ = false;
    idle_cv_.notify_all();
  }
}

bool TieredStore::MoveBatch() {
  uint64_t used = RamHeldBytes();
  if (used <= low_) return false;
  uint64_t need = used - low_;
  struct Item {
    StoreHandle h;
    StoreHandle inner;
    uint64_t raw_len;
    std::vector<unsigned char> bytes;
    int tier = 0;  // where it landed (0: nowhere)
    StoreHandle new_inner = 0;
  };
  std::vector<Item> items;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<uint64_t, StoreHandle>> cands;  // (coldness, handle)
    cands.reserve(entries_.size());
    for (auto& [h, e] : entries_) {
      if (e.tier != 0 || e.moving || e.freed) continue;
      cands.emplace_back(e.hint ? e.hint : clock_ - e.last_use, h);
    }
    size_t k = std::min(cands.size(), kMoveBatch);
    std::partial_sort(cands.begin(), cands.begin() + k, cands.end(),
                      [](const auto& a, const auto& b) { return a.first > b.first; });
    uint64_t bytes = 0;
    for (size_t i = 0; i < k && bytes < need; ++i) {
      Entry& e = entries_[cands[i].second];
      e.moving = true;
      items.push_back(Item{cands[i].second, e.inner, e.raw_len, {}});
      bytes += e.raw_len / 2 + 1;  // a guess of the encoded size; the loop re-checks usage
    }
  }
  if (items.empty()) return false;
  // Write the batch in Put order (handles grow with each Put): the engine evicts a region's chunks
  // one after another, so they land next to each other in the lower tier and a later read-back of
  // the region coalesces them into large requests.
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.h < b.h; });
  for (Item& it : items) {
    Status s = ram_->Get(it.inner, [&](const void* p, size_t n) {
      it.bytes.assign(static_cast<const unsigned char*>(p),
                      static_cast<const unsigned char*>(p) + n);
      return Status::Ok();
    });
    if (!s.ok()) it.bytes.clear();
  }
  for (size_t t = 0; t < lower_.size(); ++t) {
    std::vector<ExtentStore::PutReq> reqs;
    std::vector<size_t> idx;
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].tier || items[i].bytes.empty()) continue;
      ExtentStore::PutReq r;
      r.data = items[i].bytes.data();
      r.len = items[i].bytes.size();
      r.raw_len = items[i].raw_len;
      reqs.push_back(r);
      idx.push_back(i);
    }
    if (reqs.empty()) break;
    lower_[t]->PutBatch(reqs.data(), reqs.size());
    for (size_t k = 0; k < reqs.size(); ++k)
      if (reqs[k].status.ok()) {
        items[idx[k]].tier = static_cast<int>(t + 1);
        items[idx[k]].new_inner = reqs[k].out;
      }
  }
  std::vector<std::pair<int, StoreHandle>> release;
  bool failed = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (Item& it : items) {
      Entry* e = &entries_[it.h];
      if (it.tier) {
        readers_cv_.wait(lock, [&] { return entries_[it.h].readers == 0; });
        e = &entries_[it.h];
        if (e->freed) {
          release.emplace_back(it.tier, it.new_inner);
          release.emplace_back(0, e->inner);
          entries_.erase(it.h);
          continue;
        }
        release.emplace_back(0, e->inner);
        e->tier = it.tier;
        e->inner = it.new_inner;
        e->moving = false;
      } else {
        failed = true;
        e->moving = false;
        if (e->freed) {
          release.emplace_back(0, e->inner);
          entries_.erase(it.h);
        }
      }
    }
    if (failed) backoff_until_ns_ = MonotonicNs() + kBackoffNs;
  }
  for (auto& [tier, inner] : release) ReleaseInner(tier, inner);
  return !failed;
}

void TieredStore::ReleaseIdle(uint64_t min_idle_ns) {
  ram_->ReleaseIdle(min_idle_ns);
}

StoreUsage TieredStore::Usage() const {
  StoreUsage sum;
  bool unlimited = false;
  for (int t = 0; t <= static_cast<int>(lower_.size()); ++t) {
    StoreUsage u = TierStore(t)->Usage();
    sum.entries += u.entries;
    sum.raw_bytes += u.raw_bytes;
    sum.payload_bytes += u.payload_bytes;
    sum.used_bytes += u.used_bytes;
    sum.idle_bytes += u.idle_bytes;
    sum.limit_bytes += u.limit_bytes;
    // RAM and zram occupy host memory; spill files do not.
    if (t == 0 || strcmp(TierStore(t)->name(), "zram") == 0) sum.memory_bytes += u.used_bytes;
    unlimited = unlimited || u.limit_bytes == 0;
  }
  if (unlimited) sum.limit_bytes = 0;
  return sum;
}

StoreUsage TieredStore::TierUsage(int tier) const {
  return TierStore(tier)->Usage();
}

int TieredStore::TierOf(StoreHandle h) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(h);
  return it == entries_.end() ? -1 : it->second.tier;
}

void TieredStore::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    bool mover_idle = !mover_busy_ && !kicked_ &&
                      (MonotonicNs() < backoff_until_ns_ || !high_ || RamHeldBytes() <= high_);
    bool prefetch_idle = prefetch_queue_.empty() && prefetch_busy_ == 0;
    if ((mover_idle && prefetch_idle) || stop_) return;
    if (!mover_busy_ && !kicked_ && !mover_idle) {
      kicked_ = true;  // past the mark but not yet noticed: wake the mover now
      mover_cv_.notify_one();
    }
    idle_cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
}

}  // namespace zrtier
