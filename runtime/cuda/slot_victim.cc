#include "runtime/cuda/slot_victim.h"

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
    parked_[slot] = set_.extract(it_[slot]);
  }
  parked_[slot].value().first = key;
  it_[slot] = set_.insert(std::move(parked_[slot])).position;
  in_[slot] = true;
}

void VictimIndex::Remove(int slot) {
  if (!in_[slot]) return;
  parked_[slot] = set_.extract(it_[slot]);
  in_[slot] = false;
}

}  // namespace zrtier
