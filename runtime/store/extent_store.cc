// The block-tier machinery (see extent_store.h).
#include "runtime/store/extent_store.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "runtime/base/checksum.h"
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
  if (staging_) os_->Munmap(staging_, config_.staging_bytes);
}

Status ExtentStore::Start() {
  config_.staging_bytes = RoundUp(std::max<size_t>(config_.staging_bytes, 4 * kBlock));
  for (Uring& r : rings_) ZRTIER_RETURN_IF_ERROR(r.Init(config_.ring_entries, os_));
  int err = 0;
  void* p = os_->Mmap(nullptr, config_.staging_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, &err);
  if (p == MAP_FAILED)
    return Status::Error(err ? err : ENOMEM, std::string(config_.name) + " store: staging buffers");
  staging_ = static_cast<unsigned char*>(p);
  free_arena_[0] = config_.staging_bytes;
  struct iovec iov;
  iov.iov_base = staging_;
  iov.iov_len = config_.staging_bytes;
  bool fixed = true;
  for (Uring& r : rings_) fixed = r.RegisterBuffers(&iov, 1) && fixed;
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

Uring::Op ExtentStore::RunOp(bool write, const Buf& b, const Run& r) {
  Uring::Op op;
  op.write = write;
  op.fd = r.fd;
  op.buf = b.p + r.buf_off;
  op.len = static_cast<uint32_t>(r.len);
  op.off = r.off;
  op.buf_index = b.index;
  return op;
}

std::vector<ExtentStore::Run> ExtentStore::MakeRuns(const std::vector<Loc>& locs,
                                                    std::vector<size_t> idx,
                                                    uint64_t max_gap) const {
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return locs[a].seg != locs[b].seg ? locs[a].seg < locs[b].seg : locs[a].off < locs[b].off;
  });
  std::vector<Run> runs;
  for (size_t i : idx) {
    const Loc& l = locs[i];
    if (!runs.empty()) {
      Run& r = runs.back();
      uint64_t end = r.off + r.len;
      if (l.seg == r.seg && l.off >= end && l.off - end <= max_gap &&
          l.off + l.alen - r.off <= config_.max_request_bytes) {
        r.len = l.off + l.alen - r.off;
        r.members.push_back(i);
        continue;
      }
    }
    Run r;
    r.seg = l.seg;
    r.off = l.off;
    r.len = l.alen;
    r.members.push_back(i);
    runs.push_back(std::move(r));
  }
  return runs;
}

bool ExtentStore::AllocLocked(uint64_t alen, bool may_open, Loc* loc, Status* why) {
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
        loc->alen = static_cast<uint32_t>(alen);
        uint64_t rest = it->second - alen, off = it->first;
        seg.free.erase(it);
        if (rest) seg.free[off + alen] = rest;
        seg.live++;
        reserved_ += alen;
        return true;
      }
    }
    if (pass == 1 || !may_open) break;
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

void ExtentStore::AllocGroupLocked(const std::vector<uint64_t>& alens, std::vector<Loc>* locs,
                                   std::vector<bool>* have, std::vector<Status>* statuses) {
  uint64_t total = 0;
  size_t count = 0;
  for (uint64_t a : alens) {
    total += a;
    count += a > 0;
  }
  Loc big;
  Status why;
  // One extent for the whole group, in an open segment only: the group's entries lie together
  // (otherwise they fill the holes one by one, and a new segment opens only when those are gone).
  if (count > 1 && AllocLocked(total, false, &big, &why)) {
    segments_[big.seg].live += count - 1;  // AllocLocked counted one
    uint64_t off = big.off;
    for (size_t i = 0; i < alens.size(); ++i) {
      if (!alens[i]) continue;
      (*locs)[i].seg = big.seg;
      (*locs)[i].off = off;
      (*locs)[i].alen = static_cast<uint32_t>(alens[i]);
      (*have)[i] = true;
      off += alens[i];
    }
    return;
  }
  for (size_t i = 0; i < alens.size(); ++i) {
    if (!alens[i]) continue;
    if (AllocLocked(alens[i], true, &(*locs)[i], &why)) {
      (*have)[i] = true;
    } else {
      if (why.code() == ENOSPC) StatAdd(Stat::store_full, 1);
      (*statuses)[i] = why;
    }
  }
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
  need = RoundUp(std::max<size_t>(need, 1));
  if (need > config_.staging_bytes / 4) {
    int err = 0;
    void* p =
        os_->Mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, &err);
    if (p == MAP_FAILED) return b;
    b.p = static_cast<unsigned char*>(p);
    b.size = need;
    return b;
  }
  std::unique_lock<std::mutex> lock(pool_mu_);
  for (;;) {
    for (auto it = free_arena_.begin(); it != free_arena_.end(); ++it) {
      if (it->second < need) continue;
      size_t off = it->first, rest = it->second - need;
      free_arena_.erase(it);
      if (rest) free_arena_[off + need] = rest;
      b.index = 0;
      b.p = staging_ + off;
      b.size = need;
      return b;
    }
    pool_cv_.wait(lock);
  }
}

void ExtentStore::GiveBuffer(const Buf& b) {
  if (!b.p) return;
  if (b.index < 0) {
    os_->Munmap(b.p, b.size);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    size_t off = static_cast<size_t>(b.p - staging_), len = b.size;
    auto next = free_arena_.lower_bound(off);
    if (next != free_arena_.end() && next->first == off + len) {
      len += next->second;
      next = free_arena_.erase(next);
    }
    if (next != free_arena_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        off = prev->first;
        len += prev->second;
        free_arena_.erase(prev);
      }
    }
    free_arena_[off] = len;
  }
  pool_cv_.notify_all();  // waiters need pieces of different sizes
}

void ExtentStore::IoError(const char* what, long res) {
  StatAdd(Stat::io_errors, 1);
  ZRTIER_LOG_ONCE(LogLevel::kWarn,
                  "%s store: %s failed (%s); the chunk stays in the tier above (further errors are "
                  "counted in io_errors)",
                  config_.name, what, strerror(static_cast<int>(-res)));
}

Status ExtentStore::CheckEntry(StoreHandle h, const Loc& loc, const unsigned char* p) const {
  const uint32_t crc = Crc32c(p, loc.len);
  if (crc == loc.crc) return Status::Ok();
  StatAdd(Stat::checksum_errors, 1);
  char what[256];
  snprintf(what, sizeof(what),
           "%s store: entry %llu (segment %u, offset %llu, %u bytes) fails its checksum: crc32c "
           "%08x written, %08x read back",
           config_.name, static_cast<unsigned long long>(h), loc.seg,
           static_cast<unsigned long long>(loc.off), loc.len, loc.crc, crc);
  ZRTIER_LOG_ONCE(LogLevel::kError, "%s (further mismatches are counted in checksum_errors)", what);
  return Status::Error(EBADMSG, what);
}

void ExtentStore::PutBatch(PutReq* reqs, size_t n) {
  // Groups of at most a quarter of the arena, so concurrent batches always make progress.
  const uint64_t cap = config_.staging_bytes / 4;
  size_t start = 0;
  while (start < n) {
    size_t count = 0;
    uint64_t bytes = 0;
    while (start + count < n) {
      uint64_t a = RoundUp(reqs[start + count].len);
      if (count > 0 && bytes + a > cap) break;
      bytes += a;
      count++;
    }
    PutReq* group = reqs + start;
    start += count;

    std::vector<uint64_t> alens(count, 0);
    std::vector<Loc> locs(count);
    std::vector<bool> have(count, false);
    std::vector<Status> statuses(count);
    for (size_t i = 0; i < count; ++i) {
      if (group[i].len == 0 || group[i].len > UINT32_MAX - kBlock)
        statuses[i] = Status::Error(EINVAL, std::string(config_.name) + " store: bad length");
      else
        alens[i] = RoundUp(group[i].len);
    }
    std::vector<Run> runs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      AllocGroupLocked(alens, &locs, &have, &statuses);
      std::vector<size_t> idx;
      for (size_t i = 0; i < count; ++i) {
        if (!have[i]) continue;
        locs[i].len = static_cast<uint32_t>(group[i].len);
        locs[i].raw_len = group[i].raw_len;
        idx.push_back(i);
      }
      runs = MakeRuns(locs, std::move(idx), 0);  // writes never span a gap
      for (Run& r : runs) r.fd = segments_[r.seg].fd;
    }
    // Fails every entry of run `r` with `st` and gives their extents back.
    auto fail_run = [&](const Run& r, const Status& st) {
      for (size_t i : r.members) {
        statuses[i] = st;
        ReleaseExtent(locs[i], true);
        have[i] = false;
      }
    };
    std::vector<Run> ready;
    uint64_t total = 0;
    for (Run& r : runs) {
      if (config_.allocate_before_write) {
        long a = os_->Fallocate(r.fd, 0, static_cast<off_t>(r.off), static_cast<off_t>(r.len));
        if (a < 0) {
          IoError("fallocate", a);
          fail_run(r, Status::Error(static_cast<int>(-a),
                                    std::string(config_.name) +
                                        " store: fallocate: " + strerror(static_cast<int>(-a))));
          continue;
        }
      }
      r.buf_off = total;
      total += r.len;
      ready.push_back(std::move(r));
    }
    Buf buf;
    if (!ready.empty()) {
      buf = TakeBuffer(total);
      if (!buf.p) {
        for (const Run& r : ready)
          fail_run(r, Status::Error(ENOMEM, std::string(config_.name) + " store: buffer"));
        ready.clear();
      }
    }
    std::vector<Uring::Op> ops;
    for (const Run& r : ready) {
      unsigned char* base = buf.p + r.buf_off;
      for (size_t i : r.members) {  // a write run has no gaps: the members fill it
        uint64_t at = locs[i].off - r.off;
        memcpy(base + at, group[i].data, group[i].len);
        memset(base + at + group[i].len, 0, locs[i].alen - group[i].len);
        locs[i].crc = Crc32c(base + at, group[i].len);  // of the bytes written, in cache now
      }
      ops.push_back(RunOp(true, buf, r));
    }
    NextRing().Run(ops.data(), ops.size());
    GiveBuffer(buf);
    for (size_t k = 0; k < ready.size(); ++k) {
      const Run& r = ready[k];
      write_requests_.fetch_add(1, std::memory_order_relaxed);
      write_entries_.fetch_add(r.members.size(), std::memory_order_relaxed);
      write_bytes_.fetch_add(r.len, std::memory_order_relaxed);
      if (ops[k].res < 0) {
        IoError("write", ops[k].res);
        int code = ops[k].res == -ENOSPC ? ENOSPC : EIO;
        fail_run(r, Status::Error(code, std::string(config_.name) + " store: write: " +
                                            strerror(static_cast<int>(-ops[k].res))));
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i : r.members) {
        PutReq& q = group[i];
        reserved_ -= locs[i].alen;
        q.out = next_++;
        entries_.emplace(q.out, locs[i]);
        usage_.entries++;
        usage_.raw_bytes += q.raw_len;
        usage_.payload_bytes += q.len;
        usage_.used_bytes += locs[i].alen;
        StatAdd(config_.raw_gauge, q.raw_len);
        StatAdd(config_.bytes_gauge, locs[i].alen);
        StatAdd(Stat::spill_write_bytes, q.len);
        statuses[i] = Status::Ok();
      }
    }
    for (size_t i = 0; i < count; ++i) group[i].status = statuses[i];
  }
}

Status ExtentStore::Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) {
  return PutAsBatch(data, len, raw_len, out);
}

void ExtentStore::GetBatch(GetReq* reqs, size_t n) {
  std::vector<Loc> locs(n);
  std::vector<size_t> idx;
  std::vector<Run> runs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < n; ++i) {
      auto it = entries_.find(reqs[i].h);
      if (it == entries_.end()) {
        reqs[i].status = Status::Error(ENOENT, std::string(config_.name) + " store: no such entry");
        continue;
      }
      locs[i] = it->second;
      idx.push_back(i);
    }
    runs = MakeRuns(locs, std::move(idx), config_.max_gap_bytes);
    for (Run& r : runs) r.fd = segments_[r.seg].fd;
  }
  // Groups of runs: at most a quarter of the arena and one ring's depth, so concurrent batches
  // always make progress; a run larger than that alone (it gets a temporary buffer).
  const uint64_t cap = config_.staging_bytes / 4;
  size_t start = 0;
  while (start < runs.size()) {
    size_t count = 0;
    uint64_t total = 0;
    while (start + count < runs.size() && count < config_.ring_entries) {
      Run& r = runs[start + count];
      if (count > 0 && total + r.len > cap) break;
      r.buf_off = total;
      total += r.len;
      count++;
    }
    Run* group = runs.data() + start;
    start += count;
    Buf buf = TakeBuffer(total);
    if (!buf.p) {
      for (size_t k = 0; k < count; ++k)
        for (size_t i : group[k].members)
          reqs[i].status = Status::Error(ENOMEM, std::string(config_.name) + " store: buffer");
      continue;
    }
    std::vector<Uring::Op> ops(count);
    for (size_t k = 0; k < count; ++k) ops[k] = RunOp(false, buf, group[k]);
    NextRing().Run(ops.data(), ops.size());
    for (size_t k = 0; k < count; ++k) {
      const Run& r = group[k];
      read_requests_.fetch_add(1, std::memory_order_relaxed);
      read_entries_.fetch_add(r.members.size(), std::memory_order_relaxed);
      read_bytes_.fetch_add(r.len, std::memory_order_relaxed);
      if (ops[k].res < 0) {
        // Only the entries this request covered fail; they stay stored, readable again.
        IoError("read", ops[k].res);
        for (size_t i : r.members)
          reqs[i].status = Status::Error(EIO, std::string(config_.name) + " store: read: " +
                                                  strerror(static_cast<int>(-ops[k].res)));
        continue;
      }
      const unsigned char* base = buf.p + r.buf_off;
      for (size_t i : r.members) {
        const unsigned char* p = base + (locs[i].off - r.off);
        StatAdd(Stat::spill_read_bytes, locs[i].len);
        reqs[i].status = CheckEntry(reqs[i].h, locs[i], p);
        if (reqs[i].status.ok()) reqs[i].out->assign(p, p + locs[i].len);
      }
    }
    GiveBuffer(buf);
  }
}

Status ExtentStore::Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) {
  Run r;
  Loc loc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(h);
    if (it == entries_.end())
      return Status::Error(ENOENT, std::string(config_.name) + " store: no such entry");
    loc = it->second;
    r.fd = segments_[loc.seg].fd;
  }
  r.off = loc.off;
  r.len = loc.alen;
  Buf b = TakeBuffer(loc.alen);
  if (!b.p) return Status::Error(ENOMEM, std::string(config_.name) + " store: buffer");
  Uring::Op op = RunOp(false, b, r);
  NextRing().Run(&op, 1);
  read_requests_.fetch_add(1, std::memory_order_relaxed);
  read_entries_.fetch_add(1, std::memory_order_relaxed);
  read_bytes_.fetch_add(r.len, std::memory_order_relaxed);
  Status s;
  if (op.res < 0) {
    IoError("read", op.res);
    s = Status::Error(
        EIO, std::string(config_.name) + " store: read: " + strerror(static_cast<int>(-op.res)));
  } else {
    StatAdd(Stat::spill_read_bytes, loc.len);
    s = CheckEntry(h, loc, b.p);
    if (s.ok()) s = fn(b.p, loc.len);
  }
  GiveBuffer(b);
  return s;
}

ExtentStore::IoCounts ExtentStore::io_counts() const {
  IoCounts c;
  c.read_requests = read_requests_.load(std::memory_order_relaxed);
  c.read_entries = read_entries_.load(std::memory_order_relaxed);
  c.read_bytes = read_bytes_.load(std::memory_order_relaxed);
  c.write_requests = write_requests_.load(std::memory_order_relaxed);
  c.write_entries = write_entries_.load(std::memory_order_relaxed);
  c.write_bytes = write_bytes_.load(std::memory_order_relaxed);
  return c;
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
