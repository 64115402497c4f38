// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// sync::Blocking: every copy runs on the current (compute) stream and the
/// host waits for it. Simplest, always correct, works on every device.

#include <string_view>

#include <offload/buffers.hpp>
#include <offload/concepts.hpp>
#include <offload/options.hpp>
#include <offload/transfer.hpp>

namespace offload::sync {

/// Blocking copies. Forward: the device-to-host copy of each offloaded
/// storage is finished before the pack hook returns, so its device memory
/// can be released at once. Backward: the host-to-device copy is finished
/// before the unpack hook returns. Needs nothing of the device policy but
/// its device type, and no step callback.
///
/// Thread-safety: State is called under the manager's lock.
struct Blocking {
  static constexpr std::string_view name = "blocking";
  static constexpr bool needs_events = false;

  template <device_policy Device>
  class State {
   public:
    /// Nothing is kept per storage.
    struct EntryState {};

    explicit State(const Options& /*options*/) {}

    /// Copies the storage's bytes to the host; returns when the copy is done.
    void offload(const Transfer<EntryState>& t, const at::Tensor& device_bytes) {
      t.copy_to_host(device_bytes, /*non_blocking=*/false);
    }
    /// A new device buffer holding the storage's bytes, ready to use.
    Reloaded reload(const Transfer<EntryState>& t) {
      auto bytes = t.empty_device_bytes();
      t.copy_to_device(bytes, /*non_blocking=*/false);
      return {std::move(bytes), /*copied=*/true};
    }
  };
};

}  // namespace offload::sync
