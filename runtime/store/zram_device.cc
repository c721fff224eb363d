// zram device claiming and configuration through sysfs (see zram_device.h).
#include "runtime/store/zram_device.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/base/log.h"

namespace zrtier {
namespace {

constexpr const char* kControl = "/sys/class/zram-control";

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The start time of process `pid` (field 22 of /proc/<pid>/stat, clock ticks since boot); 0 if it
// does not exist.
uint64_t StartTime(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(text.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) return strtoull(field.c_str(), nullptr, 10);
  return 0;
}

// Whether the process recorded as (pid, start) is gone: no such pid, or the pid is another
// process's now.
bool Gone(pid_t pid, uint64_t start) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  const uint64_t now = StartTime(pid);
  return now != 0 && now != start;
}

}  // namespace

std::string ZramDevice::UnavailableReason() {
  long fd =
      Os::Default()->Open((std::string(kControl) + "/hot_add").c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    long d = Os::Default()->Open("/sys/block/zram0/disksize", O_RDONLY | O_CLOEXEC, 0);
    if (d < 0) return "no zram in this kernel (no /sys/class/zram-control, no /sys/block/zram0)";
    Os::Default()->Close(static_cast<int>(d));
    return "";
  }
  Os::Default()->Close(static_cast<int>(fd));
  return "";
}

std::string ZramDevice::Attr(const std::string& name) const {
  return "/sys/block/zram" + std::to_string(id_) + "/" + name;
}

Status ZramDevice::ReadFile(const std::string& path, std::string* out) const {
  long fd = os_->Open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0)
    return Status::Error(static_cast<int>(-fd), path + ": " + strerror(static_cast<int>(-fd)));
  char buf[512];
  long n = os_->Read(static_cast<int>(fd), buf, sizeof(buf) - 1);
  os_->Close(static_cast<int>(fd));
  if (n < 0)
    return Status::Error(static_cast<int>(-n), path + ": " + strerror(static_cast<int>(-n)));
  out->assign(buf, static_cast<size_t>(n));
  return Status::Ok();
}

Status ZramDevice::WriteFile(const std::string& path, const std::string& text) const {
  long fd = os_->Open(path.c_str(), O_WRONLY | O_CLOEXEC, 0);
  if (fd < 0)
    return Status::Error(static_cast<int>(-fd), path + ": " + strerror(static_cast<int>(-fd)));
  long n = os_->Write(static_cast<int>(fd), text.data(), text.size());
  os_->Close(static_cast<int>(fd));
  if (n < 0)
    return Status::Error(static_cast<int>(-n),
                         "write '" + text + "' to " + path + ": " + strerror(static_cast<int>(-n)));
  return Status::Ok();
}

void ZramDevice::RecordOwner() {
  mkdir(kOwnerDir, 0700);
  owner_file_ = std::string(kOwnerDir) + "/zram" + std::to_string(id_) + ".owner";
  const std::string text = std::to_string(getpid()) + " " + std::to_string(StartTime(getpid())) +
                           " " + (hot_added_ ? "1" : "0") + "\n";
  // A record left by a gone owner of the same device number is replaced; a link is not followed.
  os_->Unlink(owner_file_.c_str());
  long fd =
      os_->Open(owner_file_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    owner_file_.clear();
    return;
  }
  os_->Write(static_cast<int>(fd), text.data(), text.size());
  os_->Close(static_cast<int>(fd));
}

int ZramDevice::ReapOrphans(Os* os, const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  std::vector<std::string> records;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("zram", 0) == 0 && name.size() > 10 && name.substr(name.size() - 6) == ".owner")
      records.push_back(name);
  }
  closedir(d);
  int reaped = 0;
  for (const std::string& name : records) {
    const std::string path = dir + "/" + name;
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;
    std::ifstream in(path);
    long pid = 0;
    unsigned long long start = 0;
    int hot = 0;
    if (!(in >> pid >> start >> hot) || pid <= 0 || !Gone(static_cast<pid_t>(pid), start)) continue;
    ZramDevice dev(os);
    dev.id_ = atoi(name.c_str() + 4);
    if (!dev.Reset().ok()) {  // still open somewhere (a forked child): a later Claim tries again
      dev.id_ = -1;
      continue;
    }
    if (hot) dev.WriteFile(std::string(kControl) + "/hot_remove", std::to_string(dev.id_));
    dev.id_ = -1;
    os->Unlink(path.c_str());
    Log(LogLevel::kInfo, "zram: reset /dev/%s, left configured by process %ld that is gone",
        name.substr(0, name.size() - 6).c_str(), pid);
    ++reaped;
  }
  return reaped;
}

Status ZramDevice::Claim(const std::string& spec) {
  ReapOrphans(os_);
  Status st = ClaimDevice(spec);
  if (st.ok()) RecordOwner();
  return st;
}

Status ZramDevice::ClaimDevice(const std::string& spec) {
  std::string text;
  if (spec == "auto" || spec.empty()) {
    if (ReadFile(std::string(kControl) + "/hot_add", &text).ok()) {
      id_ = atoi(text.c_str());
      hot_added_ = true;
      return Status::Ok();
    }
    for (int n = 0; n < 64; ++n) {
      std::string ds;
      id_ = n;
      if (!ReadFile(Attr("disksize"), &ds).ok() || Trim(ds) != "0") continue;
      // Lock, then look again: another process may have taken it between the read and the lock.
      std::string lock = "/run/zrtier-zram" + std::to_string(n) + ".lock";
      long fd = os_->Open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0) continue;
      if (flock(static_cast<int>(fd), LOCK_EX | LOCK_NB) != 0 ||
          !ReadFile(Attr("disksize"), &ds).ok() || Trim(ds) != "0") {
        os_->Close(static_cast<int>(fd));
        continue;
      }
      lock_fd_ = static_cast<int>(fd);
      return Status::Ok();
    }
    id_ = -1;
    return Status::Error(EBUSY,
                         "ZRTIER_ZRAM_DEVICE=auto: no free zram device and hot_add refused "
                         "(modprobe zram, or name a device)");
  }
  const size_t digits = strlen("/dev/zram");
  if (spec.rfind("/dev/zram", 0) != 0 || spec.size() == digits ||
      spec.find_first_not_of("0123456789", digits) != std::string::npos)
    return Status::Error(EINVAL, "ZRTIER_ZRAM_DEVICE=" + spec + ": expected auto or /dev/zramN");
  id_ = atoi(spec.c_str() + strlen("/dev/zram"));
  std::string ds;
  Status s = ReadFile(Attr("disksize"), &ds);
  if (!s.ok()) {
    id_ = -1;
    return Status::Error(s.code(), "ZRTIER_ZRAM_DEVICE=" + spec + ": " + s.message());
  }
  if (Trim(ds) != "0") {
    id_ = -1;
    return Status::Error(EBUSY, "ZRTIER_ZRAM_DEVICE=" + spec + " is in use (disksize " + Trim(ds) +
                                    "); give a free device or auto");
  }
  return Status::Ok();
}

std::vector<std::string> ZramDevice::Algorithms(std::string* current) const {
  std::string text;
  std::vector<std::string> out;
  if (!ReadFile(Attr("comp_algorithm"), &text).ok()) return out;
  std::istringstream in(text);
  std::string w;
  while (in >> w) {
    if (w.front() == '[' && w.back() == ']') {
      w = w.substr(1, w.size() - 2);
      if (current) *current = w;
    }
    out.push_back(w);
  }
  return out;
}

Status ZramDevice::SetAlgorithm(const std::string& alg) {
  return WriteFile(Attr("comp_algorithm"), alg);
}

std::string ZramDevice::ChooseAlgorithm() {
  std::string current;
  std::vector<std::string> algs = Algorithms(&current);
  for (const char* want : {"zstd", "lz4"})
    for (const std::string& a : algs)
      if (a == want) {
        if (SetAlgorithm(a).ok()) return a;
      }
  return current;
}

Status ZramDevice::SetDiskSize(uint64_t bytes) {
  ZRTIER_RETURN_IF_ERROR(WriteFile(Attr("disksize"), std::to_string(bytes)));
  configured_ = true;
  return Status::Ok();
}

Status ZramDevice::Reset() {
  Status s = WriteFile(Attr("reset"), "1");
  if (s.ok()) configured_ = false;
  return s;
}

void ZramDevice::Release() {
  if (id_ < 0) return;
  if (configured_ || hot_added_) {
    Status s = Reset();
    if (!s.ok())
      Log(LogLevel::kWarn, "zram: reset of %s failed: %s", path().c_str(), s.ToString().c_str());
  }
  if (hot_added_) {
    Status s = WriteFile(std::string(kControl) + "/hot_remove", std::to_string(id_));
    if (!s.ok())
      Log(LogLevel::kWarn, "zram: hot_remove of %s failed: %s", path().c_str(),
          s.ToString().c_str());
  }
  if (lock_fd_ >= 0) os_->Close(lock_fd_);
  if (!owner_file_.empty()) os_->Unlink(owner_file_.c_str());
  owner_file_.clear();
  lock_fd_ = -1;
  id_ = -1;
  hot_added_ = false;
}

Status ZramDevice::MmStat(uint64_t* orig, uint64_t* compr, uint64_t* mem_used) const {
  std::string text;
  ZRTIER_RETURN_IF_ERROR(ReadFile(Attr("mm_stat"), &text));
  std::istringstream in(text);
  if (!(in >> *orig >> *compr >> *mem_used)) return Status::Error(EBADMSG, "zram mm_stat: " + text);
  return Status::Ok();
}

}  // namespace zrtier
