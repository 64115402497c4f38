// SPDX-License-Identifier: MIT
//
// Simulated graph capture: which sim streams capture now
// (offload::sim::set_capturing), and the probe install() registers with
// offload::set_capture_probe, so a manager sees a sim capture as it sees a
// CUDA graph capture.

#include "internal.hpp"

#include <atomic>
#include <mutex>
#include <set>
#include <utility>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/capture.hpp>

namespace offload::sim {
namespace detail {
namespace {

std::mutex g_capture_mutex;
std::set<std::pair<c10::DeviceIndex, c10::StreamId>> g_capturing;  // guarded by g_capture_mutex
std::atomic<int> g_captures{0};                                    // its size: the probe's fast path

}  // namespace

bool capture_probe(c10::DeviceIndex index) noexcept {
  if (g_captures.load(std::memory_order_acquire) == 0) return false;
  try {
    const auto stream = guard_impl().getStream(c10::Device(c10::DeviceType::PrivateUse1, index));
    const std::lock_guard lock(g_capture_mutex);
    return g_capturing.count(std::pair{stream.device_index(), stream.id()}) != 0;
  } catch (...) {
    return false;
  }
}

}  // namespace detail

void set_capturing(c10::Stream stream, bool on) {
  (void)detail::stream_ref(stream);  // checks: installed, a sim stream of a sim device
  const std::lock_guard lock(detail::g_capture_mutex);
  const std::pair key{stream.device_index(), stream.id()};
  if (on) {
    detail::g_capturing.insert(key);
  } else {
    detail::g_capturing.erase(key);
  }
  detail::g_captures.store(static_cast<int>(detail::g_capturing.size()), std::memory_order_release);
}

}  // namespace offload::sim
