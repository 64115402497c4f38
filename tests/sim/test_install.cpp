// SPDX-License-Identifier: MIT
//
// Tests of offload::sim::install() and its Config, and of the process exit
// with work still queued.

#include "sim_tests.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

using namespace sim_tests;

TEST_CASE("sim: install validates, is idempotent and names what differs") {
  sim::install();
  // The suites run with stream-order checking on (fixture::prepare_target);
  // this case compares the knobs with the default Config.
  const sim::ScopedKnobs suite_knobs;
  sim::set_check_streams(false);
  CHECK(sim::installed());
  CHECK(sim::config() == sim::Config{});
  CHECK_NOTHROW(sim::install(sim::Config{}));

  const auto bad = [](auto&& mutate) {
    sim::Config c;
    mutate(c);
    try {
      sim::install(c);
    } catch (const c10::ValueError& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("wrong exception type: ") + e.what();
    }
    return std::string("<no exception>");
  };
  auto msg = bad([](sim::Config& c) { c.num_devices = 0; });
  CHECK(msg.find("num_devices must be in [1, 16], got 0") != std::string::npos);
  msg = bad([](sim::Config& c) { c.num_devices = 17; });
  CHECK(msg.find("num_devices must be in [1, 16], got 17") != std::string::npos);
  msg = bad([](sim::Config& c) { c.copy_latency_us = -1; });
  CHECK(msg.find("copy_latency_us must be in [0, 10000000], got -1") != std::string::npos);
  msg = bad([](sim::Config& c) { c.copy_latency_us = sim::kMaxCopyLatencyUs + 1; });
  CHECK(msg.find("copy_latency_us must be in [0, 10000000], got 10000001") != std::string::npos);
  msg = bad([](sim::Config& c) { c.copy_bandwidth_gbps = 0.0; });
  CHECK(msg.find("copy_bandwidth_gbps must be in (0, 10000], got 0") != std::string::npos);
  msg = bad([](sim::Config& c) { c.copy_bandwidth_gbps = -3.0; });
  CHECK(msg.find("copy_bandwidth_gbps must be in (0, 10000], got -3") != std::string::npos);
  msg = bad([](sim::Config& c) { c.copy_bandwidth_gbps = 2 * sim::kMaxCopyBandwidthGbps; });
  CHECK(msg.find("copy_bandwidth_gbps must be in (0, 10000], got 20000") != std::string::npos);
  msg = bad([](sim::Config& c) { c.copy_bandwidth_gbps = std::numeric_limits<double>::quiet_NaN(); });
  CHECK(msg.find("copy_bandwidth_gbps must be in (0, 10000], got nan") != std::string::npos);
  msg = bad([](sim::Config& c) { c.pinned_alloc_us = -1; });
  CHECK(msg.find("offload::sim::Config: pinned_alloc_us must be in [0, 1000000], got -1") != std::string::npos);
  msg = bad([](sim::Config& c) { c.pinned_alloc_us = sim::kMaxPinnedAllocUs + 1; });
  CHECK(msg.find("offload::sim::Config: pinned_alloc_us must be in [0, 1000000], got 1000001") != std::string::npos);
  msg = bad([](sim::Config& c) { c.capacity_bytes = -5; });
  CHECK(msg.find("capacity_bytes must be >= 0 (0 = unlimited), got -5") != std::string::npos);
  msg = bad([](sim::Config& c) { c.backend_name = "cuda"; });
  CHECK(msg.find("backend_name") != std::string::npos);
  CHECK(msg.find("'cuda'") != std::string::npos);
  msg = bad([](sim::Config& c) { c.backend_name = "Sim"; });
  CHECK(msg.find("'Sim'") != std::string::npos);

  sim::Config other;
  other.num_devices = 3;
  other.backend_name = "npu";  // a valid name: fails only because it differs
  msg = error_of([&] { sim::install(other); });
  CHECK(msg.find("backend_name: installed 'sim', requested 'npu'") != std::string::npos);
  CHECK(msg.find("num_devices: installed 2, requested 3") != std::string::npos);

  CHECK_THROWS_AS(sim::set_copy_latency_us(-1), c10::ValueError);
  CHECK_THROWS_AS(sim::set_copy_latency_us(sim::kMaxCopyLatencyUs + 1), c10::ValueError);
  CHECK(error_of([] {
          sim::set_copy_bandwidth_gbps(0.0);
        }).find("offload::sim::set_copy_bandwidth_gbps: copy_bandwidth_gbps must be in (0, 10000], got 0") !=
        std::string::npos);
  CHECK_THROWS_AS(sim::set_copy_bandwidth_gbps(-1.0), c10::ValueError);
  CHECK_THROWS_AS(sim::set_copy_bandwidth_gbps(sim::kMaxCopyBandwidthGbps * 1.5), c10::ValueError);
  CHECK_THROWS_AS(sim::set_capacity_bytes(-1), c10::ValueError);
  CHECK(error_of([] {
          sim::set_pinned_alloc_us(-1);
        }).find("offload::sim::set_pinned_alloc_us: pinned_alloc_us must be in [0, 1000000], got -1") !=
        std::string::npos);
  CHECK_THROWS_AS(sim::set_pinned_alloc_us(sim::kMaxPinnedAllocUs + 1), c10::ValueError);
  CHECK_THROWS_AS((void)sim::device_memory(2), c10::Error);
  CHECK(sim::config() == sim::Config{});  // nothing changed by the failures

  {
    sim::ScopedKnobs knobs;
    sim::set_copy_latency_us(7);
    sim::set_copy_bandwidth_gbps(0.5);
    sim::set_poison_freed(true);
    sim::set_capacity_bytes(1 << 20);
    sim::set_host_power_of_two(true);
    sim::set_pinned_alloc_us(3000);
    CHECK(sim::config().host_power_of_two);
    CHECK(sim::config().pinned_alloc_us == 3000);
    CHECK(sim::config().copy_latency_us == 7);
    CHECK(sim::config().copy_bandwidth_gbps == 0.5);
    CHECK(sim::config().poison_freed);
    CHECK_NOTHROW(sim::install());  // knobs moved; the installed Config did not
    CHECK(sim::config().capacity_bytes == (1 << 20));
  }
  CHECK(sim::config() == sim::Config{});
}

// Run only as the child process of the case below (skipped otherwise): the
// process ends while non-blocking copies wait out their link time on a stream.
TEST_CASE("sim: exit child: std::exit with copies still queued" * doctest::skip()) {
  sim::set_copy_latency_us(20'000);
  const auto x = torch::randn({10000}).to(sim_device());
  std::vector<at::Tensor> copies;
  for (int i = 0; i < 8; ++i) copies.push_back(x.to(at::kCPU, /*non_blocking=*/true));
  std::exit(3);
}

TEST_CASE("sim: a process that exits with copies in flight exits with its own status") {
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command = "'" + self + "' --no-skip --no-intro -tc='sim: exit child: *' > /dev/null 2>&1";
  for (int run = 0; run < 5; ++run) {
    CAPTURE(run);
    const int status = std::system(command.c_str());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 3);
  }
}
