// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// storage::PinnedHost and storage::PageableHost: offloaded tensors live in
/// host memory, page-locked or pageable.

#include <cstdint>
#include <string_view>

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceType.h>

#include <offload/buffers.hpp>
#include <offload/options.hpp>

namespace offload::storage {

namespace detail {
inline HostBuffer host_bytes(std::int64_t nbytes, c10::Allocator* allocator, bool pinned) {
  auto bytes = at::detail::empty_generic({nbytes}, allocator, c10::DispatchKeySet(c10::DispatchKey::CPU),
                                         c10::ScalarType::Byte, std::nullopt);
  return HostBuffer{std::move(bytes), pinned};
}
}  // namespace detail

/// Pageable host memory from LibTorch's CPU allocator. Copies to and from
/// it are synchronous on every backend. Stateless.
struct PageableHost {
  static constexpr std::string_view name = "pageable_host";
  static constexpr bool prefers_pinned = false;
  /// A CPU uint8 buffer of `nbytes` bytes. Throws c10::Error when the host
  /// is out of memory.
  HostBuffer allocate(std::int64_t nbytes, c10::DeviceType /*device*/, const Options& /*options*/) {
    return detail::host_bytes(nbytes, c10::GetCPUAllocator(), false);
  }
};

/// Page-locked host memory from the accelerator's own host allocator
/// (`at::Context::getPinnedMemoryAllocator(device)`), which asynchronous
/// copies need. With Options::pin_memory false, or when the pinned
/// allocation fails, pageable memory is used (HostBuffer::pinned tells).
/// Stateless.
struct PinnedHost {
  static constexpr std::string_view name = "pinned_host";
  static constexpr bool prefers_pinned = true;
  HostBuffer allocate(std::int64_t nbytes, c10::DeviceType device, const Options& options) {
    if (!options.pin_memory) return PageableHost{}.allocate(nbytes, device, options);
    try {
      return detail::host_bytes(nbytes, at::globalContext().getPinnedMemoryAllocator(device), true);
    } catch (const c10::Error& e) {
      TORCH_WARN_ONCE("offload::storage::PinnedHost: pinned host memory is not available (", e.what_without_backtrace(),
                      "); using pageable memory (Stats::pinned_fallbacks counts it)");
      return PageableHost{}.allocate(nbytes, device, options);
    }
  }
};

}  // namespace offload::storage
