// The RegionBackend used in production: forwards every call to the Engine.
#include "runtime/cuda/region_backend.h"

namespace zrtier {
namespace {

class EngineBackend final : public RegionBackend {
 public:
  explicit EngineBackend(std::unique_ptr<Engine> e) : e_(std::move(e)) {}
  size_t chunk_size() const override { return e_->chunk_size(); }
  Status Allocate(size_t size, RegionInfo* out) override { return e_->Allocate(size, out); }
  Status Free(void* base) override { return e_->Free(base); }
  bool Lookup(const void* p, RegionInfo* out) const override { return e_->Lookup(p, out); }
  Status ReadChunk(const void* chunk_start, void* dst, bool* zero, uint64_t* gen) override {
    return e_->ReadChunk(chunk_start, dst, zero, gen);
  }
  Status Read(const void* src, size_t len, void* dst, bool* zero) override {
    return e_->Read(src, len, dst, zero);
  }
  Status Write(void* dst, const void* src, size_t len) override { return e_->Write(dst, src, len); }
  void PrepareRead(const void* p, size_t len) override { e_->PrepareRead(p, len); }
  void PrepareWrite(void* p, size_t len) override { e_->PrepareWrite(p, len); }
  uint64_t Generation(const void* p) const override { return e_->Generation(p); }
  void Generations(const void* p, size_t n, uint64_t* out, bool* resident) const override {
    e_->Generations(p, n, out, resident);
  }
  Status EvictRange(const void* p, size_t len) override { return e_->EvictRange(p, len); }
  void SetExternalCopies(ExternalCopies* x) override { e_->SetExternalCopies(x); }
  void SetPlacementOracle(const policy::NextUseOracle* oracle) override {
    e_->SetPlacementOracle(oracle);
  }
  void SetFaultObserver(Engine::FaultObserver observer) override {
    e_->SetFaultObserver(std::move(observer));
  }
  Status Adopt(void* p, size_t n, uint64_t* gens,
               const std::function<void()>& registered) override {
    return e_->Adopt(p, n, gens, registered);
  }
  uint64_t ResidentRoom() const override { return e_->ResidentRoom(); }
  Status Attach(void* chunk_start, uint64_t gen, const void* bytes, bool* installed) override {
    return e_->Attach(chunk_start, gen, bytes, installed);
  }

 private:
  std::unique_ptr<Engine> e_;
};

}  // namespace

std::unique_ptr<RegionBackend> MakeEngineBackend(std::unique_ptr<Engine> engine) {
  return std::make_unique<EngineBackend>(std::move(engine));
}

}  // namespace zrtier
