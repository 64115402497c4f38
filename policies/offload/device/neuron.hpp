// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// device::Neuron: AWS Trainium / Inferentia (the PrivateUse1 backend
/// registered as "neuron"), through LibTorch's device-generic interfaces
/// only: no Neuron SDK header is needed to compile it.

#include <string_view>

#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/device/generic.hpp>
#include <offload/device/generic_ops.hpp>

namespace offload::device {

/// The PrivateUse1 backend named "neuron". Streams and events are claimed
/// so the policy composes with every sync policy; runtime_has_events()
/// checks the loaded backend and the dispatcher uses sync::Blocking when
/// it has none. Pinned host memory and memory statistics are used when the
/// backend provides them (storage::PinnedHost falls back to pageable memory
/// and counts it; memory_allocated() returns -1), so neither is promised.
///
/// Thread-safety: every member is thread-safe (see GenericOps).
/// Errors: stream and memory members throw c10::Error when no PrivateUse1
/// backend is loaded.
struct Neuron : GenericOps<c10::DeviceType::PrivateUse1> {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "neuron";
  static constexpr std::string_view backend_name = "neuron";  ///< PrivateUse1 name it answers to
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
  /// True when PrivateUse1 is registered under the name "neuron" and its
  /// device guard is loaded. Never throws.
  static bool available() { return privateuse1_named(backend_name); }
  /// Whether the loaded backend has streams and events (probe_runtime,
  /// cached). Never throws.
  static bool runtime_has_events() { return probe_runtime(device_type).streams_and_events; }
};

}  // namespace offload::device
