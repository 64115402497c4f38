// SPDX-License-Identifier: MIT

#include "report.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../../cli/stats_json.hpp"
#include "../../models/registry.hpp"

namespace demo {
namespace {

std::string seconds_text(const RunResult& r) {
  if (r.losses.empty()) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f s", r.seconds_per_step());
  return buf;
}

std::string ratio_text(double a, double b) {
  if (!(a > 0) || !(b > 0)) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", b / a);
  return buf;
}

std::string column_title(const RunResult& r) {
  if (r.name == "none") return "no offload";
  if (r.name == "checkpoint") return "checkpoint";
  if (r.name.rfind("checkpoint+", 0) == 0) return "checkpoint + offload (" + r.name.substr(11) + ")";
  if (r.name == "target") return "offload (target)";
  if (r.name == "auto") return "auto plan (target)";
  return "offload (" + r.name + ")";
}

// With more runs, the ratios against the run without offloading follow the
// peak and the time in each cell instead of a column of their own.
void print_table(const Args& args, const RunResult* none, const RunResult* off,
                 const std::vector<const RunResult*>& more) {
  std::vector<std::pair<std::string, const RunResult*>> cols;
  for (const auto* r : {none, off}) {
    if (r) cols.emplace_back(column_title(*r), r);
  }
  for (const auto* r : more) cols.emplace_back(column_title(*r), r);
  const bool ratio = none && off && more.empty();
  const auto in_cell = [&](const RunResult& r, std::string text, double base, double value) {
    if (ratio || !none || &r == none || none->oom_step) return text;
    const auto x = ratio_text(base, value);
    return x.empty() ? text : text + " (" + x + ")";
  };
  std::vector<std::vector<std::string>> rows;
  auto row = [&](std::string label, const std::function<std::string(const RunResult&)>& cell, std::string r = "") {
    std::vector<std::string> out{std::move(label)};
    for (const auto& c : cols) out.push_back(cell(*c.second));
    if (ratio) out.push_back(std::move(r));
    rows.push_back(std::move(out));
  };
  std::vector<std::string> header{""};
  for (const auto& c : cols) header.push_back(c.first);
  if (ratio) header.push_back("offload / none");
  rows.push_back(header);
  row("steps trained", [&](const RunResult& r) {
    return std::to_string(r.losses.size()) + "/" + std::to_string(args.steps) + (r.oom_step ? " (out of memory)" : "");
  });
  row("final loss", [](const RunResult& r) {
    if (r.losses.empty()) return std::string("n/a");
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6f", static_cast<double>(r.losses.back()));
    return std::string(buf);
  });
  row(
      "peak device memory",
      [&](const RunResult& r) {
        return in_cell(r, mib(r.peak_bytes), none ? static_cast<double>(none->peak_bytes) : 0,
                       static_cast<double>(r.peak_bytes));
      },
      ratio && !none->oom_step ? ratio_text(static_cast<double>(none->peak_bytes), static_cast<double>(off->peak_bytes))
                               : "");
  const auto offloads = [](const RunResult& r) { return r.name != "none" && r.name != "checkpoint"; };
  row("bytes offloaded",
      [&](const RunResult& r) { return offloads(r) ? mib(r.stats.bytes_offloaded) : std::string("-"); });
  row("bytes brought back",
      [&](const RunResult& r) { return offloads(r) ? mib(r.stats.bytes_reloaded) : std::string("-"); });
  row(
      "time per step",
      [&](const RunResult& r) {
        return in_cell(r, seconds_text(r), none ? none->seconds_per_step() : 0, r.seconds_per_step());
      },
      ratio ? ratio_text(none->seconds_per_step(), off->seconds_per_step()) : "");
  std::vector<std::size_t> widths(rows.front().size(), 0);
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size(); ++i) widths[i] = std::max(widths[i], r[i].size());
  }
  std::cout << "\n";
  for (std::size_t k = 0; k < rows.size(); ++k) {
    std::string line;
    for (std::size_t i = 0; i < rows[k].size(); ++i) {
      const auto& cell = rows[k][i];
      const auto pad = std::string(widths[i] - cell.size(), ' ');
      line += i == 0 ? cell + pad : "   " + pad + cell;  // first column left, others right aligned
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::cout << line << "\n";
    if (k == 0) std::cout << std::string(line.size(), '-') << "\n";
  }
  std::cout << "\n";
}

}  // namespace

void print_report(const Args& args, const RunResult* none, const RunResult* off,
                  const std::vector<const RunResult*>& more) {
  print_table(args, none, off, more);
  if (none && off) {
    const auto cmp = compare(*none, *off);
    if (cmp.common == 0) {
      std::cout << "losses: no step completed in both runs, nothing to compare\n";
    } else if (cmp.bitwise_equal) {
      std::cout << "losses: all " << cmp.common << " steps bitwise equal without and with offloading"
                << (cmp.common < static_cast<std::size_t>(args.steps) ? " (the steps both runs completed)" : "")
                << "\n";
    } else {
      std::cout << "losses: NOT bitwise equal (max abs difference " << cmp.max_abs_diff << " over " << cmp.common
                << " steps)\n";
    }
  }
  if (none && none->oom_step) {
    std::cout << "without offloading: ran out of device memory at step " << *none->oom_step << " of " << args.steps;
    if (off && !off->oom_step) std::cout << "; with offloading: trained all " << args.steps << " steps";
    std::cout << " (cap " << mib(args.device_memory_cap) << ")\n";
  }
  if (off && off->oom_step) {
    std::cout << "with offloading: ran out of device memory at step " << *off->oom_step << " of " << args.steps
              << (args.device_memory_cap > 0 ? "; the cap is below what offloading needs" : "") << "\n";
  }
  for (const auto* r : more) {
    const auto title = column_title(*r);
    if (none) {
      const auto cmp = compare(*none, *r);
      if (cmp.common > 0) {
        std::cout << title << ": losses of " << cmp.common << " steps "
                  << (cmp.bitwise_equal ? "bitwise equal to the run without offloading" : "NOT bitwise equal") << "\n";
      }
    }
    if (r->oom_step) {
      std::cout << title << ": ran out of device memory at step " << *r->oom_step << " of " << args.steps << "\n";
    } else if (args.device_memory_cap > 0 && ((off && off->oom_step) || (none && none->oom_step))) {
      std::cout << title << ": trained all " << args.steps << " steps under the cap " << mib(args.device_memory_cap)
                << "\n";
    }
  }
  for (const auto* r : more) {
    if (r->name != "target" || r->losses.empty()) continue;
    std::cout << "target " << mib(args.device_target) << ": peak " << mib(r->peak_bytes) << ", moved "
              << mib(r->stats.bytes_offloaded);
    if (off && off->stats.bytes_offloaded > 0) {
      std::cout << " ("
                << ratio_text(static_cast<double>(off->stats.bytes_offloaded),
                              static_cast<double>(r->stats.bytes_offloaded))
                << " of offloading everything)";
    }
    std::cout << ", kept " << mib(r->stats.target_kept_bytes) << " on the device by the plan, "
              << r->stats.target_guard_offloads << " guard offloads\n";
  }
  for (const auto* r : more) {
    if (r->name != "auto" || r->losses.empty()) continue;
    std::cout << "auto plan, target " << mib(args.device_target) << ": peak " << mib(r->peak_bytes)
              << "; last step: blocks kept " << r->stats.blocks_kept << ", offloaded " << r->stats.blocks_offloaded
              << ", recomputed " << r->stats.blocks_recomputed << "; step predicted "
              << r->stats.plan_predicted_step_us / 1000.0 << " ms, measured " << r->stats.plan_measured_step_us / 1000.0
              << " ms\n";
  }
  if (off) std::cout << "offload stats: " << off->stats << "\n";
  for (const auto* r : more) {
    if (r->name != "checkpoint") std::cout << column_title(*r) << " stats: " << r->stats << "\n";
  }
}

void write_summary(const std::string& path, const Args& args, const Corpus& corpus, const DeviceChoice& device,
                   const RunResult* none, const RunResult* off, const std::vector<const RunResult*>& more) {
  using Json = nlohmann::ordered_json;
  auto losses = [](const RunResult* r) { return r ? Json(r->losses) : Json(nullptr); };
  auto peak = [](const RunResult* r) { return r && r->peak_bytes >= 0 ? Json(r->peak_bytes) : Json(nullptr); };
  auto per_step = [](const RunResult* r) {
    return r && !r->losses.empty() ? Json(r->seconds_per_step()) : Json(nullptr);
  };
  auto oom_step = [](const RunResult* r) { return r && r->oom_step ? Json(*r->oom_step) : Json(nullptr); };
  std::optional<Comparison> cmp;
  if (none && off) cmp = compare(*none, *off);
  Json model{{"name", args.model}, {"layers", args.layers}, {"width", args.width}};
  model["heads"] = models::model_kind(args.model).uses_heads ? Json(args.heads) : Json(nullptr);
  model.update(Json{{"seq", args.seq}, {"batch", args.batch}, {"lr", args.lr}, {"seed", args.seed}});
  const auto run_json = [&](const RunResult* r) {
    const bool offloaded = r->name != "checkpoint";
    return Json{
        {"name", r->name},
        {"losses", r->losses},
        {"losses_bitwise_equal_to_none", none ? Json(compare(*none, *r).bitwise_equal) : Json(nullptr)},
        {"peak_device_bytes", peak(r)},
        {"bytes_offloaded", offloaded ? Json(r->stats.bytes_offloaded) : Json(nullptr)},
        {"bytes_reloaded", offloaded ? Json(r->stats.bytes_reloaded) : Json(nullptr)},
        {"oom_step", oom_step(r)},
        {"seconds_per_step", per_step(r)},
        {"stats", offloaded ? offload_json::stats(r->stats) : Json(nullptr)},
    };
  };
  Json runs = args.checkpoint ? Json::array() : Json(nullptr);
  Json target(nullptr);
  Json automatic(nullptr);
  for (const auto* r : more) {
    if (r->name == "target") {
      target = run_json(r);
    } else if (r->name == "auto") {
      automatic = run_json(r);
    } else {
      runs.push_back(run_json(r));
    }
  }
  Json j{
      {"device", device.label},
      {"data_files", corpus.files},
      {"data_bytes", corpus.bytes},
      {"vocab", corpus.vocab.size()},
      {"model", model},
      {"offload_mode", std::string(mode_name(args.offload))},
      {"manager", off ? Json(off->manager) : Json(nullptr)},
      {"device_memory_cap", args.device_memory_cap},
      {"steps", args.steps},
      {"losses_none", losses(none)},
      {"losses_offload", losses(off)},
      {"losses_bitwise_equal", cmp ? Json(cmp->bitwise_equal) : Json(nullptr)},
      {"max_abs_loss_diff", cmp ? Json(cmp->max_abs_diff) : Json(nullptr)},
      {"peak_device_bytes_none", peak(none)},
      {"peak_device_bytes_offload", peak(off)},
      {"bytes_offloaded", off ? Json(off->stats.bytes_offloaded) : Json(nullptr)},
      {"bytes_reloaded", off ? Json(off->stats.bytes_reloaded) : Json(nullptr)},
      {"oom_without_offload", none && none->oom_step.has_value()},
      {"oom_step_without_offload", oom_step(none)},
      {"oom_with_offload", off && off->oom_step.has_value()},
      {"oom_step_with_offload", oom_step(off)},
      {"seconds_per_step_none", per_step(none)},
      {"seconds_per_step_offload", per_step(off)},
      {"stats_offload", off ? offload_json::stats(off->stats) : Json(nullptr)},
  };
  j["checkpoint_runs"] = std::move(runs);
  j["device_target"] = args.device_target;
  j["target_run"] = std::move(target);
  j["plan"] = args.plan;
  j["auto_run"] = std::move(automatic);
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) throw std::runtime_error("--summary-json: cannot write '" + path + "': " + std::strerror(errno));
}

}  // namespace demo
