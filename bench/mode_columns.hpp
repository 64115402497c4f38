// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Table columns the benchmarks that compare modes share (memory,
/// checkpoint, overlap, gpu): each reads a row's "mode", "loss" or phase
/// peaks.

#include <string>
#include <utility>

#include "bench.hpp"
#include "gpt_trainer.hpp"

namespace bench {

/// The mode a row's "mode" key names, as the tables print it.
inline std::string mode_name_of(const Json& row) {
  const auto key = row.at("mode").get<std::string>();
  for (const Mode m : {Mode::none, Mode::blocking, Mode::streamed})
    if (mode_key(m) == key) return mode_name(m);
  return key;
}

/// The "mode" column: mode_name_of().
inline Column mode_column() { return {"mode", "", mode_name_of}; }

/// The "loss" column: the row's loss, "(=)" when bitwise equal to the run
/// without offloading, "(DIFFERS)" otherwise.
inline Column loss_column() {
  return {"loss", "", [](const Json& row) {
            return fixed(number(row, "loss"), 6) +
                   (row.at("loss_bitwise_equal_to_none").get<bool>() ? " (=)" : " (DIFFERS)");
          }};
}

/// The "fwd/bwd/opt peak MiB" column: the peaks of the step's three phases.
inline Column phase_peaks_column() {
  return {"fwd/bwd/opt peak", "MiB", [](const Json& row) {
            return mib(integer(row, "peak_forward_bytes")) + " / " + mib(integer(row, "peak_backward_bytes")) + " / " +
                   mib(integer(row, "peak_optimizer_bytes"));
          }};
}

/// `column`, with "" in the rows of `mode` none.
inline Column unless_none(Column column) {
  auto cell = std::move(column.cell);
  column.cell = [cell](const Json& row) { return row.at("mode") == "none" ? std::string() : cell(row); };
  return column;
}

}  // namespace bench
