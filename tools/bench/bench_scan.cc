// `zrtier bench scan`: CPU scans over compressed memory -- what an optimizer step over offloaded
// parameters or a reload of offloaded activations meets. A region of --bytes of sample data is
// written, kept at --resident resident (the rest compressed in the RAM store), and then, for each
// mode and thread count, evicted down to the limit again and scanned:
//   seq     each thread reads its contiguous part, every 8-byte word
//   rmw     the same, adding 1 to every word (read-modify-write: write faults and re-encodes)
//   strided each thread reads every 4th chunk of its part
//   rand    every chunk once, in a random order (threads take turns)
//   rand4k  one 8-byte load per randomly chosen 4 KiB page (a sparse touch under pressure)
// gbps counts the bytes the scan reads (rand4k: 4 KiB per touch); memcpy_gbps is the same scan over
// plain memory of the same pattern (a buffer of at most 1 GiB) in the same run; faults, wp_faults
// and prefetched are the engine's missing faults, write-protect faults (a clean chunk's first
// store) and readahead restores during the scan. kernel_gbps
// is the kernel's answer, measured first (before the engine starts threads): the same data in
// --bytes of pageable memory of a child process whose memory cgroup holds it to --resident bytes,
// the rest swapped by the kernel to a zram device (lz4 where offered) -- the same scans in the same
// order (tools/bench/kernel_swap.h). Where the machine cannot (not root, no zram, no memory
// cgroup) it is "-" and stderr says why; --no-kernel skips it.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "tools/bench/bench.h"
#include "tools/bench/kernel_swap.h"
#include "tools/bench/sample_data.h"
#include "zrtier/options.h"

namespace zrtier::tools {
namespace {

struct ScanArgs {
  bool json = false;
  std::string bytes = "4G";
  std::string resident = "5%";  // of --bytes
  std::string threads = "1,2,all";
  std::string modes = "seq,rmw,strided,rand,rand4k";
  std::string data = "bf16";
  int touches = 20000;  // rand4k
  bool no_kernel = false;
};

int Fail(const Status& s, int code = 1) {
  return BenchFailure("scan", s, code);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// One scan of `mode` by `threads` threads over [base, base+len) (chunks of `cs` bytes); returns
// the seconds it took and adds the bytes it read to *bytes.
double Scan(const std::string& mode, int threads, char* base, size_t len, size_t cs, int touches,
            uint64_t seed, uint64_t* bytes) {
  using Clock = std::chrono::steady_clock;
  const size_t n = len / cs;
  std::vector<size_t> order;
  if (mode == "rand") {
    order.resize(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  }
  std::atomic<uint64_t> total{0}, sink{0};
  auto read_words = [](const char* p, size_t n_bytes) {
    uint64_t s = 0;
    const volatile uint64_t* w = reinterpret_cast<const volatile uint64_t*>(p);
    for (size_t k = 0; k < n_bytes / 8; ++k) s += w[k];
    return s;
  };
  auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      uint64_t s = 0, read = 0;
      const size_t lo = n * t / threads, hi = n * (t + 1) / threads;
      if (mode == "seq" || mode == "strided") {
        const size_t step = mode == "seq" ? 1 : 4;
        for (size_t i = lo; i < hi; i += step) {
          s += read_words(base + i * cs, cs);
          read += cs;
        }
      } else if (mode == "rmw") {
        for (size_t i = lo; i < hi; ++i) {
          volatile uint64_t* w = reinterpret_cast<volatile uint64_t*>(base + i * cs);
          for (size_t k = 0; k < cs / 8; ++k) w[k] = w[k] + 1;
          read += cs;
        }
      } else if (mode == "rand") {
        for (size_t k = t; k < n; k += threads) {
          s += read_words(base + order[k] * cs, cs);
          read += cs;
        }
      } else {  // rand4k
        std::mt19937_64 rng(seed * 1000 + t);
        const size_t pages = len / 4096;
        for (int k = 0; k < touches / threads; ++k) {
          s += *reinterpret_cast<volatile uint64_t*>(base + (rng() % pages) * 4096);
          read += 4096;
        }
      }
      sink += s;
      total += read;
    });
  }
  for (auto& th : ts) th.join();
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  *bytes = total.load();
  if (sink.load() == 42) printf(" ");
  return sec;
}

// Writes the scan's data into `base` (`len` bytes, chunks of `cs`): a pool of 64 distinct chunks
// of sample data, each copy tagged with its index.
void FillScanData(SampleKind kind, char* base, size_t len, size_t cs) {
  const size_t kPool = 64;
  std::vector<char> pool(kPool * cs);
  FillSample(kind, 1, pool.data(), pool.size());
  for (size_t i = 0; i < len / cs; ++i) {
    memcpy(base + i * cs, pool.data() + (i % kPool) * cs, cs);
    memcpy(base + i * cs, &i, sizeof(i));
  }
}

using KernelResults = std::map<std::pair<std::string, int>, double>;  // (mode, threads) -> GB/s

// The kernel baseline (see the file comment): runs every (mode, threads) scan in a child over
// pageable memory swapped to zram. Returns false with *why when the machine cannot.
bool KernelScans(const std::vector<std::string>& modes, const std::vector<int>& thread_counts,
                 SampleKind kind, uint64_t bytes, uint64_t resident, size_t cs, int touches,
                 KernelResults* out, std::string* why) {
  KernelSwap ks;
  if (Status s = ks.Start(bytes); !s.ok()) return *why = s.ToString(), false;
  std::string text;
  Status s = ks.RunLimited(
      resident,
      [&](int fd, const std::function<bool()>& limit) {
        const size_t len = bytes / cs * cs;
        void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) return 4;
        char* base = static_cast<char*>(m);
        FillScanData(kind, base, len, cs);
        if (!limit()) return 6;
        uint64_t seed = 1;
        for (const std::string& mode : modes) {
          for (int threads : thread_counts) {
            uint64_t read = 0;
            const double sec = Scan(mode, threads, base, len, cs, touches, ++seed, &read);
            const std::string line = mode + " " + std::to_string(threads) + " " +
                                     std::to_string(read / sec / 1e9) + "\n";
            if (write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 5;
          }
        }
        return 0;
      },
      &text);
  if (!s.ok()) return *why = s.ToString(), false;
  std::istringstream in(text);
  std::string mode;
  int threads;
  double gbps;
  while (in >> mode >> threads >> gbps) (*out)[{mode, threads}] = gbps;
  return true;
}

int Run(const ScanArgs& a) {
  uint64_t bytes = 0;
  if (Status s = ParseSize(a.bytes, &bytes); !s.ok()) return Fail(s, 2);
  uint64_t resident = 0;
  if (!a.resident.empty() && a.resident.back() == '%') {
    resident = static_cast<uint64_t>(bytes * atof(a.resident.c_str()) / 100);
  } else if (Status s = ParseSize(a.resident, &resident); !s.ok()) {
    return Fail(s, 2);
  }
  SampleKind kind;
  if (!ParseSampleKind(a.data, &kind))
    return Fail(Status::Error(EINVAL, "unknown --data " + a.data), 2);
  Options o = Options::FromEnvironment();
  std::vector<int> thread_counts;
  for (const std::string& t : Split(a.threads)) {
    int n = t == "all" ? static_cast<int>(std::thread::hardware_concurrency()) : atoi(t.c_str());
    if (n > 0 && std::find(thread_counts.begin(), thread_counts.end(), n) == thread_counts.end())
      thread_counts.push_back(n);
  }
  for (const std::string& mode : Split(a.modes))
    if (mode != "seq" && mode != "rmw" && mode != "strided" && mode != "rand" && mode != "rand4k")
      return Fail(
          Status::Error(EINVAL, "unknown mode " + mode + " (seq, rmw, strided, rand, rand4k)"), 2);
  KernelResults kernel;
  if (!a.no_kernel) {
    std::string why;
    if (!KernelScans(Split(a.modes), thread_counts, kind, bytes, resident, o.Size(Opt::kChunk),
                     a.touches, &kernel, &why))
      fprintf(stderr, "zrtier bench scan: no kernel baseline (kernel_gbps): %s\n", why.c_str());
  }
  o.Set(Opt::kStoreLimit, "0");
  o.Set(Opt::kResidentLimit, std::to_string(resident));
  std::unique_ptr<Engine> e;
  if (Status s = Engine::Create(o, nullptr, nullptr, &e); !s.ok()) return Fail(s);
  const size_t cs = e->chunk_size();
  RegionInfo r;
  if (Status s = e->Allocate(bytes, &r); !s.ok()) return Fail(s);
  char* base = static_cast<char*>(r.base);
  FillScanData(kind, base, r.size, cs);
  // The plain-memory baseline buffer (at most 1 GiB, the same data).
  const size_t plain_len = std::min<size_t>(r.size, 1ull << 30) / cs * cs;
  std::vector<char> plain(plain_len);
  FillScanData(kind, plain.data(), plain_len, cs);

  Report rep({"mode", "threads", "gbps", "memcpy_gbps", "ratio", "faults", "wp_faults",
              "prefetched", "kernel_gbps", "bytes", "resident"});
  uint64_t seed = 1;
  for (const std::string& mode : Split(a.modes)) {
    for (int threads : thread_counts) {
      // Down to the limit: the scan meets compressed chunks everywhere but in the resident part.
      if (Status s = e->EvictTo(resident); !s.ok()) return Fail(s);
      const uint64_t f0 = StatGet(Stat::faults_missing), p0 = StatGet(Stat::readahead_chunks),
                     w0 = StatGet(Stat::faults_wp);
      uint64_t read = 0, plain_read = 0;
      const double sec = Scan(mode, threads, base, r.size, cs, a.touches, ++seed, &read);
      const double psec =
          Scan(mode, threads, plain.data(), plain_len, cs, a.touches, seed, &plain_read);
      const double gbps = read / sec / 1e9, mgbps = plain_read / psec / 1e9;
      rep.AddRow({mode, std::to_string(threads), Fixed(gbps, 3), Fixed(mgbps, 2),
                  Fixed(mgbps > 0 ? gbps / mgbps : 0, 3),
                  std::to_string(StatGet(Stat::faults_missing) - f0),
                  std::to_string(StatGet(Stat::faults_wp) - w0),
                  std::to_string(StatGet(Stat::readahead_chunks) - p0),
                  kernel.count({mode, threads}) ? Fixed(kernel[{mode, threads}], 3) : "-",
                  FormatSize(r.size), FormatSize(resident)});
    }
  }
  rep.Print(a.json);
  return 0;
}

void AddScanBench(CLI::App* bench) {
  auto args = std::make_shared<ScanArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "scan",
      "CPU scans over compressed memory (seq, rmw, strided, rand, rand4k) by 1, 2 and all "
      "threads: GB/s against the same scan over plain memory");
  cmd->add_flag("--json", args->json, "one JSON object per row (mode, threads, gbps, ...)");
  cmd->add_option("--bytes", args->bytes, "region size (default 4G)");
  cmd->add_option("--resident", args->resident, "resident limit: bytes or N% of --bytes (5%)");
  cmd->add_option("--threads", args->threads, "thread counts, e.g. 1,2,all (default)");
  cmd->add_option("--modes", args->modes, "modes (default seq,rmw,strided,rand,rand4k)");
  AddSampleKindOption(cmd, &args->data);
  cmd->add_option("--touches", args->touches, "rand4k: page touches per scan (default 20000)");
  cmd->add_flag("--no-kernel", args->no_kernel,
                "skip the kernel baseline (kernel_gbps: pageable memory swapped to zram)");
  cmd->callback([args] { ExitOnFailure(Run(*args)); });
}

}  // namespace

ZRTIER_BENCH(scan, AddScanBench);

}  // namespace zrtier::tools
