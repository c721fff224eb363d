// The block-tier machinery (see extent_store.h).
#include "runtime/store/extent_store.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>

#include <cstring>

#include "runtime/base/log.h"

namespace zrtier {
namespace {

constexpr uint64_t kBlock = 4096;
uint64_t RoundUp(uint64_t v) {
  return (v + kBlock - 1) / kBlock * kBlock;
}

}  // namespace

ExtentStore::ExtentStore(Config config, Os* os) : os_(os), config_(std::move(config)) {
  usage_.limit_bytes = config_.limit;
}

ExtentStore::~ExtentStore() {
  // The subclass has closed the segments (CloseAll); what is left is accounting and memory.
  StatSub(config_.raw_gauge, usage_.raw_bytes);
  StatSub(config_.bytes_gauge, usage_.used_bytes);
  if (staging_) os_->Munmap(staging_, config_.staging_buffers * config_.staging_bytes);
}

Status ExtentStore::Start() {
  for (Uring& r : rings_) ZRTIER_RETURN_IF_ERROR(r.Init(64, os_));
  size_t total = config_.staging_buffers * config_.staging_bytes;
  int err = 0;
  void* p =
      os_->Mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, &err);
  if (p == MAP_FAILED)
    return Status::Error(err ? err : ENOMEM, std::string(config_.name) + " store: staging buffers");
  staging_ = static_cast<unsigned char*>(p);
  std::vector<struct iovec> iov(config_.staging_buffers);
  for (unsigned i = 0; i < config_.staging_buffers; ++i) {
    iov[i].iov_base = staging_ + i * config_.staging_bytes;
    iov[i].iov_len = config_.staging_bytes;
    free_bufs_.push_back(static_cast<int>(i));
  }
  bool fixed = true;
  for (Uring& r : rings_) fixed = r.RegisterBuffers(iov.data(), config_.staging_buffers) && fixed;
  if (!fixed)
    Log(LogLevel::kInfo, "%s store: io_uring refused registered buffers; using plain reads/writes",
        config_.name);
  std::lock_guard<std::mutex> lock(mu_);
  Segment seg;
  ZRTIER_RETURN_IF_ERROR(OpenSegment(0, &seg.fd, &seg.capacity));
  seg.free[0] = seg.capacity;
  segments_.push_back(std::move(seg));
  started_ = true;
  return Status::Ok();
}

void ExtentStore::CloseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t i = 0; i < segments_.size(); ++i) {
    if (segments_[i].fd >= 0) CloseSegment(i, segments_[i].fd);
    segments_[i].fd = -1;
  }
}

Uring::Op ExtentStore::SlotOp(bool write, int fd, const Buf& b, const Loc& loc) {
  Uring::Op op;
  op.write = write;
  op.fd = fd;
  op.buf = b.p;
  op.len = loc.alen;
  op.off = loc.off;
  op.buf_index = b.index;
  return op;
}

bool ExtentStore::AllocLocked(uint32_t alen, Loc* loc, Status* why) {
  if (config_.limit && usage_.used_bytes + reserved_ + alen > config_.limit) {
    *why = Status::Error(
        ENOSPC, std::string(config_.name) + " store full: " + FormatSize(usage_.used_bytes) +
                    " of " + config_.limit_option + "=" + FormatSize(config_.limit) + " used");
    return false;
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (uint32_t s = 0; s < segments_.size(); ++s) {
      Segment& seg = segments_[s];
      if (seg.fd < 0) continue;
      for (auto it = seg.free.begin(); it != seg.free.end(); ++it) {
        if (it->second < alen) continue;
        loc->seg = s;
        loc->off = it->first;
        loc->alen = alen;
        uint64_t rest = it->second - alen, off = it->first;
        seg.free.erase(it);
        if (rest) seg.free[off + alen] = rest;
        seg.live++;
        reserved_ += alen;
        return true;
      }
    }
    if (pass == 1) break;
    // No room: open another segment (reusing a closed slot).
    uint32_t idx = static_cast<uint32_t>(segments_.size());
    for (uint32_t s = 0; s < segments_.size(); ++s)
      if (segments_[s].fd < 0) {
        idx = s;
        break;
      }
    Segment seg;
    Status st = OpenSegment(idx, &seg.fd, &seg.capacity);
    if (!st.ok()) {
      *why = st;
      return false;
    }
    seg.free[0] = seg.capacity;
    if (idx == segments_.size())
      segments_.push_back(std::move(seg));
    else
      segments_[idx] = std::move(seg);
  }
  *why = Status::Error(ENOSPC, std::string(config_.name) + " store: entry larger than a segment");
  return false;
}

void ExtentStore::ReleaseExtent(const Loc& loc, bool reserved) {
  int fd;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fd = segments_[loc.seg].fd;
  }
  // Give the blocks back before the extent can be reused (never punch a newer entry away).
  os_->Fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(loc.off),
                 static_cast<off_t>(loc.alen));
  std::lock_guard<std::mutex> lock(mu_);
  if (reserved) reserved_ -= loc.alen;
  Segment& seg = segments_[loc.seg];
  uint64_t off = loc.off, len = loc.alen;
  auto next = seg.free.lower_bound(off);
  if (next != seg.free.end() && next->first == off + len) {
    len += next->second;
    next = seg.free.erase(next);
  }
  if (next != seg.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      seg.free.erase(prev);
    }
  }
  seg.free[off] = len;
  seg.live--;
  size_t open = 0;
  for (const Segment& s : segments_) open += s.fd >= 0;
  if (seg.live == 0 && open > 1) {  // an empty segment goes away; keep the last one open
    CloseSegment(loc.seg, seg.fd);
    seg.fd = -1;
    seg.free.clear();
  }
}

ExtentStore::Buf ExtentStore::TakeBuffer(size_t need) {
  Buf b;
  if (need > config_.staging_bytes) {
    int err = 0;
    void* p =
        os_->Mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, &err);
    if (p == MAP_FAILED) return b;
    b.p = static_cast<unsigned char*>(p);
    b.size = need;
    return b;
  }
  std::unique_lock<std::mutex> lock(pool_mu_);
  pool_cv_.wait(lock, [&] { return !free_bufs_.empty(); });
  b.index = free_bufs_.back();
  free_bufs_.pop_back();
  b.p = staging_ + static_cast<size_t>(b.index) * config_.staging_bytes;
  b.size = config_.staging_bytes;
  return b;
}

void ExtentStore::GiveBuffer(const Buf& b) {
  if (!b.p) return;
  if (b.index < 0) {
    os_->Munmap(b.p, b.size);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    free_bufs_.push_back(b.index);
  }
  pool_cv_.notify_one();
}

void ExtentStore::IoError(const char* what, long res) {
  StatAdd(Stat::io_errors, 1);
  ZRTIER_LOG_ONCE(LogLevel::kWarn,
                  "%s store: %s failed (%s); the chunk stays in the tier above (further errors are "
                  "counted in io_errors)",
                  config_.name, what, strerror(static_cast<int>(-res)));
}

void ExtentStore::PutBatch(PutReq* reqs, size_t n) {
  // Groups of at most half the pool, so concurrent batches always make progress.
  const size_t group = std::max<size_t>(1, config_.staging_buffers / 2);
  for (size_t start = 0; start < n; start += group) {
    size_t count = std::min(group, n - start);
    std::vector<Loc> locs(count);
    std::vector<bool> have(count, false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < count; ++i) {
        PutReq& r = reqs[start + i];
        if (r.len == 0 || r.len > UINT32_MAX - kBlock) {
          r.status = Status::Error(EINVAL, std::string(config_.name) + " store: bad length");
          continue;
        }
        Status why;
        if (!AllocLocked(static_cast<uint32_t>(RoundUp(r.len)), &locs[i], &why)) {
          if (why.code() == ENOSPC) StatAdd(Stat::store_full, 1);
          r.status = why;
          continue;
        }
        locs[i].len = static_cast<uint32_t>(r.len);
        locs[i].raw_len = r.raw_len;
        have[i] = true;
      }
    }
    std::vector<Buf> bufs(count);
    std::vector<Uring::Op> ops;
    std::vector<size_t> op_req;
    for (size_t i = 0; i < count; ++i) {
      if (!have[i]) continue;
      PutReq& r = reqs[start + i];
      int fd;
      {
        std::lock_guard<std::mutex> lock(mu_);
        fd = segments_[locs[i].seg].fd;
      }
      if (config_.allocate_before_write) {
        long a = os_->Fallocate(fd, 0, static_cast<off_t>(locs[i].off),
                                static_cast<off_t>(locs[i].alen));
        if (a < 0) {
          IoError("fallocate", a);
          r.status = Status::Error(
              static_cast<int>(-a),
              std::string(config_.name) + " store: fallocate: " + strerror(static_cast<int>(-a)));
          ReleaseExtent(locs[i], true);
          have[i] = false;
          continue;
        }
      }
      bufs[i] = TakeBuffer(locs[i].alen);
      if (!bufs[i].p) {
        r.status = Status::Error(ENOMEM, std::string(config_.name) + " store: buffer");
        ReleaseExtent(locs[i], true);
        have[i] = false;
        continue;
      }
      memcpy(bufs[i].p, r.data, r.len);
      memset(bufs[i].p + r.len, 0, locs[i].alen - r.len);
      ops.push_back(SlotOp(true, fd, bufs[i], locs[i]));
      op_req.push_back(i);
    }
    NextRing().Run(ops.data(), ops.size());
    for (size_t k = 0; k < ops.size(); ++k) {
      size_t i = op_req[k];
      PutReq& r = reqs[start + i];
      GiveBuffer(bufs[i]);
      if (ops[k].res < 0) {
        IoError("write", ops[k].res);
        int code = ops[k].res == -ENOSPC ? ENOSPC : EIO;
        r.status = Status::Error(code, std::string(config_.name) + " store: write: " +
                                           strerror(static_cast<int>(-ops[k].res)));
        ReleaseExtent(locs[i], true);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      reserved_ -= locs[i].alen;
      r.out = next_++;
      entries_.emplace(r.out, locs[i]);
      usage_.entries++;
      usage_.raw_bytes += r.raw_len;
      usage_.payload_bytes += r.len;
      usage_.used_bytes += locs[i].alen;
      StatAdd(config_.raw_gauge, r.raw_len);
      StatAdd(config_.bytes_gauge, locs[i].alen);
      StatAdd(Stat::spill_write_bytes, r.len);
      r.status = Status::Ok();
    }
  }
}

Status ExtentStore::Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) {
  PutReq r;
  r.data = data;
  r.len = len;
  r.raw_len = raw_len;
  PutBatch(&r, 1);
  if (r.status.ok()) *out = r.out;
  return r.status;
}

void ExtentStore::GetBatch(GetReq* reqs, size_t n) {
  const size_t group = std::max<size_t>(1, config_.staging_buffers / 2);
  for (size_t start = 0; start < n; start += group) {
    size_t count = std::min(group, n - start);
    std::vector<Loc> locs(count);
    std::vector<int> fds(count, -1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < count; ++i) {
        GetReq& r = reqs[start + i];
        auto it = entries_.find(r.h);
        if (it == entries_.end()) {
          r.status = Status::Error(ENOENT, std::string(config_.name) + " store: no such entry");
          continue;
        }
        locs[i] = it->second;
        fds[i] = segments_[locs[i].seg].fd;
      }
    }
    std::vector<Buf> bufs(count);
    std::vector<Uring::Op> ops;
    std::vector<size_t> op_req;
    for (size_t i = 0; i < count; ++i) {
      if (fds[i] < 0) continue;
      bufs[i] = TakeBuffer(locs[i].alen);
      if (!bufs[i].p) {
        reqs[start + i].status =
            Status::Error(ENOMEM, std::string(config_.name) + " store: buffer");
        continue;
      }
      ops.push_back(SlotOp(false, fds[i], bufs[i], locs[i]));
      op_req.push_back(i);
    }
    NextRing().Run(ops.data(), ops.size());
    for (size_t k = 0; k < ops.size(); ++k) {
      size_t i = op_req[k];
      GetReq& r = reqs[start + i];
      if (ops[k].res < 0) {
        IoError("read", ops[k].res);
        r.status = Status::Error(EIO, std::string(config_.name) + " store: read: " +
                                          strerror(static_cast<int>(-ops[k].res)));
      } else {
        r.out->assign(bufs[i].p, bufs[i].p + locs[i].len);
        StatAdd(Stat::spill_read_bytes, locs[i].len);
        r.status = Status::Ok();
      }
      GiveBuffer(bufs[i]);
    }
  }
}

Status ExtentStore::Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) {
  Loc loc;
  int fd;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(h);
    if (it == entries_.end())
      return Status::Error(ENOENT, std::string(config_.name) + " store: no such entry");
    loc = it->second;
    fd = segments_[loc.seg].fd;
  }
  Buf b = TakeBuffer(loc.alen);
  if (!b.p) return Status::Error(ENOMEM, std::string(config_.name) + " store: buffer");
  Uring::Op op = SlotOp(false, fd, b, loc);
  NextRing().Run(&op, 1);
  Status s;
  if (op.res < 0) {
    IoError("read", op.res);
    s = Status::Error(
        EIO, std::string(config_.name) + " store: read: " + strerror(static_cast<int>(-op.res)));
  } else {
    StatAdd(Stat::spill_read_bytes, loc.len);
    s = fn(b.p, loc.len);
  }
  GiveBuffer(b);
  return s;
}

void ExtentStore::Free(StoreHandle h) {
  Loc loc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(h);
    if (it == entries_.end()) return;
    loc = it->second;
    entries_.erase(it);
    usage_.entries--;
    usage_.raw_bytes -= loc.raw_len;
    usage_.payload_bytes -= loc.len;
    usage_.used_bytes -= loc.alen;
    StatSub(config_.raw_gauge, loc.raw_len);
    StatSub(config_.bytes_gauge, loc.alen);
  }
  ReleaseExtent(loc, false);
}

StoreUsage ExtentStore::Usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_;
}

}  // namespace zrtier
