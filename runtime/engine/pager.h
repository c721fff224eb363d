// Pager: the userfaultfd fault-handler thread and its restore workers. One poll loop on the uffd
// and the ParkedFaults eventfd reads fault events in batches, dedupes them by chunk and resolves
// each through the chunk state machine (chunk_table.h): a missing fault loads the chunk (decode a
// store entry, take the holder's copy of an external chunk, or zeros), installs it whole with
// UFFDIO_COPY, makes the state final, then wakes; a write-protect fault makes a clean chunk dirty
// (new generation, store copy freed). Faults on chunks in transition, or over the resident
// budget, are parked and retried when woken. When more faults wait behind a restore, the decode
// and install go to a restore worker, so several chunks are restored at once.
//
// Readahead: CPU scans (an optimizer step over offloaded parameters, a reload of activations)
// fault chunk after chunk. A missing fault on a stored chunk that continues a stream -- the same
// region, the previous fault's chunk plus the stream's stride, three times in a row -- schedules
// the stored chunks of the next window (ZRTIER_READAHEAD) of that stride on the restore workers
// (decoded and installed clean, in parallel), so that the scan runs at the workers' aggregate
// decode rate instead of one fault at a time. kStreams streams are followed at once (one per
// scanning thread); demand restores go before readahead in the workers' queue.
//
// Partial restores (ZRTIER_PARTIAL_RESTORE, partial.h): a missing read fault on a stored chunk
// that looks random -- not continuing a readahead stream, not next to the same thread's previous
// stored fault's chunk, and at the chunk's first or last unit (where scans enter a chunk) neither
// a stride on from that fault nor coming from an installed chunk or the region's edge (no fault at
// those units where the kernel gives no thread id) -- installs only the touched unit,
// write-protected, and the chunk becomes kPartial. Later random faults install more units; a fault
// that does not look random, one next to an installed unit (a scan inside the chunk), the
// kCompleteUnits-th unit, readahead, or any write (a write-protect fault on an installed unit, a
// missing fault raised by a store) completes the chunk first: the missing units are installed from
// one whole decode (the installed ones equal it) and the chunk ends clean, or dirty with a new
// generation.
//
// The pager thread touches region memory only through uffd ioctls and never calls CUDA (DESIGN.md
// section 6). Thread safety: Start/Stop from the owner; SetFaultObserver and the accessors from any
// thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/engine/chunk_io.h"
#include "runtime/engine/engine_parts.h"
#include "runtime/engine/external.h"
#include "runtime/engine/parked_faults.h"
#include "runtime/engine/region_backend.h"
#include "runtime/engine/region_map.h"
#include "runtime/engine/resident_budget.h"
#include "runtime/engine/uffd.h"
#include "runtime/os/os.h"

namespace zrtier {

class Pager {
 public:
  // `external` is not owned and must outlive this object. `restorers`: restore worker threads.
  // `readahead_bytes`: the readahead window (0 = none).
  // `partial`: partial restores (ZRTIER_PARTIAL_RESTORE).
  Pager(const EngineParts& parts, ExternalChunks* external, int restorers, size_t readahead_bytes,
        bool partial = true)
      : e_(parts),
        external_(external),
        restorer_count_(restorers),
        readahead_bytes_(readahead_bytes),
        unit_(PartialUnit(parts.chunk)),
        partial_(partial && parts.chunk / unit_ >= kMinUnits) {}
  // REQUIRES: Stop() was called.
  ~Pager();

  void Start();
  // Stops the pager thread, then the restore workers (they finish the queued restores first).
  void Stop();

  // RegionBackend::SetFaultObserver (called under a mutex, so that clearing it waits for a call in
  // progress).
  void SetFaultObserver(FaultObserver observer);

  // For the watchdog: the pager thread's last loop start (MonotonicNs) and whether it died.
  uint64_t heartbeat() const { return heartbeat_.load(); }
  bool failed() const { return failed_.load(); }

 private:
  // A fault waiting for a transition to end or for the evictor to make room.
  struct Fault {
    std::shared_ptr<Region> region;  // null: the address is in no live region
    uint64_t addr = 0;
    bool wp = false;
    bool write = false;  // a missing fault raised by a store
    uint64_t t0 = 0;     // when it was read
    uint32_t tid = 0;    // the faulting thread (UFFD_FEATURE_THREAD_ID); 0: not known
  };
  // kQueued: handed to a restore worker, which finishes (or re-parks) the fault.
  enum class Outcome { kDone, kPark, kQueued };
  static constexpr size_t kWhole = SIZE_MAX;
  struct RestoreJob {
    Fault f;
    Chunk* c;
    char* p;
    ChunkState from;
    bool readahead = false;  // no fault waits: installed ahead of a scan
    size_t unit = kWhole;    // a partial restore of this unit (from kStored or kPartial)
  };
  // A chunk of fewer units is always restored whole (a unit would save little).
  static constexpr size_t kMinUnits = 4;
  // A partial chunk whose next install would make this many units is completed instead: it is
  // being read densely, and one whole restore costs less than the faults to come.
  static constexpr size_t kCompleteUnits = 16;
  // A scan followed by readahead: the last stored chunk faulted in `region`, the stride to the one
  // before, how many faults in a row kept that stride, and the last chunk scheduled ahead.
  struct Stream {
    uint64_t region = 0;
    size_t last = 0;
    size_t stride = 0;
    uint32_t run = 0;
    size_t ahead = 0;
    uint64_t used = 0;    // when the stream last matched (the pager's fault count)
    uint64_t when = 0;    // and its time (MonotonicNs)
    uint32_t writes = 0;  // write-protect faults on its chunks since its last fault
  };
  static constexpr int kStreams = 16;
  // A stream that matched a fault this recently scans still: readahead's windows of all such
  // streams together stay within an eighth of the resident limit. A scan behind readahead faults
  // once per half window: every few ms for an optimizer thread.
  static constexpr uint64_t kActiveStreamNs = 100'000'000;
  // The least window of one of several active scans, in chunks: a thread reads a chunk several
  // times faster than a worker decodes one, so a few in flight keep it from waiting on each.
  static constexpr size_t kStreamChunks = 4;
  // The farthest, in chunks, that a scan's next stored fault lies past its last one (a strided
  // scan's stride; readahead follows strides up to it).
  static constexpr size_t kScanReach = 64;

  void PagerLoop();
  // Retries the parked faults once; those still waiting go back into `parked`.
  void RetryParked(std::vector<Fault>* parked, std::vector<Fault>* retry);
  // Reads and handles every fault event available now; false if the uffd read failed.
  bool ReadEvents(std::vector<Fault>* parked, uint64_t* last_event);
  // At debug verbosity (ZRTIER_VERBOSE=2): logs a sample of the faults (the first 16, then every
  // 1024th) with the name of the thread that faulted, so that one can tell the program's own CPU
  // accesses from a driver's or zrtier's.
  void LogFault(const Fault& f);
  // `may_defer`: more faults are waiting behind this one, so a restore may go to a worker (a lone
  // fault is restored right here: a hand-off would only add a wake-up to its latency).
  Outcome HandleFault(const Fault& f, bool may_defer);
  // A write-protect fault on a clean chunk (state word `w`): makes it dirty.
  Outcome ResolveWriteProtect(Region* r, Chunk& c, char* p, uint32_t w);
  // Missing fault on a chunk claimed (kBusy) from `from` (kEmpty, kStored or kExternal).
  // `readahead`: no thread waits on it (not counted as a fault, not learned; a chunk that cannot be
  // restored is left stored for the demand fault to report).
  Outcome Load(Region* r, Chunk& c, char* p, ChunkState from, bool write, uint64_t t0,
               bool readahead = false);
  // An install of a chunk claimed from `from` failed with `st`: ends the claim; kDone if the
  // process is exiting, else kPark (retried).
  Outcome InstallFailed(Chunk& c, ChunkState from, const Status& st);
  // Load's end once the chunk is installed: accounting, state, wake-up, observer.
  void Loaded(Region* r, Chunk& c, char* p, ChunkState from, bool write, uint64_t t0,
              bool readahead);
  // Missing read fault on unit `u` of a chunk claimed from `from` (kStored or kPartial) that does
  // not have it: installs that unit alone, write-protected; the chunk ends kPartial.
  Outcome InstallUnit(Region* r, Chunk& c, char* p, size_t u, ChunkState from, uint64_t t0);
  // A fault on a chunk claimed from kPartial that completes it (see the file comment): the missing
  // units are installed, the chunk ends kDirty (`write`, a new generation) or kClean.
  // `readahead`: no fault waits (Readahead met a partial chunk).
  Outcome Complete(Region* r, Chunk& c, char* p, bool write, bool wp_fault, uint64_t t0,
                   bool readahead = false);
  // Whether a missing read fault by thread `tid` on unit `u` of stored (or partial) chunk `i` of
  // `r` looks random rather than part of a scan (pager thread; remembers the fault as that
  // thread's last).
  bool LooksRandom(const Region& r, size_t i, size_t u, uint32_t tid);
  // Restores a claimed chunk for fault `f`: whole (unit == kWhole, Load) or one unit; handed to a
  // restore worker when `may_defer` and one is free.
  Outcome Restore(const Fault& f, Chunk& c, char* p, ChunkState s, size_t unit, bool may_defer);
  // Follows the streams of missing faults on stored chunks; schedules readahead and tells the
  // budget its reach (pager thread). `now`: the fault's time. True if the fault continues a stream
  // (a stride on from its last fault, or inside or just past its window): a scan's.
  bool NoteStoredFault(const std::shared_ptr<Region>& r, size_t i, uint64_t now);
  // A write-protect fault on chunk `i` of region `r`: counted for the stream scanning there (none
  // without readahead).
  void NoteWriteFault(const Region& r, size_t i);
  // Claims the stored (and partial) chunks among `count` chunks from `first` with `stride` and
  // queues them; `write`: the scan writes them (stored ones are installed writable and dirty).
  void Readahead(const std::shared_ptr<Region>& r, size_t first, size_t stride, size_t count,
                 bool write);
  // A fault outside any live region (see pager.cc).
  void Stray(uint64_t addr, bool wp);
  void Finish(const Fault& f);
  void RestoreLoop();

  const EngineParts e_;
  ExternalChunks* external_;
  int restorer_count_;
  size_t readahead_bytes_;  // bytes restored ahead of a stream at most (ZRTIER_READAHEAD)
  const size_t unit_;       // PartialUnit(chunk)
  const bool partial_;      // partial restores on
  // The last stored fault of each of the threads that faulted most recently (pager thread), so
  // that several threads' scans are each seen as one; `tid` 0 (the kernel does not say): one for
  // all threads.
  struct LastFault {
    uint32_t tid = 0;
    uint64_t region = 0;
    size_t chunk = SIZE_MAX;
    uint64_t seen = 0;  // last_seq_ when it was last used (the least is replaced)
  };
  static constexpr size_t kLastFaults = 16;
  LastFault last_[kLastFaults];
  uint64_t last_seq_ = 0;

  std::mutex observer_mu_;
  FaultObserver observer_;  // guarded by observer_mu_
  std::atomic<bool> has_observer_{false};

  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::atomic<uint64_t> heartbeat_{0};
  std::thread pager_;
  std::vector<std::thread> restorers_;
  std::mutex restore_mu_;
  std::condition_variable restore_cv_;
  std::deque<RestoreJob> restore_q_;         // guarded by restore_mu_
  bool restore_stop_ = false;                // guarded by restore_mu_
  std::atomic<size_t> restore_queued_{0};    // demand restores queued
  std::atomic<size_t> readahead_queued_{0};  // readahead restores queued
  Stream streams_[kStreams];                 // pager thread only
  uint64_t stored_faults_ = 0;               // pager thread only
  uint64_t logged_faults_ = 0;               // pager thread only: faults seen by LogFault
  std::mutex requeue_mu_;
  std::vector<Fault> requeued_;  // restores that must be retried; guarded by requeue_mu_
};

}  // namespace zrtier
