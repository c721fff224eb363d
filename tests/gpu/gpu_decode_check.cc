// The GPU decode check, for a machine with an NVIDIA GPU (not a ctest: CI has none; built only
// when nvcc was found; scripts/device-check.sh gpu-decode runs it). Encodes sample data on the
// CPU in the GPU chunk format, decodes it on GPU 0 with the embedded kernel through the driver API
// (runtime/gpu/decode_module.h), compares every byte with the original and with the CPU decoder's
// output, then times the kernel alone on 1 GiB of decoded bf16 (256 KiB chunks; CUDA events over
// many launches) and prints its GB/s of output. Then the encode kernel (encode_module.h): sample
// chunks encoded on the GPU, every encoding decoded by the CPU decoder and compared with the
// original, its size against the CPU encoder's, and its speed alone in GB/s of input. Exit status
// 0 only if every byte matched.
//
//   gpu_decode_check [--bytes N] [--launches K]   (N: bytes of output timed per kind, default 1
//   GiB)
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/codec/codec.h"
#include "runtime/codec/gpu_format.h"
#include "runtime/gpu/decode_module.h"
#include "runtime/gpu/encode_module.h"
#include "tools/bench/sample_data.h"

namespace zrtier::gpu {
namespace {

const CudaDriver* d = nullptr;

#define CHECK_CU(call)                                            \
  do {                                                            \
    if (Status s_ = d->Check((call), #call); !s_.ok()) {          \
      fprintf(stderr, "gpu-decode: %s\n", s_.ToString().c_str()); \
      exit(2);                                                    \
    }                                                             \
  } while (0)

size_t Align16(size_t x) {
  return (x + 15) & ~size_t{15};
}

// Runs fn(i) for i in [0, n) on all cores.
template <typename F>
void Parallel(size_t n, F fn) {
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < n;) fn(i);
    });
  for (auto& th : pool) th.join();
}

// A batch of chunks: originals, their encodings packed at 16-byte aligned offsets, the kernel's
// descriptors (src/dst filled in once device buffers exist).
struct Batch {
  std::string name;
  std::vector<std::vector<uint8_t>> chunks;
  std::vector<uint8_t> packed;  // the encodings
  std::vector<size_t> enc_off, enc_len, dst_off;
  size_t dst_bytes = 0;
};

void EncodeBatch(const Codec& codec, Batch* b) {
  const size_t n = b->chunks.size();
  std::vector<std::vector<uint8_t>> enc(n);
  Parallel(n, [&](size_t i) {
    enc[i].resize(Codec::MaxEncodedSize(b->chunks[i].size()));
    size_t len = 0;
    Status s =
        codec.Encode(b->chunks[i].data(), b->chunks[i].size(), enc[i].data(), enc[i].size(), &len);
    if (!s.ok()) fprintf(stderr, "gpu-decode: encode: %s\n", s.ToString().c_str()), exit(2);
    enc[i].resize(len);
  });
  size_t pos = 0;
  b->dst_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    b->enc_off.push_back(pos);
    b->enc_len.push_back(enc[i].size());
    pos = Align16(pos + enc[i].size());
    b->dst_off.push_back(b->dst_bytes);
    b->dst_bytes = Align16(b->dst_bytes + b->chunks[i].size());
  }
  b->packed.assign(std::max<size_t>(pos, 16), 0);
  Parallel(n, [&](size_t i) {
    if (!enc[i].empty()) memcpy(&b->packed[b->enc_off[i]], enc[i].data(), enc[i].size());
  });
}

struct DeviceBatch {
  CUdeviceptr src = 0, dst = 0, descs = 0, status = 0;
  uint32_t count = 0;
  ~DeviceBatch() {
    for (CUdeviceptr p : {src, dst, descs, status})
      if (p) d->cuMemFree(p);
  }
};

void Upload(const Batch& b, DeviceBatch* db) {
  db->count = static_cast<uint32_t>(b.chunks.size());
  CHECK_CU(d->cuMemAlloc(&db->src, b.packed.size()));
  CHECK_CU(d->cuMemAlloc(&db->dst, std::max<size_t>(b.dst_bytes, 16)));
  CHECK_CU(d->cuMemAlloc(&db->descs, sizeof(DecodeChunk) * db->count));
  CHECK_CU(d->cuMemAlloc(&db->status, 4 * db->count));
  CHECK_CU(d->cuMemcpyHtoD(db->src, b.packed.data(), b.packed.size()));
  CHECK_CU(d->cuMemsetD8(db->dst, 0xa5, std::max<size_t>(b.dst_bytes, 16)));
  std::vector<DecodeChunk> descs(db->count);
  for (uint32_t i = 0; i < db->count; ++i)
    descs[i] = {db->src + b.enc_off[i], db->dst + b.dst_off[i], static_cast<uint32_t>(b.enc_len[i]),
                static_cast<uint32_t>(b.chunks[i].size()), 0};
  CHECK_CU(d->cuMemcpyHtoD(db->descs, descs.data(), sizeof(DecodeChunk) * db->count));
}

// Compares the device's output with the originals and with the CPU decoder; returns mismatches.
size_t Verify(const Codec& codec, const Batch& b, const DeviceBatch& db,
              uint32_t expect_status = 0) {
  std::vector<uint8_t> out(std::max<size_t>(b.dst_bytes, 16));
  std::vector<uint32_t> status(db.count);
  CHECK_CU(d->cuMemcpyDtoH(out.data(), db.dst, out.size()));
  CHECK_CU(d->cuMemcpyDtoH(status.data(), db.status, 4 * db.count));
  std::atomic<size_t> bad{0};
  Parallel(db.count, [&](size_t i) {
    const std::vector<uint8_t>& orig = b.chunks[i];
    if (status[i] != expect_status) {
      if (bad++ < 5)
        fprintf(stderr, "gpu-decode: %s chunk %zu: status %u, expected %u\n", b.name.c_str(), i,
                status[i], expect_status);
      return;
    }
    if (expect_status != 0) return;
    std::vector<uint8_t> cpu(orig.size());
    Status s = codec.Decode(&b.packed[b.enc_off[i]], b.enc_len[i], cpu.data(), cpu.size());
    const uint8_t* gpu = &out[b.dst_off[i]];
    if (!s.ok() || memcmp(gpu, orig.data(), orig.size()) != 0 ||
        memcmp(gpu, cpu.data(), cpu.size()) != 0) {
      size_t at = 0;
      while (at < orig.size() && gpu[at] == orig[at]) ++at;
      if (bad++ < 5)
        fprintf(stderr,
                "gpu-decode: %s chunk %zu (%zu bytes): GPU output differs at byte %zu (cpu decode "
                "%s)\n",
                b.name.c_str(), i, orig.size(), at, s.ToString().c_str());
    }
  });
  return bad;
}

Batch Samples(const std::string& name, SampleKind kind, size_t chunk, size_t count, uint64_t seed) {
  Batch b;
  b.name = name;
  b.chunks.resize(count);
  Parallel(count, [&](size_t i) {
    b.chunks[i].resize(chunk);
    FillSample(kind, seed + i, b.chunks[i].data(), chunk);
  });
  return b;
}

// The batch's chunks encoded on the GPU (`launches` times, timed with events into *ms): the
// encodings and their lengths (out_len).
void EncodeOnGpu(const EncodeModule& mod, const Batch& b, int launches,
                 std::vector<std::vector<uint8_t>>* enc, std::vector<uint32_t>* lens, float* ms) {
  const uint32_t count = static_cast<uint32_t>(b.chunks.size());
  std::vector<size_t> src_off, dst_off;
  size_t src_bytes = 0, dst_bytes = 0;
  for (const auto& c : b.chunks) {
    src_off.push_back(src_bytes);
    dst_off.push_back(dst_bytes);
    src_bytes = Align16(src_bytes + c.size());
    dst_bytes = Align16(dst_bytes + gpufmt::MaxEncodedSize(c.size()));
  }
  CUdeviceptr src, dst, descs, out_len;
  CHECK_CU(d->cuMemAlloc(&src, src_bytes));
  CHECK_CU(d->cuMemAlloc(&dst, dst_bytes));
  CHECK_CU(d->cuMemAlloc(&descs, sizeof(EncodeChunk) * count));
  CHECK_CU(d->cuMemAlloc(&out_len, 4 * count));
  std::vector<EncodeChunk> dv(count);
  for (uint32_t i = 0; i < count; ++i) {
    CHECK_CU(d->cuMemcpyHtoD(src + src_off[i], b.chunks[i].data(), b.chunks[i].size()));
    dv[i] = {src + src_off[i], dst + dst_off[i], static_cast<uint32_t>(b.chunks[i].size()), 0, 0};
  }
  CHECK_CU(d->cuMemcpyHtoD(descs, dv.data(), sizeof(EncodeChunk) * count));
  CUevent start, stop;
  CHECK_CU(d->cuEventCreate(&start, CU_EVENT_DEFAULT));
  CHECK_CU(d->cuEventCreate(&stop, CU_EVENT_DEFAULT));
  if (Status s = mod.Launch(descs, count, out_len, nullptr); !s.ok())  // warm-up
    fprintf(stderr, "gpu-encode: %s\n", s.ToString().c_str()), exit(2);
  CHECK_CU(d->cuEventRecord(start, nullptr));
  for (int l = 0; l < launches; ++l) (void)mod.Launch(descs, count, out_len, nullptr);
  CHECK_CU(d->cuEventRecord(stop, nullptr));
  CHECK_CU(d->cuEventSynchronize(stop));
  CHECK_CU(d->cuEventElapsedTime(ms, start, stop));
  lens->assign(count, 0);
  CHECK_CU(d->cuMemcpyDtoH(lens->data(), out_len, 4 * count));
  enc->assign(count, {});
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t n = (*lens)[i];
    if (n == 0 || n == kEncodeRefused || n > gpufmt::MaxEncodedSize(b.chunks[i].size())) continue;
    (*enc)[i].resize(n);
    CHECK_CU(d->cuMemcpyDtoH((*enc)[i].data(), dst + dst_off[i], n));
  }
  d->cuEventDestroy(start);
  d->cuEventDestroy(stop);
  for (CUdeviceptr p : {src, dst, descs, out_len}) d->cuMemFree(p);
}

// Checks the GPU's encodings of `b`: each decodes (CPU decoder) to its original, an all-zero
// chunk is the empty encoding. Returns the mismatches; *bytes: the encodings' total.
size_t VerifyEncoded(const Codec& codec, const Batch& b,
                     const std::vector<std::vector<uint8_t>>& enc,
                     const std::vector<uint32_t>& lens, size_t* bytes) {
  std::atomic<size_t> bad{0}, total{0};
  Parallel(b.chunks.size(), [&](size_t i) {
    const std::vector<uint8_t>& orig = b.chunks[i];
    const bool zero = std::all_of(orig.begin(), orig.end(), [](uint8_t v) { return v == 0; });
    total += lens[i] == kEncodeRefused ? 0 : lens[i];
    std::vector<uint8_t> out(orig.size(), 0x5a);
    Status s = Status::Ok();
    bool ok;
    if (lens[i] == 0) {
      ok = zero;
    } else if (lens[i] == kEncodeRefused || enc[i].empty()) {
      ok = false;
    } else {
      s = codec.Decode(enc[i].data(), enc[i].size(), out.data(), out.size());
      ok = s.ok() && memcmp(out.data(), orig.data(), orig.size()) == 0;
    }
    if (!ok && bad++ < 5)
      fprintf(stderr, "gpu-encode: %s chunk %zu (%zu bytes): out_len %u, decode %s\n",
              b.name.c_str(), i, orig.size(), lens[i], s.ToString().c_str());
  });
  *bytes = total;
  return bad;
}

int Run(size_t timed_bytes, int launches) {
  if (Status s = CudaDriver::Load(&d); !s.ok())
    return fprintf(stderr, "gpu-decode: %s\n", s.ToString().c_str()), 2;
  CHECK_CU(d->cuInit(0));
  CUdevice dev;
  CHECK_CU(d->cuDeviceGet(&dev, 0));
  char name[256] = {};
  CHECK_CU(d->cuDeviceGetName(name, sizeof(name), dev));
  CUcontext ctx;
  CHECK_CU(d->cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK_CU(d->cuCtxSetCurrent(ctx));
  std::unique_ptr<DecodeModule> mod;
  if (Status s = DecodeModule::Load(&mod); !s.ok())
    return fprintf(stderr, "gpu-decode: %s\n", s.ToString().c_str()), 2;
  printf("gpu-decode: %s, kernel loaded\n", name);

  const Codec gpu_codec({CodecKind::kGpu, 1, false});
  size_t failures = 0;
  // 1. Correctness: every kind and odd sizes, bit for bit against the original and the CPU decoder.
  struct Kind {
    const char* name;
    SampleKind kind;
  };
  const Kind kinds[] = {{"bf16", SampleKind::kBf16Gaussian},  {"fp16", SampleKind::kFp16Gaussian},
                        {"fp32", SampleKind::kFp32Gaussian},  {"random", SampleKind::kRandom},
                        {"relu_bf16", SampleKind::kBf16Relu}, {"text", SampleKind::kText},
                        {"zero", SampleKind::kZero}};
  const size_t sizes[] = {256 << 10, (256 << 10) - 3, 64 << 10, 4097, 1000, 33, 1};
  for (const Kind& k : kinds) {
    for (size_t len : sizes) {
      Batch b = Samples(k.name, k.kind, len, len > 4096 ? 64 : 8, len);
      if (len == 33) b.chunks[0].assign(len, 0x3c);  // one byte repeated
      EncodeBatch(gpu_codec, &b);
      DeviceBatch db;
      Upload(b, &db);
      if (Status s = mod->Launch(db.descs, db.count, db.status, nullptr); !s.ok())
        return fprintf(stderr, "gpu-decode: %s\n", s.ToString().c_str()), 2;
      CHECK_CU(d->cuCtxSynchronize());
      size_t bad = Verify(gpu_codec, b, db);
      failures += bad;
      printf("gpu-decode check %-9s %7zu-byte chunks x %zu: %s\n", k.name, len, b.chunks.size(),
             bad ? "MISMATCH" : "bit-identical");
    }
  }
  {
    // A chunk of another format (zstd) is refused with its status, not decoded.
    Batch b = Samples("auto-format", SampleKind::kText, 4096, 4, 1);
    EncodeBatch(Codec({}), &b);
    DeviceBatch db;
    Upload(b, &db);
    if (Status s = mod->Launch(db.descs, db.count, db.status, nullptr); !s.ok())
      return fprintf(stderr, "gpu-decode: %s\n", s.ToString().c_str()), 2;
    CHECK_CU(d->cuCtxSynchronize());
    size_t bad = Verify(gpu_codec, b, db, kDecodeNotGpuFormat);
    failures += bad;
    printf("gpu-decode check zstd-format chunks refused: %s\n", bad ? "NO" : "yes");
  }

  // 2. Speed of the kernel alone: output bytes / kernel time, 256 KiB chunks.
  const size_t chunk = 256 << 10;
  for (const Kind& k : {kinds[0], kinds[1], kinds[3]}) {
    Batch b = Samples(k.name, k.kind, chunk, std::max<size_t>(1, timed_bytes / chunk), 1000);
    EncodeBatch(gpu_codec, &b);
    DeviceBatch db;
    Upload(b, &db);
    CUevent start, stop;
    CHECK_CU(d->cuEventCreate(&start, CU_EVENT_DEFAULT));
    CHECK_CU(d->cuEventCreate(&stop, CU_EVENT_DEFAULT));
    for (int w = 0; w < 2; ++w)
      if (Status s = mod->Launch(db.descs, db.count, db.status, nullptr); !s.ok())
        return fprintf(stderr, "gpu-decode: %s\n", s.ToString().c_str()), 2;
    CHECK_CU(d->cuEventRecord(start, nullptr));
    for (int l = 0; l < launches; ++l) (void)mod->Launch(db.descs, db.count, db.status, nullptr);
    CHECK_CU(d->cuEventRecord(stop, nullptr));
    CHECK_CU(d->cuEventSynchronize(stop));
    float ms = 0;
    CHECK_CU(d->cuEventElapsedTime(&ms, start, stop));
    size_t bad = Verify(gpu_codec, b, db);
    failures += bad;
    const double out_bytes = double(b.chunks.size()) * chunk;
    size_t in_bytes = 0;
    for (size_t l : b.enc_len) in_bytes += l;
    printf(
        "gpu-decode kernel %s: %.0f MiB out, ratio %.3f, %d launches, %.3f ms each, %.1f GB/s %s\n",
        k.name, out_bytes / (1 << 20), out_bytes / double(in_bytes), launches, ms / launches,
        out_bytes * launches / (ms * 1e-3) / 1e9, bad ? "MISMATCH" : "bit-identical");
    d->cuEventDestroy(start);
    d->cuEventDestroy(stop);
  }
  // 3. The encode kernel: every kind, its encodings decoded by the CPU decoder, sizes against the
  // CPU encoder; then its speed alone (GB/s of input), 256 KiB chunks.
  std::unique_ptr<EncodeModule> enc_mod;
  if (Status s = EncodeModule::Load(&enc_mod); !s.ok())
    return fprintf(stderr, "gpu-encode: %s\n", s.ToString().c_str()), 2;
  for (const Kind& k : kinds) {
    for (size_t len : {size_t{256} << 10, size_t{64} << 10, size_t{4096} + 16, size_t{16}}) {
      Batch b = Samples(k.name, k.kind, len, len > 4096 ? 64 : 8, len + 7);
      std::vector<std::vector<uint8_t>> enc;
      std::vector<uint32_t> lens;
      float ms = 0;
      EncodeOnGpu(*enc_mod, b, 1, &enc, &lens, &ms);
      size_t gpu_bytes = 0;
      const size_t bad = VerifyEncoded(gpu_codec, b, enc, lens, &gpu_bytes);
      failures += bad;
      EncodeBatch(gpu_codec, &b);
      size_t cpu_bytes = 0;
      for (size_t l : b.enc_len) cpu_bytes += l;
      printf("gpu-encode check %-9s %7zu-byte chunks x %zu: %s, %zu bytes (CPU encoder %zu)\n",
             k.name, len, b.chunks.size(), bad ? "MISMATCH" : "decodes bit-identical", gpu_bytes,
             cpu_bytes);
    }
  }
  for (const Kind& k : {kinds[0], kinds[2], kinds[3]}) {
    Batch b = Samples(k.name, k.kind, chunk, std::max<size_t>(1, timed_bytes / chunk), 2000);
    std::vector<std::vector<uint8_t>> enc;
    std::vector<uint32_t> lens;
    float ms = 0;
    EncodeOnGpu(*enc_mod, b, launches, &enc, &lens, &ms);
    size_t gpu_bytes = 0;
    const size_t bad = VerifyEncoded(gpu_codec, b, enc, lens, &gpu_bytes);
    failures += bad;
    const double in_bytes = double(b.chunks.size()) * chunk;
    printf(
        "gpu-encode kernel %s: %.0f MiB in, ratio %.3f, %d launches, %.3f ms each, %.1f GB/s %s\n",
        k.name, in_bytes / (1 << 20), in_bytes / double(std::max<size_t>(gpu_bytes, 1)), launches,
        ms / launches, in_bytes * launches / (ms * 1e-3) / 1e9,
        bad ? "MISMATCH" : "decodes bit-identical");
  }
  // The encode kernel's time per launch against the chunks in it (a device-to-host copy launches
  // it per piece): bf16, 256 KiB chunks, launches of at most the timed bytes.
  for (size_t n : {size_t{16}, size_t{64}, size_t{128}, size_t{256}, size_t{512}}) {
    if (n > 16 && n * chunk > timed_bytes) break;
    Batch b = Samples("bf16", kinds[0].kind, chunk, n, 3000 + n);
    std::vector<std::vector<uint8_t>> enc;
    std::vector<uint32_t> lens;
    float ms = 0;
    const int reps = launches;
    EncodeOnGpu(*enc_mod, b, reps, &enc, &lens, &ms);
    size_t gpu_bytes = 0;
    const size_t bad = VerifyEncoded(gpu_codec, b, enc, lens, &gpu_bytes);
    failures += bad;
    const double in_bytes = double(n) * chunk;
    printf("gpu-encode launch bf16 %4zu chunks (%3.0f MiB): %.3f ms a launch, %.1f GB/s %s\n", n,
           in_bytes / (1 << 20), ms / reps, in_bytes * reps / (ms * 1e-3) / 1e9,
           bad ? "MISMATCH" : "decodes bit-identical");
  }
  printf("gpu-decode: %s\n", failures ? "FAILED (mismatches above)" : "all bytes identical");
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace zrtier::gpu

int main(int argc, char** argv) {
  size_t bytes = size_t{1} << 30;
  int launches = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--bytes"))
      bytes = strtoull(argv[i + 1], nullptr, 0);
    else if (!strcmp(argv[i], "--launches"))
      launches = atoi(argv[i + 1]);
    else
      return fprintf(stderr, "usage: %s [--bytes N] [--launches K]\n", argv[0]), 2;
  }
  return zrtier::gpu::Run(bytes, std::max(1, launches));
}
