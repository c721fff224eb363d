// RegionBackend: what the CUDA side of the shim needs from the engine -- carve and free regions,
// find the region of a pointer, read and publish chunk contents, and chunk generations. The real
// implementation forwards to Engine (MakeEngineBackend); unit tests of the copy paths may use a
// plain heap-backed one. Same contracts as the Engine methods of the same names (runtime/engine.h).
//
// Thread safety: every method may be called from any thread, including inside CUDA host
// functions (Read/Write/Generation never fault the caller and never call CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/base/status.h"
#include "runtime/engine.h"

namespace zrtier {

class RegionBackend {
 public:
  virtual ~RegionBackend() = default;
  virtual size_t chunk_size() const = 0;
  virtual Status Allocate(size_t size, RegionInfo* out) = 0;
  virtual Status Free(void* base) = 0;
  virtual bool Lookup(const void* p, RegionInfo* out) const = 0;
  virtual Status Read(const void* src, size_t len, void* dst, bool* zero) = 0;
  virtual Status Write(void* dst, const void* src, size_t len) = 0;
  // Engine::ReadChunk. The default (for backends whose memory cannot change unseen): the
  // generation, then the bytes.
  virtual Status ReadChunk(const void* chunk_start, void* dst, bool* zero, uint64_t* gen) {
    *gen = Generation(chunk_start);
    return Read(chunk_start, chunk_size(), dst, zero);
  }
  // Engine::PrepareRead / PrepareWrite (hints; the default does nothing).
  virtual void PrepareRead(const void* p, size_t len) {}
  virtual void PrepareWrite(void* p, size_t len) {}
  virtual uint64_t Generation(const void* p) const = 0;
  // Generation of `n` consecutive chunks from the one containing `p`, and, when `resident` is not
  // null, whether each is resident (Engine::Generations; the default: none is).
  virtual void Generations(const void* p, size_t n, uint64_t* out, bool* resident) const {
    for (size_t i = 0; i < n; ++i) {
      out[i] = Generation(static_cast<const char*>(p) + i * chunk_size());
      if (resident) resident[i] = false;
    }
  }
  // Engine::SetExternalCopies / Adopt / Attach. Backends without adoption return ENOTSUP from
  // Adopt (the D2H publish then writes the bytes into the region instead).
  virtual void SetExternalCopies(ExternalCopies* x) {}
  virtual Status Adopt(void* p, size_t n, uint64_t* gens, const std::function<void()>& registered) {
    return Status::Error(ENOTSUP, "this region backend does not adopt external copies");
  }
  // Engine::ResidentRoom (the default: no limit).
  virtual uint64_t ResidentRoom() const { return UINT64_MAX; }
  virtual Status Attach(void* chunk_start, uint64_t gen, const void* bytes, bool* installed) {
    return Status::Error(ENOTSUP, "this region backend does not adopt external copies");
  }
  // Engine::SetPlacementOracle / SetFaultObserver: T1 placement by the learned next use, and the
  // CPU's faults for learning. Backends without tiers or faults ignore them.
  virtual void SetPlacementOracle(const policy::NextUseOracle* oracle) {}
  virtual void SetFaultObserver(Engine::FaultObserver observer) {}
  // Compresses the chunks of [p, p+len) out of T1 now (Engine::EvictRange). Backends without
  // tiers return ENOTSUP.
  virtual Status EvictRange(const void* p, size_t len) {
    return Status::Error(ENOTSUP, "this region backend has no tiers to evict to");
  }
};

// Wraps an engine. Never null.
std::unique_ptr<RegionBackend> MakeEngineBackend(std::unique_ptr<Engine> engine);

}  // namespace zrtier
