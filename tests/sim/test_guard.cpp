// SPDX-License-Identifier: MIT
//
// Tests of the sim device guard: the accelerator API, the backend name, the
// devices, the current device and stream of each thread.

#include "sim_tests.hpp"

#include <c10/core/StreamGuard.h>

#include <doctest/doctest.h>

#include <thread>

using namespace sim_tests;

TEST_CASE("sim: accelerator, backend name, devices and guard") {
  const auto dev = sim_device();
  CHECK(c10::get_privateuse1_backend() == "sim");
  REQUIRE(at::getAccelerator().has_value());
  CHECK(*at::getAccelerator() == kSim);
  CHECK(at::accelerator::deviceCount() == 2);
  CHECK(c10::Device("sim:1") == c10::Device(kSim, 1));
  CHECK(dev.str() == "sim:0");

  {
    const c10::DeviceGuard guard(c10::Device(kSim, 1));
    CHECK(at::accelerator::getDeviceIndex() == 1);
    const auto t = torch::empty({3}, torch::TensorOptions().device(kSim));  // current device
    CHECK(t.device() == c10::Device(kSim, 1));
  }
  CHECK(at::accelerator::getDeviceIndex() == 0);
  CHECK_THROWS_AS(at::accelerator::setDeviceIndex(2), c10::Error);

  // Streams: default is id 0, pool streams differ, current is per thread.
  CHECK(current_stream(0).id() == 0);
  const auto side = pool_stream(0);
  CHECK(side.id() != 0);
  CHECK(side.device() == dev);
  {
    const c10::StreamGuard guard(side);
    CHECK(current_stream(0) == side);
    CHECK(current_stream(1).id() == 0);  // per device
    c10::StreamId seen = -1;
    std::thread([&] { seen = current_stream(0).id(); }).join();
    CHECK(seen == 0);  // per thread
  }
  CHECK(current_stream(0).id() == 0);
  CHECK(side.query());
  side.synchronize();
  at::accelerator::synchronizeDevice(0);

  // The device allocator is reachable through the generic c10 interface.
  auto* allocator = c10::getDeviceAllocator(kSim);
  REQUIRE(allocator != nullptr);
  CHECK(allocator->initialized());
}

TEST_CASE("sim: tensors on sim:1 stay on sim:1") {
  const auto d1 = sim_device(1);
  const auto base1 = sim::device_memory(1);
  const auto cpu = torch::randn({5, 5});
  {
    const auto t = cpu.to(d1);
    CHECK(t.device() == d1);
    const auto r = torch::matmul(t, t) + 1;
    CHECK(r.device() == d1);
    CHECK(bitwise_equal(r, torch::matmul(cpu, cpu) + 1));
    CHECK(sim::device_memory(1).current_bytes > base1.current_bytes);
    const auto t0 = t.to(sim_device(0));
    CHECK(t0.device() == sim_device(0));
    CHECK(bitwise_equal(t0, cpu));
    const auto back = t0.to(d1, /*non_blocking=*/true);
    CHECK(back.device() == d1);
    CHECK(bitwise_equal(back, cpu));
    const auto msg = error_of([&] { (void)(t + t0); });
    CHECK(msg.find("Expected all tensors to be on the same device") != std::string::npos);
  }
  CHECK(sim::device_memory(1).current_bytes == base1.current_bytes);

  // A CPU tensor with dimensions next to a sim tensor is an error, as on CUDA;
  // a 0-dim CPU tensor is a scalar and allowed.
  const auto t = torch::ones({3}, torch::TensorOptions().device(d1));
  CHECK(error_of([&] { (void)(t + torch::ones({3})); }).find("same device") != std::string::npos);
  CHECK(bitwise_equal(t + torch::tensor(2.0f), torch::full({3}, 3.0f)));
}
