// The frame of the engine stress tests: threads that own versioned chunks of one region.
//
// RunOwnedChunks runs `threads` threads for `seconds`. Thread t owns `per_thread` chunks of the
// region at `base`, interleaved (its k-th chunk is chunk k * threads + t, so neighbouring chunks
// belong to different threads). Every chunk has a version, 0 at the start, whose contents `fill`
// gives. Each step a thread picks one of its chunks at random (with a generator seeded seed + t)
// and calls `step` with it: the step stores, publishes, reads or evicts the chunk, increments its
// version when it writes a new one, and counts what it finds wrong itself. When time is up every
// thread compares each of its chunks, by CPU loads, with `fill` of its version, and adds each
// chunk that differs to *mismatches. Returns the number of steps taken.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

namespace zrtier::testing {

// Writes the contents of chunk `c` at `version` to the `words` words at `p`.
using ChunkFill = void (*)(uint64_t* p, size_t words, uint64_t c, uint64_t version);

struct OwnedChunks {
  char* base;         // the region
  size_t chunk_size;  // a multiple of 8
  int threads;
  int per_thread;
  ChunkFill fill;
};

// What a step gets: the thread's generator, the chunk it picked (index, first word, version), and
// two chunk-sized buffers of the thread's own.
struct ChunkStep {
  std::mt19937_64& rng;
  uint64_t c;
  uint64_t* p;
  uint64_t& version;
  uint64_t* expect;
  uint64_t* got;
};

inline uint64_t RunOwnedChunks(const OwnedChunks& o, uint64_t seed, int seconds,
                               std::atomic<uint64_t>* mismatches,
                               const std::function<void(ChunkStep&)>& step) {
  const size_t words = o.chunk_size / 8;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> steps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < o.threads; ++t) {
    threads.emplace_back([&, t] {
      auto chunk = [&](int k) { return static_cast<uint64_t>(k) * o.threads + t; };
      auto at = [&](uint64_t c) { return reinterpret_cast<uint64_t*>(o.base + c * o.chunk_size); };
      std::mt19937_64 rng(seed + t);
      std::vector<uint64_t> version(o.per_thread, 0);
      std::vector<uint64_t> expect(words), got(words);
      while (!stop.load(std::memory_order_relaxed)) {
        int k = static_cast<int>(rng() % o.per_thread);
        ChunkStep s{rng, chunk(k), at(chunk(k)), version[k], expect.data(), got.data()};
        step(s);
        steps.fetch_add(1, std::memory_order_relaxed);
      }
      for (int k = 0; k < o.per_thread; ++k) {
        o.fill(expect.data(), words, chunk(k), version[k]);
        if (memcmp(at(chunk(k)), expect.data(), o.chunk_size) != 0) mismatches->fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop.store(true);
  for (auto& th : threads) th.join();
  return steps.load();
}

}  // namespace zrtier::testing
