// NUMA placement: which node the GPU sits on, so the pinned pool and the RAM store can live there.
#pragma once

#include <string>

#include "zrtier/options.h"

namespace zrtier {

// Normalizes a PCI bus id as cudaDeviceGetPCIBusId gives it ("0000:3B:00.0", or nvidia-smi's
// "00000000:3B:00.0") to the sysfs form "0000:3b:00.0". Returns "" if it does not parse.
std::string NormalizePciBusId(const std::string& pci_bus_id);

// The NUMA node of the PCI device `pci_bus_id`, read from
// <sysfs_root>/bus/pci/devices/<bus id>/numa_node (sysfs_root is "/sys" outside tests).
// -1 when the file is missing, unreadable, malformed or says -1 (no preference).
int GpuNumaNode(const std::string& sysfs_root, const std::string& pci_bus_id);

// The node to place memory on: ZRTIER_NUMA_NODE when it is >= 0 (the override), else the GPU's
// node (GpuNumaNode with "/sys"), else -1.
int ResolveNumaNode(const Options& opts, const std::string& pci_bus_id);

}  // namespace zrtier
