// A holder of external chunk copies for engine tests (what the shim's T0 pool is in production):
// copies by (region, chunk), each at one generation, kept until Forget or until the engine says
// the chunk left the external state (Released). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/engine/engine.h"

namespace zrtier::testing {

class ExternalHolder final : public ExternalCopies {
 public:
  explicit ExternalHolder(size_t chunk_size) : chunk_(chunk_size) {}
  // Takes the lock once before the copies go. An engine thread's last call (Released from a fault
  // the test's own load raised) is ordered before the test's return only through the kernel's
  // fault wake-up, which ThreadSanitizer does not see; the lock makes that order visible to it.
  ~ExternalHolder() override { std::lock_guard<std::mutex> l(mu_); }

  // Records `bytes` (chunk_size) as the copy of (region, chunk) at `gen`, replacing an older one.
  void Hold(uint64_t region, uint64_t chunk, uint64_t gen, const char* bytes) {
    std::lock_guard<std::mutex> l(mu_);
    Copy& c = copies_[{region, chunk}];
    c.gen = gen;
    c.bytes.assign(bytes, bytes + chunk_);
  }
  // The held copy's generation and bytes; false if none.
  bool Get(uint64_t region, uint64_t chunk, uint64_t* gen, std::vector<char>* bytes) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = copies_.find({region, chunk});
    if (it == copies_.end()) return false;
    *gen = it->second.gen;
    *bytes = it->second.bytes;
    return true;
  }
  // Forgets the copy of (region, chunk) if it is still at `gen`.
  void Forget(uint64_t region, uint64_t chunk, uint64_t gen) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = copies_.find({region, chunk});
    if (it != copies_.end() && it->second.gen == gen) copies_.erase(it);
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu_);
    return copies_.size();
  }
  // How many times the engine said a chunk left the external state (Released).
  size_t released() {
    std::lock_guard<std::mutex> l(mu_);
    return released_;
  }

  void Released(uint64_t region, uint64_t chunk, uint64_t gen) override {
    std::lock_guard<std::mutex> l(mu_);
    ++released_;
    auto it = copies_.find({region, chunk});
    if (it != copies_.end() && it->second.gen == gen) copies_.erase(it);
  }

  bool WithBytes(uint64_t region, uint64_t chunk, uint64_t gen,
                 const std::function<void(const char*)>& use) override {
    std::lock_guard<std::mutex> l(mu_);  // held during use(): Hold cannot change the bytes
    auto it = copies_.find({region, chunk});
    if (it == copies_.end() || it->second.gen != gen) return false;
    use(it->second.bytes.data());
    return true;
  }

 private:
  struct Copy {
    uint64_t gen = 0;
    std::vector<char> bytes;
  };
  const size_t chunk_;
  std::mutex mu_;
  std::map<std::pair<uint64_t, uint64_t>, Copy> copies_;
  size_t released_ = 0;
};

}  // namespace zrtier::testing
