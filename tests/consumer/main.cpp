// SPDX-License-Identifier: MIT
// The consumer program of the integration tests: built once as a Meson
// project with torch-offload as a subproject (tests/consumer/meson.build),
// and against an installed torch-offload once with pkg-config and once with
// CMake (tests/install/). Trains one SGD step of a tiny MLP on the sim device
// inside an offload::Scope, and the same step without it; exits 0 only when
// bytes were offloaded and brought back and the gradients are bitwise equal.

#include <cstdlib>
#include <iostream>
#include <vector>

#include <torch/torch.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

namespace {

using Offload = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Blocking>;

/// One step from seed 0; returns the gradients (on the CPU).
std::vector<torch::Tensor> step(const c10::Device& device, const Offload* manager) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(64, 256), torch::nn::GELU(), torch::nn::Linear(256, 8));
  model->to(device);
  const auto x = torch::randn({32, 64}).to(device);
  const auto y = torch::randn({32, 8}).to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  optimizer.zero_grad();
  torch::Tensor loss;
  if (manager != nullptr) {
    offload::Scope scope(*manager);  // saved tensors of this thread go to host memory
    loss = torch::mse_loss(model->forward(x), y);
  } else {
    loss = torch::mse_loss(model->forward(x), y);
  }
  loss.backward();  // after the scope: they come back as backward needs them
  optimizer.step();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().cpu());
  return grads;
}

}  // namespace

int main() {
  offload::sim::install();  // the simulated accelerator: PrivateUse1 backend "sim"
  const c10::Device sim(c10::DeviceType::PrivateUse1, 0);

  const Offload manager;
  const auto offloaded = step(sim, &manager);
  const auto plain = step(sim, nullptr);

  const auto stats = manager.stats();
  std::cout << "consumer: torch-offload " << OFFLOAD_VERSION << " " << stats << "\n";
  bool equal = offloaded.size() == plain.size();
  for (std::size_t i = 0; equal && i < plain.size(); ++i) equal = torch::equal(offloaded[i], plain[i]);
  if (stats.bytes_offloaded <= 0 || stats.bytes_reloaded <= 0 || !equal) {
    std::cerr << "consumer: FAILED (bytes_offloaded " << stats.bytes_offloaded << ", bytes_reloaded "
              << stats.bytes_reloaded << ", gradients bitwise equal: " << std::boolalpha << equal << ")\n";
    return EXIT_FAILURE;
  }
  std::cout << "consumer: OK\n";
  return EXIT_SUCCESS;
}
