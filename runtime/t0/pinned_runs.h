// PinnedRuns: T0 in place (DESIGN.md section 10, option (a)). While the memory budget has room, a
// region's own pages are pinned where they are: the run's chunks are held in the backend
// (RegionBackend::Hold: installed, writable, never evicted) and the run is registered with the real
// cudaHostRegister, so copies go straight from and to the program's pages -- plain pinned speed --
// and the CPU touches them without a fault. Under pressure the coldest runs are unpinned again:
// the copies issued from them are waited for, the run is unregistered and its chunks unheld, and
// from then on they are ordinary T1 chunks that the evictor may compress; copies of them go
// through T0 slots.
//
// A region is cut into runs of at most kRunBytes: registration, unregistration and the copies'
// segments are per run (the driver treats every registration as its own range).
//
// A copy issued while its stream captures a CUDA graph pins the runs it touches for good
// (AcquireForCapture): the graph replays the DMA from or into these pages whenever the program
// launches it. A region whose device pointer the program asks for is pinned for good and mapped for
// device access (PinMapped).
//
// Copies: Lease() says whether a range lies wholly in pinned runs and keeps them pinned until the
// lease ends; the caller issues one real copy per segment, then Fence(stream) records the stream's
// fence event, which Unpin synchronizes before it unregisters anything.
//
// Thread safety: every method may be called from any thread. Unpin and AddRegion call CUDA and the
// backend: never from a CUDA host function or the fault handler.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/cuda/cuda_api.h"
#include "runtime/engine/region_backend.h"

namespace zrtier {

// One run of a region's pages (pinned_runs.cc).
struct PinnedRun;

class PinnedRuns {
 public:
  // Runs are cut at this size: small enough that unpinning under pressure frees memory in steps,
  // large enough that a long copy is a few DMAs (one per run) and registration is per large range.
  static constexpr size_t kRunBytes = 64 << 20;

  // `api` and `backend` are not owned and must outlive this object.
  PinnedRuns(const CudaApi* api, RegionBackend* backend);
  // Unregisters every pinned run. REQUIRES: no copy uses them (the device is idle).
  ~PinnedRuns();

  // Pins the runs of region `r` in order while `room(run bytes)` allows each (the caller's budget)
  // and pinning works; returns the bytes pinned. A failure (the backend cannot hold, the driver
  // refuses the registration) is said once and leaves the rest of the region unpinned.
  size_t AddRegion(const RegionInfo& r, const std::function<bool(size_t)>& room);
  // Unregisters the region's pinned runs before it is freed. REQUIRES: no copy of it in flight.
  void RemoveRegion(uint64_t id);

  // The segments of one direct copy: [p, p+len) of the copy, each inside one pinned run.
  struct Segment {
    const char* p;
    size_t len;
  };
  // Keeps the runs of a direct copy pinned while it is issued; released by End() or destruction.
  class Lease {
   public:
    Lease() = default;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { End(); }
    const std::vector<Segment>& segments() const { return segments_; }
    void End();

   private:
    friend class PinnedRuns;
    std::vector<Segment> segments_;
    std::vector<std::shared_ptr<PinnedRun>> runs_;
  };
  // True, with `lease` holding the runs, if [p, p+n) (inside region `r`) lies wholly in pinned
  // runs; false (nothing held) otherwise.
  bool Acquire(const RegionInfo& r, const char* p, size_t n, Lease* lease);
  // Acquire for a copy issued while its stream captures a CUDA graph: the runs of the range that
  // are not pinned are pinned first, whatever the budget, and every run of it is kept pinned until
  // the region is removed (Unpin passes it over): the graph may replay the copy at any time, from
  // or into these pages. False when a run cannot be pinned (as for AddRegion).
  bool AcquireForCapture(const RegionInfo& r, const char* p, size_t n, Lease* lease);
  // Makes every run of region `r` pinned for good and registered for device access
  // (cudaHostRegisterMapped): the program was handed a device pointer to the region
  // (cudaHostGetDevicePointer), and its kernels may read and write the pages at any time. A run
  // registered without the mapping is registered again, once the copies issued from it are done.
  // False when a run cannot be pinned (as for AddRegion).
  bool PinMapped(const RegionInfo& r);
  // Whether `p` (inside region `r`) lies in a run that is pinned and registered for device access
  // (PinMapped): the driver then knows its device address.
  bool Mapped(const RegionInfo& r, const void* p) const;
  // Bytes of the runs kept pinned for captured copies and device access.
  uint64_t captured_bytes() const { return captured_bytes_.load(std::memory_order_relaxed); }
  // Records the fence of `stream` behind the copies just issued there from pinned runs -- while
  // fencing is on; otherwise only notes the stream as unfenced (the per-copy event is only worth
  // its cost while unpinning may come soon): an Unpin then synchronizes it. The legacy stream is
  // fenced per device; unfenced, it is noted with the calling thread's current device (the Unpin
  // synchronizes that device's legacy stream). The per-thread stream, which only its own thread
  // can name, a copy whose fence cannot be recorded and more than kUnfencedStreams streams are
  // noted so too: the Unpin synchronizes that device.
  void Fence(cudaStream_t stream);
  // The program destroys `stream`: it is synchronized no more (had it copied unfenced, the next
  // Unpin synchronizes the calling thread's device instead), and its fence leaves the list, its
  // event destroyed at once where its copies are done (so are those of earlier destroyed streams),
  // else waited for by the next Unpin and then destroyed. Waits for a sync of it in progress.
  void ForgetStream(cudaStream_t stream);
  // Whether copies record fences (the memory budget turns it on near its limit).
  void SetFencing(bool on) { fencing_.store(on, std::memory_order_relaxed); }

  // Unpins the least recently used pinned runs until at least `bytes` are unpinned or none is
  // left (runs kept for captured copies stay); returns the bytes unpinned.
  size_t Unpin(size_t bytes);
  // Pins runs that are not pinned, most recently used regions first, while `room(run bytes)`
  // allows each; returns the bytes pinned.
  size_t Repin(const std::function<bool(size_t)>& room);

  // Makes the calling thread's current CUDA device the one the first region was added on (its
  // caller's device then), so that unpinning and fencing from a thread of zrtier's own never
  // creates a context on device 0 for a program that runs on another one. Only for zrtier's own
  // threads: it changes the thread's current device. No-op before the first region.
  void BindDevice();

  uint64_t pinned_bytes() const { return pinned_bytes_.load(std::memory_order_relaxed); }
  // Whether pinning failed once (the backend cannot hold, or the driver refused a registration):
  // nothing is pinned any more from then on.
  bool broken() const { return broken_.load(std::memory_order_relaxed); }
  // Whether every run of every region is pinned (nothing to Repin).
  bool all_pinned() const {
    return broken() || pinned_bytes() == total_bytes_.load(std::memory_order_relaxed);
  }

 private:
  struct RegionRuns {
    RegionInfo info;
    std::vector<std::shared_ptr<PinnedRun>> runs;
  };
  // Holds and registers `run`; false (said once) if either fails.
  bool Pin(PinnedRun* run);
  // Registers `run`, whose chunks are held (mapped for device access when run->mapped); false
  // (said once) if the driver refuses, its chunks unheld then.
  bool Register(PinnedRun* run);
  // Counts `bytes` more (or fewer) pinned for good (captured_bytes and its statistic).
  void AddCaptured(int64_t bytes);
  // Marks the runs of [p, p+n) of region `r` pinned for good and pins those that are not
  // (whatever the budget); with `mapped`, registered with cudaHostRegisterMapped (a run
  // registered without it is registered again once its copies are done). False when a run cannot
  // be pinned (its mark cleared).
  bool PinForGood(const RegionInfo& r, const char* p, size_t n, bool mapped);
  // Clears `run`'s mark of pinned for good (a run that could not be pinned, or is removed);
  // returns false. REQUIRES: run->mu held.
  bool Uncapture(PinnedRun* run);
  // Unregisters and unholds `run`. REQUIRES: its users are gone and its fence synchronized.
  void Release(PinnedRun* run, bool unhold);
  // Waits until every fence recorded so far has completed.
  void SyncFences();
  // Sets the calling thread's current device in *devices (or sync_current_device_).
  void NoteDevice(std::atomic<uint64_t>* devices);

  const CudaApi* api_;
  RegionBackend* backend_;
  mutable std::shared_mutex mu_;  // guards regions_ (pins and unpins take it exclusively)
  std::unordered_map<uint64_t, RegionRuns> regions_;
  std::atomic<uint64_t> pinned_bytes_{0};
  std::atomic<uint64_t> total_bytes_{0};
  std::atomic<uint64_t> captured_bytes_{0};
  std::atomic<bool> broken_{false};
  std::atomic<bool> fencing_{true};
  // The streams (not the default ones) copies were issued on without a fence since the last sync,
  // each stored as its handle + 1 (0: empty); more streams than that are noted by device. A stream
  // synchronize, unlike a device one, leaves a graph that another stream captures valid. Programs
  // copy on a few streams.
  static constexpr int kUnfencedStreams = 8;
  std::atomic<uintptr_t> unfenced_[kUnfencedStreams] = {};
  // Devices (bit d: device d) whose unfenced copies a device synchronize waits for, and whose
  // legacy default stream took unfenced copies; a device the bits cannot name (or unknown) sets
  // sync_current_device_: a device synchronize on the syncing thread's current device.
  std::atomic<uint64_t> sync_devices_{0};
  std::atomic<uint64_t> legacy_devices_{0};
  std::atomic<bool> sync_current_device_{false};
  std::mutex sync_mu_;  // held by SyncFences and ForgetStream: no sync of a destroyed stream
  std::atomic<int> device_{-1};    // the device of the first AddRegion's caller
  int bound_device_ = -1;          // the device BindDevice last set (its one thread only)
  std::atomic<uint64_t> tick_{0};  // the use clock of the runs (one tick per lease)
  std::mutex fence_mu_;            // guards fences_
  // The last fence per stream: a named stream (device -1) or the legacy stream of a device
  // (cudaStreamLegacy); event null: it could not be made.
  struct Fenced {
    cudaStream_t stream;
    int device;
    cudaEvent_t event;
  };
  std::vector<Fenced> fences_;
  // Events of destroyed streams' fences whose copies were still running (ForgetStream): the next
  // SyncFences waits for each once, then destroys it.
  std::vector<cudaEvent_t> retired_;  // guarded by fence_mu_
};

}  // namespace zrtier
