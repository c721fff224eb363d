#include "runtime/engine/fork.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "runtime/base/log.h"
#include "runtime/base/thread_name.h"
#include "runtime/engine/arena.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/region_map.h"
#include "runtime/engine/uffd.h"
#include "runtime/os/uffd_compat.h"

namespace zrtier {
namespace fork_support {
namespace {

// The registered engines. g_mu is held from the prepare handler to the parent or child handler,
// so Register/Unregister never race a fork.
std::mutex g_mu;
std::vector<Engine*>* g_engines = nullptr;  // guarded by g_mu; never freed (a fork may follow exit)
std::atomic<bool> g_in_child{false};
std::once_flag g_installed;

void Prepare() {
  g_mu.lock();
  if (!g_engines) return;
  for (Engine* e : *g_engines) e->ForkPrepare();
}

void Parent() {
  if (g_engines)
    for (auto it = g_engines->rbegin(); it != g_engines->rend(); ++it) (*it)->ForkParent();
  g_mu.unlock();
}

void Child() {
  if (g_engines && !g_engines->empty()) {
    g_in_child.store(true);
    for (auto it = g_engines->rbegin(); it != g_engines->rend(); ++it) (*it)->ForkChild();
  }
  g_mu.unlock();
}

// A chunk's request from a child and the answer's header, on a stream socket (a chunk is larger
// than a datagram may be); the answer is the header and, when status is 0, the chunk's bytes.
struct ChunkRequest {
  uint64_t region;  // the region's id at the fork; kNewConnection: a socket for a grandchild
  uint64_t addr;
  uint64_t len;
};
// A child about to fork asks its parent to serve its child too: the request carries that child's
// end of a new socketpair (SCM_RIGHTS); the answer is the header alone.
constexpr uint64_t kNewConnection = ~0ull;

struct ChunkAnswer {
  int32_t status;  // 0, or the errno of the parent's read
};

// Sends or receives all `n` bytes on the stream socket `fd`; false at its end or on an error.
bool SendAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k, n -= static_cast<size_t>(k);
  }
  return true;
}
bool RecvAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k, n -= static_cast<size_t>(k);
  }
  return true;
}

// Receives a request; a descriptor passed with it (SCM_RIGHTS) goes to *passed (else -1).
bool RecvRequest(int fd, ChunkRequest* req, int* passed) {
  *passed = -1;
  char control[CMSG_SPACE(sizeof(int))];
  iovec iov{req, sizeof(*req)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t k;
  do {
    k = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (k < 0 && errno == EINTR);
  if (k <= 0) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      memcpy(passed, CMSG_DATA(c), sizeof(int));
  return RecvAll(fd, reinterpret_cast<char*>(req) + k, sizeof(*req) - static_cast<size_t>(k));
}

// The child's fault server: one thread reading the child's userfaultfd, answering each fault with
// the chunk's bytes as the parent has them now. It never exits (the process's end takes it).
class ChildServer {
 public:
  ChildServer(ChildParts parts, int fd, bool poison)
      : p_(std::move(parts)), uffd_(p_.os, fd, poison) {
    std::sort(p_.regions.begin(), p_.regions.end(),
              [](const auto& a, const auto& b) { return a->base < b->base; });
    buf_ = static_cast<char*>(aligned_alloc(kPage, p_.chunk));
  }

  // Says that the thread runs (Started), for ServeChild (AwaitStart).
  void Started() {
    started_.store(true, std::memory_order_release);
    started_.notify_all();
  }
  void AwaitStart() { started_.wait(false, std::memory_order_acquire); }

  void Run() {
    for (;;) {
      uffd_msg msg[16];
      long n = p_.os->Read(uffd_.fd(), msg, sizeof(msg));
      if (n == -EINTR || n == -EAGAIN) continue;
      if (n <= 0) {
        Log(LogLevel::kError,
            "forked child: reading the userfaultfd failed (%s); faults on "
            "evicted managed memory are no longer served",
            ErrnoText(n).c_str());
        return;
      }
      for (size_t k = 0; k < static_cast<size_t>(n) / sizeof(uffd_msg); ++k)
        if (msg[k].event == UFFD_EVENT_PAGEFAULT) Serve(msg[k].arg.pagefault.address);
    }
  }

 private:
  Region* Find(uint64_t addr) const {
    const char* a = reinterpret_cast<const char*>(addr);
    auto it = std::upper_bound(p_.regions.begin(), p_.regions.end(), a,
                               [](const char* x, const auto& r) { return x < r->base; });
    if (it == p_.regions.begin()) return nullptr;
    Region* r = std::prev(it)->get();
    return a < r->base + r->size ? r : nullptr;
  }

  void Fail(uint64_t addr, const char* why) {
    Log(LogLevel::kError, "forked child: the chunk at %p cannot be read (%s): SIGBUS",
        reinterpret_cast<void*>(addr), why);
    uffd_.Poison(addr & ~(kPage - 1));
  }

  void Serve(uint64_t addr) {
    Region* r = Find(addr);
    if (!r) {  // not in a region live at the fork: freed memory
      Fail(addr, "outside any live region");
      return;
    }
    char* p = r->table.AddressOf(r->table.IndexOf(reinterpret_cast<void*>(addr)));
    Status st = p_.parent_fd >= 0
                    ? FetchFromParent(r->id, p)
                    : Status::Error(EIO, "the fork could not share the parent's memory with it");
    if (st.ok()) st = uffd_.Copy(p, buf_, p_.chunk, /*wp=*/false);
    if (!st.ok()) Fail(addr, st.ToString().c_str());
  }

  // Asks the parent for the chunk at `p` of region `region` (ParentServers) into buf_. (Sockets
  // are outside Os: a failure here is the parent's absence, reported like any unreadable chunk.)
  Status FetchFromParent(uint64_t region, char* p) {
    std::lock_guard<std::mutex> lock(*p_.parent_mu);
    const ChunkRequest req{region, reinterpret_cast<uint64_t>(p), p_.chunk};
    ChunkAnswer ans{};
    if (!SendAll(p_.parent_fd, &req, sizeof(req)) || !RecvAll(p_.parent_fd, &ans, sizeof(ans)))
      return Status::Error(EIO, "the parent is gone (its chunks cannot be fetched)");
    if (ans.status == ENXIO)
      return Status::Error(ENXIO, "its region was freed in the parent since the fork");
    if (ans.status != 0) return Status::Error(ans.status, "the parent could not read it");
    if (!RecvAll(p_.parent_fd, buf_, p_.chunk))
      return Status::Error(EIO, "the parent is gone (its chunks cannot be fetched)");
    return Status::Ok();
  }

  ChildParts p_;
  Uffd uffd_;
  char* buf_;
  std::atomic<bool> started_{false};
};

}  // namespace

Span LiveSpan(const RegionMap& regions) {
  char* lo = nullptr;
  char* hi = nullptr;
  regions.ForEachLocked([&](const std::shared_ptr<Region>& r) {
    if (!lo || r->base < lo) lo = r->base;
    if (r->base + r->reserved > hi) hi = r->base + r->reserved;
  });
  return {lo, static_cast<size_t>(hi - lo)};
}

void ChildSocket(int fds[2]) {
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0) return;
  Log(LogLevel::kError,
      "fork: no socket for the child (%s); it cannot read zrtier memory there (SIGBUS)",
      strerror(errno));
  fds[0] = fds[1] = -1;
}

bool MapInChild(Os* os, Span span) {
  int err = 0;
  void* m = os->Mmap(span.p, span.len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0, &err);
  if (m == span.p) return true;
  Log(LogLevel::kError,
      "forked child: mapping the parent's pinned memory failed (%s); it is inaccessible here "
      "(SIGSEGV)",
      strerror(err));
  return false;
}

bool Reconnect(int parent_fd, int fds[2]) {
  ChildSocket(fds);
  if (fds[0] < 0) return false;
  const ChunkRequest req{kNewConnection, 0, 0};
  iovec iov{const_cast<ChunkRequest*>(&req), sizeof(req)};
  char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fds[0], sizeof(int));
  ssize_t k;
  do {
    k = sendmsg(parent_fd, &msg, MSG_NOSIGNAL);
  } while (k < 0 && errno == EINTR);
  ChunkAnswer ans{EIO};
  const bool ok = k > 0 &&
                  SendAll(parent_fd, reinterpret_cast<const char*>(&req) + k,
                          sizeof(req) - static_cast<size_t>(k)) &&
                  RecvAll(parent_fd, &ans, sizeof(ans)) && ans.status == 0;
  close(fds[0]);  // the parent has its own copy now (or none: the request failed)
  fds[0] = -1;
  if (!ok) {
    close(fds[1]);
    fds[1] = -1;
    Log(LogLevel::kError,
        "forked child: its parent cannot serve a child of its own; that child cannot read the "
        "zrtier memory this process has not touched (SIGBUS)");
  }
  return ok;
}

ParentServers::~ParentServers() {
  std::vector<Server> servers;
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;  // a server's Start from now on closes its socket
    servers.swap(servers_);
  }
  for (Server& s : servers) shutdown(s.fd, SHUT_RDWR);  // the threads' recv returns 0
  for (Server& s : servers) {
    s.thread.join();
    close(s.fd);
  }
}

void ParentServers::Start(int fd) {
  std::lock_guard<std::mutex> l(mu_);
  if (stopping_) {
    close(fd);
    return;
  }
  // The servers of children that are gone are joined here.
  for (auto it = servers_.begin(); it != servers_.end();) {
    if (!it->done->load()) {
      ++it;
      continue;
    }
    it->thread.join();
    close(it->fd);
    it = servers_.erase(it);
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([this, fd, done] {
    NameThisThread("zr-fork-serve");
    Serve(fd);
    done->store(true);
  });
  servers_.push_back({fd, std::move(t), std::move(done)});
}

void ParentServers::Serve(int fd) {
  std::vector<char> buf(chunk_);
  for (;;) {
    ChunkRequest req{};
    int passed = -1;
    // The child exited or exec'd (or shutdown).
    if (!RecvRequest(fd, &req, &passed)) {
      if (passed >= 0) close(passed);
      return;
    }
    ChunkAnswer ans{0};
    if (req.region == kNewConnection) {  // the child's child, served from here too
      if (passed >= 0)
        Start(passed);
      else
        ans.status = EINVAL;
      if (!SendAll(fd, &ans, sizeof(ans))) return;
      continue;
    }
    if (passed >= 0) close(passed);
    if (req.len == 0 || req.len > chunk_) {
      ans.status = EINVAL;
    } else {
      Status st = read_(req.region, reinterpret_cast<const void*>(req.addr), req.len, buf.data());
      if (!st.ok()) ans.status = st.code() ? st.code() : EIO;
    }
    if (!SendAll(fd, &ans, sizeof(ans))) return;
    if (ans.status == 0 && !SendAll(fd, buf.data(), req.len)) return;
  }
}

void Register(Engine* e) {
  std::call_once(g_installed, [] { pthread_atfork(Prepare, Parent, Child); });
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_engines) g_engines = new std::vector<Engine*>;
  g_engines->push_back(e);
}

void Unregister(Engine* e) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_engines)
    g_engines->erase(std::remove(g_engines->begin(), g_engines->end(), e), g_engines->end());
}

bool InForkedChild() {
  return g_in_child.load(std::memory_order_relaxed);
}

void ServeChild(ChildParts parts) {
  char* lo = parts.span.p;
  char* hi = lo + parts.span.len;
  Os* os = parts.os;
  auto fail = [&](const char* what, long r) {
    Log(LogLevel::kError,
        "forked child: %s failed (%s): evicted managed memory is inaccessible here (SIGSEGV)", what,
        ErrnoText(r).c_str());
    os->Mprotect(lo, hi - lo, PROT_NONE);
  };
  long fd = os->Userfaultfd(O_CLOEXEC);
  if (fd < 0) return fail("userfaultfd", fd);
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = parts.arena->poison_supported() ? UFFD_FEATURE_POISON : 0;
  long r = os->Ioctl(static_cast<int>(fd), UFFDIO_API, &api);
  if (r < 0) {
    os->Close(static_cast<int>(fd));
    return fail("UFFDIO_API", r);
  }
  uffdio_register reg{};
  reg.range.start = reinterpret_cast<uint64_t>(lo);
  reg.range.len = static_cast<uint64_t>(hi - lo);
  reg.mode = UFFDIO_REGISTER_MODE_MISSING;
  r = os->Ioctl(static_cast<int>(fd), UFFDIO_REGISTER, &reg);
  if (r < 0) {
    os->Close(static_cast<int>(fd));
    return fail("UFFDIO_REGISTER", r);
  }
  const bool poison = parts.arena->poison_supported() && (api.features & UFFD_FEATURE_POISON);
  auto* server = new ChildServer(std::move(parts), static_cast<int>(fd), poison);  // never freed
  std::thread([server] {
    NameThisThread("zr-fork-child");
    server->Started();
    server->Run();
  }).detach();
  // The child's code runs once the thread has started: a thread's start-up may take allocator locks
  // that a fork does not hand over consistently (ASan's allocator does not take its own around a
  // fork), so a child that forks again at once would hand its child a lock held for ever.
  server->AwaitStart();
}

}  // namespace fork_support
}  // namespace zrtier
