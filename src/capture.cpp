// SPDX-License-Identifier: MIT
// The capture probes of device types (offload/capture.hpp).

#include <offload/capture.hpp>

#include <array>
#include <atomic>
#include <cstddef>

namespace offload {
namespace {
std::array<std::atomic<CaptureProbe>, static_cast<std::size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
    g_probes{};

std::atomic<CaptureProbe>* slot(c10::DeviceType type) noexcept {
  const auto i = static_cast<std::size_t>(type);
  return i < g_probes.size() ? &g_probes[i] : nullptr;
}
}  // namespace

void set_capture_probe(c10::DeviceType type, CaptureProbe probe) noexcept {
  if (auto* s = slot(type)) s->store(probe, std::memory_order_release);
}

bool capturing(c10::DeviceType type, c10::DeviceIndex index) noexcept {
  const auto* s = slot(type);
  const CaptureProbe probe = s != nullptr ? s->load(std::memory_order_acquire) : nullptr;
  return probe != nullptr && probe(index);
}

}  // namespace offload
