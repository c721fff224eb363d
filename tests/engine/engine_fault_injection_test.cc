// Engine error paths with injected failures (FaultyOs, a failing store): creation fails with a
// Status naming cause and fix; a full or failing store keeps chunks resident and nothing is lost
// (also when an adopted chunk's write-back has no room in T1); a failed batched drop of clean
// chunks falls back to one drop per chunk; a dead fault handler is reported on stderr.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/external_holder.h"
#include "tests/testutil/faulty_os.h"
#include "tests/testutil/sample_bytes.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

using testing::SampleBytes;
using testing::TestEngineOptions;

// A store whose Put/Get can be made to fail; otherwise the real store stack.
class FlakyStore : public ChunkStore {
 public:
  FlakyStore() {
    Status st = CreateStore(TestEngineOptions(), Os::Default(), &inner_);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  const char* name() const override { return "flaky"; }
  Status Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) override {
    while (gate.load() && std::this_thread::get_id() != gate_owner) usleep(1000);
    if (int e = put_err.load()) return Status::Error(e, "injected Put failure");
    return inner_->Put(data, len, raw_len, out);
  }
  Status Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) override {
    if (int e = get_err.load()) return Status::Error(e, "injected Get failure");
    return inner_->Get(h, fn);
  }
  void Free(StoreHandle h) override { inner_->Free(h); }
  StoreUsage Usage() const override { return inner_->Usage(); }

  std::atomic<int> put_err{0};
  std::atomic<int> get_err{0};
  // While `gate` is set, Put from any thread but `gate_owner` waits (evictors stuck in the store).
  std::atomic<bool> gate{false};
  std::thread::id gate_owner;

 private:
  std::unique_ptr<ChunkStore> inner_;
};

// A region of `chunks` chunks in an engine over a FlakyStore, which *flaky points at (the engine
// owns it); `p` is null, and a test failure added, if either cannot be made.
testing::TestRegion MakeFlakyRegion(size_t chunks, FlakyStore** flaky) {
  auto store = std::make_unique<FlakyStore>();
  *flaky = store.get();
  return testing::MakeTestRegion(
      chunks, testing::MakeTestEngine(TestEngineOptions(), Os::Default(), std::move(store)));
}

// Success if creating an engine over `os` fails with `code`, names `words` in its message and
// leaves no engine.
::testing::AssertionResult CreateFails(Os* os, int code, const char* words) {
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(TestEngineOptions(), os, nullptr, &e);
  if (st.code() == code && st.message().find(words) != std::string::npos && !e)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "Create: " << st.ToString() << (e ? ", an engine made" : "") << "; want error " << code
         << " naming \"" << words << "\"";
}

// A whole chunk written while T1 is full goes straight to the store: the writer neither waits for
// the evictors (here stuck in the store) nor installs the chunk for them to encode again.
TEST(EngineFaultInjectionTest, WholeChunksWrittenWhileT1IsFullGoStraightToTheStore) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto store = std::make_unique<FlakyStore>();
  FlakyStore* flaky = store.get();
  flaky->gate_owner = std::this_thread::get_id();
  flaky->gate = true;
  auto [e, cs, r, p] = testing::MakeTestRegion(
      32, testing::MakeTestEngine(TestEngineOptions("1M"), Os::Default(), std::move(store)));
  ASSERT_TRUE(p);
  // The CPU fills T1 up to the limit and its slack (4 chunks at this limit): the faults install
  // every chunk, the evictors wake and get stuck in Put with the oldest chunks claimed. Chunk by
  // chunk: a large memcpy may store its tail first, and a chunk an evictor holds would block it.
  const size_t fill = (1 << 20) / cs + 4;
  std::vector<char> model = SampleBytes<char>(SampleKind::kBf16Gaussian, r.size, 12);
  for (size_t k = 0; k < fill; ++k) memcpy(p + k * cs, model.data() + k * cs, cs);
  const EngineUsage before = e->Usage();
  const size_t n = 8;
  const uint64_t t0 = MonotonicNs();
  ASSERT_TRUE(e->Write(p + fill * cs, model.data() + fill * cs, n * cs).ok());
  const double secs = (MonotonicNs() - t0) / 1e9;
  const EngineUsage after = e->Usage();
  EXPECT_EQ(after.resident_bytes, before.resident_bytes) << "written chunks were installed";
  EXPECT_EQ(after.stored_raw_bytes, before.stored_raw_bytes + n * cs);
  printf("Write of %zu chunks into a full T1: %.3f s\n", n, secs);
  flaky->gate = false;
  std::vector<char> out(r.size);
  ASSERT_TRUE(e->Read(p, r.size, out.data(), nullptr).ok());
  EXPECT_EQ(0, memcmp(out.data(), model.data(), (fill + n) * cs));
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_EQ(0, memcmp(p, model.data(), (fill + n) * cs));
}

TEST(EngineFaultInjectionTest, UserfaultfdUnavailableNamesTheFix) {
  for (int err : {EPERM, ENOSYS}) {
    FaultyOs os;
    os.Fail(OsCall::kUserfaultfd, err);
    EXPECT_TRUE(CreateFails(&os, err, "vm.unprivileged_userfaultfd=1"));
  }
}

TEST(EngineFaultInjectionTest, MissingWriteProtectNamesTheKernel) {
  ZRTIER_SKIP_UNLESS_UFFD();
  FaultyOs os;
  os.Fail(OsCall::kIoctl, EINVAL);  // UFFDIO_API refuses the features asked for
  EXPECT_TRUE(CreateFails(&os, ENOTSUP, "5.7"));
}

TEST(EngineFaultInjectionTest, ArenaMmapFailureNamesTheOption) {
  ZRTIER_SKIP_UNLESS_UFFD();
  FaultyOs os;
  os.Fail(OsCall::kMmap, ENOMEM);
  EXPECT_TRUE(CreateFails(&os, ENOMEM, "ZRTIER_ARENA"));
  EXPECT_GE(os.Count(OsCall::kClose), 1);  // the userfaultfd was closed again
}

TEST(EngineFaultInjectionTest, RegisterAndEventfdFailuresAreReported) {
  ZRTIER_SKIP_UNLESS_UFFD();
  {
    FaultyOs os;
    os.Fail(OsCall::kIoctl, EPERM, /*after=*/1);  // UFFDIO_API ok, UFFDIO_REGISTER fails
    EXPECT_TRUE(CreateFails(&os, EPERM, "UFFDIO_REGISTER"));
  }
  {
    FaultyOs os;
    os.Fail(OsCall::kEventfd, EMFILE);
    EXPECT_TRUE(CreateFails(&os, EMFILE, "eventfd"));
  }
}

TEST(EngineFaultInjectionTest, FullStoreKeepsChunksResidentAndReadable) {
  ZRTIER_SKIP_UNLESS_UFFD();
  FlakyStore* flaky;
  auto [e, cs, r, p] = MakeFlakyRegion(16, &flaky);
  ASSERT_TRUE(p);
  std::vector<char> data = SampleBytes<char>(SampleKind::kBf16Gaussian, r.size, 11);
  memcpy(r.base, data.data(), r.size / 2);
  flaky->put_err.store(ENOSPC);
  uint64_t full0 = StatGet(Stat::store_full);
  Status st = e->EvictTo(0);
  EXPECT_EQ(st.code(), ENOSPC);
  EXPECT_GT(StatGet(Stat::store_full), full0);
  EXPECT_GT(e->Usage().resident_bytes, 0u);
  // A small budget with a full store must not hang writers: chunks stay resident.
  e->SetResidentLimit(2 * cs);
  memcpy(static_cast<char*>(r.base) + r.size / 2, data.data() + r.size / 2, r.size / 2);
  EXPECT_EQ(0, memcmp(r.base, data.data(), r.size));
  std::vector<char> out(r.size);
  ASSERT_TRUE(e->Read(r.base, r.size, out.data(), nullptr).ok());
  EXPECT_EQ(out, data);
  // Room again: everything evicts and comes back exactly.
  flaky->put_err.store(0);
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_EQ(e->Usage().resident_bytes, 0u);
  EXPECT_EQ(0, memcmp(r.base, data.data(), r.size));
}

TEST(EngineFaultInjectionTest, StoreIoErrorOnEvictionLosesNothing) {
  ZRTIER_SKIP_UNLESS_UFFD();
  FlakyStore* flaky;
  auto [e, cs, r, p] = MakeFlakyRegion(4, &flaky);
  ASSERT_TRUE(p);
  std::vector<char> data = SampleBytes<char>(SampleKind::kText, r.size, 12);
  memcpy(r.base, data.data(), r.size);
  flaky->put_err.store(EIO);
  uint64_t io0 = StatGet(Stat::io_errors);
  EXPECT_EQ(e->EvictRange(r.base, r.size).code(), EIO);
  EXPECT_GT(StatGet(Stat::io_errors), io0);
  EXPECT_EQ(0, memcmp(r.base, data.data(), r.size));
  // A write after the failed eviction is seen (the chunk went back write-protected and clean).
  static_cast<char*>(r.base)[7] = 'Z';
  data[7] = 'Z';
  flaky->put_err.store(0);
  ASSERT_TRUE(e->EvictTo(0).ok());
  std::vector<char> out(r.size);
  ASSERT_TRUE(e->Read(r.base, r.size, out.data(), nullptr).ok());
  EXPECT_EQ(out, data);
  // A store that cannot read an entry: Read says so and names the chunk.
  flaky->get_err.store(EIO);
  Status st = e->Read(r.base, 16, out.data(), nullptr);
  EXPECT_EQ(st.code(), EIO);
  EXPECT_NE(st.message().find("chunk at"), std::string::npos) << st.message();
  flaky->get_err.store(0);
  EXPECT_EQ(0, memcmp(r.base, data.data(), r.size));
}

// Attach (an owned T0 slot's write-back) installs the bytes while T1 has room; without room it
// encodes them into the store (same generation, no pages, an all-zero chunk stores nothing), and
// a store that refuses the entry makes it install past the limit. Every byte reads back.
TEST(EngineFaultInjectionTest, AttachWithoutRoomStoresTheBytesOrInstallsThem) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const size_t n = 4;
  FlakyStore* flaky;
  auto [e, cs, r, p] = MakeFlakyRegion(n, &flaky);
  ASSERT_TRUE(p);
  testing::ExternalHolder holder(cs);
  e->SetExternalCopies(&holder);
  std::vector<char> data = SampleBytes<char>(SampleKind::kBf16Gaussian, n * cs, 14);
  memset(data.data() + 2 * cs, 0, cs);  // chunk 2: all zero
  std::vector<uint64_t> gens(n);
  ASSERT_TRUE(e->Adopt(p, n, gens.data(), [&] {
                 for (size_t k = 0; k < n; ++k) holder.Hold(r.id, k, gens[k], data.data() + k * cs);
               }).ok());
  EXPECT_EQ(e->Usage().external_bytes, n * cs);

  // No limit: room, installed.
  EXPECT_EQ(e->ResidentRoom(), UINT64_MAX);
  bool installed = false;
  ASSERT_TRUE(e->Attach(p, gens[0], data.data(), &installed).ok());
  EXPECT_TRUE(installed);
  EXPECT_EQ(e->Usage().resident_bytes, cs);
  e->SetResidentLimit(3 * cs);
  EXPECT_EQ(e->ResidentRoom(), 2 * cs);

  // A limit of one chunk, reached: chunks 1 (bf16) and 2 (zero) go to the store, encoded.
  e->SetResidentLimit(cs);
  EXPECT_EQ(e->ResidentRoom(), 0u);
  const uint64_t encoded0 = StatGet(Stat::bytes_encoded);
  for (size_t k : {1, 2}) {
    installed = true;
    ASSERT_TRUE(e->Attach(p + k * cs, gens[k], data.data() + k * cs, &installed).ok());
    EXPECT_FALSE(installed) << "chunk " << k;
    EXPECT_EQ(e->Generation(p + k * cs), gens[k]) << "chunk " << k;
  }
  EXPECT_EQ(StatGet(Stat::bytes_encoded) - encoded0, 2 * cs);
  EngineUsage u = e->Usage();
  EXPECT_EQ(u.resident_bytes, cs);
  EXPECT_EQ(u.stored_raw_bytes, cs);  // chunk 1; chunk 2 is empty
  EXPECT_EQ(u.external_bytes, cs);    // chunk 3
  uint64_t g[n];
  bool resident[n];
  e->Generations(p, n, g, resident);
  EXPECT_TRUE(resident[0]);
  EXPECT_FALSE(resident[1]);
  EXPECT_FALSE(resident[2]);

  // The store refuses chunk 3: installed anyway (nothing waits, nothing is lost).
  flaky->put_err.store(ENOSPC);
  const uint64_t full0 = StatGet(Stat::store_full);
  installed = false;
  ASSERT_TRUE(e->Attach(p + 3 * cs, gens[3], data.data() + 3 * cs, &installed).ok());
  EXPECT_TRUE(installed);
  EXPECT_GE(StatGet(Stat::store_full) - full0, 1u);  // (the evictor may fail on it too)
  EXPECT_EQ(e->Usage().external_bytes, 0u);
  flaky->put_err.store(0);

  std::vector<char> out(n * cs);
  ASSERT_TRUE(e->Read(p, n * cs, out.data(), nullptr).ok());
  EXPECT_EQ(out, data);
  EXPECT_EQ(0, memcmp(p, data.data(), n * cs));  // CPU loads: faults decode chunk 1
  EXPECT_TRUE(e->Free(p).ok());
  e->SetExternalCopies(nullptr);
}

TEST(EngineFaultInjectionTest, TinyStoreLimitFillsUpWithoutLoss) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Options o = TestEngineOptions();
  ASSERT_TRUE(o.Set(Opt::kStoreLimit, "1M").ok());
  auto e = testing::MakeTestEngine(o);
  ASSERT_TRUE(e);
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(4 << 20, &r).ok());
  std::vector<char> data = SampleBytes<char>(SampleKind::kRandom, r.size, 13);  // incompressible
  memcpy(r.base, data.data(), r.size);
  Status st = e->EvictTo(0);
  EXPECT_EQ(st.code(), ENOSPC) << st.ToString();
  EngineUsage u = e->Usage();
  EXPECT_GT(u.resident_bytes, 0u);
  EXPECT_GT(u.stored_raw_bytes, 0u);
  EXPECT_LE(u.store.used_bytes, 1u << 20);
  std::vector<char> out(r.size);
  ASSERT_TRUE(e->Read(r.base, r.size, out.data(), nullptr).ok());
  EXPECT_EQ(out, data);
  EXPECT_EQ(0, memcmp(r.base, data.data(), r.size));
}

TEST(EngineFaultInjectionTest, MadviseFailureDuringEvictionKeepsTheChunk) {
  ZRTIER_SKIP_UNLESS_UFFD();
  FaultyOs os;
  auto [e, cs, r, p] = testing::MakeTestRegion(2, TestEngineOptions(), &os);
  ASSERT_TRUE(p);
  std::vector<char> data = SampleBytes<char>(SampleKind::kFp16Gaussian, r.size, 14);
  memcpy(r.base, data.data(), r.size);
  os.Fail(OsCall::kMadvise, EIO);
  EXPECT_EQ(e->EvictTo(0).code(), EIO);
  EXPECT_EQ(0, memcmp(r.base, data.data(), r.size));
  os.ClearAll();
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_EQ(0, memcmp(r.base, data.data(), r.size));
}

// A region of 32 chunks of sample data over a FaultyOs whose every chunk is resident and clean
// with a current store copy (evicted once, then read back).
class CleanRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZRTIER_SKIP_UNLESS_UFFD();
    t_ = testing::MakeTestRegion(32, TestEngineOptions(), &os_);
    ASSERT_TRUE(t_.p);
    data_ = SampleBytes<char>(SampleKind::kBf16Gaussian, t_.r.size, 15);
    memcpy(t_.p, data_.data(), t_.r.size);
    ASSERT_TRUE(t_.e->EvictTo(0).ok());
    ExpectIntact();  // faults restore every chunk, clean
    EXPECT_EQ(t_.e->Usage().resident_bytes, t_.r.size);
  }
  // Every byte as written (CPU loads: stored chunks fault back in).
  void ExpectIntact() { EXPECT_EQ(0, memcmp(t_.p, data_.data(), t_.r.size)); }
  // Nothing resident, and every byte as written.
  void ExpectEvictedIntact() {
    EXPECT_EQ(t_.e->Usage().resident_bytes, 0u);
    ExpectIntact();
  }

  FaultyOs os_;
  testing::TestRegion t_;
  std::vector<char> data_;
};

// Clean chunks with a current store copy are dropped several at a time (one madvise call for a
// batch of them), not one call per chunk.
TEST_F(CleanRegionTest, CleanChunksAreDroppedInBatches) {
  const int calls = os_.Count(OsCall::kMadvise);
  ASSERT_TRUE(t_.e->EvictTo(0).ok());
  EXPECT_LE(os_.Count(OsCall::kMadvise) - calls, 4);
  ExpectEvictedIntact();
}

// A batched drop that fails is retried chunk by chunk; a chunk whose own drop fails stays
// resident and intact, and is evicted once the failure is gone.
TEST_F(CleanRegionTest, AFailedBatchedDropFallsBackToOneDropPerChunk) {
  os_.Fail(OsCall::kMadvise, EIO, /*after=*/0, /*times=*/1);  // the first batch's call
  ASSERT_TRUE(t_.e->EvictTo(0).ok());
  ExpectEvictedIntact();
  EXPECT_EQ(t_.e->Usage().resident_bytes, t_.r.size);
  os_.Fail(OsCall::kMadvise, EIO, /*after=*/0, /*times=*/2);  // a batch's call, then one chunk's
  EXPECT_EQ(t_.e->EvictTo(0).code(), EIO);
  EXPECT_GE(t_.e->Usage().resident_bytes, t_.cs);
  ExpectIntact();
  os_.ClearAll();
  ASSERT_TRUE(t_.e->EvictTo(0).ok());
  ExpectEvictedIntact();
}

TEST(EngineFaultInjectionTest, DeadFaultHandlerIsReported) {
  ZRTIER_SKIP_UNLESS_UFFD();
  FaultyOs os;
  auto e = testing::MakeTestEngine(TestEngineOptions(), &os);
  ASSERT_TRUE(e);
  ::testing::internal::CaptureStderr();
  os.Fail(OsCall::kPoll, EBADF);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("fault handler"), std::string::npos) << err;
  EXPECT_NE(err.find("has stopped"), std::string::npos) << err;
}

}  // namespace
}  // namespace zrtier
