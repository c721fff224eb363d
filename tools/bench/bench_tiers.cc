// `zrtier bench tiers`: read-back speed of each store tier (ram, zram, file, and zram/file with
// Prefetch issued ahead of Get) for 64 KiB bf16 chunks encoded with zrtier's codec, and the
// compression ratio of the kernel's zram codecs on the same raw bf16 data against zrtier's codec.
//
// write_mbps (rows of a bare tier) counts the encoded bytes put per second of filling the tier (the
// block tiers take 64 entries per PutBatch); read_mbps counts the encoded bytes delivered to the
// caller (copied into its buffer) per second of the read loop; p50/p99 are per-Get latencies;
// cpu_cores is the CPU time of the whole process (the prefetch and io_uring worker threads too)
// over the loop's wall time; reqs / avg_req_kib are the I/O requests the tier issued during the
// loop and their average size (adjacent entries of a batch are read in one request). Reads go in
// shuffled order, except the `+prefetch-seq` rows, which read the same entries in the order they
// were written (a region read front to back). The file tier reads with O_DIRECT (no page cache)
// unless the file system refuses it. The `disk-dd-1m` row reads the spill files themselves with 1
// MiB O_DIRECT requests: the disk's speed during the same run, for scale.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "runtime/codec/codec.h"
#include "runtime/store/file_store.h"
#include "runtime/store/ram_store.h"
#include "runtime/store/tiered_store.h"
#include "runtime/store/zram_device.h"
#include "runtime/store/zram_store.h"
#include "tools/bench/bench.h"
#include "tools/bench/sample_data.h"

namespace zrtier::tools {
namespace {

constexpr size_t kChunk = 64 << 10;

struct Args {
  uint64_t mb = 128;
  uint64_t codec_mb = 64;
  std::string dir = "/var/tmp/zrtier-bench";
  int ahead = 256;
  bool json = false;
};

double NowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ReadResult {
  double mbps = 0, p50 = 0, p99 = 0;
  double cpu_cores = 0;  // the process's CPU time (every thread) over the loop's wall time
  int64_t reqs = -1;     // >= 0: requests issued (when the tier does not count them itself)
  double avg_kib = 0;
};

// CPU seconds used by the whole process so far (user + system, every thread).
double ProcessCpuSeconds() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// The result of a read loop that began at `start_us` (NowUs()) with the process at `cpu0`
// (ProcessCpuSeconds()) and ends now: MB/s of the `bytes` it delivered, its CPU use, and p50/p99
// of its per-read latencies *lat (µs; sorted here; p50/p99 stay 0 when there are none).
ReadResult Summarize(double start_us, double cpu0, uint64_t bytes, std::vector<double>* lat) {
  const double secs = (NowUs() - start_us) / 1e6;
  std::sort(lat->begin(), lat->end());
  ReadResult r;
  r.cpu_cores = (ProcessCpuSeconds() - cpu0) / secs;
  r.mbps = bytes / 1e6 / secs;
  if (!lat->empty()) {
    r.p50 = (*lat)[lat->size() / 2];
    r.p99 = (*lat)[std::min(lat->size() - 1, lat->size() * 99 / 100)];
  }
  return r;
}

// The disk's own speed right now, for scale: every spill file in `dir` read front to back with
// 1 MiB O_DIRECT preads, one at a time (what `dd bs=1M iflag=direct` does), up to its allocated
// size (a fresh store fills its segments from offset 0). Latencies are per 1 MiB read.
ReadResult DiskRead(const std::string& dir, bool* ok) {
  constexpr size_t kReq = 1 << 20;
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, kReq) != 0) {
    *ok = false;
    return {};
  }
  std::vector<double> lat;
  uint64_t bytes = 0;
  double start = NowUs(), cpu0 = ProcessCpuSeconds();
  // Spill files have no name while the store is open (O_TMPFILE, or unlinked at once): they are
  // found through this process's open descriptors whose target lies in `dir`.
  std::error_code ec;
  const std::string canon = std::filesystem::weakly_canonical(dir, ec).string();
  for (auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (ec || target.rfind(canon + "/", 0) != 0) continue;
    int fd = open(e.path().c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
      if (fd >= 0) close(fd);
      continue;
    }
    uint64_t len = std::min<uint64_t>(st.st_size, static_cast<uint64_t>(st.st_blocks) * 512);
    for (uint64_t off = 0; off + kReq <= len; off += kReq) {
      double t0 = NowUs();
      if (pread(fd, buf, kReq, static_cast<off_t>(off)) != static_cast<ssize_t>(kReq)) break;
      lat.push_back(NowUs() - t0);
      bytes += kReq;
    }
    close(fd);
  }
  ReadResult r = Summarize(start, cpu0, bytes, &lat);
  free(buf);
  if (lat.empty()) {
    fprintf(stderr, "bench tiers: disk baseline: nothing to read in %s\n", dir.c_str());
    return r;
  }
  r.reqs = static_cast<int64_t>(lat.size());
  r.avg_kib = kReq / 1024.0;
  return r;
}

// Reads every handle (in a shuffled order, or in write order when seed is 0) into a caller buffer;
// with `ahead` > 0 issues Prefetch that many entries ahead of each Get.
ReadResult ReadBack(ChunkStore* store, const std::vector<StoreHandle>& hs, int ahead, uint64_t seed,
                    bool* ok) {
  std::vector<size_t> order(hs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (seed) std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  std::vector<unsigned char> dst(Codec::MaxEncodedSize(kChunk));
  std::vector<double> lat;
  lat.reserve(hs.size());
  uint64_t bytes = 0;
  for (int i = 0; i < ahead && i < static_cast<int>(order.size()); ++i)
    store->Prefetch(hs[order[i]]);
  double start = NowUs(), cpu0 = ProcessCpuSeconds();
  for (size_t i = 0; i < order.size(); ++i) {
    if (ahead > 0 && i + ahead < order.size()) store->Prefetch(hs[order[i + ahead]]);
    double t0 = NowUs();
    Status s = store->Get(hs[order[i]], [&](const void* p, size_t n) {
      memcpy(dst.data(), p, n);
      bytes += n;
      return Status::Ok();
    });
    lat.push_back(NowUs() - t0);
    if (!s.ok()) {
      fprintf(stderr, "bench tiers: %s Get: %s\n", store->name(), s.ToString().c_str());
      *ok = false;
      return {};
    }
  }
  return Summarize(start, cpu0, bytes, &lat);
}

// Reads every handle (shuffled) with GetBatch, 32 entries per submission; the latency of each
// entry is its batch's time.
ReadResult BatchReadBack(ExtentStore* store, const std::vector<StoreHandle>& hs, uint64_t seed,
                         bool* ok) {
  std::vector<size_t> order(hs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(seed));
  std::vector<std::vector<unsigned char>> out(32);
  std::vector<double> lat;
  uint64_t bytes = 0;
  double start = NowUs(), cpu0 = ProcessCpuSeconds();
  for (size_t i = 0; i < order.size(); i += 32) {
    std::vector<ExtentStore::GetReq> reqs;
    for (size_t k = i; k < std::min(order.size(), i + 32); ++k) {
      ExtentStore::GetReq r;
      r.h = hs[order[k]];
      r.out = &out[k - i];
      reqs.push_back(r);
    }
    double t0 = NowUs();
    store->GetBatch(reqs.data(), reqs.size());
    double dt = NowUs() - t0;
    for (auto& r : reqs) {
      if (!r.status.ok()) {
        fprintf(stderr, "bench tiers: %s GetBatch: %s\n", store->name(),
                r.status.ToString().c_str());
        *ok = false;
        return {};
      }
      bytes += r.out->size();
      lat.push_back(dt);
    }
  }
  return Summarize(start, cpu0, bytes, &lat);
}

// Puts every encoded chunk into `store`; returns the handles.
bool Fill(ChunkStore* store, const std::vector<std::vector<unsigned char>>& enc,
          std::vector<StoreHandle>* hs) {
  if (auto* ext = dynamic_cast<ExtentStore*>(store)) {  // one batch per 64 chunks
    for (size_t i = 0; i < enc.size(); i += 64) {
      std::vector<ExtentStore::PutReq> reqs;
      for (size_t k = i; k < std::min(enc.size(), i + 64); ++k) {
        ExtentStore::PutReq r;
        r.data = enc[k].data();
        r.len = enc[k].size();
        r.raw_len = kChunk;
        reqs.push_back(r);
      }
      ext->PutBatch(reqs.data(), reqs.size());
      for (auto& r : reqs) {
        if (!r.status.ok()) {
          fprintf(stderr, "bench tiers: %s Put: %s\n", store->name(), r.status.ToString().c_str());
          return false;
        }
        hs->push_back(r.out);
      }
    }
    return true;
  }
  for (auto& e : enc) {
    StoreHandle h;
    Status s = store->Put(e.data(), e.size(), kChunk, &h);
    if (!s.ok()) {
      fprintf(stderr, "bench tiers: %s Put: %s\n", store->name(), s.ToString().c_str());
      return false;
    }
    hs->push_back(h);
  }
  return true;
}

// The ratio a kernel zram codec reaches on `raw_chunks` chunks of bf16 (orig / compr_data_size).
bool ZramRatio(const std::string& alg, size_t raw_chunks, double* ratio, std::string* why) {
  ZramDevice dev(Os::Default());
  Status s = dev.Claim("auto");
  if (s.ok()) s = dev.SetAlgorithm(alg);
  if (s.ok()) s = dev.SetDiskSize(raw_chunks * kChunk + (1 << 20));
  if (!s.ok()) {
    *why = s.ToString();
    return false;
  }
  int fd = open(dev.path().c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    *why = dev.path() + ": " + strerror(errno);
    return false;
  }
  std::vector<unsigned char> raw(kChunk);
  for (size_t i = 0; i < raw_chunks; ++i) {
    FillSample(SampleKind::kBf16Gaussian, i, raw.data(), kChunk);
    if (pwrite(fd, raw.data(), kChunk, static_cast<off_t>(i * kChunk)) !=
        static_cast<ssize_t>(kChunk)) {
      *why = std::string("write: ") + strerror(errno);
      close(fd);
      return false;
    }
  }
  fsync(fd);
  uint64_t orig = 0, compr = 0, mem = 0;
  s = dev.MmStat(&orig, &compr, &mem);
  close(fd);
  if (!s.ok() || compr == 0) {
    *why = s.ok() ? "mm_stat shows nothing stored" : s.ToString();
    return false;
  }
  *ratio = static_cast<double>(orig) / compr;
  return true;
}

int Run(const Args& a) {
  size_t n = a.mb * (1 << 20) / kChunk;
  CodecConfig cc;
  cc.kind = CodecKind::kAuto;
  Codec codec(cc);
  std::vector<std::vector<unsigned char>> enc(n);
  std::vector<unsigned char> raw(kChunk);
  uint64_t enc_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    FillSample(SampleKind::kBf16Gaussian, i, raw.data(), kChunk);
    enc[i].resize(Codec::MaxEncodedSize(kChunk));
    size_t len = 0;
    if (!codec.Encode(raw.data(), kChunk, enc[i].data(), enc[i].size(), &len).ok() || len == 0) {
      fprintf(stderr, "bench tiers: encode failed\n");
      return 1;
    }
    enc[i].resize(len);
    enc_bytes += len;
  }
  if (!a.json)
    printf("%zu chunks of 64 KiB bf16, encoded to %.1f MB (zrtier codec auto, %.3fx)\n", n,
           enc_bytes / 1e6, static_cast<double>(n * kChunk) / enc_bytes);

  Report tiers(
      {"tier", "write_mbps", "read_mbps", "p50_us", "p99_us", "cpu_cores", "reqs", "avg_req_kib"});
  // `before`: the tier's request counts at the start of the read loop (store nullptr: RAM);
  // `write_mbps` 0: not measured for this row.
  auto add = [&](const std::string& name, const ReadResult& r, const ExtentStore* store,
                 const ExtentStore::IoCounts& before, double write_mbps = 0) {
    std::string reqs = "-", avg = "-";
    if (r.reqs >= 0) {
      reqs = std::to_string(r.reqs);
      avg = Fixed(r.avg_kib, 1);
    } else if (store) {
      ExtentStore::IoCounts now = store->io_counts();
      uint64_t n = now.read_requests - before.read_requests;
      reqs = std::to_string(n);
      if (n) avg = Fixed((now.read_bytes - before.read_bytes) / 1024.0 / n, 1);
    }
    tiers.AddRow({name, write_mbps > 0 ? Fixed(write_mbps, 0) : "-", Fixed(r.mbps, 0),
                  Fixed(r.p50, 1), Fixed(r.p99, 1), Fixed(r.cpu_cores, 2), reqs, avg});
  };
  bool ok = true;
  {
    RamStore ram(0, -1, Os::Default());
    std::vector<StoreHandle> hs;
    double w0 = NowUs();
    if (!Fill(&ram, enc, &hs)) return 1;
    double write_mbps = enc_bytes / (NowUs() - w0);
    add("ram", ReadBack(&ram, hs, 0, 1, &ok), nullptr, {}, write_mbps);
  }
  // Lower tiers alone, then behind a TieredStore whose RAM tier is (nearly) full, with Prefetch.
  auto run_lower = [&](const char* name, std::unique_ptr<ExtentStore> store) {
    std::vector<StoreHandle> hs;
    double w0 = NowUs();
    if (!Fill(store.get(), enc, &hs)) {
      ok = false;
      return;
    }
    double write_mbps = enc_bytes / (NowUs() - w0);
    ExtentStore::IoCounts c0 = store->io_counts();
    add(name, ReadBack(store.get(), hs, 0, 2, &ok), store.get(), c0, write_mbps);
    c0 = store->io_counts();
    add(std::string(name) + "+batch", BatchReadBack(store.get(), hs, 4, &ok), store.get(), c0);
    for (StoreHandle h : hs) store->Free(h);
  };
  auto run_prefetched = [&](const std::string& name, std::unique_ptr<ExtentStore> store) {
    const ExtentStore* tier = store.get();  // owned by the stack from here on
    std::vector<std::unique_ptr<ExtentStore>> lower_tiers;
    lower_tiers.push_back(std::move(store));
    // A RAM tier of 64 KiB: every chunk falls through to the lower tier.
    TieredStore stack(std::make_unique<RamStore>(64 << 10, -1, Os::Default()),
                      std::move(lower_tiers));
    std::vector<StoreHandle> hs;
    if (!Fill(&stack, enc, &hs)) {
      ok = false;
      return;
    }
    stack.WaitIdle();
    ExtentStore::IoCounts c0 = tier->io_counts();
    add(name + "+prefetch", ReadBack(&stack, hs, a.ahead, 3, &ok), tier, c0);
    stack.WaitIdle();
    c0 = tier->io_counts();
    add(name + "+prefetch-seq", ReadBack(&stack, hs, a.ahead, 0, &ok), tier, c0);
    if (name == "file") add("disk-dd-1m", DiskRead(a.dir, &ok), nullptr, {});
  };
  std::string zram_why = ZramDevice::UnavailableReason();
  for (int pass = 0; pass < 2; ++pass) {
    if (!zram_why.empty()) {
      if (pass == 0) fprintf(stderr, "bench tiers: zram tier skipped: %s\n", zram_why.c_str());
      break;
    }
    std::unique_ptr<ZramStore> z;
    Status s = ZramStore::Create("auto", enc_bytes * 5 / 4 + (8 << 20), Os::Default(), &z);
    if (!s.ok()) {
      fprintf(stderr, "bench tiers: zram tier skipped: %s\n", s.ToString().c_str());
      break;
    }
    if (pass == 0)
      run_lower("zram", std::move(z));
    else
      run_prefetched("zram", std::move(z));
  }
  for (int pass = 0; pass < 2; ++pass) {
    std::unique_ptr<FileStore> f;
    Status s = FileStore::Create(a.dir, 0, Os::Default(), &f);
    if (!s.ok()) {
      fprintf(stderr, "bench tiers: file tier skipped: %s\n", s.ToString().c_str());
      break;
    }
    if (pass == 0 && !f->direct_io())
      fprintf(stderr, "bench tiers: %s: buffered I/O\n", a.dir.c_str());
    if (pass == 0)
      run_lower("file", std::move(f));
    else
      run_prefetched("file", std::move(f));
  }

  // Compression ratios on the same raw bf16 data.
  size_t cn = std::min<size_t>(n, a.codec_mb * (1 << 20) / kChunk);
  Report codecs({"codec", "ratio"});
  uint64_t auto_out = 0, zstd_out = 0;
  CodecConfig zc;
  zc.kind = CodecKind::kZstd;
  Codec zstd(zc);
  std::vector<unsigned char> out(Codec::MaxEncodedSize(kChunk));
  for (size_t i = 0; i < cn; ++i) {
    FillSample(SampleKind::kBf16Gaussian, i, raw.data(), kChunk);
    size_t len = 0;
    if (codec.Encode(raw.data(), kChunk, out.data(), out.size(), &len).ok()) auto_out += len;
    if (zstd.Encode(raw.data(), kChunk, out.data(), out.size(), &len).ok()) zstd_out += len;
  }
  codecs.AddRow({"zrtier-auto", Fixed(static_cast<double>(cn * kChunk) / auto_out, 3)});
  codecs.AddRow({"zrtier-zstd-plain", Fixed(static_cast<double>(cn * kChunk) / zstd_out, 3)});
  if (zram_why.empty()) {
    ZramDevice probe(Os::Default());
    std::vector<std::string> algs;
    if (probe.Claim("auto").ok()) algs = probe.Algorithms();
    probe.Release();
    for (const std::string& alg : algs) {
      double ratio = 0;
      std::string why;
      if (ZramRatio(alg, cn, &ratio, &why))
        codecs.AddRow({"zram-" + alg, Fixed(ratio, 3)});
      else
        fprintf(stderr, "bench tiers: zram %s: %s\n", alg.c_str(), why.c_str());
    }
  }
  tiers.Print(a.json);
  if (!a.json) printf("\n");
  codecs.Print(a.json);
  std::filesystem::remove(a.dir);  // empty again (the stores deleted their files)
  return ok ? 0 : 1;
}

void Add(CLI::App* bench) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench->add_subcommand(
      "tiers", "read-back MB/s and latency per store tier; zram codec ratios vs zrtier's codec");
  cmd->add_option("--mb", args->mb, "MiB of 64 KiB bf16 chunks per tier")->capture_default_str();
  cmd->add_option("--codec-mb", args->codec_mb, "MiB of raw chunks for the codec ratios")
      ->capture_default_str();
  cmd->add_option("--dir", args->dir, "directory for the file tier")->capture_default_str();
  cmd->add_option("--ahead", args->ahead, "entries prefetched ahead of each Get")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "one JSON object per row");
  cmd->callback([args] { ExitOnFailure(Run(*args)); });
}

}  // namespace

ZRTIER_BENCH(tiers, Add);

}  // namespace zrtier::tools
