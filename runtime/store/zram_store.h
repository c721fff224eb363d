// ZramStore: the zram tier. Claims a zram device (ZRTIER_ZRAM_DEVICE: auto = a hot-added private
// device, or a free existing one; or a path), configures its algorithm (zstd if the kernel offers
// it, else lz4, else the default) and disksize, and keeps encoded chunks in 4 KiB-aligned slots on
// it, written and read with io_uring on an O_DIRECT fd (see extent_store.h). Freed slots are
// discarded (the kernel frees their memory). The device is reset (and hot-removed if it was
// hot-added) when the store is destroyed.
#pragma once

#include <memory>
#include <string>

#include "runtime/store/extent_store.h"
#include "runtime/store/zram_device.h"

namespace zrtier {

class ZramStore : public ExtentStore {
 public:
  // `disksize`: the device's size in bytes (rounded down to 4 KiB, at least 1 MiB); the store's
  // limit is the device size.
  static Status Create(const std::string& device, uint64_t disksize, Os* os,
                       std::unique_ptr<ZramStore>* out);
  ~ZramStore() override;

  const ZramDevice& device() const { return device_; }
  const std::string& algorithm() const { return algorithm_; }

 protected:
  Status OpenSegment(uint32_t index, int* fd, uint64_t* capacity) override;
  void CloseSegment(uint32_t index, int fd) override;

 private:
  ZramStore(uint64_t disksize, Os* os);
  ZramDevice device_;
  uint64_t disksize_;
  std::string algorithm_;
};

}  // namespace zrtier
