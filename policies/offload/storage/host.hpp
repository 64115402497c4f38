// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// storage::PinnedHost and storage::PageableHost: offloaded tensors live in
/// host memory, page-locked or pageable; storage::pinned_block_bytes: what
/// an accelerator's pinned host allocator sets aside for a request.

#include <cstdint>
#include <string_view>

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceType.h>

#include <offload/buffers.hpp>

namespace offload::storage {

/// The host bytes the pinned host allocator of device type `type`
/// (`at::Context::getPinnedMemoryAllocator`) sets aside for a request of
/// `nbytes`: for CUDA, HIP and XPU the next power of two (c10's
/// CachingHostAllocator rounds each block so:
/// ATen/core/CachingHostAllocator.h); for a type whose backend registered
/// its rule with set_pinned_block_rule (offload::sim does at install), that
/// rule; else `nbytes` (not known). Thread-safe.
std::int64_t pinned_block_bytes(c10::DeviceType type, std::int64_t nbytes);

/// Registers how the pinned host allocator of `type` rounds a request (a
/// backend's own allocator); null restores the default. Thread-safe.
void set_pinned_block_rule(c10::DeviceType type, std::int64_t (*rule)(std::int64_t nbytes));

namespace detail {
inline HostBuffer host_bytes(std::int64_t nbytes, c10::Allocator* allocator, bool pinned, std::int64_t reserved) {
  auto bytes = at::detail::empty_generic({nbytes}, allocator, c10::DispatchKeySet(c10::DispatchKey::CPU),
                                         c10::ScalarType::Byte, std::nullopt);
  // Reused only after its copies ended: pageable copies complete before they
  // return, and a device's pinned host allocator records their events.
  return HostBuffer{std::move(bytes), pinned, reserved, /*stream_ordered=*/true};
}
}  // namespace detail

/// Pageable host memory from LibTorch's CPU allocator. Copies to and from
/// it are synchronous on every backend (its buffers are stream_ordered).
/// Stateless.
struct PageableHost {
  static constexpr std::string_view name = "pageable_host";
  static constexpr bool prefers_pinned = false;
  /// A CPU uint8 buffer of `request.nbytes` bytes (reserved: its size).
  /// Throws c10::Error when the host is out of memory.
  HostBuffer allocate(const HostRequest& request) {
    return detail::host_bytes(request.nbytes, c10::GetCPUAllocator(), false, request.nbytes);
  }
  /// `request.nbytes`.
  std::int64_t reserved_for(const HostRequest& request) const noexcept { return request.nbytes; }
};

/// Page-locked host memory from the accelerator's own host allocator
/// (`at::Context::getPinnedMemoryAllocator(device)`), which asynchronous
/// copies need; each buffer is counted at the block the allocator sets
/// aside for it (pinned_block_bytes: a power of two on CUDA). With
/// HostRequest::pin false (Options::pin_memory), or when the pinned
/// allocation fails, pageable memory is used (HostBuffer::pinned tells).
/// Its buffers are stream_ordered: the backend's pinned allocator hands a
/// block out again only after the asynchronous copies recorded on it ended
/// (c10's CachingHostAllocator records each copy's event; a backend whose
/// allocator does not is not safe for asynchronous copies to freed pinned
/// memory, and should use storage::PinnedPool). Stateless.
struct PinnedHost {
  static constexpr std::string_view name = "pinned_host";
  static constexpr bool prefers_pinned = true;
  HostBuffer allocate(const HostRequest& request) {
    if (!request.pin) return PageableHost{}.allocate(request);
    try {
      return detail::host_bytes(request.nbytes, at::globalContext().getPinnedMemoryAllocator(request.device.type()),
                                true, pinned_block_bytes(request.device.type(), request.nbytes));
    } catch (const c10::Error& e) {
      TORCH_WARN_ONCE("offload::storage::PinnedHost: pinned host memory is not available (", e.what_without_backtrace(),
                      "); using pageable memory (Stats::pinned_fallbacks counts it)");
      return PageableHost{}.allocate(request);
    }
  }
  /// The pinned block of the request (pinned_block_bytes), or its size when
  /// pinned memory is not wanted.
  std::int64_t reserved_for(const HostRequest& request) const {
    return request.pin ? pinned_block_bytes(request.device.type(), request.nbytes) : request.nbytes;
  }
};

}  // namespace offload::storage
