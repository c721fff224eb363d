// GPU NUMA node lookup through sysfs (see numa.h).
#include "runtime/store/numa.h"

#include <fcntl.h>

#include <cctype>
#include <cstdlib>

#include "runtime/os/os.h"

namespace zrtier {

std::string NormalizePciBusId(const std::string& id) {
  // domain:bus:device.function, hex; the domain may have 4 or 8 digits.
  size_t c1 = id.find(':');
  size_t c2 = c1 == std::string::npos ? c1 : id.find(':', c1 + 1);
  size_t dot = c2 == std::string::npos ? c2 : id.find('.', c2 + 1);
  if (dot == std::string::npos) return "";
  auto hex = [](const std::string& s, unsigned long* v) {
    if (s.empty() || s.size() > 8) return false;
    for (char ch : s)
      if (!isxdigit(static_cast<unsigned char>(ch))) return false;
    *v = strtoul(s.c_str(), nullptr, 16);
    return true;
  };
  unsigned long dom, bus, dev, fn;
  if (!hex(id.substr(0, c1), &dom) || !hex(id.substr(c1 + 1, c2 - c1 - 1), &bus) ||
      !hex(id.substr(c2 + 1, dot - c2 - 1), &dev) || !hex(id.substr(dot + 1), &fn))
    return "";
  if (dom > 0xffff || bus > 0xff || dev > 0x1f || fn > 7) return "";
  char buf[32];
  snprintf(buf, sizeof(buf), "%04lx:%02lx:%02lx.%lx", dom, bus, dev, fn);
  return buf;
}

int GpuNumaNode(const std::string& sysfs_root, const std::string& pci_bus_id) {
  std::string id = NormalizePciBusId(pci_bus_id);
  if (id.empty()) return -1;
  std::string path = sysfs_root + "/bus/pci/devices/" + id + "/numa_node";
  Os* os = Os::Default();
  long fd = os->Open(path.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return -1;
  char buf[32] = {};
  long n = os->Read(static_cast<int>(fd), buf, sizeof(buf) - 1);
  os->Close(static_cast<int>(fd));
  if (n <= 0) return -1;
  char* end = nullptr;
  long node = strtol(buf, &end, 10);
  if (end == buf || (*end != '\0' && *end != '\n') || node < -1 || node > 1023) return -1;
  return static_cast<int>(node);
}

int ResolveNumaNode(const Options& opts, const std::string& pci_bus_id) {
  int64_t forced = opts.Int(Opt::kNumaNode);
  if (forced >= 0) return static_cast<int>(forced);
  return GpuNumaNode("/sys", pci_bus_id);
}

}  // namespace zrtier
