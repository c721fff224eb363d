// LiveRegions: the shim's regions by id (with the cudaHostAlloc flags each was allocated with),
// for the work that names chunks by region id and runs on other threads (prefetches, write-backs
// of owned slots), and for cudaHostGetFlags. Such work reads a region under the shared
// lock; FreeHost removes it under the exclusive lock before freeing it, so no such work touches a
// freed region.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "runtime/engine/region_backend.h"

namespace zrtier {

class LiveRegions {
 public:
  void Add(const RegionInfo& r, unsigned alloc_flags) {
    std::unique_lock<std::shared_mutex> l(mu_);
    regions_[r.id] = r;
    if (alloc_flags) flags_[r.id] = alloc_flags;
  }
  // Returns once no With() call is reading the region.
  void Remove(uint64_t id) {
    std::unique_lock<std::shared_mutex> l(mu_);
    regions_.erase(id);
    flags_.erase(id);
  }
  // The flags region `id` was allocated with (0 if none, or not live).
  unsigned AllocFlags(uint64_t id) {
    std::shared_lock<std::shared_mutex> l(mu_);
    auto it = flags_.find(id);
    return it == flags_.end() ? 0 : it->second;
  }
  // Calls fn(region) under the shared lock if region `id` is live and returns fn's result;
  // returns `gone` otherwise.
  template <typename T, typename Fn>
  T With(uint64_t id, T gone, Fn fn) {
    std::shared_lock<std::shared_mutex> l(mu_);
    auto it = regions_.find(id);
    if (it == regions_.end()) return gone;
    return fn(it->second);
  }

 private:
  std::shared_mutex mu_;
  std::unordered_map<uint64_t, RegionInfo> regions_;  // guarded by mu_
  std::unordered_map<uint64_t, unsigned> flags_;      // guarded by mu_: only where not 0
};

}  // namespace zrtier
