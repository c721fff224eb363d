// Fork: a child forked from a process with live regions reads every region's chunk as the parent
// has it when the child first touches the chunk, whatever tier holds it then -- the semantics of
// the real runtime's pinned memory, which parent and child share -- and its writes stay its own;
// after its first touch of a chunk, the parent's writes do not reach it. A fork copies none of the
// regions' memory and no page table of it: a child pays only for the chunks it reads (DataLoader
// workers, which never read the parent's pinned batches, pay nothing), fork+exec and
// vfork/posix_spawn pay nothing (docs/decisions.md, "fork: the child fetches every chunk from the
// parent").
//
// How:
//   - pthread_atfork prepare (ForkPrepare): takes each engine's region map lock (shared), notes
//     the span of the arena its live regions cover, marks the whole arena MADV_DONTFORK (the
//     child inherits no page of it, so none is shared copy-on-write: the parent's later writes
//     never copy a page for a child, and a child's peak RSS holds only what it reads) and makes a
//     socketpair. parent: releases the lock and serves its end on a thread for that child
//     (ParentServers, reading each chunk with Engine::Read) until the child exits or execs.
//   - child: maps the span afresh, registers it with its own userfaultfd (MISSING) and starts one
//     thread (and waits until it runs) that answers each fault by fetching the chunk from the
//     parent; an address outside the live regions of the fork, a region the parent has freed
//     since, a parent that is gone: the page is poisoned (SIGBUS), never zeros.
//   - A child that forks again hands the parent a socket for its own child (Reconnect): its child
//     inherits the chunks it touched copy-on-write (its mapping of the span is ordinary memory)
//     and fetches the others from the first parent, as it would.
//
// The child must not use the engine (the shim turns itself off there: runtime/shim/process.cc):
// its threads do not exist in the child.
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
class Engine;
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

// A range of the arena.
struct Span {
  char* p;
  size_t len;
};

// The span from the first live region's base to the last one's end; len 0 if there is none.
// REQUIRES: the region map's lock (shared) is held.
Span LiveSpan(const RegionMap& regions);

// ForkPrepare's socketpair for the child: fds[0] the parent's end, fds[1] the child's. If none
// can be made, both are -1 and that is said: the child cannot read zrtier memory (SIGBUS).
void ChildSocket(int fds[2]);

// In the child, before ServeChild: maps `span` afresh (it was not inherited). False if that
// failed (the span is then left unmapped: a touch gets SIGSEGV).
bool MapInChild(Os* os, Span span);

// In a forked child about to fork again, whose socket to its parent is `parent_fd`: makes a
// socketpair for its child and hands one end to the parent, which serves that child too; fds[1]
// is the child's end (fds[0] is closed). False (both -1, said once) if that failed.
// REQUIRES: the caller holds the socket's lock (ChildParts::parent_mu).
bool Reconnect(int parent_fd, int fds[2]);

// The parent's servers of its children's chunk requests: one thread per child, reading the chunk
// with `read` (Engine::Read, after checking that the region of the fork is still live) and
// answering until the child closes its end (exit or exec); a child that forks starts another for
// its own child (Reconnect).
class ParentServers {
 public:
  // Reads `len` bytes at `src` of region `region` into `dst`; an error if that region is gone.
  using ReadFn = std::function<Status(uint64_t region, const void* src, size_t len, void* dst)>;
  ParentServers(size_t chunk, ReadFn read) : chunk_(chunk), read_(std::move(read)) {}
  // Shuts every connection down and joins the threads.
  ~ParentServers();
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
  bool stopping_ = false;        // guarded by mu_: the destructor runs
};

// For Engine::ForkChild: what the child's fault server needs.
struct ChildParts {
  Os* os;
  Arena* arena;
  size_t chunk;
  std::vector<std::shared_ptr<Region>> regions;  // the live regions of the fork (non-empty)
  Span span;                                     // LiveSpan of them, mapped afresh
  int parent_fd = -1;  // the socket to the parent's ParentServers; -1: none (every touch: SIGBUS)
  // Guards parent_fd, which the fault server and a fork of the child's own (Reconnect) both use.
  std::mutex* parent_mu = nullptr;
};

// In the child: registers `parts.span` with a new userfaultfd and starts the thread that serves
// its faults. If that fails, the span is made inaccessible (PROT_NONE: a touch gets SIGSEGV,
// never zeros) and the reason is said once.
void ServeChild(ChildParts parts);

}  // namespace fork_support
}  // namespace zrtier
