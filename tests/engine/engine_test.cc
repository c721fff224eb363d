// Engine: regions carved from the arena, CPU faults through the real userfaultfd pager, eviction to
// the store and exact read-back (CPU loads, Read, Write), generations and free (fork:
// fork_test.cc).
#include "runtime/engine/engine.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/external_holder.h"
#include "tests/testutil/faulty_os.h"
#include "tests/testutil/sample_bytes.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

using testing::MakeTestEngine;
using testing::MakeTestRegion;
using testing::SampleBytes;
using testing::TestEngineOptions;

TEST(EngineTest, FreshRegionReadsZeroAndCostsNothing) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(1000000, &r).ok());
  EXPECT_EQ(r.size % e->chunk_size(), 0u);
  EXPECT_GE(r.size, 1000000u);
  std::vector<char> out(r.size, 1);
  bool zero = false;
  ASSERT_TRUE(e->Read(r.base, r.size, out.data(), &zero).ok());
  EXPECT_TRUE(zero);
  ASSERT_TRUE(e->Read(r.base, r.size, out.data(), nullptr).ok());
  EXPECT_TRUE(Codec::IsZero(out.data(), out.size()));
  EXPECT_EQ(e->Usage().resident_bytes, 0u);
  EXPECT_EQ(e->Usage().empty_bytes, r.size);
  // A CPU load installs zeros (one chunk).
  volatile char* p = static_cast<char*>(r.base);
  EXPECT_EQ(p[12345], 0);
  EXPECT_EQ(e->Usage().resident_bytes, e->chunk_size());
  ASSERT_TRUE(e->Free(r.base).ok());
  EXPECT_EQ(e->Usage().regions, 0u);
}

class EngineKindTest : public ::testing::TestWithParam<SampleKind> {};

TEST_P(EngineKindTest, WriteEvictReadBackExactly) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  const size_t sizes[] = {1, 4096, 65536, 65537, 3 * 65536 + 777, 1 << 20};
  for (size_t size : sizes) {
    RegionInfo r;
    ASSERT_TRUE(e->Allocate(size, &r).ok());
    std::vector<char> data = SampleBytes<char>(GetParam(), size, size);
    memcpy(r.base, data.data(), size);  // CPU stores through the pager
    uint64_t ev0 = StatGet(Stat::evictions);
    ASSERT_TRUE(e->EvictTo(0).ok());
    EXPECT_EQ(e->Usage().resident_bytes, 0u);
    EXPECT_GT(StatGet(Stat::evictions), ev0);
    // Read decodes without installing.
    std::vector<char> out(size);
    bool zero = true;
    ASSERT_TRUE(e->Read(r.base, size, out.data(), &zero).ok());
    EXPECT_EQ(zero, Codec::IsZero(data.data(), size));
    if (!zero) {
      EXPECT_EQ(0, memcmp(out.data(), data.data(), size)) << "size " << size;
    }
    EXPECT_EQ(e->Usage().resident_bytes, 0u);
    // CPU loads refault from the store.
    EXPECT_EQ(0, memcmp(r.base, data.data(), size)) << "size " << size;
    // The tail past `size` is still zero.
    EXPECT_TRUE(Codec::IsZero(static_cast<char*>(r.base) + size, r.size - size));
    ASSERT_TRUE(e->Free(r.base).ok());
  }
  EXPECT_EQ(e->Usage().store.entries, 0u);
}

INSTANTIATE_TEST_SUITE_P(AllKinds, EngineKindTest, ::testing::ValuesIn(AllSampleKinds()),
                         [](const auto& info) { return std::string(SampleKindName(info.param)); });

TEST(EngineTest, ZeroChunksStayFreeAfterEviction) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto [e, cs, r, p] = MakeTestRegion(8);
  ASSERT_TRUE(p);
  std::vector<char> data = SampleBytes<char>(SampleKind::kBf16Gaussian, cs, 7);
  memcpy(p + 3 * cs, data.data(), data.size());
  for (int i = 0; i < 8; ++i) p[i * cs] |= 0;  // touch every chunk (zeros installed)
  p[5 * cs + 9] = 0;                           // a write of zero: dirty but all-zero
  uint64_t z0 = StatGet(Stat::evictions_zero);
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_EQ(e->Usage().store.entries, 1u);
  EXPECT_EQ(e->Usage().stored_raw_bytes, cs);
  EXPECT_EQ(e->Usage().empty_bytes, 7 * cs);
  EXPECT_GE(StatGet(Stat::evictions_zero), z0 + 1);
  EXPECT_EQ(0, memcmp(p + 3 * cs, data.data(), data.size()));
  EXPECT_TRUE(Codec::IsZero(p, 3 * cs));
}

TEST(EngineTest, CleanChunkEvictedAgainCostsNoCompression) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(4 * e->chunk_size(), &r).ok());
  std::vector<char> data = SampleBytes<char>(SampleKind::kBf16Gaussian, r.size, 1);
  memcpy(r.base, data.data(), r.size);
  ASSERT_TRUE(e->EvictTo(0).ok());
  uint64_t f0 = StatGet(Stat::faults_missing);
  EXPECT_EQ(0, memcmp(r.base, data.data(), r.size));  // read faults: clean chunks
  EXPECT_EQ(StatGet(Stat::faults_missing), f0 + 4);
  EXPECT_EQ(e->Usage().resident_bytes, r.size);
  uint64_t enc0 = StatGet(Stat::bytes_encoded), clean0 = StatGet(Stat::evictions_clean);
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_EQ(StatGet(Stat::bytes_encoded), enc0);
  EXPECT_EQ(StatGet(Stat::evictions_clean), clean0 + 4);
  // A write after the refault makes the stored copy garbage and bumps the generation.
  char* p = static_cast<char*>(r.base);
  EXPECT_EQ(p[10], data[10]);
  uint64_t g = e->Generation(p);
  p[10] = static_cast<char>(p[10] + 1);
  data[10] = static_cast<char>(data[10] + 1);
  EXPECT_EQ(e->Generation(p), kNoGeneration);  // writable now
  EXPECT_EQ(e->Usage().store.entries, 3u);
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_EQ(e->Generation(p), g + 1);
  EXPECT_EQ(StatGet(Stat::bytes_encoded), enc0 + e->chunk_size());
  std::vector<char> out(r.size);
  ASSERT_TRUE(e->Read(r.base, r.size, out.data(), nullptr).ok());
  EXPECT_EQ(0, memcmp(out.data(), data.data(), r.size));
}

TEST(EngineTest, WritePublishesAndMergesPartialChunks) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto [e, cs, r, p] = MakeTestRegion(5);
  ASSERT_TRUE(p);
  std::vector<char> model(r.size, 0);
  std::vector<char> a = SampleBytes<char>(SampleKind::kFp32Gaussian, r.size, 3);
  memcpy(r.base, a.data(), 2 * cs);  // chunks 0, 1 by the CPU
  memcpy(model.data(), a.data(), 2 * cs);
  ASSERT_TRUE(e->EvictRange(r.base, cs).ok());  // chunk 0 stored, chunk 1 resident dirty
  std::vector<char> b = SampleBytes<char>(SampleKind::kText, 3 * cs, 4);
  size_t off = cs / 2;
  uint64_t g0 = e->Generation(static_cast<char*>(r.base));
  ASSERT_TRUE(e->Write(static_cast<char*>(r.base) + off, b.data(), 3 * cs).ok());
  memcpy(model.data() + off, b.data(), 3 * cs);
  EXPECT_EQ(e->Generation(static_cast<char*>(r.base)), g0 + 1);
  // Generations (one lookup for a run of chunks) agrees with Generation; past the end reads 0.
  uint64_t gens[7];
  e->Generations(static_cast<char*>(r.base) + cs + 10, 7, gens);
  for (size_t i = 0; i < 7; ++i)
    EXPECT_EQ(gens[i], i + 1 < 5 ? e->Generation(static_cast<char*>(r.base) + (i + 1) * cs) : 0)
        << i;
  EXPECT_GT(gens[0], 0u);  // chunk 1 was written
  std::vector<char> out(r.size);
  ASSERT_TRUE(e->Read(r.base, r.size, out.data(), nullptr).ok());
  EXPECT_EQ(0, memcmp(out.data(), model.data(), r.size));
  EXPECT_EQ(0, memcmp(r.base, model.data(), r.size));
  ASSERT_TRUE(e->EvictTo(0).ok());
  ASSERT_TRUE(e->Read(r.base, r.size, out.data(), nullptr).ok());
  EXPECT_EQ(0, memcmp(out.data(), model.data(), r.size));
  // Read of a sub-range that spans a stored and an empty chunk.
  bool zero = true;
  ASSERT_TRUE(e->Read(static_cast<char*>(r.base) + 4 * cs - 100, 200, out.data(), &zero).ok());
  EXPECT_FALSE(zero);
  EXPECT_EQ(0, memcmp(out.data(), model.data() + 4 * cs - 100, 200));
}

// A generation vouches for a copy made elsewhere only while every CPU store is seen: a writable
// (dirty) chunk reports kNoGeneration; Write and ReadChunk leave chunks write-protected, so the
// next store faults and bumps the generation.
TEST(EngineTest, GenerationsVouchOnlyForProtectedChunks) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto [e, cs, r, p] = MakeTestRegion(4);
  ASSERT_TRUE(p);
  EXPECT_EQ(e->Generation(p), 0u);  // never written: zeros, protected
  p[10] = 1;                        // CPU store: dirty, writable
  EXPECT_EQ(e->Generation(p), kNoGeneration);
  std::vector<char> copy(cs);
  bool zero = true;
  uint64_t g = 0;
  ASSERT_TRUE(e->ReadChunk(p, copy.data(), &zero, &g).ok());
  EXPECT_FALSE(zero);
  EXPECT_NE(g, kNoGeneration);
  EXPECT_EQ(e->Generation(p), g);  // protected now
  EXPECT_EQ(copy[10], 1);
  EXPECT_GE(StatGet(Stat::chunks_cleaned), 1u);
  p[11] = 2;  // faults: a new generation, then writable again
  EXPECT_EQ(e->Generation(p), kNoGeneration);
  ASSERT_TRUE(e->ReadChunk(p, copy.data(), &zero, &g).ok());
  EXPECT_EQ(copy[11], 2);
  const uint64_t g2 = g;
  // Write (a D2H landing): a new generation; a resident chunk is left writable, one installed by
  // the Write is protected.
  std::vector<char> d(cs, 7);
  ASSERT_TRUE(e->Write(p, d.data(), cs).ok());  // resident chunk
  EXPECT_EQ(e->Generation(p), kNoGeneration);
  ASSERT_TRUE(e->ReadChunk(p, copy.data(), &zero, &g).ok());
  EXPECT_GT(g, g2);
  EXPECT_EQ(copy[0], 7);
  ASSERT_TRUE(e->Write(p + 2 * cs, d.data(), cs).ok());  // never-written chunk
  const uint64_t g3 = e->Generation(p + 2 * cs);
  EXPECT_NE(g3, kNoGeneration);
  p[2 * cs + 5] = 9;  // seen: a new generation
  EXPECT_EQ(e->Generation(p + 2 * cs), kNoGeneration);
  ASSERT_TRUE(e->ReadChunk(p + 2 * cs, copy.data(), &zero, &g).ok());
  EXPECT_GT(g, g3);
  EXPECT_EQ(copy[5], 9);
  // A stored chunk is protected too; ReadChunk of it installs nothing.
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_NE(e->Generation(p + 2 * cs), kNoGeneration);
  ASSERT_TRUE(e->ReadChunk(p + 2 * cs, copy.data(), &zero, &g).ok());
  EXPECT_EQ(g, e->Generation(p + 2 * cs));
  EXPECT_EQ(e->Usage().resident_bytes, 0u);
  EXPECT_FALSE(e->ReadChunk(p + 1, copy.data(), &zero, &g).ok());  // not a chunk start
}

// PrepareRead / PrepareWrite change the protection of a run of chunks with one ioctl; the bytes
// never change, the generations say what the protection is, and ReadChunk / Write of the prepared
// chunks need no ioctl of their own. Partial chunks at either end are left alone.
TEST(EngineTest, PrepareReadAndWriteReprotectWholeRunsInOneIoctl) {
  ZRTIER_SKIP_UNLESS_UFFD();
  FaultyOs os;
  const size_t n = 8;
  auto [e, cs, r, p] = MakeTestRegion(n, TestEngineOptions(), &os);
  ASSERT_TRUE(p);
  std::vector<char> want = SampleBytes<char>(SampleKind::kRandom, n * cs, 42);
  memcpy(p, want.data(), want.size());  // CPU stores: every chunk dirty
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(e->Generation(p + i * cs), kNoGeneration);

  // A range that starts and ends mid-chunk: chunks 1..6 are wholly inside.
  const uint64_t cleaned0 = StatGet(Stat::chunks_cleaned);
  int ioctls = os.Count(OsCall::kIoctl);
  e->PrepareRead(p + cs / 2, n * cs - cs);
  EXPECT_EQ(os.Count(OsCall::kIoctl) - ioctls, 1);
  EXPECT_EQ(StatGet(Stat::chunks_cleaned) - cleaned0, n - 2);
  EXPECT_EQ(e->Generation(p), kNoGeneration);
  EXPECT_EQ(e->Generation(p + (n - 1) * cs), kNoGeneration);
  std::vector<uint64_t> g(n);
  e->Generations(p, n, g.data());
  for (size_t i = 1; i + 1 < n; ++i) EXPECT_NE(g[i], kNoGeneration) << i;
  // ReadChunk of a prepared chunk stamps it without an ioctl, with the same generation.
  std::vector<char> copy(cs);
  bool zero = true;
  uint64_t gen = 0;
  ioctls = os.Count(OsCall::kIoctl);
  ASSERT_TRUE(e->ReadChunk(p + 3 * cs, copy.data(), &zero, &gen).ok());
  EXPECT_EQ(os.Count(OsCall::kIoctl), ioctls);
  EXPECT_EQ(gen, g[3]);
  EXPECT_EQ(memcmp(copy.data(), want.data() + 3 * cs, cs), 0);
  // A CPU store to a prepared chunk is seen: a new generation.
  p[2 * cs + 1] ^= 1;
  want[2 * cs + 1] ^= 1;
  EXPECT_EQ(e->Generation(p + 2 * cs), kNoGeneration);
  ASSERT_TRUE(e->ReadChunk(p + 2 * cs, copy.data(), &zero, &gen).ok());
  EXPECT_GT(gen, g[2]);

  // PrepareWrite of everything: the protected chunks (1..6) become writable in one ioctl, with new
  // generations; a Write over them then needs no ioctl.
  ioctls = os.Count(OsCall::kIoctl);
  e->PrepareWrite(p, n * cs);
  EXPECT_EQ(os.Count(OsCall::kIoctl) - ioctls, 1);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(e->Generation(p + i * cs), kNoGeneration) << i;
  EXPECT_EQ(memcmp(p, want.data(), want.size()), 0);
  const uint64_t wp_faults = StatGet(Stat::faults_wp);
  p[4 * cs] ^= 1;  // writable: no fault
  want[4 * cs] ^= 1;
  EXPECT_EQ(StatGet(Stat::faults_wp), wp_faults);
  std::vector<char> d = SampleBytes<char>(SampleKind::kRandom, n * cs, 43);
  ioctls = os.Count(OsCall::kIoctl);
  ASSERT_TRUE(e->Write(p + cs, d.data() + cs, (n - 2) * cs).ok());
  EXPECT_EQ(os.Count(OsCall::kIoctl), ioctls);
  memcpy(want.data() + cs, d.data() + cs, (n - 2) * cs);
  EXPECT_EQ(memcmp(p, want.data(), want.size()), 0);

  // Stored and never-written chunks are not resident: neither call touches them; nor ranges
  // outside any region.
  ASSERT_TRUE(e->EvictTo(0).ok());
  ioctls = os.Count(OsCall::kIoctl);
  e->PrepareWrite(p, n * cs);
  e->PrepareRead(p, n * cs);
  e->PrepareRead(want.data(), cs);
  EXPECT_EQ(os.Count(OsCall::kIoctl), ioctls);
  EXPECT_EQ(memcmp(p, want.data(), want.size()), 0);
}

// Adopt (a landed D2H slot becomes a chunk's newest copy): chunks of every state become external
// with new generations, their pages and store copies go; Read, CPU loads and stores, a partial
// Write and Attach then take the bytes from the holder (told when a fault or a Write lets a copy
// go), and Free forgets them.
TEST(EngineTest, AdoptedChunksAreServedByTheirHolderUntilAttached) {
  ZRTIER_SKIP_UNLESS_UFFD();
  FaultyOs os;
  const size_t n = 6;
  auto [e, cs, r, p] = MakeTestRegion(n, TestEngineOptions(), &os);
  ASSERT_TRUE(p);
  testing::ExternalHolder holder(cs);
  std::vector<uint64_t> gens(n);
  EXPECT_EQ(e->Adopt(p, 1, gens.data(), [] {}).code(), ENOTSUP) << "no holder yet";
  e->SetExternalCopies(&holder);

  // Chunk 0 dirty, 1 clean, 2 stored, 3 never written; 4 and 5 stay as they are.
  std::vector<char> old = SampleBytes<char>(SampleKind::kBf16Gaussian, n * cs, 50);
  memcpy(p, old.data(), 3 * cs);
  memcpy(p + 4 * cs, old.data() + 4 * cs, 2 * cs);
  e->PrepareRead(p + cs, cs);
  ASSERT_TRUE(e->EvictRange(p + 2 * cs, cs).ok());
  std::vector<uint64_t> before(n);
  e->Generations(p, n, before.data());
  const EngineUsage u0 = e->Usage();
  std::vector<char> x = SampleBytes<char>(SampleKind::kFp32Gaussian, 4 * cs, 51);
  bool registered = false;
  ASSERT_TRUE(e->Adopt(p, 4, gens.data(), [&] {
                 registered = true;
                 for (size_t k = 0; k < 4; ++k) holder.Hold(r.id, k, gens[k], x.data() + k * cs);
               }).ok());
  EXPECT_TRUE(registered);
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(e->Generation(p + k * cs), gens[k]) << k;
    if (before[k] != kNoGeneration) {
      EXPECT_GT(gens[k], before[k]) << k;
    }
  }
  EngineUsage u = e->Usage();
  EXPECT_EQ(u.external_bytes, 4 * cs);
  EXPECT_EQ(u.resident_bytes, u0.resident_bytes - 2 * cs);  // chunks 0 and 1
  EXPECT_EQ(u.stored_raw_bytes, u0.stored_raw_bytes - cs);  // chunk 2

  std::vector<char> want = old;
  memcpy(want.data(), x.data(), 4 * cs);
  std::vector<char> got(n * cs);
  bool zero = true;
  ASSERT_TRUE(e->Read(p, n * cs, got.data(), &zero).ok());
  EXPECT_FALSE(zero);
  EXPECT_EQ(got, want);

  // A CPU load of chunk 0 installs it clean at the same generation; a store into chunk 3
  // installs it dirty.
  const uint64_t missing = StatGet(Stat::faults_missing);
  EXPECT_EQ(memcmp(p, want.data(), cs), 0);
  EXPECT_EQ(e->Generation(p), gens[0]);
  p[3 * cs + 5] ^= 0x21;
  want[3 * cs + 5] ^= 0x21;
  EXPECT_EQ(e->Generation(p + 3 * cs), kNoGeneration);
  EXPECT_EQ(StatGet(Stat::faults_missing) - missing, 2u);
  EXPECT_EQ(e->Usage().external_bytes, 2 * cs);
  EXPECT_EQ(holder.released(), 2u);  // the holder may forget those two copies

  // A partial Write into chunk 1 merges with the held copy.
  std::vector<char> y = SampleBytes<char>(SampleKind::kRandom, cs / 2, 52);
  ASSERT_TRUE(e->Write(p + cs + cs / 4, y.data(), cs / 2).ok());
  memcpy(want.data() + cs + cs / 4, y.data(), cs / 2);
  EXPECT_EQ(e->Usage().external_bytes, cs);
  EXPECT_EQ(holder.released(), 3u);

  // Attach: a copy whose chunk moved on changes nothing; chunk 2's installs its bytes, clean.
  const int ioctls = os.Count(OsCall::kIoctl);
  EXPECT_TRUE(e->Attach(p + cs, gens[1], x.data() + cs).ok());
  EXPECT_TRUE(e->Attach(p + 2 * cs, gens[2] + 1, x.data() + 2 * cs).ok());
  EXPECT_EQ(os.Count(OsCall::kIoctl), ioctls);
  EXPECT_TRUE(e->Attach(p + 2 * cs, gens[2], x.data() + 2 * cs).ok());
  EXPECT_EQ(os.Count(OsCall::kIoctl), ioctls + 1);
  EXPECT_EQ(e->Generation(p + 2 * cs), gens[2]);
  EXPECT_EQ(e->Usage().external_bytes, 0u);
  EXPECT_EQ(memcmp(p, want.data(), n * cs), 0);
  ASSERT_TRUE(e->Read(p, n * cs, got.data(), nullptr).ok());
  EXPECT_EQ(got, want);

  // A holder that lost a copy it must keep is an error, not a hang.
  uint64_t g1;
  ASSERT_TRUE(e->Adopt(p + 4 * cs, 1, &g1, [&] { holder.Hold(r.id, 4, g1, x.data()); }).ok());
  holder.Forget(r.id, 4, g1);
  EXPECT_EQ(e->Read(p + 4 * cs, cs, got.data(), nullptr).code(), EIO);

  // Adopting again supersedes; Free forgets external chunks.
  ASSERT_TRUE(e->Adopt(p + 4 * cs, 2, gens.data(), [&] {
                 for (size_t k = 0; k < 2; ++k) holder.Hold(r.id, 4 + k, gens[k], x.data());
               }).ok());
  EXPECT_GT(gens[0], g1);
  EXPECT_EQ(e->Usage().external_bytes, 2 * cs);
  ASSERT_TRUE(e->Free(r.base).ok());
  EXPECT_EQ(e->Usage().external_bytes, 0u);
  e->SetExternalCopies(nullptr);
}

// Attach of a superseded copy (the chunk was adopted again since, from a newer landed D2H) changes
// nothing, on both of Attach's paths -- encoding into the store (no room in T1) and installing in
// T1: the chunk stays external and reads the newer copy's bytes, whose own Attach then gives them
// back.
TEST(EngineTest, AttachOfASupersededCopyNeverOverwritesTheNewerOne) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto [e, cs, r, p] = MakeTestRegion(3);
  ASSERT_TRUE(p);
  testing::ExternalHolder holder(cs);
  e->SetExternalCopies(&holder);
  std::vector<char> older = SampleBytes<char>(SampleKind::kBf16Gaussian, 3 * cs, 53);
  std::vector<char> newer = SampleBytes<char>(SampleKind::kFp32Gaussian, 3 * cs, 54);
  memcpy(p + 2 * cs, newer.data() + 2 * cs, cs);  // chunk 2: resident, the whole limit below
  for (size_t k : {0, 1}) {
    const bool room = k == 1;
    SCOPED_TRACE(room ? "installed in T1" : "encoded into the store");
    e->SetResidentLimit(room ? 0 : cs);
    ASSERT_EQ(e->ResidentRoom(), room ? UINT64_MAX : 0u);
    char* c = p + k * cs;
    uint64_t g_old = 0, g_new = 0;
    ASSERT_TRUE(
        e->Adopt(c, 1, &g_old, [&] { holder.Hold(r.id, k, g_old, older.data() + k * cs); }).ok());
    ASSERT_TRUE(
        e->Adopt(c, 1, &g_new, [&] { holder.Hold(r.id, k, g_new, newer.data() + k * cs); }).ok());
    ASSERT_GT(g_new, g_old);

    bool installed = true;
    ASSERT_TRUE(e->Attach(c, g_old, older.data() + k * cs, &installed).ok());
    EXPECT_FALSE(installed);
    EXPECT_EQ(e->Generation(c), g_new);
    EXPECT_EQ(e->Usage().external_bytes, cs) << "the superseded copy ended the external state";
    std::vector<char> got(cs);
    ASSERT_TRUE(e->Read(c, cs, got.data(), nullptr).ok());
    EXPECT_EQ(memcmp(got.data(), newer.data() + k * cs, cs), 0)
        << "the superseded copy's bytes replaced the newer ones";

    ASSERT_TRUE(e->Attach(c, g_new, newer.data() + k * cs, &installed).ok());
    EXPECT_EQ(installed, room);
    EXPECT_EQ(e->Usage().external_bytes, 0u);
    EXPECT_EQ(memcmp(c, newer.data() + k * cs, cs), 0);  // a CPU load (a fault decodes chunk 0)
  }
  EXPECT_TRUE(e->Free(p).ok());
  e->SetExternalCopies(nullptr);
}

// A chunk the CPU rewrites after each cached read (a staging buffer) stops being protected for
// caching after kMaxRewrites rewrites: its stores no longer fault, its copies are not cached, and
// every read still returns the newest bytes.
TEST(EngineTest, ARewrittenStagingChunkStaysWritableAndUncached) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto [e, cs, r, p] = MakeTestRegion(2);
  ASSERT_TRUE(p);
  std::vector<char> copy(cs);
  bool zero = false;
  uint64_t g = 0;
  for (int round = 0; round < 5; ++round) {
    memset(p, 'a' + round, cs);  // the CPU fills the buffer
    const uint64_t cleaned0 = StatGet(Stat::chunks_cleaned);
    ASSERT_TRUE(e->ReadChunk(p, copy.data(), &zero, &g).ok());  // an H2D reads it
    // After ReadChunk: it waited for the fault of the memset above to end, counter included.
    const uint64_t wp0 = StatGet(Stat::faults_wp);
    EXPECT_EQ(copy, std::vector<char>(cs, static_cast<char>('a' + round))) << round;
    if (round < 2) {  // (kMaxRewrites = 2) protected for a cached copy; the next store faults
      EXPECT_NE(g, kNoGeneration) << round;
      EXPECT_EQ(StatGet(Stat::chunks_cleaned), cleaned0 + 1) << round;
    } else {  // rewritten twice after that: left writable, not cached, no faults
      EXPECT_EQ(g, kNoGeneration) << round;
      EXPECT_EQ(StatGet(Stat::chunks_cleaned), cleaned0) << round;
      memset(p, 'x', cs);
      EXPECT_EQ(StatGet(Stat::faults_wp), wp0) << round;
    }
  }
  // The other chunk, read once and never rewritten, stays cacheable.
  p[cs] = 1;
  ASSERT_TRUE(e->ReadChunk(p + cs, copy.data(), &zero, &g).ok());
  EXPECT_NE(g, kNoGeneration);
  EXPECT_EQ(e->Generation(p + cs), g);
}

TEST(EngineTest, ResidentBudgetIsKeptInTheBackground) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions("1M"));
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(32 << 20, &r).ok());
  std::vector<char> data = SampleBytes<char>(SampleKind::kBf16Gaussian, r.size, 9);
  memcpy(r.base, data.data(), r.size);
  EngineUsage u = e->Usage();
  // Backpressure: at most the limit plus the slack (4 chunks or limit/64) plus one chunk.
  EXPECT_LE(u.resident_bytes, (1 << 20) + 5 * e->chunk_size());
  EXPECT_GT(u.stored_raw_bytes, 0u);
  EXPECT_EQ(0, memcmp(r.base, data.data(), r.size));
  EXPECT_LE(e->Usage().resident_bytes, (1 << 20) + 5 * e->chunk_size());
}

// Wake-ups of this process's threads named `name` so far (voluntary context switches, from
// /proc/self/task/*/status).
uint64_t ContextSwitchesOf(const char* name) {
  uint64_t total = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return 0;
  while (dirent* t = readdir(d)) {
    if (t->d_name[0] == '.') continue;
    const std::string dir = std::string("/proc/self/task/") + t->d_name;
    char comm[32] = {};
    if (FILE* f = fopen((dir + "/comm").c_str(), "r")) {
      if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
      fclose(f);
    }
    comm[strcspn(comm, "\n")] = 0;
    if (strcmp(comm, name) != 0) continue;
    if (FILE* f = fopen((dir + "/status").c_str(), "r")) {
      char line[256];
      unsigned long long n = 0;
      while (fgets(line, sizeof line, f))
        if (sscanf(line, "voluntary_ctxt_switches: %llu", &n) == 1) total += n;
      fclose(f);
    }
  }
  closedir(d);
  return total;
}

// An engine under its resident limit does not keep waking its evictors (each wake-up preempts a
// thread of the host program), and a growth past the limit after a long idle spell is still
// evicted in the background.
TEST(EngineTest, IdleEvictorsSleepUntilTheLimitIsPassed) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Options o = TestEngineOptions("2M");
  ASSERT_TRUE(o.Set(Opt::kWorkers, "8").ok());
  auto e = MakeTestEngine(o);
  ASSERT_TRUE(e);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const uint64_t before = ContextSwitchesOf("zr-evict");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const uint64_t wakeups = ContextSwitchesOf("zr-evict") - before;
  // One evictor polls every 20 ms (25 in 500 ms); eight polling would be 200.
  EXPECT_LE(wakeups, 60u) << "evictor wake-ups in 500 ms while idle";

  RegionInfo r;
  ASSERT_TRUE(e->Allocate(16 << 20, &r).ok());
  std::vector<char> data = SampleBytes<char>(SampleKind::kBf16Gaussian, r.size, 4);
  ASSERT_TRUE(e->Write(r.base, data.data(), r.size).ok());  // published, not throttled
  for (int i = 0; i < 200 && e->Usage().resident_bytes > (2u << 20); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_LE(e->Usage().resident_bytes, 2u << 20);
  EXPECT_EQ(0, memcmp(r.base, data.data(), r.size));
}

TEST(EngineTest, FreeReleasesEverythingAndRangesAreReused) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(1 << 20, &r).ok());
  std::vector<char> data = SampleBytes<char>(SampleKind::kRandom, r.size, 5);
  memcpy(r.base, data.data(), r.size);
  ASSERT_TRUE(e->EvictRange(r.base, r.size / 2).ok());
  EXPECT_EQ(e->Usage().store.entries, r.size / 2 / e->chunk_size());
  RegionInfo look;
  EXPECT_TRUE(e->Lookup(static_cast<char*>(r.base) + 5, &look));
  EXPECT_EQ(look.id, r.id);
  ASSERT_TRUE(e->Free(r.base).ok());
  EXPECT_FALSE(e->Lookup(r.base, &look));
  EXPECT_EQ(e->Free(r.base).code(), EINVAL);
  EngineUsage u = e->Usage();
  EXPECT_EQ(u.store.entries, 0u);
  EXPECT_EQ(u.resident_bytes, 0u);
  EXPECT_EQ(u.region_bytes, 0u);
  RegionInfo r2;
  ASSERT_TRUE(e->Allocate(1 << 20, &r2).ok());
  EXPECT_EQ(r2.base, r.base);  // first fit reuses the range
  EXPECT_NE(r2.id, r.id);
  EXPECT_TRUE(Codec::IsZero(r2.base, r2.size));
}

TEST(EngineTest, ArenaFullIsEnomem) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Options o = TestEngineOptions();
  ASSERT_TRUE(o.Set(Opt::kArena, "64M").ok());
  auto e = MakeTestEngine(o);
  RegionInfo a, b;
  ASSERT_TRUE(e->Allocate(48 << 20, &a).ok());
  Status st = e->Allocate(32 << 20, &b);
  EXPECT_EQ(st.code(), ENOMEM);
  EXPECT_NE(st.message().find("ZRTIER_ARENA"), std::string::npos) << st.message();
  ASSERT_TRUE(e->Free(a.base).ok());
  ASSERT_TRUE(e->Allocate(64 << 20, &b).ok());
}

TEST(EngineTest, ReadAndWriteRejectRangesOutsideARegion) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(e->chunk_size(), &r).ok());
  char buf[16];
  EXPECT_EQ(e->Read(static_cast<char*>(r.base) + r.size - 8, 16, buf, nullptr).code(), EINVAL);
  EXPECT_EQ(e->Write(buf, buf, 16).code(), EINVAL);
  EXPECT_EQ(e->EvictRange(buf, 16).code(), EINVAL);
}

}  // namespace
}  // namespace zrtier

namespace zrtier {
namespace {

sigjmp_buf g_jump;

TEST(EngineTest, TouchAfterFreeGetsSigbusAndTheRangeIsReusable) {
  ZRTIER_SKIP_UNLESS_UFFD();
  // Run in a child process with its own engine, so the signal cannot hurt this test process.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);  // a hang fails the test instead of blocking it
    std::unique_ptr<Engine> e;
    if (!Engine::Create(TestEngineOptions(), Os::Default(), nullptr, &e).ok()) _exit(3);
    RegionInfo r;
    if (!e->Allocate(1 << 20, &r).ok() || !e->Free(r.base).ok()) _exit(3);
    struct sigaction sa {};
    sa.sa_handler = [](int) { siglongjmp(g_jump, 1); };
    sigaction(SIGBUS, &sa, nullptr);
    sigaction(SIGSEGV, &sa, nullptr);
    if (sigsetjmp(g_jump, 1) == 0) {
      volatile char c = static_cast<volatile char*>(r.base)[100];
      _exit(c == 0 ? 1 : 2);  // read something after free: wrong
    }
    // The range is reused by the next region and works normally (poison markers dropped).
    RegionInfo r2;
    if (!e->Allocate(1 << 20, &r2).ok() || r2.base != r.base) _exit(4);
    memset(r2.base, 7, r2.size);
    if (!e->EvictTo(0).ok()) _exit(5);
    if (static_cast<char*>(r2.base)[100] != 7) _exit(6);
    _exit(42);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 42)
      << "1/2: read after free, 3: setup, 4: range not reused, 5: evict, 6: reused range broken";
}

}  // namespace
}  // namespace zrtier

namespace zrtier {
namespace {

TEST(EngineTest, StatsGaugesAndRegionRowsFollowTheRegion) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  uint64_t regions0 = StatGet(Stat::regions), bytes0 = StatGet(Stat::region_bytes);
  uint64_t res0 = StatGet(Stat::resident_bytes);
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(8 * e->chunk_size(), &r).ok());
  EXPECT_EQ(StatGet(Stat::regions), regions0 + 1);
  EXPECT_EQ(StatGet(Stat::region_bytes), bytes0 + r.size);
  std::vector<char> data = SampleBytes<char>(SampleKind::kBf16Gaussian, r.size, 21);
  memcpy(r.base, data.data(), r.size);
  EXPECT_EQ(StatGet(Stat::resident_bytes), res0 + r.size);
  ASSERT_TRUE(e->EvictRange(r.base, r.size / 2).ok());
  EXPECT_EQ(StatGet(Stat::resident_bytes), res0 + r.size / 2);
  int row = -1;
  for (int i = 0; i < kStatsMaxRegions; ++i)
    if (Stats()->regions[i].base.load() == reinterpret_cast<uint64_t>(r.base)) row = i;
  ASSERT_GE(row, 0);
  StatsRegionRow& rr = Stats()->regions[row];
  bool seen = false;  // the watchdog refreshes rows every 200 ms
  for (int k = 0; k < 50 && !seen; ++k) {
    usleep(20000);
    seen = rr.stored_raw_bytes.load() == r.size / 2 && rr.resident_bytes.load() == r.size / 2 &&
           rr.stored_bytes.load() > 0 && rr.stored_bytes.load() < r.size / 2;
  }
  EXPECT_TRUE(seen) << rr.stored_raw_bytes.load() << " " << rr.resident_bytes.load() << " "
                    << rr.stored_bytes.load();
  EXPECT_GT(StatGet(Stat::store_bytes), 0u);
  ASSERT_TRUE(e->Free(r.base).ok());
  EXPECT_EQ(StatGet(Stat::regions), regions0);
  EXPECT_EQ(StatGet(Stat::resident_bytes), res0);
  EXPECT_EQ(rr.base.load(), 0u);
}

}  // namespace
}  // namespace zrtier

namespace zrtier {
namespace {

// One registration for the whole arena: thousands of regions (PyTorch makes one pinned block per
// tensor) need no per-region registration; UMap's per-range registration fails near 950.
// ReadChunk's sink for an encoding in the GPU chunk format: its length says the format.
struct FormatProbe final : GpuEncodingSink {
  std::vector<char> buf;
  char* Place(size_t n) override {
    buf.resize(n);
    return buf.data();
  }
};

// With the GPU format on (SetGpuFormat, the auto codec), a chunk is stored in it unless the CPU
// touched it after its first write: a fault on it stored (a load or a store) makes the next
// encoding auto; a chunk read in never written and then written (a write-protect fault at
// generation 0) is not a reuse. Off again, every new encoding is auto. Every byte reads back.
TEST(EngineTest, TheGpuFormatIsForChunksTheCpuDoesNotReuse) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  const size_t cs = e->chunk_size(), n = 6 * cs;
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(n, &r).ok());
  char* base = static_cast<char*>(r.base);
  std::vector<char> want = SampleBytes<char>(SampleKind::kBf16Gaussian, n, 3);
  // Chunk 5: read while never written (installed clean), then written.
  volatile char* p5 = base + 5 * cs;
  EXPECT_EQ(p5[100], 0);
  memcpy(base, want.data(), n);
  e->SetGpuFormat(true);
  EXPECT_FALSE(e->GpuEncoded());
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_TRUE(e->GpuEncoded());
  auto gpu_format = [&](size_t i) {
    FormatProbe probe;
    std::vector<char> out(cs);
    bool zero = false;
    uint64_t gen = 0;
    EXPECT_TRUE(e->ReadChunk(base + i * cs, out.data(), &zero, &gen, &probe).ok());
    if (probe.len == 0) {
      EXPECT_EQ(0, memcmp(out.data(), want.data() + i * cs, cs)) << i;
    }
    return probe.len > 0;
  };
  for (size_t i = 0; i < 6; ++i) EXPECT_TRUE(gpu_format(i)) << i;
  // The CPU reads chunk 1 and rewrites chunk 2 (both stored), then rewrites both again.
  volatile char* p1 = base + cs;
  EXPECT_EQ(p1[7], want[cs + 7]);
  want[2 * cs + 9] ^= 1;
  base[2 * cs + 9] = want[2 * cs + 9];
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_TRUE(gpu_format(1)) << "read, dropped: its store copy stays";
  EXPECT_FALSE(gpu_format(2)) << "rewritten after a fault: auto";
  want[cs + 9] ^= 1;
  base[cs + 9] = want[cs + 9];
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_FALSE(gpu_format(1));
  EXPECT_TRUE(gpu_format(0));
  EXPECT_TRUE(gpu_format(5));
  // Off: chunk 3, untouched by the CPU, is rewritten and stored in the auto format.
  e->SetGpuFormat(false);
  want[3 * cs] ^= 1;
  base[3 * cs] = want[3 * cs];
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_FALSE(gpu_format(3));
  std::vector<char> out(n);
  ASSERT_TRUE(e->Read(base, n, out.data(), nullptr).ok());
  EXPECT_EQ(0, memcmp(out.data(), want.data(), n));
  EXPECT_EQ(0, memcmp(base, want.data(), n));
  ASSERT_TRUE(e->Free(base).ok());
}

// WriteEncoded of a run of chunks: the ones not resident keep their encodings as their store
// copies (one batch), the entries they replace are freed, a resident one is decoded and written in
// place, an empty encoding makes its chunk zero. Every byte reads back; the store holds exactly one
// entry per stored chunk.
TEST(EngineTest, ARunOfEncodingsIsStoredAndReplacesTheOldCopies) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto [e, cs, r, p] = MakeTestRegion(8);
  ASSERT_TRUE(p);
  ASSERT_TRUE(e->TakesEncodings());
  char* base = static_cast<char*>(r.base);
  std::vector<char> old = SampleBytes<char>(SampleKind::kBf16Gaussian, r.size, 5);
  memcpy(base, old.data(), r.size);
  ASSERT_TRUE(e->EvictTo(0).ok());
  ASSERT_EQ(e->Usage().store.entries, 8u);
  volatile char* p3 = base + 3 * cs;
  EXPECT_EQ(p3[1], old[3 * cs + 1]);  // chunk 3 resident again (its first two pages: a scan)
  EXPECT_EQ(p3[4097], old[3 * cs + 4097]);
  std::vector<char> want = SampleBytes<char>(SampleKind::kBf16Gaussian, r.size, 6);
  memset(want.data() + 5 * cs, 0, cs);  // chunk 5 becomes zero: an empty encoding
  Codec codec(CodecConfig{CodecKind::kGpu});
  std::vector<std::vector<char>> encs(8);
  std::vector<RegionBackend::ChunkEncoding> run(8);
  for (size_t i = 0; i < 8; ++i) {
    encs[i].resize(Codec::MaxEncodedSize(cs));
    size_t len = 0;
    ASSERT_TRUE(codec.Encode(want.data() + i * cs, cs, encs[i].data(), encs[i].size(), &len).ok());
    EXPECT_EQ(len == 0, i == 5) << i;
    run[i] = {encs[i].data(), len};
  }
  ASSERT_TRUE(e->WriteEncoded(base, run.data(), run.size()).ok());
  EXPECT_TRUE(e->GpuEncoded());
  EXPECT_EQ(e->Usage().store.entries, 6u) << "chunks 0-2, 4, 6, 7; the old entries are freed";
  uint64_t payload = 0;
  for (size_t i : {0, 1, 2, 4, 6, 7}) payload += run[i].len;
  EXPECT_EQ(e->Usage().store.payload_bytes, payload);
  std::vector<char> out(r.size);
  ASSERT_TRUE(e->Read(base, r.size, out.data(), nullptr).ok());
  EXPECT_EQ(0, memcmp(out.data(), want.data(), r.size));
  EXPECT_EQ(0, memcmp(base, want.data(), r.size));
  ASSERT_TRUE(e->Free(base).ok());
  EXPECT_EQ(e->Usage().store.entries, 0u);
}

TEST(EngineTest, ThousandsOfRegions) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  const int kRegions = 3000;
  std::vector<RegionInfo> rs(kRegions);
  for (int i = 0; i < kRegions; ++i) {
    ASSERT_TRUE(e->Allocate(1 + i % 3 * e->chunk_size(), &rs[i]).ok()) << i;
    static_cast<int*>(rs[i].base)[0] = i;
  }
  ASSERT_TRUE(e->EvictTo(0).ok());
  for (int i = 0; i < kRegions; i += 7) ASSERT_EQ(static_cast<int*>(rs[i].base)[0], i);
  for (int i = 0; i < kRegions; ++i) ASSERT_TRUE(e->Free(rs[i].base).ok());
  EXPECT_EQ(e->Usage().regions, 0u);
  EXPECT_EQ(e->Usage().store.entries, 0u);
}

}  // namespace
}  // namespace zrtier
