// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// sync::Blocking: every copy runs on the current (compute) stream and the
/// host waits for it. Simplest, always correct, works on every device.

#include <memory>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>

#include <offload/concepts.hpp>
#include <offload/entry.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>

namespace offload::sync {

/// Blocking copies. Forward: the device-to-host copy of each offloaded
/// storage is finished before the pack hook returns, so its device memory
/// can be released at once. Backward: the host-to-device copy is finished
/// before the unpack hook returns. Needs nothing of the device policy but
/// its device type.
///
/// Thread-safety: State is called under the manager's lock.
struct Blocking {
  static constexpr std::string_view name = "blocking";
  static constexpr bool needs_events = false;

  template <device_policy Device>
  class State {
   public:
    /// Nothing is kept per entry.
    struct EntryState {};
    using Entry = offload::Entry<EntryState>;

    explicit State(const Options& /*options*/) {}

    /// Copies entry->piece of `device_bytes` (uint8 view of the storage from
    /// byte 0) into the entry's host buffer; returns when the copy is done.
    void offload(const std::shared_ptr<Entry>& entry, const at::Tensor& device_bytes) {
      piece_of(entry->host, entry->piece).copy_(piece_of(device_bytes, entry->piece), /*non_blocking=*/false);
    }
    /// A new device buffer of entry->device_nbytes holding the entry's piece
    /// where it was in the storage, ready to use.
    Reloaded reload(const std::shared_ptr<Entry>& entry) {
      const c10::DeviceGuard guard(entry->device);
      auto bytes = at::empty({entry->device_nbytes}, at::TensorOptions().dtype(at::kByte).device(entry->device));
      piece_of(bytes, entry->piece).copy_(piece_of(entry->host, entry->piece), /*non_blocking=*/false);
      return {std::move(bytes), true};
    }
    void on_unpack(const std::shared_ptr<Entry>& /*entry*/) {}
    void settle() {}
    void end_backward() {}
    void add_stats(Stats& /*stats*/) const {}
    void resume(const std::shared_ptr<Entry>& /*entry*/) {}
    void release(Entry& /*entry*/) noexcept {}
  };
};

}  // namespace offload::sync
