// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Device primitives through LibTorch's device-generic interfaces only
/// (c10::impl::DeviceGuardImplInterface, c10::DeviceAllocator). Used by every
/// device policy that is not CUDA; no vendor SDK is needed to compile it.

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/capture.hpp>

namespace offload::device {

/// True when the PrivateUse1 backend is registered under `name` and its
/// device guard is loaded: how every policy for a named PrivateUse1
/// backend (Npu, Neuron, Sim) recognises it. Never throws.
inline bool privateuse1_named(std::string_view name) {
  return c10::is_privateuse1_backend_registered() && c10::get_privateuse1_backend() == name &&
         c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1);
}

/// Static helpers for one device type, reached through the device's
/// registered guard implementation and allocator. Policies use these as
/// building blocks: `struct Npu : GenericOps<c10::DeviceType::PrivateUse1>`.
///
/// Thread-safety: as thread-safe as the backend's guard implementation
/// (LibTorch requires guard implementations to be thread-safe).
template <c10::DeviceType Type>
struct GenericOps {
  /// The guard implementation registered for Type. Throws c10::Error when
  /// no backend registered one.
  static const c10::impl::DeviceGuardImplInterface& guard() {
    TORCH_CHECK(c10::impl::hasDeviceGuardImpl(Type), "offload: no device guard is registered for ",
                c10::DeviceTypeName(Type), "; is its backend loaded?");
    return *c10::impl::getDeviceGuardImpl(Type);
  }
  /// The current (compute) stream of device `index` on this thread.
  static c10::Stream current_stream(c10::DeviceIndex index) { return guard().getStream(c10::Device(Type, index)); }
  /// A stream from the backend's pool for side copies (not the current one
  /// when the backend has more than one stream).
  static c10::Stream side_stream(c10::DeviceIndex index) {
    return guard().getStreamFromGlobalPool(c10::Device(Type, index), /*isHighPriority=*/false);
  }
  /// Tells the allocator that `t`'s memory is used on `stream`, so it is not
  /// reused before that stream's queued work is done.
  static void record_stream(const at::Tensor& t, c10::Stream stream) {
    guard().recordDataPtrOnStream(t.storage().data_ptr(), stream);
  }
  /// Active bytes on `index` now: handed out, or freed while a stream
  /// recorded on them (record_stream) has not passed the free, the larger
  /// of the allocator's active and allocated bytes (an allocator that
  /// fills only the latter reads as such); -1 when the backend's allocator
  /// does not report statistics.
  static std::int64_t memory_allocated(c10::DeviceIndex index) { return active(index, /*peak=*/false); }
  /// The most active bytes on `index` at once since the allocator's peak
  /// was last reset, or -1 without statistics.
  static std::int64_t memory_peak(c10::DeviceIndex index) { return active(index, /*peak=*/true); }
  /// Whether the current stream of `index` is capturing a graph, by the
  /// probe the backend registered (offload::set_capture_probe); false
  /// without one.
  static bool capturing(c10::DeviceIndex index) noexcept { return offload::capturing(Type, index); }
  /// Returns cached, unused device memory to the system (no-op when the
  /// allocator does not cache).
  static void empty_cache() {
    if (auto* allocator = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(Type))) {
      allocator->emptyCache();
    }
  }

 private:
  static std::int64_t active(c10::DeviceIndex index, bool peak) {
    auto* allocator = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(Type));
    if (allocator == nullptr) return -1;
    const auto stats = allocator->getDeviceStats(index);
    constexpr auto aggregate = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const auto& active = stats.active_bytes[aggregate];
    const auto& allocated = stats.allocated_bytes[aggregate];
    return peak ? std::max(active.peak, allocated.peak) : std::max(active.current, allocated.current);
  }
};

}  // namespace offload::device
