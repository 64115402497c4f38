// SPDX-License-Identifier: MIT
// offload-bench target: Options::device_target_bytes on sim. For the demo's
// GPT and LSTM (examples/demo/models.hpp) and a small CNN, under
// sync::Blocking and sync::Streamed: the step peak, the bytes moved and the
// step time at targets of 0.5, 0.7 and 0.9 of the peak without offloading,
// against offloading everything and none, all measured in the same run.

#include "bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../examples/demo/char_model.hpp"
#include "../examples/demo/models.hpp"

namespace bench {
namespace {

const c10::Device kSim(c10::DeviceType::PrivateUse1, 0);

// A small CNN: a stem and `blocks` conv-BatchNorm-ReLU blocks of 16
// channels at 32x32, average-pooled into a linear classifier.
class Cnn final : public torch::nn::Module {
 public:
  explicit Cnn(int blocks)
      : stem_(register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)))),
        head_(register_module("head", torch::nn::Linear(16, 10))) {
    for (int i = 0; i < blocks; ++i) {
      convs_.push_back(register_module("conv" + std::to_string(i),
                                       torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1).bias(false))));
      norms_.push_back(register_module("norm" + std::to_string(i), torch::nn::BatchNorm2d(16)));
    }
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = torch::relu(stem_(x));
    for (std::size_t i = 0; i < convs_.size(); ++i) h = torch::relu(norms_[i](convs_[i](h)));
    return torch::nn::functional::cross_entropy(head_(h.mean({2, 3})), y);
  }

 private:
  torch::nn::Conv2d stem_;
  torch::nn::Linear head_;
  std::vector<torch::nn::Conv2d> convs_;
  std::vector<torch::nn::BatchNorm2d> norms_;
};

// One benchmark model on sim:0: its parameters and its loss on fixed data.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor()> loss;
};

Model make_model(const std::string& name, bool quick) {
  torch::manual_seed(0);
  if (name == "cnn") {
    const std::int64_t batch = quick ? 4 : 16;
    auto m = std::make_shared<Cnn>(quick ? 4 : 8);
    m->to(kSim);
    const auto x = torch::randn({batch, 3, 32, 32}).to(kSim);
    const auto y = torch::randint(10, {batch}, torch::kLong).to(kSim);
    return {m, [m, x, y] { return m->loss(x, y); }};
  }
  // The demo's defaults (4 GPT blocks or 2 LSTM layers, width 128, seq 128,
  // batch 8); --quick: half the width and the sequence.
  const demo::ModelShape shape{.vocab = 64,
                               .layers = demo::model_kind(name).default_layers,
                               .width = quick ? 64 : 128,
                               .heads = 4,
                               .seq = quick ? 64 : 128};
  std::shared_ptr<demo::CharModel> m = demo::model_kind(name).make(shape);
  m->to(kSim);
  const auto data = torch::randint(shape.vocab, {8, shape.seq + 1}, torch::kLong);
  const auto x = data.narrow(1, 0, shape.seq).to(kSim);
  const auto y = data.narrow(1, 1, shape.seq).to(kSim);
  return {m, [m, x, y] { return m->loss(x, y); }};
}

enum class Policy { blocking, streamed };

offload::AnyManager make_manager(Policy policy, const offload::Options& options) {
  using offload::device::Sim;
  using offload::storage::PinnedHost;
  if (policy == Policy::blocking) return offload::Manager<Sim, PinnedHost, offload::sync::Blocking>(options);
  return offload::Manager<Sim, PinnedHost, offload::sync::Streamed>(options);
}

// What one run of `steps` training steps measured, per step.
struct Run {
  std::vector<std::int64_t> peaks;          // sim:0 allocated bytes, most over forward and backward
  std::vector<std::int64_t> forward_peaks;  // ... over forward (to the Scope's end)
  std::vector<std::int64_t> moved;          // bytes offloaded
  std::vector<std::int64_t> least;          // Stats::target_min_offload_bytes: the recorded step's minimum
  std::vector<std::int64_t> kept;           // Stats::passed_target: tensors the plan kept on the device
  std::vector<double> seconds;              // forward + backward + optimizer step
  std::vector<float> losses;
  std::int64_t guard = 0;  // Stats::target_guard_offloads, all steps
};

Run train(const std::string& name, bool quick, int steps, std::optional<offload::AnyManager> manager) {
  auto model = make_model(name, quick);
  if (manager) manager->exclude(model.module->parameters());
  torch::optim::AdamW optimizer(model.module->parameters(), torch::optim::AdamWOptions(1e-3));
  Run run;
  for (int s = 0; s < steps; ++s) {
    if (manager) manager->reset_stats();
    optimizer.zero_grad();
    offload::sim::synchronize(0);
    offload::sim::reset_peak(0);
    const auto t0 = Clock::now();
    torch::Tensor loss;
    {
      std::optional<offload::Scope> scope;
      if (manager) scope.emplace(*manager);
      loss = model.loss();
    }
    run.forward_peaks.push_back(offload::sim::device_memory(0).peak_bytes);
    loss.backward();
    offload::sim::synchronize(0);
    run.peaks.push_back(offload::sim::device_memory(0).peak_bytes);
    optimizer.step();
    run.losses.push_back(loss.item<float>());
    run.seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    const auto st = manager ? manager->stats() : offload::Stats{};
    run.moved.push_back(st.bytes_offloaded);
    run.least.push_back(st.target_min_offload_bytes);
    run.kept.push_back(st.passed_target);
    run.guard += st.target_guard_offloads;
  }
  return run;
}

// Mean of v over the planned steps (from the second on).
template <class T>
double planned_mean(const std::vector<T>& v) {
  double sum = 0;
  for (std::size_t i = 1; i < v.size(); ++i) sum += static_cast<double>(v[i]);
  return v.size() > 1 ? sum / static_cast<double>(v.size() - 1) : 0.0;
}

std::string times(double a, double b) { return b > 0 ? fixed(a / b, 2) + "x" : std::string("-"); }

/// planned_mean() of the list `row[key]`.
template <class T>
double planned_mean_of(const Json& row, const std::string& key) {
  return planned_mean(row.at(key).get<std::vector<T>>());
}

/// `column`, with "-" in the rows without a target.
Column if_targeted(Column column) {
  auto cell = std::move(column.cell);
  column.cell = [cell](const Json& row) { return integer(row, "target_bytes") > 0 ? cell(row) : std::string("-"); };
  return column;
}

/// The table of run_target(), read from its rows.
std::vector<Column> target_columns() {
  const auto moved = [](const Json& row) { return planned_mean_of<std::int64_t>(row, "bytes_moved"); };
  const auto seconds = [](const Json& row) { return planned_mean_of<double>(row, "seconds"); };
  return {
      text_column("model", "model"),
      {"sync", "", [](const Json& row) { return has(row, "sync") ? row.at("sync").get<std::string>() : "-"; }},
      text_column("run", "run"),
      if_targeted(mib_column("target", "target_bytes")),
      if_targeted({"max peak / target: steps 2+ / 4+", "",
                   [](const Json& row) {
                     return fixed(number(row, "max_peak_over_target"), 3) + " / " +
                            fixed(number(row, "max_peak_over_target_from_step_4"), 3) +
                            (row.at("feasible").get<bool>() ? "" : " (cannot be met)");
                   }}),
      {"moved", "MiB/step", [moved](const Json& row) { return mib(static_cast<std::int64_t>(moved(row))); }},
      if_targeted({"/ minimum: 2+ / 4+", "",
                   [](const Json& row) {
                     const double worst = number(row, "max_moved_over_minimum");
                     return worst > 0 ? fixed(worst, 3) + "x / " +
                                            fixed(number(row, "max_moved_over_minimum_from_step_4"), 3) + "x"
                                      : std::string("-");
                   }}),
      if_targeted({"/ floor", "", [moved](const Json& row) { return times(moved(row), number(row, "floor_bytes")); }}),
      {"/ everything", "",
       [moved](const Json& row) { return times(moved(row), number(row, "everything_moved_bytes")); }},
      if_targeted(
          {"kept", "", [](const Json& row) { return fixed(planned_mean_of<std::int64_t>(row, "kept_tensors"), 1); }}),
      {"step", "s", [seconds](const Json& row) { return fixed(seconds(row), 3); }},
      {"/ everything", "",
       [seconds](const Json& row) { return times(seconds(row), number(row, "everything_seconds")); }},
      {"/ none", "", [seconds](const Json& row) { return times(seconds(row), number(row, "none_seconds")); }},
      {"losses", "",
       [](const Json& row) { return row.at("losses_bitwise_equal").get<bool>() ? "bitwise equal" : "DIFFER"; }},
  };
}

}  // namespace

int run_target(const Args& args) {
  const int steps = args.quick ? 4 : 6;
  std::cout << "## A device-memory target (Options::device_target_bytes) on sim\n\n"
            << "Each model trains " << steps << " AdamW steps per run on sim:0 from the same weights and data "
            << "(library defaults otherwise, parameters excluded); sim's link model as configured. peak: sim's most "
               "allocated bytes over forward and backward of a step. Targets are fractions of the most a step "
               "without offloading allocated, measured in the same run. The first step of a target run offloads "
               "everything (nothing learned yet), so every figure below is of steps 2 on: max peak / target the "
               "worst step from step 2 on / from step 4 on (steps 2 and 3 follow the first optimizer step, "
               "which adds its state: a step unlike the one it was planned from; \"cannot be met\": offloading "
               "everything peaks above the target, the manager warned and offloaded everything); moved the mean bytes "
               "offloaded per step; / minimum the worst step's "
               "bytes moved over the analytical minimum of that step's record (Stats::target_min_offload_bytes of "
               "the step after it, which is planned from it: the fewest eligible bytes whose offloading keeps "
               "every recorded point under the target less the reserve; steps 2 / 4 to " +
                   std::to_string(steps - 1) +
                   "); / floor the mean over peak(none) - target, the bytes that must be off the device at the "
                   "peak without offloading; kept: tensors the plan kept on the device per step.\n\n";
  std::vector<Json> rows;
  bool met = true;       // steps 2 on
  bool met_late = true;  // steps 4 on
  for (const std::string name : {"gpt", "cnn", "lstm"}) {
    const auto none = train(name, args.quick, steps, std::nullopt);
    const auto peak_none = *std::max_element(none.peaks.begin(), none.peaks.end());
    const double time_none = planned_mean(none.seconds);
    const auto equal = [&](const Run& r) {
      return r.losses.size() == none.losses.size() &&
             std::memcmp(r.losses.data(), none.losses.data(), sizeof(float) * none.losses.size()) == 0;
    };
    for (const Policy policy : {Policy::blocking, Policy::streamed}) {
      const std::string sync = policy == Policy::blocking ? "Blocking" : "Streamed";
      const auto all = train(name, args.quick, steps, make_manager(policy, offload::Options{}));
      const double moved_all = planned_mean(all.moved);
      const double time_all = planned_mean(all.seconds);
      const auto peak_all = *std::max_element(all.peaks.begin() + 1, all.peaks.end());
      const auto add = [&](const std::string& run, const Run& r, std::int64_t target) {
        // The worst step from step 2 on, and from step 4 on (after the
        // steps that follow the first optimizer step, which adds its state).
        double worst = 0, worst_late = 0;          // peak / target
        double worst_min = 0, worst_min_late = 0;  // moved / minimum
        for (std::size_t i = 1; i < r.peaks.size(); ++i) {
          const double over = static_cast<double>(r.peaks[i]) / static_cast<double>(target);
          worst = std::max(worst, over);
          if (i >= 3) worst_late = std::max(worst_late, over);
          if (i + 1 < r.peaks.size() && r.least[i + 1] > 0) {
            const double x = static_cast<double>(r.moved[i]) / static_cast<double>(r.least[i + 1]);
            worst_min = std::max(worst_min, x);
            if (i >= 3) worst_min_late = std::max(worst_min_late, x);
          }
        }
        const bool feasible = peak_all <= target;
        const double moved = planned_mean(r.moved);
        const double floor = static_cast<double>(std::max<std::int64_t>(0, peak_none - target));
        const bool targeted = target > 0;
        if (!equal(r) || (targeted && ((feasible && worst > 1.02) || worst_min > 1.10))) met = false;
        if (!equal(r) || (targeted && ((feasible && worst_late > 1.02) || worst_min_late > 1.10))) met_late = false;
        rows.push_back(
            Json::object({{"model", Json(name)},
                          {"sync", run == "none" ? Json(nullptr) : Json(sync)},
                          {"run", Json(run)},
                          {"target_bytes", Json(target)},
                          {"peak_none_bytes", Json(peak_none)},
                          {"peaks", Json(r.peaks)},
                          {"forward_peaks", Json(r.forward_peaks)},
                          {"bytes_moved", Json(r.moved)},
                          {"minimum_bytes", Json(r.least)},
                          {"kept_tensors", Json(r.kept)},
                          {"floor_bytes", Json(floor)},
                          {"seconds", Json(r.seconds)},
                          {"max_peak_over_target", targeted ? Json(worst) : Json(nullptr)},
                          {"max_peak_over_target_from_step_4", targeted ? Json(worst_late) : Json(nullptr)},
                          {"feasible", targeted ? Json(feasible) : Json(nullptr)},
                          {"max_moved_over_minimum", targeted ? Json(worst_min) : Json(nullptr)},
                          {"max_moved_over_minimum_from_step_4", targeted ? Json(worst_min_late) : Json(nullptr)},
                          {"moved_over_everything", Json(moved_all > 0 ? moved / moved_all : 0.0)},
                          {"everything_moved_bytes", Json(moved_all)},
                          {"everything_seconds", Json(time_all)},
                          {"none_seconds", Json(time_none)},
                          {"guard_offloads", Json(r.guard)},
                          {"losses_bitwise_equal", Json(equal(r))}}));
      };
      if (policy == Policy::blocking) add("none", none, 0);
      add("everything", all, 0);
      for (const double fraction : {0.5, 0.7, 0.9}) {
        const auto target = static_cast<std::int64_t>(fraction * static_cast<double>(peak_none));
        add(fixed(fraction, 1) + " x peak",
            train(name, args.quick, steps, make_manager(policy, offload::Options{.device_target_bytes = target})),
            target);
      }
    }
  }
  print_rows(target_columns(), rows);
  std::cout << "\n"
            << (met ? "every target cell: peak within 1.02 of its target (where it can be met), bytes moved within "
                      "1.10x of the minimum, losses bitwise equal"
                    : "SOME target cell misses a peak within 1.02 of its target (where it can be met), bytes moved "
                      "within 1.10x of the minimum, or bitwise equal losses")
            << " from step 2 on; from step 4 on: " << (met_late ? "every cell" : "SOME cell misses") << "\n";
  auto json = header(args, torch_version());
  json.push_back({"steps", Json(steps)});
  json.push_back({"rows", Json(rows)});
  json.push_back({"met", Json(met)});
  json.push_back({"met_from_step_4", Json(met_late)});
  write_result(args, "target.json", json);
  return 0;
}

}  // namespace bench
