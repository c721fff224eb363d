// The pieces of a host-to-device copy, shared by the copy call (h2d.cc) and the deferred pieces'
// end (h2d_deferred.cc). Internal to H2DPath.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "runtime/shim/h2d.h"
#include "runtime/shim/staging_ring.h"

namespace zrtier {

struct H2DPath::Chunk {
  char* start;  // chunk start in the region
  uint64_t index;
  uint64_t gen;
  int slot;
  bool hit;
  bool zero;
  bool resident = false;  // installed in the region (T1) when planned: a miss of it is a memcpy
  bool gpu = false;       // a whole stored chunk the fill may leave encoded (GpuDecode)
  uint32_t enc_len = 0;   // filled: the chunk's GPU-format encoding is staged, this long (its slot
  uint32_t enc_off = 0;   // is unused), at this offset in the piece's staging span
  // Leased instead (RegionBackend::LeaseEncoding, enc_len set when planned): the encoding lies at
  // enc_src in the pinned RAM store, sent from there; released once its DMA is complete. Not
  // filled.
  const char* enc_src = nullptr;
  uint64_t lease = 0;
};

// Whether one copy had every chunk in T0 before the GPU's DMAs needed it
// (Stat::copies_ready_in_time), shared by the copy call and the pieces it hands to the stream still
// filling (H2DPath::Defer); whoever drops the last reference counts the copy.
struct H2DPath::Readiness {
  std::atomic<int> refs{1};  // the copy call's
  std::atomic<bool> late{false};
  // Drops one reference; `was_late`: the holder found the copy's data not ready in time.
  void Release(bool was_late) {
    if (was_late) late.store(true, std::memory_order_relaxed);
    if (refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (!late.load(std::memory_order_relaxed)) StatAdd(Stat::copies_ready_in_time, 1);
    delete this;
  }
};

// One piece of a copy on its way: its slots are pinned and its misses are being filled by the
// workers. Owned by the copy call, which issues it once filled -- or, deferred (H2DPath::Defer), by
// the fill batch, whose last step finishes and deletes it.
struct H2DPath::Piece {
  const char* begin;  // the bytes of the copy it covers: [begin, end)
  const char* end;
  std::vector<Chunk> chunks;
  std::vector<size_t> misses;                // indexes into chunks
  std::shared_ptr<FillWorkers::Batch> fill;  // null: every chunk was a hit
  std::atomic<bool> failed{false};
  // Who ends a piece with a fill: the fill's last step and Defer each swap in their state; the
  // one that finds the other's state there finishes a deferred piece (FinishDeferred).
  enum State { kFilling, kFilled, kDeferred };
  std::atomic<int> state{kFilling};
  // Who releases the stream flag: Defer swaps in kFlagged once the wait is queued (before its DMA
  // calls), the fill's last step kBytes; the one that finds the other's mark there calls
  // ReleaseFlag, which records in `reached` whether the stream was already waiting.
  enum Release { kNeither, kFlagged, kBytes };
  std::atomic<int> release{kNeither};
  StreamFlags::Reached reached = StreamFlags::Reached::kUnknown;
  // The GPU chunks' room in the host staging ring (null: none): their fills pack the encodings
  // there, `packed` bytes so far (each 16-byte aligned).
  StagingRing::Span span;
  std::atomic<size_t> packed{0};
  uint64_t region = 0;             // set when deferred
  int flag = -1;                   // the StreamFlags token its DMAs wait on, once deferred
  Readiness* readiness = nullptr;  // once deferred: a reference to its copy's
  bool ready() const { return !fill || fill->done(); }
};

// Bytes an encoding of `len` takes in a staging span (the kernel reads 16-byte aligned encodings).
inline size_t StagedBytes(size_t len) {
  return (len + gpu::kDecodeAlign - 1) / gpu::kDecodeAlign * gpu::kDecodeAlign;
}

// A fill's GpuEncodingSink: packs the encoding into its piece's host staging span,
// after the ones packed before it (the span has a chunk of room for each GPU chunk).
class PackSink final : public GpuEncodingSink {
 public:
  PackSink(char* host, std::atomic<size_t>* packed) : host_(host), packed_(packed) {}
  char* Place(size_t n) override { return host_ + packed_->fetch_add(StagedBytes(n)); }

 private:
  char* host_;
  std::atomic<size_t>* packed_;
};

}  // namespace zrtier
