// Fork: a child forked from a process with live regions reads every region's bytes as they were at
// the fork, whatever tier held them (a region page, an owned T0 slot, the RAM store, zram, a spill
// file); its writes stay its own, and nothing the parent does after the fork (writes, evictions,
// frees) changes what it reads. Chunks pinned in place are the exception (below): the child reads
// them as the parent has them when it first touches them, as the real runtime's pinned memory,
// which parent and child share, reads. fork+exec and vfork/posix_spawn pay nothing for evicted or
// pinned data (docs/decisions.md, "fork: the child serves its own faults").
//
// How:
//   - The arena is inherited (no MADV_DONTFORK). The arena's userfaultfd has no
//     UFFD_FEATURE_EVENT_FORK, so the kernel drops the registration from the child's copy: pages
//     present at the fork are shared copy-on-write, and a missing page would read as zeros.
//   - pthread_atfork prepare (ForkPrepare, in this order): closes the ForkGate (chunk_table.h)
//     and waits until no chunk is in transition; takes each engine's region map lock (shared),
//     the holder's lock (the T0 pool) and the store's locks. The child inherits a consistent copy
//     of the chunk tables, the owned slots and the store. parent: releases them, reopens the gate
//     and wakes the parked faults.
//   - child: the store and holder locks are released (the region map's is left alone: the child
//     never changes the map); the gate stays closed (no transition ever runs in the child). If a
//     region holds a chunk whose bytes are not in its pages (stored or adopted), the child opens
//     its own userfaultfd, registers the span of the arena those regions cover (MISSING) and starts
//     one thread (and waits until it runs) that answers each fault from the child's copy of the
//     state: a store entry decoded (RAM: the inherited copy-on-write extents; zram and spill
//     files: pread on the inherited fds, ChunkStore::GetInChild), an owned slot (inherited
//     memory), zeros for a never-written chunk; anything else is poisoned (SIGBUS), never zeros.
//     Without such a chunk no fd and no thread is made.
//   - Block tiers keep the extents live at a fork until every child forked then has exited or
//     exec'd (store/fork_epochs.h); RAM store extents and region pages are copy-on-write, except
//     RAM store extents registered for DMA (GPU decode reads encodings there): those are
//     MADV_DONTFORK, like held chunks (below), and the child fetches a chunk whose store copy lies
//     there from the parent at its first touch (ChunkStore::GetInChild: EREMOTE), so it reads as
//     the parent has it then.
//   - Pinned in place (kHeld) chunks are not copied at the fork: the kernel copies every pinned
//     page for the child at once (it cannot share a DMA-pinned page copy-on-write), which made
//     each fork cost a copy of all pinned bytes (a DataLoader forking 8 workers: 8 copies). In
//     ForkPrepare the spans of held chunks are marked MADV_DONTFORK and a socketpair is made; the
//     parent serves it (HeldServers: one thread per child, until the child exits or execs), and
//     the child maps the spans afresh and fetches a held chunk from the parent the first time it
//     touches it (the parent reads it with Engine::Read, so a chunk freed or moved since is still
//     read safely). Like the real runtime's pinned memory (shared with the child), a held chunk
//     reads as the parent has it when the child first touches it, not as of the fork; after that
//     the child's copy is its own. A parent that is gone by then gives the child SIGBUS. A child
//     that forks again first fetches every held chunk it has not touched (and every chunk whose
//     store copy it did not inherit), so its child inherits them copy-on-write.
//
// The child must not use the engine (the shim turns itself off there: runtime/shim/process.cc):
// its threads do not exist in the child and every claim fails. A child that forks again does the
// same for its own child, from the same inherited state.
//
// Thread safety: Register/Unregister from any thread; they exclude a fork in progress.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "zrtier/status.h"

namespace zrtier {

class Arena;
class ChunkIo;
class ChunkStore;
class Engine;
class ExternalCopies;
class Os;
class RegionMap;
struct Region;

namespace fork_support {

// Makes `e` take part in every later fork (installs the pthread_atfork handlers once).
void Register(Engine* e);
// Stops that; a fork in progress is waited for. REQUIRES: e was registered.
void Unregister(Engine* e);
// True in a process forked from one with a registered engine.
bool InForkedChild();

// For Engine::ForkChild: what the child's fault server reads from (all inherited copies).
struct ChildParts {
  Os* os;
  Arena* arena;
  ChunkIo* io;
  ExternalCopies* holder;  // may be null
  size_t chunk;
  std::vector<std::shared_ptr<Region>> regions;  // the regions to serve (non-empty)
  int parent_fd = -1;  // the socket to the parent's HeldServers, for kHeld chunks; -1: none
};

// A span of consecutive kHeld chunks.
struct Span {
  char* p;
  size_t len;
};

// The spans of kHeld chunks of every region. REQUIRES: the region map's lock (shared) is held.
std::vector<Span> HeldSpans(const RegionMap& regions, size_t chunk);

// In a forked child: the spans of chunks whose store copy the child did not inherit
// (ChunkStore::InheritedInChild), which its fault server reads from the parent.
// REQUIRES: the region map's lock (shared) is held.
std::vector<Span> UninheritedSpans(const RegionMap& regions, size_t chunk, const ChunkStore& store);

// ForkPrepare's half of the held-chunk sharing: marks `spans` MADV_DONTFORK and makes the
// socketpair (fds[0] the parent's end, fds[1] the child's). False (nothing changed) if either
// fails: the fork then copies the held pages as the kernel does for any pinned page.
bool ShareHeld(Os* os, const std::vector<Span>& spans, int fds[2]);

// In the child, before ServeChild: maps `spans` afresh (they were not inherited). False if that
// failed (the spans are then left unmapped: a touch gets SIGSEGV).
bool MapHeldInChild(Os* os, const std::vector<Span>& spans);

// In a forked child about to fork again: reads a byte of every page of `spans`, so that the held
// chunks it has not touched are fetched from its parent now and its child inherits them.
void FetchHeld(const std::vector<Span>& spans);

// The parent's servers of its children's held-chunk requests: one thread per child, reading the
// chunk with `read` (Engine::Read) and answering until the child closes its end (exit or exec).
class HeldServers {
 public:
  using ReadFn = std::function<Status(const void* src, size_t len, void* dst)>;
  HeldServers(size_t chunk, ReadFn read) : chunk_(chunk), read_(std::move(read)) {}
  // Shuts every connection down and joins the threads.
  ~HeldServers();
  // Serves `fd` (the parent's end; owned from now on) on a new thread.
  void Start(int fd);

 private:
  struct Server {
    int fd;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void Serve(int fd);
  const size_t chunk_;
  const ReadFn read_;
  std::mutex mu_;
  std::vector<Server> servers_;  // guarded by mu_
};
// In the child: registers the span of the arena `parts.regions` cover with a new userfaultfd and
// starts the thread that serves its faults. If that fails, the span is made inaccessible
// (PROT_NONE: a touch gets SIGSEGV, never zeros) and the reason is said once.
void ServeChild(ChildParts parts);

}  // namespace fork_support
}  // namespace zrtier
