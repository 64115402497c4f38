// SPDX-License-Identifier: MIT
// storage::pinned_block_bytes: the rounding of each device type's pinned
// host allocator, for Stats::host_bytes_reserved and the host budget.

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>

#include <c10/core/DeviceType.h>

#include <offload/storage/host.hpp>

namespace offload::storage {

namespace {
using Rule = std::int64_t (*)(std::int64_t);

std::array<std::atomic<Rule>, static_cast<std::size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>& rules() {
  static std::array<std::atomic<Rule>, static_cast<std::size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)> r{};
  return r;
}

std::int64_t power_of_two(std::int64_t n) {
  return n <= 1 ? n : static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(n)));
}
}  // namespace

std::int64_t pinned_block_bytes(c10::DeviceType type, std::int64_t nbytes) {
  const auto index = static_cast<std::size_t>(type);
  if (index < rules().size()) {
    if (const Rule rule = rules()[index].load(std::memory_order_acquire)) return rule(nbytes);
  }
  switch (type) {
    case c10::DeviceType::CUDA:
    case c10::DeviceType::HIP:
    case c10::DeviceType::XPU:
      return power_of_two(nbytes);
    default:
      return nbytes;
  }
}

void set_pinned_block_rule(c10::DeviceType type, std::int64_t (*rule)(std::int64_t nbytes)) {
  const auto index = static_cast<std::size_t>(type);
  TORCH_CHECK_VALUE(index < rules().size(), "offload::storage::set_pinned_block_rule: type must be a device type, got ",
                    static_cast<int>(type));
  rules()[index].store(rule, std::memory_order_release);
}

}  // namespace offload::storage
