// RegionBackend: what the copy path (runtime/shim/) needs from the region engine -- carve and free
// regions, find the region of a pointer, read and publish chunk contents, chunk generations,
// adopted chunks and placement hooks. Engine (engine.h) implements it; the shim's unit tests use a
// plain heap-backed one (tests/testutil/heap_backend.h).
//
// Thread safety: every method may be called from any thread, including inside CUDA host functions
// (Read/Write/Generation never fault the caller and never call CUDA).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "runtime/policy/access.h"
#include "zrtier/status.h"

namespace zrtier {

struct RegionInfo {
  void* base = nullptr;
  size_t size = 0;  // bytes usable (the allocation rounded up to the chunk size)
  uint64_t id = 0;  // unique for the backend's lifetime
};

// Generation() of a chunk that must not be cached (dirty or in a transition).
inline constexpr uint64_t kNoGeneration = ~0ull;

// Holder of external chunk copies (RegionBackend::Adopt): the shim's T0 pool, whose slots a D2H
// copy landed in. The engine asks it for the bytes whenever a chunk in the external state is read
// or faulted in.
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

// Called for every chunk a CPU fault brought back into T1 (region id, chunk index) -- not for the
// first touch of a never-written chunk -- after the faulting thread was woken: the access stream of
// the CPU, for learning. Must not call back into the backend.
using FaultObserver = std::function<void(uint64_t region, uint64_t chunk)>;

// The host memory a backend's data occupies (for the memory budget, ZRTIER_MEMORY).
struct BackendMemory {
  uint64_t resident = 0;  // region pages installed (T1), held ones included
  uint64_t held = 0;      // of those, held for DMA from the pages (Hold: pinned in place)
  uint64_t store = 0;     // the store's bytes in host memory (RAM, zram; not spill files)
  bool keeping = false;   // T1 keeps part of the data apart (over the limit, swept by the CPU)
};

// Where RegionBackend::ReadChunk may put a chunk's stored encoding in the GPU chunk format instead
// of decoding it (an H2D copy that the GPU decodes packs a piece's encodings this way).
class StorePinner;  // runtime/store/store.h

class GpuEncodingSink {
 public:
  // Where the `len` encoded bytes go (at least len bytes of memory the caller owns), or null to
  // have the chunk decoded into ReadChunk's dst instead. Called at most once per ReadChunk.
  virtual char* Place(size_t len) = 0;
  size_t len = 0;      // set by ReadChunk: the encoding's length (0: dst holds the bytes)
  char* at = nullptr;  // where Place put it

 protected:
  ~GpuEncodingSink() = default;
};

class RegionBackend {
 public:
  virtual ~RegionBackend() = default;
  virtual size_t chunk_size() const = 0;

  // Carves a region of at least `size` bytes (rounded up to the chunk size). ENOMEM when there is
  // no room (the shim then falls back to the real allocator).
  virtual Status Allocate(size_t size, RegionInfo* out) = 0;
  // Frees the region whose base is `base`: every copy of its chunks is released and its pages
  // dropped. EINVAL if `base` is not the base of a live region.
  virtual Status Free(void* base) = 0;
  // True if `p` lies in a live region; fills *out (may be null).
  virtual bool Lookup(const void* p, RegionInfo* out) const = 0;

  // Copies the current content of [src, src+len) (inside one region) into `dst`, from whichever
  // tier holds the newest copy, decoding stored chunks straight into `dst` without installing
  // them. If `zero` is non-null and every chunk touched was never written (or is stored as
  // all-zero), sets *zero = true and leaves `dst` untouched; otherwise sets *zero = false. EINVAL
  // if the range is not inside one region; EIO/EBADMSG if a stored copy cannot be read (the error
  // names the chunk).
  virtual Status Read(const void* src, size_t len, void* dst, bool* zero) = 0;
  // Read of the whole chunk starting at `chunk_start`, for a copy to be cached (a T0 slot): a
  // dirty chunk is write-protected first (clean from then on, so that the next CPU store faults
  // and bumps the generation), and *gen is the generation the copied bytes belong to --
  // kNoGeneration if the chunk stays writable (then the copy must not be cached). `dst` is written
  // with non-temporal stores. With `gpu` non-null the backend may write, instead of the bytes into
  // dst, the chunk's stored encoding in the GPU chunk format (at most one chunk long) where
  // gpu->Place says, for the GPU to decode (gpu->len, gpu->at); else gpu->len is 0. The default
  // (for backends whose memory cannot change unseen): the generation, then the bytes.
  virtual Status ReadChunk(const void* chunk_start, void* dst, bool* zero, uint64_t* gen,
                           GpuEncodingSink* gpu = nullptr) {
    if (gpu) gpu->len = 0;
    *gen = Generation(chunk_start);
    return Read(chunk_start, chunk_size(), dst, zero);
  }
  // A whole chunk's store copy (of a stored chunk, or of a clean resident one that has one) in the
  // GPU chunk format, held in place in memory registered for DMA (the RAM store's,
  // ChunkStore::Lease) so that a copy sends it to the GPU without a copy into staging: *out has
  // its bytes, valid and unchanged until ReleaseEncodings names out->token (one call may end a
  // copy's leases together), even if the chunk changes meanwhile (the lease is of the store copy
  // the chunk had at the call). False where there is none (not stored, not in that format, not
  // in registered memory, no pinner): the caller reads the chunk with ReadChunk.
  struct EncodingLease {
    const char* data = nullptr;
    uint32_t len = 0;
    uint64_t token = 0;
  };
  virtual bool LeaseEncoding(const void* chunk_start, EncodingLease* out) { return false; }
  virtual void ReleaseEncodings(const uint64_t* tokens, size_t n) {}
  // Enables LeaseEncoding: `pinner` registers the store's memory for DMA (ChunkStore::SetPinner).
  // Set once, before copies; the pinner must outlive the backend. Default: no leases.
  virtual void SetStorePinner(StorePinner* pinner) {}
  // Stores the chunks that the CPU does not touch again after their first write in the GPU chunk
  // format from now on, where the backend encodes chunks with the auto codec (ChunkIo::Encode):
  // the shim turns it on once its GPU decode kernel loads. GpuEncoded: whether any chunk was
  // stored in that format (copies look for such chunks only then). Defaults: no encodings.
  virtual void SetGpuFormat(bool on) {}
  virtual bool GpuEncoded() const { return false; }
  // Publishes `len` bytes from `src` as the newest content of [dst, dst+len) (inside one region),
  // as a device-to-host copy landing there would: older copies of the chunks become garbage;
  // partially covered chunks are merged with their current content. Every chunk gets a new
  // generation.
  virtual Status Write(void* dst, const void* src, size_t len) = 0;
  // Write of whole chunks given as their GPU-format encodings (the GPU encode kernel's output,
  // encode_kernel.h): `encs[k]` is that of the k-th of `n` consecutive chunks from `chunk_start`
  // (len 0: all zero). A chunk that is not resident is stored as it is, never decoded (the run's
  // new entries go to the store in one batch, the ones they replace leave it in another); a
  // resident one (or one the store refuses) is decoded and written in place. Every chunk is
  // written even where one fails; the first error is returned. TakesEncodings: whether
  // WriteEncoded is there (default: ENOTSUP, nothing written).
  struct ChunkEncoding {
    const void* data = nullptr;
    size_t len = 0;
  };
  virtual bool TakesEncodings() const { return false; }
  virtual Status WriteEncoded(void* chunk_start, const ChunkEncoding* encs, size_t n) {
    return Status::Error(ENOTSUP, "this region backend does not take encodings");
  }
  // Of the `n` chunks from `chunk_start`, how many in a row from the first the CPU has not touched
  // again since their first write (what a GPU-format encoding suits: the CPU decodes it slower
  // than its own format). The default: all of them.
  virtual size_t CpuUntouched(const void* chunk_start, size_t n) const { return n; }

  // Batched protection hints for copies of many chunks (they change no bytes; the default does
  // nothing). PrepareRead write-protects the dirty chunks wholly inside [p, p+len) so that a
  // ReadChunk of them can stamp its copy without an ioctl; PrepareWrite makes the write-protected
  // resident ones writable so that a Write that follows is a plain memcpy.
  virtual void PrepareRead(const void* p, size_t len) {}
  virtual void PrepareWrite(void* p, size_t len) {}

  // The generation of the chunk containing `p`: bumped by every CPU write to a clean chunk and by
  // every Write. A copy made elsewhere at generation g is valid while Generation() == g, provided g
  // was read before the bytes. kNoGeneration while the chunk is writable or in a transition.
  virtual uint64_t Generation(const void* p) const = 0;
  // The generations of the `n` consecutive chunks from the one containing `p` (chunks past the
  // region's end, or outside any region, read 0) and, when `resident` is not null, whether each is
  // installed in the region now (T1: a copy of it is a memcpy). The default: none is resident.
  virtual void Generations(const void* p, size_t n, uint64_t* out, bool* resident) const {
    for (size_t i = 0; i < n; ++i) {
      out[i] = Generation(static_cast<const char*>(p) + i * chunk_size());
      if (resident) resident[i] = false;
    }
  }

  // Adopted chunks (DESIGN.md section 4: the slot a D2H copy landed in becomes the chunk's newest
  // copy, with no copy into the region). SetExternalCopies names the holder, once, before any
  // Adopt. Adopt: the `n` chunks from `p` (a chunk start) become external, their generations
  // bumped into gens[0..n) (kNoGeneration for a chunk that could not be adopted: write it
  // instead), and `registered()` runs while every one is still claimed. Attach gives an external
  // chunk at `gen` its bytes back (installed in T1 while the resident budget has room, else
  // encoded into the store; *installed says which); OK also when the chunk has moved on; an error
  // means the holder must keep its copy. Backends without adoption return ENOTSUP.
  virtual void SetExternalCopies(ExternalCopies* x) {}
  virtual Status Adopt(void* p, size_t n, uint64_t* gens, const std::function<void()>& registered) {
    return Status::Error(ENOTSUP, "this region backend does not adopt external copies");
  }
  virtual Status Attach(void* chunk_start, uint64_t gen, const void* bytes, bool* installed) {
    return Status::Error(ENOTSUP, "this region backend does not adopt external copies");
  }
  // Bytes the resident budget has left (UINT64_MAX without a limit). A snapshot.
  virtual uint64_t ResidentRoom() const { return UINT64_MAX; }

  // Pinned in place (DESIGN.md section 10): Hold makes the whole chunks of [p, p+len) resident,
  // writable and held -- never evicted, write-protected or adopted -- so that the caller may
  // register their pages with CUDA and copy straight from and to them; every older copy of them
  // becomes garbage. Unhold (once the pages are unregistered) makes them ordinary resident chunks
  // again. Backends that cannot return ENOTSUP (copies then go through T0 slots).
  virtual Status Hold(void* p, size_t len) {
    return Status::Error(ENOTSUP, "this region backend does not pin in place");
  }
  virtual Status Unhold(void* p, size_t len) {
    return Status::Error(ENOTSUP, "this region backend does not pin in place");
  }

  // The memory the backend's data occupies now (a snapshot), and the most resident bytes it may
  // keep (0 = no limit; lowering it makes the backend evict in the background). Backends without
  // tiers report nothing and ignore the limit.
  virtual BackendMemory Memory() const { return {}; }
  virtual void SetResidentLimit(uint64_t bytes) {}

  // T1 placement by the learned next use (null: CLOCK), and the CPU's faults for learning.
  // Each returns once no call of the previous oracle / observer is in progress. Backends without
  // tiers or faults ignore them.
  virtual void SetPlacementOracle(const policy::NextUseOracle* oracle) {}
  virtual void SetFaultObserver(FaultObserver observer) {}
  // Compresses the chunks of [p, p+len) out of T1 now. Backends without tiers return ENOTSUP.
  virtual Status EvictRange(const void* p, size_t len) {
    return Status::Error(ENOTSUP, "this region backend has no tiers to evict to");
  }
};

}  // namespace zrtier
