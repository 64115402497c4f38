// SPDX-License-Identifier: MIT
// Host NUMA placement (<offload/numa.hpp>): libnuma's policy calls when
// the library was built with it, "unknown" without.

#include <offload/config.hpp>
#include <offload/numa.hpp>

#include <cctype>
#include <cstdint>
#include <fstream>
#include <string>

#if OFFLOAD_HAS_NUMA
#include <numa.h>
#include <numaif.h>
#include <unistd.h>
#endif

namespace offload::numa {

namespace {
#if OFFLOAD_HAS_NUMA
constexpr unsigned long kMaskBits = sizeof(unsigned long) * 8 * PreferredNode::kMaskWords;

bool valid_node(int node) noexcept { return node >= 0 && node < node_count() && node < int(kMaskBits) - 1; }

void set_bit(unsigned long* mask, int node) noexcept {
  mask[node / (sizeof(unsigned long) * 8)] |= 1UL << (node % (sizeof(unsigned long) * 8));
}
#endif
}  // namespace

bool placement_available() noexcept {
#if OFFLOAD_HAS_NUMA
  static const bool available = [] {
    int mode = 0;
    return numa_available() >= 0 && get_mempolicy(&mode, nullptr, 0, nullptr, 0) == 0;
  }();
  return available;
#else
  return false;
#endif
}

int node_count() noexcept {
#if OFFLOAD_HAS_NUMA
  static const int count = placement_available() ? numa_max_node() + 1 : 0;
  return count;
#else
  return 0;
#endif
}

int node_of(const void* address) noexcept {
#if OFFLOAD_HAS_NUMA
  if (!placement_available() || address == nullptr) return -1;
  int node = -1;
  if (get_mempolicy(&node, nullptr, 0, const_cast<void*>(address), MPOL_F_NODE | MPOL_F_ADDR) != 0) return -1;
  return node;
#else
  (void)address;
  return -1;
#endif
}

int pci_node(std::string_view bus_id) noexcept {
  try {
    if (bus_id.empty() || bus_id.find('/') != std::string_view::npos) return -1;
    std::string path = "/sys/bus/pci/devices/";
    for (const char c : bus_id) path += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    path += "/numa_node";
    std::ifstream file(path);
    int node = -1;
    if (!(file >> node)) return -1;
    return node >= 0 ? node : -1;
  } catch (...) {
    return -1;
  }
}

PreferredNode::PreferredNode(int node) noexcept {
#if OFFLOAD_HAS_NUMA
  if (!valid_node(node)) return;
  if (get_mempolicy(&old_mode_, old_mask_, kMaskBits, nullptr, 0) != 0) return;
  unsigned long mask[kMaskWords] = {};
  set_bit(mask, node);
  active_ = set_mempolicy(MPOL_PREFERRED, mask, kMaskBits) == 0;
#else
  (void)node;
#endif
}

PreferredNode::~PreferredNode() {
#if OFFLOAD_HAS_NUMA
  if (active_) set_mempolicy(old_mode_, old_mask_, kMaskBits);
#endif
}

bool prefer_range(void* address, std::size_t bytes, int node) noexcept {
#if OFFLOAD_HAS_NUMA
  if (!valid_node(node) || address == nullptr) return false;
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<std::uintptr_t>(address) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(address) + bytes) / page * page;
  if (end <= begin) return false;
  unsigned long mask[PreferredNode::kMaskWords] = {};
  set_bit(mask, node);
  return mbind(reinterpret_cast<void*>(begin), end - begin, MPOL_PREFERRED, mask, kMaskBits, 0) == 0;
#else
  (void)address;
  (void)bytes;
  (void)node;
  return false;
#endif
}

}  // namespace offload::numa
