#include "runtime/engine/uffd.h"

#include <cstring>

#include "runtime/engine/chunk_table.h"
#include "runtime/os/uffd_compat.h"

namespace zrtier {

std::string ErrnoText(long r) {
  return strerror(static_cast<int>(r < 0 ? -r : r));
}

Status Uffd::Copy(char* dst, const char* src, size_t len, bool wp, bool dontwake) {
  size_t done = 0;
  int again = 0;
  bool skipped = false;
  while (done < len) {
    uffdio_copy c{};
    c.dst = reinterpret_cast<uint64_t>(dst + done);
    c.src = reinterpret_cast<uint64_t>(src + done);
    c.len = len - done;
    c.mode = (wp ? UFFDIO_COPY_MODE_WP : 0) | (dontwake ? UFFDIO_COPY_MODE_DONTWAKE : 0);
    long r = os_->Ioctl(fd_, UFFDIO_COPY, &c);
    if (r == 0) break;
    if (c.copy > 0) done += static_cast<size_t>(c.copy);
    if (r == -EAGAIN) {
      if (++again > 100000) return Status::Error(EAGAIN, "UFFDIO_COPY keeps returning EAGAIN");
      continue;
    }
    if (r == -EEXIST) {  // a page is already there: it counts as installed
      done += kPage;
      skipped = true;
      continue;
    }
    return Status::Error(static_cast<int>(-r), "UFFDIO_COPY: " + ErrnoText(r));
  }
  if (skipped && !dontwake) Wake(dst, len);
  return Status::Ok();
}

Status Uffd::ZeroPage(char* p, size_t len, bool dontwake) {
  size_t done = 0;
  int again = 0;
  bool skipped = false;
  while (done < len) {
    uffdio_zeropage z{};
    z.range.start = reinterpret_cast<uint64_t>(p + done);
    z.range.len = len - done;
    z.mode = dontwake ? UFFDIO_ZEROPAGE_MODE_DONTWAKE : 0;
    long r = os_->Ioctl(fd_, UFFDIO_ZEROPAGE, &z);
    if (r == 0) break;
    if (z.zeropage > 0) done += static_cast<size_t>(z.zeropage);
    if (r == -EAGAIN) {
      if (++again > 100000) return Status::Error(EAGAIN, "UFFDIO_ZEROPAGE keeps returning EAGAIN");
      continue;
    }
    if (r == -EEXIST) {  // a page is already there: it stays
      done += kPage;
      skipped = true;
      continue;
    }
    return Status::Error(static_cast<int>(-r), "UFFDIO_ZEROPAGE: " + ErrnoText(r));
  }
  if (skipped && !dontwake) Wake(p, len);
  return Status::Ok();
}

long Uffd::WriteProtect(char* p, size_t len, bool wp) {
  for (int again = 0;; ++again) {
    uffdio_writeprotect w{};
    w.range.start = reinterpret_cast<uint64_t>(p);
    w.range.len = len;
    w.mode = wp ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
    long r = os_->Ioctl(fd_, UFFDIO_WRITEPROTECT, &w);
    if (r != -EAGAIN || again > 100000) return r;
  }
}

void Uffd::Wake(char* p, size_t len) {
  uffdio_range r{reinterpret_cast<uint64_t>(p), len};
  os_->Ioctl(fd_, UFFDIO_WAKE, &r);
}

void Uffd::Poison(uint64_t addr) {
  char* page = reinterpret_cast<char*>(addr & ~(kPage - 1));
  if (poison_) {
    uffdio_poison p{};
    p.range.start = reinterpret_cast<uint64_t>(page);
    p.range.len = kPage;
    poisoned_.store(true);
    long r = os_->Ioctl(fd_, UFFDIO_POISON, &p);
    if (r == 0 || r == -EEXIST) return;
  }
  Wake(page, kPage);
}

}  // namespace zrtier
