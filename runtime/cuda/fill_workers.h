// FillWorkers: a few threads that help a copy call fill T0 slots in parallel (Engine::Read of
// several chunks -- a memcpy from T1 or a decode from T2 -- at once), so that filling piece i+1
// keeps up with piece i on the wire (ZRTIER_WORKERS).
//
// Thread safety: Run may be called from any thread. One job runs at a time; a caller that finds the
// workers busy does its job alone (never waits for another copy call's job). Workers never call
// CUDA.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace zrtier {

class FillWorkers {
 public:
  // Starts `threads` workers (0: none; Run then runs everything on the caller).
  explicit FillWorkers(int threads);
  ~FillWorkers();
  FillWorkers(const FillWorkers&) = delete;
  FillWorkers& operator=(const FillWorkers&) = delete;

  // Calls fn(i) for every i in [0, count), on the caller and the workers; returns when all are
  // done.
  void Run(size_t count, const std::function<void(size_t)>& fn);

 private:
  void Loop();

  std::mutex job_mu_;  // held by the caller whose job is running
  std::mutex mu_;      // guards the fields below
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t count_ = 0;
  std::atomic<size_t> next_{0};
  size_t finished_ = 0;  // items finished of the current job
  uint64_t job_ = 0;     // bumped per job
  int active_ = 0;       // workers inside the current job (the caller waits for 0)
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace zrtier
