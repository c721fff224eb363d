// EngineParts: what the engine's mechanisms share -- the system-call seam, the region map, the
// userfaultfd ioctls, chunk I/O, the resident budget and the pager's wake-up. Owned by Engine
// (every pointer stays valid for the mechanisms' lifetime); each mechanism holds a copy.
#pragma once

#include <cstddef>

namespace zrtier {

class ChunkIo;
class Os;
class ParkedFaults;
class RegionMap;
class ResidentBudget;
class Uffd;

struct EngineParts {
  Os* os = nullptr;
  RegionMap* regions = nullptr;
  Uffd* uffd = nullptr;
  ChunkIo* io = nullptr;
  ResidentBudget* budget = nullptr;
  ParkedFaults* parked = nullptr;
  size_t chunk = 0;
};

}  // namespace zrtier
