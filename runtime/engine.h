// Engine: the facade over the tiers. It owns one userfaultfd-registered arena from which regions
// (managed "pinned" allocations) are carved, the fault-handler thread(s) that install whole chunks,
// the chunk table (per-chunk state and generation, DESIGN.md section 3), the evictor that keeps
// resident bytes under ZRTIER_RESIDENT_LIMIT, the codec and the store stack.
//
// Guarantees:
//   - Nothing lost: at every instant each written chunk has at least one valid copy (T1 pages, a
//     store entry of its current generation, or -- for an adopted chunk -- the external copy its
//     holder keeps); a write racing an eviction is never lost.
//   - A region reads as zeros until written; CPU loads and stores anywhere in a region just work
//     (missing faults install whole chunks; the first store to a clean chunk is seen through a
//     write-protect fault and makes older copies garbage).
//   - The engine never calls CUDA. Read/Write below never fault the calling thread on region
//     memory, so they are safe inside CUDA host functions.
//   - fork: the arena is MADV_DONTFORK; a child that touches a region gets SIGSEGV instead of
//     reading zeros (real cudaHostAlloc memory would be inherited: documented difference).
//
// Thread safety: every public method may be called from any thread concurrently, except that a
// region must not be used (by CPU access, Read or Write) while or after it is freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "runtime/base/options.h"
#include "runtime/base/status.h"
#include "runtime/codec/codec.h"
#include "runtime/os/os.h"
#include "runtime/policy/access.h"
#include "runtime/store/store.h"

namespace zrtier {

struct RegionInfo {
  void* base = nullptr;
  size_t size = 0;  // bytes usable (the allocation rounded up to the chunk size)
  uint64_t id = 0;  // unique for the engine's lifetime
};

struct EngineUsage {
  uint64_t regions = 0;
  uint64_t region_bytes = 0;
  uint64_t resident_bytes = 0;    // T1: chunks installed in region pages
  uint64_t resident_limit = 0;    // 0 = none
  uint64_t stored_raw_bytes = 0;  // original bytes of chunks whose newest copy is in the store
  uint64_t external_bytes = 0;    // bytes of chunks whose newest copy is an external one (Adopt)
  uint64_t empty_bytes = 0;       // bytes of chunks never written (or evicted as all-zero)
  StoreUsage store;               // the store stack's own accounting
};

// Generation() of a chunk that must not be cached (dirty or in a transition).
inline constexpr uint64_t kNoGeneration = ~0ull;

// Holder of external chunk copies (Engine::Adopt): the shim's T0 pool, whose slots a D2H copy
// landed in. The engine asks it for the bytes whenever a chunk in the external state is read or
// faulted in.
class ExternalCopies {
 public:
  virtual ~ExternalCopies() = default;
  // If the copy of chunk `chunk` of region `region` at generation `gen` is held, calls use(bytes)
  // (chunk_size bytes, valid and unchanged during the call) and returns true; false if it is not
  // held (given back or superseded: the chunk has left the external state at `gen` by then).
  // Called from the pager thread and from Read/Write callers; never calls into the engine.
  virtual bool WithBytes(uint64_t region, uint64_t chunk, uint64_t gen,
                         const std::function<void(const char* bytes)>& use) = 0;
  // The chunk left the external state at `gen` without Attach (a fault installed it, a Write
  // replaced it): the holder may forget its copy, which is still a valid copy of generation `gen`.
  // Called after the transition, from the pager thread or a Write caller.
  virtual void Released(uint64_t region, uint64_t chunk, uint64_t gen) {}
};

class Engine {
 public:
  // Creates the engine from `opts` (ZRTIER_CHUNK, ZRTIER_ARENA, ZRTIER_RESIDENT_LIMIT, the codec
  // and store options). `store` may be null: then CreateStore(opts) builds the stack.
  // Fails, never aborts, with a Status naming the cause and what to do, e.g.
  //   ENOSYS/EPERM "userfaultfd unavailable: ... (sysctl vm.unprivileged_userfaultfd=1 or run as
  //   root)", ENOTSUP "kernel lacks UFFD_FEATURE_... (needs Linux >= 5.7)", ENOMEM
  //   "ZRTIER_ARENA=1T: mmap ...".
  static Status Create(const Options& opts, Os* os, std::unique_ptr<ChunkStore> store,
                       std::unique_ptr<Engine>* out);
  // Stops the handler and evictor threads, frees every region and store entry, unmaps the arena.
  // REQUIRES: no thread is using a region.
  ~Engine();

  size_t chunk_size() const;

  // Carves a region of at least `size` bytes (rounded up to the chunk size) out of the arena.
  // ENOMEM when the arena has no room (the shim then falls back to the real allocator).
  Status Allocate(size_t size, RegionInfo* out);
  // Frees the region whose base is `base`: every copy of its chunks is released and its pages
  // dropped. EINVAL if `base` is not the base of a live region.
  Status Free(void* base);
  // True if `p` lies in a live region; fills *out.
  bool Lookup(const void* p, RegionInfo* out) const;

  // Copies the current content of [src, src+len) (inside one region) into `dst`, from whichever
  // tier holds the newest copy, decoding stored chunks straight into `dst` without installing them.
  // If `zero` is non-null and every chunk touched was never written (or is stored as all-zero),
  // sets *zero = true and leaves `dst` untouched; otherwise sets *zero = false.
  // EINVAL if the range is not inside one region; EIO/EBADMSG if a store entry cannot be read
  // (the error names the chunk).
  Status Read(const void* src, size_t len, void* dst, bool* zero);
  // Read of the whole chunk starting at `chunk_start`, for a copy to be cached (a T0 slot): a dirty
  // chunk is write-protected first (clean from then on, so that the next CPU store faults and
  // bumps the generation), and *gen is the generation the copied bytes belong to, to stamp the
  // copy with -- kNoGeneration if the chunk stays writable (then the copy must not be cached):
  // when protecting it failed, or when the CPU has rewritten it twice after such a protect (a
  // staging buffer, whose stores should not each pay a fault for a copy used once).
  // `dst` is written with non-temporal stores: resident bytes by CopyStreaming, stored ones by the
  // codec's streaming merge (Codec::Decode).
  Status ReadChunk(const void* chunk_start, void* dst, bool* zero, uint64_t* gen);

  // Publishes `len` bytes from `src` as the newest content of [dst, dst+len) (inside one region),
  // as a device-to-host copy landing there would: older copies of the chunks become garbage;
  // partially covered chunks are merged with their current content. Concurrent CPU faults on those
  // chunks wait until the publish is complete. Every chunk gets a new generation. One that was not
  // resident is installed write-protected (clean: a copy of it may be cached and a later CPU
  // store is seen); a resident one is written in place and left writable (dirty).
  Status Write(void* dst, const void* src, size_t len);

  // Batched protection changes, for copies of many chunks at once. Each changes the write
  // protection of whole runs of consecutive chunks with one UFFDIO_WRITEPROTECT (one TLB flush)
  // per run, where ReadChunk and Write would each pay one per chunk. Both are hints: they change
  // no bytes, touch only chunks wholly inside [p, p+len) (inside one region, else nothing), and
  // leave chunks in a transition or in the wrong state to ReadChunk and Write, which stay correct
  // either way.
  //
  // PrepareRead write-protects the dirty chunks (clean from then on; a later CPU store faults and
  // bumps the generation), so that a ReadChunk of them can stamp its copy without an ioctl.
  // Chunks ReadChunk would leave writable (rewritten staging buffers) are left alone.
  void PrepareRead(const void* p, size_t len);
  // PrepareWrite makes the write-protected resident chunks writable (dirty: new generation, older
  // store copies freed), so that a Write of them that follows is a plain memcpy.
  void PrepareWrite(void* p, size_t len);

  // The generation of the chunk containing `p`: bumped by every CPU write to a clean chunk and by
  // every Write. A copy of the chunk's bytes made elsewhere (a T0 slot) at generation g is valid
  // while Generation() == g, provided g was read before the bytes. kNoGeneration while the chunk
  // is writable (dirty: CPU stores change it without a fault, so no generation can vouch for a
  // copy) or in a transition: such a chunk must not be cached.
  uint64_t Generation(const void* p) const;
  // The generations of the `n` consecutive chunks starting with the one containing `p` (one region
  // lookup for all), as Generation. Chunks past the region's end, or outside any region, read 0.
  // `resident` (optional): whether each chunk is installed in the region now (T1: a copy of it is
  // a memcpy, not a decode).
  void Generations(const void* p, size_t n, uint64_t* out, bool* resident = nullptr) const;

  // Resident budget (0 = none). Lowering it makes the evictor catch up in the background.
  void SetResidentLimit(uint64_t bytes);
  // Synchronously evicts chunks of every region until resident bytes <= `target` (0 = all).
  Status EvictTo(uint64_t target_resident_bytes);
  // Synchronously evicts the chunks overlapping [p, p+len) (inside one region).
  Status EvictRange(const void* p, size_t len);

  // Adopted chunks (DESIGN.md section 4: the slot a D2H copy landed in becomes the chunk's newest
  // copy, with no copy into the region). SetExternalCopies names the holder, once, before any
  // Adopt (null: none; chunks still external then read as errors and fault with SIGBUS).
  void SetExternalCopies(ExternalCopies* x);

  // Placement in T1 (DESIGN.md section 5). With an oracle the evictor takes, of a sample of
  // resident chunks spread over all regions, the one predicted to be needed farthest ahead
  // (unpredicted chunks first, CLOCK's reference bit among them), and then the rest of its aligned
  // group of ReusePolicy::kRun chunks predicted about as far ahead; null: CLOCK. ChunkKeys are
  // (RegionInfo::id, chunk index). Returns once no query of the previous oracle is in progress.
  void SetPlacementOracle(const policy::NextUseOracle* oracle);
  // Called for every chunk a CPU fault brought back into T1 (region id, chunk index) -- not for
  // the first touch of a never-written chunk -- after the faulting thread was woken, on the thread
  // that served the fault (the pager or a restore worker): the access stream of the CPU, for
  // learning. Must not call back into the engine.
  // Empty: none. Returns once no call of the previous observer is in progress.
  using FaultObserver = std::function<void(uint64_t region, uint64_t chunk)>;
  void SetFaultObserver(FaultObserver observer);
  // The `n` chunks from `p` (a chunk start; inside one region) become external: their pages are
  // dropped, their store copies freed, their generations bumped into gens[0..n), and then, while
  // every one of them is still claimed -- so no fault or Read sees one external before its copy is
  // known -- `registered()` runs (the holder records its copies at those generations). Concurrent
  // faults on those chunks wait and are then served from the holder. EINVAL outside a region.
  Status Adopt(void* p, size_t n, uint64_t* gens, const std::function<void()>& registered);
  // Gives an external chunk its bytes back: if the chunk starting at `chunk_start` is still
  // external at generation `gen`, installs `bytes` write-protected (T1: clean, same generation)
  // when the resident budget has room for one more chunk; without room it encodes them into the
  // store instead (T2: stored at the same generation, no pages) -- it never waits for the evictor,
  // so a write-back costs one encode, not an install plus another chunk's eviction. A store that
  // refuses the entry (full, I/O error) makes it install anyway. *installed (optional): whether
  // the bytes went into the region. Returns OK (the holder may forget its copy) also when the
  // chunk is no longer external at `gen` (written, installed or freed meanwhile: then nothing
  // changes); an error (UFFDIO_COPY failed) means the chunk is still external and the holder must
  // keep its copy.
  Status Attach(void* chunk_start, uint64_t gen, const void* bytes, bool* installed = nullptr);
  // Bytes the resident budget has left (UINT64_MAX without a resident limit): an Attach installs
  // while there is room for its chunk and encodes into the store once there is not. A snapshot:
  // the budget moves with every fault, install and eviction.
  uint64_t ResidentRoom() const;
  EngineUsage Usage() const;
  const Codec& codec() const;

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zrtier
