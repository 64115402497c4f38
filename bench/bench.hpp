// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Shared helpers of offload-bench: summaries of repeated timings, JSON
/// result files (nlohmann/json), markdown tables and the parsed command
/// line. No LibTorch here.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../cli/stats_json.hpp"

namespace bench {

/// JSON values of the result files; objects keep their fields in insertion order.
using Json = nlohmann::ordered_json;

/// Command line of one subcommand, `offload-bench NAME [--quick] [--out DIR]
/// [--flag value]...`, parsed and range-checked by parse_args (main.cpp).
struct Args {
  std::string name;
  bool quick = false;
  std::string out = "bench/results";             ///< folder for NAME.json
  std::map<std::string, std::int64_t> integers;  ///< integer flags given, by name without "--"
  std::map<std::string, std::string> texts;      ///< text flags given, by name without "--"

  bool has(const std::string& key) const { return integers.count(key) > 0 || texts.count(key) > 0; }
  std::string get(const std::string& key, const std::string& fallback) const {
    auto it = texts.find(key);
    return it == texts.end() ? fallback : it->second;
  }
  std::int64_t get_int(const std::string& key, std::int64_t fallback) const {
    auto it = integers.find(key);
    return it == integers.end() ? fallback : it->second;
  }
};

/// Median, quartiles and extremes of repeated measurements.
struct Summary {
  double median = 0, q1 = 0, q3 = 0, min = 0, max = 0;
  std::size_t n = 0;
};

inline double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const auto hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] * (1 - frac) + sorted[hi] * frac;
}

inline Summary summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = v.size();
  s.min = v.front();
  s.max = v.back();
  s.median = quantile(v, 0.5);
  s.q1 = quantile(v, 0.25);
  s.q3 = quantile(v, 0.75);
  return s;
}

using Clock = std::chrono::steady_clock;

/// Nanoseconds `f()` takes.
template <class F>
double time_ns(F&& f) {
  const auto t0 = Clock::now();
  f();
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

/// CPU nanoseconds all threads of this process spend in `f()`
/// (CLOCK_PROCESS_CPUTIME_ID): unlike wall time, not inflated when other
/// processes compete for the cores.
template <class F>
double cpu_ns(F&& f) {
  timespec a{}, b{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  f();
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  return static_cast<double>(b.tv_sec - a.tv_sec) * 1e9 + static_cast<double>(b.tv_nsec - a.tv_nsec);
}

// ---------------------------------------------------------------- JSON

/// {"median", "q1", "q3", "min", "max", "n"} of `s`.
inline Json summary_json(const Summary& s) {
  return Json::object({{"median", s.median},
                       {"q1", s.q1},
                       {"q3", s.q3},
                       {"min", s.min},
                       {"max", s.max},
                       {"n", static_cast<std::int64_t>(s.n)}});
}

/// Writes `value` to DIR/NAME.json and says so on stdout.
inline void write_result(const Args& args, const std::string& file, const Json& value) {
  const std::string path = args.out + "/" + file;
  std::ofstream out(path);
  if (!out) {
    std::cerr << "offload-bench: cannot write " << path << "\n";
    return;
  }
  out << value.dump(2) << "\n";
  std::cout << "\nraw numbers: " << path << "\n";
}

/// Fields every result file carries: what ran where. More are added with
/// push_back({"name", value}).
inline Json header(const Args& args, const std::string& torch_version) {
  return Json::object({{"benchmark", args.name},
                       {"quick", args.quick},
                       {"hardware_threads", static_cast<std::int64_t>(std::thread::hardware_concurrency())},
                       {"libtorch", torch_version}});
}

// ---------------------------------------------------------------- tables

/// A markdown table printed to stdout.
class Table {
 public:
  explicit Table(std::vector<std::string> columns) : columns_(std::move(columns)) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void print(std::ostream& os = std::cout) const {
    auto line = [&](const std::vector<std::string>& cells) {
      os << "|";
      for (const auto& c : cells) os << " " << c << " |";
      os << "\n";
    };
    line(columns_);
    os << "|";
    for (std::size_t i = 0; i < columns_.size(); ++i) os << (i == 0 ? "---|" : "---:|");
    os << "\n";
    for (const auto& r : rows_) line(r);
  }

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

/// `x` with `digits` digits after the point.
inline std::string fixed(double x, int digits = 1) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << x;
  return os.str();
}
inline std::string mib(std::int64_t bytes) { return fixed(static_cast<double>(bytes) / (1 << 20), 1); }
inline std::string size_label(std::int64_t bytes) {
  if (bytes >= (std::int64_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

// ---------------------------------------------------------------- result rows

/// One column of a benchmark's result table: its header (name and unit) and
/// how a row's cell is formatted. A benchmark returns its rows as JSON objects
/// (the raw numbers, written to its result file as they are) and lists its
/// columns once; print_rows() prints the table from those same rows, so the
/// table shows nothing the file does not hold.
struct Column {
  std::string name;                                  ///< header before the unit
  std::string unit;                                  ///< appended to the header ("MiB", "ms"); "" for none
  std::function<std::string(const Json& row)> cell;  ///< the cell of `row`; "" when it has none
  std::string header() const { return unit.empty() ? name : name + " " + unit; }
};

/// The number `row[key]` (throws nlohmann::json's error when it is missing).
inline double number(const Json& row, const std::string& key) { return row.at(key).get<double>(); }
inline std::int64_t integer(const Json& row, const std::string& key) { return row.at(key).get<std::int64_t>(); }
/// Whether `row` has a value (not null) at `key`.
inline bool has(const Json& row, const std::string& key) { return row.contains(key) && !row.at(key).is_null(); }

// The columns below show "" for a row without a value at `key`.

/// `row[key]` as it reads: a string as is, an integer in decimal.
inline Column text_column(std::string name, std::string key) {
  return {std::move(name), "", [key](const Json& row) {
            if (!has(row, key)) return std::string();
            const auto& v = row.at(key);
            return v.is_string() ? v.get<std::string>() : std::to_string(v.get<std::int64_t>());
          }};
}
/// `row[key]` with `digits` digits after the point, then `suffix`.
inline Column fixed_column(std::string name, std::string unit, std::string key, int digits, std::string suffix = "") {
  return {std::move(name), std::move(unit), [key, digits, suffix](const Json& row) {
            return has(row, key) ? fixed(number(row, key), digits) + suffix : std::string();
          }};
}
/// The bytes `row[key]` in MiB (`unit` says so: "MiB", "MiB/step").
inline Column mib_column(std::string name, std::string key, std::string unit = "MiB") {
  return {std::move(name), std::move(unit),
          [key](const Json& row) { return has(row, key) ? mib(integer(row, key)) : std::string(); }};
}
/// The median and the quartiles "q1..q3" of the summary_json() at `row[key]`.
inline Column median_column(std::string name, std::string unit, std::string key, int digits) {
  return {std::move(name), std::move(unit), [key, digits](const Json& row) {
            return has(row, key) ? fixed(number(row.at(key), "median"), digits) : std::string();
          }};
}
inline Column iqr_column(std::string name, std::string unit, std::string key, int digits) {
  return {std::move(name), std::move(unit), [key, digits](const Json& row) {
            if (!has(row, key)) return std::string();
            const auto& s = row.at(key);
            return fixed(number(s, "q1"), digits) + ".." + fixed(number(s, "q3"), digits);
          }};
}

/// Prints `rows` as a markdown table of `columns`.
inline void print_rows(const std::vector<Column>& columns, const std::vector<Json>& rows,
                       std::ostream& os = std::cout) {
  std::vector<std::string> headers;
  for (const auto& c : columns) headers.push_back(c.header());
  Table table(std::move(headers));
  for (const auto& row : rows) {
    std::vector<std::string> cells;
    for (const auto& c : columns) cells.push_back(c.cell(row));
    table.row(std::move(cells));
  }
  table.print(os);
}

}  // namespace bench

namespace bench {
/// Makes sim's link free (latency 0, the largest bandwidth): for
/// benchmarks that measure the host's cost, not the link's (bench.cpp).
void free_link();

/// The subcommands, one file each (NAME.cpp: run_NAME). Each returns the
/// process exit status.
int run_hook(const Args& args);
int run_copy(const Args& args);
int run_sim(const Args& args);
/// offload-bench sim's section on stream-order checking: a training step
/// with it off and on (sim_checked.cpp); printed, and returned for sim.json.
Json checked_step_section(const Args& args);
int run_memory(const Args& args);
int run_checkpoint(const Args& args);
int run_overlap(const Args& args);
int run_gpu(const Args& args);
int run_target(const Args& args);
int run_plan(const Args& args);
/// The sim devices `plan` needs: one per strategy of an R, stepped in turn.
inline constexpr int kPlanDevices = 16;
int run_host(const Args& args);
/// "2.11.0": the LibTorch this program was built against (bench.cpp).
std::string torch_version();
}  // namespace bench
