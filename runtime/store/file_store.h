// FileStore: the T3 spill tier. Encoded chunks are packed into segment files in ZRTIER_SPILL_DIR
// (64 MiB each, sparse) through io_uring with registered buffers, O_DIRECT where the file system
// allows it (otherwise buffered I/O, said once on stderr). Disk blocks are allocated per extent
// (fallocate) before the write, so a full disk is found before any byte is written; freed extents
// are punched and reused; empty segment files are closed.
//
// Nothing is left behind: a segment file has no name while it is open -- O_TMPFILE, or where the
// file system refuses that, zrtier-<pid>-<n>-<seg>.spill unlinked right after open, before a byte
// is written -- so its blocks are freed when the process closes it, whatever the exit (return from
// main with the store alive, a crash, kill -9). Named files left by a process that died inside
// that instant (or by older versions) are deleted by the next store created in the directory:
// regular files of our user whose pid is gone. See extent_store.h.
#pragma once

#include <memory>
#include <string>

#include "runtime/store/extent_store.h"

namespace zrtier {

class FileStore : public ExtentStore {
 public:
  // Creates `dir` (and missing parents) if needed and opens the first segment file. `limit` bytes
  // of extents at most (0 = until the disk is full). Fails with a Status naming ZRTIER_SPILL_DIR
  // when the directory cannot be created or written.
  static Status Create(const std::string& dir, uint64_t limit, Os* os,
                       std::unique_ptr<FileStore>* out);
  ~FileStore() override;

  // The segment size (bytes); smaller when the limit is smaller.
  uint64_t segment_bytes() const { return segment_bytes_; }

 protected:
  Status OpenSegment(uint32_t index, int* fd, uint64_t* capacity) override;
  void CloseSegment(uint32_t index, int fd) override;

 private:
  FileStore(const std::string& dir, uint64_t limit, Os* os);
  std::string SegmentPath(uint32_t index) const;
  // Opens a new segment file that has no name in dir_ (see above); the fd or -errno.
  long OpenNameless(uint32_t index, int flags);

  std::string dir_;
  uint64_t segment_bytes_;
  int id_;               // distinguishes stores of one process in file names
  bool tmpfile_ = true;  // false once dir_ refused O_TMPFILE
};

}  // namespace zrtier
