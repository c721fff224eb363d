#include "runtime/shim/staging_ring.h"

#include "runtime/base/log.h"
#include "runtime/cuda/dma_batch.h"

namespace zrtier {

StagingRing::StagingRing(const CudaApi* api, EventPool* events, char* base, size_t bytes)
    : api_(api), events_(events), base_(base), bytes_(bytes) {}

StagingRing::~StagingRing() {
  for (Use& u : uses_)
    if (u.ev) events_->Put(u.ev);
}

void StagingRing::RetireOldest(std::unique_lock<std::mutex>& lock) {
  const uint64_t id = uses_.front().id;
  cudaEvent_t ev = uses_.front().ev;
  // Not done yet: wait outside the lock (other threads may reserve and commit meanwhile).
  if (ev && api_->cudaEventQuery(ev) != cudaSuccess) {
    lock.unlock();
    if (api_->cudaEventSynchronize(ev) != cudaSuccess && api_->cudaGetLastError)
      api_->cudaGetLastError();
    lock.lock();
  }
  if (!uses_.empty() && uses_.front().id == id) {
    if (uses_.front().ev) events_->Put(uses_.front().ev);
    uses_.pop_front();
  }
}

StagingRing::Span StagingRing::Reserve(size_t bytes, bool wait_uncommitted) {
  if (bytes == 0 || bytes > max_reserve()) return {};
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t begin, start, end;
  for (;;) {
    // A reservation does not wrap: the ring's tail end is skipped (part of this use).
    begin = start = head_;
    if (start % bytes_ + bytes > bytes_) start += bytes_ - start % bytes_;
    end = start + bytes;
    // An older use overlaps [start, end) in the ring iff end laps past its first byte.
    if (uses_.empty() || end <= uses_.front().begin + bytes_) break;
    if (!uses_.front().committed) {
      if (!wait_uncommitted) return {};
      committed_cv_.wait(lock);
      continue;
    }
    RetireOldest(lock);  // may let go of the lock: head_ is read again
  }
  // Drop the oldest uses already done, so that the queue stays short.
  while (!uses_.empty() && uses_.front().committed &&
         (!uses_.front().ev || api_->cudaEventQuery(uses_.front().ev) == cudaSuccess)) {
    if (uses_.front().ev) events_->Put(uses_.front().ev);
    uses_.pop_front();
  }
  head_ = end;
  uses_.push_back(Use{next_id_++, begin});
  return Span{base_ + start % bytes_, uses_.back().id};
}

void StagingRing::Commit(const Span& span, cudaStream_t stream) {
  if (!span.ptr) return;
  cudaError_t err = cudaSuccess;
  cudaEvent_t ev = events_->Get(&err);
  if (ev && api_->cudaEventRecord(ev, stream) != cudaSuccess) {
    events_->Put(ev);
    ev = nullptr;
  }
  if (!ev) {
    ZRTIER_LOG_ONCE(LogLevel::kWarn,
                    "GPU decode staging: no CUDA event to mark its buffer's use; the copy waits "
                    "for its stream instead");
    DmaBatch::Synchronize(api_, stream);
  }
  Finish(span, ev);
}

void StagingRing::Release(const Span& span) {
  if (span.ptr) Finish(span, nullptr);
}

void StagingRing::Finish(const Span& span, cudaEvent_t ev) {
  std::lock_guard<std::mutex> l(mu_);
  for (Use& u : uses_)
    if (u.id == span.id) {
      u.ev = ev;
      u.committed = true;
      committed_cv_.notify_all();
      return;
    }
  if (ev) events_->Put(ev);  // not found: a bug, but keep the event
}

}  // namespace zrtier
