#include "tools/bench/lru.h"

namespace zrtier::policy {

void LruOrder::Touch(const ChunkKey& key) {
  auto it = where_.find(key);
  if (it != where_.end()) {
    order_.splice(order_.begin(), order_, it->second);
    return;
  }
  order_.push_front(key);
  where_.emplace(key, order_.begin());
}

void LruOrder::Erase(const ChunkKey& key) {
  auto it = where_.find(key);
  if (it == where_.end()) return;
  order_.erase(it->second);
  where_.erase(it);
}

}  // namespace zrtier::policy
