// `zrtier bench host`: the host-side ceilings of the copy paths, with 1..N threads working on
// 64 KiB chunks at once -- memcpy (what publishing a device-to-host copy costs at best), the
// streaming copy (CopyStreaming: non-temporal stores, what filling T0 from T1 costs at best) and
// the chunk codec's decode of bf16, with plain and with streaming stores (what filling T0 from T2
// costs at best). The GPU copy paths cannot beat these; docs/PERFORMANCE.md reads its copy
// numbers against them. The last column reads the same chunks back through a real Engine (stored,
// Engine::ReadChunk decodes them into the destination, as the H2D fill does): its gap to the
// streaming decode is the engine's own cost under that many threads ("-" where the engine cannot
// start, e.g. without userfaultfd).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/base/stream_copy.h"
#include "runtime/codec/codec.h"
#include "runtime/engine/engine.h"
#include "tools/bench/bench.h"
#include "tools/bench/sample_data.h"
#include "zrtier/options.h"

namespace zrtier::tools {
namespace {

struct HostBenchArgs {
  bool json = false;
  std::string bytes = "1G";
  std::string chunk = InfoOf(Opt::kChunk).default_text;  // ZRTIER_CHUNK's default
  std::vector<int> threads;
};

// Runs fn(thread, chunk_index) over every chunk with `threads` threads (chunks dealt round robin)
// and returns GB/s of chunk bytes.
template <typename Fn>
double Parallel(int threads, size_t chunks, size_t chunk, Fn fn) {
  std::atomic<size_t> next{0};
  uint64_t t0 = MonotonicNs();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) fn(t, i);
    });
  for (auto& t : ts) t.join();
  return static_cast<double>(chunks * chunk) / (static_cast<double>(MonotonicNs() - t0) / 1e9) /
         1e9;
}

int RunHost(const HostBenchArgs& a) {
  uint64_t bytes = 0, chunk = 0;
  if (!ParseSize(a.bytes, &bytes).ok() || !ParseSize(a.chunk, &chunk).ok() || chunk == 0 ||
      bytes < chunk) {
    fprintf(stderr, "zrtier bench host: --bytes and --chunk must be sizes, bytes >= chunk\n");
    return 2;
  }
  const size_t chunks = bytes / chunk;
  bytes = chunks * chunk;
  std::vector<int> threads = a.threads;
  if (threads.empty()) {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    for (int t = 1; t < n; t *= 2) threads.push_back(t);
    threads.push_back(n);
  }
  // Source and destination are touched first (page faults are not what is measured).
  std::vector<char> src(bytes), dst(bytes);
  FillSample(SampleKind::kBf16Gaussian, 1, src.data(), bytes);
  memset(dst.data(), 1, bytes);
  Codec codec(CodecConfig{});
  const size_t cap = Codec::MaxEncodedSize(chunk);
  std::vector<char> enc(chunks * cap);
  std::vector<size_t> enc_len(chunks);
  for (size_t i = 0; i < chunks; ++i) {
    Status st = codec.Encode(src.data() + i * chunk, chunk, enc.data() + i * cap, cap, &enc_len[i]);
    if (!st.ok()) {
      fprintf(stderr, "zrtier bench host: encode: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  // The engine copy: one region holding the data, every chunk stored (compressed).
  std::unique_ptr<Engine> engine;
  RegionInfo region{};
  {
    Options opts;
    opts.Set(Opt::kChunk, std::to_string(chunk));  // the engine's chunks are the ones measured
    opts.Set(Opt::kResidentLimit, "0");
    opts.Set(Opt::kStoreLimit, "0");
    Status st = Engine::Create(opts, Os::Default(), nullptr, &engine);
    if (st.ok()) st = engine->Allocate(bytes, &region);
    if (st.ok()) st = engine->Write(region.base, src.data(), bytes);
    if (st.ok()) st = engine->EvictTo(0);
    if (!st.ok()) {
      fprintf(stderr, "zrtier bench host: no engine column: %s\n", st.ToString().c_str());
      engine.reset();
    }
  }
  Report report({"threads", "memcpy_gbps", "stream_copy_gbps", "decode_gbps",
                 "decode_gbps_per_thread", "decode_stream_gbps", "engine_read_gbps"});
  std::atomic<bool> bad{false};
  for (int t : threads) {
    double mc = 0, sc = 0, dc = 0, ds = 0;
    for (int rep = 0; rep < 3; ++rep) {  // best of three
      mc = std::max(mc, Parallel(t, chunks, chunk, [&](int, size_t i) {
                      memcpy(dst.data() + i * chunk, src.data() + i * chunk, chunk);
                    }));
      memset(dst.data(), 1, bytes);
      sc = std::max(sc, Parallel(t, chunks, chunk, [&](int, size_t i) {
                      CopyStreaming(dst.data() + i * chunk, src.data() + i * chunk, chunk);
                    }));
      if (memcmp(dst.data(), src.data(), bytes) != 0) {
        fprintf(stderr, "zrtier bench host: streamed bytes differ from the original\n");
        return 1;
      }
      // The codec's decode, with plain stores (dc) and with streaming stores (ds).
      for (bool streaming : {false, true}) {
        memset(dst.data(), 1, bytes);
        double& best = streaming ? ds : dc;
        best = std::max(best, Parallel(t, chunks, chunk, [&](int, size_t i) {
                          if (!codec
                                   .Decode(enc.data() + i * cap, enc_len[i], dst.data() + i * chunk,
                                           chunk, streaming)
                                   .ok())
                            bad = true;
                        }));
        if (bad || memcmp(dst.data(), src.data(), bytes) != 0) {
          fprintf(stderr, "zrtier bench host: decoded bytes differ from the original%s\n",
                  streaming ? " (streaming stores)" : "");
          return 1;
        }
      }
    }
    std::string er = "-";
    if (engine) {
      double best = 0;
      for (int rep = 0; rep < 3; ++rep) {
        best = std::max(best, Parallel(t, chunks, chunk, [&](int, size_t i) {
                          bool zero = false;
                          uint64_t gen = 0;
                          if (!engine
                                   ->ReadChunk(static_cast<char*>(region.base) + i * chunk,
                                               dst.data() + i * chunk, &zero, &gen)
                                   .ok() ||
                              zero)
                            bad = true;
                        }));
      }
      if (bad || memcmp(dst.data(), src.data(), bytes) != 0) {
        fprintf(stderr, "zrtier bench host: engine reads differ from the original\n");
        return 1;
      }
      er = Fixed(best, 2);
    }
    report.AddRow({std::to_string(t), Fixed(mc, 2), Fixed(sc, 2), Fixed(dc, 2), Fixed(dc / t, 2),
                   Fixed(ds, 2), er});
  }
  if (!a.json)
    printf("host ceilings: %s of bf16 in %s chunks, GB/s of chunk bytes (best of 3)\n",
           FormatSize(bytes).c_str(), FormatSize(chunk).c_str());
  report.Print(a.json);
  return 0;
}

void AddHost(CLI::App* bench) {
  auto args = std::make_shared<HostBenchArgs>();
  CLI::App* c = bench->add_subcommand("host",
                                      "memcpy, streaming-copy and chunk-decode GB/s with 1..N "
                                      "threads: the host ceilings of the copy paths");
  c->add_flag("--json", args->json, "one JSON object per row");
  c->add_option("--bytes", args->bytes, "data per pass (default 1G)");
  AddChunkOption(c, &args->chunk);
  c->add_option("--threads", args->threads, "thread counts to run (default 1, 2, 4, ... cores)");
  c->callback([args] { ExitOnFailure(RunHost(*args)); });
}

ZRTIER_BENCH(host, AddHost);

}  // namespace
}  // namespace zrtier::tools
