// SPDX-License-Identifier: MIT
//
// Tests of the sim link model: every copy between the CPU and a sim device
// takes latency + bytes / bandwidth.

#include "sim_tests.hpp"

#include <c10/core/Event.h>

#include <doctest/doctest.h>

#include <chrono>

using namespace sim_tests;

TEST_CASE("sim: every CPU<->sim copy crosses the link: latency + bytes / bandwidth, blocking or not") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  const auto src = torch::arange(1 << 18, torch::kFloat);  // 1 MiB
  const auto dev = src.to(d);
  const auto elapsed_ms = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };

  SUBCASE("a blocking copy makes the host wait for the latency") {
    sim::set_copy_latency_us(100'000);
    CHECK(elapsed_ms([&] { CHECK(bitwise_equal(dev.cpu(), src)); }) >= 100.0);
    const auto back = torch::empty({1 << 18}, torch::TensorOptions().device(d));
    CHECK(elapsed_ms([&] { back.copy_(src); }) >= 100.0);
    sim::set_copy_latency_us(0);
    CHECK(bitwise_equal(back.cpu(), src));
  }
  SUBCASE("a blocking copy makes the host wait for bytes / bandwidth") {
    sim::set_copy_latency_us(0);
    sim::set_copy_bandwidth_gbps(0.01);  // 10 MB/s: 1 MiB takes 105 ms
    CHECK(elapsed_ms([&] { (void)dev.cpu(); }) >= 100.0);
    sim::set_copy_bandwidth_gbps(0.1);                          // ten times faster: 10.5 ms
    const auto small = torch::arange(16, torch::kFloat).to(d);  // 64 bytes: 6.4 us
    CHECK(bitwise_equal(small.cpu(), torch::arange(16, torch::kFloat)));
  }
  SUBCASE("a queued copy takes its link time on its stream, and its bytes land at the end") {
    sim::set_copy_latency_us(0);
    sim::set_copy_bandwidth_gbps(0.005);  // 1 MiB takes 210 ms: wide enough for a loaded machine
    auto host = torch::zeros({1 << 18}).pin_memory();
    c10::Event done(kSim, c10::EventFlag::BACKEND_DEFAULT);
    c10::Event start(kSim, c10::EventFlag::BACKEND_DEFAULT);
    start.record(current_stream());
    CHECK(elapsed_ms([&] { host.copy_(dev, /*non_blocking=*/true); }) < 100.0);
    done.record(current_stream());
    CHECK(bitwise_equal(host, torch::zeros({1 << 18})));  // not there yet
    done.synchronize();
    CHECK(start.elapsedTime(done) >= 200.0);
    CHECK(bitwise_equal(host, src));
  }
  SUBCASE("copies within the device do not cross the link") {
    sim::set_copy_latency_us(sim::kMaxCopyLatencyUs);  // 10 s
    const auto other = torch::empty_like(dev);
    CHECK(elapsed_ms([&] {
            other.copy_(dev);
            CHECK(torch::equal(other, dev.clone()));
            CHECK(other.sum().item<double>() == src.sum().item<double>());  // a scalar read is no copy
          }) < 5000.0);
  }
}
