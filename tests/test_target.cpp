// SPDX-License-Identifier: MIT
// Options::device_target_bytes: the plan keeps a step under the target on
// sim (its counters are exact) from the second step on, moves fewer bytes
// than offloading everything, follows a step that grows (the guard), warns
// once for a target that cannot be met, keeps everything under a target
// above the peak without offloading, and counts only kept saved bytes on a
// device without memory statistics; gradients stay bitwise those of the
// run without offloading under every sync policy.

#include "doctest.hpp"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "fixture.hpp"
#include "harness.hpp"
#include "warnings.hpp"

namespace {

// Why every case of this suite runs on sim only (OFFLOAD_TEST_DEVICE=cuda
// skips and lists them instead of counting a sim run as a CUDA pass).
constexpr const char* kSuiteOnSim =
    "the target is planned from sim's allocated-memory counts, with sim's copy latency and poisoning";

using Blocking = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Blocking>;
using Streamed = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Streamed>;
using fixture::sim0;

// Each copy delayed 200 us: enough to race, short enough for four steps of
// every target.
struct SlowPoisonedSim : fixture::SlowPoisonedSim {
  SlowPoisonedSim() : fixture::SlowPoisonedSim(200) {}
};

// A stack of `layers` Linear-tanh layers of width 64 on sim:0: each saves
// its input and its output ([batch, 64] floats each), its weight (a leaf)
// stays. The model input stays too: the first layer's product is in an
// opt-out region (the targets below were chosen with it on the device).
struct Stack {
  explicit Stack(int layers = 12) {
    at::manual_seed(0);
    for (int i = 0; i < layers; ++i) weights.push_back((at::randn({64, 64}) / 8).to(sim0).requires_grad_());
  }
  at::Tensor loss(std::int64_t batch) const {
    at::manual_seed(1);
    auto h = at::randn({batch, 64}).to(sim0);
    std::vector<at::Tensor> held;
    for (std::size_t i = 0; i < weights.size(); ++i) {
      std::optional<offload::NoOffload> input_stays;
      if (i == 0) input_stays.emplace();
      auto product = at::matmul(h, weights[i]);
      input_stays.reset();
      h = at::tanh(product);
      if (hold && i % 2 == 0) held.push_back(h);
    }
    return h.pow(2).mean();
  }
  std::vector<at::Tensor> weights;
  // Hold every other layer's output to the end of forward (as a model that
  // uses them again later does): offloading those frees nothing there.
  bool hold = false;
};

using harness::same;
using harness::Step;

// One step of `stack` on sim:0 (harness::train_step), inside a Scope of
// `manager` when one is given.
template <class M>
Step step(const Stack& stack, std::int64_t batch, const M* manager) {
  std::optional<offload::AnyManager> any;
  if (manager != nullptr) any = *manager;
  return harness::train_step(stack.weights, sim0, [&] { return stack.loss(batch); }, any ? &*any : nullptr);
}

}  // namespace

TEST_CASE_TEMPLATE("target: each step from the second stays under the target, bitwise equal, fewer bytes moved" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking, Streamed) {
  const SlowPoisonedSim sim;
  const Stack stack;
  const std::int64_t batch = 1024;
  const auto plain = step<M>(stack, batch, nullptr);
  M everything(offload::Options{});
  const auto all = step(stack, batch, &everything);
  CHECK(same(all, plain));
  const auto moved_all = everything.stats().bytes_offloaded;
  for (const double fraction : {0.5, 0.7, 0.9}) {
    CAPTURE(fraction);
    const auto target = static_cast<std::int64_t>(fraction * static_cast<double>(plain.peak));
    // sync::Streamed offloading everything peaks near 0.5 of this model's
    // peak (0.49-0.55 here), higher on a loaded machine (0.72 seen): its
    // forward stash holds tensors until their copies end. Where the
    // manager finds from the step before that the target cannot be met, it
    // warns once and offloads everything; where it does not, the step stays
    // under the target.
    harness::CollectWarnings warnings;
    M manager(offload::Options{.device_target_bytes = target});
    std::int64_t last_peak = -1;  // the step before's
    for (int s = 0; s < 4; ++s) {
      CAPTURE(s);
      manager.reset_stats();
      const auto run = step(stack, batch, &manager);
      const auto before = std::exchange(last_peak, run.peak);
      CHECK(same(run, plain));
      const auto stats = manager.stats();
      MESSAGE("peak " << run.peak << " (forward " << run.forward_peak << ") target " << target << " plain "
                      << plain.peak << " all " << all.peak << " moved " << stats.bytes_offloaded << " of " << moved_all
                      << " min " << stats.target_min_offload_bytes << " guard " << stats.target_guard_offloads);
      CHECK(stats.bytes_offloaded > 0);
      if (s == 0) {
        CHECK(stats.bytes_offloaded == moved_all);  // nothing learned: everything
        continue;
      }
      // sync::Blocking's steps are alike, so its plans need no guard.
      // sync::Streamed's forward stash differs from step to step (how fast
      // the side stream runs); where this step's stash outgrew the one it
      // was planned from, the guard offloads what the plan kept, and a step
      // that offloaded everything peaks where offloading everything does.
      if (std::is_same_v<M, Blocking>) CHECK(stats.target_guard_offloads == 0);
      if (stats.target_guard_offloads > 0 && stats.bytes_offloaded == moved_all) continue;
      // The plan from the step before offloads everything only where the
      // target cannot be met (its minimum: every eligible byte).
      const bool possible = stats.target_min_offload_bytes < moved_all;
      CAPTURE(possible);
      if (!possible) {
        // Warned where the step the plan was made from peaked over the
        // target (its model errs high: a step that met it is no cause).
        REQUIRE(warnings.messages.size() <= 1);
        if (before > target) CHECK(warnings.messages.size() == 1);
        if (!warnings.messages.empty()) CHECK(warnings.messages[0].find("cannot be met") != std::string::npos);
        CHECK(std::is_same_v<M, Streamed>);  // sync::Blocking offloading everything peaks at 0.38 of the peak
        CHECK(stats.bytes_offloaded == moved_all);
        CHECK(stats.passed_target == 0);
        continue;
      }
      // The step peak within 2 % of the target.
      CHECK(run.peak <= target + target / 50);
      // The minimum of the recorded step, within one storage (a plan keeps
      // whole storages), unless the guard offloaded more.
      if (stats.target_guard_offloads == 0) {
        CHECK(stats.bytes_offloaded <= stats.target_min_offload_bytes + 1024 * 64 * 4);
      }
      // Something kept where the target leaves room. sync::Streamed's own
      // peak (its forward stash, whose freed blocks wait for the side
      // stream's copies) depends on how fast those copies run, so on a
      // loaded machine it can leave no room below 0.9.
      if (fraction > (std::is_same_v<M, Streamed> ? 0.7 : 0.5)) {
        CHECK(stats.passed_target > 0);
        CHECK(stats.bytes_offloaded < moved_all);
      }
    }
    CHECK(warnings.messages.size() <= 1);  // once per manager
  }
}

TEST_CASE_TEMPLATE("target: a step whose tensors double mid-run stays under the target (the guard)" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking, Streamed) {
  const SlowPoisonedSim sim;
  const Stack stack;
  const auto plain = step<M>(stack, 1024, nullptr);
  const auto plain_long = step<M>(stack, 2048, nullptr);
  M everything(offload::Options{});
  const auto all_long = step(stack, 2048, &everything);
  // Under the peak of the short steps without offloading, above what the
  // long ones need with everything offloaded.
  const auto target = std::max(all_long.peak + all_long.peak / 4, plain.peak * 9 / 10);
  REQUIRE(target < plain_long.peak);
  M manager(offload::Options{.device_target_bytes = target});
  std::int64_t guarded = 0;
  for (int s = 0; s < 6; ++s) {
    CAPTURE(s);
    const auto batch = s < 3 ? 1024 : 2048;
    manager.reset_stats();
    const auto run = step(stack, batch, &manager);
    CHECK(same(run, batch == 1024 ? plain : plain_long));
    const auto stats = manager.stats();
    MESSAGE("batch " << batch << " peak " << run.peak << " target " << target << " moved " << stats.bytes_offloaded
                     << " guard " << stats.target_guard_offloads << " kept " << stats.target_kept_bytes);
    guarded += stats.target_guard_offloads;
    if (s > 0) CHECK(run.peak <= target + target / 50);  // within 2 %
    if (s == 1) CHECK(stats.passed_target > 0);          // the short step keeps some on the device
  }
  CHECK(guarded > 0);  // the first long step followed the short step's plan until the guard stopped it
}

TEST_CASE_TEMPLATE("target: one that cannot be met warns once with the numbers and offloads everything" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking, Streamed) {
  const SlowPoisonedSim sim;
  const Stack stack;
  const auto plain = step<M>(stack, 1024, nullptr);
  M everything(offload::Options{});
  step(stack, 1024, &everything);
  const auto moved_all = everything.stats().bytes_offloaded;
  const std::int64_t target = 4096;  // below the weights alone
  M manager(offload::Options{.device_target_bytes = target});
  harness::CollectWarnings warnings;
  for (int s = 0; s < 3; ++s) {
    manager.reset_stats();
    CHECK(same(step(stack, 1024, &manager), plain));
    CHECK(manager.stats().bytes_offloaded == moved_all);
    CHECK(manager.stats().passed_target == 0);
  }
  std::vector<std::string> ours;
  for (const auto& m : warnings.messages) {
    if (m.find("device_target_bytes") != std::string::npos) ours.push_back(m);
  }
  REQUIRE(ours.size() == 1);
  CHECK(ours[0].find("device_target_bytes 4096 cannot be met: with every eligible saved tensor offloaded the last "
                     "step needs ") != std::string::npos);
  CHECK(ours[0].find(", and its measured peak was ") != std::string::npos);  // the figure the step showed
  CHECK(ours[0].find("offloading every eligible tensor") != std::string::npos);
}

TEST_CASE_TEMPLATE("target: one above the peak without offloading offloads nothing from the second step" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking, Streamed) {
  const SlowPoisonedSim sim;
  const Stack stack;
  const auto plain = step<M>(stack, 1024, nullptr);
  M manager(offload::Options{.device_target_bytes = plain.peak * 3 / 2});
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    manager.reset_stats();
    const auto run = step(stack, 1024, &manager);
    CHECK(same(run, plain));
    const auto stats = manager.stats();
    if (s == 0) {
      CHECK(stats.bytes_offloaded > 0);  // nothing learned yet: everything
    } else {
      CHECK(stats.bytes_offloaded == 0);
      CHECK(stats.passed_target == stats.tensors_seen - stats.passed_leaf - stats.passed_other_device);
      CHECK(stats.target_planned_offload_bytes == 0);
      CHECK(stats.target_steps_planned == 1);
    }
  }
}

// A model that holds every other layer's output to the end of forward:
// offloading those frees nothing there. The step planned from the first
// (which offloaded everything and saw them stay allocated) and the steps
// after it (which keep some of them) must agree on what is allocated
// anyway, so each planned step moves within 1.10x of the minimum of its
// own record (read from the step after it) and stays under the target.
TEST_CASE_TEMPLATE("target: storages the model holds anyway stay counted when the plan keeps them" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking) {
  const SlowPoisonedSim sim;
  Stack stack;
  stack.hold = true;
  const std::int64_t batch = 1024;
  const auto plain = step<M>(stack, batch, nullptr);
  M everything(offload::Options{});
  const auto all = step(stack, batch, &everything);
  const auto target = static_cast<std::int64_t>(0.9 * static_cast<double>(plain.peak));
  REQUIRE(all.peak < target);
  M manager(offload::Options{.device_target_bytes = target});
  std::vector<offload::Stats> stats;
  for (int s = 0; s < 4; ++s) {
    CAPTURE(s);
    manager.reset_stats();
    const auto run = step(stack, batch, &manager);
    CHECK(same(run, plain));
    if (s > 0) CHECK(run.peak <= target + target / 50);
    stats.push_back(manager.stats());
  }
  for (std::size_t s = 1; s + 1 < stats.size(); ++s) {
    CAPTURE(s);
    CHECK(stats[s].bytes_offloaded > 0);
    CHECK(stats[s].passed_target > 0);
    CHECK(stats[s].target_guard_offloads == 0);
    CHECK(static_cast<double>(stats[s].bytes_offloaded) <=
          1.10 * static_cast<double>(stats[s + 1].target_min_offload_bytes));
  }
}

// sync::Blocking only: its steps are alike, so the two managers' first
// steps record the same; under sync::Streamed they differ with how fast the
// side stream runs.
TEST_CASE_TEMPLATE("target: memory allocated after the first step (optimizer state) is planned for" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking) {
  const SlowPoisonedSim sim;
  const Stack stack;
  const auto plain = step<M>(stack, 1024, nullptr);
  const auto target = plain.peak * 9 / 10;
  // Two managers see the same first step; before the second, one of them
  // finds a tenth of the peak allocated (as an optimizer's state is, after
  // its first step) and must plan to offload that much more.
  std::int64_t planned[2] = {0, 0};
  for (int grown = 0; grown < 2; ++grown) {
    CAPTURE(grown);
    M manager(offload::Options{.device_target_bytes = target});
    (void)step(stack, 1024, &manager);
    at::Tensor state;
    if (grown == 1) state = at::zeros({plain.peak / 10 / 4}, at::kFloat).to(sim0);
    for (int s = 1; s < 3; ++s) {
      CAPTURE(s);
      manager.reset_stats();
      const auto run = step(stack, 1024, &manager);
      CHECK(same(run, plain));
      const auto stats = manager.stats();
      CHECK(stats.bytes_offloaded > 0);
      if (s == 1) planned[grown] = stats.target_planned_offload_bytes;
      if (std::is_same_v<M, Blocking>) CHECK(run.peak <= target + target / 50);
    }
  }
  CHECK(planned[1] > planned[0]);
}

namespace {
// sim without memory statistics: Sim's streams and events, no
// memory_allocated().
struct SimWithoutStats {
  static constexpr c10::DeviceType device_type = offload::device::Sim::device_type;
  static constexpr std::string_view name = "sim-without-stats";
  static constexpr std::string_view backend_name = "sim";
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
  static bool available() { return offload::device::Sim::available(); }
  static c10::Stream current_stream(c10::DeviceIndex index) { return offload::device::Sim::current_stream(index); }
  static c10::Stream side_stream(c10::DeviceIndex index) { return offload::device::Sim::side_stream(index); }
  static void record_stream(const at::Tensor& t, c10::Stream stream) { offload::device::Sim::record_stream(t, stream); }
};
static_assert(!offload::memory_stats_device_policy<SimWithoutStats>);
}  // namespace

// Three steps of the stack under a target on `Device`, a policy whose
// memory statistics are not there or not reported: the target counts only
// the saved bytes it keeps on the device, bitwise.
template <class Device, class Sync>
void counts_kept_saved_bytes_only() {
  const SlowPoisonedSim sim;
  const Stack stack;
  const auto plain = step<Blocking>(stack, 1024, nullptr);
  const std::int64_t act = 1024 * 64 * 4;  // one saved activation
  const std::int64_t target = 5 * act + act / 2;
  offload::Manager<Device, offload::storage::PinnedHost, Sync> manager(offload::Options{.device_target_bytes = target});
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    manager.reset_stats();
    CHECK(same(step(stack, 1024, &manager), plain));
    const auto stats = manager.stats();
    CHECK(stats.bytes_offloaded > 0);
    if (s == 0) {
      CHECK(stats.target_kept_bytes == 0);
    } else {
      CHECK(stats.target_kept_bytes == 5 * act);  // the latest five, whatever the device allocated besides
      CHECK(stats.target_guard_offloads == 0);
    }
  }
}

TEST_CASE_TEMPLATE("target: without memory statistics it counts the saved bytes kept on the device" *
                       fixture::sim_only{kSuiteOnSim},
                   Sync, offload::sync::Blocking, offload::sync::Streamed) {
  counts_kept_saved_bytes_only<SimWithoutStats, Sync>();
}

namespace {
// sim whose memory statistics throw, as CUDA's do before its lazy
// initialisation and under a pluggable allocator (RMM): read as not
// reported (-1), never a crash.
struct SimWithThrowingStats : offload::device::Sim {
  static std::int64_t memory_allocated(c10::DeviceIndex) { throw std::runtime_error("statistics are not ready"); }
  static std::int64_t memory_peak(c10::DeviceIndex) { throw std::runtime_error("statistics are not ready"); }
};
static_assert(offload::memory_stats_device_policy<SimWithThrowingStats>);
}  // namespace

TEST_CASE_TEMPLATE("target: memory statistics that throw count as not reported, never a crash" *
                       fixture::sim_only{kSuiteOnSim},
                   Sync, offload::sync::Blocking, offload::sync::Streamed) {
  // The scope's hooks read the statistics in noexcept code: a throw there
  // ended the program (std::terminate) at the first scope. Planned as
  // without statistics.
  counts_kept_saved_bytes_only<SimWithThrowingStats, Sync>();
}

TEST_CASE_TEMPLATE("target: the demo GPT trains bitwise equal with a target, keeping and offloading" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking, Streamed) {
  const SlowPoisonedSim sim;
  offload::sim::synchronize();
  offload::sim::reset_peak(0);
  const auto plain = harness::train(harness::ModelKind::gpt, sim0, 4);
  const auto peak = offload::sim::device_memory(0).peak_bytes;
  const auto train = [&](M& manager) {
    offload::sim::synchronize();
    offload::sim::reset_peak(0);
    const auto run = harness::train(harness::ModelKind::gpt, sim0, 4, harness::with_scope(manager),
                                    [&](const std::vector<at::Tensor>& p) { manager.exclude(p); });
    std::string why;
    CHECK_MESSAGE(harness::bitwise_equal(plain, run, &why), why);
    return offload::sim::device_memory(0).peak_bytes;
  };
  // This small model peaks in AdamW's step, after backward, with or without
  // offloading: at the peak, everything fits and the plan keeps tensors.
  M fits(offload::Options{.min_offload_bytes = 1, .device_target_bytes = peak});
  CHECK(train(fits) <= peak);
  CHECK(fits.stats().storages_offloaded > 0);  // the first step, nothing learned yet
  CHECK(fits.stats().passed_target > 0);
  CHECK(fits.stats().target_steps_planned == 3);
  // At 0.9 of it nothing offloaded reaches the target: the plan counts the
  // optimizer state the first step created, warns once and offloads
  // everything (the guard keeps nothing).
  harness::CollectWarnings warnings;
  M below(offload::Options{.min_offload_bytes = 1, .device_target_bytes = peak * 9 / 10});
  CHECK(train(below) <= peak);
  CHECK(below.stats().passed_target == 0);
  std::size_t ours = 0;
  for (const auto& m : warnings.messages) ours += m.find("device_target_bytes") != std::string::npos ? 1 : 0;
  CHECK(ours == 1);
}
