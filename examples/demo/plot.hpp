// SPDX-License-Identifier: MIT
#pragma once
// offload-demo's --plot: the memory traces as CSV, drawn as a PNG by
// plot_memory.py with matplotlib.

#include <string>
#include <vector>

#include "device.hpp"
#include "flags.hpp"
#include "training.hpp"

namespace demo {

/// Throws UsageError when --plot cannot be rendered (no plot_memory.py,
/// no python, no matplotlib), so that nothing trains in vain.
void check_plot_tool();

/// Writes the traces of `runs` as CSV next to `png` (PNG's name with .csv)
/// and renders the PNG. Returns the CSV path. Throws std::runtime_error
/// when either step fails.
std::string write_plot(const std::string& png, const Args& args, const DeviceChoice& device,
                       const std::vector<const RunResult*>& runs);

}  // namespace demo
