// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// device::Sim: the simulated accelerator of the offload_sim library
/// (PrivateUse1 backend named "sim"), for tests and the CPU demo.

#include <string_view>

#include <c10/core/DeviceType.h>

#include <offload/detail/linked.hpp>
#include <offload/device/generic_ops.hpp>

namespace offload::device {

/// The `sim` backend (link offload_sim and call offload::sim::install()).
/// Real streams with worker threads, events, a counting allocator with
/// memory statistics (a memory_stats_device_policy).
struct Sim : GenericOps<c10::DeviceType::PrivateUse1> {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "sim";
  static constexpr std::string_view backend_name = "sim";  ///< PrivateUse1 name it answers to
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
  /// True when PrivateUse1 is registered under the name "sim" and its
  /// device guard is loaded. Never throws.
  static bool available() { return privateuse1_named(backend_name); }
  /// True when this program has loaded liboffload_sim (the dispatcher's
  /// errors list `sim` only then). Never throws.
  static bool linked() { return offload::detail::is_linked("sim"); }
  /// The stream host-to-device copies run on, apart from side_stream's
  /// device-to-host copies (as device::Cuda has): another stream of sim's
  /// pool.
  static c10::Stream h2d_stream(c10::DeviceIndex index) {
    return guard().getStreamFromGlobalPool(c10::Device(device_type, index), /*isHighPriority=*/true);
  }
  /// What the dispatcher's "no accelerator" error says about this policy.
  static constexpr std::string_view when_absent = "offload::sim::install() makes a sim device";
};

}  // namespace offload::device
