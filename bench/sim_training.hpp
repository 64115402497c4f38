// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The training loop the target, plan and host benchmarks share: a model
/// trained for a few AdamW steps on a sim device, each step's peaks, times,
/// loss and the manager's counters recorded. SimTrainer steps one model at
/// a time, so that several (each on its own sim device) can be stepped in
/// turn: round robin, where a loaded machine slows them alike.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <offload/any_manager.hpp>
#include <offload/stats.hpp>

namespace torch::optim {
class AdamW;
}

namespace bench {

/// What one training step on a sim device measured.
struct SimStep {
  std::int64_t forward_peak = 0;  ///< the device's allocated bytes, most over the forward (to the Scope's end)
  std::int64_t peak = 0;          ///< ... most over forward and backward
  double forward_seconds = 0;     ///< the forward, to the Scope's end
  double seconds = 0;             ///< forward + backward + optimizer step
  std::int64_t fresh_pinned = 0;  ///< sim's pinned host blocks taken from malloc in the step
  float loss = 0;
  offload::Stats stats;  ///< the manager's counters of the step; zeros without a manager
};

/// One model's training on sim device `device` (its parameters and the
/// tensors `loss()` reads live there), a step at a time. `manager` (none:
/// no Scope) is the caller's and must outlive the trainer; the parameters
/// are excluded from it first. AdamW, lr 1e-3. Not thread-safe.
class SimTrainer {
 public:
  SimTrainer(const std::vector<at::Tensor>& parameters, std::function<at::Tensor()> loss,
             std::optional<offload::AnyManager>& manager, c10::DeviceIndex device = 0);
  ~SimTrainer();
  SimTrainer(const SimTrainer&) = delete;
  SimTrainer& operator=(const SimTrainer&) = delete;

  /// One step: resets the manager's counters and the device's peak,
  /// computes `loss()` inside the manager's Scope, runs the backward and
  /// the optimizer step.
  SimStep step();

 private:
  std::function<at::Tensor()> loss_;
  std::optional<offload::AnyManager>& manager_;
  c10::DeviceIndex device_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
};

/// Trains for `steps` steps on sim:0 (SimTrainer::step, one after another).
std::vector<SimStep> train_on_sim(const std::vector<at::Tensor>& parameters, const std::function<at::Tensor()>& loss,
                                  std::optional<offload::AnyManager>& manager, int steps);

}  // namespace bench
