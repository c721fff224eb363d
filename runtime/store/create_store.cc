// CreateStore: builds the store stack named by ZRTIER_STORE_BACKEND.
#include "runtime/store/ram_store.h"
#include "runtime/store/store.h"

namespace zrtier {

Status CreateStore(const Options& opts, Os* os, std::unique_ptr<ChunkStore>* out) {
  const std::string& backend = opts.String(Opt::kStoreBackend);
  if (backend != "ram")
    return Status::Error(
        ENOTSUP, "ZRTIER_STORE_BACKEND=" + backend + ": only 'ram' is available in this build");
  out->reset(
      new RamStore(opts.Size(Opt::kStoreLimit), static_cast<int>(opts.Int(Opt::kNumaNode)), os));
  return Status::Ok();
}

}  // namespace zrtier
