#include "tools/zrtier/stats_json.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tools/top/metrics.h"

namespace zrtier::tools {
namespace {

using Json = nlohmann::json;

// Files larger than this are no statistics file (one is a few KiB).
constexpr off_t kMaxFileBytes = 64 << 20;

// Reads the whole file at `path` into *text.
Status ReadWholeFile(const std::string& path, std::string* text) {
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return Status::Error(errno, "cannot open " + path + ": " + strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return Status::Error(EINVAL, path + ": not a regular file");
  }
  if (st.st_size > kMaxFileBytes) {
    close(fd);
    return Status::Error(EFBIG, path + ": " + std::to_string(st.st_size) +
                                    " bytes, too large for a statistics file");
  }
  text->clear();
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      close(fd);
      return Status::Error(e, "cannot read " + path + ": " + strerror(e));
    }
    if (n == 0) break;
    text->append(buf, static_cast<size_t>(n));
    if (text->size() > static_cast<size_t>(kMaxFileBytes)) {
      close(fd);
      return Status::Error(EFBIG, path + ": too large for a statistics file");
    }
  }
  close(fd);
  return Status::Ok();
}

// `j[key]` as an unsigned integer; `fallback` when absent. Throws std::runtime_error naming the key
// when present with another type.
uint64_t U64(const Json& j, const char* key, uint64_t fallback = 0) {
  auto it = j.find(key);
  if (it == j.end()) return fallback;
  if (!it->is_number_unsigned())
    throw std::runtime_error(std::string("\"") + key + "\" is not a non-negative integer");
  return it->get<uint64_t>();
}

const Json& Member(const Json& j, const char* key, Json::value_t type, const char* what) {
  auto it = j.find(key);
  if (it == j.end() || it->type() != type)
    throw std::runtime_error(std::string("no \"") + key + "\" " + what);
  return *it;
}

StatsSnapshot FromJson(const Json& j) {
  if (!j.is_object()) throw std::runtime_error("a process is not a JSON object");
  StatsSnapshot s;
  if (!j.contains("pid") || !j["pid"].is_number_integer())
    throw std::runtime_error("no \"pid\" integer");
  s.pid = static_cast<pid_t>(j["pid"].get<int64_t>());
  s.pid_ns = static_cast<uint32_t>(U64(j, "pid_ns"));
  s.version = static_cast<uint32_t>(U64(j, "version"));
  s.start_unix_ns = U64(j, "start_unix_ns");
  s.heartbeat_unix_ns = U64(j, "heartbeat_unix_ns");
  s.taken_unix_ns = U64(j, "taken_unix_ns");
  if (auto it = j.find("cmdline"); it != j.end() && it->is_string())
    s.cmdline = it->get<std::string>();
  if (auto it = j.find("final"); it != j.end() && it->is_boolean()) s.final = it->get<bool>();
  const Json& stats = Member(j, "stats", Json::value_t::object, "object of counters");
  for (int i = 0; i < kStatCount; ++i) s.values[i] = U64(stats, StatInfoAt(i).name);
  if (auto hs = j.find("histograms"); hs != j.end() && hs->is_object()) {
    for (int h = 0; h < kHistCount; ++h) {
      auto it = hs->find(HistName(h));
      if (it == hs->end() || !it->is_object()) continue;
      if (auto b = it->find("buckets"); b != it->end()) {
        if (!b->is_array() || b->size() > static_cast<size_t>(kHistBuckets))
          throw std::runtime_error(std::string("bad buckets of ") + HistName(h));
        for (size_t k = 0; k < b->size(); ++k) {
          if (!(*b)[k].is_number_unsigned())
            throw std::runtime_error(std::string("bad buckets of ") + HistName(h));
          s.hist[h][k] = (*b)[k].get<uint64_t>();
        }
      }
      if (it->contains("sum_ns")) {
        s.hist_sum_ns[h] = U64(*it, "sum_ns");
      } else {
        s.hist_sum_ns[h] = EstimatedHistSumNs(s.hist[h]);
        s.hist_sum_estimated = true;
      }
    }
  }
  if (auto rs = j.find("regions"); rs != j.end() && rs->is_array()) {
    for (const Json& r : *rs) {
      if (!r.is_object()) throw std::runtime_error("a region is not a JSON object");
      s.regions.push_back({U64(r, "base"), U64(r, "size"), U64(r, "resident_bytes"),
                           U64(r, "stored_raw_bytes"), U64(r, "stored_bytes")});
    }
  }
  return s;
}

}  // namespace

nlohmann::ordered_json SnapshotJson(const StatsSnapshot& s) {
  nlohmann::ordered_json o;
  o["pid"] = s.pid;
  o["pid_ns"] = s.pid_ns;
  o["cmdline"] = s.cmdline;
  o["version"] = s.version;
  o["start_unix_ns"] = s.start_unix_ns;
  o["heartbeat_unix_ns"] = s.heartbeat_unix_ns;
  o["taken_unix_ns"] = s.taken_unix_ns;
  o["final"] = s.final;
  nlohmann::ordered_json& stats = o["stats"] = nlohmann::ordered_json::object();
  for (int i = 0; i < kStatCount; ++i) stats[StatInfoAt(i).name] = s.values[i];
  nlohmann::ordered_json& hists = o["histograms"] = nlohmann::ordered_json::object();
  for (int h = 0; h < kHistCount; ++h) {
    const Hist hist = static_cast<Hist>(h);
    nlohmann::ordered_json& x = hists[HistName(h)];
    x["count"] = HistCount(s, hist);
    x["sum_ns"] = s.hist_sum_ns[h];
    if (s.hist_sum_estimated) x["sum_estimated"] = true;
    x["p50_ns"] = HistQuantileNs(s, hist, 0.5);
    x["p90_ns"] = HistQuantileNs(s, hist, 0.9);
    x["p99_ns"] = HistQuantileNs(s, hist, 0.99);
    x["buckets"] = s.hist[h];
  }
  nlohmann::ordered_json& regions = o["regions"] = nlohmann::ordered_json::array();
  for (const auto& r : s.regions)
    regions.push_back({{"base", r.base},
                       {"size", r.size},
                       {"resident_bytes", r.resident_bytes},
                       {"stored_raw_bytes", r.stored_raw_bytes},
                       {"stored_bytes", r.stored_bytes}});
  return o;
}

std::string JsonText(const nlohmann::ordered_json& json) {
  return json.dump(-1, ' ', /*ensure_ascii=*/true,
                   nlohmann::ordered_json::error_handler_t::replace);
}

Status ReadStatsJsonFile(const std::string& path, std::vector<StatsSnapshot>* out) {
  std::string text;
  ZRTIER_RETURN_IF_ERROR(ReadWholeFile(path, &text));
  std::vector<StatsSnapshot> found;
  try {
    const Json doc = Json::parse(text);
    if (doc.is_object() && doc.contains("processes")) {
      const Json& list = Member(doc, "processes", Json::value_t::array, "array of processes");
      for (const Json& p : list) found.push_back(FromJson(p));
    } else {
      found.push_back(FromJson(doc));
    }
  } catch (const std::exception& e) {
    return Status::Error(EINVAL, path + ": not a zrtier statistics file: " + e.what());
  }
  out->insert(out->end(), found.begin(), found.end());
  return Status::Ok();
}

}  // namespace zrtier::tools
