// SPDX-License-Identifier: MIT
// offload-bench plan: the automatic plan (CheckpointOptions::planned under
// Options::device_target_bytes) against every fixed strategy that meets the
// same target, on the demo GPT (models/gpt.hpp) at width 256 on sim, with
// sim's link bandwidth set so that R = 0.25, 1, 3 and 6, at targets 1/4,
// 1/2 and 3/4 of the way from the peak of "checkpoint every block + offload
// its input" to the peak without offloading; and, per R, auto under a
// target everything fits (1.25x the peak without offloading) against no
// offloading. All measured in one run.

#include "bench.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../models/gpt.hpp"
#include "sim_training.hpp"

namespace bench {
namespace {

using Streamed = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Streamed>;

// One strategy: how the blocks run and which manager (none: no scope).
struct Strategy {
  std::string name;
  std::int64_t checkpoint_first = 0;  // blocks [0, k) checkpointed
  bool planned = false;
  bool manager = false;
  std::int64_t target = 0;  // Options::device_target_bytes
};

// What `steps` steps of one strategy measured.
struct Run {
  std::vector<std::int64_t> peaks;
  std::vector<double> seconds;
  std::vector<double> forward_seconds;
  std::vector<float> losses;
  std::vector<std::int64_t> moved;
  offload::Stats last;  // the last step's counters
  std::string plan;     // the automatic plan's summary, after the last step
};

struct Shape {
  std::int64_t layers, width, seq, batch;
};

// One strategy's model (the same weights and data for every strategy),
// manager and trainer on its own sim device, and what its steps measured.
struct Trainee {
  Strategy strategy;
  gpt::Model model{nullptr};
  std::optional<offload::AnyManager> manager;
  std::unique_ptr<SimTrainer> trainer;
  Run run;
};

std::unique_ptr<Trainee> make_trainee(const Shape& shape, const Strategy& s, c10::DeviceIndex device) {
  const c10::Device on(c10::DeviceType::PrivateUse1, device);
  auto t = std::make_unique<Trainee>();
  t->strategy = s;
  torch::manual_seed(0);
  t->model = gpt::Model(gpt::Config{.vocab = 64,
                                    .layers = shape.layers,
                                    .width = shape.width,
                                    .heads = 4,
                                    .seq = shape.seq,
                                    .checkpoint_first = s.checkpoint_first,
                                    .planned = s.planned});
  t->model->to(on);
  const auto data = torch::randint(64, {shape.batch, shape.seq + 1}, torch::kLong);
  const auto x = data.narrow(1, 0, shape.seq).to(on);
  const auto y = data.narrow(1, 1, shape.seq).to(on);
  if (s.manager) t->manager = Streamed(offload::Options{.device_target_bytes = s.target});
  t->trainer = std::make_unique<SimTrainer>(
      t->model->parameters(), [model = t->model, x, y]() mutable { return model->loss(x, y); }, t->manager, device);
  return t;
}

void record(Trainee& t, const SimStep& step) {
  t.run.forward_seconds.push_back(step.forward_seconds);
  t.run.peaks.push_back(step.peak);
  t.run.losses.push_back(step.loss);
  t.run.seconds.push_back(step.seconds);
  t.run.last = step.stats;
  t.run.moved.push_back(step.stats.bytes_offloaded);
}

// Each strategy on its own sim device (0, 1, ...; at most kPlanDevices), stepped in
// turn for `steps` steps: what each measured, in the order given.
std::vector<Run> round_robin(const Shape& shape, const std::vector<Strategy>& strategies, int steps) {
  TORCH_CHECK(strategies.size() <= static_cast<std::size_t>(kPlanDevices), "offload-bench plan: ", strategies.size(),
              " strategies, sim has ", kPlanDevices, " devices");
  std::vector<std::unique_ptr<Trainee>> trainees;
  for (std::size_t i = 0; i < strategies.size(); ++i)
    trainees.push_back(make_trainee(shape, strategies[i], static_cast<c10::DeviceIndex>(i)));
  for (int s = 0; s < steps; ++s) {
    for (auto& t : trainees) record(*t, t->trainer->step());
  }
  std::vector<Run> out;
  for (auto& t : trainees) {
    if (t->manager && t->strategy.planned) {
      if (auto planner = offload::interface_of(*t->manager)->block_planner()) t->run.plan = planner->summary();
    }
    out.push_back(std::move(t->run));
  }
  return out;
}

// One strategy alone, on sim:0.
Run train(const Shape& shape, const Strategy& s, int steps) { return round_robin(shape, {s}, steps).front(); }

// Mean of v from step `from` (0-based) on.
template <class T>
double mean_from(const std::vector<T>& v, std::size_t from) {
  double sum = 0;
  for (std::size_t i = from; i < v.size(); ++i) sum += static_cast<double>(v[i]);
  return v.size() > from ? sum / static_cast<double>(v.size() - from) : 0.0;
}

// Median of v from step `from` (0-based) on: a step slowed by the machine
// (a loaded moment) moves it less than the mean.
double median_from(const std::vector<double>& v, std::size_t from) {
  if (v.size() <= from) return 0.0;
  std::vector<double> tail(v.begin() + static_cast<std::ptrdiff_t>(from), v.end());
  std::sort(tail.begin(), tail.end());
  const auto n = tail.size();
  return n % 2 == 1 ? tail[n / 2] : (tail[n / 2 - 1] + tail[n / 2]) / 2;
}

std::int64_t max_from(const std::vector<std::int64_t>& v, std::size_t from) {
  std::int64_t out = 0;
  for (std::size_t i = from; i < v.size(); ++i) out = std::max(out, v[i]);
  return out;
}

// The fixed strategies whose peak does not depend on a target.
std::vector<Strategy> fixed_strategies(std::int64_t layers) {
  std::vector<Strategy> out = {{"offload all", 0, false, true},
                               {"checkpoint all", layers, false, false},
                               {"checkpoint all + offload inputs", layers, false, true}};
  for (std::int64_t k = 1; k < layers; ++k) {
    out.push_back({"checkpoint first " + std::to_string(k), k, false, false});
    out.push_back({"checkpoint first " + std::to_string(k) + " + offload rest", k, false, true});
  }
  return out;
}

// One measured strategy in one cell.
// `run`: "survey" (every strategy) or "confirm" (auto and the fixed
// strategies the survey picked, run again: run_plan()).
Json row_of(const Strategy& s, const Run& r, const Run& none, std::int64_t target, double r_value,
            const std::string& run) {
  const bool equal = r.losses.size() == none.losses.size() &&
                     std::memcmp(r.losses.data(), none.losses.data(), sizeof(float) * r.losses.size()) == 0;
  const auto peak = max_from(r.peaks, 1);  // from step 2 on
  return Json::object({{"R", Json(r_value)},
                       {"run", Json(run)},
                       {"target_bytes", Json(target)},
                       {"strategy", Json(s.name)},
                       {"peak_bytes", Json(peak)},
                       {"meets_target", Json(target == 0 || peak <= target + target / 50)},
                       {"seconds", Json(median_from(r.seconds, 2))},  // steps 3 on: every plan learned
                       {"forward_seconds", Json(median_from(r.forward_seconds, 2))},
                       {"bytes_moved_per_step", Json(mean_from(r.moved, 2))},
                       {"blocks_kept", Json(r.last.blocks_kept)},
                       {"blocks_offloaded", Json(r.last.blocks_offloaded)},
                       {"blocks_recomputed", Json(r.last.blocks_recomputed)},
                       {"blocks_guarded", Json(r.last.blocks_guarded)},
                       {"peaks", Json(r.peaks)},
                       {"moved", Json(r.moved)},
                       {"step_seconds", Json(r.seconds)},
                       {"losses_bitwise_equal", Json(equal)},
                       {"plan", r.plan.empty() ? Json(nullptr) : Json(r.plan)}});
}

// The cell's verdict from the rows of one run: auto against the best fixed
// strategy that meets the target, and against the better of the device
// target and checkpoint all + offload inputs.
Json verdict(const std::vector<Json>& rows, double r_value, std::int64_t target, const std::string& run) {
  double best = 0, baseline = 0, automatic = 0;
  std::string best_name, baseline_name;
  bool auto_ok = false;
  for (const auto& row : rows) {
    const auto t = integer(row, "target_bytes");
    if (number(row, "R") != r_value || (t != 0 && t != target) || row.at("run") != run) continue;
    const auto name = row.at("strategy").get<std::string>();
    const bool meets = row.at("losses_bitwise_equal").get<bool>() && integer(row, "peak_bytes") <= target + target / 50;
    const double seconds = number(row, "seconds");
    if (name == "auto") {
      automatic = seconds;
      auto_ok = meets;
      continue;
    }
    if (!meets) continue;
    if (best == 0 || seconds < best) best = seconds, best_name = name;
    if ((name == "device target" || name == "checkpoint all + offload inputs") && (baseline == 0 || seconds < baseline))
      baseline = seconds, baseline_name = name;
  }
  return Json::object({{"R", Json(r_value)},
                       {"target_bytes", Json(target)},
                       {"auto_seconds", Json(automatic)},
                       {"auto_meets_target_bitwise", Json(auto_ok)},
                       {"best_fixed", Json(best_name)},
                       {"best_fixed_seconds", Json(best)},
                       {"auto_over_best", Json(best > 0 ? automatic / best : 0.0)},
                       {"baseline", Json(baseline_name)},
                       {"baseline_seconds", Json(baseline)},
                       {"auto_faster_than_baseline", Json(baseline > 0 ? 1.0 - automatic / baseline : 0.0)}});
}

// The "everything fits" cell of one R: auto under a target above the peak
// without offloading, against no offloading in the same (confirming) run.
Json fits_verdict(const std::vector<Json>& rows, double r_value, std::int64_t target) {
  const Json* automatic = nullptr;
  const Json* none = nullptr;
  for (const auto& row : rows) {
    if (number(row, "R") != r_value || row.at("run") != "confirm") continue;
    if (row.at("strategy") == "none") none = &row;
    if (row.at("strategy") == "auto" && integer(row, "target_bytes") == target) automatic = &row;
  }
  TORCH_CHECK(automatic != nullptr && none != nullptr, "offload-bench plan: the everything-fits rows of R = ", r_value,
              " are missing");
  const double auto_s = number(*automatic, "seconds"), none_s = number(*none, "seconds");
  const auto moved = max_from((*automatic).at("moved").get<std::vector<std::int64_t>>(), 1);
  const bool bitwise = (*automatic).at("losses_bitwise_equal").get<bool>();
  const double ratio = none_s > 0 ? auto_s / none_s : 0.0;
  return Json::object({{"R", Json(r_value)},
                       {"target_bytes", Json(target)},
                       {"auto_seconds", Json(auto_s)},
                       {"none_seconds", Json(none_s)},
                       {"auto_over_none", Json(ratio)},
                       {"auto_peak_bytes", (*automatic).at("peak_bytes")},
                       {"none_peak_bytes", (*none).at("peak_bytes")},
                       {"moved_bytes_max_from_step_2", Json(moved)},
                       {"blocks_kept", (*automatic).at("blocks_kept")},
                       {"losses_bitwise_equal", Json(bitwise)},
                       {"met", Json(bitwise && moved == 0 && ratio <= 1.01)}});
}

void print_fits(const std::vector<Json>& cells) {
  const std::vector<Column> columns = {
      fixed_column("R", "", "R", 2),
      mib_column("target", "target_bytes"),
      mib_column("peak, none", "none_peak_bytes"),
      mib_column("peak, auto", "auto_peak_bytes"),
      text_column("blocks kept", "blocks_kept"),
      mib_column("moved from step 2, most in a step", "moved_bytes_max_from_step_2"),
      {"none", "s", [](const Json& c) { return fixed(number(c, "none_seconds"), 3); }},
      {"auto", "s", [](const Json& c) { return fixed(number(c, "auto_seconds"), 3); }},
      {"auto / none", "", [](const Json& c) { return fixed(number(c, "auto_over_none"), 3) + "x"; }},
      {"bitwise", "", [](const Json& c) { return c.at("losses_bitwise_equal").get<bool>() ? "yes" : "NO"; }},
  };
  print_rows(columns, cells);
}

void print_cells(const std::vector<Json>& cells) {
  std::vector<Column> columns = {
      fixed_column("R", "", "R", 2),
      mib_column("target", "target_bytes"),
      {"auto", "s", [](const Json& c) { return fixed(number(c, "auto_seconds"), 3); }},
      {"meets, bitwise", "",
       [](const Json& c) { return c.at("auto_meets_target_bitwise").get<bool>() ? "yes" : "NO"; }},
      text_column("best fixed", "best_fixed"),
      {"best", "s", [](const Json& c) { return fixed(number(c, "best_fixed_seconds"), 3); }},
      {"auto / best", "", [](const Json& c) { return fixed(number(c, "auto_over_best"), 3) + "x"; }},
      {"survey: best, auto / best", "",
       [](const Json& c) {
         const auto& s = c.at("survey");
         return s.at("best_fixed").get<std::string>() + ", " + fixed(number(s, "auto_over_best"), 3) + "x";
       }},
      {"auto vs min(target, ckpt+offload)", "",
       [](const Json& c) { return fixed(100.0 * number(c, "auto_faster_than_baseline"), 1) + " % faster"; }},
  };
  print_rows(columns, cells);
}

// The values of R of `--r` ("0.25,1,3,6" by default).
std::vector<double> r_values(const Args& args) {
  const auto text = args.get("r", "0.25,1,3,6");
  std::vector<double> out;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const auto end = std::min(text.find(',', begin), text.size());
    const auto item = text.substr(begin, end - begin);
    std::size_t used = 0;
    double value = 0;
    try {
      value = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TORCH_CHECK_VALUE(used == item.size() && used > 0 && value > 0 && value <= 100,
                      "offload-bench plan: --r must be numbers in (0, 100] separated by commas, got '", text, "'");
    out.push_back(value);
    begin = end + 1;
  }
  return out;
}

}  // namespace

int run_plan(const Args& args) {
  const auto r_list = r_values(args);
  const Shape shape{4, args.quick ? 128 : 256, args.quick ? 64 : 128, 8};
  const int steps = static_cast<int>(args.get_int("steps", 8));
  const int confirm_steps = static_cast<int>(args.get_int("confirm-steps", args.quick ? 12 : 24));
  const auto threads = static_cast<int>(args.get_int("threads", 1));
  at::set_num_threads(threads);  // compute on one core, sim's stream workers (the link) on the other
  std::cout << "## The automatic plan (CheckpointOptions::planned + device_target_bytes) on sim\n\n"
            << "The demo GPT (" << shape.layers << " blocks, width " << shape.width << ", seq " << shape.seq
            << ", batch " << shape.batch << "), AdamW, " << threads
            << " intra-op thread(s) (sim's stream workers, the link, on the other cores); every strategy of one R "
               "on its own sim device, stepped in turn (round robin: a loaded machine slows them alike), "
               "sync::Streamed for every strategy that offloads. R = (bytes offload-all moves per step one way / "
               "link bandwidth) / forward time without offloading: sim's bandwidth is set to bytes / (R x "
               "forward), both measured first. Targets: 1/4, 1/2, 3/4 of the way from the peak of checkpoint all "
               "+ offload inputs to the peak without offloading. A fixed strategy counts where its peak from "
               "step 2 on is within 1.02x of the target and its losses are bitwise those without offloading. "
               "Survey: every strategy, "
            << steps << " steps each; confirming run: per cell auto, the best fixed strategy of the survey and the "
            << "better of the device target and checkpoint all + offload inputs, " << confirm_steps
            << " steps each, timed apart from the choice (the table's times), and auto under a target of 1.25x "
               "the peak without offloading (everything fits). Times are the median of steps 3 on.\n\n";
  const Run probe_none = train(shape, {"none"}, steps);
  const double forward = mean_from(probe_none.forward_seconds, 1);
  const double moved_all = mean_from(train(shape, {"offload all", 0, false, true}, 2).moved, 1);
  const auto high = max_from(probe_none.peaks, 0);
  std::vector<Json> rows;
  std::vector<Json> cells;
  std::vector<Json> fits;  // per R: everything fits
  for (const double r_value : r_list) {
    const double gbps = std::min(offload::sim::kMaxCopyBandwidthGbps, moved_all / (r_value * forward) / 1e9);
    offload::sim::set_copy_bandwidth_gbps(gbps);
    std::cout << "R = " << fixed(r_value, 2) << ": link " << fixed(gbps, 3) << " GB/s\n";
    // The targets' low end, from a short run of its own; then every
    // strategy of this R stepped in turn.
    const auto low = max_from(train(shape, {"checkpoint all + offload inputs", shape.layers, false, true}, 2).peaks, 1);
    std::vector<Strategy> strategies = {{"none"}};
    for (const auto& s : fixed_strategies(shape.layers)) strategies.push_back(s);
    std::vector<std::int64_t> targets;
    for (const double fraction : {0.25, 0.5, 0.75}) {
      const auto target = low + static_cast<std::int64_t>(fraction * static_cast<double>(high - low));
      targets.push_back(target);
      strategies.push_back({"device target", 0, false, true, target});
      strategies.push_back({"auto", 0, true, true, target});
    }
    const auto runs = round_robin(shape, strategies, steps);
    for (std::size_t i = 0; i < strategies.size(); ++i)
      rows.push_back(row_of(strategies[i], runs[i], runs.front(), strategies[i].target, r_value, "survey"));
    // The confirming run: auto and, per target, the fixed strategies the
    // survey picked (the best, and the better of the device target and
    // checkpoint all + offload inputs), with none for the losses, stepped
    // in turn again. The fastest of a dozen noisy medians is biased low
    // (it is the fastest partly because its steps were lucky); timed
    // again, apart from the choice, it is not.
    std::vector<Json> surveyed;
    std::vector<Strategy> confirm = {{"none"}};
    const auto add = [&](const std::string& name, std::int64_t target) {
      for (const auto& s : strategies) {
        if (s.name != name || (s.target != 0 && s.target != target)) continue;
        const bool have = std::any_of(confirm.begin(), confirm.end(),
                                      [&s](const Strategy& c) { return c.name == s.name && c.target == s.target; });
        if (!have) confirm.push_back(s);
      }
    };
    for (const auto target : targets) {
      surveyed.push_back(verdict(rows, r_value, target, "survey"));
      add("auto", target);
      add(surveyed.back().at("best_fixed").get<std::string>(), target);
      add(surveyed.back().at("baseline").get<std::string>(), target);
    }
    // Everything fits: auto under a target above the peak without
    // offloading, timed against none in the same run.
    const auto fits_target = high + high / 4;
    confirm.push_back({"auto", 0, true, true, fits_target});
    const auto again = round_robin(shape, confirm, confirm_steps);
    for (std::size_t i = 0; i < confirm.size(); ++i)
      rows.push_back(row_of(confirm[i], again[i], again.front(), confirm[i].target, r_value, "confirm"));
    for (std::size_t k = 0; k < targets.size(); ++k) {
      auto cell = verdict(rows, r_value, targets[k], "confirm");
      cell["survey"] = surveyed[k];
      cells.push_back(std::move(cell));
    }
    fits.push_back(fits_verdict(rows, r_value, fits_target));
  }
  offload::sim::set_copy_bandwidth_gbps(offload::sim::Config{}.copy_bandwidth_gbps);
  std::cout << "\n";
  print_cells(cells);
  int faster = 0, within = 0;
  for (const auto& c : cells) {
    if (number(c, "auto_faster_than_baseline") >= 0.10) ++faster;
    if (c.at("auto_meets_target_bitwise").get<bool>() && number(c, "auto_over_best") <= 1.03) ++within;
  }
  std::cout << "\nauto within 1.03x of the best fixed strategy, under the target and bitwise: " << within << " of "
            << cells.size() << " cells; >= 10 % faster than the better of the device target and checkpoint all + "
            << "offload inputs: " << faster << " of " << cells.size() << "\n";
  std::cout << "\nEverything fits (target 1.25x the peak without offloading; auto and none from the confirming "
               "run):\n\n";
  print_fits(fits);
  const auto fits_met = std::count_if(fits.begin(), fits.end(), [](const Json& c) { return c.at("met").get<bool>(); });
  std::cout << "\neverything fits: auto within 1.01x of no offloading, nothing moved from step 2 on, bitwise: "
            << fits_met << " of " << fits.size() << "\n";
  auto json = header(args, torch_version());
  json.push_back({"steps", Json(steps)});
  json.push_back({"confirm_steps", Json(confirm_steps)});
  json.push_back({"intra_op_threads", Json(threads)});
  json.push_back({"forward_seconds", Json(forward)});
  json.push_back({"offload_all_bytes_per_step", Json(moved_all)});
  json.push_back({"cells", Json(cells)});
  json.push_back({"everything_fits", Json(fits)});
  json.push_back({"rows", Json(rows)});
  write_result(args, "plan.json", json);
  return 0;
}

}  // namespace bench
