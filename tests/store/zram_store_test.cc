// Covers the zram tier on a real zram device: a private hot-added device configured (algorithm,
// disksize) and reset/removed afterwards, exact round trips through io_uring on O_DIRECT, slot
// reuse, coalesced batch reads across holes, the device-size limit, a busy device refused, the
// ram+zram+file stack spilling through zram into files, and entries corrupted on the device (a
// flipped bit, a zeroed 64 KiB block) failing every read with an error naming them. Skips with the
// reason where there is no zram or it cannot be configured.
#include "runtime/store/zram_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/store/tiered_store.h"
#include "tests/testutil/backing_bytes.h"
#include "tests/testutil/skip.h"
#include "tests/testutil/store_bytes.h"
#include "tests/testutil/temp_dir.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

std::vector<unsigned char> Bytes(size_t n, uint64_t seed) {
  return testing::SampleBytes(SampleKind::kBf16Gaussian, n, seed);
}

using testing::ReadsBack;

std::string ReadSys(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

// Every test hot-adds its own device (ZRTIER_ZRAM_DEVICE=auto), so tests never share one.
// SKIP_UNLESS_ZRAM() skips the test, with the reason, where there is no zram or no io_uring.
#define SKIP_UNLESS_ZRAM()                                             \
  do {                                                                 \
    std::string why = ZramDevice::UnavailableReason();                 \
    if (!why.empty()) GTEST_SKIP() << why;                             \
    why = testing::IoUringUnavailableReason();                         \
    if (!why.empty()) GTEST_SKIP() << "io_uring unavailable: " << why; \
  } while (0)

// Why a test skips after `s`, the result of creating a store on a zram device: no device can be
// claimed here (EPERM, EACCES, EBUSY). Empty for any other result.
std::string ClaimSkipReason(const Status& s) {
  if (s.code() == EPERM || s.code() == EACCES || s.code() == EBUSY)
    return "cannot claim a zram device: " + s.ToString();
  return "";
}

// ZRAM_STORE_OR_SKIP(size, out): *out (a std::unique_ptr<ZramStore>*) gets a store of `size`
// bytes on a device of its own, or the test skips (SKIP_UNLESS_ZRAM, ClaimSkipReason); any
// other failure is a fatal one.
#define ZRAM_STORE_OR_SKIP(size, out)                                                 \
  do {                                                                                \
    SKIP_UNLESS_ZRAM();                                                               \
    Status _st = ZramStore::Create("auto", (size), Os::Default(), (out));             \
    if (std::string _why = ClaimSkipReason(_st); !_why.empty()) GTEST_SKIP() << _why; \
    ASSERT_TRUE(_st.ok()) << _st.ToString();                                          \
  } while (0)

TEST(ZramStore, RoundTripsOnARealDeviceAndResetsIt) {
  std::string dev_dir;
  uint64_t raw0 = StatGet(Stat::zram_raw_bytes), bytes0 = StatGet(Stat::zram_bytes);
  {
    std::unique_ptr<ZramStore> store;
    ZRAM_STORE_OR_SKIP(16 << 20, &store);
    EXPECT_STREQ(store->name(), "zram");
    dev_dir = "/sys/block/zram" + std::to_string(store->device().id());
    EXPECT_EQ(ReadSys(dev_dir + "/disksize"), std::to_string(16 << 20));
    std::string current;
    auto algs = store->device().Algorithms(&current);
    EXPECT_EQ(current, store->algorithm());
    bool has_zstd = std::find(algs.begin(), algs.end(), "zstd") != algs.end();
    bool has_lz4 = std::find(algs.begin(), algs.end(), "lz4") != algs.end();
    if (has_zstd) {
      EXPECT_EQ(current, "zstd");
    } else if (has_lz4) {
      EXPECT_EQ(current, "lz4");
    }
    printf("device %s, algorithm %s, O_DIRECT %d\n", store->device().path().c_str(),
           current.c_str(), store->direct_io());

    testing::Entries items;
    for (size_t n : {1, 4096, 4097, 45000, 65536, 300000})
      ASSERT_TRUE(testing::PutEntry(store.get(), Bytes(n, n), n, &items));
    for (auto& [h, d] : items) EXPECT_TRUE(ReadsBack(store.get(), h, d));
    uint64_t raw_sum = 0;
    for (auto& it : items) raw_sum += it.second.size();
    EXPECT_EQ(StatGet(Stat::zram_raw_bytes) - raw0, raw_sum);
    EXPECT_EQ(StatGet(Stat::zram_bytes) - bytes0, store->Usage().used_bytes);
    uint64_t orig, compr, mem;
    ASSERT_TRUE(store->device().MmStat(&orig, &compr, &mem).ok());
    EXPECT_GT(orig, 0u) << "the bytes are on the device";
    for (auto& it : items) store->Free(it.first);
    EXPECT_EQ(store->Usage().used_bytes, 0u);
    EXPECT_EQ(StatGet(Stat::zram_raw_bytes), raw0);
    EXPECT_EQ(StatGet(Stat::zram_bytes), bytes0);
  }
  // Reset: a hot-added device is gone, an existing one is back to disksize 0.
  if (std::filesystem::exists(dev_dir)) {
    EXPECT_EQ(ReadSys(dev_dir + "/disksize"), "0");
  }
}

TEST(ZramStore, DeviceSizeLimitsAndSlotsAreReused) {
  std::unique_ptr<ZramStore> store;
  ZRAM_STORE_OR_SKIP(1 << 20, &store);
  auto d = Bytes(60000, 3);  // 15 slots of 4 KiB
  std::vector<StoreHandle> hs;
  Status s;
  for (;;) {
    StoreHandle h;
    s = store->Put(d.data(), d.size(), 65536, &h);
    if (!s.ok()) break;
    hs.push_back(h);
  }
  EXPECT_EQ(s.code(), ENOSPC);
  EXPECT_EQ(hs.size(), 256u / 15);
  store->Free(hs[3]);
  StoreHandle h;
  ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &h).ok()) << "the freed slots are reused";
  hs[3] = h;
  for (StoreHandle x : hs) ASSERT_TRUE(ReadsBack(store.get(), x, d));
}

TEST(ZramStore, BatchOfAdjacentSlotsIsReadInFewRequestsWithHoles) {
  std::unique_ptr<ZramStore> store;
  ZRAM_STORE_OR_SKIP(8 << 20, &store);
  const size_t n = 48;
  std::vector<std::vector<unsigned char>> data;
  for (size_t i = 0; i < n; ++i) data.push_back(Bytes(10000 + i * 613, 50 + i));
  std::vector<StoreHandle> hs = testing::PutAll(store.get(), data);
  for (size_t i = 0; i < n; i += 5) store->Free(hs[i]);  // holes between the rest
  std::vector<size_t> live;
  for (size_t i = 0; i < n; ++i)
    if (i % 5) live.push_back(i);
  std::reverse(live.begin(), live.end());  // out of order
  ExtentStore::IoCounts c0 = store->io_counts();
  ASSERT_TRUE(testing::BatchReadsBack(store.get(), hs, data, live));
  ExtentStore::IoCounts c1 = store->io_counts();
  EXPECT_EQ(c1.read_entries - c0.read_entries, live.size());
  EXPECT_LT(c1.read_requests - c0.read_requests, live.size() / 4);
}

TEST(ZramStore, BusyDeviceIsRefused) {
  std::unique_ptr<ZramStore> first;
  ZRAM_STORE_OR_SKIP(1 << 20, &first);
  std::unique_ptr<ZramStore> second;
  Status s = ZramStore::Create(first->device().path(), 1 << 20, Os::Default(), &second);
  EXPECT_EQ(s.code(), EBUSY) << s.ToString();
  EXPECT_NE(s.message().find("ZRTIER_ZRAM_DEVICE"), std::string::npos);
  s = ZramStore::Create("/dev/sda", 1 << 20, Os::Default(), &second);
  EXPECT_EQ(s.code(), EINVAL);
}

TEST(ZramStore, StackSpillsThroughZramIntoFiles) {
  SKIP_UNLESS_ZRAM();
  const std::string dir = testing::MakeTempDir("/var/tmp/zrtier-zram-test-");
  ASSERT_FALSE(dir.empty());
  Options opts;
  ASSERT_TRUE(opts.Set(Opt::kStoreBackend, "ram+zram+file").ok());
  ASSERT_TRUE(opts.Set(Opt::kStoreLimit, "512K").ok());
  ASSERT_TRUE(opts.Set(Opt::kZramSize, "1M").ok());
  ASSERT_TRUE(opts.Set(Opt::kSpillDir, dir).ok());
  {
    std::unique_ptr<ChunkStore> base;
    Status s = CreateStore(opts, Os::Default(), &base);
    if (std::string why = ClaimSkipReason(s); !why.empty()) GTEST_SKIP() << why;
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto* store = static_cast<TieredStore*>(base.get());
    EXPECT_STREQ(store->name(), "ram+zram+file");
    testing::Entries items;
    for (int i = 0; i < 80; ++i)  // 80 x 40 KB = 3.2 MB through 0.5 MB RAM + 1 MB zram
      ASSERT_TRUE(testing::PutEntry(store, Bytes(40000, 100 + i), 65536, &items));
    store->WaitIdle();
    EXPECT_GT(store->TierUsage(1).entries, 0u) << "zram holds some";
    EXPECT_GT(store->TierUsage(2).entries, 0u) << "files hold the rest";
    for (auto& [h, d] : items) ASSERT_TRUE(ReadsBack(store, h, d));
  }
  std::filesystem::remove_all(dir);
}

// A process that ends without releasing its device (killed, or exiting with the store in use)
// leaves it configured; the next Claim resets it and hot-removes it (zram_device.h).
// Issue #40 row 5: bytes changed on the device (written through the block device behind the
// store's back) fail every read with an error naming the entry, never come back as wrong bytes.
TEST(ZramStore, CorruptedEntriesFailEveryReadNamingThem) {
  std::unique_ptr<ZramStore> store;
  ZRAM_STORE_OR_SKIP(32 << 20, &store);
  testing::BackingBytes device(store->device().path());
  ASSERT_TRUE(device.ok()) << device.why();
  const uint64_t seed = testing::PrintedTestSeed();
  EXPECT_TRUE(testing::CorruptionFailsLoudly(store.get(), &device, "zram", seed));
  EXPECT_TRUE(testing::EveryFlipCaught(store.get(), &device, "zram", 1000, seed));
}

TEST(ZramDeviceTest, ADeviceLeftByAGoneProcessIsResetAtTheNextClaim) {
  if (std::string why = ZramDevice::UnavailableReason(); !why.empty()) GTEST_SKIP() << why;
  if (geteuid() != 0) GTEST_SKIP() << "hot_add and reset need root";
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto* d = new ZramDevice(Os::Default());  // never released: the process just ends
    int id = -1;
    if (d->Claim("auto").ok() && d->hot_added() && d->SetDiskSize(16 << 20).ok()) id = d->id();
    (void)!write(fds[1], &id, sizeof(id));
    _exit(0);
  }
  int id = -1;
  ASSERT_EQ(read(fds[0], &id, sizeof(id)), static_cast<ssize_t>(sizeof(id)));
  close(fds[0]);
  close(fds[1]);
  int status = 0;
  waitpid(child, &status, 0);
  if (id < 0) GTEST_SKIP() << "no device could be hot-added and configured here";
  const std::string disksize = "/sys/block/zram" + std::to_string(id) + "/disksize";
  EXPECT_NE(ReadSys(disksize), "0") << "the gone process left its device configured";
  EXPECT_GE(ZramDevice::ReapOrphans(Os::Default()), 1);
  EXPECT_FALSE(std::filesystem::exists(disksize)) << "the hot-added device is removed";
  EXPECT_FALSE(std::filesystem::exists("/run/zrtier/zram" + std::to_string(id) + ".owner"));
}

TEST(ZramDeviceTest, ADeviceNameMustBeZramAndItsNumber) {
  ZramDevice d(Os::Default());
  EXPECT_EQ(d.Claim("/dev/zram0abc").code(), EINVAL);
  EXPECT_EQ(d.Claim("/dev/zram").code(), EINVAL);
  EXPECT_EQ(d.Claim("/dev/sda").code(), EINVAL);
}

}  // namespace
}  // namespace zrtier
