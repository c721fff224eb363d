#include "zrtier/options.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "runtime/base/log.h"

extern char** environ;

namespace zrtier {
namespace {

constexpr OptionInfo kTable[] = {
#define ZRTIER_OPTION_ROW(id, name, type, def, unit, choices, flag, help) \
  {Opt::id, name, OptionType::type, def, unit, choices, flag, help},
    ZRTIER_OPTIONS(ZRTIER_OPTION_ROW)
#undef ZRTIER_OPTION_ROW
};
static_assert(sizeof(kTable) / sizeof(kTable[0]) == kOptionCount);

std::string Lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

Status ParseBool(std::string_view text, bool* out) {
  std::string t = Lower(text);
  if (t == "1" || t == "true" || t == "yes" || t == "on") return *out = true, Status::Ok();
  if (t == "0" || t == "false" || t == "no" || t == "off") return *out = false, Status::Ok();
  return Status::Error(EINVAL, "expected 1/0, true/false, yes/no or on/off");
}

Status ParseInt(std::string_view text, int64_t* out) {
  std::string t(text);
  if (t.empty()) return Status::Error(EINVAL, "expected an integer");
  char* end = nullptr;
  errno = 0;
  long long v = strtoll(t.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return Status::Error(EINVAL, "expected an integer");
  *out = v;
  return Status::Ok();
}

// Option-specific checks beyond the syntax of the type.
Status Validate(Opt id, int64_t num, const std::string& str) {
  const OptionInfo& info = InfoOf(id);
  if (info.choices[0] != '\0') {
    std::string_view choices(info.choices);
    size_t pos = 0;
    while (pos <= choices.size()) {
      size_t bar = choices.find('|', pos);
      if (bar == std::string_view::npos) bar = choices.size();
      if (choices.substr(pos, bar - pos) == str) return Status::Ok();
      pos = bar + 1;
    }
    return Status::Error(EINVAL, std::string("expected one of ") + info.choices);
  }
  long page = sysconf(_SC_PAGESIZE);
  switch (id) {
    case Opt::kChunk:
      if (num < page || (num & (num - 1)) != 0)
        return Status::Error(
            EINVAL, "expected a power of two >= the page size (" + std::to_string(page) + ")");
      if (num > (64 << 20)) return Status::Error(EINVAL, "expected at most 64M");
      break;
    case Opt::kArena:
      if (num < (64 << 20)) return Status::Error(EINVAL, "expected at least 64M");
      break;
    case Opt::kZstdLevel:
      if (num < -7 || num > 22) return Status::Error(EINVAL, "expected a zstd level in -7..22");
      break;
    case Opt::kWorkers:
      if (num < 0 || num > 256) return Status::Error(EINVAL, "expected 0 (auto) to 256");
      break;
    case Opt::kVerbose:
      if (num < 0 || num > 3) return Status::Error(EINVAL, "expected 0 to 3");
      break;
    case Opt::kNumaNode:
      if (num < -1 || num > 1023)
        return Status::Error(EINVAL, "expected -1 (auto) or a node number");
      break;
    case Opt::kStoreBackend: {
      // The whole stack is checked here, so that a stack the store would refuse (and zrtier then
      // turn itself off) is a bad value, reported at start-up with the default kept.
      size_t pos = 0;
      while (pos <= str.size()) {
        size_t plus = str.find('+', pos);
        if (plus == std::string::npos) plus = str.size();
        std::string tier = str.substr(pos, plus - pos);
        if (tier != "ram" && tier != "zram" && tier != "file")
          return Status::Error(
              EINVAL, "unknown tier '" + tier + "' (expected ram, zram, file joined by '+')");
        pos = plus + 1;
      }
      if (str != "ram" && str != "ram+zram" && str != "ram+file" && str != "ram+zram+file")
        return Status::Error(EINVAL,
                             "expected ram, ram+zram, ram+file or ram+zram+file (ram first, then "
                             "each lower tier at most once, in that order)");
      break;
    }
    default:
      break;
  }
  return Status::Ok();
}

}  // namespace

bool IsTestOption(const OptionInfo& info) {
  return std::string_view(info.name).rfind("TEST_", 0) == 0;
}

const OptionInfo& OptionAt(int i) {
  return kTable[i];
}
const OptionInfo& InfoOf(Opt id) {
  return kTable[static_cast<int>(id)];
}

std::optional<Opt> FindOption(std::string_view name) {
  if (name.rfind("ZRTIER_", 0) == 0) name.remove_prefix(7);
  for (const OptionInfo& info : kTable) {
    if (name == info.name || (info.flag[0] != '\0' && name == info.flag)) return info.id;
  }
  return std::nullopt;
}

int ResolveWorkers(int64_t requested) {
  if (requested > 0) return static_cast<int>(requested);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return static_cast<int>(std::max(2L, cores - 2));
}

uint64_t PhysicalMemoryBytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

Status ParseSize(std::string_view text, uint64_t* out) {
  std::string t = Lower(text);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  const Status bad = Status::Error(EINVAL, "expected a size like 65536, 64K, 1.5G, 2T or 25%");
  if (t.empty() || !(std::isdigit(static_cast<unsigned char>(t[0])) || t[0] == '.')) return bad;
  char* end = nullptr;
  errno = 0;
  double v = strtod(t.c_str(), &end);
  if (errno != 0 || end == t.c_str() || !std::isfinite(v) || v < 0) return bad;
  std::string suffix(end);
  double mult = 1;
  if (suffix == "%") {
    if (v > 100) return Status::Error(EINVAL, "a percentage of physical memory must be <= 100%");
    *out = static_cast<uint64_t>(v / 100.0 * static_cast<double>(PhysicalMemoryBytes()));
    return Status::Ok();
  }
  if (suffix.size() >= 2 && suffix.substr(suffix.size() - 2) == "ib")
    suffix.resize(suffix.size() - 2);
  else if (suffix.size() >= 1 && suffix.back() == 'b')
    suffix.pop_back();
  if (suffix.empty())
    mult = 1;
  else if (suffix == "k")
    mult = 1024.0;
  else if (suffix == "m")
    mult = 1024.0 * 1024;
  else if (suffix == "g")
    mult = 1024.0 * 1024 * 1024;
  else if (suffix == "t")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    return bad;
  double bytes = v * mult;
  if (bytes > 1.8e19) return Status::Error(ERANGE, "size too large");
  if (mult == 1 && v != std::floor(v)) return bad;
  *out = static_cast<uint64_t>(bytes);
  return Status::Ok();
}

std::string FormatSize(uint64_t bytes) {
  static const char* kUnits[] = {"", "K", "M", "G", "T"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  if (u == 0)
    snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(bytes));
  else if (v == std::floor(v))
    snprintf(buf, sizeof(buf), "%.0f%s", v, kUnits[u]);
  else
    snprintf(buf, sizeof(buf), "%.1f%s", v, kUnits[u]);
  return buf;
}

Options::Options() {
  for (const OptionInfo& info : kTable) {
    Status s = Set(info.id, info.default_text);
    (void)s;  // defaults are valid by construction (options_test checks every one)
  }
}

Status Options::Set(Opt id, std::string_view text) {
  const OptionInfo& info = InfoOf(id);
  int i = static_cast<int>(id);
  int64_t num = 0;
  std::string str;
  Status s;
  switch (info.type) {
    case OptionType::kBool: {
      bool b = false;
      s = ParseBool(text, &b);
      num = b;
      break;
    }
    case OptionType::kInt:
      s = ParseInt(text, &num);
      break;
    case OptionType::kSize: {
      uint64_t v = 0;
      s = ParseSize(text, &v);
      num = static_cast<int64_t>(v);
      break;
    }
    case OptionType::kString:
      str = std::string(text);
      break;
  }
  if (s.ok()) s = Validate(id, num, str);
  if (!s.ok())
    return Status::Error(s.code(), std::string("ZRTIER_") + info.name + "='" + std::string(text) +
                                       "': " + s.message());
  num_[i] = num;
  str_[i] = std::move(str);
  return Status::Ok();
}

bool Options::Bool(Opt id) const {
  return num_[static_cast<int>(id)] != 0;
}
int64_t Options::Int(Opt id) const {
  return num_[static_cast<int>(id)];
}
uint64_t Options::Size(Opt id) const {
  return static_cast<uint64_t>(num_[static_cast<int>(id)]);
}
const std::string& Options::String(Opt id) const {
  return str_[static_cast<int>(id)];
}

std::string Options::SpillDir() const {
  std::string dir = String(Opt::kSpillDir);
  const std::string uid = std::to_string(geteuid());
  for (size_t at = dir.find("%u"); at != std::string::npos; at = dir.find("%u", at + uid.size()))
    dir.replace(at, 2, uid);
  return dir;
}

std::string Options::Text(Opt id) const {
  switch (InfoOf(id).type) {
    case OptionType::kBool:
      return Bool(id) ? "1" : "0";
    case OptionType::kInt:
      return std::to_string(Int(id));
    case OptionType::kSize:
      return FormatSize(Size(id));
    case OptionType::kString:
      return String(id);
  }
  return "";
}

Options Options::FromEnvironment(const std::function<void(const std::string&)>& warn,
                                 const std::function<const char*(const char*)>& getenv_fn) {
  auto report = [&](const std::string& msg) {
    if (warn)
      warn(msg);
    else
      Log(LogLevel::kWarn, "%s", msg.c_str());
  };
  Options opts;
  for (const OptionInfo& info : kTable) {
    std::string var = std::string("ZRTIER_") + info.name;
    const char* value = getenv_fn ? getenv_fn(var.c_str()) : getenv(var.c_str());
    if (value == nullptr) continue;
    Status s = opts.Set(info.id, value);
    if (!s.ok()) report(s.message() + "; keeping the default " + info.default_text);
  }
  if (!getenv_fn && environ != nullptr) {
    for (char** e = environ; *e != nullptr; ++e) {
      std::string_view kv(*e);
      if (kv.rfind("ZRTIER_", 0) != 0 || kv.rfind("ZRTIER_TEST_", 0) == 0) continue;
      std::string_view name = kv.substr(0, kv.find('='));
      if (!FindOption(name) || name.substr(7) != InfoOf(*FindOption(name)).name)
        report("unknown variable " + std::string(name) + " ignored (see `zrtier run --help`)");
    }
  }
  return opts;
}

}  // namespace zrtier
