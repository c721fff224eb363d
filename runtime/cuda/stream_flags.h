// StreamFlags: host words a CUDA stream can wait on (the driver's cuStreamWaitValue32). A D2H copy
// into a region must not let its stream complete before the landed bytes are published; a host
// function at the end of the copy says so too, but its dispatch costs tens of microseconds after
// the last DMA (docs/decisions.md, "End of a D2H copy: a stream flag, not a host function"). With a
// flag the stream
// waits on a word in mapped pinned memory instead, and the thread that finishes the publish
// releases it with one store. An asynchronous H2D copy uses the same words the other way round:
// a piece's DMAs, queued while its slots are still being filled, wait on a word that the fill's
// last step sets (H2DPath::Defer), so the copy call returns without waiting for its decodes.
//
// A flag may also tell whether the stream had reached its wait before the word was set: Enqueue
// with `mark` queues, just ahead of the wait, a write of the awaited value into a second word of
// the flag (the driver's cuStreamWriteValue32), which the stream performs once everything queued
// before it is done; Signal reads that word before it releases the stream. For an H2D piece that
// says whether the GPU got to the piece's DMAs before its fill was done
// (Stat::copies_ready_in_time).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "runtime/cuda/cuda_api.h"

namespace zrtier {

class StreamFlags {
 public:
  // Resolves cuStreamWaitValue32 (from the loaded driver, or whatever the process exports under
  // that name, e.g. the fake runtime) and allocates `count` words through `api`. available() is
  // false if either fails; Enqueue then always returns -1.
  StreamFlags(const CudaApi* api, size_t count);
  ~StreamFlags();
  StreamFlags(const StreamFlags&) = delete;
  StreamFlags& operator=(const StreamFlags&) = delete;

  bool available() const { return wait_ != nullptr; }

  // Takes a free word and enqueues on `stream` a wait for its next value: work queued on the
  // stream after this call runs only once Signal(token). With `mark`, the stream also notes when
  // it reaches the wait (see above; skipped, said once on stderr, where the driver has no stream
  // writes). Returns the token, or -1 when no word is free or the driver refused the wait (said
  // once on stderr): the caller uses a host function.
  int Enqueue(cudaStream_t stream, bool mark = false);

  // Whether the stream had reached the wait when Signal released it.
  enum class Reached {
    kUnknown,  // not marked (Enqueue without `mark`, or no stream writes)
    kNotYet,   // the word was set before the stream got to the wait: it did not wait
    kWaiting,  // the stream was at the wait (or reached it while Signal ran)
  };

  // Releases the stream waiting on `token` (after every store the waiting work must see) and
  // frees the word. Once per successful Enqueue.
  Reached Signal(int token);

 private:
  using WaitFn = int (*)(void* stream, unsigned long long addr, unsigned int value,
                         unsigned int flags);
  static constexpr size_t kStride = 16;  // words per flag: one per 64-byte line

  const CudaApi* api_;
  WaitFn wait_ = nullptr;
  WaitFn write_ = nullptr;      // cuStreamWriteValue32 (the same signature); null: no marks
  uint32_t* words_ = nullptr;   // host view
  unsigned long long dev_ = 0;  // device view of words_
  std::mutex mu_;               // guards free_ and next_
  std::vector<int> free_;
  std::vector<uint32_t> next_;  // per flag: the value its next wait waits for
  // Per flag: whether its current wait was marked. Written by Enqueue before the token is handed
  // out, read by Signal, which the token's owner calls after it (ordered by the owner's handoff).
  std::vector<uint8_t> marked_;
};

}  // namespace zrtier
