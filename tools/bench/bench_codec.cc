// `zrtier bench codec`: compression ratio and single-thread encode/decode speed of the chunk codec
// (zrtier = kAuto) against plain zstd at levels 1 and 3, on every sample kind or on the tensors of
// a model's safetensors files ("how much would zrtier save on my model?"). The ratio covers every
// byte measured; each speed is the median of full passes over those chunks, min and max beside.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime/codec/codec.h"
#include "tools/bench/bench.h"
#include "tools/bench/chunk_sample.h"
#include "tools/bench/safetensors.h"
#include "tools/bench/sample_data.h"
#include "zrtier/options.h"

namespace zrtier::tools {
namespace {

struct CodecBenchArgs {
  std::vector<std::string> files;  // FILE or DIR arguments: one model
  bool json = false;
  std::string chunk = InfoOf(Opt::kChunk).default_text;  // ZRTIER_CHUNK's default
  std::string bytes = "8M";
  std::string max_bytes = "256M";
  double seconds = 0.5;
  std::string dtype;
  int level = 1;
  bool verify = false;
  std::vector<std::string> data;  // sample kinds to run; empty = all
};

// MB/s (of original bytes) over timed passes.
struct Speed {
  double median = 0, min = 0, max = 0;
  int passes = 0;
};

struct Result {
  double ratio = 0;  // +inf when everything encoded to nothing
  Speed encode, decode;
  uint64_t bytes = 0;
};

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

constexpr int kMinPasses = 3;

// Encodes and decodes `chunks` with `codec` on this thread: one checked pass for the ratio (every
// decoded byte compared), then timed passes, each over every chunk once in data order, repeated
// until `seconds / 2` is spent on each of encode and decode (at least kMinPasses each). Fails if a
// round trip does not give the original bytes back.
Status Measure(const Codec& codec, const std::vector<Chunk>& chunks, double seconds, Result* r) {
  size_t max_len = 0;
  uint64_t total = 0;
  for (const Chunk& c : chunks) max_len = std::max(max_len, c.len), total += c.len;
  const size_t slot = Codec::MaxEncodedSize(max_len);
  std::vector<uint8_t> enc(slot * chunks.size());
  std::vector<size_t> enc_len(chunks.size());
  std::vector<uint8_t> out(max_len);
  uint64_t encoded = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    ZRTIER_RETURN_IF_ERROR(
        codec.Encode(chunks[i].p, chunks[i].len, &enc[i * slot], slot, &enc_len[i]));
    encoded += enc_len[i];
    ZRTIER_RETURN_IF_ERROR(codec.Decode(&enc[i * slot], enc_len[i], out.data(), chunks[i].len));
    if (memcmp(out.data(), chunks[i].p, chunks[i].len) != 0)
      return Status::Error(EIO, "bench codec: round trip changed chunk " + std::to_string(i));
  }
  r->bytes = total;
  r->ratio = encoded ? double(total) / double(encoded) : INFINITY;

  // A pass over all the chunks measured, not the fastest part of one: the speed of the whole data,
  // with the spread of the passes beside it.
  using Clock = std::chrono::steady_clock;
  auto timed = [&](bool encode, double budget, Speed* speed) -> Status {
    std::vector<double> mbps;
    const auto start = Clock::now();
    while (mbps.size() < kMinPasses || Seconds(start, Clock::now()) < budget) {
      const auto t0 = Clock::now();
      for (size_t i = 0; i < chunks.size(); ++i) {
        if (encode)
          ZRTIER_RETURN_IF_ERROR(
              codec.Encode(chunks[i].p, chunks[i].len, &enc[i * slot], slot, &enc_len[i]));
        else
          ZRTIER_RETURN_IF_ERROR(
              codec.Decode(&enc[i * slot], enc_len[i], out.data(), chunks[i].len));
      }
      const double t = Seconds(t0, Clock::now());
      mbps.push_back(t > 0 ? double(total) / t / 1e6 : INFINITY);
    }
    std::sort(mbps.begin(), mbps.end());
    const size_t n = mbps.size();
    speed->median = n % 2 ? mbps[n / 2] : (mbps[n / 2 - 1] + mbps[n / 2]) / 2;
    speed->min = mbps.front();
    speed->max = mbps.back();
    speed->passes = static_cast<int>(n);
    return Status::Ok();
  };
  ZRTIER_RETURN_IF_ERROR(timed(true, seconds / 2, &r->encode));
  ZRTIER_RETURN_IF_ERROR(timed(false, seconds / 2, &r->decode));
  return Status::Ok();
}

struct NamedCodec {
  std::string name;
  CodecConfig config;
};

std::vector<NamedCodec> Codecs(const CodecBenchArgs& a) {
  return {{"zrtier", {CodecKind::kAuto, a.level, a.verify}},
          {"gpu", {CodecKind::kGpu, a.level, a.verify}},
          {"zstd-1", {CodecKind::kZstd, 1, false}},
          {"zstd-3", {CodecKind::kZstd, 3, false}}};
}

// What a FILE-mode row measured out of its dtype's tensors.
struct Coverage {
  size_t tensors = 0, tensors_read = 0;
  uint64_t bytes_total = 0;
};

class Output {
 public:
  explicit Output(bool json, bool file_mode) : json_(json), file_mode_(file_mode) {
    std::vector<std::string> cols = {"data", "codec", "ratio", "encode MB/s/core (min-max)",
                                     "decode MB/s/core (min-max)"};
    if (file_mode) cols.insert(cols.end(), {"tensors read", "MiB read"});
    table_ = std::make_unique<Report>(cols);
  }
  void Add(const std::string& data, const std::string& codec, const Result& r,
           const Coverage& cov) {
    if (json_) {
      // JSON has no infinity: an all-zero data set's ratio is written as null.
      std::string ratio = std::isinf(r.ratio) ? "null" : Fixed(r.ratio, 4);
      printf("{\"data\": \"%s\", \"codec\": \"%s\", \"ratio\": %s", data.c_str(), codec.c_str(),
             ratio.c_str());
      PrintSpeed("encode", r.encode);
      PrintSpeed("decode", r.decode);
      printf(", \"bytes\": %llu", static_cast<unsigned long long>(r.bytes));
      if (file_mode_)
        printf(", \"bytes_total\": %llu, \"tensors\": %zu, \"tensors_read\": %zu",
               static_cast<unsigned long long>(cov.bytes_total), cov.tensors, cov.tensors_read);
      printf("}\n");
      fflush(stdout);
      return;
    }
    std::vector<std::string> row = {data, codec, std::isinf(r.ratio) ? "inf" : Fixed(r.ratio, 3),
                                    SpeedCell(r.encode), SpeedCell(r.decode)};
    if (file_mode_) {
      row.push_back(std::to_string(cov.tensors_read) + " of " + std::to_string(cov.tensors));
      row.push_back(Fixed(double(r.bytes) / (1 << 20), 1) + " of " +
                    Fixed(double(cov.bytes_total) / (1 << 20), 1));
    }
    table_->AddRow(row);
  }
  void Finish() {
    if (!json_) table_->Print(false);
  }

 private:
  // "<dir>_mbps_per_core" is the median pass; min, max and the number of passes beside it.
  static void PrintSpeed(const char* dir, const Speed& s) {
    printf(
        ", \"%s_mbps_per_core\": %.1f, \"%s_mbps_per_core_min\": %.1f, "
        "\"%s_mbps_per_core_max\": %.1f, \"%s_passes\": %d",
        dir, s.median, dir, s.min, dir, s.max, dir, s.passes);
  }
  static std::string SpeedCell(const Speed& s) {
    return Fixed(s.median, 0) + " (" + Fixed(s.min, 0) + "-" + Fixed(s.max, 0) + ")";
  }

  bool json_, file_mode_;
  std::unique_ptr<Report> table_;
};

int Fail(const Status& s) {
  return BenchFailure("codec", s);
}

int RunSamples(const CodecBenchArgs& a, size_t chunk) {
  uint64_t bytes;
  if (Status s = ParseSize(a.bytes, &bytes); !s.ok()) return Fail(s);
  size_t count = std::max<uint64_t>(1, bytes / chunk);
  std::vector<uint8_t> data(count * chunk);
  Output out(a.json, false);
  std::vector<SampleKind> kinds;
  for (const std::string& name : a.data) {
    SampleKind k;
    if (!ParseSampleKind(name, &k))
      return Fail(Status::Error(EINVAL, "unknown --data '" + name +
                                            "' (random, zero, bf16, fp16, fp32, relu_bf16, text)"));
    kinds.push_back(k);
  }
  if (kinds.empty()) kinds = AllSampleKinds();
  for (SampleKind kind : kinds) {
    for (size_t i = 0; i < count; ++i) FillSample(kind, i + 1, &data[i * chunk], chunk);
    std::vector<Chunk> chunks = SampleChunks({{data.data(), data.size()}}, chunk, data.size());
    for (const NamedCodec& c : Codecs(a)) {
      Result r;
      if (Status s = Measure(Codec(c.config), chunks, a.seconds, &r); !s.ok()) return Fail(s);
      out.Add(SampleKindName(kind), c.name, r, {});
    }
  }
  out.Finish();
  return 0;
}

int RunFile(const CodecBenchArgs& a, size_t chunk) {
  uint64_t max_bytes;
  if (Status s = ParseSize(a.max_bytes, &max_bytes); !s.ok()) return Fail(s);
  const bool raw = !a.dtype.empty();
  if (raw && a.dtype != "bf16" && a.dtype != "fp16" && a.dtype != "fp32" && a.dtype != "raw")
    return Fail(Status::Error(EINVAL, "--dtype must be bf16, fp16, fp32 or raw"));
  std::vector<std::string> paths;
  if (Status s = ListSafetensorsFiles(a.files, !raw, &paths); !s.ok()) return Fail(s);
  // The files stay mapped while their chunks are measured; each dtype's tensors are one stream in
  // file order, then header order, and are sampled as one.
  std::vector<std::unique_ptr<MappedFile>> files;
  std::vector<std::string> order;  // dtypes in first-seen order
  std::map<std::string, std::vector<Span>> groups;
  for (const std::string& path : paths) {
    files.push_back(std::make_unique<MappedFile>());
    MappedFile& file = *files.back();
    if (Status s = file.Open(path); !s.ok()) return Fail(s);
    if (raw) {
      if (groups[a.dtype].empty()) order.push_back(a.dtype);
      groups[a.dtype].push_back({file.data(), file.size()});
      continue;
    }
    std::vector<SafetensorsTensor> tensors;
    if (Status s = ParseSafetensors(file.data(), file.size(), &tensors); !s.ok())
      return Fail(Status::Error(
          s.code(), path + ": " + s.message() + " (for a file of raw tensor bytes use --dtype)"));
    for (const SafetensorsTensor& t : tensors) {
      if (t.begin == t.end) continue;
      if (!groups.count(t.dtype)) order.push_back(t.dtype);
      groups[t.dtype].push_back({file.data() + t.begin, t.end - t.begin});
    }
  }
  if (order.empty()) return Fail(Status::Error(EINVAL, "no tensor data in the files given"));
  Output out(a.json, true);
  for (const std::string& dtype : order) {
    const std::vector<Span>& spans = groups[dtype];
    std::vector<Chunk> chunks = SampleChunks(spans, chunk, max_bytes);
    Coverage cov;
    cov.tensors = spans.size();
    for (const Span& s : spans) cov.bytes_total += s.len;
    std::set<size_t> read;
    for (const Chunk& c : chunks) read.insert(c.span);
    cov.tensors_read = read.size();
    for (const NamedCodec& c : Codecs(a)) {
      Result r;
      if (Status s = Measure(Codec(c.config), chunks, a.seconds, &r); !s.ok()) return Fail(s);
      out.Add(dtype, c.name, r, cov);
    }
  }
  out.Finish();
  return 0;
}

// Runs the bench on the FILEs, or on sample data when there are none; returns the exit status (2
// for a bad --chunk).
int Run(const CodecBenchArgs& a) {
  uint64_t chunk = 0;
  Status s = ParseSize(a.chunk, &chunk);
  if (!s.ok() || chunk == 0 || chunk > (1u << 30)) {
    fprintf(stderr, "zrtier bench codec: bad --chunk '%s'\n", a.chunk.c_str());
    return 2;
  }
  return a.files.empty() ? RunSamples(a, chunk) : RunFile(a, chunk);
}

void AddCodecBench(CLI::App* bench) {
  auto args = std::make_shared<CodecBenchArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "codec",
      "chunk codec ratio and single-thread MB/s (of original bytes): zrtier vs plain zstd -1/-3, "
      "on sample data or on the tensors of a model: safetensors FILEs, or a DIR of them. Speeds: "
      "median of full passes (min-max). JSON ratio is null for data that encodes to nothing (all "
      "zero).");
  cmd->add_option("file", args->files,
                  "safetensors files or directories (all *.safetensors in each), one model; with "
                  "--dtype, files of raw bytes");
  cmd->add_flag("--json", args->json, "one JSON object per (data, codec) per line");
  AddChunkOption(cmd, &args->chunk);
  cmd->add_option("--seconds", args->seconds,
                  "timing budget per (data, codec): passes repeat until it is spent, at least 3 "
                  "encode and 3 decode (default 0.5)");
  cmd->add_option("--bytes", args->bytes, "sample data per kind (default 8M)");
  cmd->add_option("--max-bytes", args->max_bytes,
                  "FILE: bytes measured per dtype, chunks spread evenly over all its bytes; all of "
                  "them when there are no more (default 256M)");
  cmd->add_option("--dtype", args->dtype, "FILE is raw bytes of this type: bf16|fp16|fp32|raw");
  cmd->add_option("--data", args->data, "sample kinds to run (default all)")->delimiter(',');
  cmd->add_option("--level", args->level, "zstd level of the zrtier codec (default 1)");
  cmd->add_flag("--verify", args->verify, "zrtier codec with CRC32C checksums");
  cmd->callback([args] { ExitOnFailure(Run(*args)); });
}

}  // namespace

ZRTIER_BENCH(codec, AddCodecBench);

}  // namespace zrtier::tools
