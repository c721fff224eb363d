// LruOrder: least-recently-used order of chunks, the baseline placement policy
// and the reference that benchmarks compare ReusePlacement against. O(1) per operation.
//
// Thread safety: none; the owner serializes calls.
#pragma once

#include <list>
#include <unordered_map>

#include "runtime/policy/access.h"

namespace zrtier::policy {

class LruOrder {
 public:
  // Marks `key` most recently used (inserting it if absent).
  void Touch(const ChunkKey& key);
  // Removes `key` if present.
  void Erase(const ChunkKey& key);
  // The least recently used key. REQUIRES: !empty().
  const ChunkKey& Oldest() const { return order_.back(); }
  bool Contains(const ChunkKey& key) const { return where_.count(key) != 0; }
  size_t size() const { return order_.size(); }
  bool empty() const { return order_.empty(); }

 private:
  std::list<ChunkKey> order_;  // front = most recent
  std::unordered_map<ChunkKey, std::list<ChunkKey>::iterator, ChunkKeyHash> where_;
};

}  // namespace zrtier::policy
