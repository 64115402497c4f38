// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The buffers policies exchange with the manager: a host request and the
/// host buffer a storage policy allocates for it, and the device bytes a
/// sync policy's reload gives back.
/// A sync policy sees one offloaded storage through offload::Transfer
/// (<offload/transfer.hpp>).

#include <algorithm>
#include <cstdint>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace offload {

/// What the manager asks a storage policy for: host memory for one
/// offloaded piece of a saved tensor's storage. The manager asks under a
/// guard of `device`, so `device` is also the current device of its type.
struct HostRequest {
  std::int64_t nbytes = 0;                   ///< bytes wanted, >= 0
  c10::Device device{c10::DeviceType::CPU};  ///< the device the saved tensor is on (type and index)
  bool pin = true;                           ///< page-locked memory wanted (Options::pin_memory)
  /// The host NUMA node nearest `device`, as its device policy says
  /// (`numa_node(index)`, device::Cuda has it), -1 when unknown. A policy
  /// that pins may place the buffer there (storage::PinnedPool does).
  int numa_node = -1;
};

/// Host memory for one offloaded piece: a 1-D CPU tensor of dtype uint8
/// with exactly `nbytes` elements, whether it is page-locked, and the host
/// bytes its allocator set aside for it.
struct HostBuffer {
  at::Tensor bytes;     ///< CPU, uint8, shape [nbytes], contiguous
  bool pinned = false;  ///< page-locked (eligible for asynchronous copies)
  /// Host bytes the allocator set aside for this buffer (its block: a
  /// caching allocator's rounding included), what Stats::host_bytes_reserved
  /// counts; 0 when the policy does not know (counted as the buffer's size).
  std::int64_t reserved = 0;
  /// Its allocator hands the memory out again only after the copies queued
  /// on it ended, even once its last reference is gone: a device's pinned
  /// host allocator that records each asynchronous copy's event (c10's
  /// CachingHostAllocator: CUDA, XPU), or pageable memory, whose copies
  /// complete before they return. A sync policy that releases a storage
  /// while its copy runs then need not keep the buffer (false: it keeps it
  /// until the copy's event completed, as for storage::PinnedPool's slabs,
  /// which it carves itself).
  bool stream_ordered = false;

  /// The bytes counted in Stats::host_bytes_reserved: `reserved`, and never
  /// less than the buffer's size.
  std::int64_t reserved_nbytes() const noexcept {
    return std::max<std::int64_t>(reserved, bytes.defined() ? bytes.numel() : 0);
  }
};

/// What a sync policy's reload() gives back: the device bytes (1-D uint8,
/// Transfer::device_nbytes() from byte 0 of the storage) and whether they
/// were copied from the host (false: the policy still had them on the
/// device, e.g. in a forward stash). The manager counts
/// Stats::tensors_reloaded and bytes_reloaded for copies.
struct Reloaded {
  at::Tensor bytes;
  bool copied = true;
};

}  // namespace offload
