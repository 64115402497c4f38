// SPDX-License-Identifier: MIT
// The training loop on sim that the target, plan and host benchmarks share
// (sim_training.hpp).

#include "sim_training.hpp"

#include <chrono>

#include <torch/optim/adamw.h>

#include <offload/scope.hpp>
#include <offload/sim.hpp>

#include "bench.hpp"

namespace bench {

std::vector<SimStep> train_on_sim(const std::vector<at::Tensor>& parameters, const std::function<at::Tensor()>& loss,
                                  std::optional<offload::AnyManager>& manager, int steps) {
  if (manager) manager->exclude(parameters);
  torch::optim::AdamW optimizer(parameters, torch::optim::AdamWOptions(1e-3));
  std::vector<SimStep> out;
  for (int s = 0; s < steps; ++s) {
    if (manager) manager->reset_stats();
    optimizer.zero_grad();
    offload::sim::synchronize(0);
    offload::sim::reset_peak(0);
    SimStep step;
    const auto fresh_before = offload::sim::host_memory().system_allocations;
    const auto t0 = Clock::now();
    at::Tensor value;
    {
      std::optional<offload::Scope> scope;
      if (manager) scope.emplace(*manager);
      value = loss();
    }
    step.forward_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    step.forward_peak = offload::sim::device_memory(0).peak_bytes;
    value.backward();
    offload::sim::synchronize(0);
    step.peak = offload::sim::device_memory(0).peak_bytes;
    optimizer.step();
    step.loss = value.item<float>();
    step.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    step.fresh_pinned = offload::sim::host_memory().system_allocations - fresh_before;
    step.stats = manager ? manager->stats() : offload::Stats{};
    out.push_back(step);
  }
  return out;
}

}  // namespace bench
