// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// device::Xpu: Intel GPUs (c10::DeviceType::XPU), through LibTorch's
/// device-generic interfaces only: no SYCL header is needed to compile it.

#include <string_view>

#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/device/generic.hpp>
#include <offload/device/generic_ops.hpp>

namespace offload::device {

/// XPU device policy. LibTorch's XPU guard has streams (a pool per device)
/// and events, its caching allocator records streams and is a
/// c10::DeviceAllocator (memory statistics), and its hooks give pinned
/// host memory. runtime_has_events() still checks the loaded backend.
///
/// Thread-safety: every member is thread-safe (see GenericOps).
/// Errors: stream and memory members throw c10::Error when LibTorch has no
/// XPU support.
struct Xpu : GenericOps<c10::DeviceType::XPU> {
  static constexpr c10::DeviceType device_type = c10::DeviceType::XPU;
  static constexpr std::string_view name = "xpu";
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
  /// True when LibTorch's XPU guard is loaded and sees at least one device.
  /// Never throws.
  static bool available() {
    return c10::impl::hasDeviceGuardImpl(device_type) && c10::impl::getDeviceGuardImpl(device_type)->deviceCount() > 0;
  }
  /// Whether the XPU runtime has streams and events (probe_runtime,
  /// cached). Never throws.
  static bool runtime_has_events() { return probe_runtime(device_type).streams_and_events; }
};

}  // namespace offload::device
