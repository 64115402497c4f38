// SPDX-License-Identifier: MIT
// The training loop on sim that the target, plan and host benchmarks share
// (sim_training.hpp).

#include "sim_training.hpp"

#include <chrono>

#include <c10/core/DeviceGuard.h>
#include <torch/optim/adamw.h>

#include <offload/scope.hpp>
#include <offload/sim.hpp>

#include "bench.hpp"

namespace bench {

SimTrainer::SimTrainer(const std::vector<at::Tensor>& parameters, std::function<at::Tensor()> loss,
                       std::optional<offload::AnyManager>& manager, c10::DeviceIndex device)
    : loss_(std::move(loss)), manager_(manager), device_(device) {
  if (manager_) manager_->exclude(parameters);
  optimizer_ = std::make_unique<torch::optim::AdamW>(parameters, torch::optim::AdamWOptions(1e-3));
}

SimTrainer::~SimTrainer() = default;

SimStep SimTrainer::step() {
  // The device's own step, as a process per accelerator runs it.
  const c10::DeviceGuard on(c10::Device(c10::DeviceType::PrivateUse1, device_));
  if (manager_) manager_->reset_stats();
  optimizer_->zero_grad();
  offload::sim::synchronize(device_);
  offload::sim::reset_peak(device_);
  SimStep out;
  const auto fresh_before = offload::sim::host_memory().system_allocations;
  const auto t0 = Clock::now();
  at::Tensor value;
  {
    std::optional<offload::Scope> scope;
    if (manager_) scope.emplace(*manager_);
    value = loss_();
  }
  out.forward_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  out.forward_peak = offload::sim::device_memory(device_).peak_bytes;
  value.backward();
  offload::sim::synchronize(device_);
  out.peak = offload::sim::device_memory(device_).peak_bytes;
  optimizer_->step();
  out.loss = value.item<float>();
  out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  out.fresh_pinned = offload::sim::host_memory().system_allocations - fresh_before;
  out.stats = manager_ ? manager_->stats() : offload::Stats{};
  return out;
}

std::vector<SimStep> train_on_sim(const std::vector<at::Tensor>& parameters, const std::function<at::Tensor()>& loss,
                                  std::optional<offload::AnyManager>& manager, int steps) {
  SimTrainer trainer(parameters, loss, manager);
  std::vector<SimStep> out;
  for (int s = 0; s < steps; ++s) out.push_back(trainer.step());
  return out;
}

}  // namespace bench
