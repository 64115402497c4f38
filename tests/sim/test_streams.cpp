// SPDX-License-Identifier: MIT
//
// Tests of the sim streams and events: queued copies, stream order, waits on
// a recording.

#include "sim_tests.hpp"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include <doctest/doctest.h>

#include <chrono>
#include <thread>
#include <vector>

using namespace sim_tests;

TEST_CASE("sim: a non_blocking copy is queued on the current stream") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  // Reads a copy's destination on another stream without a wait on purpose
  // (the stream-order checker would report it: tests/sim/test_checker.cpp).
  sim::set_check_streams(false);
  const auto src = torch::arange(1000, torch::kFloat);
  const auto dev = src.to(d);
  sim::set_copy_latency_us(150'000);

  // Device to host: the host sees the destination unchanged right after the
  // call, and correct once the stream (here: an event on it) has completed.
  auto host = torch::zeros({1000}).pin_memory();
  const auto t0 = std::chrono::steady_clock::now();
  host.copy_(dev, /*non_blocking=*/true);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100));
  CHECK(bitwise_equal(host, torch::zeros({1000})));
  c10::Event done(kSim);
  done.record(current_stream());
  CHECK_FALSE(done.query());
  CHECK_FALSE(current_stream().query());
  done.synchronize();
  CHECK(done.query());
  CHECK(bitwise_equal(host, src));

  // Host to device, then a read on another stream does not wait for it (a
  // race, visible as stale data); a read on the copy's stream does.
  const auto dst = torch::zeros({1000}, torch::TensorOptions().device(d));
  const auto pinned = (src * 2).pin_memory();
  dst.copy_(pinned, /*non_blocking=*/true);
  {
    const c10::StreamGuard guard(pool_stream());
    CHECK(bitwise_equal(dst, torch::zeros({1000})));
  }
  CHECK(bitwise_equal(dst, src * 2));  // drains the current stream first

  // A blocking copy waits for what the stream has queued before it.
  host.copy_(dev * 3, /*non_blocking=*/true);
  const auto blocking = dev.cpu();
  CHECK(bitwise_equal(blocking, src));
  current_stream().synchronize();
  CHECK(bitwise_equal(host, src * 3));
}

TEST_CASE("sim: a stream blocked on an event waits for that recording") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  // Races on purpose (the negative control; the copies' destination is
  // filled on the current stream and written on the side stream without a
  // wait): the stream-order checker would report them.
  sim::set_check_streams(false);
  const auto src = torch::arange(256, torch::kFloat).pin_memory();
  const auto side = pool_stream();
  const auto main = current_stream();

  SUBCASE("without block: the main stream races ahead (negative control)") {
    const auto dst = torch::zeros({256}, torch::TensorOptions().device(d));
    sim::set_copy_latency_us(100'000);
    {
      const c10::StreamGuard guard(side);
      dst.copy_(src, /*non_blocking=*/true);
    }
    CHECK(bitwise_equal(dst, torch::zeros({256})));
    side.synchronize();
  }
  SUBCASE("with block: the main stream waits") {
    const auto dst = torch::zeros({256}, torch::TensorOptions().device(d));
    sim::set_copy_latency_us(100'000);
    c10::Event copied(kSim);
    {
      const c10::StreamGuard guard(side);
      dst.copy_(src, /*non_blocking=*/true);
      copied.record(side);
    }
    copied.block(main);
    CHECK_FALSE(main.query());
    CHECK(bitwise_equal(dst, src));
  }
  SUBCASE("a later re-record does not change what an earlier block waits for") {
    const auto dst = torch::zeros({256}, torch::TensorOptions().device(d));
    c10::Event ev(kSim);
    sim::set_copy_latency_us(20'000);
    {
      const c10::StreamGuard guard(side);
      dst.copy_(src, /*non_blocking=*/true);
      ev.record(side);
    }
    ev.block(main);
    sim::set_copy_latency_us(800'000);
    const auto host = torch::zeros({256}).pin_memory();
    {
      const c10::StreamGuard guard(side);
      host.copy_(dst, /*non_blocking=*/true);  // 0.8 s
      ev.record(side);
    }
    const auto t0 = std::chrono::steady_clock::now();
    main.synchronize();
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500));
    CHECK_FALSE(ev.query());
    ev.synchronize();
    CHECK(bitwise_equal(host, src));
  }
  SUBCASE("an event never recorded is complete") {
    c10::Event ev(kSim);
    CHECK(ev.query());
    ev.block(main);
    ev.synchronize();
  }
  SUBCASE("elapsed time between two recordings") {
    c10::Event a(kSim, c10::EventFlag::BACKEND_DEFAULT);  // "enable_timing"
    c10::Event b(kSim, c10::EventFlag::BACKEND_DEFAULT);
    a.record(main);
    sim::set_copy_latency_us(30'000);
    const auto host = torch::zeros({4}).pin_memory();
    host.copy_(torch::ones({4}, torch::TensorOptions().device(d)), /*non_blocking=*/true);
    b.record(main);
    b.synchronize();
    CHECK(a.elapsedTime(b) >= 25.0);  // milliseconds
  }
}

TEST_CASE("sim: threads waiting for a stream run its queued work in order, each task once, with its link time") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  const auto side = pool_stream();
  // 64 copies into one host buffer, each of a different value: the buffer
  // ends with the last only if they ran in queue order; each takes its
  // link time, whichever thread (the stream's worker or a waiter) runs it.
  constexpr int kCopies = 64;
  std::vector<at::Tensor> values;
  for (int i = 0; i < kCopies; ++i)
    values.push_back(torch::full({1024}, static_cast<float>(i), torch::TensorOptions().device(d)));
  const auto host = torch::zeros({1024}).pin_memory();
  c10::Event filled(kSim);
  filled.record(current_stream());
  filled.block(side);  // the side stream reads what the current one wrote
  sim::set_copy_latency_us(2'000);
  const auto t0 = std::chrono::steady_clock::now();
  {
    const c10::StreamGuard guard(side);
    for (const auto& v : values) host.copy_(v, /*non_blocking=*/true);
  }
  c10::Event done(kSim);
  done.record(side);
  std::vector<std::thread> waiters;
  for (int k = 0; k < 3; ++k) waiters.emplace_back([&, k] { k == 0 ? done.synchronize() : side.synchronize(); });
  side.synchronize();
  for (auto& w : waiters) w.join();
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(kCopies * 2));
  CHECK(done.query());
  CHECK(bitwise_equal(host, torch::full({1024}, static_cast<float>(kCopies - 1))));

  // The current stream blocked on the side stream: its next operator waits
  // for every queued copy (the waiting thread may run them itself).
  const auto dst = torch::zeros({1024}, torch::TensorOptions().device(d));
  const auto ones = torch::ones({1024}).pin_memory();
  filled.record(current_stream());
  filled.block(side);
  {
    const c10::StreamGuard guard(side);
    for (int i = 0; i < 8; ++i) dst.copy_(ones * i, /*non_blocking=*/true);
    done.record(side);
  }
  done.block(current_stream());
  CHECK(bitwise_equal(dst + 0, torch::full({1024}, 7.0F)));
}
