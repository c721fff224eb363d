// Covers the T0 pool under concurrent copy threads with the learned placement: several threads
// pin cached copies, acquire and fill slots, publish and unpin (and one thread prefetches through
// AcquireForPrefetch) while the predictor learns their cyclic orders; a slot being filled is never
// handed to anyone else, and every cached hit holds exactly the bytes of its chunk.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "runtime/t0/pinned_pool.h"

#include "tools/bench/learned_oracle.h"

namespace zrtier {
namespace {

constexpr size_t kSlotSize = 256;

void Fill(char* p, uint64_t region, uint64_t chunk) {
  const uint64_t tag = region * 1000003 + chunk;
  for (size_t i = 0; i < kSlotSize; i += sizeof(tag)) memcpy(p + i, &tag, sizeof(tag));
}
bool Holds(const char* p, uint64_t region, uint64_t chunk) {
  char want[kSlotSize];
  Fill(want, region, chunk);
  return memcmp(p, want, kSlotSize) == 0;
}

TEST(PinnedPoolConcurrency, CopyThreadsNeverShareAFillSlotAndHitsHoldTheirBytes) {
  const uint64_t seed = std::random_device{}();
  printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const size_t kSlots = 256;
  std::unique_ptr<PinnedPool> pool;
  ASSERT_TRUE(PinnedPool::Create(HostMemoryCudaApi(), kSlots * kSlotSize, kSlotSize, &pool).ok());
  LearnedOracle oracle;
  pool->SetOracle(&oracle);
  pool->set_prefetch_reserve(kSlots / 4);
  // -1: being filled by one holder (from Acquire until just before its Publish); n >= 0: n
  // readers of its cached copy.
  std::vector<std::atomic<int> > state(kSlots);
  std::atomic<int> errors{0}, hits{0};
  auto unpin = [&](int slot, bool reader) {
    if (reader) state[slot].fetch_sub(1);
    pool->Unpin(slot);
  };
  auto fill = [&](int slot, uint64_t region, uint64_t chunk) {
    int zero = 0;
    if (!state[slot].compare_exchange_strong(zero, -1)) ++errors;  // handed out while held
    Fill(pool->SlotPtr(slot), region, chunk);
    state[slot].store(0);
    pool->Publish(slot, region, chunk, 0);
  };
  auto copier = [&](uint64_t region, int passes, uint64_t thread_seed) {
    std::mt19937_64 rng(thread_seed);
    const uint64_t kLayers = 8, kLayerChunks = 24;  // 192 chunks per region, 4 regions > pool
    for (int pass = 0; pass < passes; ++pass) {
      for (uint64_t l = 0; l < kLayers; ++l) {
        policy::Access a{region, l * kLayerChunks, static_cast<uint32_t>(kLayerChunks),
                         policy::Direction::kH2D, region};
        oracle.OnAccess(a);
        pool->NoteAccess(kLayerChunks);
        std::vector<std::pair<int, bool> > held;
        int prev = -1;
        for (uint64_t c = a.first_chunk; c < a.first_chunk + kLayerChunks; ++c) {
          int slot = pool->PinCached(region, c, 0);
          if (slot >= 0) {
            if (state[slot].fetch_add(1) < 0) ++errors;  // a reader of a slot being filled
            if (!Holds(pool->SlotPtr(slot), region, c)) ++errors;
            ++hits;
            held.push_back({slot, true});
          } else {
            while ((slot = pool->Acquire(prev)) < 0) {
              for (auto& [s, f] : held) unpin(s, f);
              held.clear();
              pool->WaitForSlot();
            }
            fill(slot, region, c);
            held.push_back({slot, false});
          }
          prev = slot;
          if (held.size() >= 8 || rng() % 16 == 0) {
            for (auto& [s, f] : held) unpin(s, f);
            held.clear();
            prev = -1;
          }
        }
        for (auto& [s, f] : held) unpin(s, f);
      }
    }
  };
  std::atomic<bool> stop{false};
  std::thread prefetcher([&] {
    std::mt19937_64 rng(seed ^ 0x5bd1e995);
    while (!stop.load()) {
      const uint64_t region = 1 + rng() % 4, chunk = rng() % 192;
      const int slot = pool->AcquireForPrefetch(region, chunk);
      if (slot < 0) {
        std::this_thread::yield();
        continue;
      }
      fill(slot, region, chunk);
      unpin(slot, false);
    }
  });
  std::vector<std::thread> threads;
  for (uint64_t r = 1; r <= 4; ++r) threads.emplace_back(copier, r, 12, seed + r);
  for (auto& t : threads) t.join();
  stop = true;
  prefetcher.join();
  pool->SetOracle(nullptr);
  EXPECT_EQ(errors.load(), 0) << "seed " << seed;
  EXPECT_EQ(pool->free_slots(), kSlots);
  printf("hits %d\n", hits.load());
}

}  // namespace
}  // namespace zrtier
