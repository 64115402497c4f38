// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// device::Npu: Ascend NPUs (the PrivateUse1 backend torch_npu registers
/// as "npu"), through LibTorch's device-generic interfaces only: no CANN
/// or torch_npu header is needed to compile it.

#include <string_view>

#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/device/generic.hpp>
#include <offload/device/generic_ops.hpp>

namespace offload::device {

/// The PrivateUse1 backend named "npu". torch_npu's guard has streams and
/// events and its hooks a pinned host allocator; runtime_has_events()
/// checks the streams and events of the backend actually loaded (the
/// dispatcher uses sync::Blocking when it answers no). Memory statistics
/// are read through c10::DeviceAllocator when the loaded allocator is one
/// (memory_allocated() returns -1 otherwise), so not promised.
///
/// Thread-safety: every member is thread-safe (see GenericOps).
/// Errors: stream and memory members throw c10::Error when no PrivateUse1
/// backend is loaded.
struct Npu : GenericOps<c10::DeviceType::PrivateUse1> {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "npu";
  static constexpr std::string_view backend_name = "npu";  ///< PrivateUse1 name it answers to
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
  /// True when PrivateUse1 is registered under the name "npu" and its
  /// device guard is loaded. Never throws.
  static bool available() { return privateuse1_named(backend_name); }
  /// Whether the loaded backend has streams and events (probe_runtime,
  /// cached). Never throws.
  static bool runtime_has_events() { return probe_runtime(device_type).streams_and_events; }
};

}  // namespace offload::device
