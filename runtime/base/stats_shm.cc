#include "runtime/base/stats_shm.h"

#include "zrtier/options.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <thread>

#include "runtime/base/log.h"
#include "runtime/base/thread_name.h"
#include "runtime/os/os.h"

namespace zrtier {
namespace {

// Publishing state. g_publish_mu serializes PublishStats/UnpublishStats; g_path is written under it
// and read by UnpublishStats (also under it).
std::mutex g_publish_mu;
bool g_published = false;
char g_path[256];

void HeartbeatLoop() {
  for (;;) {
    sleep(1);
    Stats()->heartbeat_unix_ns.store(RealtimeNs(), std::memory_order_relaxed);
  }
}

// In a forked child: stop writing into the parent's block, and never unlink the parent's file.
void AtForkChild() {
  g_published = false;
  g_path[0] = '\0';
  auto* local = new StatsBlock();
  InitStatsBlock(local);
  InstallStatsBlock(local);
}

void AtExitUnpublish() {
  UnpublishStats();
}

// Process start time (CLOCK_REALTIME ns) from /proc/<pid>/stat and /proc/stat btime; 0 if unknown.
uint64_t ProcessStartUnixNs(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = fopen(path, "re");
  if (!f) return 0;
  char buf[1024];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  // Fields after the command name (which may contain spaces) start after the last ')'.
  char* p = strrchr(buf, ')');
  if (!p) return 0;
  p += 2;  // state field
  unsigned long long starttime = 0;
  // Field 3 is state; starttime is field 22, i.e. the 20th after the state.
  for (int field = 3; field < 22 && *p; ++field) {
    p = strchr(p, ' ');
    if (!p) return 0;
    ++p;
  }
  starttime = strtoull(p, nullptr, 10);
  FILE* s = fopen("/proc/stat", "re");
  if (!s) return 0;
  unsigned long long btime = 0;
  char line[256];
  while (fgets(line, sizeof(line), s))
    if (sscanf(line, "btime %llu", &btime) == 1) break;
  fclose(s);
  if (btime == 0) return 0;
  long hz = sysconf(_SC_CLK_TCK);
  if (hz <= 0) hz = 100;
  return btime * 1000000000ull + starttime * (1000000000ull / static_cast<uint64_t>(hz));
}

}  // namespace

uint64_t EstimatedHistSumNs(const uint64_t (&buckets)[kHistBuckets]) {
  double sum = static_cast<double>(buckets[0]);
  for (int b = 1; b < kHistBuckets; ++b)
    sum += static_cast<double>(buckets[b]) * 1.5 * std::ldexp(1.0, b);
  return static_cast<uint64_t>(sum);
}

uint64_t RealtimeNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::string StatsDir() {
  const std::string dir =
      Options::FromEnvironment([](const std::string&) {}).String(Opt::kTestStatsDir);
  return dir.empty() ? "/dev/shm" : dir;
}

std::string StatsPath(const std::string& dir, pid_t pid) {
  return dir + "/zrtier." + std::to_string(pid);
}

namespace {

// The header: what a reader checks before it trusts the rest (magic, version, size, ...).
constexpr size_t kHeaderBytes = offsetof(StatsBlock, heartbeat_unix_ns);
// Rounds of re-reading for region rows that were being written during a read.
constexpr int kRowRounds = 64;
// Whole copies attempted while the file changes size under the reader.
constexpr int kCopyAttempts = 4;

// A block of another pid namespace counts as live while its heartbeat (about once a second) is
// younger than this.
constexpr uint64_t kForeignHeartbeatNs = 10ull * 1000000000ull;

// Reads exactly `len` bytes at `off`; false on a short read (the file shrank) or an error.
bool PreadAll(int fd, void* buf, size_t len, off_t off) {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = pread(fd, p, len, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    off += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

// Opens `path` for reading without following a symlink and without blocking (a FIFO, a lease),
// and accepts only a regular file; *st is its fstat.
Status OpenBlockFile(const std::string& path, int* fd, struct stat* st) {
  int f = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (f < 0) {
    int e = errno;
    if (e == ELOOP) return Status::Error(e, path + ": a symbolic link, not a statistics block");
    return Status::Error(e, "cannot open " + path + ": " + strerror(e));
  }
  if (fstat(f, st) != 0) {
    int e = errno;
    close(f);
    return Status::Error(e, "cannot stat " + path);
  }
  if (!S_ISREG(st->st_mode)) {
    close(f);
    return Status::Error(EINVAL, path + ": not a regular file, not a statistics block");
  }
  *fd = f;
  return Status::Ok();
}

// What an older block lacks: version 22 ends its values before d2h_gpu_wait_ns, version 21 before
// d2h_gpu_encoded_bytes, version 20
// before pinned_for_good_bytes, version 19
// before store_pinned_bytes, version 18
// before t1_kept_bytes, version 17 before
// h2d_gpu_launches, version 16
// before partial_restores, version 15
// before h2d_gpu_decoded_bytes, versions 13 and 14 before checksum_errors, and version 13's
// histograms have no sum_ns word (each is kHistBuckets words), so what follows sits earlier.
struct Layout {
  int values = kStatCount;
  bool sums = true;
};
Layout LayoutOf(uint32_t version) {
  Layout l;
  if (version < 24) l.values = static_cast<int>(Stat::store_idle_bytes);
  if (version < 23) l.values = static_cast<int>(Stat::d2h_gpu_wait_ns);
  if (version < 22) l.values = static_cast<int>(Stat::d2h_gpu_encoded_bytes);
  if (version < 21) l.values = static_cast<int>(Stat::pinned_for_good_bytes);
  if (version < 20) l.values = static_cast<int>(Stat::store_pinned_bytes);
  if (version < 19) l.values = static_cast<int>(Stat::t1_kept_bytes);
  if (version < 18) l.values = static_cast<int>(Stat::h2d_gpu_launches);
  if (version < 17) l.values = static_cast<int>(Stat::partial_restores);
  if (version < 16) l.values = static_cast<int>(Stat::h2d_gpu_decoded_bytes);
  if (version < 15) l.values = static_cast<int>(Stat::checksum_errors);
  if (version < 14) l.sums = false;
  return l;
}

// The size of a block of `version`, 0 for a version this reader does not know.
size_t BlockSizeOf(uint32_t version) {
  if (version == kStatsVersion) return sizeof(StatsBlock);
  if (version < kStatsOldestReadable || version > kStatsVersion) return 0;
  const Layout l = LayoutOf(version);
  return offsetof(StatsBlock, values) + l.values * sizeof(uint64_t) +
         kHistCount * (kHistBuckets + (l.sums ? 1 : 0)) * sizeof(uint64_t) +
         sizeof(StatsBlock::regions);
}
static_assert(offsetof(StatsBlock, values) + kStatCount * sizeof(uint64_t) +
                      kHistCount * (kHistBuckets + 1) * sizeof(uint64_t) +
                      sizeof(StatsBlock::regions) ==
                  sizeof(StatsBlock),
              "StatsBlock has padding: BlockSizeOf's layouts would be wrong");

Status CheckHeader(const StatsBlock& b, off_t file_size, const std::string& path) {
  if (b.magic != kStatsMagic)
    return Status::Error(EINVAL, path + ": not a zrtier statistics block (bad magic)");
  const size_t want = BlockSizeOf(b.version);
  if (want == 0)
    return Status::Error(EPROTO, path + ": written by zrtier stats version " +
                                     std::to_string(b.version) + ", this reader knows " +
                                     std::to_string(kStatsOldestReadable) + " to " +
                                     std::to_string(kStatsVersion));
  if (b.size != want || file_size != static_cast<off_t>(want))
    return Status::Error(EPROTO, path + ": block size " + std::to_string(b.size) + " (file " +
                                     std::to_string(file_size) + "), expected " +
                                     std::to_string(want) + " for version " +
                                     std::to_string(b.version));
  return Status::Ok();
}

// Converts `raw`, a whole block of `version` (checked by CheckHeader), into the current layout.
// What an older block lacks (LayoutOf) is left 0: counters added since, histogram sums.
void ToCurrentLayout(const char* raw, uint32_t version, StatsBlock* out) {
  if (version == kStatsVersion) {
    memcpy(static_cast<void*>(out), raw, sizeof(StatsBlock));
    return;
  }
  const Layout l = LayoutOf(version);
  constexpr size_t kValuesAt = offsetof(StatsBlock, values);
  memcpy(static_cast<void*>(out), raw, kValuesAt);
  memcpy(static_cast<void*>(out->values), raw + kValuesAt, l.values * sizeof(uint64_t));
  for (int i = l.values; i < kStatCount; ++i) out->values[i].store(0, std::memory_order_relaxed);
  size_t at = kValuesAt + l.values * sizeof(uint64_t);
  constexpr size_t kBucketBytes = kHistBuckets * sizeof(uint64_t);
  for (int h = 0; h < kHistCount; ++h) {
    memcpy(static_cast<void*>(out->hist[h].buckets), raw + at, kBucketBytes);
    at += kBucketBytes;
    uint64_t sum = 0;
    if (l.sums) {
      memcpy(&sum, raw + at, sizeof(sum));
      at += sizeof(sum);
    }
    out->hist[h].sum_ns.store(sum, std::memory_order_relaxed);
  }
  memcpy(static_cast<void*>(out->regions), raw + at, sizeof(out->regions));
}

// Copies the block open at `fd` into *out with pread (never mapped: a file truncated meanwhile
// gives a short read, not SIGBUS). Values, histograms and the header come from one copy; a region
// row is taken from a copy only if its sequence word was even and unchanged in the copies read just
// before and just after it (no write began or ended in between: a seqlock whose reads are whole
// preads); rows that never hold still are left out. A short read is retried, then EAGAIN.
Status CopyBlock(int fd, const struct stat& st, const std::string& path, StatsSnapshot* out) {
  if (static_cast<size_t>(st.st_size) < kHeaderBytes)
    return Status::Error(EINVAL, path + ": not a zrtier statistics block (too short)");
  std::unique_ptr<StatsBlock> header(new StatsBlock());
  if (!PreadAll(fd, header.get(), kHeaderBytes, 0))
    return Status::Error(EINVAL, path + ": not a zrtier statistics block (too short)");
  ZRTIER_RETURN_IF_ERROR(CheckHeader(*header, st.st_size, path));

  // Each copy is read in the writer's layout (`raw`) and converted into the current one.
  const uint32_t version = header->version;
  const size_t size = BlockSizeOf(version);
  std::unique_ptr<char[]> raw(new char[size]);
  std::unique_ptr<StatsBlock[]> copies(new StatsBlock[3]());
  StatsBlock* before = &copies[0];
  StatsBlock* cur = &copies[1];
  StatsBlock* after = &copies[2];
  auto read = [&](StatsBlock* b) {
    if (!PreadAll(fd, raw.get(), size, 0)) return false;
    const auto* h = reinterpret_cast<const StatsBlock*>(raw.get());
    if (h->version != version) return false;  // replaced by a block of another version meanwhile
    ToCurrentLayout(raw.get(), version, b);
    return true;
  };
  bool whole = false;
  for (int attempt = 0; attempt < kCopyAttempts && !whole; ++attempt)
    whole = read(before) && read(cur) && read(after) && CheckHeader(*cur, st.st_size, path).ok();
  if (!whole)
    return Status::Error(EAGAIN, path + ": changed while being read (truncated?); skipped");

  out->pid = cur->pid;
  out->pid_ns = cur->pid_ns;
  out->version = cur->version;
  out->start_unix_ns = cur->start_unix_ns;
  out->heartbeat_unix_ns = cur->heartbeat_unix_ns.load(std::memory_order_relaxed);
  out->taken_unix_ns = RealtimeNs();
  out->cmdline.assign(cur->cmdline, strnlen(cur->cmdline, sizeof(cur->cmdline)));
  for (int i = 0; i < kStatCount; ++i)
    out->values[i] = cur->values[i].load(std::memory_order_relaxed);
  for (int h = 0; h < kHistCount; ++h) {
    for (int k = 0; k < kHistBuckets; ++k)
      out->hist[h][k] = cur->hist[h].buckets[k].load(std::memory_order_relaxed);
    out->hist_sum_ns[h] = version >= 14 ? cur->hist[h].sum_ns.load(std::memory_order_relaxed)
                                        : EstimatedHistSumNs(out->hist[h]);
  }
  out->hist_sum_estimated = version < 14;

  StatsSnapshot::Region rows[kStatsMaxRegions];
  bool taken[kStatsMaxRegions] = {};
  int left = kStatsMaxRegions;
  for (int round = 0; left > 0 && round < kRowRounds; ++round) {
    if (round > 0) {
      // The copy read last was read before the next `cur` is: it is the new `before`.
      std::swap(before, after);
      if (round >= 4) sched_yield();
      if (!read(cur) || !read(after)) break;  // shrank meanwhile: the rows left are left out
    }
    for (int i = 0; i < kStatsMaxRegions; ++i) {
      if (taken[i]) continue;
      uint64_t s1 = before->regions[i].seq.load(std::memory_order_relaxed);
      uint64_t s2 = after->regions[i].seq.load(std::memory_order_relaxed);
      if ((s1 & 1) || s1 != s2) continue;
      const StatsRegionRow& row = cur->regions[i];
      rows[i] = {row.base.load(std::memory_order_relaxed), row.size.load(std::memory_order_relaxed),
                 row.resident_bytes.load(std::memory_order_relaxed),
                 row.stored_raw_bytes.load(std::memory_order_relaxed),
                 row.stored_bytes.load(std::memory_order_relaxed)};
      taken[i] = true;
      --left;
    }
  }
  out->regions.clear();
  for (int i = 0; i < kStatsMaxRegions; ++i)
    if (taken[i] && rows[i].base != 0 && rows[i].size != 0) out->regions.push_back(rows[i]);
  return Status::Ok();
}

// True if the block was written in this process's pid namespace, so that its pid is one of ours.
bool SameNamespace(const StatsSnapshot& s) {
  return s.pid_ns != 0 && s.pid_ns == CurrentPidNamespace();
}

// True if process `pid` (of our namespace) runs with `uid` as its real, effective, saved or file
// system uid (/proc/<pid>/status).
bool ProcessHasUid(pid_t pid, uid_t uid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/status", static_cast<int>(pid));
  FILE* f = fopen(path, "re");
  if (!f) return false;
  char line[256];
  bool has = false;
  while (fgets(line, sizeof(line), f)) {
    unsigned long ids[4];
    if (sscanf(line, "Uid: %lu %lu %lu %lu", &ids[0], &ids[1], &ids[2], &ids[3]) == 4) {
      for (unsigned long id : ids) has = has || id == uid;
      break;
    }
  }
  fclose(f);
  return has;
}

// Opens and copies the block at `path`; *st is the file's fstat.
Status ReadBlock(const std::string& path, StatsSnapshot* out, struct stat* st) {
  int fd = -1;
  ZRTIER_RETURN_IF_ERROR(OpenBlockFile(path, &fd, st));
  Status s = CopyBlock(fd, *st, path, out);
  close(fd);
  return s;
}

// Why the file at `path` (there before we created ours) may not be replaced: "" when it is a
// statistics block of this zrtier version, of our user, written in our pid namespace by a process
// with our pid -- which, as we hold that pid now, is dead. Everything else (another user's file, a
// symlink, a FIFO, a block of another namespace or version, anything that is no block) is left
// alone. On "", *dev and *ino identify the checked file.
std::string WhyNotStale(const std::string& path, dev_t* dev, ino_t* ino) {
  StatsSnapshot snap;
  struct stat st;
  Status s = ReadBlock(path, &snap, &st);
  if (!s.ok()) return s.message();
  if (st.st_uid != geteuid()) return "owned by uid " + std::to_string(st.st_uid);
  if (!SameNamespace(snap)) return "written in another pid namespace";
  if (snap.pid != getpid()) return "the block of pid " + std::to_string(snap.pid);
  *dev = st.st_dev;
  *ino = st.st_ino;
  return "";
}

}  // namespace

uint32_t CurrentPidNamespace() {
  struct stat st;
  if (stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint32_t>(st.st_ino);
}

Status PublishStats(Os* os) {
  if (os == nullptr) os = Os::Default();
  std::lock_guard<std::mutex> lock(g_publish_mu);
  if (g_published) return Status::Ok();
  std::string path = StatsPath(StatsDir(), getpid());
  if (path.size() >= sizeof(g_path))
    return Status::Error(ENAMETOOLONG, "stats path too long: " + path);
  // Only a file this call creates is used: O_EXCL (and O_NOFOLLOW) refuse whatever is at the path
  // already -- a symlink to a file of ours, a file another user could truncate under our mapping.
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC;
  long fd = os->Open(path.c_str(), flags, 0600);
  if (fd == -EEXIST) {
    dev_t dev = 0;
    ino_t ino = 0;
    std::string why = WhyNotStale(path, &dev, &ino);
    if (!why.empty())
      return Status::Error(EEXIST, path + " exists and is not a stale statistics block of this " +
                                       "user (" + why + "): statistics are not published");
    // Still the file we checked (only its owner or root can replace it in a sticky /dev/shm).
    struct stat st;
    if (lstat(path.c_str(), &st) == 0 && st.st_dev == dev && st.st_ino == ino)
      os->Unlink(path.c_str());
    fd = os->Open(path.c_str(), flags, 0600);
  }
  if (fd < 0)
    return Status::Error(static_cast<int>(-fd),
                         "cannot create " + path + " (is /dev/shm mounted and writable?)");
  struct stat st;
  if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      st.st_nlink != 1 || st.st_size != 0) {
    os->Close(static_cast<int>(fd));
    return Status::Error(EEXIST,
                         path + " is not the file just created: statistics are not published");
  }
  // Blocks allocated now, not at first touch: a full /dev/shm fails here, not with SIGBUS later.
  long r = os->Fallocate(static_cast<int>(fd), 0, 0, sizeof(StatsBlock));
  if (r == -EOPNOTSUPP) r = os->Ftruncate(static_cast<int>(fd), sizeof(StatsBlock));
  if (r < 0) {
    os->Close(static_cast<int>(fd));
    os->Unlink(path.c_str());
    return Status::Error(static_cast<int>(-r), "cannot size " + path);
  }
  int err = 0;
  void* mem = os->Mmap(nullptr, sizeof(StatsBlock), PROT_READ | PROT_WRITE, MAP_SHARED,
                       static_cast<int>(fd), 0, &err);
  os->Close(static_cast<int>(fd));
  if (mem == MAP_FAILED) {
    os->Unlink(path.c_str());
    return Status::Error(err, "cannot map " + path);
  }
  // The file is zero-filled (fallocate, ftruncate): a zero block is what InitStatsBlock expects.
  // The magic is written last so a reader never accepts a half-initialized header.
  auto* block = static_cast<StatsBlock*>(mem);
  InitStatsBlock(block);
  uint64_t magic = block->magic;
  __atomic_store_n(&block->magic, 0, __ATOMIC_RELAXED);
  // Region rows claimed before publishing move along with the counters.
  StatsBlock* old = Stats();
  for (int i = 0; i < kStatsMaxRegions; ++i) {
    StatsRegionRow& from = old->regions[i];
    StatsRegionRow& to = block->regions[i];
    to.base.store(from.base.load(std::memory_order_relaxed), std::memory_order_relaxed);
    to.resident_bytes.store(from.resident_bytes.load(std::memory_order_relaxed),
                            std::memory_order_relaxed);
    to.stored_raw_bytes.store(from.stored_raw_bytes.load(std::memory_order_relaxed),
                              std::memory_order_relaxed);
    to.stored_bytes.store(from.stored_bytes.load(std::memory_order_relaxed),
                          std::memory_order_relaxed);
    to.size.store(from.size.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  InstallStatsBlock(block);
  __atomic_store_n(&block->magic, magic, __ATOMIC_RELEASE);
  memcpy(g_path, path.c_str(), path.size() + 1);
  g_published = true;

  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(nullptr, nullptr, AtForkChild);
    atexit(AtExitUnpublish);
    std::thread([] {
      NameThisThread("zr-stats");
      HeartbeatLoop();
    }).detach();
  });
  Log(LogLevel::kInfo, "statistics published in %s", g_path);
  return Status::Ok();
}

void UnpublishStats() {
  std::lock_guard<std::mutex> lock(g_publish_mu);
  if (!g_published) return;
  Os::Default()->Unlink(g_path);
  g_published = false;
}

std::string PublishedStatsPath() {
  std::lock_guard<std::mutex> lock(g_publish_mu);
  return g_published ? std::string(g_path) : std::string();
}

Status ReadStatsFile(const std::string& path, StatsSnapshot* out) {
  struct stat st;
  ZRTIER_RETURN_IF_ERROR(ReadBlock(path, out, &st));
  if (st.st_uid == geteuid() || (SameNamespace(*out) && ProcessHasUid(out->pid, st.st_uid)))
    return Status::Ok();
  return Status::Error(EPERM, path + ": owned by uid " + std::to_string(st.st_uid) +
                                  ", neither this user nor the owner of process " +
                                  std::to_string(out->pid));
}

Status ReadStats(pid_t pid, StatsSnapshot* out, const std::string& dir) {
  return ReadStatsFile(StatsPath(dir, pid), out);
}

std::vector<pid_t> ListStatsPids(const std::string& dir) {
  std::vector<pid_t> pids;
  DIR* d = opendir(dir.c_str());
  if (!d) return pids;
  while (dirent* e = readdir(d)) {
    const char* name = e->d_name;
    if (strncmp(name, "zrtier.", 7) != 0) continue;
    char* end = nullptr;
    long pid = strtol(name + 7, &end, 10);
    if (end == name + 7 || *end != '\0' || pid <= 0) continue;
    pids.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  std::sort(pids.begin(), pids.end());
  return pids;
}

bool StatsProcessGone(pid_t pid, uint64_t start_unix_ns) {
  if (pid <= 0) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  uint64_t proc_start = ProcessStartUnixNs(pid);
  // btime has one-second resolution: allow 2 s of slack. A block is created after its process
  // started, so a process that started clearly later than the block is a reused pid.
  return proc_start != 0 && start_unix_ns != 0 && proc_start > start_unix_ns + 2000000000ull;
}

namespace {

// What a reader makes of the file of `pid` in `dir`.
enum class Verdict { kLive, kDead, kSkip };

// Reads the file named for `pid` and judges it: kLive (shown), kDead (a block of ours whose
// process is gone: it may be deleted), kSkip (not shown, never deleted; *why says why when that is
// worth a line). A block of another pid namespace is never judged by its pid: it is shown while
// its heartbeat is fresh and it is ours, and is never dead.
Verdict Judge(const std::string& dir, pid_t pid, StatsSnapshot* snap, struct stat* st,
              std::string* why) {
  const std::string path = StatsPath(dir, pid);
  Status s = ReadBlock(path, snap, st);
  if (!s.ok()) {
    // Gone meanwhile, or another user's block this user may not read: nothing to say.
    if (s.code() != ENOENT && s.code() != EACCES) *why = s.ToString();
    return Verdict::kSkip;
  }
  const bool ours = st->st_uid == geteuid();
  if (!SameNamespace(*snap)) {
    bool fresh = snap->heartbeat_unix_ns + kForeignHeartbeatNs > snap->taken_unix_ns;
    return ours && fresh ? Verdict::kLive : Verdict::kSkip;
  }
  if (snap->pid != pid) {
    *why = path + ": the block of pid " + std::to_string(snap->pid) + ", skipped";
    return Verdict::kSkip;
  }
  if (StatsProcessGone(pid, snap->start_unix_ns)) {
    // The start times also disagree when the wall clock was stepped after the block was made (a
    // virtual machine's clock set after boot, NTP): a running pid whose block's heartbeat is fresh
    // is that block's writer, not a reuse of its pid (a reuse shows at most until the heartbeat is
    // stale).
    const bool fresh = snap->heartbeat_unix_ns + kForeignHeartbeatNs > snap->taken_unix_ns;
    if (!fresh || (kill(pid, 0) != 0 && errno == ESRCH))
      return ours ? Verdict::kDead : Verdict::kSkip;
  }
  if (!ours && !ProcessHasUid(pid, st->st_uid)) {
    *why = path + ": owned by uid " + std::to_string(st->st_uid) +
           ", neither this user nor the owner of process " + std::to_string(pid) + ", skipped";
    return Verdict::kSkip;
  }
  return Verdict::kLive;
}

// Unlinks `path` if it still is the regular file of ours that was judged (`judged`): a name
// replaced meanwhile is left alone. True if unlinked.
bool UnlinkIfSame(const std::string& path, const struct stat& judged) {
  struct stat now;
  if (lstat(path.c_str(), &now) != 0 || !S_ISREG(now.st_mode) || now.st_uid != geteuid() ||
      now.st_dev != judged.st_dev || now.st_ino != judged.st_ino)
    return false;
  return Os::Default()->Unlink(path.c_str()) == 0;
}

}  // namespace

std::vector<StatsSnapshot> ReadAllStats(bool clean_stale, std::vector<std::string>* errors,
                                        const std::string& dir) {
  std::vector<StatsSnapshot> result;
  for (pid_t pid : ListStatsPids(dir)) {
    StatsSnapshot snap;
    struct stat st;
    std::string why;
    switch (Judge(dir, pid, &snap, &st, &why)) {
      case Verdict::kLive:
        result.push_back(std::move(snap));
        break;
      case Verdict::kDead:
        if (clean_stale) UnlinkIfSame(StatsPath(dir, pid), st);
        break;
      case Verdict::kSkip:
        if (errors && !why.empty()) errors->push_back(why);
        break;
    }
  }
  return result;
}

int CleanStaleStats(const std::string& dir) {
  int removed = 0;
  for (pid_t pid : ListStatsPids(dir)) {
    StatsSnapshot snap;
    struct stat st;
    std::string why;
    if (Judge(dir, pid, &snap, &st, &why) == Verdict::kDead &&
        UnlinkIfSame(StatsPath(dir, pid), st))
      ++removed;
  }
  return removed;
}

}  // namespace zrtier
