// HeapBackend: a RegionBackend made of plain heap memory, with per-chunk generations and
// never-written tracking, so the shim's copy paths can be tested without userfaultfd (and under
// the sanitizers). CPU stores by a test must be followed by Touched(p, len), standing in for the
// engine's write-protect fault that bumps the generation.
#pragma once

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/engine/region_backend.h"

namespace zrtier::testing {

class HeapBackend : public RegionBackend {
 public:
  explicit HeapBackend(size_t chunk) : chunk_(chunk) {}
  ~HeapBackend() override {
    for (auto& [b, r] : regions_) free(reinterpret_cast<void*>(b));
  }
  size_t chunk_size() const override { return chunk_; }
  Status Allocate(size_t size, RegionInfo* out) override {
    size_t rounded = (size + chunk_ - 1) / chunk_ * chunk_;
    void* p = aligned_alloc(chunk_, rounded);
    if (!p) return Status::Error(ENOMEM, "heap");
    memset(p, 0xEE, rounded);  // garbage: never-written chunks must read as zero anyway
    std::lock_guard<std::mutex> l(mu_);
    Region& r = regions_[reinterpret_cast<uintptr_t>(p)];
    r.info = RegionInfo{p, rounded, ++next_id_};
    r.gen.assign(rounded / chunk_, 0);
    *out = r.info;
    return Status::Ok();
  }
  Status Free(void* base) override {
    std::lock_guard<std::mutex> l(mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
    if (it == regions_.end()) return Status::Error(EINVAL, "not a region");
    free(base);
    regions_.erase(it);
    return Status::Ok();
  }
  bool Lookup(const void* p, RegionInfo* out) const override {
    std::lock_guard<std::mutex> l(mu_);
    const Region* r = Find(p);
    if (!r) return false;
    *out = r->info;
    return true;
  }
  Status Read(const void* src, size_t len, void* dst, bool* zero) override {
    {
      std::unique_lock<std::mutex> g(gate_mu_);
      ++waiting_;
      gate_cv_.notify_all();
      gate_cv_.wait(g, [&] { return !held_; });
      --waiting_;
      if (fail_reads_) return Status::Error(EIO, "read failure injected by the test");
    }
    std::lock_guard<std::mutex> l(mu_);
    Region* r = Find(src);
    if (!r || !Inside(*r, src, len)) return Status::Error(EINVAL, "read outside a region");
    bool all_zero = true;
    for (size_t c = Index(*r, src); c <= Index(*r, static_cast<const char*>(src) + len - 1); ++c)
      if (r->gen[c] != 0) all_zero = false;
    if (zero) *zero = all_zero;
    if (all_zero && zero) return Status::Ok();
    // Never-written chunks read as zero even though their heap bytes are garbage.
    const char* s = static_cast<const char*>(src);
    char* d = static_cast<char*>(dst);
    for (size_t done = 0; done < len;) {
      size_t c = Index(*r, s + done);
      size_t in = (s + done - static_cast<const char*>(r->info.base)) % chunk_;
      size_t n = std::min(len - done, chunk_ - in);
      if (r->gen[c] == 0)
        memset(d + done, 0, n);
      else
        memcpy(d + done, s + done, n);
      done += n;
    }
    reads_++;
    return Status::Ok();
  }
  Status Write(void* dst, const void* src, size_t len) override {
    std::lock_guard<std::mutex> l(mu_);
    Region* r = Find(dst);
    if (!r || !Inside(*r, dst, len)) return Status::Error(EINVAL, "write outside a region");
    // Partial chunks merge with the current content (never-written parts are zero).
    for (size_t c = Index(*r, dst); c <= Index(*r, static_cast<char*>(dst) + len - 1); ++c) {
      if (r->gen[c] == 0) memset(static_cast<char*>(r->info.base) + c * chunk_, 0, chunk_);
      r->gen[c] = ++gen_;
    }
    memcpy(dst, src, len);
    return Status::Ok();
  }
  uint64_t Generation(const void* p) const override {
    std::lock_guard<std::mutex> l(mu_);
    const Region* r = Find(p);
    return r ? r->gen[Index(*r, p)] : 0;
  }
  // A test wrote [p, p+len) with the CPU: zero-fill never-written chunks first, as an install
  // would.
  void PrepareCpuWrite(void* p, size_t len) {
    std::lock_guard<std::mutex> l(mu_);
    Region* r = Find(p);
    for (size_t c = Index(*r, p); c <= Index(*r, static_cast<char*>(p) + len - 1); ++c) {
      if (r->gen[c] == 0) memset(static_cast<char*>(r->info.base) + c * chunk_, 0, chunk_);
      r->gen[c] = ++gen_;
    }
  }
  uint64_t reads() const { return reads_; }
  // While held, every Read blocks (before reading anything) until Release.
  void Hold() {
    std::lock_guard<std::mutex> g(gate_mu_);
    held_ = true;
  }
  void Release() {
    std::lock_guard<std::mutex> g(gate_mu_);
    held_ = false;
    gate_cv_.notify_all();
  }
  // Waits until at least `n` reads are blocked by Hold.
  void AwaitHeldReads(int n) {
    std::unique_lock<std::mutex> g(gate_mu_);
    gate_cv_.wait(g, [&] { return waiting_ >= n; });
  }
  // Every later Read fails with EIO (until called with false).
  void FailReads(bool fail) {
    std::lock_guard<std::mutex> g(gate_mu_);
    fail_reads_ = fail;
  }

 private:
  struct Region {
    RegionInfo info;
    std::vector<uint64_t> gen;  // 0 = never written
  };
  const Region* Find(const void* p) const {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) return nullptr;
    --it;
    return a < it->first + it->second.info.size ? &it->second : nullptr;
  }
  Region* Find(const void* p) { return const_cast<Region*>(std::as_const(*this).Find(p)); }
  bool Inside(const Region& r, const void* p, size_t len) const {
    return static_cast<const char*>(p) + len <= static_cast<const char*>(r.info.base) + r.info.size;
  }
  size_t Index(const Region& r, const void* p) const {
    return (static_cast<const char*>(p) - static_cast<const char*>(r.info.base)) / chunk_;
  }
  size_t chunk_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Region> regions_;
  uint64_t next_id_ = 0;
  uint64_t gen_ = 0;
  uint64_t reads_ = 0;
  std::mutex gate_mu_;  // guards the fields below
  std::condition_variable gate_cv_;
  bool held_ = false, fail_reads_ = false;
  int waiting_ = 0;  // reads blocked by Hold
};

}  // namespace zrtier::testing
