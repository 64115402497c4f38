// SPDX-License-Identifier: MIT
#pragma once
// CLI11 validators shared by offload-demo and offload-bench: the error text
// names the value and the accepted range (CLI11 puts the flag in front).

#include <charconv>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include <offload/options.hpp>

namespace flag_checks {

/// "[lo, hi]".
inline std::string range_text(offload::Range r) {
  return "[" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]";
}

/// An integer in `r`, rewritten as plain decimal (so CLI11 never reads
/// "010" as octal); `shown` names the range in errors (default "[lo, hi]").
inline CLI::Validator integer_in(offload::Range r, std::string shown = {}) {
  if (shown.empty()) shown = range_text(r);
  return CLI::Validator(
      [r, shown](std::string& text) -> std::string {
        std::int64_t value = 0;
        const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (text.empty() || ec == std::errc::invalid_argument || ptr != text.data() + text.size()) {
          return "expected an integer in " + shown + ", got '" + text + "'";
        }
        if (ec == std::errc::result_out_of_range || value < r.lo || value > r.hi) {
          return text + " is out of range; accepted: " + shown;
        }
        text = std::to_string(value);
        return {};
      },
      "");
}

}  // namespace flag_checks
