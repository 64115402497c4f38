// SPDX-License-Identifier: MIT
#pragma once
// The shared fixture of the runtime suites on the `sim` device: its two
// device indices, and the substrate (sim installed once per process, a
// copy latency and poisoning of freed memory for one test, restored after).

#include <cstdint>

#include <c10/core/Device.h>

#include <offload/sim.hpp>

namespace fixture {

/// sim:0 and sim:1.
inline const c10::Device sim0(c10::DeviceType::PrivateUse1, 0);
inline const c10::Device sim1(c10::DeviceType::PrivateUse1, 1);

/// Installs the sim backend (once per process) and, while it lives, makes
/// every copy between host and sim cost `latency_us` microseconds on its
/// stream (plus bytes over sim's bandwidth) and (with `poison`) fills freed
/// device memory with NaN, so a missing wait or an early free shows up as
/// wrong numbers. Restores the knobs after.
struct Substrate {
  explicit Substrate(std::int64_t latency_us, bool poison = true) {
    offload::sim::install();
    offload::sim::set_copy_latency_us(latency_us);
    offload::sim::set_poison_freed(poison);
  }
  offload::sim::ScopedKnobs restore;
};

/// The substrate of the suites that race copies on purpose: 1 ms per copy
/// unless given, freed memory poisoned.
struct SlowPoisonedSim : Substrate {
  explicit SlowPoisonedSim(std::int64_t latency_us = 1000) : Substrate(latency_us) {}
};

}  // namespace fixture
