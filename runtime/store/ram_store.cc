// Initial RAM store: one heap buffer per entry. (The slab store with NUMA placement replaces it.)
#include "runtime/store/ram_store.h"

#include <cstring>

namespace zrtier {

RamStore::RamStore(uint64_t limit_bytes, int numa_node, Os* os) : limit_(limit_bytes) {
  usage_.limit_bytes = limit_bytes;
}
RamStore::~RamStore() = default;

Status RamStore::Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (limit_ && usage_.used_bytes + len > limit_)
    return Status::Error(ENOSPC, "RAM store full (ZRTIER_STORE_LIMIT)");
  Entry e{std::vector<unsigned char>(static_cast<const unsigned char*>(data),
                                     static_cast<const unsigned char*>(data) + len),
          raw_len};
  StoreHandle h = next_++;
  entries_.emplace(h, std::move(e));
  usage_.entries++;
  usage_.raw_bytes += raw_len;
  usage_.payload_bytes += len;
  usage_.used_bytes += len;
  *out = h;
  return Status::Ok();
}

Status RamStore::Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = entries_.find(h);
  if (it == entries_.end()) return Status::Error(ENOENT, "RAM store: no such entry");
  const Entry& e = it->second;
  lock.unlock();  // entries are immutable and freed only when no reader can reach them
  return fn(e.bytes.data(), e.bytes.size());
}

void RamStore::Free(StoreHandle h) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(h);
  if (it == entries_.end()) return;
  usage_.entries--;
  usage_.raw_bytes -= it->second.raw_len;
  usage_.payload_bytes -= it->second.bytes.size();
  usage_.used_bytes -= it->second.bytes.size();
  entries_.erase(it);
}

StoreUsage RamStore::Usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_;
}

Status CreateStore(const Options& opts, Os* os, std::unique_ptr<ChunkStore>* out) {
  if (opts.String(Opt::kStoreBackend) != "ram")
    return Status::Error(ENOTSUP, "ZRTIER_STORE_BACKEND=" + opts.String(Opt::kStoreBackend) +
                                      ": only 'ram' is available in this build");
  out->reset(new RamStore(opts.Size(Opt::kStoreLimit), static_cast<int>(opts.Int(Opt::kNumaNode)), os));
  return Status::Ok();
}

}  // namespace zrtier
