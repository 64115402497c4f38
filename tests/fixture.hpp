// SPDX-License-Identifier: MIT
#pragma once
// The shared fixture of the runtime suites on the `sim` device: its two
// device indices, and the substrate (sim installed once per process, a
// copy delay and poisoning of freed memory for one test, restored after).

#include <cstdint>

#include <c10/core/Device.h>

#include <offload/sim.hpp>

namespace fixture {

/// sim:0 and sim:1.
inline const c10::Device sim0(c10::DeviceType::PrivateUse1, 0);
inline const c10::Device sim1(c10::DeviceType::PrivateUse1, 1);

/// Installs the sim backend (once per process) and, while it lives, queues
/// every non-blocking copy with `copy_delay_us` microseconds of delay and
/// (with `poison`) fills freed device memory with NaN, so a missing wait or
/// an early free shows up as wrong numbers. Restores the knobs after.
struct Substrate {
  explicit Substrate(std::int64_t copy_delay_us, bool poison = true) {
    offload::sim::install();
    offload::sim::set_copy_delay_us(copy_delay_us);
    offload::sim::set_poison_freed(poison);
  }
  offload::sim::ScopedKnobs restore;
};

}  // namespace fixture
