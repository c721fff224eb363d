// ZramDevice: claims and configures one kernel zram device through sysfs (all I/O through Os).
//   Claim("auto"): hot-adds a private device (/sys/class/zram-control/hot_add) when the kernel
//   allows it, else takes a free existing one (disksize 0), guarded by an flock on
//   /run/zrtier-zram<N>.lock so two processes never configure the same device.
//   Claim("/dev/zramN"): that device, if it is free (disksize 0).
// Release() resets the device (frees its memory) and hot-removes it if it was hot-added; the
// destructor calls it.
//
// Nothing left behind: a process may end without Release (killed, or exiting with the store still
// in use). Every claimed device is recorded in /run/zrtier/zram<N>.owner (the owner's pid and start
// time, and whether the device was hot-added); every Claim first reaps the devices of owners that
// are gone -- reset, hot-removed if hot-added, record deleted. A device some process still holds
// open (a forked child of the owner) cannot be reset and is left for a later Claim.
//
// Thread safety: none; one owner.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/os/os.h"
#include "zrtier/status.h"

namespace zrtier {

class ZramDevice {
 public:
  explicit ZramDevice(Os* os) : os_(os) {}
  ~ZramDevice() { Release(); }
  ZramDevice(const ZramDevice&) = delete;
  ZramDevice& operator=(const ZramDevice&) = delete;

  // Empty if the kernel has zram (/sys/class/zram-control exists); otherwise why not.
  static std::string UnavailableReason();

  // Claims a device (see above). Fails naming ZRTIER_ZRAM_DEVICE: no zram, no free device, device
  // in use.
  Status Claim(const std::string& spec);
  // The algorithms the device offers and the current one ("[lzo-rle] lzo lz4").
  std::vector<std::string> Algorithms(std::string* current = nullptr) const;
  // Sets the compression algorithm. REQUIRES: disksize not yet set (or after Reset).
  Status SetAlgorithm(const std::string& alg);
  // Picks zstd if offered, else lz4, else keeps the default; returns the one in use.
  std::string ChooseAlgorithm();
  Status SetDiskSize(uint64_t bytes);
  // Resets the device to unconfigured (disksize 0). REQUIRES: no fd open on it.
  Status Reset();
  // Reset + hot_remove (if hot-added) + unlock. Idempotent.
  void Release();
  // Reaps the devices whose recorded owner is gone (see above); returns how many were reset.
  // `dir`: the records' folder (tests pass their own).
  static int ReapOrphans(Os* os, const std::string& dir = kOwnerDir);
  static constexpr const char* kOwnerDir = "/run/zrtier";

  // mm_stat: orig_data_size, compr_data_size, mem_used_total (bytes).
  Status MmStat(uint64_t* orig, uint64_t* compr, uint64_t* mem_used) const;

  int id() const { return id_; }
  std::string path() const { return "/dev/zram" + std::to_string(id_); }
  bool hot_added() const { return hot_added_; }

 private:
  std::string Attr(const std::string& name) const;
  Status ReadFile(const std::string& path, std::string* out) const;
  Status WriteFile(const std::string& path, const std::string& text) const;
  // Claim's choice of device, before the owner record.
  Status ClaimDevice(const std::string& spec);
  // Records this process as the device's owner (see above); best effort.
  void RecordOwner();

  Os* os_;
  int id_ = -1;
  bool hot_added_ = false;
  bool configured_ = false;
  int lock_fd_ = -1;
  std::string owner_file_;  // the record written by RecordOwner, deleted by Release
};

}  // namespace zrtier
