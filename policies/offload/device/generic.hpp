// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// device::Generic: any PrivateUse1 backend, through LibTorch's
/// device-generic interfaces only; and the run-time probe every non-CUDA
/// policy uses to find out whether its backend really has streams and
/// events (the dispatcher falls back to sync::Blocking when it has not).

#include <array>
#include <cstddef>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/device/generic_ops.hpp>

namespace offload::device {

/// What probe_runtime() found out about one device type's runtime backend.
struct RuntimeSupport {
  /// The backend hands out side streams, and an event recorded on one
  /// stream can block another and be synchronized on.
  bool streams_and_events = false;
  /// Why not, when streams_and_events is false (the backend's own error
  /// message, or what is missing); empty otherwise.
  std::string reason;
};

namespace detail {

/// One probe, uncached; nullopt when the backend is not there yet (no guard
/// registered, no device, or for PrivateUse1 no backend name registered),
/// so that a later call probes again.
inline std::optional<RuntimeSupport> probe_runtime_once(c10::DeviceType type) {
  if (type == c10::DeviceType::PrivateUse1 && !c10::is_privateuse1_backend_registered()) {
    return std::nullopt;
  }
  if (!c10::impl::hasDeviceGuardImpl(type)) return std::nullopt;
  const auto* guard = c10::impl::getDeviceGuardImpl(type);
  if (guard->deviceCount() <= 0) return std::nullopt;
  try {
    const c10::Device device(type, 0);
    const c10::Stream current = guard->getStream(device);
    const c10::Stream side = guard->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
    c10::Event event(type);
    event.record(current);
    event.block(side);
    event.synchronize();
    (void)event.query();
    return RuntimeSupport{true, {}};
  } catch (const c10::Error& e) {
    return RuntimeSupport{false, e.what_without_backtrace()};
  } catch (const std::exception& e) {
    return RuntimeSupport{false, e.what()};
  }
}

}  // namespace detail

/// Finds out once per device type whether the runtime backend of `type`
/// supports what asynchronous sync policies need: a side stream from
/// getStreamFromGlobalPool, and a c10::Event recorded on device 0's
/// current stream that blocks the side stream, is synchronized and queried.
/// The probe never throws: a backend error is the answer "no", with its
/// message in RuntimeSupport::reason. The result is cached once the backend
/// is present (guard registered, at least one device, and for PrivateUse1
/// a registered backend name); before that every call probes again and
/// answers no.
///
/// Thread-safety: thread-safe; concurrent first calls may each probe.
inline RuntimeSupport probe_runtime(c10::DeviceType type) {
  static std::mutex mutex;
  static std::array<std::optional<RuntimeSupport>, c10::COMPILE_TIME_MAX_DEVICE_TYPES> cache;
  const auto slot = static_cast<std::size_t>(type);
  {
    const std::lock_guard lock(mutex);
    if (slot < cache.size() && cache[slot]) return *cache[slot];
  }
  auto found = detail::probe_runtime_once(type);
  if (!found) {
    return RuntimeSupport{false, std::string("no ") + c10::DeviceTypeName(type, /*lower_case=*/true) +
                                     " backend with a device is registered"};
  }
  const std::lock_guard lock(mutex);
  if (slot < cache.size()) cache[slot] = found;
  return *found;
}

/// Any PrivateUse1 backend, whatever its name (the dispatcher's catch-all
/// after the named policies). Claims streams and events at compile time so
/// it composes with every sync policy; runtime_has_events() tells whether
/// the backend really has them, and the dispatcher uses sync::Blocking when
/// it has not. Pinned host memory and memory statistics are used when the
/// backend provides them (storage::PinnedHost falls back to pageable
/// memory and counts it; memory_allocated() returns -1), so neither is
/// promised at compile time.
///
/// Thread-safety: every member is thread-safe (see GenericOps).
/// Errors: stream and memory members throw c10::Error when no PrivateUse1
/// backend is loaded.
struct Generic : GenericOps<c10::DeviceType::PrivateUse1> {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "generic";
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
  /// True when a PrivateUse1 backend name is registered and its device
  /// guard is loaded. Never throws.
  static bool available() {
    return c10::is_privateuse1_backend_registered() && c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1);
  }
  /// Whether the backend has streams and events at run time (probe_runtime,
  /// cached). Never throws.
  static bool runtime_has_events() { return probe_runtime(device_type).streams_and_events; }
};

}  // namespace offload::device
