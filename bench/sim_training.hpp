// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The training loop the target, plan and host benchmarks share: a model
/// trained for a few AdamW steps on sim:0, each step's peaks, times, loss
/// and the manager's counters recorded.

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include <offload/any_manager.hpp>
#include <offload/stats.hpp>

namespace bench {

/// What one training step on sim:0 measured.
struct SimStep {
  std::int64_t forward_peak = 0;  ///< sim:0 allocated bytes, most over the forward (to the Scope's end)
  std::int64_t peak = 0;          ///< ... most over forward and backward
  double forward_seconds = 0;     ///< the forward, to the Scope's end
  double seconds = 0;             ///< forward + backward + optimizer step
  std::int64_t fresh_pinned = 0;  ///< sim's pinned host blocks taken from malloc in the step
  float loss = 0;
  offload::Stats stats;  ///< the manager's counters of the step; zeros without a manager
};

/// Trains for `steps` steps: each resets the manager's counters and sim:0's
/// peak, computes `loss()` inside the manager's Scope (none without a
/// manager), runs the backward and an AdamW step (lr 1e-3) over
/// `parameters`, which are excluded from the manager first.
std::vector<SimStep> train_on_sim(const std::vector<at::Tensor>& parameters, const std::function<at::Tensor()>& loss,
                                  std::optional<offload::AnyManager>& manager, int steps);

}  // namespace bench
