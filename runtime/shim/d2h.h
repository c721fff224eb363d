// D2HPath: device-to-host copies into a region. The GPU writes T0 slots only: each piece of the
// copy is a real copy into slots on the caller's stream with an event behind it; when the event
// watcher sees the piece land it hands the slots to the fill workers, which publish them -- a slot
// holding a whole chunk is adopted (RegionBackend::Adopt: the slot becomes the chunk's owned copy,
// nothing is copied), a partial chunk is merged with RegionBackend::Write. The stream -- and a
// cudaMemcpy or a stream synchronize after it -- completes only once every byte is published: it
// waits on a StreamFlags word the last publish sets, or where no flag can be had, on the copy's one
// host function, which waits for every piece. Host functions never call CUDA. While a piece is
// queued and not yet published its chunks are marked in PendingD2H (H2D copies of them then run
// in stream order).
//
// Thread safety: every method may be called from any thread concurrently.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "runtime/shim/copy_context.h"
#include "runtime/shim/write_back.h"

namespace zrtier {

class D2HPath {
 public:
  D2HPath(const CopyContext& ctx, WriteBack* write_back) : ctx_(ctx), write_back_(write_back) {}
  // Deletes the finished publish groups. REQUIRES: every copy's stream has completed.
  ~D2HPath() { ReapRetired(/*all=*/true); }

  // Copies `n` bytes of device memory `src` into [dst, dst+n) (inside region `r`) on `stream`.
  cudaError_t Copy(char* dst, const RegionInfo& r, const void* src, size_t n, cudaStream_t stream);
  // Whether copies end their stream with a wait on a StreamFlags word (else a host function).
  bool ends_on_flags() const { return ctx_.flags->available(); }

 private:
  struct Group;
  struct Task;
  class Copier;

  // Hands a landed piece to the fill workers (from the event watcher, or inline).
  void StartPublish(Task* task);
  // The piece's work items: runs of whole consecutive chunks adopted at once, runs of
  // GPU-encoded chunks stored at once (split evenly over `workers` threads), or single writes.
  static void PlanItems(Task* task, size_t workers);
  // Publishes ops [i, i+n) of `task` (whole consecutive chunks) by adoption: their slots become
  // the chunks' owned copies; a chunk the backend does not adopt is written instead.
  void AdoptOps(Task* task, size_t i, size_t n);
  // Writes op `i` of `task` into the region (RegionBackend::Write).
  void WriteOp(Task* task, size_t i);
  // Publishes ops [i, i+n) of `task`, whole chunks encoded on the GPU: their encodings are stored
  // (RegionBackend::WriteEncoded, consecutive chunks in one call), or, where the kernel wrote a
  // chunk's raw bytes, they are written.
  void WriteEncodedOps(Task* task, size_t i, size_t n);
  // The piece's last step, once every item ran: written chunks become clean cached copies, the
  // chunks are unmarked, the group loses the piece's reference, the slots are released.
  void EndPiece(Task* task);
  static void CUDART_CB EndFn(void* group);
  // Drops one reference of a copy's group; the last one ends a group whose stream waits on a
  // flag (FinishGroup). A group ended by EndFn needs nothing here.
  void Unref(Group* group);
  // Ends a flag-waiting group: releases its stream, retires it.
  void FinishGroup(Group* group);
  // Deletes retired groups whose publish batches have all returned.
  void ReapRetired(bool all);

  CopyContext ctx_;
  WriteBack* write_back_;
  std::mutex retired_mu_;        // guards retired_
  std::vector<Group*> retired_;  // finished groups, deleted by ReapRetired
};

}  // namespace zrtier
