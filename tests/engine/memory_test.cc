// Memory stays bounded: N GiB (ZRTIER_TEST_MEMORY_GIB, default 1) of bf16 weights written by CPU
// stores into a region with a resident limit of N/8 cost at most limit + N/1.40 + 3 % of N, both
// by the engine's own accounting and by the process RSS (RSS not under AddressSanitizer, whose
// quarantine keeps freed heap memory resident: up to 256 MiB that are not zrtier's), and read back
// exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

uint64_t RssBytes() {
  FILE* f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
  fclose(f);
  return static_cast<uint64_t>(resident) * sysconf(_SC_PAGESIZE);
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAsan = true;
#else
constexpr bool kAsan = false;
#endif
#else
constexpr bool kAsan = false;
#endif

double Mib(uint64_t b) {
  return b / 1048576.0;
}

TEST(MemoryTest, Bf16WithResidentLimitStaysUnderTheBound) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const char* env = getenv("ZRTIER_TEST_MEMORY_GIB");
  double gib = env ? atof(env) : 1.0;
  if (gib <= 0) gib = 1.0;
  const uint64_t total = static_cast<uint64_t>(gib * (1ull << 30));
  const uint64_t limit = total / 8;
  const double ratio = 1.40;
  const uint64_t bound_write = limit + static_cast<uint64_t>(total / ratio + 0.03 * total);

  Options o;
  ASSERT_TRUE(o.Set(Opt::kArena, "1T").ok());
  ASSERT_TRUE(o.Set(Opt::kStoreLimit, "0").ok());
  ASSERT_TRUE(o.Set(Opt::kResidentLimit, std::to_string(limit)).ok());
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(o, Os::Default(), nullptr, &e);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const size_t cs = e->chunk_size();
  std::vector<char> buf(cs), want(cs);
  // 256 distinct bf16 chunks (generating N GiB of Gaussians would dominate the test's time; the
  // codec sees each chunk alone, so repeats across chunks do not help it). The first 8 bytes of
  // each chunk carry its index, so a misplaced chunk is caught.
  const size_t kPool = 256;
  std::vector<char> pool(kPool * cs);
  FillSample(SampleKind::kBf16Gaussian, 42, pool.data(), pool.size());
  auto make = [&](size_t i, char* out) {
    memcpy(out, pool.data() + (i % kPool) * cs, cs);
    uint64_t tag = i;
    memcpy(out, &tag, sizeof(tag));
  };
  uint64_t rss0 = RssBytes();

  RegionInfo r;
  ASSERT_TRUE(e->Allocate(total, &r).ok());
  char* base = static_cast<char*>(r.base);
  const size_t n = r.size / cs;
  for (size_t i = 0; i < n; ++i) {
    make(i, buf.data());
    memcpy(base + i * cs, buf.data(), cs);  // CPU stores through the pager (with backpressure)
  }
  // Let the evictor finish the tail.
  for (int k = 0; k < 200 && e->Usage().resident_bytes > limit; ++k) usleep(10000);

  // After reading back, the resident chunks are clean and keep their store copies (so evicting
  // them again costs no compression); the bound still holds with the byte-plane codec.
  auto check = [&](const char* when, uint64_t bound) {
    EngineUsage u = e->Usage();
    uint64_t engine_bytes = u.resident_bytes + u.store.used_bytes;
    uint64_t rss = RssBytes() - rss0;
    printf(
        "%s: %.1f GiB written, limit %.0f MiB: resident %.1f MiB + store %.1f MiB "
        "(payload %.1f MiB, ratio %.3f) = %.1f MiB; RSS growth %.1f MiB; bound %.1f MiB\n",
        when, gib, Mib(limit), Mib(u.resident_bytes), Mib(u.store.used_bytes),
        Mib(u.store.payload_bytes),
        u.store.payload_bytes ? double(u.store.raw_bytes) / u.store.payload_bytes : 0.0,
        Mib(engine_bytes), Mib(rss), Mib(bound));
    EXPECT_LE(u.resident_bytes, limit + limit / 64 + 4 * cs) << when;
    EXPECT_LE(engine_bytes, bound) << when;
    if (!kAsan) {
      EXPECT_LE(rss, bound) << when;
    }
  };
  check("after writing", bound_write);

  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    make(i, want.data());
    if (memcmp(base + i * cs, want.data(), cs) != 0) ++bad;  // CPU loads refault
  }
  EXPECT_EQ(bad, 0u);
  for (int k = 0; k < 200 && e->Usage().resident_bytes > limit; ++k) usleep(10000);
  check("after reading back", bound_write);
  // Read (decode without installing) agrees as well, on a sample of chunks.
  for (size_t i = 0; i < n; i += 97) {
    make(i, want.data());
    ASSERT_TRUE(e->Read(base + i * cs, cs, buf.data(), nullptr).ok());
    if (buf != want) ++bad;
  }
  EXPECT_EQ(bad, 0u);
  ASSERT_TRUE(e->Free(r.base).ok());
}

}  // namespace
}  // namespace zrtier
