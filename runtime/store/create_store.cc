// CreateStore: builds the store stack named by ZRTIER_STORE_BACKEND ("ram", "ram+zram",
// "ram+file", "ram+zram+file").
#include <sstream>

#include "runtime/store/file_store.h"
#include "runtime/store/ram_store.h"
#include "runtime/store/store.h"
#include "runtime/store/tiered_store.h"
#include "runtime/store/zram_store.h"

namespace zrtier {

Status CreateStore(const Options& opts, Os* os, std::unique_ptr<ChunkStore>* out) {
  const std::string& backend = opts.String(Opt::kStoreBackend);
  std::vector<std::string> names;
  std::stringstream in(backend);
  for (std::string part; std::getline(in, part, '+');) names.push_back(part);
  auto bad = [&](const std::string& why) {
    return Status::Error(EINVAL, "ZRTIER_STORE_BACKEND=" + backend + ": " + why +
                                     " (expected ram, ram+zram, ram+file or ram+zram+file)");
  };
  if (names.empty() || names[0] != "ram") return bad("the first tier must be ram");
  auto ram = std::make_unique<RamStore>(opts.Size(Opt::kStoreLimit),
                                        static_cast<int>(opts.Int(Opt::kNumaNode)), os);
  if (names.size() == 1) {
    *out = std::move(ram);
    return Status::Ok();
  }
  std::vector<std::unique_ptr<ExtentStore>> lower;
  bool zram = false, file = false;
  for (size_t i = 1; i < names.size(); ++i) {
    if (names[i] == "zram" && !zram && !file) {
      std::unique_ptr<ZramStore> z;
      ZRTIER_RETURN_IF_ERROR(
          ZramStore::Create(opts.String(Opt::kZramDevice), opts.Size(Opt::kZramSize), os, &z));
      lower.push_back(std::move(z));
      zram = true;
    } else if (names[i] == "file" && !file) {
      std::unique_ptr<FileStore> f;
      ZRTIER_RETURN_IF_ERROR(
          FileStore::Create(opts.SpillDir(), opts.Size(Opt::kSpillLimit), os, &f));
      lower.push_back(std::move(f));
      file = true;
    } else {
      return bad("unknown, repeated or misplaced tier '" + names[i] + "'");
    }
  }
  out->reset(new TieredStore(std::move(ram), std::move(lower)));
  return Status::Ok();
}

}  // namespace zrtier
