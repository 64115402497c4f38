// SPDX-License-Identifier: MIT
// The automatic plan (CheckpointOptions::planned under a manager with
// Options::device_target_bytes) on sim: the first step recomputes every
// block, later steps keep, offload or recompute each so the peak stays
// under the target, every step is bitwise the run without offloading,
// a target above the peak keeps everything and moves nothing, one below
// what recomputing everything reaches warns once and recomputes, and a
// change of shapes measures again and re-plans.

#include "doctest.hpp"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <optional>
#include <string>
#include <vector>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "fixture.hpp"
#include "harness.hpp"
#include "warnings.hpp"

namespace {

constexpr const char* kSuiteOnSim =
    "the plan is made from sim's allocated-memory counts and link, with sim's copy latency and poisoning";

using Blocking = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Blocking>;
using Streamed = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Streamed>;
using fixture::sim0;

struct SlowPoisonedSim : fixture::SlowPoisonedSim {
  SlowPoisonedSim() : fixture::SlowPoisonedSim(100) {}
};

enum class How { plain, checkpoint, planned };

// Blocks of a small MLP with residuals, width 64, hidden 256: each saves
// its input, the hidden product and its tanh ([batch, 64] + 2 x [batch,
// 256] floats); the weights are parameters.
struct Model {
  static constexpr int kBlocks = 6;
  explicit Model(c10::Device on = sim0) : device(on) {
    at::manual_seed(0);
    for (int i = 0; i < kBlocks; ++i) {
      up.push_back((at::randn({64, 256}) / 8).to(device).requires_grad_());
      down.push_back((at::randn({256, 64}) / 16).to(device).requires_grad_());
    }
  }
  std::vector<at::Tensor> params() const {
    auto out = up;
    out.insert(out.end(), down.begin(), down.end());
    return out;
  }
  at::Tensor loss(std::int64_t batch, How how) const {
    at::manual_seed(1);
    auto h = at::randn({batch, 64}).to(device);
    for (int i = 0; i < kBlocks; ++i) {
      offload::Block block = [u = up[i], d = down[i]](const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{in[0] + at::matmul(at::tanh(at::matmul(in[0], u)), d)};
      };
      if (how == How::plain) {
        h = block({h})[0];
      } else {
        h = offload::checkpoint(block, {h}, {.name = "block" + std::to_string(i), .planned = how == How::planned})[0];
      }
    }
    return h.pow(2).mean();
  }
  c10::Device device;
  std::vector<at::Tensor> up, down;
};

using harness::same;
using harness::Step;

// One step of `model` on its device (harness::train_step), inside a Scope
// of `manager` when one is given.
Step step(const Model& model, std::int64_t batch, How how, const offload::AnyManager* manager) {
  return harness::train_step(model.params(), model.device, [&] { return model.loss(batch, how); }, manager);
}

// The peaks the targets are placed between: no offloading, and every block
// recomputed with its input offloaded.
struct Bounds {
  Step plain;
  std::int64_t recompute_all = 0;
};
template <class M>
Bounds bounds(const Model& model, std::int64_t batch) {
  Bounds out;
  out.plain = step(model, batch, How::plain, nullptr);
  const offload::AnyManager all = M(offload::Options{});
  (void)step(model, batch, How::checkpoint, &all);
  out.recompute_all = step(model, batch, How::checkpoint, &all).peak;
  return out;
}

std::int64_t between(const Bounds& b, double fraction) {
  return b.recompute_all + static_cast<std::int64_t>(fraction * static_cast<double>(b.plain.peak - b.recompute_all));
}

}  // namespace

TEST_CASE_TEMPLATE("plan: the first step recomputes every block, later ones meet the target, bitwise" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking, Streamed) {
  const SlowPoisonedSim sim;
  const Model model;
  const auto b = bounds<M>(model, 512);
  REQUIRE(b.recompute_all < b.plain.peak);
  for (const double fraction : {0.25, 0.5, 0.75}) {
    CAPTURE(fraction);
    const auto target = between(b, fraction);
    offload::AnyManager manager = M(offload::Options{.device_target_bytes = target});
    bool not_all_recomputed = false;
    for (int s = 0; s < 5; ++s) {
      CAPTURE(s);
      manager.reset_stats();
      const auto run = step(model, 512, How::planned, &manager);
      CHECK(same(run, b.plain));
      const auto stats = manager.stats();
      MESSAGE("peak " << run.peak << " (forward " << run.forward_peak << ") target " << target << " plain "
                      << b.plain.peak << " recompute all " << b.recompute_all << " kept " << stats.blocks_kept
                      << " offloaded " << stats.blocks_offloaded << " recomputed " << stats.blocks_recomputed
                      << " moved " << stats.bytes_offloaded << " predicted " << stats.plan_predicted_step_us
                      << " us measured " << stats.plan_measured_step_us << " us");
      CHECK(stats.blocks_kept + stats.blocks_offloaded + stats.blocks_recomputed == Model::kBlocks);
      CHECK(run.peak < b.plain.peak);  // the target is below it: something was offloaded or recomputed
      CHECK((stats.bytes_offloaded > 0 || stats.blocks_recomputed > 0));
      if (s == 0) {
        CHECK(stats.blocks_recomputed == Model::kBlocks);
        continue;
      }
      CHECK(run.peak <= target + target / 50);
      CHECK(stats.plan_predicted_step_us > 0);
      if (stats.blocks_recomputed < Model::kBlocks) not_all_recomputed = true;
    }
    CHECK(not_all_recomputed);  // the target leaves room: not every block is rebuilt
    // The measuring step recorded each block's point and time in backward.
    const auto summary = offload::interface_of(manager)->block_planner()->summary();
    CHECK(summary.find("backward peak -1") == std::string::npos);
    CHECK(summary.find("recomputed in -1") == std::string::npos);
  }
}

TEST_CASE_TEMPLATE("plan: a model on sim:1 is planned from sim:1's memory, whatever sim:0 holds" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking, Streamed) {
  // One process per accelerator: the current device is the model's, and
  // another device of the process holds more than the whole step.
  const SlowPoisonedSim sim;
  const c10::DeviceGuard current(fixture::sim1);
  const Model model(fixture::sim1);
  const auto b = bounds<M>(model, 512);
  const auto target = between(b, 0.5);
  // sim:0 peaked at twice the step's peak and holds a quarter of it now.
  offload::sim::reset_peak(0);
  const auto byte_on_sim0 = at::TensorOptions().dtype(at::kByte).device(sim0);
  (void)at::empty({2 * b.plain.peak}, byte_on_sim0);
  const auto elsewhere = at::empty({b.plain.peak / 4}, byte_on_sim0);
  offload::AnyManager manager = M(offload::Options{.device_target_bytes = target});
  for (int s = 0; s < 4; ++s) {
    CAPTURE(s);
    manager.reset_stats();
    const auto run = step(model, 512, How::planned, &manager);
    CHECK(same(run, b.plain));
    const auto stats = manager.stats();
    MESSAGE("peak " << run.peak << " target " << target << " plain " << b.plain.peak << " kept " << stats.blocks_kept
                    << " recomputed " << stats.blocks_recomputed);
    if (s == 0) continue;
    // The measuring step's peaks were sim:1's (its forward's own, not -1).
    const auto summary = offload::interface_of(manager)->block_planner()->summary();
    CHECK_MESSAGE(summary.find("(forward -1 B") == std::string::npos, summary);
    CHECK(run.peak <= target + target / 50);
    CHECK(stats.blocks_recomputed < Model::kBlocks);  // planned from sim:1's peaks: the target leaves room
  }
}

TEST_CASE("plan: over a slow link blocks are recomputed with their inputs kept where they fit, bitwise" *
          fixture::sim_only{kSuiteOnSim}) {
  const SlowPoisonedSim sim;
  const Model model;
  const auto b = bounds<Blocking>(model, 512);
  // 0.02 GB/s: a block's saved bytes take 30 ms to copy, its forward about
  // 1 ms; recomputing is cheaper, and keeping a 128 KiB input saves its
  // copies (blocking: both exposed). At a quarter of the way to the plain
  // peak that leaves room for two kept blocks and the other four's inputs.
  offload::sim::set_copy_bandwidth_gbps(0.02);
  const auto target = between(b, 0.25);
  offload::AnyManager manager = Blocking(offload::Options{.device_target_bytes = target});
  for (int s = 0; s < 4; ++s) {
    CAPTURE(s);
    manager.reset_stats();
    const auto run = step(model, 512, How::planned, &manager);
    CHECK(same(run, b.plain));
    if (s == 0) continue;
    CHECK(run.peak <= target + target / 50);
    CHECK(manager.stats().blocks_recomputed > 0);
  }
  const auto summary = offload::interface_of(manager)->block_planner()->summary();
  CHECK_MESSAGE(summary.find(": recompute (input kept)") != std::string::npos, summary);
}

TEST_CASE_TEMPLATE("plan: a target above the peak keeps every block and moves nothing from the second step" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking, Streamed) {
  const SlowPoisonedSim sim;
  const Model model;
  const auto plain = step(model, 512, How::plain, nullptr);
  offload::AnyManager manager = M(offload::Options{.device_target_bytes = plain.peak * 2});
  for (int s = 0; s < 4; ++s) {
    CAPTURE(s);
    manager.reset_stats();
    const auto run = step(model, 512, How::planned, &manager);
    CHECK(same(run, plain));
    const auto stats = manager.stats();
    if (s >= 1) CHECK(stats.blocks_kept == Model::kBlocks);
    // What no block saves (the loss's input) is kept too, from the first
    // planned step.
    if (s >= 1) CHECK(stats.bytes_offloaded == 0);
  }
}

TEST_CASE_TEMPLATE("plan: a target below what recomputing every block reaches warns once and recomputes" *
                       fixture::sim_only{kSuiteOnSim},
                   M, Blocking, Streamed) {
  const SlowPoisonedSim sim;
  const Model model;
  const auto b = bounds<M>(model, 512);
  const auto target = b.recompute_all / 2;
  offload::AnyManager manager = M(offload::Options{.device_target_bytes = target});
  harness::CollectWarnings warnings;
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    manager.reset_stats();
    CHECK(same(step(model, 512, How::planned, &manager), b.plain));
    CHECK(manager.stats().blocks_recomputed == Model::kBlocks);
  }
  std::vector<std::string> ours;
  for (const auto& m : warnings.messages) {
    if (m.find("recomputing every planned block") != std::string::npos) ours.push_back(m);
  }
  REQUIRE(ours.size() == 1);
  CHECK(ours[0].find("device_target_bytes " + std::to_string(target) + " is below") != std::string::npos);
}

TEST_CASE_TEMPLATE(
    "plan: a device peak reached before the measuring step is no block's own and does not stop the plan" *
        fixture::sim_only{kSuiteOnSim},
    M, Blocking, Streamed) {
  // The device's running peak is left high by what ran before (an earlier
  // run, a larger evaluation pass), and nobody resets it: the measuring
  // step's stretches in backward cannot raise it, so they were taken as
  // that peak, the plan found nothing under the target but recomputing
  // everything, and said the target was too low.
  const SlowPoisonedSim sim;
  const Model model;
  const auto b = bounds<M>(model, 512);
  const auto target = between(b, 0.5);
  offload::AnyManager manager = M(offload::Options{.device_target_bytes = target});
  harness::CollectWarnings warnings;
  harness::reset_peak(sim0);
  {
    const auto big = at::empty({2 * b.plain.peak}, at::TensorOptions().dtype(at::kByte).device(sim0));
  }
  bool planned = false;
  for (int s = 0; s < 4; ++s) {
    CAPTURE(s);
    manager.reset_stats();
    // harness::train_step without its reset of the device's peak.
    for (const auto& p : model.params()) const_cast<at::Tensor&>(p).mutable_grad() = at::Tensor();
    at::Tensor loss;
    {
      const offload::Scope scope(manager);
      loss = model.loss(512, How::planned);
    }
    loss.backward();
    harness::synchronize(sim0);
    harness::Step run;
    run.loss = loss.item<float>();
    for (const auto& p : model.params()) run.grads.push_back(p.grad().to(at::kCPU));
    CHECK(same(run, b.plain));
    if (s > 0 && manager.stats().blocks_recomputed < Model::kBlocks) planned = true;
  }
  CHECK(planned);
  for (const auto& m : warnings.messages)
    CHECK_MESSAGE(m.find("recomputing every planned block") == std::string::npos, m);
  const auto summary = offload::interface_of(manager)->block_planner()->summary();
  // No block is said to have peaked where the device did before the step.
  const std::string key = "backward peak ";
  for (auto at = summary.find(key); at != std::string::npos; at = summary.find(key, at + 1)) {
    CHECK_MESSAGE(std::stoll(summary.substr(at + key.size())) < 2 * b.plain.peak, summary);
  }
}

TEST_CASE_TEMPLATE("plan: a change of shapes recomputes, measures again and re-plans" * fixture::sim_only{kSuiteOnSim},
                   M, Blocking, Streamed) {
  const SlowPoisonedSim sim;
  const Model model;
  const auto small = bounds<M>(model, 256);
  const auto large = bounds<M>(model, 512);
  const auto target = between(large, 0.5);
  offload::AnyManager manager = M(offload::Options{.device_target_bytes = target});
  for (int s = 0; s < 7; ++s) {
    CAPTURE(s);
    const std::int64_t batch = s < 3 ? 256 : 512;
    manager.reset_stats();
    const auto run = step(model, batch, How::planned, &manager);
    CHECK(same(run, batch == 256 ? small.plain : large.plain));
    const auto stats = manager.stats();
    MESSAGE("batch " << batch << " peak " << run.peak << " target " << target << " kept " << stats.blocks_kept
                     << " offloaded " << stats.blocks_offloaded << " recomputed " << stats.blocks_recomputed);
    if (s > 0) CHECK(run.peak <= target + target / 50);
    // Steps 3 (the blocks the plan did not expect) and 4 (measuring)
    // recompute every block; 5 is planned again.
    if (s == 0 || s == 3 || s == 4) CHECK(stats.blocks_recomputed == Model::kBlocks);
    if (s == 2 || s == 5 || s == 6) CHECK(stats.blocks_recomputed < Model::kBlocks);
  }
}

TEST_CASE("plan: planned blocks without a target run as they are" * fixture::sim_only{kSuiteOnSim}) {
  const SlowPoisonedSim sim;
  const Model model;
  const auto plain = step(model, 256, How::plain, nullptr);
  // No scope: nothing offloaded, no checkpoint.
  CHECK(same(step(model, 256, How::planned, nullptr), plain));
  // A manager without a target: every block's saved tensors go through it.
  offload::AnyManager manager = Blocking(offload::Options{});
  CHECK(same(step(model, 256, How::planned, &manager), plain));
  const auto stats = manager.stats();
  CHECK(stats.blocks_kept + stats.blocks_offloaded + stats.blocks_recomputed == 0);
  CHECK(stats.tensors_offloaded >= Model::kBlocks * 3);  // what the blocks saved, not only their inputs
}

TEST_CASE("plan: a scope of the same manager inside the step, and a planned block inside another, count once" *
          fixture::sim_only{kSuiteOnSim}) {
  const SlowPoisonedSim sim;
  const Model model;
  offload::AnyManager manager = Blocking(offload::Options{.device_target_bytes = std::int64_t{1} << 30});
  const auto plain_loss = model.loss(64, How::plain).item<float>();
  for (int s = 0; s < 3; ++s) {
    CAPTURE(s);
    at::Tensor loss;
    {
      const offload::Scope step(manager);
      at::manual_seed(1);
      auto h = at::randn({64, 64}).to(sim0);
      for (int i = 0; i < Model::kBlocks; ++i) {
        offload::Block inner = [u = model.up[i], d = model.down[i]](const std::vector<at::Tensor>& in) {
          return std::vector<at::Tensor>{in[0] + at::matmul(at::tanh(at::matmul(in[0], u)), d)};
        };
        // The outer block runs the inner one, also planned, inside a
        // scope of the same manager: still one block of one step.
        offload::Block outer = [&manager, inner](const std::vector<at::Tensor>& in) {
          const offload::Scope nested(manager);
          return offload::checkpoint(inner, in, {.name = "inner", .planned = true});
        };
        h = offload::checkpoint(outer, {h}, {.name = "outer", .planned = true})[0];
      }
      loss = h.pow(2).mean();
    }
    loss.backward();
    CHECK(loss.item<float>() == plain_loss);
    const auto stats = manager.stats();
    CHECK(stats.blocks_kept + stats.blocks_offloaded + stats.blocks_recomputed == Model::kBlocks);
    if (s > 0) CHECK(stats.blocks_kept == Model::kBlocks);  // the target leaves room for every block
  }
}
