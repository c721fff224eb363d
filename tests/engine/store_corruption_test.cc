// Covers the engine over a spill file whose bytes change under it: a chunk whose stored entry is
// corrupted is never handed out -- Read fails with an error naming the chunk and the entry, a CPU
// load of it gets SIGBUS (a memory error, as the kernel reports one) -- and every other chunk still
// reads back exactly.
#include <gtest/gtest.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/codec/codec.h"
#include "runtime/engine/engine.h"
#include "runtime/store/file_store.h"
#include "tests/testutil/backing_bytes.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/sample_bytes.h"
#include "tests/testutil/skip.h"
#include "tests/testutil/temp_dir.h"

namespace zrtier {
namespace {

constexpr size_t kChunks = 8;
constexpr size_t kBad = 3;  // the chunk whose entry is corrupted

// An engine whose only store is a FileStore, with one region of kChunks chunks of bf16 data, all
// evicted into the spill file, and one random bit of chunk kBad's entry flipped there.
struct CorruptSpill {
  std::unique_ptr<Engine> e;
  RegionInfo r{};
  size_t cs = 0;
  std::vector<char> data;
};

// Builds `*out` in `dir`; "" on success, else what failed (usable in a forked child).
std::string MakeCorruptSpill(const std::string& dir, uint64_t seed, CorruptSpill* out) {
  Options o = testing::TestEngineOptions();
  if (!o.Set(Opt::kChunk, "64K").ok()) return "chunk option";
  std::unique_ptr<FileStore> store;
  Status st = FileStore::Create(dir, 0, Os::Default(), &store);
  if (!st.ok()) return st.ToString();
  std::vector<std::string> files = testing::OpenSpillFiles(dir);
  if (files.size() != 1) return "expected one spill file, found " + std::to_string(files.size());
  st = Engine::Create(o, Os::Default(), std::move(store), &out->e);
  if (!st.ok()) return st.ToString();
  out->cs = out->e->chunk_size();
  st = out->e->Allocate(kChunks * out->cs, &out->r);
  if (!st.ok()) return st.ToString();
  out->data = testing::SampleBytes<char>(SampleKind::kBf16Gaussian, out->r.size, seed);
  memcpy(out->r.base, out->data.data(), out->r.size);
  st = out->e->EvictRange(out->r.base, out->r.size);
  if (!st.ok()) return st.ToString();
  // The engine's encoding of chunk kBad (the codec is deterministic), found in the spill file.
  Codec codec(CodecConfig{});
  std::vector<unsigned char> enc(Codec::MaxEncodedSize(out->cs));
  size_t len = 0;
  st = codec.Encode(out->data.data() + kBad * out->cs, out->cs, enc.data(), enc.size(), &len);
  if (!st.ok() || len == 0) return "encode: " + st.ToString();
  enc.resize(len);
  testing::BackingBytes file(files[0]);
  if (!file.ok()) return file.why();
  const int64_t off = file.Find(enc, 8 << 20);
  if (off < 0) return "chunk not found in the spill file " + file.why();
  const uint64_t bit = std::mt19937_64(seed)() % (len * 8);
  if (!file.Xor(off + bit / 8, static_cast<unsigned char>(1u << (bit % 8)))) return file.why();
  return "";
}

class StoreCorruptionTest : public testing::SpillDirTest {
 protected:
  StoreCorruptionTest() : SpillDirTest("corrupt") {}
};

TEST_F(StoreCorruptionTest, ReadOfACorruptedChunkFailsNamingItOthersReadBack) {
  ZRTIER_SKIP_UNLESS_UFFD();
  CorruptSpill s;
  ASSERT_EQ(MakeCorruptSpill(dir_, testing::PrintedTestSeed(), &s), "");
  const uint64_t errors0 = StatGet(Stat::checksum_errors);
  std::vector<char> out(s.cs);
  for (size_t i = 0; i < kChunks; ++i) {
    char* p = static_cast<char*>(s.r.base) + i * s.cs;
    bool zero = false;
    Status st = s.e->Read(p, s.cs, out.data(), &zero);
    if (i != kBad) {
      ASSERT_TRUE(st.ok()) << "chunk " << i << ": " << st.ToString();
      EXPECT_FALSE(zero);
      EXPECT_EQ(memcmp(out.data(), s.data.data() + i * s.cs, s.cs), 0) << "chunk " << i;
      continue;
    }
    EXPECT_EQ(st.code(), EBADMSG) << st.ToString();
    char chunk[32];
    snprintf(chunk, sizeof(chunk), "%p", static_cast<void*>(p));
    EXPECT_NE(st.message().find("file store: entry"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(chunk), std::string::npos) << "names the chunk: " << st.message();
  }
  EXPECT_GT(StatGet(Stat::checksum_errors), errors0);
  // The chunk stays stored and keeps failing (nothing installed, nothing healed with wrong bytes).
  bool zero = false;
  EXPECT_EQ(s.e->Read(static_cast<char*>(s.r.base) + kBad * s.cs, s.cs, out.data(), &zero).code(),
            EBADMSG);
}

sigjmp_buf g_jump;

TEST_F(StoreCorruptionTest, CpuLoadOfACorruptedChunkGetsSigbus) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const uint64_t seed = testing::PrintedTestSeed();
  // In a child process with its own engine, so the signal cannot hurt this test process.
  fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(20);  // a hang fails the test instead of blocking it
    CorruptSpill s;
    std::string why = MakeCorruptSpill(dir_, seed, &s);
    if (!why.empty()) {
      fprintf(stderr, "setup: %s\n", why.c_str());
      _exit(3);
    }
    const char* base = static_cast<const char*>(s.r.base);
    for (size_t i = 0; i < kChunks; ++i)  // every other chunk faults in exactly
      if (i != kBad && memcmp(base + i * s.cs, s.data.data() + i * s.cs, s.cs) != 0) _exit(4);
    struct sigaction sa {};
    sa.sa_handler = [](int) { siglongjmp(g_jump, 1); };
    sigaction(SIGBUS, &sa, nullptr);
    if (sigsetjmp(g_jump, 1) == 0) {
      volatile char c = base[kBad * s.cs + 100];
      _exit(c == s.data[kBad * s.cs + 100] ? 1 : 2);  // the load returned: bytes of some kind
    }
    _exit(42);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 42)
      << "1: the load returned (right bytes), 2: the load returned wrong bytes, 3: setup, 4: "
         "another chunk read back wrong";
}

}  // namespace
}  // namespace zrtier
