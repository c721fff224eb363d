// offload_train_bench: the weight-streaming trainer of scripts/examples/weight_streaming.py over
// the fake CUDA runtime, so that what zrtier's tiers do under a memory budget can be seen without a
// GPU. Like preload_test it knows nothing of zrtier (it links only the fake libcudart) and is run
// with LD_PRELOAD=libzrtier.so and the options under study (ZRTIER_MEMORY, ...).
//
// Host state per layer, each in its own cudaHostAlloc'd buffer rounded up to a power of two as
// PyTorch's host allocator does: an fp32 master, a bf16 compute copy, an fp32 gradient. A step:
// forward, the bf16 copies H2D in layer order; backward, in reverse order, each layer's bf16 copy
// H2D and then its gradient D2H (new values every step); then AdamW on the CPU over every layer
// (reads master and gradient, writes the master; its moments in plain memory), and each layer's
// bf16 copy refreshed from its master. Prints each step's milliseconds and, at the end, a digest
// of the masters (compare runs with and without zrtier: equal digests, equal bytes).
// Mode `activations` is save_on_cpu's pattern instead (scripts/examples/save_on_cpu_train.py): per
// layer 4 saved bf16 activations of `params per layer` elements each, D2H in the forward into
// pinned buffers allocated in the first step and reused (PyTorch's caching host allocator), H2D
// back in the backward in reverse order; the digest covers what came back. Mode `filled`: the same,
// with each buffer first filled with NaN by two CPU threads before its D2H, as PyTorch does for
// every torch.empty (pinned ones too) under torch.use_deterministic_algorithms(True) (its
// fill_uninitialized_memory), which scripts/examples/train.py runs with. Mode `inference`
// (scripts/examples/infer.py's pattern): the same buffers written once by D2H, then every step
// copied H2D in order.
// Usage: FAKE_CUDA_COPY_US=0 offload_train_bench [layers=6] [params per layer, M=6.5] [steps=4]
//        [weights|activations|filled|inference]
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

uint64_t Next(uint64_t* s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Normal(0, sigma) samples (Box-Muller), deterministic in `seed`.
void Normal(float* out, size_t n, float sigma, uint64_t seed) {
  for (size_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(Next(&seed) >> 11) + 1) * 0x1p-53;
    const double u2 = static_cast<double>(Next(&seed) >> 11) * 0x1p-53;
    const double r = std::sqrt(-2 * std::log(u1)) * sigma;
    out[i] = static_cast<float>(r * std::cos(2 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(2 * M_PI * u2));
  }
}

uint16_t ToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

size_t Pow2(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

void* Pinned(size_t n) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, Pow2(n), cudaHostAllocDefault) != cudaSuccess) {
    fprintf(stderr, "cudaHostAlloc(%zu) failed\n", Pow2(n));
    exit(1);
  }
  return p;
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    exit(1);
  }
}

// The NaN fill of an uninitialized tensor under PyTorch's deterministic mode: its halves written by
// two threads (PyTorch's intra-op pool splits it the same way, over more threads).
void FillNan(uint16_t* p, size_t n) {
  auto fill = [](uint16_t* q, size_t k) {
    for (size_t i = 0; i < k; ++i) q[i] = 0x7fc0;  // bf16 quiet NaN
  };
  std::thread other(fill, p + n / 2, n - n / 2);
  fill(p, n / 2);
  other.join();
}

// save_on_cpu's pattern, or with `once` infer.py's, or with `nan_fill` train.py's (see the file
// comment).
int Activations(int layers, size_t n, int steps, bool once, bool nan_fill) {
  constexpr int kPerLayer = 4;
  const int count = layers * kPerLayer;
  std::vector<uint16_t*> host(count);
  std::vector<float> f(n + 65536);
  Normal(f.data(), f.size(), 1.0f, 77);
  std::vector<uint16_t> src(f.size());
  for (size_t i = 0; i < f.size(); ++i) src[i] = ToBf16(f[i]);
  void *act, *back;
  Check(cudaMalloc(&act, n * 2), "cudaMalloc");
  Check(cudaMalloc(&back, n * 2), "cudaMalloc");
  cudaStream_t st;
  Check(cudaStreamCreate(&st), "cudaStreamCreate");
  uint64_t digest = 1469598103934665603ull;
  std::vector<uint16_t> got(n);
  for (int s = 1; s <= steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int a = 0; a < count && (s == 1 || !once); ++a) {
      if (s == 1) host[a] = static_cast<uint16_t*>(Pinned(n * 2));
      const size_t off = (static_cast<size_t>(s) * 7919 + static_cast<size_t>(a) * 131) % 65536;
      Check(cudaMemcpy(act, src.data() + off, n * 2, cudaMemcpyHostToDevice), "act");
      if (nan_fill) FillNan(host[a], n);
      Check(cudaMemcpyAsync(host[a], act, n * 2, cudaMemcpyDeviceToHost, st), "d2h");
      Check(cudaStreamSynchronize(st), "sync");
    }
    for (int k = 0; k < count; ++k) {
      const int a = once ? k : count - 1 - k;
      Check(cudaMemcpyAsync(back, host[a], n * 2, cudaMemcpyHostToDevice, st), "h2d");
      Check(cudaStreamSynchronize(st), "sync");
      if (a % 7 == 0) {  // a sample of what came back enters the digest
        Check(cudaMemcpy(got.data(), back, n * 2, cudaMemcpyDeviceToHost), "check");
        const unsigned char* p = reinterpret_cast<const unsigned char*>(got.data());
        for (size_t i = 0; i < n * 2; i += 61) digest = (digest ^ p[i]) * 1099511628211ull;
      }
    }
    printf(
        "step %d: %.0f ms\n", s,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    fflush(stdout);
  }
  printf("digest %016llx, pinned %.2f GiB\n", static_cast<unsigned long long>(digest),
         count * static_cast<double>(Pow2(n * 2)) / (1 << 30));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int layers = argc > 1 ? atoi(argv[1]) : 6;
  const double mparams = argc > 2 ? atof(argv[2]) : 6.5;
  const int steps = argc > 3 ? atoi(argv[3]) : 4;
  const std::string mode = argc > 4 ? argv[4] : "weights";
  if (layers < 1 || mparams <= 0 || steps < 1 ||
      (mode != "weights" && mode != "activations" && mode != "filled" && mode != "inference")) {
    fprintf(stderr,
            "usage: offload_train_bench [layers] [M params per layer] [steps] "
            "[weights|activations|filled|inference]\n");
    return 2;
  }
  const size_t n = static_cast<size_t>(mparams * 1e6) & ~size_t{63};
  if (mode != "weights")
    return Activations(layers, n, steps, mode == "inference", mode == "filled");
  std::vector<float*> master(layers), grad(layers);
  std::vector<uint16_t*> compute(layers);
  std::vector<std::vector<float>> m(layers, std::vector<float>(n)),
      v(layers, std::vector<float>(n));
  for (int l = 0; l < layers; ++l) {
    master[l] = static_cast<float*>(Pinned(n * 4));
    compute[l] = static_cast<uint16_t*>(Pinned(n * 2));
    grad[l] = static_cast<float*>(Pinned(n * 4));
    Normal(master[l], n, 0.02f, 1 + l);
    for (size_t i = 0; i < n; ++i) compute[l][i] = ToBf16(master[l][i]);
    memset(grad[l], 0, n * 4);
  }
  // The "GPU": two weight slots, a gradient staging buffer, and a source of new gradients.
  void *slot[2], *gdev;
  Check(cudaMalloc(&slot[0], n * 2), "cudaMalloc");
  Check(cudaMalloc(&slot[1], n * 2), "cudaMalloc");
  Check(cudaMalloc(&gdev, n * 4), "cudaMalloc");
  // New gradients every step: windows of one pool of normals at offsets that differ per step and
  // layer.
  std::vector<float> gpool(n + 65536);
  Normal(gpool.data(), gpool.size(), 1e-3f, 999);
  cudaStream_t h2d, d2h;
  Check(cudaStreamCreate(&h2d), "cudaStreamCreate");
  Check(cudaStreamCreate(&d2h), "cudaStreamCreate");
  const float lr = 1e-4f, b1 = 0.9f, b2 = 0.95f, wd = 0.1f, eps = 1e-8f;
  for (int s = 1; s <= steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    int k = 0;
    for (int l = 0; l < layers; ++l, ++k)
      Check(cudaMemcpyAsync(slot[k % 2], compute[l], n * 2, cudaMemcpyHostToDevice, h2d), "h2d");
    Check(cudaStreamSynchronize(h2d), "sync");
    for (int l = layers - 1; l >= 0; --l, ++k) {
      Check(cudaMemcpyAsync(slot[k % 2], compute[l], n * 2, cudaMemcpyHostToDevice, h2d), "h2d");
      Check(cudaStreamSynchronize(h2d), "sync");
      const size_t off = (static_cast<size_t>(s) * 7919 + static_cast<size_t>(l) * 131) % 65536;
      Check(cudaMemcpy(gdev, gpool.data() + off, n * 4, cudaMemcpyHostToDevice), "grad");
      Check(cudaMemcpyAsync(grad[l], gdev, n * 4, cudaMemcpyDeviceToHost, d2h), "d2h");
      Check(cudaStreamSynchronize(d2h), "sync");
    }
    const auto t1 = std::chrono::steady_clock::now();
    const float c1 = 1 - std::pow(b1, s), c2 = 1 - std::pow(b2, s);
    for (int l = 0; l < layers; ++l) {
      float *w = master[l], *g = grad[l], *mm = m[l].data(), *vv = v[l].data();
      for (size_t i = 0; i < n; ++i) {
        w[i] *= 1 - lr * wd;
        mm[i] = b1 * mm[i] + (1 - b1) * g[i];
        vv[i] = b2 * vv[i] + (1 - b2) * g[i] * g[i];
        w[i] -= lr * (mm[i] / c1) / (std::sqrt(vv[i] / c2) + eps);
      }
    }
    for (int l = 0; l < layers; ++l)
      for (size_t i = 0; i < n; ++i) compute[l][i] = ToBf16(master[l][i]);
    const auto t2 = std::chrono::steady_clock::now();
    printf("step %d: %.0f ms (copies %.0f, optimizer %.0f)\n", s,
           std::chrono::duration<double, std::milli>(t2 - t0).count(),
           std::chrono::duration<double, std::milli>(t1 - t0).count(),
           std::chrono::duration<double, std::milli>(t2 - t1).count());
    fflush(stdout);
  }
  uint64_t digest = 1469598103934665603ull;
  for (int l = 0; l < layers; ++l) {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(master[l]);
    for (size_t i = 0; i < n * 4; ++i) digest = (digest ^ p[i]) * 1099511628211ull;
  }
  printf("digest %016llx, pinned %.2f GiB (touched %.2f GiB)\n",
         static_cast<unsigned long long>(digest),
         layers * (2.0 * Pow2(n * 4) + Pow2(n * 2)) / (1 << 30), layers * n * 10.0 / (1 << 30));
  return 0;
}
