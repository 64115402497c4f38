// SPDX-License-Identifier: MIT
// offload-bench target: Options::device_target_bytes on sim. For the demo's
// GPT and LSTM (models/registry.hpp) and a small CNN, under
// sync::Blocking and sync::Streamed: the step peak, the bytes moved and the
// step time at targets of 0.5, 0.7 and 0.9 of the peak without offloading,
// against offloading everything and none, all measured in the same run.

#include "bench.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../models/char_model.hpp"
#include "../models/registry.hpp"
#include "sim_training.hpp"

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
  const models::ModelShape shape{.vocab = 64,
                                 .layers = models::model_kind(name).default_layers,
                                 .width = quick ? 64 : 128,
                                 .heads = 4,
                                 .seq = quick ? 64 : 128};
  std::shared_ptr<models::CharModel> m = models::model_kind(name).make(shape);
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
  Run run;
  for (const auto& step : train_on_sim(model.module->parameters(), model.loss, manager, steps)) {
    run.forward_peaks.push_back(step.forward_peak);
    run.peaks.push_back(step.peak);
    run.losses.push_back(step.loss);
    run.seconds.push_back(step.seconds);
    run.moved.push_back(step.stats.bytes_offloaded);
    run.least.push_back(step.stats.target_min_offload_bytes);
    run.kept.push_back(step.stats.passed_target);
    run.guard += step.stats.target_guard_offloads;
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

/// The worst steps of a run against its target: from step 2 on, and from
/// step 4 on (after the steps that follow the first optimizer step, which
/// adds its state).
struct Worst {
  double peak = 0, peak_late = 0;    // peak / target
  double moved = 0, moved_late = 0;  // moved / minimum
};

Worst worst_of(const Run& r, std::int64_t target) {
  Worst w;
  for (std::size_t i = 1; i < r.peaks.size(); ++i) {
    const double over = static_cast<double>(r.peaks[i]) / static_cast<double>(target);
    w.peak = std::max(w.peak, over);
    if (i >= 3) w.peak_late = std::max(w.peak_late, over);
    if (i + 1 < r.peaks.size() && r.least[i + 1] > 0) {
      const double x = static_cast<double>(r.moved[i]) / static_cast<double>(r.least[i + 1]);
      w.moved = std::max(w.moved, x);
      if (i >= 3) w.moved_late = std::max(w.moved_late, x);
    }
  }
  return w;
}

/// What the runs of one model and policy are measured against: the run
/// without offloading and the one that offloads everything.
struct References {
  std::string model, sync;
  const Run& none;
  std::int64_t peak_none = 0;
  double time_none = 0;
  double moved_all = 0, time_all = 0;
  std::int64_t peak_all = 0;  // from step 2 on

  bool equal(const Run& r) const {
    return r.losses.size() == none.losses.size() &&
           std::memcmp(r.losses.data(), none.losses.data(), sizeof(float) * none.losses.size()) == 0;
  }
};

/// Whether every cell met the targets from step 2 on, and from step 4 on.
struct Verdict {
  bool met = true, met_late = true;
};

/// The row of `run` (named `name`) at `target` (0: none), and its verdict.
Json target_row(const std::string& name, const Run& r, std::int64_t target, const References& ref, Verdict& verdict) {
  const Worst w = worst_of(r, target);
  const bool feasible = ref.peak_all <= target;
  const double moved = planned_mean(r.moved);
  const double floor = static_cast<double>(std::max<std::int64_t>(0, ref.peak_none - target));
  const bool targeted = target > 0;
  const bool equal = ref.equal(r);
  if (!equal || (targeted && ((feasible && w.peak > 1.02) || w.moved > 1.10))) verdict.met = false;
  if (!equal || (targeted && ((feasible && w.peak_late > 1.02) || w.moved_late > 1.10))) verdict.met_late = false;
  return Json::object({{"model", Json(ref.model)},
                       {"sync", name == "none" ? Json(nullptr) : Json(ref.sync)},
                       {"run", Json(name)},
                       {"target_bytes", Json(target)},
                       {"peak_none_bytes", Json(ref.peak_none)},
                       {"peaks", Json(r.peaks)},
                       {"forward_peaks", Json(r.forward_peaks)},
                       {"bytes_moved", Json(r.moved)},
                       {"minimum_bytes", Json(r.least)},
                       {"kept_tensors", Json(r.kept)},
                       {"floor_bytes", Json(floor)},
                       {"seconds", Json(r.seconds)},
                       {"max_peak_over_target", targeted ? Json(w.peak) : Json(nullptr)},
                       {"max_peak_over_target_from_step_4", targeted ? Json(w.peak_late) : Json(nullptr)},
                       {"feasible", targeted ? Json(feasible) : Json(nullptr)},
                       {"max_moved_over_minimum", targeted ? Json(w.moved) : Json(nullptr)},
                       {"max_moved_over_minimum_from_step_4", targeted ? Json(w.moved_late) : Json(nullptr)},
                       {"moved_over_everything", Json(ref.moved_all > 0 ? moved / ref.moved_all : 0.0)},
                       {"everything_moved_bytes", Json(ref.moved_all)},
                       {"everything_seconds", Json(ref.time_all)},
                       {"none_seconds", Json(ref.time_none)},
                       {"guard_offloads", Json(r.guard)},
                       {"losses_bitwise_equal", Json(equal)}});
}

/// The rows of model `name`: without offloading (once), then per policy
/// everything and the targets 0.5, 0.7, 0.9 x the peak without offloading.
void add_model_rows(const std::string& name, bool quick, int steps, std::vector<Json>& rows, Verdict& verdict) {
  const auto none = train(name, quick, steps, std::nullopt);
  const auto peak_none = *std::max_element(none.peaks.begin(), none.peaks.end());
  for (const Policy policy : {Policy::blocking, Policy::streamed}) {
    const auto all = train(name, quick, steps, make_manager(policy, offload::Options{}));
    const References ref{.model = name,
                         .sync = policy == Policy::blocking ? "Blocking" : "Streamed",
                         .none = none,
                         .peak_none = peak_none,
                         .time_none = planned_mean(none.seconds),
                         .moved_all = planned_mean(all.moved),
                         .time_all = planned_mean(all.seconds),
                         .peak_all = *std::max_element(all.peaks.begin() + 1, all.peaks.end())};
    if (policy == Policy::blocking) rows.push_back(target_row("none", none, 0, ref, verdict));
    rows.push_back(target_row("everything", all, 0, ref, verdict));
    for (const double fraction : {0.5, 0.7, 0.9}) {
      const auto target = static_cast<std::int64_t>(fraction * static_cast<double>(peak_none));
      const auto run = train(name, quick, steps, make_manager(policy, offload::Options{.device_target_bytes = target}));
      rows.push_back(target_row(fixed(fraction, 1) + " x peak", run, target, ref, verdict));
    }
  }
}

void print_intro(int steps) {
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
}

}  // namespace

int run_target(const Args& args) {
  const int steps = args.quick ? 4 : 6;
  print_intro(steps);
  std::vector<Json> rows;
  Verdict verdict;
  for (const std::string name : {"gpt", "cnn", "lstm"}) add_model_rows(name, args.quick, steps, rows, verdict);
  const bool met = verdict.met, met_late = verdict.met_late;
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
