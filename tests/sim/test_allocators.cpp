// SPDX-License-Identifier: MIT
//
// Tests of the sim allocators: device memory counted, capped and released in
// stream order, pinned host memory counted, poisoning of freed blocks, and
// threads sharing the allocator.

#include "sim_tests.hpp"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <offload/device/sim.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace sim_tests;

TEST_CASE("sim: poison makes a prematurely freed block read as NaN") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  // Frees and races on purpose, to show what poisoning makes of it (the
  // stream-order checker would report it first: tests/sim/test_checker.cpp).
  sim::set_check_streams(false);
  sim::set_poison_freed(true);
  sim::set_copy_latency_us(100'000);
  const auto side = pool_stream();

  SUBCASE("freed while a copy on another stream still reads it") {
    auto dev = torch::ones({4096}, torch::TensorOptions().device(d));
    const auto host = torch::zeros({4096}).pin_memory();
    {
      const c10::StreamGuard guard(side);
      host.copy_(dev, /*non_blocking=*/true);
    }
    dev.reset();  // allocation stream idle: released (and poisoned) now
    side.synchronize();
    CHECK(torch::isnan(host).all().item<bool>());
  }
  SUBCASE("record_stream defers the release: correct values (control)") {
    auto dev = torch::ones({4096}, torch::TensorOptions().device(d));
    const auto host = torch::zeros({4096}).pin_memory();
    {
      const c10::StreamGuard guard(side);
      host.copy_(dev, /*non_blocking=*/true);
    }
    dev.record_stream(side);
    dev.reset();
    side.synchronize();
    CHECK(bitwise_equal(host, torch::ones({4096})));
  }
  SUBCASE("reading a fresh block before the copy into it lands") {
    const auto fresh = torch::empty({64}, torch::TensorOptions().device(d));
    CHECK(torch::isnan(fresh).all().item<bool>());
  }
}

TEST_CASE("sim: device memory is counted, capped and released in stream order") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  const auto base = sim::device_memory(0);
  const std::int64_t mib = 1 << 20;

  SUBCASE("counters return to baseline and the generic stats agree") {
    {
      const auto a = torch::empty({mib / 4}, torch::TensorOptions().device(d));  // 1 MiB
      const auto now = sim::device_memory(0);
      CHECK(now.current_bytes == base.current_bytes + mib);
      CHECK(now.allocations == base.allocations + 1);
      const auto stats = c10::getDeviceAllocator(kSim)->getDeviceStats(0);
      constexpr auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
      CHECK(stats.allocated_bytes[agg].current == now.current_bytes);
      CHECK(stats.allocated_bytes[agg].peak == now.peak_bytes);
      const auto [free_bytes, total] = c10::getDeviceAllocator(kSim)->getMemoryInfo(0);
      CHECK(free_bytes < total);
    }
    const auto after = sim::device_memory(0);
    CHECK(after.current_bytes == base.current_bytes);
    CHECK(after.frees == base.frees + 1);
    CHECK(after.peak_bytes >= base.current_bytes + mib);
    sim::reset_peak(0);
    CHECK(sim::device_memory(0).peak_bytes == base.current_bytes);
  }
  SUBCASE("above capacity: OutOfMemoryError, counters unchanged") {
    sim::set_capacity_bytes(base.current_bytes + mib);
    auto a = torch::empty({mib / 4}, torch::TensorOptions().device(d));
    const auto full = sim::device_memory(0);
    std::string msg;
    try {
      (void)torch::empty({1}, torch::TensorOptions().device(d));
    } catch (const c10::OutOfMemoryError& e) {
      msg = e.what();
    }
    CHECK(msg.find("out of memory on sim:0: tried to allocate 4 bytes") != std::string::npos);
    CHECK(msg.find("capacity " + std::to_string(base.current_bytes + mib)) != std::string::npos);
    const auto after = sim::device_memory(0);
    CHECK(after.current_bytes == full.current_bytes);
    CHECK(after.allocations == full.allocations);
    a.reset();
    CHECK_NOTHROW((void)torch::empty({mib / 4}, torch::TensorOptions().device(d)));
    CHECK(sim::device_memory(0).current_bytes == base.current_bytes);
  }
  SUBCASE("a block freed while its own stream is busy stops counting at once, reused once the stream gets there") {
    sim::set_copy_latency_us(100'000);
    const auto side = pool_stream();
    const auto host = torch::zeros({mib / 4}).pin_memory();
    const void* first = nullptr;
    {
      const c10::StreamGuard guard(side);
      auto a = torch::ones({mib / 4}, torch::TensorOptions().device(d));
      first = a.data_ptr();
      host.copy_(a, /*non_blocking=*/true);
    }  // a freed here; its stream still has the copy queued
    CHECK(sim::device_memory(0).current_bytes == base.current_bytes);  // as CUDA's allocated bytes
    {
      const auto b = torch::empty({mib / 4}, torch::TensorOptions().device(d));
      CHECK(b.data_ptr() != first);  // the copy may still read it
    }
    side.synchronize();
    CHECK(sim::device_memory(0).current_bytes == base.current_bytes);  // counted out once
    CHECK(bitwise_equal(host, torch::ones({mib / 4})));
  }
  SUBCASE("an allocation over capacity waits only for releases that lower the count") {
    sim::set_copy_latency_us(2'000'000);
    sim::set_capacity_bytes(base.current_bytes + mib);
    const auto side = pool_stream();
    const auto host = torch::zeros({mib / 4}).pin_memory();
    {
      const c10::StreamGuard guard(side);
      auto a = torch::ones({mib / 4}, torch::TensorOptions().device(d));
      host.copy_(a, /*non_blocking=*/true);
    }  // a counted out at its free; its release waits two seconds behind the copy
    const auto held = torch::empty({mib / 4}, torch::TensorOptions().device(d));  // full now
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS((void)torch::empty({1}, torch::TensorOptions().device(d)), c10::OutOfMemoryError);
    // Out of memory at once: waiting for a's release would lower nothing.
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
    side.synchronize();
  }
  SUBCASE("a block recorded on another busy stream counts until that stream gets there") {
    sim::set_copy_latency_us(100'000);
    const auto side = pool_stream();
    const auto host = torch::zeros({mib / 4}).pin_memory();
    auto a = torch::ones({mib / 4}, torch::TensorOptions().device(d));
    c10::Event filled(kSim);
    filled.record(current_stream());
    filled.block(side);
    {
      const c10::StreamGuard guard(side);
      host.copy_(a, /*non_blocking=*/true);
    }
    a.record_stream(side);
    a.reset();
    CHECK(sim::device_memory(0).current_bytes == base.current_bytes + mib);
    // Counted both ways CUDA counts: allocated drops at the free, active
    // (c10's active and requested bytes) once the recorded stream got there.
    CHECK(sim::device_memory(0).allocated_bytes == base.allocated_bytes);
    constexpr auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const auto in_limbo = c10::getDeviceAllocator(kSim)->getDeviceStats(0);
    CHECK(in_limbo.allocated_bytes[agg].current == base.allocated_bytes);
    CHECK(in_limbo.active_bytes[agg].current == base.current_bytes + mib);
    CHECK(in_limbo.requested_bytes[agg].current == base.current_bytes + mib);
    CHECK(offload::device::Sim::memory_allocated(0) == base.current_bytes + mib);  // what a target steers by
    side.synchronize();
    CHECK(sim::device_memory(0).current_bytes == base.current_bytes);
    CHECK(sim::device_memory(0).allocated_bytes == base.allocated_bytes);
    CHECK(bitwise_equal(host, torch::ones({mib / 4})));
  }
  SUBCASE("a released block is cached, reused, and returned by empty_cache") {
    sim::set_poison_freed(false);
    sim::empty_cache();
    const auto r0 = sim::device_memory(0).reserved_bytes;
    const void* first = nullptr;
    {
      const auto a = torch::empty({mib / 4}, torch::TensorOptions().device(d));
      first = a.data_ptr();
      CHECK(sim::device_memory(0).reserved_bytes == r0 + mib);
    }
    CHECK(sim::device_memory(0).current_bytes == base.current_bytes);  // in use: back
    CHECK(sim::device_memory(0).reserved_bytes == r0 + mib);           // reserved: cached
    const auto stats = c10::getDeviceAllocator(kSim)->getDeviceStats(0);
    constexpr auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    CHECK(stats.reserved_bytes[agg].current == r0 + mib);
    CHECK(stats.allocated_bytes[agg].current == base.current_bytes);
    {
      // A slightly smaller request fits the cached block (same rounded size).
      const auto b = torch::empty({mib / 4 - 100}, torch::TensorOptions().device(d));
      CHECK(b.data_ptr() == first);
      CHECK(sim::device_memory(0).reserved_bytes == r0 + mib);
      CHECK(sim::device_memory(0).current_bytes == base.current_bytes + mib - 400);
    }
    sim::empty_cache();
    CHECK(sim::device_memory(0).reserved_bytes == r0);
  }
  SUBCASE("a cached block is reused only after the work queued on its stream") {
    sim::set_poison_freed(false);
    sim::set_copy_latency_us(100'000);
    sim::empty_cache();
    const auto side = pool_stream();
    const auto host = torch::zeros({mib / 4}).pin_memory();
    const void* first = nullptr;
    {
      const c10::StreamGuard guard(side);
      auto a = torch::ones({mib / 4}, torch::TensorOptions().device(d));
      first = a.data_ptr();
      host.copy_(a, /*non_blocking=*/true);
    }  // a freed; the copy reading it is still queued on its stream
    {
      const auto b = torch::zeros({mib / 4}, torch::TensorOptions().device(d));
      CHECK(b.data_ptr() != first);
    }
    side.synchronize();
    CHECK(bitwise_equal(host, torch::ones({mib / 4})));
    const auto c1 = torch::empty({mib / 4}, torch::TensorOptions().device(d));
    const auto c2 = torch::empty({mib / 4}, torch::TensorOptions().device(d));
    CHECK((c1.data_ptr() == first || c2.data_ptr() == first));
  }
  SUBCASE("checking mode poisons a cached block when it is handed out again") {
    sim::set_poison_freed(false);
    sim::empty_cache();
    const void* first = nullptr;
    {
      const auto a = torch::ones({mib / 4}, torch::TensorOptions().device(d));
      first = a.data_ptr();
    }  // cached with its ones (no poison on release)
    sim::set_poison_freed(true);
    const auto fresh = torch::empty({mib / 4}, torch::TensorOptions().device(d));
    CHECK(fresh.data_ptr() == first);
    CHECK(torch::isnan(fresh).all().item<bool>());
  }
  SUBCASE("trace of device 0") {
    sim::set_trace(true);
    {
      const auto a = torch::empty({256}, torch::TensorOptions().device(d));
    }
    sim::set_trace(false);
    const auto trace = sim::take_trace();
    REQUIRE(trace.size() == 2);
    CHECK(trace[0].bytes == base.current_bytes + 1024);
    CHECK(trace[1].bytes == base.current_bytes);
    CHECK(trace[1].t_us >= trace[0].t_us);
    CHECK(sim::take_trace().empty());
  }
}

TEST_CASE("sim: pinned host memory is counted") {
  const auto d = sim_device();
  const auto base = sim::host_memory();
  {
    const auto p = torch::ones({1000}).pin_memory();
    CHECK(p.is_pinned());
    CHECK_FALSE(torch::ones({1000}).is_pinned());
    CHECK(sim::host_memory().current_bytes == base.current_bytes + 4000);
    if (!at::globalContext().hasCUDA()) {  // with CUDA present, factories pin with CUDA
      const auto q = torch::empty({10}, torch::TensorOptions().pinned_memory(true));
      CHECK(q.is_pinned());
      CHECK(sim::host_memory().current_bytes == base.current_bytes + 4040);
    }
    const auto dev = p.to(d);
    CHECK(bitwise_equal(dev, torch::ones({1000})));
  }
  CHECK(sim::host_memory().current_bytes == base.current_bytes);
  sim::reset_host_peak();
  CHECK(sim::host_memory().peak_bytes == base.current_bytes);

  // Released pinned blocks are cached and handed out again (poisoned in
  // checking mode); empty_cache returns them.
  sim::ScopedKnobs knobs;
  sim::set_poison_freed(true);
  sim::empty_cache();
  const auto r0 = sim::host_memory().reserved_bytes;
  const void* first = nullptr;
  {
    const auto p = torch::ones({1 << 18}).pin_memory();
    first = p.data_ptr();
  }
  CHECK(sim::host_memory().reserved_bytes == r0 + (1 << 20));
  {
    const auto q = torch::empty({1 << 18}, torch::TensorOptions().pinned_memory(true));
    if (!at::globalContext().hasCUDA()) {
      CHECK(q.data_ptr() == first);
      CHECK(torch::isnan(q).all().item<bool>());
    }
  }
  sim::empty_cache();
  CHECK(sim::host_memory().reserved_bytes == r0);
}

TEST_CASE("sim: pinned host blocks as CUDA's: power-of-two rounding and a cost per fresh block") {
  if (at::globalContext().hasCUDA()) return;  // with CUDA present, factories pin with CUDA
  sim::ScopedKnobs knobs;
  const auto pinned = [](std::int64_t n) {
    return torch::empty({n}, torch::TensorOptions().dtype(torch::kByte).pinned_memory(true));
  };
  // 3000 bytes: 3072 reserved by sim's own rounding, 4096 by a power of two.
  sim::empty_cache();
  auto r0 = sim::host_memory().reserved_bytes;
  {
    const auto p = pinned(3000);
  }
  CHECK(sim::host_memory().reserved_bytes == r0 + 3072);
  sim::set_host_power_of_two(true);
  sim::empty_cache();
  r0 = sim::host_memory().reserved_bytes;
  {
    const auto p = pinned((1 << 20) + 1);
  }
  CHECK(sim::host_memory().reserved_bytes == r0 + (2 << 20));

  // A fresh block costs the allocating thread pinned_alloc_us; one reused
  // from the cache costs nothing and takes nothing from malloc.
  sim::set_pinned_alloc_us(20'000);
  sim::empty_cache();
  const auto fresh_before = sim::host_memory().system_allocations;
  const auto t0 = std::chrono::steady_clock::now();
  {
    const auto p = pinned(5000);
  }
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(20));
  CHECK(sim::host_memory().system_allocations == fresh_before + 1);
  {
    const auto p = pinned(5000);
  }
  CHECK(sim::host_memory().system_allocations == fresh_before + 1);
  sim::empty_cache();
}

TEST_CASE("sim: threads and streams share the allocator safely") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  sim::set_copy_latency_us(200);
  const auto base = sim::device_memory(0);
  const auto src = torch::arange(4096, torch::kFloat);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      const c10::StreamGuard guard(pool_stream());
      for (int k = 0; k < 20; ++k) {
        const auto dev = (src + i).to(d, /*non_blocking=*/true);
        const auto host = torch::empty({4096}).pin_memory();
        host.copy_(dev * 2, /*non_blocking=*/true);
        current_stream().synchronize();
        if (!torch::equal(host, (src + i) * 2)) {
          ++wrong;
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  CHECK(wrong.load() == 0);
  sim::synchronize(0);
  CHECK(sim::device_memory(0).current_bytes == base.current_bytes);

  // Forward on a side stream, backward through the autograd engine's device
  // thread: the engine's stream/event synchronization goes through the guard.
  const auto cpu_x = torch::randn({16, 16});
  const auto expected_grad = [&] {
    const auto x = cpu_x.clone().requires_grad_(true);
    torch::matmul(x, x).tanh().sum().backward();
    return x.grad();
  }();
  const auto x = cpu_x.to(d).requires_grad_(true);
  {
    const c10::StreamGuard guard(pool_stream());
    torch::matmul(x, x).tanh().sum().backward();
  }
  // Backward's results are ordered before the stream current at its call,
  // not before this thread's default stream, which reads them next.
  sim::synchronize(0);
  CHECK(bitwise_equal(x.grad(), expected_grad));
}
