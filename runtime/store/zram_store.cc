// The zram tier (see zram_store.h).
#include "runtime/store/zram_store.h"

#include <fcntl.h>

#include <cstring>

#include "runtime/base/log.h"

namespace zrtier {
namespace {

ExtentStore::Config ZramConfig(uint64_t disksize) {
  ExtentStore::Config c;
  c.name = "zram";
  c.raw_gauge = Stat::zram_raw_bytes;
  c.bytes_gauge = Stat::zram_bytes;
  c.limit = disksize;
  c.limit_option = "ZRTIER_ZRAM_SIZE";
  c.allocate_before_write = false;  // a block device: every slot exists
  return c;
}

uint64_t ClampSize(uint64_t bytes) {
  bytes = bytes / 4096 * 4096;
  return bytes < (1u << 20) ? (1u << 20) : bytes;
}

}  // namespace

ZramStore::ZramStore(uint64_t disksize, Os* os)
    : ExtentStore(ZramConfig(ClampSize(disksize)), os),
      device_(os),
      disksize_(ClampSize(disksize)) {}

ZramStore::~ZramStore() {
  CloseAll();
  device_.Release();
}

Status ZramStore::Create(const std::string& device, uint64_t disksize, Os* os,
                         std::unique_ptr<ZramStore>* out) {
  std::unique_ptr<ZramStore> store(new ZramStore(disksize, os));
  ZRTIER_RETURN_IF_ERROR(store->device_.Claim(device));
  store->algorithm_ = store->device_.ChooseAlgorithm();
  Status s = store->device_.SetDiskSize(store->disksize_);
  if (!s.ok())
    return Status::Error(s.code(), "zram: configuring " + store->device_.path() +
                                       " failed (ZRTIER_ZRAM_DEVICE): " + s.message());
  s = store->Start();
  if (!s.ok()) return Status::Error(s.code(), "zram store: " + s.message());
  Log(LogLevel::kInfo, "zram store: %s, %s, %llu bytes", store->device_.path().c_str(),
      store->algorithm_.c_str(), static_cast<unsigned long long>(store->disksize_));
  *out = std::move(store);
  return Status::Ok();
}

Status ZramStore::OpenSegment(uint32_t index, int* fd, uint64_t* capacity) {
  if (index > 0)
    return Status::Error(ENOSPC, "zram device " + device_.path() + " full (ZRTIER_ZRAM_SIZE)");
  std::string path = device_.path();
  // O_EXCL on a block device: fail rather than share it with a mount or swap.
  long r = os_->Open(path.c_str(), O_RDWR | O_DIRECT | O_EXCL | O_CLOEXEC, 0);
  if (r == -EINVAL) {
    direct_ = false;
    r = os_->Open(path.c_str(), O_RDWR | O_EXCL | O_CLOEXEC, 0);
  }
  if (r < 0)
    return Status::Error(static_cast<int>(-r),
                         "open " + path + ": " + strerror(static_cast<int>(-r)));
  *fd = static_cast<int>(r);
  *capacity = disksize_;
  return Status::Ok();
}

void ZramStore::CloseSegment(uint32_t, int fd) {
  os_->Close(fd);
}

}  // namespace zrtier
