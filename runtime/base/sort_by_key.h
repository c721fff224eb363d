// Sorting by keys that other threads change meanwhile (last-use times, counters): each element's
// key is read once, then the snapshot is sorted. std::sort with a comparison whose answers change
// under it is undefined behaviour: its unguarded insertion steps may walk outside the range.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace zrtier {

// Sorts `v` by key(element) with `less` over the keys, each key read exactly once.
template <class T, class KeyFn, class Less>
void SortBySnapshot(std::vector<T>& v, KeyFn key, Less less) {
  using Key = decltype(key(v.front()));
  std::vector<std::pair<Key, T>> keyed;
  keyed.reserve(v.size());
  for (T& x : v) keyed.emplace_back(key(x), std::move(x));
  std::stable_sort(keyed.begin(), keyed.end(),
                   [&](const auto& a, const auto& b) { return less(a.first, b.first); });
  for (size_t i = 0; i < keyed.size(); ++i) v[i] = std::move(keyed[i].second);
}

}  // namespace zrtier
