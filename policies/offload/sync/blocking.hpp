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
#include <c10/core/StreamGuard.h>

#include <offload/concepts.hpp>
#include <offload/entry.hpp>
#include <offload/options.hpp>
#include <offload/testing.hpp>

namespace offload::sync {

/// Blocking copies. Forward: the device-to-host copy of each offloaded
/// storage is finished before the pack hook returns, so its device memory
/// can be released at once. Backward: the host-to-device copy is finished
/// before the unpack hook returns.
///
/// Thread-safety: State is called under the manager's lock.
struct Blocking {
  static constexpr std::string_view name = "blocking";
  static constexpr bool needs_events = false;

  template <device_policy Device, storage_policy Storage>
  class State {
   public:
    State(const Options& options, Storage& storage) : options_(options), storage_(&storage) {}

    /// Copies entry->piece of `device_bytes` (uint8 view of the storage from
    /// byte 0) to a new host buffer; returns when the copy is done.
    void offload(const std::shared_ptr<Entry>& entry, const at::Tensor& device_bytes) {
      entry->host = storage_->allocate(entry->nbytes, Device::device_type, options_);
      if constexpr (Device::has_streams) {
        if (testing::take_fault(testing::Fault::free_early)) {  // deliberate bug, tests only
          const c10::StreamGuard side(Device::side_stream(entry->device.index()));
          piece_of(entry->host, entry->piece).copy_(piece_of(device_bytes, entry->piece), /*non_blocking=*/true);
          return;  // the caller drops device_bytes while the copy may not have run
        }
      }
      piece_of(entry->host, entry->piece).copy_(piece_of(device_bytes, entry->piece), /*non_blocking=*/false);
    }
    /// A new device buffer of entry->device_nbytes holding the entry's piece
    /// where it was in the storage, ready to use.
    at::Tensor reload(const std::shared_ptr<Entry>& entry) {
      const c10::DeviceGuard guard(entry->device);
      auto bytes = at::empty({entry->device_nbytes}, at::TensorOptions().dtype(at::kByte).device(entry->device));
      if constexpr (Device::has_streams) {
        if (testing::take_fault(testing::Fault::skip_wait)) {  // deliberate bug, tests only
          const c10::StreamGuard side(Device::side_stream(entry->device.index()));
          piece_of(bytes, entry->piece).copy_(piece_of(entry->host, entry->piece), /*non_blocking=*/true);
          return bytes;  // the compute stream does not wait for this copy
        }
      }
      piece_of(bytes, entry->piece).copy_(piece_of(entry->host, entry->piece), /*non_blocking=*/false);
      return bytes;
    }
    void on_unpack(const std::shared_ptr<Entry>& /*entry*/) {}
    void release(Entry& /*entry*/) noexcept {}

   private:
    Options options_;
    Storage* storage_;
  };
};

}  // namespace offload::sync
