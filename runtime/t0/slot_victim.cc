#include "runtime/t0/slot_victim.h"

namespace zrtier {

VictimIndex::VictimIndex(size_t slots) : it_(slots), parked_(slots), in_(slots, false) {
  // Allocate every node once: insert, then park it.
  for (size_t i = 0; i < slots; ++i) {
    auto r = set_.emplace(0, static_cast<int>(i));
    parked_[i] = set_.extract(r.first);
  }
}

void VictimIndex::Insert(int slot, uint64_t key) {
  if (in_[slot]) {
    if (it_[slot]->first == key) return;
    spread_out_ -= IsSpreadOutKey(it_[slot]->first);
    parked_[slot] = set_.extract(it_[slot]);
  }
  spread_out_ += IsSpreadOutKey(key);
  parked_[slot].value().first = key;
  // The common insertions land at an end of the order -- LRU: a slot just released is the most
  // recently used, the smallest cold key -- where a hint makes them O(1) instead of a descent
  // through the tree (a wrong hint only costs the descent).
  const std::pair<uint64_t, int> v(key, slot);
  Set::const_iterator hint = set_.end();
  if (!set_.empty() && v < *set_.begin()) hint = set_.begin();
  it_[slot] = set_.insert(hint, std::move(parked_[slot]));
  in_[slot] = true;
}

void VictimIndex::Remove(int slot) {
  if (!in_[slot]) return;
  spread_out_ -= IsSpreadOutKey(it_[slot]->first);
  parked_[slot] = set_.extract(it_[slot]);
  in_[slot] = false;
}

}  // namespace zrtier
