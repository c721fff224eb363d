// Fork: a child forked from a process with live regions reads every region's bytes as they were at
// the fork, whatever tier held them (a region page, an owned T0 slot, the RAM store, zram, a spill
// file); its writes stay its own, and nothing the parent does after the fork (writes, evictions,
// frees) changes what it reads -- as with the real runtime's pinned memory. fork+exec and
// vfork/posix_spawn pay nothing for evicted data (docs/decisions.md, "fork: the child serves its
// own faults").
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
//     exec'd (store/fork_epochs.h); RAM store extents and region pages are copy-on-write.
//
// The child must not use the engine (the shim turns itself off there: runtime/shim/process.cc):
// its threads do not exist in the child and every claim fails. A child that forks again does the
// same for its own child, from the same inherited state.
//
// Thread safety: Register/Unregister from any thread; they exclude a fork in progress.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace zrtier {

class Arena;
class ChunkIo;
class Engine;
class ExternalCopies;
class Os;
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
};
// In the child: registers the span of the arena `parts.regions` cover with a new userfaultfd and
// starts the thread that serves its faults. If that fails, the span is made inaccessible
// (PROT_NONE: a touch gets SIGSEGV, never zeros) and the reason is said once.
void ServeChild(ChildParts parts);

}  // namespace fork_support
}  // namespace zrtier
