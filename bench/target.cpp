// SPDX-License-Identifier: MIT
// offload-bench target: Options::device_target_bytes on sim. For the demo's
// GPT and LSTM (examples/demo/models.hpp) and a small CNN, the step peak,
// the bytes moved and the step time at targets of 0.5, 0.7 and 0.9 of the
// peak without offloading, against offloading everything and none, all in
// the same run.

#include "bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>

#include <torch/nn/functional/activation.h>
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
using Streamed = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Streamed>;

// A small CNN: a stem and `blocks` conv-BatchNorm-ReLU blocks of 16
// channels at 32x32, average-pooled into a linear classifier.
class Cnn final : public torch::nn::Module {
 public:
  explicit Cnn(int blocks) : stem_(register_module("stem", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 16, 3).padding(1)))) {
    for (int i = 0; i < blocks; ++i) {
      convs_.push_back(register_module("conv" + std::to_string(i),
                                       torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 16, 3).padding(1).bias(false))));
      norms_.push_back(register_module("norm" + std::to_string(i), torch::nn::BatchNorm2d(16)));
    }
    head_ = register_module("head", torch::nn::Linear(16, 10));
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    auto h = torch::relu(stem_(x));
    for (std::size_t i = 0; i < convs_.size(); ++i) h = torch::relu(norms_[i](convs_[i](h)));
    return torch::nn::functional::cross_entropy(head_(h.mean({2, 3})), y);
  }

 private:
  torch::nn::Conv2d stem_;
  std::vector<torch::nn::Conv2d> convs_;
  std::vector<torch::nn::BatchNorm2d> norms_;
  torch::nn::Linear head_{nullptr};
};

// One benchmark model on sim:0: its parameters and its loss on fixed data.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor()> loss;
};

Model make_model(const std::string& name, bool quick) {
  torch::manual_seed(0);
  if (name == "cnn") {
    auto m = std::make_shared<Cnn>(quick ? 4 : 8);
    m->to(kSim);
    const auto x = torch::randn({quick ? 4 : 8, 3, 32, 32}).to(kSim);
    const auto y = torch::randint(10, {quick ? 4 : 8}, torch::kLong).to(kSim);
    return {m, [m, x, y] { return m->loss(x, y); }};
  }
  const demo::ModelShape shape{.vocab = 64, .layers = quick ? 2 : 4, .width = 64, .heads = 4, .seq = 64};
  std::shared_ptr<demo::CharModel> m = demo::model_kind(name).make(shape);
  m->to(kSim);
  const auto data = torch::randint(shape.vocab, {8, shape.seq + 1}, torch::kLong);
  const auto x = data.narrow(1, 0, shape.seq).to(kSim);
  const auto y = data.narrow(1, 1, shape.seq).to(kSim);
  return {m, [m, x, y] { return m->loss(x, y); }};
}

// What one run of `steps` training steps measured, per step.
struct Run {
  std::vector<std::int64_t> peaks;  // sim:0 peak over forward and backward
  std::vector<std::int64_t> moved;  // bytes offloaded
  std::vector<std::int64_t> least;  // the plan's analytical minimum (target runs)
  std::vector<double> seconds;      // forward + backward + optimizer step
  std::vector<float> losses;
  std::int64_t guard = 0;
};

Run train(const std::string& name, bool quick, int steps, std::optional<Streamed> manager) {
  auto model = make_model(name, quick);
  if (manager) manager->exclude(model.module->parameters());
  torch::optim::AdamW optimizer(model.module->parameters(), torch::optim::AdamWOptions(1e-3));
  Run run;
  for (int s = 0; s < steps; ++s) {
    if (manager) manager->reset_stats();
    optimizer.zero_grad();
    offload::sim::synchronize(0);
    offload::sim::reset_peak(0);
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor loss;
    {
      std::optional<offload::Scope> scope;
      if (manager) scope.emplace(*manager);
      loss = model.loss();
    }
    loss.backward();
    offload::sim::synchronize(0);
    run.peaks.push_back(offload::sim::device_memory(0).peak_bytes);
    optimizer.step();
    run.losses.push_back(loss.item<float>());
    run.seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    const auto st = manager ? manager->stats() : offload::Stats{};
    run.moved.push_back(st.bytes_offloaded);
    run.least.push_back(st.target_min_offload_bytes);
    run.guard += st.target_guard_offloads;
  }
  return run;
}

// Mean of v from index 1 on (the planned steps), or of all when one.
template <class T>
double planned_mean(const std::vector<T>& v) {
  const std::size_t from = v.size() > 1 ? 1 : 0;
  double sum = 0;
  for (std::size_t i = from; i < v.size(); ++i) sum += static_cast<double>(v[i]);
  return sum / static_cast<double>(v.size() - from);
}

}  // namespace

int run_target(const Args& args) {
  const int steps = args.quick ? 3 : 5;
  std::cout << "## A device-memory target (Options::device_target_bytes) on sim\n\n"
            << "Each model trains " << steps << " AdamW steps per run on sim:0 (sync::Streamed, library defaults "
            << "otherwise; parameters excluded); every run is from the same weights and data. peak: sim's allocated "
               "bytes over forward and backward of a step. Targets are fractions of the peak without offloading, "
               "measured in the same run; the first step of a target run offloads everything, so its figures are of "
               "steps 2 on. minimum: the plan's analytical minimum (the fewest eligible bytes whose offloading keeps "
               "the recorded step under the target, Stats::target_min_offload_bytes); floor: peak(none) - target, the "
               "bytes that must leave the device at the peak without offloading.\n\n";
  Table table({"model", "run", "target MiB", "max peak/target", "moved MiB/step", "/ minimum", "/ floor",
               "/ everything", "step s", "/ everything", "/ none", "losses"});
  std::vector<Json> rows;
  bool met = true;
  for (const std::string name : {"gpt", "cnn", "lstm"}) {
    const auto none = train(name, args.quick, steps, std::nullopt);
    const auto peak_none = *std::max_element(none.peaks.begin(), none.peaks.end());
    const auto all = train(name, args.quick, steps, Streamed(offload::Options{}));
    const double moved_all = planned_mean(all.moved);
    const double time_all = planned_mean(all.seconds);
    const double time_none = planned_mean(none.seconds);
    const auto equal = [&](const Run& r) {
      return std::memcmp(r.losses.data(), none.losses.data(), sizeof(float) * none.losses.size()) == 0;
    };
    const auto add = [&](const std::string& run, const Run& r, std::int64_t target) {
      double worst = 0;
      for (std::size_t i = 1; i < r.peaks.size(); ++i) {
        worst = std::max(worst, static_cast<double>(r.peaks[i]) / static_cast<double>(target > 0 ? target : peak_none));
      }
      const double moved = planned_mean(r.moved);
      const double least = planned_mean(r.least);
      const double floor = static_cast<double>(std::max<std::int64_t>(0, peak_none - target));
      const auto ratio = [](double a, double b) { return b > 0 ? fixed(a / b, 3) + "x" : std::string("-"); };
      table.row({name, run, target > 0 ? mib(target) : "-", target > 0 ? fixed(worst, 3) : "-", mib(static_cast<std::int64_t>(moved)),
                 target > 0 ? ratio(moved, least) : "-", target > 0 ? ratio(moved, floor) : "-", ratio(moved, moved_all),
                 fixed(planned_mean(r.seconds), 3), ratio(planned_mean(r.seconds), time_all),
                 ratio(planned_mean(r.seconds), time_none), equal(r) ? "bitwise equal" : "DIFFER"});
      if (target > 0 && (worst > 1.02 || (least > 0 && moved > 1.10 * least) || !equal(r))) met = false;
      rows.push_back(Json::object({{"model", Json(name)},
                                   {"run", Json(run)},
                                   {"target_bytes", Json(target)},
                                   {"peak_none_bytes", Json(peak_none)},
                                   {"peaks", Json(r.peaks)},
                                   {"bytes_moved", Json(r.moved)},
                                   {"minimum_bytes", Json(r.least)},
                                   {"floor_bytes", Json(floor)},
                                   {"seconds", Json(r.seconds)},
                                   {"max_peak_over_target", Json(worst)},
                                   {"guard_offloads", Json(r.guard)},
                                   {"losses_bitwise_equal", Json(equal(r))}}));
    };
    add("none", none, 0);
    add("everything", all, 0);
    for (const double fraction : {0.5, 0.7, 0.9}) {
      const auto target = static_cast<std::int64_t>(fraction * static_cast<double>(peak_none));
      add("target " + fixed(fraction, 1), train(name, args.quick, steps, Streamed(offload::Options{.device_target_bytes = target})),
          target);
    }
  }
  table.print();
  std::cout << "\n" << (met ? "every target cell within 1.02 of its target and 1.10x of its minimum, losses bitwise equal"
                            : "SOME target cell misses 1.02 x target, 1.10x the minimum or bitwise equal losses")
            << "\n";
  auto json = header(args, torch_version());
  json.push_back({"steps", Json(steps)});
  json.push_back({"rows", Json(rows)});
  json.push_back({"met", Json(met)});
  write_result(args, "target.json", json);
  return 0;
}

}  // namespace bench
