// The one table of ZRTIER_* options: name, type, default, unit, one-line help and the `zrtier run`
// flag. The environment parser, `zrtier run --help` and the README's option table are all generated
// from ZRTIER_OPTIONS, so they cannot disagree (mimalloc options.c).
//
// Value syntax:
//   size   : "65536", "64K", "1.5G", "2T" (binary units, case-insensitive, optional B/iB), or "N%"
//            = N percent of physical memory. "0" means "off/unlimited" where the help says so.
//   int    : decimal, may be negative.
//   bool   : 1/0, true/false, yes/no, on/off.
//   string : taken as is (choices, where listed, are checked).
// A bad value is reported (which variable, which value, why) and the default is kept.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "zrtier/status.h"

namespace zrtier {

enum class OptionType { kBool, kInt, kSize, kString };

// X(Id, NAME, type, "default", "unit", "choices|or empty", "run-flag or empty", "help")
// clang-format off
#define ZRTIER_OPTIONS(X)                                                                          \
  X(kDisable, "DISABLE", kBool, "0", "", "", "",                                                 \
    "1 = pass every CUDA call to the real runtime untouched")                                     \
  X(kRequire, "REQUIRE", kBool, "0", "", "", "require",                                          \
    "1 = zrtier must manage memory: if it cannot start (no userfaultfd, no CUDA runtime, ...), "   \
    "the program exits with status 69 instead of running unmanaged; zrtier run checks first and " \
    "refuses to start it")                                                                        \
  X(kVerbose, "VERBOSE", kInt, "0", "level", "", "verbose",                                      \
    "stderr logging: 0 errors and warnings, 1 info, 2 debug")                                     \
  X(kChunk, "CHUNK", kSize, "256K", "bytes", "", "chunk",                                         \
    "chunk size (power of two, >= page size): unit of faulting, compression and copying")        \
  X(kMinAlloc, "MIN_ALLOC", kSize, "1M", "bytes", "", "min-alloc",                               \
    "pinned allocations smaller than this go to the real runtime")                                \
  X(kMemory, "MEMORY", kSize, "0", "bytes", "", "memory",                                        \
    "most host memory zrtier's managed data may occupy: pinned in place, resident, RAM store and " \
    "T0 pool together (bytes or N% of RAM). 0 = auto: what the machine can spare, leaving "        \
    "max(1G, RAM/16) free")                                                                      \
  X(kPinInPlace, "PIN_IN_PLACE", kBool, "1", "", "", "",                                          \
    "1 = while the memory budget has room, pin regions where they are (cudaHostRegister): copies " \
    "run at plain pinned speed; 0 = every copy goes through T0 slots")                            \
  X(kArena, "ARENA", kSize, "1T", "bytes", "", "",                                               \
    "virtual address space reserved once for all managed regions")                                \
  X(kPinnedPool, "PINNED_POOL", kSize, "0", "bytes", "", "pool",                                 \
    "T0 slots: real pinned memory for copies of chunks not pinned in place. 0 = auto: 64M "       \
    "(whatever the budget)")                                                                     \
  X(kResidentLimit, "RESIDENT_LIMIT", kSize, "0", "bytes", "", "resident",                       \
    "a cap on the bytes of region pages kept resident (T1) below what the memory budget gives; "  \
    "colder chunks are compressed. 0 = the budget decides")                                       \
  X(kStoreLimit, "STORE_LIMIT", kSize, "40%", "bytes", "", "store",                              \
    "most bytes the compressed RAM store (T2) may occupy; past it chunks spill to lower tiers. "  \
    "Unset under ZRTIER_MEMORY with a tier below RAM: half the budget")                           \
  X(kStoreBackend, "STORE_BACKEND", kString, "ram", "", "", "backend",                           \
    "tiers below T1, in order, joined by '+': ram, zram, file (e.g. ram+file)")                   \
  X(kSpillDir, "SPILL_DIR", kString, "/var/tmp/zrtier-%u", "path", "", "spill",                  \
    "directory for spill files of the file tier (T3, io_uring, O_DIRECT); %u = the user id, so "  \
    "that each user has a directory of their own")                                               \
  X(kSpillLimit, "SPILL_LIMIT", kSize, "0", "bytes", "", "spill-limit",                          \
    "most bytes of spill files. 0 = until the file system is full")                               \
  X(kZramDevice, "ZRAM_DEVICE", kString, "auto", "path", "", "",                                 \
    "zram device for the zram tier: auto (a free /dev/zramN, hot-added if allowed) or a path")    \
  X(kCodec, "CODEC", kString, "auto", "", "auto|zstd|raw|gpu", "codec",                          \
    "chunk codec: auto (zero detection + byte planes + zstd), zstd (plain), raw (no compression), " \
    "gpu (byte planes + Huffman in segments a GPU kernel decodes)")                                \
  X(kZstdLevel, "ZSTD_LEVEL", kInt, "1", "level", "", "level", "zstd level for compressible planes") \
  X(kVerify, "VERIFY", kBool, "0", "", "", "verify",                                             \
    "1 = also checksum each chunk's original bytes, checked on decode (covers the RAM tier); zram and spill-file entries are always checked") \
  X(kWorkers, "WORKERS", kInt, "0", "threads", "", "workers",                                    \
    "decode/prefetch worker threads. 0 = all cores but two, at least 2")                             \
  X(kPrefetchAhead, "PREFETCH_AHEAD", kSize, "0", "bytes", "", "prefetch",                       \
    "bytes of predicted chunks decoded into T0 ahead of the copies. 0 = off (docs/decisions.md, " \
    "\"Prefetcher off by default\")")                                                            \
  X(kReadahead, "READAHEAD", kSize, "8M", "bytes", "", "readahead",                              \
    "bytes of stored chunks restored ahead of the CPU's sequential or strided scans, in parallel " \
    "on the workers: one scan gets them all, several share them (at least 4 chunks each), all "    \
    "together at most 1/8 of the resident limit. 0 = off")                                        \
  X(kPartialRestore, "PARTIAL_RESTORE", kBool, "1", "", "", "",                                  \
    "1 = a CPU touch of a stored chunk that looks random (not a scan) restores only the touched "  \
    "page (1/64 of a chunk over 256K), not the whole chunk; 0 = whole chunks")                    \
  X(kNumaNode, "NUMA_NODE", kInt, "-1", "node", "", "numa",                                      \
    "NUMA node for the RAM store's memory. -1 = not placed (the pinned pool never is)")          \
  X(kStats, "STATS", kBool, "1", "", "", "",                                                     \
    "1 = publish statistics in /dev/shm/zrtier.<pid> for zrtier stats and zrtier-top")           \
  X(kStatsFile, "STATS_FILE", kString, "", "path", "", "stats-file",                            \
    "at exit, write the final statistics to this file as JSON (zrtier stats FILE reads it); "     \
    "%p = the pid, so that several processes do not overwrite each other's")                     \
  X(kZramSize, "ZRAM_SIZE", kSize, "25%", "bytes", "", "",                                       \
    "disksize of the zram device the zram tier configures (its capacity for encoded chunks)")    \
  X(kLibrary, "LIBRARY", kString, "", "path", "", "",                                            \
    "libzrtier.so for zrtier run to preload (default: found next to the zrtier binary)")         \
  X(kPolicy, "POLICY", kString, "reuse", "", "reuse|lru", "policy",                              \
    "what leaves T0 and T1 first: reuse (the chunk predicted to be needed farthest ahead, "       \
    "learned from copies and CPU faults; until something is learned: least recently used in T0, " \
    "CLOCK in T1), or lru (no learning: least recently used in T0, CLOCK in T1). With either, "   \
    "while the CPU sweeps through more data than T1 may hold, T1 keeps a part of it in place (the " \
    "regions whose compression saves least) and cycles the rest")                                \
  X(kSpread, "SPREAD", kBool, "1", "", "", "spread",                                             \
    "1 = when a cycle of copies does not fit in T0, keep a hash sample of its chunks, spread "     \
    "over every layer, so that decode and DMA overlap in every copy (ZRTIER_POLICY=reuse only)") \
  X(kDmaBatch, "DMA_BATCH", kBool, "1", "", "", "",                                              \
    "1 = queue each piece's DMAs with one cudaMemcpyBatchAsync (CUDA 12.8+); 0 = one "            \
    "cudaMemcpyAsync per run of slots")                                                         \
  X(kH2dAsync, "H2D_ASYNC", kBool, "1", "", "", "",                                              \
    "1 = an asynchronous copy from zrtier memory to the GPU may return before its last chunks "   \
    "are decoded: their DMAs wait in the stream on a flag the decode sets (cuStreamWaitValue32); " \
    "0 = the copy call waits for every chunk")                                                   \
  X(kGpuDecode, "GPU_DECODE", kBool, "1", "", "", "gpu-decode",                                  \
    "1 = once the decode kernel loads, chunks that the CPU does not touch again after their "     \
    "first write are stored in the GPU format (with ZRTIER_CODEC=auto; every chunk with gpu), "   \
    "and a copy to the GPU of such chunks sends their encoded bytes and decodes them on the GPU, " \
    "in the copy's stream order (per CUDA context, set up at the first such copy: 64 MiB of "     \
    "device memory, 64 MiB pinned; docs/decisions.md, \"The GPU format for chunks the CPU does "  \
    "not reuse\"); 0 = the CPU decodes every chunk")                                             \
  X(kGpuStorePinned, "GPU_STORE_PINNED", kBool, "1", "", "", "gpu-store-pinned",                \
    "with GPU decode on: 1 = the RAM store's memory is registered for DMA as copies read "       \
    "it, and a GPU-decoded copy sends encodings straight from there (no copy into staging); "    \
    "0 = the fill workers copy encodings into pinned staging")                                   \
  X(kGpuEncode, "GPU_ENCODE", kBool, "1", "", "", "gpu-encode",                                  \
    "1 = a device-to-host copy whose chunks go to the compressed store (the resident budget is "  \
    "full) has them encoded by the GPU on the copy's stream, and the encodings are stored as "    \
    "they land (no CPU encode), except chunks the CPU reads back; set up at the first such copy: " \
    "64 MiB of device memory per CUDA context and 64 MiB of pinned memory from the budget; 0 = "  \
    "the CPU encodes them")                                                                      \
  X(kCrashReport, "CRASH_REPORT", kBool, "0", "", "", "crash-report",                            \
    "1 = a process that dies of SIGSEGV, SIGBUS, SIGFPE, SIGILL or SIGABRT first prints the "     \
    "signal, the thread's name and its native stack to stderr (it still ends as it would)")      \
  X(kTestFailInit, "TEST_FAIL_INIT", kString, "none", "", "none|uffd|pool", "",                  \
    "tests only: make start-up fail as it would without userfaultfd (uffd) or without pinned "     \
    "memory for the T0 pool (pool), to exercise the fallback to the real runtime")              \
  X(kTestStatsDir, "TEST_STATS_DIR", kString, "/dev/shm", "path", "", "",                        \
    "tests only: the directory of the statistics blocks")
// clang-format on

// Exit status of a program stopped by ZRTIER_REQUIRE=1 because zrtier cannot start, and of
// `zrtier run` refusing to start one (EX_UNAVAILABLE in sysexits.h).
inline constexpr int kRequireExitStatus = 69;

enum class Opt : int {
#define ZRTIER_OPTION_ENUM(id, ...) id,
  ZRTIER_OPTIONS(ZRTIER_OPTION_ENUM)
#undef ZRTIER_OPTION_ENUM
      kCount
};
inline constexpr int kOptionCount = static_cast<int>(Opt::kCount);

struct OptionInfo {
  Opt id;
  const char* name;  // "CHUNK"; the variable is "ZRTIER_" + name
  OptionType type;
  const char* default_text;  // as a user would write it
  const char* unit;
  const char* choices;  // "a|b|c" or ""
  const char* flag;     // `zrtier run --<flag>`, or "" when the option has no flag
  const char* help;
};

// Options for tests only (their names start with TEST_): parsed like the others, left out of
// `zrtier options`, `zrtier run --help` and the README.
bool IsTestOption(const OptionInfo& info);

// The table, in declaration order. REQUIRES: 0 <= i < kOptionCount.
const OptionInfo& OptionAt(int i);
const OptionInfo& InfoOf(Opt id);
// Finds by "CHUNK" or "ZRTIER_CHUNK" (case-sensitive), or by run flag ("chunk").
std::optional<Opt> FindOption(std::string_view name_or_flag);

// Parses a size ("64K", "1.5G", "10%"). Percentages are of physical memory.
Status ParseSize(std::string_view text, uint64_t* out);
// Formats bytes as "64K", "1.5G", "123" (the shortest exact-ish form a user would type).
std::string FormatSize(uint64_t bytes);

// A set of option values. Not thread-safe to modify; the runtime parses once at start and then
// only reads.
class Options {
 public:
  Options();  // every option at its default

  // Reads every ZRTIER_* variable from `getenv`. A bad value is reported through `warn` (by default
  // one warning line on stderr naming the variable) and the default is kept. Unknown ZRTIER_*
  // variables are reported too (a typo should not silently do nothing), except ZRTIER_TEST_* (the
  // test suite's own knobs).
  static Options FromEnvironment(
      const std::function<void(const std::string&)>& warn = nullptr,
      const std::function<const char*(const char*)>& getenv_fn = nullptr);

  // Parses and validates `text` for `id`. On failure the value is unchanged and the Status names
  // the variable, the value and the accepted form.
  Status Set(Opt id, std::string_view text);

  bool Bool(Opt id) const;
  int64_t Int(Opt id) const;
  uint64_t Size(Opt id) const;
  const std::string& String(Opt id) const;
  // ZRTIER_SPILL_DIR with every "%u" replaced by the effective user id.
  std::string SpillDir() const;
  // The value as text, as it would be written in the environment.
  std::string Text(Opt id) const;

 private:
  int64_t num_[kOptionCount];
  std::string str_[kOptionCount];
};

// Physical memory in bytes (sysconf), used for "%" sizes.
uint64_t PhysicalMemoryBytes();

// ZRTIER_WORKERS resolved: `requested` if > 0, else all online cores but two, at least 2 (copies
// from compressed data need many decoding cores to keep up with the GPU link).
int ResolveWorkers(int64_t requested);

}  // namespace zrtier
