// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Host NUMA placement for pinned memory: which node a device is attached
/// to, allocation that prefers a node, and where a page is. What a storage
/// policy needs to honour HostRequest::numa_node (storage::PinnedPool
/// places its slabs with it; device::Cuda finds its node with it). Built
/// on libnuma when the library was compiled with it (OFFLOAD_HAS_NUMA in
/// <offload/config.hpp>); without it every function here says "unknown"
/// and places nothing, and nothing else changes.

#include <cstddef>
#include <string_view>

namespace offload::numa {

/// Whether this process can place memory on a NUMA node: the library was
/// built with libnuma, the kernel supports NUMA policies
/// (numa_available()) and lets this process read its own
/// (get_mempolicy; a container's seccomp profile may forbid it). True on a
/// machine with a single node too (every placement then lands on node 0).
/// Thread-safe; never throws.
bool placement_available() noexcept;

/// The number of NUMA nodes the host has (numa_max_node() + 1), 0 when
/// placement is not available. Thread-safe; never throws.
int node_count() noexcept;

/// The NUMA node of the host page holding `address` (the page is faulted
/// in if it was not yet), -1 when unknown (no placement available, or the
/// kernel refuses). For tests and statistics. Thread-safe; never throws.
int node_of(const void* address) noexcept;

/// The host NUMA node the PCI device `bus_id` ("0000:3b:00.0", the form of
/// /sys/bus/pci/devices; upper-case hex accepted) is attached to, as sysfs
/// says (its `numa_node` file), -1 when sysfs does not say (no such device,
/// a machine without NUMA, not Linux). Needs no libnuma. Thread-safe;
/// never throws.
int pci_node(std::string_view bus_id) noexcept;

/// While alive, host pages the calling thread allocates prefer NUMA node
/// `node` (MPOL_PREFERRED: another node when that one is full, never an
/// error); the thread's previous policy is restored at destruction. Does
/// nothing when `node` < 0, is not a node of this host, or placement is
/// not available. For allocators that pin (and so fault in) pages in the
/// calling thread, as cudaHostAlloc does. Not copyable; use on one thread.
class PreferredNode {
 public:
  explicit PreferredNode(int node) noexcept;
  ~PreferredNode();
  PreferredNode(const PreferredNode&) = delete;
  PreferredNode& operator=(const PreferredNode&) = delete;
  /// Whether the thread's policy was changed (the node is being preferred).
  bool active() const noexcept { return active_; }
  /// Words of the node masks handed to the kernel: up to 1024 nodes, as
  /// libnuma's default.
  static constexpr int kMaskWords = 16;

 private:
  bool active_ = false;
  [[maybe_unused]] int old_mode_ = 0;
  [[maybe_unused]] unsigned long old_mask_[kMaskWords] = {};
};

/// Sets the policy of the whole pages inside [address, address + bytes) to
/// prefer `node` (mbind, MPOL_PREFERRED, no move): pages not yet faulted
/// in land there whichever thread touches them first; pages already
/// present stay where they are. Returns whether the kernel took it; false
/// (and nothing changed) when `node` < 0, not a node of this host,
/// placement is not available, or the range holds no whole page.
/// Thread-safe; never throws.
bool prefer_range(void* address, std::size_t bytes, int node) noexcept;

}  // namespace offload::numa
