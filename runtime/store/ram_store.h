// RamStore: the T2 compressed store in RAM.
#pragma once

#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/store/store.h"

namespace zrtier {

class RamStore : public ChunkStore {
 public:
  // limit_bytes: most bytes the store may occupy (0 = none); numa_node < 0: no placement.
  RamStore(uint64_t limit_bytes, int numa_node, Os* os);
  ~RamStore() override;

  const char* name() const override { return "ram"; }
  Status Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) override;
  Status Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) override;
  void Free(StoreHandle h) override;
  StoreUsage Usage() const override;

 private:
  struct Entry {
    std::vector<unsigned char> bytes;
    uint64_t raw_len;
  };
  uint64_t limit_;
  mutable std::mutex mu_;
  std::unordered_map<StoreHandle, Entry> entries_;  // guarded by mu_
  StoreHandle next_ = 1;                             // guarded by mu_
  StoreUsage usage_;                                 // guarded by mu_
};

}  // namespace zrtier
