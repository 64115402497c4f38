// SPDX-License-Identifier: MIT
// offload-bench overlap: step time of the demo GPT on sim without
// offloading, with sync::Blocking and with sync::Streamed, by regime R =
// (bytes moved per step / link bandwidth) / forward compute time: how much
// of the link's time Streamed hides.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include <ATen/Parallel.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../cli/stats_json.hpp"
#include "bench.hpp"
#include "gpt_trainer.hpp"
#include "mode_columns.hpp"

namespace bench {
namespace {

const std::vector<Mode> kModes = {Mode::none, Mode::blocking, Mode::streamed};
// R = (bytes moved per step / bandwidth) / forward compute time; R = 0 is
// a free link (no latency, the largest bandwidth): sim's and the library's
// machinery alone.
const std::vector<double> kRatios = {0.0, 0.25, 0.5, 1.0, 2.0};

/// One trainer per mode (by index in kModes), each stepping from the same
/// seed on the same batch, and every loss each has returned, in order.
struct Trainers {
  Trainers(const Shapes& s, const offload::Options& options) : history(kModes.size()) {
    for (const Mode m : kModes)
      of.push_back(std::make_unique<Trainer>(s, kSim, make_source<offload::device::Sim>(m, options)));
  }

  void step(std::size_t i, const std::function<void()>& after_forward = {}) {
    history[i].push_back(of[i]->step(after_forward));
    offload::sim::synchronize(0);
  }

  /// Whether the k-th loss of every mode is bitwise the same (it must be).
  bool losses_equal() const {
    bool same = true;
    for (const auto& h : history) {
      const auto n = std::min(h.size(), history[0].size());
      same = same && std::memcmp(h.data(), history[0].data(), n * sizeof(float)) == 0;
    }
    return same;
  }

  std::vector<std::unique_ptr<Trainer>> of;
  std::vector<std::vector<float>> history;
};

/// The link at each R, from what a step computes and moves.
struct Link {
  std::int64_t latency = 0;  ///< us per copy (R > 0)
  double forward_ms = 0;     ///< forward compute time: none, free link, median of 5
  std::int64_t bytes = 0;    ///< Streamed moves per step (D2H + H2D)
  std::int64_t copies = 0;   ///< in that many copies

  /// GB/s at R; 1 GB/s moves one byte per nanosecond.
  double bandwidth(double r) const {
    return r == 0 ? offload::sim::kMaxCopyBandwidthGbps
                  : std::min(offload::sim::kMaxCopyBandwidthGbps, static_cast<double>(bytes) / (r * forward_ms * 1e6));
  }
  /// ms the link takes per step at R.
  double link_ms(double r) const {
    return r == 0 ? 0.0 : static_cast<double>(copies * latency) / 1e3 + static_cast<double>(bytes) / bandwidth(r) / 1e6;
  }
  /// Sets sim's link to R.
  void set(double r) const {
    if (r == 0) {
      free_link();
    } else {
      offload::sim::set_copy_latency_us(latency);
      offload::sim::set_copy_bandwidth_gbps(bandwidth(r));
    }
  }
};

/// Calibration on a free link: the forward compute time (none), and the
/// bytes and copies Streamed moves per step. One warm-up step per mode.
Link calibrate(Trainers& trainers, std::int64_t latency) {
  free_link();
  for (std::size_t i = 0; i < kModes.size(); ++i) trainers.step(i);
  std::vector<double> forward_ms;
  for (int k = 0; k < 5; ++k) {
    const auto t0 = Clock::now();
    trainers.step(0,
                  [&] { forward_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count()); });
  }
  auto& streamed = *trainers.of[2]->source;
  streamed.reset_stats();
  trainers.step(2);
  const auto moved = streamed.stats();
  return Link{.latency = latency,
              .forward_ms = summarize(forward_ms).median,
              .bytes = moved.bytes_offloaded + moved.bytes_reloaded,
              .copies = moved.storages_offloaded + moved.tensors_reloaded};
}

/// One measured cell: a mode (index in kModes) at one R.
struct Cell {
  std::size_t mode;
  double r;
};

/// None once, then (Blocking, Streamed) at every R.
std::vector<Cell> overlap_cells() {
  std::vector<Cell> cells = {{0, 0.0}};
  for (const double r : kRatios)
    for (std::size_t i = 1; i < kModes.size(); ++i) cells.push_back({i, r});
  return cells;
}

/// What the rounds measured, by cell.
struct Timings {
  std::vector<std::vector<double>> wall_ms;
  std::vector<std::vector<double>> cpu_ms;  // process CPU time: less inflated by other load
  std::vector<offload::Stats> stats;        // the manager's counters of the cell's last step
};

/// Every cell once per round, in an order rotated each round, so that drift
/// in the machine's load hits every cell alike. Leaves sim's link as configured.
Timings run_rounds(Trainers& trainers, const std::vector<Cell>& cells, const Link& link, int rounds) {
  Timings t{std::vector<std::vector<double>>(cells.size()), std::vector<std::vector<double>>(cells.size()),
            std::vector<offload::Stats>(cells.size())};
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t k = 0; k < cells.size(); ++k) {
      const std::size_t c = (k + static_cast<std::size_t>(round) * 3) % cells.size();
      const auto& cell = cells[c];
      link.set(cell.r);
      auto& trainer = *trainers.of[cell.mode];
      if (trainer.source) trainer.source->reset_stats();
      double wall_ns = 0;
      t.cpu_ms[c].push_back(cpu_ns([&] { wall_ns = time_ns([&] { trainers.step(cell.mode); }); }) / 1e6);
      t.wall_ms[c].push_back(wall_ns / 1e6);
      if (trainer.source) t.stats[c] = trainer.source->stats();
    }
  }
  offload::sim::set_copy_latency_us(offload::sim::Config{}.copy_latency_us);
  offload::sim::set_copy_bandwidth_gbps(offload::sim::Config{}.copy_bandwidth_gbps);
  return t;
}

/// The medians of every cell and what the targets read from them.
struct Medians {
  Medians(const std::vector<Cell>& c, const Timings& t) : cells(c) {
    for (const auto& v : t.wall_ms) wall.push_back(summarize(v));
    for (const auto& v : t.cpu_ms) cpu.push_back(summarize(v));
  }

  /// The median wall (or CPU) ms of `m` at R (of none at any R).
  double median(Mode m, double r, bool cpu_time = false) const {
    for (std::size_t c = 0; c < cells.size(); ++c)
      if (kModes[cells[c].mode] == m && (m == Mode::none || cells[c].r == r))
        return cpu_time ? cpu[c].median : wall[c].median;
    return 0.0;
  }
  double t_none() const { return median(Mode::none, 0); }
  /// (t_blocking - t_streamed) / (t_blocking - t_none) at R.
  double hidden(double r) const {
    return (median(Mode::blocking, r) - median(Mode::streamed, r)) / (median(Mode::blocking, r) - t_none());
  }
  /// Streamed's own cost at R = 0, a fraction of the step: in wall time, or in process CPU time.
  double machinery() const { return median(Mode::streamed, 0) / t_none() - 1; }
  double machinery_cpu() const { return median(Mode::streamed, 0, true) / median(Mode::none, 0, true) - 1; }

  bool fit_low() const {
    return median(Mode::streamed, 0.25) <= 1.05 * t_none() && median(Mode::streamed, 0.5) <= 1.05 * t_none();
  }
  bool fit_one() const { return hidden(1.0) >= 0.9; }
  bool fit_machinery() const { return machinery() <= 0.03; }

  std::vector<Cell> cells;
  std::vector<Summary> wall, cpu;
};

void print_intro(const Shapes& s, int threads, const Link& link, int rounds, const offload::Options& options) {
  std::cout << "## Copy/compute overlap on sim by regime R = (bytes moved per step / bandwidth) / forward time\n\n"
            << "Model " << s.describe() << ", AdamW, " << threads << " intra-op thread (sim's stream workers "
            << "get the other core). Forward compute time (none, free link, median of 5) " << fixed(link.forward_ms, 1)
            << " ms; Streamed moves " << mib(link.bytes) << " MiB in " << link.copies
            << " copies per step (D2H + H2D). "
            << "Link: latency " << link.latency << " us per copy, bandwidth chosen per R; R = 0 is a free link "
            << "(latency 0, " << offload::sim::kMaxCopyBandwidthGbps << " GB/s): the machinery alone. "
            << "Every copy, blocking or not, costs latency + bytes / bandwidth on its stream. Step time in ms: "
            << "median of " << rounds << " rounds (each runs every cell once, in a rotated order) after one "
            << "warm-up step per mode. Options: " << describe(options) << ".\n\n";
}

std::vector<Column> overlap_columns() {
  return {
      mode_column(),
      fixed_column("R", "", "R", 2),
      fixed_column("GB/s", "", "bandwidth_gbps", 3),
      fixed_column("link", "ms/step", "link_ms_per_step", 1),
      median_column("step", "ms", "step_ms", 1),
      iqr_column("IQR", "ms", "step_ms", 1),
      fixed_column("vs none", "", "ratio_vs_none", 3, "x"),
      median_column("CPU", "ms", "cpu_ms", 1),
      {"copies/step", "",
       [](const Json& row) {
         return has(row, "d2h_copies") ? std::to_string(integer(row, "d2h_copies") + integer(row, "h2d_copies"))
                                       : std::string();
       }},
      {"hidden", "",
       [](const Json& row) {
         return has(row, "fraction_hidden") ? fixed(100 * number(row, "fraction_hidden"), 1) + " %" : std::string();
       }},
  };
}

std::vector<Json> overlap_rows(const Medians& medians, const Timings& t, const Link& link) {
  std::vector<Json> rows;
  for (std::size_t c = 0; c < medians.cells.size(); ++c) {
    const auto& cell = medians.cells[c];
    const Mode m = kModes[cell.mode];
    Json row = Json::object({{"mode", Json(mode_key(m))},
                             {"step_ms", summary_json(medians.wall[c])},
                             {"cpu_ms", summary_json(medians.cpu[c])},
                             {"ratio_vs_none", Json(medians.wall[c].median / medians.t_none())},
                             {"step_ms_each_round", Json(t.wall_ms[c])}});
    if (m != Mode::none) {
      row["R"] = cell.r;
      row["bandwidth_gbps"] = link.bandwidth(cell.r);
      row["latency_us"] = cell.r == 0 ? 0 : link.latency;
      row["link_ms_per_step"] = link.link_ms(cell.r);
      row["d2h_copies"] = t.stats[c].storages_offloaded;
      row["h2d_copies"] = t.stats[c].tensors_reloaded;
      row["bytes_moved"] = t.stats[c].bytes_offloaded + t.stats[c].bytes_reloaded;
      if (m == Mode::streamed && cell.r > 0) row["fraction_hidden"] = medians.hidden(cell.r);
      row["stats"] = offload_json::stats(t.stats[c]);
    }
    rows.push_back(row);
  }
  return rows;
}

void print_verdict(const Medians& m, bool same_loss) {
  const auto verdict = [](bool ok) { return ok ? "met" : "MISSED"; };
  std::cout << "\nhidden = (t_blocking - t_streamed) / (t_blocking - t_none) at the same R.\n"
            << "Targets with the library defaults: Streamed <= 1.05x none at R = 0.25 and 0.5 ("
            << fixed(m.median(Mode::streamed, 0.25) / m.t_none(), 3) << "x, "
            << fixed(m.median(Mode::streamed, 0.5) / m.t_none(), 3) << "x: " << verdict(m.fit_low())
            << "); >= 90 % hidden at R = 1 (" << fixed(100 * m.hidden(1.0), 1) << " %: " << verdict(m.fit_one())
            << "); Streamed's machinery at R = 0 <= 3 % of the step (" << fixed(100 * m.machinery(), 1)
            << " %: " << verdict(m.fit_machinery())
            << "; in process CPU time, every thread: " << fixed(100 * m.machinery_cpu(), 1) << " %).\n"
            << "Losses of every step bitwise equal across modes: " << (same_loss ? "yes" : "NO") << "\n";
}

}  // namespace

int run_overlap(const Args& args) {
  // The memory benchmark's shape at 4 layers (width 256, as the peers
  // benchmark's GPT). The smaller shape of earlier runs (--seq 64 --width
  // 128 --heads 4 --layers 8) saves 2 KiB-1 MiB tensors, a copy every ~0.2
  // ms of sim's compute, where the host's cost of waking sim's stream worker
  // per queued copy (an interrupt between cores, 10-20 us on a virtual
  // machine; a device launch wakes no thread) is several % of the step.
  const Shapes s = shapes_from(args, wide_shape(8, 4));
  const std::int64_t latency = args.get_int("latency-us", offload::sim::Config{}.copy_latency_us);
  const int rounds = static_cast<int>(args.get_int("rounds", args.quick ? 3 : 15));
  const auto threads = static_cast<int>(args.get_int("threads", 1));
  at::set_num_threads(threads);  // compute on one core, sim's stream workers on the other
  // The library defaults (no tuning) unless flags say otherwise.
  const offload::Options options = options_from(args);
  Trainers trainers(s, options);
  const Link link = calibrate(trainers, latency);
  const auto cells = overlap_cells();
  const Timings timings = run_rounds(trainers, cells, link, rounds);
  const Medians m(cells, timings);

  print_intro(s, threads, link, rounds, options);
  const auto rows = overlap_rows(m, timings, link);
  print_rows(overlap_columns(), rows);
  const bool same_loss = trainers.losses_equal();
  print_verdict(m, same_loss);
  auto fields = header(args, torch_version());
  fields.push_back({"shapes", Json(s.describe())});
  fields.push_back({"latency_us", Json(latency)});
  fields.push_back({"rounds", Json(rounds)});
  fields.push_back({"intra_op_threads", Json(threads)});
  fields.push_back({"options", options_json(options)});
  fields.push_back({"forward_ms", Json(link.forward_ms)});
  fields.push_back({"bytes_moved_per_step", Json(link.bytes)});
  fields.push_back({"copies_per_step", Json(link.copies)});
  fields.push_back({"streamed_machinery_fraction_at_R0", Json(m.machinery())});
  fields.push_back({"streamed_machinery_cpu_fraction_at_R0", Json(m.machinery_cpu())});
  fields.push_back({"fraction_hidden_at_R1", Json(m.hidden(1.0))});
  fields.push_back({"targets", Json("streamed/none <= 1.05 at R = 0.25, 0.5; fraction_hidden >= 0.9 at R = 1; "
                                    "streamed machinery <= 0.03 at R = 0")});
  fields.push_back({"targets_met", Json::object({{"low_R", Json(m.fit_low())},
                                                 {"R1_hidden", Json(m.fit_one())},
                                                 {"machinery", Json(m.fit_machinery())}})});
  fields.push_back({"losses_equal", Json(same_loss)});
  fields.push_back({"rows", Json(rows)});
  write_result(args, "overlap.json", fields);
  return 0;
}

}  // namespace bench
