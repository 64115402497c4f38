// SPDX-License-Identifier: MIT
// detail::Planner, the device-memory target's plan, on synthetic recorded
// steps: plain C++, no device, no autograd. The manager's behaviour under a
// target (bitwise, peaks under the target on sim) is test_target.cpp's.

#include "doctest.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <offload/block_plan.hpp>
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
  planner.reset_stats();
  CHECK(stats_of(planner).target_steps_planned == 0);
  CHECK(stats_of(planner).target_kept_bytes == 0);
  CHECK(unmeasured_step(planner, {300, 300, 300, 300}) == std::vector<bool>{true, false, false, false});
}

TEST_CASE("planner: the prefetch headroom at an unpack leaves what followed that unpack in the recorded step") {
  Planner planner(/*target=*/1000);
  // Each step, both tensors offloaded: the model holds 500 more in
  // forward; backward's points are low (b unpacked at each of `b_at`),
  // but the step peaks at `peak` after them (what its operations
  // allocated).
  struct Tickets {
    offload::detail::PlanTicket a, b;
  };
  const auto forward = [&planner] {
    const auto a = planner.at_pack(100, true, 100);
    const auto b = planner.at_pack(100, true, 700);
    planner.end_forward(700);
    return Tickets{a.ticket, b.ticket};
  };
  const auto backward = [&planner](const Tickets& t, std::vector<std::int64_t> b_at, std::int64_t peak) {
    for (const auto allocated : b_at) planner.at_unpack(t.b, allocated, 0);
    planner.at_unpack(t.a, 100, 0);
    planner.end_backward(peak);
  };
  planner.begin_step(/*peak=*/0, /*allocated=*/0);
  const auto t1 = forward();
  backward(t1, {200}, 800);
  CHECK(planner.headroom(t1.b, 200) == 0);  // no plan yet
  planner.begin_step(800, 0);
  CHECK(planner.headroom(t1.b, 200) == 0);  // a ticket of the step before
  const auto t2 = forward();
  // At b's unpack 600 followed (800 - 200), more than twice the reserve
  // (800 - 700 = 100, the largest tensor): 1000 - 600 - 200.
  CHECK(planner.headroom(t2.b, 200) == 200);
  planner.reset_stats();
  CHECK(planner.headroom(t2.b, 200) == 200);  // the counters only
  CHECK(planner.headroom(t2.a, 100) == 200);  // 1000 - 700 - 100
  CHECK(planner.headroom(t2.a, -1) == 0);     // allocated memory unknown
  // The same step again, its peak (800) not above the one before (800):
  // it shows no peak of its own, and the margins learned before stay. b is
  // unpacked twice (two saved views): the larger margin counts.
  backward(t2, {200, 150}, 800);
  planner.begin_step(800, 0);
  const auto t3 = forward();
  CHECK(planner.headroom(t3.b, 200) == 200);
  CHECK(planner.headroom(t3.a, 100) == 200);
  // A step that raised the peak (to 900) teaches new margins: after b's
  // second unpack (at 150) 750 followed, the most at b.
  backward(t3, {200, 150}, 900);
  planner.begin_step(900, 0);
  const auto t4 = forward();
  CHECK(planner.headroom(t4.b, 200) == 50);   // 1000 - 750 - 200
  CHECK(planner.headroom(t4.a, 100) == 100);  // 1000 - 800 - 100
}

TEST_CASE("planner: no prefetch headroom without a recorded peak") {
  Planner planner(/*target=*/1000);
  planner.begin_step(-1, 0);  // allocated memory known, the peak not
  const auto a = planner.at_pack(100, true, 100);
  planner.end_forward(100);
  planner.at_unpack(a.ticket, 100, 0);
  planner.end_backward(-1);
  planner.begin_step(-1, 0);
  const auto a2 = planner.at_pack(100, true, 100);
  planner.end_forward(100);
  CHECK(planner.headroom(a2.ticket, 100) == 0);
}

namespace {

// One recorded step of two saved tensors of 100 in which an operation
// allocated 1800 above the observations around it: between two points the
// peak rose to 2000 while they read 100 and 200. The highest point comes
// later (1500), so the step's peak above it shows only 500.
void step_allocating_1800_between_observations(Planner& planner) {
  planner.begin_step(0, 0);
  planner.observe(100, 100);
  const auto a = planner.at_pack(100, true, 100);
  planner.observe(200, 2000);
  planner.observe(1500, 2000);
  const auto b = planner.at_pack(100, true, 1500);
  planner.end_forward(1500);
  planner.at_unpack(b.ticket, 1500, 0);
  planner.at_unpack(a.ticket, 100, 0);
  planner.end_backward(2000);
}

}  // namespace

TEST_CASE("planner: the reserve learns what an operation allocated between two observations that raised the peak") {
  Planner planner(/*target=*/10'000);
  step_allocating_1800_between_observations(planner);
  planner.begin_step(2000, 0);
  const auto a2 = planner.at_pack(100, true, 100);
  const auto b2 = planner.at_pack(100, true, 1500);
  planner.end_forward(1500);
  // Twice the reserve (1800) leaves more than the margins (500 after b's
  // unpack, 1900 after a's): 10000 - 3600 - allocated.
  CHECK(planner.headroom(b2.ticket, 200) == 10'000 - 3600 - 200);
  CHECK(planner.headroom(a2.ticket, 100) == 10'000 - 3600 - 100);
}

TEST_CASE("planner: after forget(), the next step that raises the peak measures the reserve afresh") {
  // The automatic plan's measuring step recomputes blocks: between two
  // observations a block's whole forward is allocated (here 1800), and the
  // reserve learns it. The plan then keeps or offloads those blocks, and
  // forget()s: a step that no longer allocates so much between
  // observations replaces the reserve instead of keeping the larger one
  // (which kept nothing the target had room for, and narrowed prefetch).
  Planner planner(/*target=*/10'000);
  step_allocating_1800_between_observations(planner);
  planner.begin_step(2000, 0);  // the reserve: 1800
  planner.forget();
  planner.observe(2100, 2100);
  const auto c = planner.at_pack(100, true, 2100);
  planner.end_forward(2100);
  planner.at_unpack(c.ticket, 2100, 0);
  planner.end_backward(2100);
  planner.begin_step(2100, 0);  // the reserve: the largest storage, 100
  const auto c2 = planner.at_pack(100, true, 2100);
  planner.end_forward(2100);
  CHECK(planner.headroom(c2.ticket, 200) == 10'000 - 200 - 200);
}

namespace {

// One measured step whose copies to the host lag behind compute: 1000
// bytes held throughout, three saved tensors of 300, each offloaded
// storage still allocated for its copy until forward ends (reported with
// Planner::in_flight() when `report`). Returns what the plan of the next
// step offloads.
std::vector<bool> after_lagging_copies(std::int64_t target, bool report) {
  Planner planner(target);
  planner.begin_step(0, 1000);
  std::vector<offload::detail::PlanTicket> tickets;
  for (std::int64_t i = 0; i < 3; ++i) {
    const auto allocated = 1300 + 300 * i;  // the tensor packed, and i copies in flight
    planner.observe(allocated, allocated);
    tickets.push_back(planner.at_pack(300, true, allocated).ticket);
    if (report) planner.in_flight(300 * i);
  }
  planner.end_forward(1000);
  for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) planner.at_unpack(*it, 1300, 0);
  planner.end_backward(1900);
  planner.begin_step(1900, 1000);
  std::vector<bool> offloaded;
  for (std::int64_t i = 0; i < 3; ++i) offloaded.push_back(planner.at_pack(300, true, 1300 + 300 * i).offload);
  return offloaded;
}

}  // namespace

TEST_CASE("planner: storages allocated only for their copies in flight are not counted twice when kept") {
  // Kept, the three tensors add 900 to the 1300 of each forward point,
  // under 2500 less the reserve (300, the largest tensor: the step's peak
  // is its highest point, in-flight bytes included).
  CHECK(after_lagging_copies(2500, true) == std::vector<bool>{false, false, false});
  // Unreported, the copies in flight count at the forward points and again
  // as kept: the plan would offload two of the three.
  CHECK(after_lagging_copies(2500, false) == std::vector<bool>{true, true, false});
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
  CHECK(warning.find("needs 2300 bytes") != std::string::npos);  // 2000 measured + the reserve (the largest tensor)
  CHECK(warning.find("its measured peak is unknown") != std::string::npos);  // no peak reported
  CHECK(planner.at_pack(300, true, 2000).offload);
  planner.end_forward(2000);
  CHECK(planner.begin_step(-1, 0).empty());  // once per planner
  CHECK(stats_of(planner).target_planned_offload_bytes == 300);
}

TEST_CASE("planner: no 'cannot be met' warning where the step's own measured peak met the target") {
  // The model (what was allocated at the points plus a reserve) errs high:
  // a step whose peak stayed under the target met it, whatever the model.
  // What was allocated since the step began (optimizer state) counts: the
  // next step starts that much higher.
  for (const auto& [peak, grown] : {std::pair<std::int64_t, std::int64_t>{900, 0}, {1200, 0}, {900, 300}}) {
    CAPTURE(peak);
    CAPTURE(grown);
    Planner planner(/*target=*/1000);
    planner.begin_step(100, 0);
    const auto a = planner.at_pack(300, true, 800);
    planner.end_forward(800);
    planner.at_unpack(a.ticket, 800, 0);
    planner.end_backward(peak);
    const auto warning = planner.begin_step(100 + grown, grown);
    if (peak + grown <= 1000) {
      CHECK(warning.empty());
    } else {
      CHECK(warning.find("cannot be met") != std::string::npos);
      CHECK(warning.find("its measured peak was 1200 bytes") != std::string::npos);
    }
    CHECK(planner.at_pack(300, true, 800).offload);  // offloaded either way
  }
}

TEST_CASE("planner: tensors that are not eligible are never kept nor counted") {
  Planner planner(/*target=*/10'000);
  unmeasured_step(planner, {300, 300});
  planner.begin_step(-1, -1);
  CHECK_FALSE(planner.at_pack(500, /*eligible=*/false, -1).offload);
  CHECK_FALSE(planner.at_pack(300, true, -1).offload);
  CHECK(stats_of(planner).target_kept_bytes == 300);
}

// ------------------------------------------------ the automatic plan

namespace {

using offload::BlockChoice;
using offload::BlockCost;
using offload::LinkCost;
constexpr auto K = BlockChoice::keep;
constexpr auto O = BlockChoice::offload;
constexpr auto R = BlockChoice::recompute;

// Four blocks of 1 us forward, 100 bytes saved in 2 storages, inputs 20.
std::vector<BlockCost> four_blocks() { return std::vector<BlockCost>(4, BlockCost{1000, 100, 2, 20}); }

// Four blocks as `offload-bench plan` measured them (its demo GPT at width
// 256): per block its forward and recomputation (ns) and its stretch of
// backward (bytes); each saves `saved` bytes in 16 storages, the largest
// `largest`, and takes an input of `input` bytes.
std::vector<BlockCost> measured_blocks(const std::int64_t (&forward)[4], const std::int64_t (&recompute)[4],
                                       const std::int64_t (&stretch)[4], std::int64_t saved, std::int64_t input,
                                       std::int64_t largest) {
  std::vector<BlockCost> blocks;
  for (std::size_t i = 0; i < 4; ++i) {
    BlockCost b{forward[i], saved, 16, input};
    b.backward_peak = stretch[i];
    b.recompute_ns = recompute[i];
    b.largest_storage = largest;
    blocks.push_back(b);
  }
  return blocks;
}

// Overlapping copies at `bytes_per_ns` whose backward prefetches two of
// the largest offloaded storages ahead (sync::Streamed's default).
LinkCost streamed(double bytes_per_ns) { return LinkCost{bytes_per_ns, 0, true, 2, 0}; }

}  // namespace

TEST_CASE("plan_blocks: when everything fits every block is kept and nothing costs extra") {
  const auto plan = offload::plan_blocks(four_blocks(), LinkCost{1.0, 0, true}, 50, 1000);
  CHECK(plan.choices == std::vector<BlockChoice>{K, K, K, K});
  CHECK(plan.extra_ns == 0);
  CHECK(plan.peak_bytes == 350);  // 50 + 4 x 100 less the last block's (held by the measured step)
  CHECK(plan.fits);
}

TEST_CASE("plan_blocks: a link that hides the copies offloads, a slow one recomputes") {
  // Room for two blocks' saved bytes over the base: one kept beyond the
  // last, and one block's in flight while overlapping copies run.
  // 20 ns of copies hide behind 4 us, but for the first storage backward
  // needs: nothing is prefetched before an offloaded storage is unpacked,
  // so it comes back on demand (5 ns); block 0's come back while block
  // 1's backward runs.
  const auto fast = offload::plan_blocks(four_blocks(), streamed(10.0), 50, 250);
  CHECK(fast.choices == std::vector<BlockChoice>{O, O, K, K});
  CHECK(fast.extra_ns == 5);
  CHECK(fast.peak_bytes == 250);
  // Without a prefetch window every copy back is on demand: 20 ns.
  CHECK(offload::plan_blocks(four_blocks(), LinkCost{10.0, 0, true}, 50, 250).extra_ns == 20);
  // At 0.01 bytes/ns a block's copies take 10 us against 4 us of forward,
  // and what they have not moved stays on the device: recompute. The
  // first block's input, offloaded, would come back on demand (2 us) at
  // the end of backward: the first two recomputed with their inputs kept
  // (2 us) are cheaper than the first alone with its input offloaded (3 us).
  constexpr auto RK = BlockChoice::recompute_input_kept;
  const auto slow = offload::plan_blocks(four_blocks(), streamed(0.01), 50, 250);
  CHECK(slow.choices == std::vector<BlockChoice>{RK, RK, K, K});
  CHECK(slow.extra_ns == 2000);
  // Under room for one block less: the first two recomputed cost 4 us (2
  // us recomputing, 2 us for block 1's input, which backward needs first
  // of what was offloaded: on demand; their copies in forward, each from
  // its block's beginning, end with forward); the first three recomputed with their
  // inputs kept on the device (20 bytes each) cost 3 us and move nothing.
  const auto slower = offload::plan_blocks(four_blocks(), streamed(0.01), 50, 150);
  CHECK(slower.choices == std::vector<BlockChoice>{RK, RK, RK, K});
  CHECK(slower.extra_ns == 3000);
  // Inputs of 60 bytes leave no room to keep them: offloaded.
  auto wide_inputs = four_blocks();
  for (auto& b : wide_inputs) b.input_bytes = 60;
  CHECK(offload::plan_blocks(wide_inputs, LinkCost{0.01, 0, true}, 50, 150).choices ==
        std::vector<BlockChoice>{R, R, K, K});
}

TEST_CASE("plan_blocks: what backward needs first of the offloaded comes back on demand, behind kept blocks") {
  // One storage per block, at 0.05 bytes/ns: 2 us a block, room for two
  // blocks fewer. Offloading blocks 0 and 1 costs 0.5 us in forward (each
  // block's copy from its middle: block 1's runs past forward's end) and 2
  // us in backward: blocks 3 and 2 are
  // kept, so nothing is unpacked that would prefetch block 1's, and it
  // waits for its copy (block 0's comes back while block 1's backward
  // runs). Recomputing block 0 costs 1 us and its input's copy back, on
  // demand too, 0.4 us: cheapest. (Were every copy back started at
  // backward's beginning, both would cost 1 us.)
  auto blocks = four_blocks();
  for (auto& b : blocks) b.saved_storages = 1;
  const auto plan = offload::plan_blocks(blocks, streamed(0.05), 50, 250);
  CHECK(plan.choices == std::vector<BlockChoice>{R, K, K, K});
  CHECK(plan.extra_ns == 1400);
}

TEST_CASE("plan_blocks: an offloaded block's copies run beside its own forward") {
  // What `offload-bench plan` measured at R = 1 (rounded): four blocks of
  // 30 ms saving 18.9 MB in 16 storages, a 0.51 GB/s link (37 ms a
  // block), room for three blocks offloaded and one kept. A block's
  // copies start as it saves, not at its end: offloading blocks 0-2 hides
  // all but 35 ms. Counted from each block's end, they came to 46 ms, and
  // recomputing block 2 instead (43 ms) was chosen, which ran slower.
  const std::int64_t forward[4] = {30'000'000, 30'000'000, 30'000'000, 30'000'000};
  const std::int64_t recompute[4] = {23'000'000, 23'000'000, 23'000'000, 23'000'000};
  const std::int64_t stretch[4] = {47'700'000, 45'600'000, 43'400'000, 40'300'000};
  const auto blocks = measured_blocks(forward, recompute, stretch, 18'900'000, 1'000'000, 4'200'000);
  const offload::OutsideCost head{{9'000, 0, 0, 0, 2'400'000}, {2, 0, 0, 0, 6}};
  const auto plan =
      offload::plan_blocks(blocks, LinkCost{0.51, 40'000, true, 2, 0, 5}, 73'500'000, 85'300'000, 61'800'000, head);
  CHECK(plan.choices == std::vector<BlockChoice>{O, O, O, K});
  CHECK(plan.fits);
  CHECK(plan.extra_ns < 36'000'000);
}

TEST_CASE("plan_blocks: extra times a rounding apart are the same time: the choice moving less wins") {
  // What `offload-bench plan` measured at R = 0.25 (one survey run): every
  // copy hides but the first storage backward needs, so offloading block 3
  // too costs the same time, 4.7e-9 ns less when summed in its order;
  // that took it over keeping block 3, for 18.9 MB more moved each way.
  const std::int64_t forward[4] = {54'436'575, 47'084'195, 42'112'418, 40'184'221};
  const std::int64_t recompute[4] = {29'991'662, 30'460'917, 32'904'300, 44'058'546};
  const std::int64_t stretch[4] = {47'670'792, 45'560'328, 43'440'648, 40'281'608};
  const auto blocks = measured_blocks(forward, recompute, stretch, 18'907'136, 1'048'576, 4'194'304);
  const offload::OutsideCost head{{9'216, 0, 0, 0, 2'375'680}, {2, 0, 0, 0, 6}};
  const auto plan =
      offload::plan_blocks(blocks, LinkCost{2.0786, 77'014, true, 2, 0, 5}, 73'472'008, 85'281'032, 61'804'288, head);
  CHECK(plan.choices == std::vector<BlockChoice>{O, O, O, K});
}

TEST_CASE("plan_blocks: a block offloading more storages than the forward stash holds waits for the link") {
  // 20 storages a block, 1.25 us of copies against 1 us of forward. With
  // no limit on copies in flight, offloading blocks 0 and 1 hides all but
  // block 1's first storage in backward (62 ns, on demand). With a forward
  // stash of one storage, compute waits until all but the last storage of
  // a block is copied: block 0 ends at 1.19 us, block 1 (whose copies
  // start when block 0's copies end, at 1.25 us) at 2.44 us: 0.44 us more.
  auto blocks = four_blocks();
  for (auto& b : blocks) b.saved_storages = 20;
  const auto free_running = offload::plan_blocks(blocks, LinkCost{0.08, 0, true, 2, 0, 0}, 50, 250);
  CHECK(free_running.choices == std::vector<BlockChoice>{O, O, K, K});
  CHECK(free_running.extra_ns == 62);
  const auto stashed = offload::plan_blocks(blocks, LinkCost{0.08, 0, true, 2, 0, 1}, 50, 250);
  CHECK(stashed.choices == std::vector<BlockChoice>{O, O, K, K});
  CHECK(stashed.extra_ns == 500);
  // A stash as large as a block's storages never waits.
  CHECK(offload::plan_blocks(blocks, LinkCost{0.08, 0, true, 2, 0, 20}, 50, 250).extra_ns == 62);
}

TEST_CASE("plan_blocks: a tighter forward stash is never predicted faster") {
  // 20 storages a block, links from a little faster than compute to half
  // its pace; the stash from one storage to unlimited (0). The stall
  // only adds time: a block that waits for the link ends later, and what
  // is still copying delays backward as without a stash. (Were the link
  // counted from the block's beginning only where it stalls, a stash that
  // stalls 45 ns would hide 1 us of copies counted from the block's end
  // without one.)
  auto blocks = four_blocks();
  for (auto& b : blocks) b.saved_storages = 20;
  for (const double ns_per_block : {900.0, 1050.0, 1100.0, 1300.0, 2000.0}) {
    for (const std::int64_t limit : {250, 150}) {
      std::int64_t looser = -1;  // the prediction with the next larger stash
      for (const std::int64_t stash : {0, 20, 19, 10, 5, 2, 1}) {
        const LinkCost link{100.0 / ns_per_block, 0, true, 2, 0, stash};
        const auto extra = offload::plan_blocks(blocks, link, 50, limit).extra_ns;
        CAPTURE(ns_per_block);
        CAPTURE(limit);
        CAPTURE(stash);
        CHECK(extra >= looser);
        looser = extra;
      }
    }
  }
}

TEST_CASE("plan_blocks: the forward stash is one queue across blocks") {
  // Block 0 offloads 20 storages of 100 ns of link time each over 1 us of
  // forward; block 1 two of 1 us each over 0.1 us; blocks 2 and 3 (3 us,
  // 1000 bytes each) are kept: anything else that fits under 1150 bytes
  // costs more (recomputing or moving a 3 us, 1000-byte block).
  // Without a stash forward hides every copy and backward waits 1.9 us
  // (block 1's first storage on demand, 1 us; its second, 0.8 us; block
  // 0's first, 0.1 us).
  const std::vector<BlockCost> blocks{
      {1000, 100, 20, 1000}, {100, 100, 2, 1000}, {3000, 1000, 20, 1000}, {3000, 1000, 20, 1000}};
  const auto free_running = offload::plan_blocks(blocks, LinkCost{0.05, 0, true, 2, 0, 0}, 50, 1150);
  CHECK(free_running.choices == std::vector<BlockChoice>{O, O, K, K});
  CHECK(free_running.extra_ns == 1900);
  // A stash of 4: block 0 ends when all but 4 of its storages are copied
  // (1.6 us: 0.6 us more); block 1 saves only two, yet at its end (1.7
  // us) three of block 0's are still copying: it waits 0.1 us more, until
  // no more than 4 are in flight. (Counted per block, it would not wait.)
  const auto stashed = offload::plan_blocks(blocks, LinkCost{0.05, 0, true, 2, 0, 4}, 50, 1150);
  CHECK(stashed.choices == std::vector<BlockChoice>{O, O, K, K});
  CHECK(stashed.extra_ns == 1900 + 600 + 100);
}

TEST_CASE("plan_blocks: copies that do not overlap cost their link time twice (forward and backward)") {
  const auto plan = offload::plan_blocks(four_blocks(), LinkCost{10.0, 5, false}, 50, 150);
  // Offloading two blocks: 2 x (2 x 5 ns + 100 / 10) = 40 ns each way.
  CHECK(plan.choices == std::vector<BlockChoice>{O, O, K, K});
  CHECK(plan.extra_ns == 80);
}

TEST_CASE("plan_blocks: a limit below the base recomputes every block and says it does not fit") {
  const auto plan = offload::plan_blocks(four_blocks(), LinkCost{10.0, 0, true}, 500, 400);
  CHECK(plan.choices == std::vector<BlockChoice>{R, R, R, R});
  CHECK_FALSE(plan.fits);
  // No link measured: offloading is never chosen.
  const auto no_link = offload::plan_blocks(four_blocks(), LinkCost{0.0, 0, true}, 50, 150);
  CHECK(no_link.choices == std::vector<BlockChoice>{R, R, K, K});
}

TEST_CASE("plan_blocks: where each block's backward stretch was measured, kept blocks count from there") {
  // Gradients grow as backward reaches earlier blocks: block 0's stretch
  // of the measuring step peaked at 230 bytes, block 3's at 200; 150 in
  // forward.
  auto blocks = four_blocks();
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].backward_peak = 230 - 10 * static_cast<int>(i);
  // Keeping blocks 2 and 3: block 3's backward holds block 2's tensors too
  // (200 + 100); block 0's stays 230; forward 150 + 100.
  const auto plan = offload::plan_blocks(blocks, LinkCost{0.0, 0, true}, 230, 300, 150);
  CHECK(plan.choices == std::vector<BlockChoice>{R, R, K, K});
  CHECK(plan.peak_bytes == 300);
  // Everything kept: block 3's stretch holds the three blocks before it.
  const auto all = offload::plan_blocks(blocks, LinkCost{0.0, 0, true}, 230, 1000, 150);
  CHECK(all.choices == std::vector<BlockChoice>{K, K, K, K});
  CHECK(all.peak_bytes == 500);
  // With a prefetch window of two inputs (prefetch_depth 2), each measured
  // stretch held the two inputs before its block, brought back ahead of
  // need; kept blocks are not brought back: 40 bytes less at block 3.
  CHECK(offload::plan_blocks(blocks, LinkCost{0.0, 0, true, 2, 0}, 230, 1000, 150).peak_bytes == 460);
  // A block whose stretch was not measured: the step's peak stands for
  // every block's (230 + the kept blocks less the last), one block fewer
  // kept.
  blocks[1].backward_peak = -1;
  const auto unmeasured = offload::plan_blocks(blocks, LinkCost{0.0, 0, true}, 230, 300, 150);
  CHECK(unmeasured.choices == std::vector<BlockChoice>{R, R, R, K});
  CHECK(unmeasured.peak_bytes == 230);
  CHECK(unmeasured.extra_ns == 3000);
  // A measured recomputation quicker than the first forward is the
  // block's time: 600 ns, not 1 us; a slower one is not (its forward ran
  // the same computation in 1 us).
  for (auto& b : blocks) b.recompute_ns = 600;
  CHECK(offload::plan_blocks(blocks, LinkCost{0.0, 0, true}, 230, 300, 150).extra_ns == 1800);
  for (auto& b : blocks) b.recompute_ns = 1500;
  CHECK(offload::plan_blocks(blocks, LinkCost{0.0, 0, true}, 230, 300, 150).extra_ns == 3000);
}

TEST_CASE("plan_blocks: where what ran after the last block raised the peak, it holds every kept block") {
  // Four blocks saving 100 bytes each; the measuring step (every block
  // recomputed) peaked at 230 after the last block (an output head), where
  // no block's tensors were held; every block's stretch read that running
  // peak.
  auto blocks = four_blocks();
  for (auto& b : blocks) b.backward_peak = 230;
  offload::OutsideCost outside;
  outside.after_blocks_peak = 230;
  // Everything kept: the head holds the four blocks (230 + 400), not three
  // (block 3's stretch counts the blocks before it: 230 + 300).
  const auto all = offload::plan_blocks(blocks, LinkCost{0.0, 0, true}, 230, 1000, 150, outside);
  CHECK(all.choices == std::vector<BlockChoice>{K, K, K, K});
  CHECK(all.peak_bytes == 630);
  CHECK(offload::plan_blocks(blocks, LinkCost{0.0, 0, true}, 230, 1000, 150).peak_bytes == 530);
  // Under 600 only three blocks fit there (230 + 300).
  const auto three = offload::plan_blocks(blocks, LinkCost{0.0, 0, true}, 230, 600, 150, outside);
  CHECK(three.choices == std::vector<BlockChoice>{R, K, K, K});
  CHECK(three.peak_bytes == 530);
  // Offloading over overlapping copies: the copies still in flight as
  // forward ends (at least the largest offloaded block's 100 bytes) are
  // held there too, so offloading one block (230 + 300 + 100) does not fit
  // under 600; two do (230 + 200 + 100).
  const auto offloaded = offload::plan_blocks(blocks, streamed(10.0), 230, 600, 150, outside);
  CHECK(offloaded.choices == std::vector<BlockChoice>{O, O, K, K});
  CHECK(offloaded.peak_bytes == 530);
}

TEST_CASE("plan_blocks: what is saved outside blocks is kept where it fits, else its copies are counted") {
  // 200 bytes saved after the last block (an output head's), in one storage.
  const offload::OutsideCost head{{0, 0, 0, 0, 200}, {0, 0, 0, 0, 1}};
  // Room for all of it: every block and the head kept, nothing moved.
  const auto roomy = offload::plan_blocks(four_blocks(), LinkCost{10.0, 0, true}, 50, 1000, -1, head);
  CHECK(roomy.choices == std::vector<BlockChoice>{K, K, K, K});
  CHECK(roomy.outside_kept);
  CHECK(roomy.extra_ns == 0);
  CHECK(roomy.peak_bytes == 550);  // 350 + the head's 200
  // Under 400 the head stays while the first three blocks are offloaded:
  // their copies hide behind the blocks after them (but for block 2's
  // first storage, which backward brings back on demand: 5 ns), the
  // head's would not.
  const auto tight = offload::plan_blocks(four_blocks(), streamed(10.0), 50, 400, -1, head);
  CHECK(tight.choices == std::vector<BlockChoice>{O, O, O, K});
  CHECK(tight.outside_kept);
  CHECK(tight.extra_ns == 5);
  // A head of 400 bytes never fits: offloaded, its copy runs after forward
  // with nothing left to hide behind (40 ns) and comes back before
  // backward can begin (40 ns).
  const offload::OutsideCost big_head{{0, 0, 0, 0, 400}, {0, 0, 0, 0, 1}};
  const auto offloaded = offload::plan_blocks(four_blocks(), LinkCost{10.0, 0, true}, 50, 400, -1, big_head);
  CHECK(offloaded.choices == std::vector<BlockChoice>{K, K, K, K});
  CHECK_FALSE(offloaded.outside_kept);
  CHECK(offloaded.extra_ns == 80);
  CHECK(offloaded.peak_bytes == 350);
  // Over a slow link (0.01 bytes/ns: 20 us each way) two recomputed blocks
  // are cheaper, and the head stays.
  const auto slow = offload::plan_blocks(four_blocks(), LinkCost{0.01, 0, true}, 50, 400, -1, head);
  CHECK(slow.outside_kept);
  CHECK(slow.choices ==
        std::vector<BlockChoice>{BlockChoice::recompute_input_kept, BlockChoice::recompute_input_kept, K, K});
  CHECK(slow.extra_ns == 2000);
  // Saved before the first block (an embedding's), it counts in every
  // block's backward too: 20 bytes more on each measured stretch.
  auto blocks = four_blocks();
  for (auto& b : blocks) b.backward_peak = 230;
  const offload::OutsideCost embedding{{20, 0, 0, 0, 0}, {1, 0, 0, 0, 0}};
  const auto early = offload::plan_blocks(blocks, LinkCost{10.0, 0, true}, 230, 1000, 150, embedding);
  CHECK(early.outside_kept);
  CHECK(early.peak_bytes == 530 + 20);  // block 3's stretch with the three kept before it
}

TEST_CASE(
    "plan_blocks: offloaded blocks come back ahead of need by the prefetch window, sized by their largest storage") {
  // Four storages per block, the largest 30 bytes; a window of one storage
  // (prefetch_depth 1). Offloading blocks 0 and 1 brings 30 bytes back
  // ahead of block 3's backward: 200 - 20 (the measuring step's input) +
  // 100 (block 2 kept) + 30 = 310, under forward's 350.
  auto blocks = four_blocks();
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].backward_peak = 230 - 10 * static_cast<int>(i);
    blocks[i].saved_storages = 4;
    blocks[i].largest_storage = 30;
  }
  const LinkCost link{10.0, 0, true, 1, 0};
  const auto plan = offload::plan_blocks(blocks, link, 230, 360, 150);
  CHECK(plan.choices == std::vector<BlockChoice>{O, O, K, K});
  CHECK(plan.peak_bytes == 350);
  CHECK(plan.extra_ns == 2);  // block 1's first storage on demand (10 ns in 4 copies); the rest hide
  // A window smaller than one storage still brings one back: the same.
  const auto small_window = offload::plan_blocks(blocks, LinkCost{10.0, 0, true, 0, 5}, 230, 360, 150);
  CHECK(small_window.choices == std::vector<BlockChoice>{O, O, K, K});
  CHECK(small_window.peak_bytes == 350);
  // Storages not measured: a block counts as one, and the window holds a
  // whole block (380 at block 3): one more block is offloaded.
  for (auto& b : blocks) b.largest_storage = -1;
  CHECK(offload::plan_blocks(blocks, link, 230, 360, 150).choices == std::vector<BlockChoice>{O, O, O, K});
}

TEST_CASE("BlockPlanner: measures the first step, plans the next, measures again after other input sizes") {
  offload::BlockPlanner planner(/*target=*/1000, /*overlaps=*/true);
  CHECK_FALSE(planner.begin_step(-1));
  for (int i = 0; i < 3; ++i) {
    const auto turn = planner.next_block(20);
    CHECK(turn.index == i);
    CHECK(turn.choice == R);
    CHECK(turn.measure);
    CHECK(turn.probe_link == (i == 0));
    planner.measured(turn.index, BlockCost{1000, 100, 2, 20});
  }
  planner.link_measured(400, 400, 100, 100);  // 1 byte/ns, no latency
  // Recomputing everything needed 300 bytes: all three blocks fit kept.
  CHECK(planner.begin_step(300));  // the choices changed
  for (int i = 0; i < 3; ++i) CHECK(planner.next_block(20).choice == K);
  offload::Stats stats;
  planner.add_stats(stats);
  CHECK(stats.blocks_kept == 3);
  CHECK(stats.blocks_recomputed == 0);
  CHECK_FALSE(planner.begin_step(300));  // same choices
  // Another input size: recomputed from there on, and the next step measures.
  CHECK(planner.next_block(40).choice == R);
  CHECK(planner.next_block(20).choice == R);
  CHECK(planner.begin_step(300));
  const auto turn = planner.next_block(40);
  CHECK(turn.measure);
  CHECK(turn.choice == R);
}

TEST_CASE("BlockPlanner: records each block's stretch of backward, and plans from it") {
  std::int64_t peak = 0;
  offload::BlockPlanner planner(/*target=*/305, /*overlaps=*/true,
                                [&](int device) { return device == 0 ? peak : std::int64_t{-1}; });
  planner.begin_step(-1, 10);
  for (int i = 0; i < 2; ++i) planner.measured(planner.next_block(20).index, BlockCost{1000, 100, 2, 20});
  planner.end_forward(50);
  // Backward, last block first: the device's peak when block 0's
  // recomputation begins closes block 1's stretch; the step's peak (at the
  // next begin) closes block 0's.
  peak = 120;
  planner.recomputing(1, 0);
  peak = 170;
  planner.recomputing(5, 0);  // no such block: ignored
  planner.recomputing(0, 0);
  planner.recomputed(0, 700);
  // The next step begins with 30 more bytes allocated (optimizer state) and
  // the step's peak, 210 with them.
  CHECK(planner.begin_step(210, 40));
  const auto summary = planner.summary();
  CHECK(summary.find("block 0: forward 1000 ns, saves 100 B in 2 storages, input 20 B, backward peak 180 B, "
                     "recomputed in 700 ns") != std::string::npos);
  CHECK(summary.find("block 1: forward 1000 ns, saves 100 B in 2 storages, input 20 B, backward peak 170 B, "
                     "recomputed in -1 ns") != std::string::npos);
  // Both kept: block 1's stretch holds block 0's tensors too (170 + 30 +
  // 100 = 300), under 305; from the step's peak alone (210 + 2 x 100, less
  // the last kept block's = 310) they would not fit.
  CHECK(planner.next_block(20).choice == K);
  CHECK(planner.next_block(20).choice == K);
  // Planned steps do not record.
  peak = 500;
  planner.recomputing(0, 0);
  planner.recomputing(1, 0);
  CHECK(planner.summary().find("backward peak 170 B") != std::string::npos);
}

TEST_CASE("BlockPlanner: measures where what runs after the last block raises the peak, and plans for it") {
  std::int64_t peak = 0;
  offload::BlockPlanner planner(/*target=*/290, /*overlaps=*/true,
                                [&](int device) { return device == 0 ? peak : std::int64_t{-1}; });
  planner.begin_step(-1, 10);
  for (int i = 0; i < 2; ++i) {
    peak = 40 + 10 * i;
    planner.measured(planner.next_block(20, 0).index, BlockCost{1000, 100, 2, 20});
    planner.block_done();  // the device's peak here: 50 after the last block
  }
  planner.end_forward(40);
  // The output head's forward and backward raise the peak to 120 before
  // block 1's recomputation; block 0's raises it no further.
  peak = 120;
  planner.recomputing(1, 0);
  planner.recomputing(0, 0);
  CHECK(planner.begin_step(120, 10));
  CHECK(planner.summary().find("after the last block the device peaked at 120 B") != std::string::npos);
  // Both kept would hold 120 + 200 there, over 290; one kept, 220. Without
  // the head's measure, block 1's stretch (120 + the 100 of block 0) would
  // have let both be kept.
  CHECK(planner.next_block(20, 0).choice == R);
  CHECK(planner.next_block(20, 0).choice == K);
  CHECK(planner.summary().find("predicted peak 220 B") != std::string::npos);
  // Peak statistics not reset since an earlier, higher peak (500): forward
  // never rises above it, the head does, and is measured all the same.
  peak = 500;
  offload::BlockPlanner unreset(/*target=*/2000, /*overlaps=*/true,
                                [&](int device) { return device == 0 ? peak : std::int64_t{-1}; });
  unreset.begin_step(-1, 10, 500);
  for (int i = 0; i < 2; ++i) {
    unreset.measured(unreset.next_block(20, 0).index, BlockCost{1000, 100, 2, 20});
    unreset.block_done();
  }
  peak = 600;
  unreset.recomputing(1, 0);
  unreset.recomputing(0, 0);
  unreset.begin_step(600, 10);
  CHECK(unreset.summary().find("after the last block the device peaked at 600 B") != std::string::npos);
}

TEST_CASE("BlockPlanner: counts what is saved outside blocks while measuring, and keeps it where the plan says") {
  offload::BlockPlanner planner(/*target=*/1000, /*overlaps=*/true);
  CHECK_FALSE(planner.outside_block());  // no step yet
  planner.begin_step(-1);
  CHECK(planner.outside_block());
  planner.saved_outside(10);  // before the first block
  for (int i = 0; i < 2; ++i) {
    const auto turn = planner.next_block(20);
    CHECK_FALSE(planner.outside_block());
    planner.saved_outside(99);  // inside a block: not counted
    planner.measured(turn.index, BlockCost{1000, 100, 2, 20});
    planner.block_done();
  }
  planner.saved_outside(30);  // after the last
  planner.saved_outside(30);
  CHECK_FALSE(planner.keeps_outside());  // a measuring step offloads it
  planner.link_measured(400, 400, 100, 100);
  CHECK(planner.begin_step(300));
  const auto summary = planner.summary();
  CHECK_MESSAGE(summary.find("outside blocks: 70 B in 10 B (1), 0 B (0), 60 B (2): keep") != std::string::npos,
                summary);
  CHECK(planner.keeps_outside());
  (void)planner.next_block(20);
  CHECK_FALSE(planner.keeps_outside());  // inside a block: the block's choice
  planner.saved_outside(500);            // planned steps do not count
  planner.block_done();
  CHECK(planner.keeps_outside());
  (void)planner.next_block(20);
  planner.block_done();
  CHECK_FALSE(planner.begin_step(300));  // the same choices, the outside kept again
  CHECK(planner.summary() == summary);
}

TEST_CASE("BlockPlanner: a step that ran its plan lowers the base of the predicted step time") {
  // The measuring step ran cold (here: 300 ms asleep); the planned step
  // after it did not. Its time less the plan's predicted extra becomes the
  // base, so the prediction no longer carries the cold step.
  offload::BlockPlanner planner(/*target=*/1000, /*overlaps=*/true);
  planner.begin_step(-1);
  for (int i = 0; i < 3; ++i) planner.measured(planner.next_block(20).index, BlockCost{1000, 100, 2, 20});
  planner.link_measured(400, 400, 100, 100);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  planner.begin_step(300);  // all kept
  offload::Stats cold;
  planner.add_stats(cold);
  CHECK(cold.plan_predicted_step_us >= 250'000);
  for (int i = 0; i < 3; ++i) CHECK(planner.next_block(20).choice == K);
  planner.begin_step(300);
  offload::Stats warm;
  planner.add_stats(warm);
  CHECK(warm.plan_predicted_step_us < 250'000);
  CHECK(warm.plan_predicted_step_us <= warm.plan_measured_step_us);
}

TEST_CASE("BlockPlanner: a step whose first block finds more allocated than the measuring step's re-plans at once") {
  // Optimizer state made after the measuring step ended (a scope without
  // planned blocks opened between backward and the optimizer's step ends
  // it early, before the state exists): the plan never counted it.
  std::int64_t allocated = 10;
  offload::BlockPlanner planner(/*target=*/1000, /*overlaps=*/true, {}, 0, 0, 0, [&](int) { return allocated; });
  planner.begin_step(-1, 10);
  for (int i = 0; i < 3; ++i) planner.measured(planner.next_block(20, 0).index, BlockCost{1000, 100, 2, 20});
  planner.link_measured(400, 400, 100, 100);
  CHECK(planner.begin_step(300, 10));  // every block kept: 300 + 2 x 100
  for (int i = 0; i < 3; ++i) CHECK(planner.next_block(20, 0).choice == K);
  CHECK_FALSE(planner.begin_step(500, 10));
  allocated = 615;  // 605 more at the first block: 905 + 2 x 100 would cross 1000
  std::vector<BlockChoice> choices;
  for (int i = 0; i < 3; ++i) choices.push_back(planner.next_block(20, 0).choice);
  // With 605 more: recomputing the first two with their inputs kept (905
  // + 2 x 20) fits, keeping two (905 + 100 + 20) does not.
  constexpr auto RK = BlockChoice::recompute_input_kept;
  CHECK(choices == std::vector<BlockChoice>{RK, RK, K});
  CHECK(planner.summary().find("correction 605 B") != std::string::npos);
  CHECK(planner.take_warning().empty());
  // Counted once: the next step with as much allocated plans the same.
  CHECK_FALSE(planner.begin_step(900, 10));
  choices.clear();
  for (int i = 0; i < 3; ++i) choices.push_back(planner.next_block(20, 0).choice);
  CHECK(choices == std::vector<BlockChoice>{RK, RK, K});
  CHECK(planner.summary().find("correction 605 B") != std::string::npos);
  // Within 1 % of the target (noise): nothing changes.
  allocated = 620;
  CHECK_FALSE(planner.begin_step(900, 10));
  CHECK(planner.next_block(20, 0).choice == RK);
  for (int i = 1; i < 3; ++i) (void)planner.next_block(20, 0);
  CHECK(planner.summary().find("correction 605 B") != std::string::npos);
  // So much more that nothing fits: every block recomputed, without the
  // warning (the model errs high there: what it adds may be in the
  // measured stretches already, as gradients made in that backward are).
  allocated = 2000;
  CHECK_FALSE(planner.begin_step(900, 10));
  CHECK(planner.next_block(20, 0).choice == R);
  CHECK(planner.take_warning().empty());
}

TEST_CASE(
    "BlockPlanner: what a first block found allocated beyond the plan is given back once two steps find it gone") {
  // One step began with 605 more allocated (a tensor the training loop held
  // over that step): the plan counted it. Once it is gone, the plan was
  // conservative for good. Now the second step in a row to find it gone
  // gives it back; steps alternating (gradient accumulation: a micro-step
  // without gradients, then one with) keep it.
  std::int64_t allocated = 10;
  offload::BlockPlanner planner(/*target=*/1000, /*overlaps=*/true, {}, 0, 0, 0, [&](int) { return allocated; });
  planner.begin_step(-1, 10);
  for (int i = 0; i < 3; ++i) planner.measured(planner.next_block(20, 0).index, BlockCost{1000, 100, 2, 20});
  planner.link_measured(400, 400, 100, 100);
  const auto step = [&](std::int64_t at_first_block) {
    CHECK_FALSE(planner.begin_step(500, 10));
    allocated = at_first_block;
    std::vector<BlockChoice> choices;
    for (int i = 0; i < 3; ++i) choices.push_back(planner.next_block(20, 0).choice);
    return choices;
  };
  constexpr auto RK = BlockChoice::recompute_input_kept;
  const std::vector<BlockChoice> kept{K, K, K}, conservative{RK, RK, K};
  CHECK(planner.begin_step(300, 10));
  for (int i = 0; i < 3; ++i) CHECK(planner.next_block(20, 0).choice == K);
  CHECK(step(615) == conservative);
  CHECK(planner.summary().find("correction 605 B") != std::string::npos);
  for (int round = 0; round < 3; ++round) {  // alternating: kept counted
    CHECK(step(10) == conservative);
    CHECK(step(615) == conservative);
  }
  CHECK(step(10) == conservative);  // gone once: may be a micro-step without gradients
  CHECK(step(10) == kept);          // gone twice in a row: given back
  CHECK(planner.summary().find("correction 0 B") != std::string::npos);
  CHECK(step(10) == kept);
  CHECK(planner.take_warning().empty());
}

TEST_CASE("BlockPlanner: a step within 2 % over the target is the per-tensor plan's to correct: no re-plan") {
  offload::BlockPlanner planner(/*target=*/1000, /*overlaps=*/true);
  planner.begin_step(-1);
  for (int i = 0; i < 3; ++i) planner.measured(planner.next_block(20).index, BlockCost{1000, 100, 2, 20});
  planner.link_measured(400, 400, 100, 100);
  planner.begin_step(300);  // every block kept, predicted 500
  for (int i = 0; i < 3; ++i) (void)planner.next_block(20);
  CHECK_FALSE(planner.begin_step(1020));  // 2 % over: the same choices, no correction
  CHECK(planner.summary().find("correction 0 B") != std::string::npos);
  for (int i = 0; i < 3; ++i) CHECK(planner.next_block(20).choice == K);
  CHECK(planner.begin_step(1021));  // beyond: re-planned with the difference
  CHECK(planner.summary().find("correction 521 B") != std::string::npos);
}

TEST_CASE("BlockPlanner: a step that needed more than predicted re-plans with the difference") {
  offload::BlockPlanner planner(/*target=*/1000, /*overlaps=*/true);
  planner.begin_step(-1);
  for (int i = 0; i < 3; ++i) planner.measured(planner.next_block(20).index, BlockCost{1000, 100, 2, 20});
  planner.link_measured(400, 400, 100, 100);
  planner.begin_step(300);  // all kept, predicted 500 (300 + 3 x 100, less the last block's)
  for (int i = 0; i < 3; ++i) (void)planner.next_block(20);
  // The step needed 1200: 700 more than the model said. With that added,
  // the target leaves no room beyond the last block: the other two are
  // recomputed (offloading them would hold one block's bytes in flight).
  CHECK(planner.begin_step(1200));
  std::vector<BlockChoice> choices;
  for (int i = 0; i < 3; ++i) choices.push_back(planner.next_block(20).choice);
  CHECK(choices == std::vector<BlockChoice>{R, R, K});
  // A target below what recomputing everything needs: one warning.
  offload::BlockPlanner tight(/*target=*/100, /*overlaps=*/true);
  tight.begin_step(-1);
  tight.measured(tight.next_block(20).index, BlockCost{1000, 100, 2, 20});
  tight.begin_step(300);
  CHECK(tight.take_warning().find("device_target_bytes 100 is below") != std::string::npos);
  CHECK(tight.take_warning().empty());
  CHECK(tight.next_block(20).choice == R);
}

TEST_CASE(
    "BlockPlanner: where nothing fits by the model but offloading every block may, one step tries it; the lower "
    "of the two stays") {
  // Blocking copies: an offloaded block's tensors come back as backward
  // unpacks them, so its stretch of backward needs less than its
  // recomputation, which held all of them at once; the model takes the
  // recomputation's. Two blocks of 100 saved bytes in 4 storages (largest
  // 25); recomputing every block peaks at 180 in backward.
  std::int64_t peak = 0;
  const auto measured_planner = [&](std::int64_t target, bool overlaps = false) {
    auto planner = std::make_unique<offload::BlockPlanner>(target, overlaps, [&](int) { return peak; });
    peak = 60;
    planner->begin_step(-1, 10);
    for (int i = 0; i < 2; ++i) {
      planner->measured(planner->next_block(20, 0).index, BlockCost{1000, 100, 4, 20, -1, -1, 25});
      planner->block_done();
    }
    planner->link_measured(400, 400, 100, 100);
    planner->end_forward(50);
    planner->recomputing(1, 0);
    peak = 170;  // block 1's stretch; block 0's closes with the step's peak, 180
    planner->recomputing(0, 0);
    return planner;
  };
  const auto choices = [](offload::BlockPlanner& planner) {
    std::vector<BlockChoice> out;
    for (int i = 0; i < 2; ++i) {
      out.push_back(planner.next_block(20, 0).choice);
      planner.block_done();
    }
    return out;
  };
  // Target 150: no candidate fits the model, but every block offloaded may
  // (block 0's stretch less 75 of its own bytes: 105): the next step tries
  // it, without a warning.
  auto planner = measured_planner(150);
  CHECK(planner->begin_step(180, 10));
  CHECK(planner->take_warning().empty());
  CHECK(planner->summary().find("this step tries every block offloaded") != std::string::npos);
  CHECK(choices(*planner) == std::vector<BlockChoice>{O, O});
  // It needed 140: under the target, it stays the plan.
  CHECK_FALSE(planner->begin_step(140, 10));
  CHECK(planner->take_warning().empty());
  CHECK(planner->summary().find("every block offloaded, tried, needed 140 B") != std::string::npos);
  CHECK(planner->summary().find("this step tries") == std::string::npos);
  CHECK(choices(*planner) == std::vector<BlockChoice>{O, O});
  // A later step over the target (the per-tensor plan inside the blocks
  // keeping a little too much) is that plan's to correct: this plan
  // neither measures again nor warns.
  CHECK_FALSE(planner->begin_step(151, 10));
  CHECK(planner->take_warning().empty());
  auto turn = planner->next_block(20, 0);
  CHECK_FALSE(turn.measure);
  CHECK(turn.choice == O);
  planner->block_done();
  (void)planner->next_block(20, 0);
  planner->block_done();
  CHECK_FALSE(planner->begin_step(140, 10));
  CHECK(choices(*planner) == std::vector<BlockChoice>{O, O});
  offload::Stats stats;
  planner->add_stats(stats);
  CHECK(stats.blocks_offloaded == 2);
  // Three steps in a row more than 2 % over (the tried step ran before the
  // optimizer's state existed, under gradient accumulation): the target is
  // not met, warned once; every block stays offloaded. Fewer in a row are
  // the per-tensor plan's to correct; a step that raised no peak counts by
  // the per-tensor plan's model of it.
  const auto over_step = [&](std::int64_t needed, bool is_peak = true) {
    CHECK_FALSE(planner->begin_step(needed, 10, -1, is_peak));
    auto warning = planner->take_warning();
    CHECK(choices(*planner) == std::vector<BlockChoice>{O, O});
    return warning;
  };
  CHECK(over_step(170).empty());
  CHECK(over_step(172).empty());
  CHECK(over_step(140).empty());  // under: not in a row
  CHECK(over_step(170).empty());
  CHECK(over_step(160, /*is_peak=*/false).empty());
  const auto over_thrice = over_step(175);
  CHECK_MESSAGE(over_thrice.find("device_target_bytes 150 is below what offloading every planned block needs: "
                                 "three steps in a row needed more than 2 % over it, the last 175 bytes; every "
                                 "planned block stays offloaded (warned once per manager)") != std::string::npos,
                over_thrice);
  CHECK(over_step(175).empty());

  // Tried and over the target, but under what recomputing every block
  // needs (180): the warning, with both figures, and every block stays
  // offloaded (the lower of the two).
  auto over = measured_planner(150);
  over->begin_step(180, 10);
  CHECK(choices(*over) == std::vector<BlockChoice>{O, O});
  CHECK_FALSE(over->begin_step(160, 10));
  auto warning = over->take_warning();
  CHECK_MESSAGE(warning.find("device_target_bytes 150 is below") != std::string::npos, warning);
  CHECK_MESSAGE(warning.find("offloading every planned block, tried, needed 160 bytes); every planned block is "
                             "offloaded (that needed less)") != std::string::npos,
                warning);
  CHECK(choices(*over) == std::vector<BlockChoice>{O, O});
  over->begin_step(160, 10);
  CHECK(over->take_warning().empty());
  CHECK(choices(*over) == std::vector<BlockChoice>{O, O});
  // Over what recomputing every block needs: every block recomputed.
  auto worse = measured_planner(150);
  worse->begin_step(180, 10);
  CHECK(choices(*worse) == std::vector<BlockChoice>{O, O});
  CHECK(worse->begin_step(190, 10));
  warning = worse->take_warning();
  CHECK_MESSAGE(warning.find("tried, needed 190 bytes); every planned block is recomputed") != std::string::npos,
                warning);
  CHECK(choices(*worse) == std::vector<BlockChoice>{R, R});
  worse->begin_step(180, 10);
  CHECK(worse->take_warning().empty());
  CHECK(choices(*worse) == std::vector<BlockChoice>{R, R});

  // The tried step did not raise the device's running peak (statistics
  // not reset since the measuring step): `needed` is the per-tensor plan's
  // model. Under the target: kept, no warning; over it: kept (it needed no
  // more than the measuring step), with a warning saying it was not
  // measured.
  auto unmeasured = measured_planner(150);
  unmeasured->begin_step(180, 10);
  CHECK(choices(*unmeasured) == std::vector<BlockChoice>{O, O});
  CHECK_FALSE(unmeasured->begin_step(145, 10, -1, /*needed_is_peak=*/false));
  CHECK(unmeasured->take_warning().empty());
  CHECK(unmeasured->summary().find("its peak not measured") != std::string::npos);
  CHECK(choices(*unmeasured) == std::vector<BlockChoice>{O, O});
  auto modelled_over = measured_planner(150);
  modelled_over->begin_step(180, 10);
  CHECK(choices(*modelled_over) == std::vector<BlockChoice>{O, O});
  CHECK_FALSE(modelled_over->begin_step(200, 10, -1, /*needed_is_peak=*/false));
  warning = modelled_over->take_warning();
  CHECK_MESSAGE(warning.find("so its own was not measured") != std::string::npos, warning);
  CHECK_MESSAGE(warning.find("every planned block is offloaded") != std::string::npos, warning);
  CHECK(choices(*modelled_over) == std::vector<BlockChoice>{O, O});

  // Overlapping copies (no prefetch window): the model holds the largest
  // offloaded block's copies in flight at forward's peak (60 + 100 > 150),
  // the bound none, so the step is tried all the same.
  auto streamed = measured_planner(150, /*overlaps=*/true);
  streamed->begin_step(180, 10);
  CHECK(streamed->take_warning().empty());
  CHECK(choices(*streamed) == std::vector<BlockChoice>{O, O});

  // A target under even that bound (100 < 105): no step tries it; the
  // warning comes at once.
  auto low = measured_planner(100);
  low->begin_step(180, 10);
  CHECK(low->take_warning().find("device_target_bytes 100 is below") != std::string::npos);
  CHECK(choices(*low) == std::vector<BlockChoice>{R, R});
}

TEST_CASE("BlockPlanner: where a step needed so much more than predicted that nothing fits, the next step measures") {
  // The blocks save more than measured (data-dependent sizes, another
  // model under the manager): the correction would leave no choice that
  // fits, and a target below what recomputing everything needs would be a
  // false alarm. The step after measures instead, without a warning.
  offload::BlockPlanner planner(/*target=*/1000, /*overlaps=*/true);
  planner.begin_step(-1);
  for (int i = 0; i < 3; ++i) planner.measured(planner.next_block(20).index, BlockCost{1000, 100, 2, 20});
  planner.link_measured(400, 400, 100, 100);
  planner.begin_step(300);  // all kept, predicted 500
  for (int i = 0; i < 3; ++i) CHECK(planner.next_block(20).choice == K);
  CHECK(planner.begin_step(5000));
  CHECK(planner.take_warning().empty());
  for (int i = 0; i < 3; ++i) {
    const auto turn = planner.next_block(20);
    CHECK(turn.measure);
    CHECK(turn.choice == R);
    planner.measured(turn.index, BlockCost{1000, 300, 2, 20});
  }
  CHECK(planner.begin_step(700));  // measured afresh: 700 recomputing all, 300 per block
  CHECK(planner.take_warning().empty());
  CHECK_FALSE(planner.next_block(20).measure);
  for (int i = 1; i < 3; ++i) (void)planner.next_block(20);
  // Missed again right after measuring afresh: no third measurement, but
  // the warning and every block recomputed, as for a target too low.
  planner.begin_step(5000);
  CHECK(planner.take_warning().find("is below what recomputing every planned block") != std::string::npos);
  const auto turn = planner.next_block(20);
  CHECK_FALSE(turn.measure);
  CHECK(turn.choice == R);
}

TEST_CASE(
    "BlockPlanner: the guard offloads a kept block where what the device holds plus what is kept from there "
    "would cross the target") {
  std::int64_t allocated = 650;  // at every first block (more would re-plan: see the case above)
  offload::BlockPlanner planner(/*target=*/1000, /*overlaps=*/true, {}, 0, 0, 0, [&](int) { return allocated; });
  planner.begin_step(-1);
  for (int i = 0; i < 3; ++i) {
    planner.measured(planner.next_block(20, 0).index, BlockCost{1000, 100, 2, 20, -1, -1, /*largest_storage=*/50});
  }
  planner.link_measured(400, 400, 100, 100);
  CHECK(planner.begin_step(300));  // all kept
  allocated = 650;                 // 650 + 3 x 100 kept - 20 (the input, held already) <= 1000: kept
  auto turn = planner.next_block(20, 0);
  CHECK(turn.choice == K);
  CHECK_FALSE(turn.guarded);
  allocated = 830;  // 830 + 2 x 100 - 20 > 1000: offloaded
  turn = planner.next_block(20, 0);
  CHECK(turn.choice == O);
  CHECK(turn.guarded);
  allocated = 5000;  // no device to read (index -1): no guard
  CHECK(planner.next_block(20).choice == K);
  offload::Stats stats;
  planner.add_stats(stats);
  CHECK(stats.blocks_kept == 2);
  CHECK(stats.blocks_offloaded == 1);
  CHECK(stats.blocks_guarded == 1);
  CHECK(planner.begin_step(300));  // what ran differs from the plan, which stays
  stats = {};
  planner.add_stats(stats);
  CHECK(stats.blocks_guarded == 1);  // the step before
  allocated = 0;
  CHECK(planner.next_block(20, 0).choice == K);

  // With copies in flight (what `relieve` ends, freeing their storages)
  // the guard ends them first and keeps the block where that is enough.
  int relieved = 0;
  offload::BlockPlanner streamed(/*target=*/1000, /*overlaps=*/true, {}, 0, 0, 0, [&](int) { return allocated; },
                                 [&] {
                                   ++relieved;
                                   allocated -= 200;
                                 });
  allocated = 650;
  streamed.begin_step(-1);
  for (int i = 0; i < 3; ++i) streamed.measured(streamed.next_block(20, 0).index, BlockCost{1000, 100, 2, 20});
  streamed.link_measured(400, 400, 100, 100);
  CHECK(streamed.begin_step(300));
  allocated = 650;
  CHECK(streamed.next_block(20, 0).choice == K);
  CHECK(relieved == 0);
  allocated = 900;  // 900 + 200 - 20 > 1000; relieved: 700 + 180 <= 1000
  turn = streamed.next_block(20, 0);
  CHECK(turn.choice == K);
  CHECK_FALSE(turn.guarded);
  CHECK(relieved == 1);
  allocated = 1000;  // 1000 + 100 - 20 > 1000; relieved: 800 + 80 <= 1000
  CHECK(streamed.next_block(20, 0).choice == K);
  CHECK(relieved == 2);
}

TEST_CASE(
    "BlockPlanner: the guard counts what each block allocates while it runs, as the measuring step's forward "
    "showed") {
  // In the measuring step block 0's forward allocated 250 above where it
  // began, block 1's 300, more than the 100 each saves; block 2's did not
  // raise the running peak (not measured: it counts as the largest, 300).
  // So a kept block is relieved (or offloaded) where what the blocks from
  // there allocate while they run would cross the target, even where what
  // is kept alone would not.
  std::int64_t allocated = 0;
  std::int64_t peak = 0;
  int relieved = 0;
  const auto measured_planner = [&](bool relieves) {
    auto planner = std::make_unique<offload::BlockPlanner>(
        /*target=*/1000, /*overlaps=*/true, [&](int) { return peak; }, 0, 0, 0, [&](int) { return allocated; },
        relieves ? std::function<void()>([&] {
          ++relieved;
          allocated -= 200;
        })
                 : std::function<void()>());
    allocated = 650;
    peak = 650;
    planner->begin_step(-1);
    const std::int64_t begins[] = {650, 660, 640};
    const std::int64_t rises[] = {250, 300, 250};  // block 2: 890, under block 1's 960
    for (int i = 0; i < 3; ++i) {
      allocated = begins[i];
      const auto turn = planner->next_block(20, 0);
      peak = std::max(peak, allocated + rises[i]);
      planner->measured(turn.index, BlockCost{1000, 100, 2, 20, -1, -1, /*largest_storage=*/50});
    }
    planner->link_measured(400, 400, 100, 100);
    allocated = 650;
    CHECK(planner->begin_step(300));  // all kept
    return planner;
  };
  // From block 0 (20 of input held): while block 2 runs, 80 + 100 kept
  // and its 20 input (block 1's output) with the 300 it allocates: 500
  // (what is kept alone: 280).
  const auto streamed = measured_planner(true);
  auto turn = streamed->next_block(20, 0);  // 650 + 500 > 1000; relieved: 450 + 500 <= 1000
  CHECK(turn.choice == K);
  CHECK_FALSE(turn.guarded);
  CHECK(relieved == 1);
  allocated = 650;  // 650 + max(300, 80 + 20 + 300) > 1000; relieved: 450 + 400
  CHECK(streamed->next_block(20, 0).choice == K);
  CHECK(relieved == 2);
  allocated = 800;  // 800 + 300 (block 2, as the largest measured) > 1000; relieved: 600 + 300
  CHECK(streamed->next_block(20, 0).choice == K);
  CHECK(relieved == 3);

  // Nothing in flight to end: the block is offloaded instead, by the sums
  // above to the byte.
  const auto blocking = measured_planner(false);
  allocated = 501;  // 501 + 500 > 1000
  turn = blocking->next_block(20, 0);
  CHECK(turn.choice == O);
  CHECK(turn.guarded);
  allocated = 600;  // 600 + 400 <= 1000
  turn = blocking->next_block(20, 0);
  CHECK(turn.choice == K);
  CHECK_FALSE(turn.guarded);
  allocated = 701;  // 701 + 300 > 1000
  turn = blocking->next_block(20, 0);
  CHECK(turn.choice == O);
  CHECK(turn.guarded);
  CHECK(blocking->begin_step(300));
  allocated = 500;  // 500 + 500 <= 1000
  CHECK(blocking->next_block(20, 0).choice == K);
  CHECK(blocking->next_block(20, 0).choice == K);
  allocated = 700;  // 700 + 300 <= 1000
  CHECK(blocking->next_block(20, 0).choice == K);
}

TEST_CASE(
    "BlockPlanner: a begin with no block run is not a step; smaller inputs follow the plan; a block left "
    "unmeasured measures again") {
  offload::BlockPlanner planner(/*target=*/1000, /*overlaps=*/true);
  planner.begin_step(-1);
  for (int i = 0; i < 3; ++i) planner.measured(planner.next_block(20).index, BlockCost{1000, 100, 2, 20});
  planner.link_measured(400, 400, 100, 100);
  CHECK(planner.begin_step(300));  // planned: all kept
  for (int i = 0; i < 3; ++i) CHECK(planner.next_block(20).choice == K);
  // An evaluation pass under the scope runs no planned block: nothing changes.
  CHECK_FALSE(planner.begin_step(300));
  CHECK_FALSE(planner.begin_step(300));
  for (int i = 0; i < 3; ++i) CHECK(planner.next_block(i == 1 ? 10 : 20).choice == K);  // a smaller input
  CHECK_FALSE(planner.begin_step(300));
  // A larger input: recomputed from there, then a measuring step in which
  // one block is never reported (it threw): the step after measures again.
  CHECK(planner.next_block(20).choice == K);
  CHECK(planner.next_block(40).choice == R);
  CHECK(planner.next_block(20).choice == R);
  CHECK(planner.begin_step(300));
  planner.measured(planner.next_block(40).index, BlockCost{1000, 100, 2, 40});
  (void)planner.next_block(20);  // not measured
  CHECK(planner.begin_step(300));
  const auto turn = planner.next_block(40);
  CHECK(turn.measure);
  CHECK(turn.choice == R);
}
