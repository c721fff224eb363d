// Prefetcher: the component the shim's copy path calls (and the engine's fault observer, through
// OnFault). It feeds every access to an AccessPredictor, answers placement's next-use queries for
// T0 and T1, and keeps ZRTIER_WORKERS threads making the predicted next host-to-device chunks
// ready in T0 (through PrefetchSink), up to ZRTIER_PREFETCH_AHEAD bytes ahead of each stream's
// demand position, in predicted order, while the plan's confidence is at least `min_confidence`.
//
// Demand is never starved:
//   - OnAccess only learns, plans and hands the access to the workers (two mutexes, each held for
//     microseconds, never across a sink call); it never waits for a prefetch or for the queue;
//   - the workers process each access before taking more work: chunks of it still queued for
//     prefetch are canceled (the demand path makes them ready itself), a chunk a worker is already
//     preparing is counted as used, and the window ahead is queued;
//   - queued work whose planned position the demand has passed, or that belongs to a discarded
//     plan, is dropped when a worker reaches it; consecutive chunks go to the sink as one run
//     (PrefetchSink::PrefetchRun, up to kMaxRun), which is not interrupted once in the sink;
//   - the part of a run a sink cannot take now (no free slot) is retried after NotifySpace() or
//     1 ms, unless the demand has passed it by then.
//
// Accounting (runtime/base/stats.h): prefetch_bytes grows by the chunk size for every chunk the
// sink read into T0 (not for one it found ready already, or left alone); prefetch_unused_bytes for
// every prefetched chunk that no access used before either the sink's owner dropped it (OnDropped)
// or the demand position passed its planned position by more than the prefetch window.
//
// Thread safety: every method may be called from any thread. The Prefetcher never holds a lock
// while calling the sink, so the sink may call any Prefetcher method (and placement, which asks
// NextUseDistance, may be called from the sink). Counters and ready chunks follow an access once
// a worker has processed it (WaitIdle waits for that too).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/policy/access.h"
#include "runtime/policy/access_predictor.h"
#include "zrtier/options.h"

namespace zrtier::policy {

class PrefetchSink {
 public:
  virtual ~PrefetchSink() = default;
  // Makes `chunk` of `region` ready in T0 (decode into a pinned slot) unless it already is.
  // Returns false when it cannot now (no free slot); the prefetcher retries later.
  // Called from prefetch worker threads, never with the Prefetcher's lock held.
  virtual bool Prefetch(uint64_t region, uint64_t chunk) = 0;
  // The same for chunks first .. first+n-1, in order: returns how many from `first` on were
  // handled; the rest are retried later. The sink sets fetched[i] (n entries) for every handled
  // chunk i: whether it read the chunk into T0 (false: it was ready already, or is left alone). The
  // prefetcher hands consecutive queued chunks of one region over as one run (up to
  // Prefetcher::kMaxRun), so a sink can take its slots in one go. The default calls Prefetch chunk
  // by chunk and counts every handled chunk as fetched.
  virtual size_t PrefetchRun(uint64_t region, uint64_t first, size_t n, bool* fetched) {
    size_t i = 0;
    while (i < n && Prefetch(region, first + i)) fetched[i++] = true;
    return i;
  }
};

struct PrefetcherConfig {
  uint64_t chunk_size = 64 << 10;
  uint64_t ahead_bytes = 256ull << 20;  // 0 = learn only, prefetch nothing (no worker threads)
  int workers = 0;                      // 0 = ZRTIER_WORKERS default (ResolveWorkers)
  float min_confidence = 0.5f;
  PredictorConfig predictor;

  // ZRTIER_CHUNK, ZRTIER_PREFETCH_AHEAD, ZRTIER_WORKERS.
  static PrefetcherConfig FromOptions(const Options& options);
};

class Prefetcher : public NextUseOracle {
 public:
  // Most chunks handed to the sink in one PrefetchRun.
  static constexpr size_t kMaxRun = 64;

  struct Counters {
    uint64_t issued = 0;      // chunks handed to the sink
    uint64_t runs = 0;        // sink calls (PrefetchRun)
    uint64_t prefetched = 0;  // chunks the sink handled by reading them into T0
    uint64_t ready = 0;       // chunks the sink handled without reading them (ready already)
    uint64_t refused = 0;     // chunks the sink could not take (retried unless stale)
    uint64_t canceled = 0;    // queued chunks a demand access reached first
    uint64_t stale = 0;   // queued chunks dropped: demand passed them, or their plan was replaced
    uint64_t used = 0;    // prefetched chunks a demand access then used
    uint64_t unused = 0;  // prefetched chunks dropped or passed without use
    uint64_t fault_blocks = 0;    // fault blocks learned (OnFault)
    uint64_t faults_dropped = 0;  // fault blocks dropped: the learner was kFaultQueue behind
  };

  // Starts the workers. `sink` is not owned and must outlive the Prefetcher.
  Prefetcher(const PrefetcherConfig& config, PrefetchSink* sink);
  // Stops the workers (waiting for sink calls in progress); queued work is dropped.
  ~Prefetcher() override;
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Called by every copy (and CPU fault) before its chunks are served. Cheap; never blocks on a
  // prefetch.
  void OnAccess(const Access& a);
  // A CPU fault installed chunk `chunk` of `region` (Engine::SetFaultObserver). Faults are learned
  // per aligned block of kFaultRun chunks, as one access on the stream kFaultStream when a pass
  // over the block begins: a fill faults a chunk at a time, a parallel fill faults the blocks of
  // several threads interleaved, and a node per chunk would cost ~500 bytes of tables (31 MiB for
  // a 4 GiB fill). A pass's faults move away from its first (each thread of a fill goes one way
  // through its part); a fault within the span the pass already faulted starts the next pass.
  // Called on the engine's fault handler thread, so it never waits for the predictor: it learns
  // the block itself (bounded work: PredictorConfig::walk_per_access) only when the predictor's
  // lock is free and no block is queued; otherwise a learner thread (started on the first such
  // fault) does. When kFaultQueue blocks wait, more are dropped (Counters::faults_dropped).
  void OnFault(uint64_t region, uint64_t chunk);
  static constexpr uint64_t kFaultStream = ~0ull;  // not a CUDA stream handle (0 is the default)
  static constexpr uint32_t kFaultRun = 16;
  static constexpr size_t kFaultQueue = 4096;
  // Waits until every fault queued so far was learned, at most `timeout_ms`. True if so.
  bool WaitFaultsLearned(int timeout_ms);

  // Chunk accesses until `key` is next used by the learned plans, or kNeverUsed (placement).
  uint64_t NextUseDistance(const ChunkKey& key) const override;
  void NextUseDistances(std::span<const ChunkKey> keys, std::span<uint64_t> out) const override;
  bool Learning() const override;

  // The sink's owner dropped the T0 copy of a chunk. If it was prefetched and never used, it is
  // counted in prefetch_unused_bytes.
  void OnDropped(uint64_t region, uint64_t chunk);
  // The sink's owner freed a slot: workers waiting to retry a refused chunk try again now.
  void NotifySpace();

  // Waits until nothing is queued or being prefetched, at most `timeout_ms`. True if idle.
  bool WaitIdle(int timeout_ms);

  Counters counters() const;
  int workers() const { return static_cast<int>(threads_.size()); }

 private:
  struct Job {
    ChunkKey key;
    uint64_t stream;
    uint64_t pos;    // planned position of the chunk on its stream
    uint64_t epoch;  // the plan it came from
    uint64_t seq;    // matches pending_[key] while the job is live
  };
  struct StreamCursor {
    uint64_t epoch = 0;           // the stream's plan epoch, as of its latest access
    uint64_t pos = 0;             // the stream's demand position, as of its latest access
    uint64_t enqueued_until = 0;  // positions below this were already considered
  };

  // An access as OnAccess saw it, for the workers: its position and plan epoch after it, and the
  // plan of the window ahead.
  struct Arrival {
    Access access;
    uint64_t pos = 0;
    uint64_t epoch = 0;
    std::vector<PlannedAccess> plan;
  };
  // How long an idle worker sleeps before it looks for arrivals it was not woken for.
  static constexpr int kPollMs = 1;

  void WorkerLoop();
  // Processes every arrival: cancels the queued chunks the access reached, marks those in flight
  // as demanded, counts ready ones as used, moves the stream's cursor and queues the window ahead.
  // Returns the chunks queued. REQUIRES: mu_ held.
  size_t TakeArrivals();
  size_t Process(const Arrival& arrival);  // REQUIRES: mu_ held
  // Pops the live job at the queue's front and the jobs right behind it that continue its run
  // (same region, stream and plan, the next chunk), up to kMaxRun, into `run`; drops canceled and
  // stale jobs on the way. REQUIRES: mu_ held.
  void TakeRun(std::vector<Job>* run);
  bool Stale(const Job& job) const;  // REQUIRES: mu_ held
  void ExpireReady();                // REQUIRES: mu_ held
  void NoteIdle();                   // REQUIRES: mu_ held

  const PrefetcherConfig config_;
  const uint64_t ahead_chunks_;
  PrefetchSink* const sink_;

  // Locking: predictor_mu_ guards predictor_; mu_ guards everything else below. Lock order: mu_,
  // then predictor_mu_ (never the other way round); OnAccess takes them one after the other.
  // Staleness and expiry read the stream positions cursors_ copies from the predictor. Invariants:
  // a key is in at most one of pending_, inflight_ and ready_; every key in pending_ has a Job in
  // queue_ (queue_ may also hold jobs whose key was canceled; workers skip those).
  mutable std::mutex predictor_mu_;
  mutable std::mutex mu_;
  // The fault path (OnFault, FaultLoop). Lock order: fault_mu_, then predictor_mu_ (OnFault only
  // tries it), then arrivals_mu_.
  void FaultLoop();
  // Observe + plan + hand to the workers. REQUIRES: `pl` holds predictor_mu_ (released here).
  void Learn(const Access& a, std::unique_lock<std::mutex>& pl);
  struct FaultBlock {
    uint64_t region = 0, block = ~0ull;  // block = chunk / kFaultRun
    uint32_t lo = 0, hi = 0;             // the chunks its current pass faulted span [lo, hi]
  };
  static constexpr size_t kFaultBlocks = 64;  // blocks whose pass is tracked (a parallel fill's)
  mutable std::mutex fault_mu_;
  std::condition_variable fault_cv_;  // fault_queue_ non-empty, fault_stop_, or learned
  FaultBlock fault_blocks_[kFaultBlocks];
  size_t fault_next_ = 0;            // the entry of fault_blocks_ replaced next
  std::vector<Access> fault_queue_;  // blocks to learn, as their accesses
  uint64_t fault_queued_ = 0;        // blocks ever queued
  uint64_t fault_learned_ = 0;       // of those, learned
  uint64_t faults_dropped_ = 0;
  bool fault_learning_ = false;  // the learner is feeding a batch to the predictor
  bool fault_stop_ = false;
  std::thread fault_thread_;
  std::mutex arrivals_mu_;                 // guards arrivals_ (taken alone, or after mu_)
  std::vector<Arrival> arrivals_;          // accesses not processed yet, in order
  std::atomic<size_t> arrivals_count_{0};  // arrivals_.size(), readable without arrivals_mu_
  std::vector<Arrival> arrivals_scratch_;  // guarded by mu_
  std::condition_variable work_cv_;        // queue_ non-empty, or stop_
  std::condition_variable space_cv_;       // NotifySpace, or stop_
  std::condition_variable idle_cv_;        // pending_ and inflight_ both empty
  AccessPredictor predictor_;
  std::deque<Job> queue_;
  std::unordered_map<ChunkKey, uint64_t, ChunkKeyHash> pending_;  // -> live job's seq
  std::unordered_map<ChunkKey, bool, ChunkKeyHash> inflight_;     // -> a demand access reached it
  std::unordered_map<ChunkKey, uint64_t, ChunkKeyHash> ready_;    // prefetched, unused -> pos
  std::deque<Job> ready_order_;  // prefetched jobs in completion order (for expiry)
  std::unordered_map<uint64_t, StreamCursor> cursors_;
  uint64_t space_seq_ = 0;
  uint64_t next_job_seq_ = 0;
  bool stop_ = false;
  Counters counters_;

  std::vector<std::thread> threads_;
};

}  // namespace zrtier::policy
