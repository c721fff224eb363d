#include "runtime/shim/write_back.h"

#include <algorithm>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"

namespace zrtier {

bool WriteBack::Slot(int slot, uint64_t rid, uint64_t chunk, uint64_t gen) {
  bool installed = false;
  // Under the regions' shared lock while attaching: FreeHost cannot free the region meanwhile.
  // A freed region's copy is garbage: nothing to do.
  Status st = ctx_.regions->With(rid, Status::Ok(), [&](const RegionInfo& r) {
    return ctx_.backend->Attach(static_cast<char*>(r.base) + chunk * ctx_.chunk, gen,
                                ctx_.pool->SlotPtr(slot), &installed);
  });
  ctx_.pool->ReleaseOwned(slot, st.ok(), installed);
  if (!st.ok()) {
    ZRTIER_LOG_ONCE(LogLevel::kError,
                    "writing an owned T0 slot back into its region failed: %s (it stays in T0)",
                    st.ToString().c_str());
    return false;
  }
  StatAdd(Stat::t0_writebacks, 1);
  return true;
}

void WriteBack::Owned(uint64_t region, size_t keep) {
  while (ctx_.pool->owned_slots() > keep) {
    uint64_t rid, chunk, gen;
    const int slot = ctx_.pool->TakeOwned(region, &rid, &chunk, &gen);
    if (slot < 0 || !Slot(slot, rid, chunk, gen)) break;
  }
}

void WriteBack::Wanted(size_t max) {
  for (size_t k = 0; k < max; ++k) {
    uint64_t rid, chunk, gen;
    const int slot = ctx_.pool->TakeWanted(&rid, &chunk, &gen);
    if (slot < 0 || !Slot(slot, rid, chunk, gen)) break;
  }
}

void WriteBack::MaybeStart() {
  const size_t limit = ctx_.pool->slots() / 2;
  const bool over = ctx_.pool->owned_slots() > limit;
  // Wanted slots go back only when T1 has no room for all of them, so that written back they end
  // in the store: their chunks' next reads then decode, and the spread overlaps those decodes
  // with the link. With room in T1 the owned copies stay (a resident chunk's fill is a memcpy):
  // the owned prefix streamed faster than the spread that replaced it, and writing it back grew
  // T1 by its bytes.
  const bool wanted = WantedGoBack();
  if (!over && !wanted) return;
  if (wanted) ctx_.workers->Nudge();  // an idle worker writes them back first (Idle)
  std::lock_guard<std::mutex> l(mu_);
  if (job_ && !job_->done()) return;  // one job at a time; it rechecks as it goes
  // Over half the pool owned: down to 3/8 of the pool, so that the next copies do not trigger it
  // again at once; every worker takes part (a write-back is a UFFDIO_COPY of a chunk, ~4 GB/s per
  // thread, or an encode into the store when T1 is full).
  job_ = ctx_.workers->Submit(std::max(1, ctx_.workers->threads()),
                              [this, limit, over, wanted](size_t) {
                                if (wanted) Wanted(kWantedPerItem);
                                if (over) Owned(PinnedPool::kAnyRegion, limit - limit / 4);
                              });
}

bool WriteBack::WantedGoBack() const {
  const size_t wanted = ctx_.pool->wanted_slots();
  return wanted > 0 && ctx_.backend->ResidentRoom() < wanted * ctx_.chunk;
}

bool WriteBack::Idle() {
  if (!WantedGoBack()) return false;
  uint64_t rid, chunk, gen;
  const int slot = ctx_.pool->TakeWanted(&rid, &chunk, &gen);
  return slot >= 0 && Slot(slot, rid, chunk, gen);
}

void WriteBack::Wait() {
  std::shared_ptr<FillWorkers::Batch> b;
  {
    std::lock_guard<std::mutex> l(mu_);
    b = job_;
  }
  if (b) ctx_.workers->Wait(*b);
}

}  // namespace zrtier
