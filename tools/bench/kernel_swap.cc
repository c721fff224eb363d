#include "tools/bench/kernel_swap.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/swap.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "runtime/os/os.h"
#include "runtime/store/zram_device.h"

namespace zrtier::tools {
namespace {

constexpr size_t kSwapPage = 4096;  // the swap header's page: the kernel's page size here

Status Errno(const std::string& what) {
  const int e = errno;
  return Status::Error(e, what + ": " + strerror(e));
}

bool ReadText(const std::string& path, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n < 0) return false;
  out->assign(buf, static_cast<size_t>(n));
  return true;
}

Status WriteText(const std::string& path, const std::string& text) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open " + path);
  ssize_t n = write(fd, text.data(), text.size());
  Status st = n == static_cast<ssize_t>(text.size()) ? Status::Ok() : Errno("write " + path);
  close(fd);
  return st;
}

// A version-1 swap signature over `bytes` of the device at `path` (what mkswap writes): the
// header's fields after 1 KiB of boot bits, "SWAPSPACE2" at the end of the first page.
Status WriteSwapHeader(const std::string& path, uint64_t bytes) {
  std::vector<char> page(kSwapPage, 0);
  const uint32_t version = 1, last_page = static_cast<uint32_t>(bytes / kSwapPage - 1);
  memcpy(&page[1024], &version, 4);
  memcpy(&page[1028], &last_page, 4);
  memcpy(&page[kSwapPage - 10], "SWAPSPACE2", 10);
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open " + path);
  Status st = Status::Ok();
  if (pwrite(fd, page.data(), page.size(), 0) != static_cast<ssize_t>(page.size()) || fsync(fd))
    st = Errno("write the swap signature to " + path);
  close(fd);
  return st;
}

// The unified hierarchy's mount if its memory controller is on, else "".
std::string UnifiedMemoryRoot() {
  for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
    std::string controllers;
    if (ReadText(std::string(root) + "/cgroup.controllers", &controllers) &&
        controllers.find("memory") != std::string::npos)
      return root;
  }
  return "";
}

}  // namespace

KernelSwap::KernelSwap() = default;

KernelSwap::~KernelSwap() {
  Stop();
}

Status KernelSwap::Start(uint64_t swap_bytes) {
  if (geteuid() != 0) return Status::Error(EPERM, "needs root (swapon, zram, a memory cgroup)");
  if (std::string why = ZramDevice::UnavailableReason(); !why.empty())
    return Status::Error(ENODEV, why);
  dev_ = std::make_unique<ZramDevice>(Os::Default());
  Status st = dev_->Claim("auto");
  if (st.ok()) {
    algorithm_ = dev_->ChooseAlgorithm();
    // lz4 is the usual choice for swap on zram (fast); zstd is the codec's rival on ratio only.
    for (const std::string& a : dev_->Algorithms())
      if (a == "lz4" && dev_->SetAlgorithm("lz4").ok()) algorithm_ = "lz4";
    st = dev_->SetDiskSize(swap_bytes / kSwapPage * kSwapPage);
  }
  if (st.ok()) st = WriteSwapHeader(dev_->path(), swap_bytes);
  if (st.ok()) {
    const int prio = (32767 << SWAP_FLAG_PRIO_SHIFT) & SWAP_FLAG_PRIO_MASK;  // before any other
    if (swapon(dev_->path().c_str(), SWAP_FLAG_PREFER | prio) != 0)
      st = Errno("swapon " + dev_->path());
    else
      swap_on_ = true;
  }
  if (st.ok()) {
    const std::string name = "zrtier-bench-" + std::to_string(getpid());
    std::string root = UnifiedMemoryRoot();
    v2_ = !root.empty();
    if (v2_) {
      // Children of the root get the memory controller only through its subtree_control.
      std::string sub;
      if (ReadText(root + "/cgroup.subtree_control", &sub) &&
          sub.find("memory") == std::string::npos)
        (void)WriteText(root + "/cgroup.subtree_control", "+memory");
    } else {
      root = "/sys/fs/cgroup/memory";
    }
    const std::string dir = root + "/" + name;
    if (mkdir(dir.c_str(), 0700) != 0)
      st = Errno("mkdir " + dir + " (no memory cgroup here?)");
    else
      cgroup_ = dir;
  }
  if (!st.ok()) Stop();
  return st;
}

Status KernelSwap::RunLimited(
    uint64_t resident, const std::function<int(int fd, const std::function<bool()>& limit)>& fn,
    std::string* out) {
  if (cgroup_.empty()) return Status::Error(EINVAL, "KernelSwap: not started");
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return Errno("pipe");
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return Errno("fork");
  }
  if (pid == 0) {
    close(pipefd[0]);
    const std::string usage_file = cgroup_ + (v2_ ? "/memory.current" : "/memory.usage_in_bytes");
    const std::string limit_file = cgroup_ + (v2_ ? "/memory.max" : "/memory.limit_in_bytes");
    std::string usage;
    if (!WriteText(cgroup_ + "/cgroup.procs", std::to_string(getpid())).ok() ||
        !ReadText(usage_file, &usage)) {
      fprintf(stderr, "zrtier bench: cannot join the cgroup %s: %s\n", cgroup_.c_str(),
              strerror(errno));
      _exit(3);
    }
    const uint64_t limit = strtoull(usage.c_str(), nullptr, 10) + resident;
    const int rc = fn(pipefd[1], [&] {
      // Writing a limit below the usage makes the kernel reclaim (swap out) down to it first.
      Status st = WriteText(limit_file, std::to_string(limit));
      if (!st.ok())
        fprintf(stderr, "zrtier bench: cannot limit the cgroup: %s\n", st.ToString().c_str());
      return st.ok();
    });
    close(pipefd[1]);
    _exit(rc);
  }
  close(pipefd[1]);
  out->clear();
  char buf[4096];
  for (;;) {
    ssize_t n = read(pipefd[0], buf, sizeof(buf));
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  close(pipefd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  return Status::Error(
      EIO, "the kernel-swap child " +
               (WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                  : "died of signal " + std::to_string(WTERMSIG(status))));
}

void KernelSwap::Stop() {
  if (!cgroup_.empty()) {
    rmdir(cgroup_.c_str());
    cgroup_.clear();
  }
  if (swap_on_ && dev_) {
    swapoff(dev_->path().c_str());
    swap_on_ = false;
  }
  dev_.reset();  // resets and hot-removes the device
}

}  // namespace zrtier::tools
