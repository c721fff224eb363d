// RegionIo: region bytes read and written without faults, for the copy path -- Read pins resident
// chunks or decodes stored ones straight into the destination; ReadChunk does that for a copy to be
// cached (write-protecting a dirty chunk first, so its copy can carry a generation); Write claims
// each chunk, merges partial chunks and installs or overwrites them (new generation, old store
// copy freed); PrepareRead/PrepareWrite change the protection of many chunks with one ioctl; and
// the chunks' generations. Contracts: RegionBackend (region_backend.h).
//
// Never faults the calling thread on region memory and never calls CUDA, so every method is safe
// inside a CUDA host function. Thread safety: any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/engine/chunk_io.h"
#include "runtime/engine/engine_parts.h"
#include "runtime/engine/external.h"
#include "runtime/engine/parked_faults.h"
#include "runtime/engine/region_map.h"
#include "runtime/engine/resident_budget.h"
#include "runtime/engine/uffd.h"
#include "zrtier/status.h"

namespace zrtier {

class RegionIo {
 public:
  // `external` is not owned and must outlive this object.
  RegionIo(const EngineParts& parts, ExternalChunks* external) : e_(parts), external_(external) {}

  Status Read(const void* src, size_t len, void* dst, bool* zero);
  Status ReadChunk(const void* chunk_start, void* dst, bool* zero, uint64_t* gen,
                   GpuEncodingSink* gpu = nullptr);
  Status Write(void* dst, const void* src, size_t len);
  Status WriteEncoded(void* chunk_start, const RegionBackend::ChunkEncoding* encs, size_t n);
  bool LeaseEncoding(const void* chunk_start, RegionBackend::EncodingLease* out);
  // PrepareRead (wp) and PrepareWrite (!wp): claims runs of consecutive eligible chunks and changes
  // each run with one ioctl. A chunk that cannot be claimed at once ends the run; it is left to
  // ReadChunk / Write.
  void Reprotect(const void* p, size_t len, bool wp);
  uint64_t Generation(const void* p) const;
  // RegionBackend::CpuUntouched (0 outside any region).
  size_t CpuUntouched(const void* chunk_start, size_t n) const;
  void Generations(const void* p, size_t n, uint64_t* out, bool* resident) const;

 private:
  // Copies bytes [off, off+n) of chunk `i` of `r` into `d` from whichever tier holds them;
  // `streaming`: `d` is a T0 slot, written with non-temporal stores (CopyStreaming for resident
  // bytes, the codec's streaming merge for stored ones). `gpu`: as ChunkIo::Decode's, for a whole
  // chunk read straight into `d`.
  Status ReadPart(Region* r, size_t i, size_t off, size_t n, char* d, bool streaming = false,
                  GpuEncodingSink* gpu = nullptr);
  // Write of the whole chunk `i` of `r` from `s` straight into the store, for a chunk that is not
  // resident while T1 is full: encoded, put, then claimed; one that became resident meanwhile is
  // written in place. *stored false (nothing changed): the codec or the store refused it, and
  // the caller installs it instead.
  Status WriteStored(Region* r, size_t i, const char* s, bool* stored);
  // WriteStored's second half (and WriteEncoded's): the chunk's encoding `enc` (enc_len 0: all
  // zero), already in the store as entry `h` (0 when enc_len is 0), becomes its store copy. A
  // chunk that became resident meanwhile is written in place from `s`, or where `s` is null, from
  // `enc` decoded. The entries no chunk refers to any more (its old copy; `h` where it was not
  // used) go to `garbage`, for the caller to free in one batch.
  Status StoreEncoded(Region* r, size_t i, const char* enc, size_t enc_len, StoreHandle h,
                      const char* s, bool* stored, std::vector<StoreHandle>* garbage);
  // Write of bytes [off, off+n) of chunk `i` (claimed by the caller in state word `was`), from `s`.
  Status WriteChunk(Region* r, size_t i, uint32_t was, size_t off, size_t n, const char* s);
  // Installs a chunk that was not resident (claimed in `was`): a whole one straight from `s`, a
  // partial one merged with its current content.
  Status InstallWritten(Region* r, size_t i, ChunkState was, size_t off, size_t n, const char* s);
  // Drops the installed units of chunk `i`, claimed from kPartial (DropPartial): it is then as a
  // claimed kStored chunk. On failure it is ended kPartial again and the error returned.
  Status LeavePartial(Region* r, size_t i);
  // Changes the protection of chunks [first, end) of `r`, claimed (kBusy) by the caller -- for !wp
  // with their generations already bumped -- with one ioctl, and ends each in its new state: wp,
  // clean (a copy may be cached; `cleaned` for the staging-buffer count); !wp, dirty with its
  // store copy freed. On failure each goes back to its old state. Returns the ioctl's result.
  long ReprotectClaimed(Region* r, size_t first, size_t end, bool wp);

  const EngineParts e_;
  ExternalChunks* external_;
};

}  // namespace zrtier
