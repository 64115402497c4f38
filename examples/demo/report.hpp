// SPDX-License-Identifier: MIT
#pragma once
// offload-demo's report: the comparison table and verdict lines on stdout,
// and the --summary-json file.

#include <string>
#include <vector>

#include "data.hpp"
#include "device.hpp"
#include "flags.hpp"
#include "training.hpp"

namespace demo {

/// The table of both runs (either may be null) and of the runs beside them
/// (`more`: the checkpointed runs of --checkpoint, the run of
/// --device-target), and the lines that say whether the losses are bitwise
/// equal and which run ran out of memory.
void print_report(const Args& args, const RunResult* none, const RunResult* off,
                  const std::vector<const RunResult*>& more = {});

/// Writes the results to `path` as JSON (field names: examples/check_demo.py
/// reads them). Throws std::runtime_error when the file cannot be written.
/// Of `more`, the checkpointed runs go to "checkpoint_runs" (null without
/// --checkpoint), the run named "target" to "target_run" (null without
/// --device-target).
void write_summary(const std::string& path, const Args& args, const Corpus& corpus, const DeviceChoice& device,
                   const RunResult* none, const RunResult* off, const std::vector<const RunResult*>& more = {});

}  // namespace demo
