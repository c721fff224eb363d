// PendingD2H: the chunks that device-to-host copies have queued but not yet published. Until a
// D2H piece is published its bytes exist only in stream order, so an H2D copy of one of those
// chunks must run in stream order too (H2DPath's ordered mode), and a prefetch must leave it
// alone.
//
// Thread safety: every method may be called from any thread (one mutex; CUDA is never called with
// it held, and host functions take it).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace zrtier {

class PendingD2H {
 public:
  // Adds `delta` (+1 queued, -1 published) to chunks first..last (inclusive) of `region`.
  void Mark(uint64_t region, uint64_t first, uint64_t last, int delta);
  // Whether any of chunks first..last of `region` is queued (lock-free while nothing is).
  bool Any(uint64_t region, uint64_t first, uint64_t last);

 private:
  struct Key {
    uint64_t region, chunk;
    bool operator==(const Key& o) const { return region == o.region && chunk == o.chunk; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return k.region * 0x9e3779b97f4a7c15ull ^ k.chunk; }
  };
  std::mutex mu_;
  std::unordered_map<Key, int, KeyHash> pending_;  // guarded by mu_
  std::atomic<uint64_t> total_{0};
};

}  // namespace zrtier
