// SPDX-License-Identifier: MIT
// detail::Planner, the device-memory target's plan, on synthetic recorded
// steps: plain C++, no device, no autograd. The manager's behaviour under a
// target (bitwise, peaks under the target on sim) is test_target.cpp's.

#include "doctest.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include <offload/detail/planner.hpp>
#include <offload/stats.hpp>

namespace {

using offload::detail::Planner;

// One step without device-memory statistics (allocated -1): saved tensors
// of `bytes` packed in order, all eligible, then unpacked in reverse.
// Returns, per tensor, whether the planner offloaded it.
std::vector<bool> unmeasured_step(Planner& planner, const std::vector<std::int64_t>& bytes,
                                  std::string* warning = nullptr) {
  const auto w = planner.begin_step(-1, -1);
  if (warning) *warning = w;
  std::vector<offload::detail::PlanTicket> tickets;
  std::vector<bool> offloaded;
  for (const auto b : bytes) {
    const auto decision = planner.at_pack(b, /*eligible=*/true, /*allocated=*/-1);
    tickets.push_back(decision.ticket);
    offloaded.push_back(decision.offload);
  }
  planner.end_forward(-1);
  for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) planner.at_unpack(*it, -1, 0);
  planner.end_backward(-1);
  return offloaded;
}

offload::Stats stats_of(const Planner& planner) {
  offload::Stats stats;
  planner.add_stats(stats);
  return stats;
}

}  // namespace

TEST_CASE("planner: the first step offloads everything; the next keeps the latest tensors that fit the target") {
  Planner planner(/*target=*/650);
  CHECK(unmeasured_step(planner, {300, 300, 300}) == std::vector<bool>{true, true, true});
  CHECK(stats_of(planner).target_steps_planned == 0);
  // Without memory statistics the target counts the saved bytes kept: two
  // of 300 fit under 650, the earliest (needed last in backward) goes.
  CHECK(unmeasured_step(planner, {300, 300, 300}) == std::vector<bool>{true, false, false});
  const auto stats = stats_of(planner);
  CHECK(stats.target_steps_planned == 1);
  CHECK(stats.target_planned_offload_bytes == 300);
  CHECK(stats.target_min_offload_bytes == 250);  // 900 - 650: the fewest bytes that must go
  CHECK(stats.target_kept_bytes == 600);
  CHECK(stats.target_guard_offloads == 0);
}

TEST_CASE("planner: tensors that grew since the recorded step are offloaded by the guard, counted") {
  Planner planner(/*target=*/650);
  unmeasured_step(planner, {300, 300, 300});
  // A longer sequence: every tensor a third larger. The plan keeps the
  // last two, but two of 400 exceed 650: the guard offloads the first.
  CHECK(unmeasured_step(planner, {400, 400, 400}) == std::vector<bool>{true, true, false});
  CHECK(stats_of(planner).target_guard_offloads == 1);
}

TEST_CASE("planner: reset_stats() zeroes the counters and leaves the plan as it was") {
  Planner planner(/*target=*/1000);
  unmeasured_step(planner, {300, 300, 300, 300});
  unmeasured_step(planner, {300, 300, 300, 300});
  const auto headroom = planner.headroom(100);
  CHECK(headroom == 900);  // target - 2 x reserve (none without statistics) - allocated
  planner.reset_stats();
  CHECK(stats_of(planner).target_steps_planned == 0);
  CHECK(stats_of(planner).target_kept_bytes == 0);
  CHECK(planner.headroom(100) == headroom);
  CHECK(unmeasured_step(planner, {300, 300, 300, 300}) == std::vector<bool>{true, false, false, false});
}

TEST_CASE("planner: a target that cannot be met warns once with the numbers and offloads every eligible tensor") {
  Planner planner(/*target=*/1000);
  // One measured step: 2000 bytes allocated with every tensor offloaded.
  planner.begin_step(-1, 0);
  const auto a = planner.at_pack(300, true, 2000);
  planner.end_forward(2000);
  planner.at_unpack(a.ticket, 2000, 0);
  planner.end_backward(-1);
  const auto warning = planner.begin_step(-1, 0);
  CHECK(warning.find("device_target_bytes 1000 cannot be met") != std::string::npos);
  CHECK(warning.find("needed 2300 bytes") != std::string::npos);  // 2000 measured + the reserve (the largest tensor)
  CHECK(planner.at_pack(300, true, 2000).offload);
  planner.end_forward(2000);
  CHECK(planner.begin_step(-1, 0).empty());  // once per planner
  CHECK(stats_of(planner).target_planned_offload_bytes == 300);
}

TEST_CASE("planner: tensors that are not eligible are never kept nor counted") {
  Planner planner(/*target=*/10'000);
  unmeasured_step(planner, {300, 300});
  planner.begin_step(-1, -1);
  CHECK_FALSE(planner.at_pack(500, /*eligible=*/false, -1).offload);
  CHECK_FALSE(planner.at_pack(300, true, -1).offload);
  CHECK(stats_of(planner).target_kept_bytes == 300);
}
