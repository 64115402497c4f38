// SPDX-License-Identifier: MIT
#pragma once
// offload-demo's training runs: the same steps from the same weights and
// batches, without offloading or through an offload manager.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <offload/options.hpp>
#include <offload/stats.hpp>

#include "data.hpp"
#include "device.hpp"
#include "flags.hpp"

namespace demo {

class DataParallel;

/// What one training run produced.
struct RunResult {
  std::string name;           ///< "none", the mode ("checkpoint+" before it if checkpointed), "target", "auto"
  std::vector<float> losses;  ///< one per completed step
  std::optional<std::int64_t> oom_step;  ///< 1-based step that ran out of device memory
  std::string oom_message;
  std::int64_t peak_bytes = -1;
  double seconds = 0;         ///< wall time of the completed steps
  offload::Stats stats;       ///< the manager's counters (offloaded runs)
  std::string manager;        ///< manager.describe()
  std::vector<Sample> trace;  ///< device memory over the traced step
  double forward_end_ms = -1, backward_end_ms = -1, step_end_ms = -1, oom_ms = -1;  ///< marks on the trace
  std::int64_t traced_step = 0;                                                     ///< 1-based
  std::size_t parameters_hash = 0;  ///< with --ranks > 1: a hash of the final parameters' bytes

  double seconds_per_step() const { return losses.empty() ? 0.0 : seconds / static_cast<double>(losses.size()); }
};

/// What every training run of one demo invocation shares.
struct Session {
  const Args& args;
  const Corpus& corpus;
  const DeviceChoice& device;
  const DeviceMemory& memory;
  bool trace = false;                ///< trace device memory over step min(2, --steps)
  bool tty = false;                  ///< progress as one updated line
  const DataParallel* dp = nullptr;  ///< --ranks > 1: this rank's group
};

/// How one run offloads.
struct RunSpec {
  OffloadMode mode = OffloadMode::none;  ///< none, or a manager: blocking or streamed
  offload::Options options{};            ///< the manager's options
  bool checkpoint = false;               ///< each block of the model through offload::checkpoint
  bool planned = false;                  ///< each block marked for the automatic plan (with a target)
};

/// Trains --model for --steps steps from the initial weights of --seed on
/// the batches of --seed, without offloading (`run.mode` none) or through
/// a manager of `run.mode` (blocking or streamed) with `run.options`;
/// every forward runs inside an offload::Scope. A c10::OutOfMemoryError
/// ends the run and is recorded. With `session.trace`, device memory is
/// traced over step min(2, --steps) (or over the step that ran out of
/// memory, when that comes first). Shows progress on stdout. With
/// `session.dp` (--ranks > 1) the run trains on the rank's shard of the
/// text, starts from rank 0's weights and averages the gradients over the
/// ranks after every backward.
RunResult train(const Session& session, const RunSpec& run);

/// Bitwise comparison of the losses both runs completed.
struct Comparison {
  std::size_t common = 0;
  bool bitwise_equal = true;
  double max_abs_diff = 0;
};
Comparison compare(const RunResult& a, const RunResult& b);

/// "12.3 MiB" / "2.03 GiB"; "n/a" for a negative count.
std::string mib(std::int64_t bytes);

}  // namespace demo
