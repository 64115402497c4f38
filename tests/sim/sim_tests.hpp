// SPDX-License-Identifier: MIT
#pragma once

// What the sim suites (tests/sim/test_*.cpp) share. Every test installs the
// default Config (the process shares one installation) and restores the
// runtime knobs it changes with offload::sim::ScopedKnobs.

#include <offload/sim.hpp>

#include <ATen/DeviceAccelerator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <exception>
#include <functional>
#include <string>

namespace sim_tests {

namespace sim = offload::sim;
inline constexpr auto kSim = c10::DeviceType::PrivateUse1;

/// sim:`index`, installing the default Config first.
inline c10::Device sim_device(c10::DeviceIndex index = 0) {
  sim::install();
  return {kSim, index};
}

inline c10::Stream current_stream(c10::DeviceIndex index = 0) { return at::accelerator::getCurrentStream(index); }

/// The next stream of device `index`'s pool.
inline c10::Stream pool_stream(c10::DeviceIndex index = 0) {
  return c10::impl::getDeviceGuardImpl(kSim)->getStreamFromGlobalPool({kSim, index});
}

/// What `f` throws, or "<no exception>".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

/// Same sizes, dtype and bytes.
inline bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && torch::equal(a.cpu(), b.cpu());
}

}  // namespace sim_tests
