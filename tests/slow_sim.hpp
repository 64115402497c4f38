// SPDX-License-Identifier: MIT
#pragma once
// The sim fixture of the suites that race copies on purpose.

#include <cstdint>

#include <offload/sim.hpp>

namespace harness {

/// sim installed, each copy delayed by `latency_us` (1 ms unless given)
/// and freed memory poisoned, for one test case (the knobs are restored at
/// its end).
struct SlowPoisonedSim {
  explicit SlowPoisonedSim(std::int64_t latency_us = 1000) {
    offload::sim::set_copy_latency_us(latency_us);
    offload::sim::set_poison_freed(true);
  }
  bool installed = (offload::sim::install(), true);
  offload::sim::ScopedKnobs restore;
};

}  // namespace harness
