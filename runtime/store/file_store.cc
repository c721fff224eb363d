// The spill-file tier (see file_store.h).
#include "runtime/store/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "runtime/base/log.h"

namespace zrtier {
namespace {

constexpr uint64_t kSegmentBytes = 64ull << 20;

// mkdir -p. (The one call outside Os: directory creation is not worth a seam; a failure here is
// reported as a Status naming ZRTIER_SPILL_DIR all the same.)
int MakeDirs(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string part = dir.substr(0, pos);
    if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return errno;
  }
  return 0;
}

// Deletes spill files left by processes that died in the instant between creating a named spill
// file and unlinking it (only where O_TMPFILE is refused), or by older versions that kept them
// named: zrtier-<pid>-*.spill whose pid no longer exists, and only regular files of our user -- a
// symlink or another user's file is not ours to delete. A live pid (even a reused one) keeps its
// files. Directory listing is outside Os: a failure here only means nothing is cleaned.
void RemoveStaleSpillFiles(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  int removed = 0;
  while (struct dirent* e = readdir(d)) {
    const char* n = e->d_name;
    size_t len = strlen(n);
    if (strncmp(n, "zrtier-", 7) != 0 || len < 7 + 6 || strcmp(n + len - 6, ".spill") != 0)
      continue;
    long pid = strtol(n + 7, nullptr, 10);
    if (pid <= 0 || pid == getpid()) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    struct stat st;
    if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != geteuid())
      continue;
    if (unlinkat(dirfd(d), n, 0) == 0) removed++;
  }
  closedir(d);
  if (removed)
    Log(LogLevel::kInfo, "file store: removed %d stale spill files of dead processes in %s",
        removed, dir.c_str());
}

ExtentStore::Config FileConfig(uint64_t limit) {
  ExtentStore::Config c;
  c.name = "file";
  c.raw_gauge = Stat::spill_raw_bytes;
  c.bytes_gauge = Stat::spill_bytes;
  c.limit = limit;
  c.limit_option = "ZRTIER_SPILL_LIMIT";
  c.allocate_before_write = true;
  return c;
}

}  // namespace

FileStore::FileStore(const std::string& dir, uint64_t limit, Os* os)
    : ExtentStore(FileConfig(limit), os), dir_(dir) {
  static std::atomic<int> next_id{0};
  id_ = next_id.fetch_add(1);
  segment_bytes_ = kSegmentBytes;
  if (limit && limit < segment_bytes_) segment_bytes_ = (limit + 4095) / 4096 * 4096;
}

FileStore::~FileStore() {
  CloseAll();
}

Status FileStore::Create(const std::string& dir, uint64_t limit, Os* os,
                         std::unique_ptr<FileStore>* out) {
  if (dir.empty()) return Status::Error(EINVAL, "ZRTIER_SPILL_DIR is empty");
  if (int err = MakeDirs(dir))
    return Status::Error(err, "ZRTIER_SPILL_DIR=" + dir + " cannot be created: " + strerror(err));
  RemoveStaleSpillFiles(dir);
  std::unique_ptr<FileStore> store(new FileStore(dir, limit, os));
  Status s = store->Start();
  if (!s.ok()) return Status::Error(s.code(), "file store: " + s.message());
  *out = std::move(store);
  return Status::Ok();
}

std::string FileStore::SegmentPath(uint32_t index) const {
  return dir_ + "/zrtier-" + std::to_string(getpid()) + "-" + std::to_string(id_) + "-" +
         std::to_string(index) + ".spill";
}

long FileStore::OpenNameless(uint32_t index, int flags) {
  // An O_TMPFILE file never has a name; where the file system refuses it (EOPNOTSUPP; EISDIR from
  // kernels that predate it), a new name is unlinked before a byte is written.
  long r = tmpfile_ ? os_->Open(dir_.c_str(), flags | O_TMPFILE, 0600) : -EOPNOTSUPP;
  if (r != -EOPNOTSUPP && r != -EISDIR) return r;
  tmpfile_ = false;
  std::string path = SegmentPath(index);
  r = os_->Open(path.c_str(), flags | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  if (r < 0) return r;
  long u = os_->Unlink(path.c_str());
  if (u < 0) {  // a file we cannot unlink would outlive us with the program's data: not used
    os_->Close(static_cast<int>(r));
    return u;
  }
  return r;
}

Status FileStore::OpenSegment(uint32_t index, int* fd, uint64_t* capacity) {
  const int flags = O_RDWR | O_CLOEXEC;
  long r = -EINVAL;
  if (direct_) r = OpenNameless(index, flags | O_DIRECT);
  if (r == -EINVAL) {
    if (direct_)
      ZRTIER_LOG_ONCE(LogLevel::kWarn,
                      "file store: %s refuses O_DIRECT; spill files use buffered I/O "
                      "(ZRTIER_SPILL_DIR)",
                      dir_.c_str());
    direct_ = false;
    r = OpenNameless(index, flags);
  }
  if (r < 0)
    return Status::Error(static_cast<int>(-r), "ZRTIER_SPILL_DIR=" + dir_ + " is not writable: " +
                                                   strerror(static_cast<int>(-r)));
  long t = os_->Ftruncate(static_cast<int>(r), static_cast<off_t>(segment_bytes_));
  if (t < 0) {
    os_->Close(static_cast<int>(r));
    return Status::Error(static_cast<int>(-t), "file store: ftruncate of a spill file in " + dir_ +
                                                   ": " + strerror(static_cast<int>(-t)));
  }
  *fd = static_cast<int>(r);
  *capacity = segment_bytes_;
  return Status::Ok();
}

void FileStore::CloseSegment(uint32_t /*index*/, int fd) {
  os_->Close(fd);  // the file has no name: closing it frees its blocks
}

}  // namespace zrtier
