#include "runtime/policy/prefetcher.h"

#include <algorithm>
#include <array>
#include <chrono>

#include "runtime/base/stats.h"
#include "runtime/base/thread_name.h"

namespace zrtier::policy {

PrefetcherConfig PrefetcherConfig::FromOptions(const Options& options) {
  PrefetcherConfig c;
  c.chunk_size = options.Size(Opt::kChunk);
  c.ahead_bytes = options.Size(Opt::kPrefetchAhead);
  c.workers = static_cast<int>(options.Int(Opt::kWorkers));
  return c;
}

Prefetcher::Prefetcher(const PrefetcherConfig& config, PrefetchSink* sink)
    : config_(config),
      ahead_chunks_(config.chunk_size ? config.ahead_bytes / config.chunk_size : 0),
      sink_(sink),
      predictor_(config.predictor) {
  // Learn-only (no window): no workers, the predictor only answers next-use distances.
  const int n = ahead_chunks_ ? zrtier::ResolveWorkers(config.workers) : 0;
  threads_.reserve(n);
  for (int i = 0; i < n; ++i)
    threads_.emplace_back([this] {
      NameThisThread("zr-prefetch");
      WorkerLoop();
    });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(fault_mu_);
    fault_stop_ = true;
  }
  fault_cv_.notify_all();
  if (fault_thread_.joinable()) fault_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
    pending_.clear();
  }
  work_cv_.notify_all();
  space_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

bool Prefetcher::Stale(const Job& job) const {
  auto it = cursors_.find(job.stream);
  if (it == cursors_.end() || it->second.epoch != job.epoch) return true;
  return job.pos < it->second.pos;
}

void Prefetcher::NoteIdle() {
  if (pending_.empty() && inflight_.empty() && arrivals_count_.load() == 0) idle_cv_.notify_all();
}

void Prefetcher::ExpireReady() {
  // Bound: a stream that stopped must not pin the expiry order forever.
  const size_t max_order = 4 * std::max<uint64_t>(ahead_chunks_, 1024);
  while (!ready_order_.empty()) {
    const Job& j = ready_order_.front();
    auto it = ready_.find(j.key);
    const bool live = it != ready_.end() && it->second == j.pos;
    auto cur = cursors_.find(j.stream);
    if (live && ready_order_.size() <= max_order && cur != cursors_.end() &&
        j.pos + ahead_chunks_ >= cur->second.pos)
      break;
    if (live) {
      ready_.erase(it);
      ++counters_.unused;
      StatAdd(Stat::prefetch_unused_bytes, config_.chunk_size);
    }
    ready_order_.pop_front();
  }
}

void Prefetcher::OnAccess(const Access& a) {
  std::unique_lock<std::mutex> pl(predictor_mu_);
  Learn(a, pl);
}

void Prefetcher::Learn(const Access& a, std::unique_lock<std::mutex>& pl) {
  // On the copy thread: learning and planning under the predictor's lock, then the access is
  // handed to the workers (arrivals_), which do the queue work -- a map operation or three per
  // chunk of the access and of the window, a millisecond for a 256 MiB layer -- under mu_. The
  // pool asks NextUseDistance with its own lock held, for every chunk a copy touches, so neither
  // lock may be held long.
  Arrival arrival;
  arrival.access = a;
  predictor_.Observe(a);
  if (ahead_chunks_ == 0) return;  // learn only: nothing is ever queued or ready
  arrival.pos = predictor_.Position(a.stream);
  arrival.epoch = predictor_.PlanEpoch(a.stream);
  predictor_.Plan(a.stream, arrival.pos, arrival.pos + ahead_chunks_, config_.min_confidence,
                  &arrival.plan);
  pl.unlock();
  {
    std::lock_guard<std::mutex> al(arrivals_mu_);
    arrivals_.push_back(std::move(arrival));
    arrivals_count_.store(arrivals_.size(), std::memory_order_release);
  }
  work_cv_.notify_one();  // a worker that misses it polls within kPollMs
}

void Prefetcher::OnFault(uint64_t region, uint64_t chunk) {
  const uint64_t block = chunk / kFaultRun;
  const uint32_t at = static_cast<uint32_t>(chunk % kFaultRun);
  std::lock_guard<std::mutex> lock(fault_mu_);
  if (fault_stop_) return;
  FaultBlock* b = nullptr;
  for (FaultBlock& f : fault_blocks_)
    if (f.block == block && f.region == region) b = &f;
  if (b && (at < b->lo || at > b->hi)) {  // the pass goes on
    b->lo = std::min(b->lo, at);
    b->hi = std::max(b->hi, at);
    return;
  }
  if (!b) {
    b = &fault_blocks_[fault_next_];
    fault_next_ = (fault_next_ + 1) % kFaultBlocks;
    b->region = region;
    b->block = block;
  }
  b->lo = b->hi = at;  // a new pass over the block: learned as an access
  if (fault_queue_.size() >= kFaultQueue) {
    ++faults_dropped_;
    StatAdd(Stat::fault_blocks_dropped, 1);
    return;
  }
  const Access a{region, block * kFaultRun, kFaultRun, Direction::kCpuFault, kFaultStream};
  // Learned right here when that cannot wait (the predictor is free) nor overtake queued faults:
  // an access costs at most the predictor's walk_per_access steps, and placement then knows the
  // block before the evictor that this fault kicked asks.
  if (fault_queue_.empty() && !fault_learning_) {
    std::unique_lock<std::mutex> pl(predictor_mu_, std::try_to_lock);
    if (pl.owns_lock()) {
      ++fault_queued_;
      ++fault_learned_;
      Learn(a, pl);
      return;
    }
  }
  if (!fault_thread_.joinable())
    fault_thread_ = std::thread([this] {
      NameThisThread("zr-prefetch-flt");
      FaultLoop();
    });
  fault_queue_.push_back(a);
  ++fault_queued_;
  if (fault_queue_.size() == 1) fault_cv_.notify_all();
}

void Prefetcher::FaultLoop() {
  std::vector<Access> batch;
  std::unique_lock<std::mutex> lock(fault_mu_);
  for (;;) {
    fault_cv_.wait(lock, [&] { return fault_stop_ || !fault_queue_.empty(); });
    if (fault_stop_) return;
    batch.swap(fault_queue_);
    fault_learning_ = true;
    lock.unlock();
    // One access at a time (OnAccess takes the predictor's lock for each), so that the copy
    // path's placement queries wait for one access at most.
    for (const Access& a : batch) OnAccess(a);
    lock.lock();
    fault_learned_ += batch.size();
    fault_learning_ = false;
    batch.clear();
    fault_cv_.notify_all();  // WaitFaultsLearned
  }
}

bool Prefetcher::WaitFaultsLearned(int timeout_ms) {
  std::unique_lock<std::mutex> lock(fault_mu_);
  const uint64_t target = fault_queued_;
  return fault_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                            [&] { return fault_learned_ >= target || fault_stop_; });
}

size_t Prefetcher::TakeArrivals() {
  {
    std::lock_guard<std::mutex> al(arrivals_mu_);
    arrivals_scratch_.swap(arrivals_);
    arrivals_count_.store(0, std::memory_order_release);
  }
  size_t added = 0;
  for (const Arrival& arrival : arrivals_scratch_) added += Process(arrival);
  arrivals_scratch_.clear();
  NoteIdle();
  return added;
}

size_t Prefetcher::Process(const Arrival& arrival) {
  const Access& a = arrival.access;
  const uint64_t pos = arrival.pos, epoch = arrival.epoch;
  const bool tracked = !pending_.empty() || !inflight_.empty() || !ready_.empty();
  for (uint32_t c = 0; tracked && c < a.chunk_count; ++c) {
    const ChunkKey key{a.region, a.first_chunk + c};
    if (pending_.erase(key)) ++counters_.canceled;
    if (auto it = inflight_.find(key); it != inflight_.end()) it->second = true;
    if (ready_.erase(key)) ++counters_.used;
  }
  if (cursors_.size() > 4 * config_.predictor.max_streams && !cursors_.count(a.stream))
    cursors_.clear();  // streams come and go; a forgotten cursor only re-plans its window
  StreamCursor& cur = cursors_[a.stream];
  // Two threads on one stream may get here out of order: only the newer position counts.
  const bool newer = epoch > cur.epoch || (epoch == cur.epoch && pos >= cur.pos);
  if (newer) {
    if (cur.epoch != epoch) {
      cur.epoch = epoch;
      cur.enqueued_until = pos;
    }
    cur.pos = pos;
  }
  ExpireReady();
  if (!newer) return 0;

  size_t added = 0;
  const uint64_t from = std::max(cur.enqueued_until, pos);
  const uint64_t until = pos + ahead_chunks_;
  for (const PlannedAccess& p : arrival.plan) {
    if (p.pos + p.access.chunk_count <= from) continue;
    uint32_t c = 0;
    for (; c < p.access.chunk_count && p.pos + c < until; ++c) {
      const uint64_t at = p.pos + c;
      // Only host-to-device targets: a D2H target needs no decode, and a fault target needs an
      // install in T1, which the sink (T0) does not do.
      if (at < from || p.access.dir != Direction::kH2D) continue;
      const ChunkKey key{p.access.region, p.access.first_chunk + c};
      if (pending_.count(key) || inflight_.count(key) || ready_.count(key)) continue;
      const uint64_t seq = ++next_job_seq_;
      pending_.emplace(key, seq);
      queue_.push_back(Job{key, a.stream, at, epoch, seq});
      ++added;
    }
    cur.enqueued_until = std::max(cur.enqueued_until, p.pos + c);
  }
  return added;
}

void Prefetcher::TakeRun(std::vector<Job>* run) {
  run->clear();
  while (!queue_.empty() && run->size() < kMaxRun) {
    const Job& job = queue_.front();
    auto live = pending_.find(job.key);
    if (live == pending_.end() || live->second != job.seq) {  // canceled or superseded
      queue_.pop_front();
      continue;
    }
    if (!run->empty()) {
      const Job& last = run->back();
      if (job.key.region != last.key.region || job.key.chunk != last.key.chunk + 1 ||
          job.stream != last.stream || job.epoch != last.epoch)
        return;
    }
    pending_.erase(live);
    if (Stale(job)) {
      ++counters_.stale;
      queue_.pop_front();
      continue;
    }
    run->push_back(job);
    queue_.pop_front();
  }
}

void Prefetcher::WorkerLoop() {
  std::vector<Job> run;
  // Set by the sink for every chunk it handled (TakeRun's cap); only those entries are read.
  std::array<bool, kMaxRun> fetched;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait_for(lock, std::chrono::milliseconds(kPollMs), [this] {
      return stop_ || !queue_.empty() || arrivals_count_.load(std::memory_order_acquire) > 0;
    });
    if (stop_) return;
    // Demand first: the accesses that arrived cancel queued chunks and extend the window.
    if (arrivals_count_.load(std::memory_order_acquire) > 0 && TakeArrivals() > 1)
      work_cv_.notify_all();
    TakeRun(&run);
    if (run.empty()) {
      NoteIdle();
      continue;
    }
    for (const Job& job : run) inflight_[job.key] = false;
    counters_.issued += run.size();
    ++counters_.runs;
    lock.unlock();
    const size_t handled = std::min(
        run.size(),
        sink_->PrefetchRun(run[0].key.region, run[0].key.chunk, run.size(), fetched.data()));
    lock.lock();
    for (size_t i = 0; i < handled; ++i) {
      const Job& job = run[i];
      auto it = inflight_.find(job.key);
      const bool demanded = it != inflight_.end() && it->second;
      if (it != inflight_.end()) inflight_.erase(it);
      if (!fetched[i]) {  // in T0 already (or left alone): nothing was prefetched
        ++counters_.ready;
        continue;
      }
      ++counters_.prefetched;
      StatAdd(Stat::prefetch_bytes, config_.chunk_size);
      if (demanded) {
        ++counters_.used;
      } else {
        ready_[job.key] = job.pos;
        ready_order_.push_back(job);
      }
    }
    if (handled == run.size()) {
      NoteIdle();
      continue;
    }
    counters_.refused += run.size() - handled;
    if (stop_) return;
    // No room now: wait for a freed slot (or 1 ms), then retry the rest of the run unless the
    // demand got there. Its chunks stay in inflight_ meanwhile (so WaitIdle waits and a demand
    // access marks them).
    const uint64_t seen = space_seq_;
    space_cv_.wait_for(lock, std::chrono::milliseconds(1),
                       [&] { return stop_ || space_seq_ != seen; });
    if (stop_) return;
    // Back to the queue's front, in order, so the run is taken again as one.
    for (size_t i = run.size(); i-- > handled;) {
      Job job = run[i];
      auto again = inflight_.find(job.key);
      const bool demanded_now = again == inflight_.end() || again->second;
      if (again != inflight_.end()) inflight_.erase(again);
      if (demanded_now || Stale(job) || pending_.count(job.key) || ready_.count(job.key)) {
        if (!demanded_now) ++counters_.stale;
        continue;
      }
      job.seq = ++next_job_seq_;
      pending_.emplace(job.key, job.seq);
      queue_.push_front(job);
    }
    NoteIdle();
  }
}

uint64_t Prefetcher::NextUseDistance(const ChunkKey& key) const {
  std::lock_guard<std::mutex> lock(predictor_mu_);
  return predictor_.NextUseDistance(key);
}

void Prefetcher::NextUseDistances(std::span<const ChunkKey> keys, std::span<uint64_t> out) const {
  std::lock_guard<std::mutex> lock(predictor_mu_);
  for (size_t i = 0; i < keys.size(); ++i) out[i] = predictor_.NextUseDistance(keys[i]);
}

bool Prefetcher::Learning() const {
  std::lock_guard<std::mutex> lock(predictor_mu_);
  return predictor_.Learning();
}

void Prefetcher::OnDropped(uint64_t region, uint64_t chunk) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ready_.find(ChunkKey{region, chunk});
  if (it == ready_.end()) return;
  {
    // An access that reached the chunk and waits for a worker has used it (Process counts it).
    std::lock_guard<std::mutex> al(arrivals_mu_);
    for (const Arrival& arrival : arrivals_) {
      const Access& a = arrival.access;
      if (a.region == region && chunk >= a.first_chunk && chunk - a.first_chunk < a.chunk_count)
        return;
    }
  }
  ready_.erase(it);
  ++counters_.unused;
  StatAdd(Stat::prefetch_unused_bytes, config_.chunk_size);
}

void Prefetcher::NotifySpace() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++space_seq_;
  }
  space_cv_.notify_all();
}

bool Prefetcher::WaitIdle(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] {
    return pending_.empty() && inflight_.empty() &&
           arrivals_count_.load(std::memory_order_acquire) == 0;
  });
}

Prefetcher::Counters Prefetcher::counters() const {
  Counters c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c = counters_;
  }
  std::lock_guard<std::mutex> lock(fault_mu_);
  c.fault_blocks = fault_learned_;
  c.faults_dropped = faults_dropped_;
  return c;
}

}  // namespace zrtier::policy
