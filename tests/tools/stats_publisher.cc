// Test helper: a process that publishes a statistics block (as the shim does), sets known values,
// prints "ready <pid>" and then, until killed, keeps counting (so monitors see numbers change):
// every 50 ms it adds two H2D copies of 1 MiB in all (one ready at the call, both in time), 10
// faults with ~20 us latency and one eviction.
//   stats_publisher [seconds]   (default 60; exits 0 afterwards, unlinking its block)
// With ZRTIER_STATS_FILE set it registers the statistics file as the shim does, and before it
// exits prints "final <name>=<value> ..." of the counters the tests compare with that file.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "runtime/base/stats.h"
#include "runtime/base/stats_file.h"
#include "runtime/base/stats_shm.h"

using namespace zrtier;

namespace {

// Two H2D copies of 512 KiB, both in time, one of them ready at the call as well (prefetch hits
// 50 %, 100 % in time).
void Copies() {
  StatAdd(Stat::h2d_bytes, 1 << 20);
  StatAdd(Stat::h2d_copies, 2);
  StatAdd(Stat::copies_ready, 1);
  StatAdd(Stat::copies_ready_in_time, 2);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 60;
  Status s = PublishStats();
  if (!s.ok()) {
    fprintf(stderr, "stats_publisher: %s\n", s.ToString().c_str());
    return 1;
  }
  if (const char* file = getenv("ZRTIER_STATS_FILE")) {
    Status fs = WriteStatsFileAtExit(file);
    if (!fs.ok()) {
      fprintf(stderr, "stats_publisher: %s\n", fs.ToString().c_str());
      return 1;
    }
  }
  StatSet(Stat::regions, 1);
  StatSet(Stat::region_bytes, 4ull << 30);
  StatSet(Stat::resident_bytes, 1ull << 30);
  StatSet(Stat::resident_limit_bytes, 2ull << 30);
  StatSet(Stat::store_raw_bytes, 3ull << 30);
  StatSet(Stat::store_bytes, 2ull << 30);
  StatsRegionAcquire(0x7f0000000000ull, 4ull << 30);
  StatAdd(Stat::faults_missing, 4242);
  Copies();
  printf("ready %d\n", static_cast<int>(getpid()));
  fflush(stdout);
  for (double t = 0; t < seconds; t += 0.05) {
    usleep(50000);
    Copies();
    StatAdd(Stat::faults_missing, 10);
    for (int i = 0; i < 10; ++i) HistRecord(Hist::fault_latency, 20000);
    StatAdd(Stat::evictions, 1);
  }
  printf("final faults_missing=%llu evictions=%llu h2d_copies=%llu h2d_bytes=%llu\n",
         static_cast<unsigned long long>(StatGet(Stat::faults_missing)),
         static_cast<unsigned long long>(StatGet(Stat::evictions)),
         static_cast<unsigned long long>(StatGet(Stat::h2d_copies)),
         static_cast<unsigned long long>(StatGet(Stat::h2d_bytes)));
  return 0;
}
