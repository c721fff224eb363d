#include "tests/testutil/backing_bytes.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>

#include "runtime/base/stats.h"
#include "tests/testutil/store_bytes.h"

namespace zrtier::testing {
namespace {

constexpr uint64_t kBlock = 4096;

struct FreeDeleter {
  void operator()(unsigned char* p) const { free(p); }
};
using AlignedBuf = std::unique_ptr<unsigned char, FreeDeleter>;
AlignedBuf Aligned(size_t n) {
  return AlignedBuf(static_cast<unsigned char*>(aligned_alloc(kBlock, n)));
}

}  // namespace

std::vector<std::string> OpenSpillFiles(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  const std::string canon = fs::weakly_canonical(dir, ec).string();
  for (auto& e : fs::directory_iterator("/proc/self/fd", ec)) {
    std::string target = fs::read_symlink(e.path(), ec).string();
    if (!ec && (target.rfind(dir + "/", 0) == 0 || target.rfind(canon + "/", 0) == 0))
      out.push_back(e.path().string());
  }
  return out;
}

BackingBytes::BackingBytes(const std::string& path) {
  fd_ = open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd_ < 0 && errno == EINVAL) fd_ = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0) why_ = path + ": " + strerror(errno);
}

BackingBytes::~BackingBytes() {
  if (fd_ >= 0) close(fd_);
}

bool BackingBytes::Io(bool write, uint64_t off, size_t len, unsigned char* buf) {
  ssize_t n = write ? pwrite(fd_, buf, len, static_cast<off_t>(off))
                    : pread(fd_, buf, len, static_cast<off_t>(off));
  if (n == static_cast<ssize_t>(len)) return true;
  why_ = std::string(write ? "pwrite" : "pread") + ": " + (n < 0 ? strerror(errno) : "short");
  return false;
}

int64_t BackingBytes::Find(const std::vector<unsigned char>& bytes, uint64_t limit) {
  limit = limit / kBlock * kBlock;
  AlignedBuf buf = Aligned(limit);
  if (!buf || bytes.empty() || !Io(false, 0, limit, buf.get())) return -1;
  const size_t n = std::min<size_t>(bytes.size(), kBlock);
  const void* at = memmem(buf.get(), limit, bytes.data(), n);
  return at ? static_cast<const unsigned char*>(at) - buf.get() : -1;
}

bool BackingBytes::Xor(uint64_t off, unsigned char mask) {
  AlignedBuf buf = Aligned(kBlock);
  const uint64_t base = off / kBlock * kBlock;
  if (!Io(false, base, kBlock, buf.get())) return false;
  buf.get()[off - base] ^= mask;
  return Io(true, base, kBlock, buf.get());
}

bool BackingBytes::Zero(uint64_t off, uint64_t len) {
  AlignedBuf buf = Aligned(len);
  memset(buf.get(), 0, len);
  return Io(true, off, len, buf.get());
}

::testing::AssertionResult ReadFailsLoudly(ExtentStore* s, StoreHandle h, const char* tier) {
  const std::string name = std::string(tier) + " store: entry " + std::to_string(h) + " (";
  auto loud = [&](const Status& st, const char* how) -> ::testing::AssertionResult {
    if (st.code() != EBADMSG)
      return ::testing::AssertionFailure() << how << " of entry " << h << " returned "
                                           << (st.ok() ? "Ok" : st.ToString()) << ", not EBADMSG";
    if (st.message().find(name) == std::string::npos ||
        st.message().find("offset ") == std::string::npos)
      return ::testing::AssertionFailure()
             << how
             << ": the error does not name the tier, the entry and its offset: " << st.message();
    return ::testing::AssertionSuccess();
  };
  bool called = false;
  Status st = s->Get(h, [&](const void*, size_t) {
    called = true;
    return Status::Ok();
  });
  if (called) return ::testing::AssertionFailure() << "Get handed out the corrupted bytes";
  ::testing::AssertionResult get = loud(st, "Get");
  if (!get) return get;
  std::vector<std::vector<unsigned char>> out;
  std::vector<ExtentStore::GetReq> reqs = GetReqs({h}, &out);
  s->GetBatch(reqs.data(), reqs.size());
  if (!out[0].empty()) return ::testing::AssertionFailure() << "GetBatch handed out bytes";
  return loud(reqs[0].status, "GetBatch");
}

::testing::AssertionResult EveryFlipCaught(ExtentStore* s, BackingBytes* b, const char* tier,
                                           int flips, uint64_t seed) {
  // ~seed: bytes unlike CorruptionFailsLoudly's entries of the same seed (Find takes the first).
  const std::vector<unsigned char> want = SampleBytes(SampleKind::kBf16Gaussian, 100000, ~seed);
  StoreHandle h = 0;
  Status st = s->Put(want.data(), want.size(), 2 * want.size(), &h);
  if (!st.ok()) return ::testing::AssertionFailure() << "Put: " << st.ToString();
  const int64_t found = b->Find(want, 16 << 20);
  if (found < 0) return ::testing::AssertionFailure() << "entry not found: " << b->why();
  const uint64_t off = static_cast<uint64_t>(found);
  std::mt19937_64 rng(seed);
  for (int k = 0; k < flips; ++k) {
    const uint64_t bit = rng() % (want.size() * 8);
    const unsigned char mask = static_cast<unsigned char>(1u << (bit % 8));
    if (!b->Xor(off + bit / 8, mask))
      return ::testing::AssertionFailure() << "flipping: " << b->why();
    ::testing::AssertionResult caught = ReadFailsLoudly(s, h, tier);
    if (!caught) return caught << " (flip " << k << " of " << flips << ": bit " << bit << ")";
    if (!b->Xor(off + bit / 8, mask))
      return ::testing::AssertionFailure() << "flipping back: " << b->why();
    ::testing::AssertionResult back = ReadsBack(s, h, want);
    if (!back) return back << " (after flip " << k << " was undone)";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult CorruptionFailsLoudly(ExtentStore* s, BackingBytes* b, const char* tier,
                                                 uint64_t seed) {
  std::vector<std::vector<unsigned char>> data;
  for (uint64_t i = 0; i < 3; ++i)
    data.push_back(SampleBytes(SampleKind::kBf16Gaussian, 200000, seed + i));
  const std::vector<StoreHandle> hs = PutAll(s, data);
  const int64_t found = b->Find(data[1], 16 << 20);
  if (found < 0) return ::testing::AssertionFailure() << "entry not found: " << b->why();
  const uint64_t off = static_cast<uint64_t>(found);
  // The middle entry fails alone, loudly; the others read back exactly, alone and in a batch.
  auto only_middle_fails = [&](const char* how) -> ::testing::AssertionResult {
    const uint64_t errors0 = StatGet(Stat::checksum_errors);
    ::testing::AssertionResult r = ReadFailsLoudly(s, hs[1], tier);
    if (!r) return r << " (" << how << ")";
    if (StatGet(Stat::checksum_errors) < errors0 + 2)
      return ::testing::AssertionFailure() << how << ": checksum_errors did not count the reads";
    std::vector<std::vector<unsigned char>> got;
    std::vector<ExtentStore::GetReq> reqs = GetReqs(hs, &got);
    s->GetBatch(reqs.data(), reqs.size());
    if (reqs[1].status.code() != EBADMSG || !got[1].empty())
      return ::testing::AssertionFailure() << how << ": a batch read the corrupted entry";
    for (size_t k : {0, 2}) {
      if (!reqs[k].status.ok())
        return ::testing::AssertionFailure()
               << how << ": entry " << k << " of the batch failed: " << reqs[k].status.ToString();
      ::testing::AssertionResult same = SameBytes(got[k], data[k]);
      if (!same) return same << " (" << how << ", entry " << k << " of the batch)";
      same = ReadsBack(s, hs[k], data[k]);
      if (!same) return same << " (" << how << ")";
    }
    return ::testing::AssertionSuccess();
  };
  std::mt19937_64 rng(seed);
  const uint64_t bit = rng() % (data[1].size() * 8);
  const unsigned char mask = static_cast<unsigned char>(1u << (bit % 8));
  if (!b->Xor(off + bit / 8, mask)) return ::testing::AssertionFailure() << b->why();
  ::testing::AssertionResult r = only_middle_fails("one flipped bit");
  if (!r) return r << " (bit " << bit << ")";
  if (!b->Xor(off + bit / 8, mask)) return ::testing::AssertionFailure() << b->why();
  r = ReadsBack(s, hs[1], data[1]);
  if (!r) return r << " (the flip undone)";
  const uint64_t block = 64 << 10, zero = (off + block - 1) / block * block;
  if (zero + block > off + data[1].size())
    return ::testing::AssertionFailure() << "no whole 64 KiB block inside the entry";
  if (!b->Zero(zero, block)) return ::testing::AssertionFailure() << b->why();
  return only_middle_fails("a zeroed 64 KiB block");
}

}  // namespace zrtier::testing
