// SortBySnapshot (runtime/base/sort_by_key.h): elements whose keys other threads keep changing are
// sorted by one reading of each key -- every element kept exactly once, in the order of the keys
// it read -- where std::sort with a comparison over the live keys is undefined behaviour.
#include "runtime/base/sort_by_key.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace zrtier {
namespace {

struct Item {
  int id = 0;
  std::atomic<uint64_t> key{0};
  uint64_t seen = 0;  // the key SortBySnapshot read (recorded by the key function)
};

TEST(SortBySnapshot, KeysChangingMeanwhile) {
  constexpr int kItems = 3000;
  std::vector<std::unique_ptr<Item>> items(kItems);
  for (int i = 0; i < kItems; ++i) {
    items[i] = std::make_unique<Item>();
    items[i]->id = i;
  }
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::mt19937_64 rng(7);
    while (!stop.load()) items[rng() % kItems]->key.store(rng() % 1000, std::memory_order_relaxed);
  });
  for (int round = 0; round < 50; ++round) {
    std::vector<Item*> v;
    for (auto& it : items) v.push_back(it.get());
    SortBySnapshot(
        v,
        [](Item* x) {
          x->seen = x->key.load(std::memory_order_relaxed);
          return x->seen;
        },
        std::greater<uint64_t>());
    std::vector<int> count(kItems);
    for (size_t i = 0; i < v.size(); ++i) {
      ++count[v[i]->id];
      if (i) {
        ASSERT_GE(v[i - 1]->seen, v[i]->seen) << "round " << round << " at " << i;
      }
    }
    for (int c : count) ASSERT_EQ(c, 1);
  }
  stop = true;
  writer.join();
}

}  // namespace
}  // namespace zrtier
