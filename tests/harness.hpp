// SPDX-License-Identifier: MIT
#pragma once
// Shared prelude of the test suites: small models trained a few steps with
// AdamW, run with or without offloading, compared bit for bit. Only
// harness.cpp includes <torch/torch.h>.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <offload/any_manager.hpp>
#include <offload/config.hpp>
#include <offload/scope.hpp>
#include <offload/stats.hpp>

namespace harness {

enum class ModelKind {
  mlp,    ///< Linear-GELU-Linear on [batch, features]
  block,  ///< one transformer block (LayerNorm, causal attention, GELU MLP)
  gpt,    ///< the demo's GPT (2 layers, tiny)
};
std::string_view name(ModelKind kind);

/// Runs the forward pass and returns the loss; a Wrap decides where it
/// runs (inside an offload::Scope or not). Backward runs after the wrap
/// returns, outside any scope.
using Forward = std::function<at::Tensor()>;
using Wrap = std::function<at::Tensor(const Forward&)>;
/// Called once before training with the model's parameters (for exclude()).
using OnParams = std::function<void(const std::vector<at::Tensor>&)>;

struct RunResult {
  std::vector<float> losses;           ///< per step
  std::vector<at::Tensor> last_grads;  ///< CPU copies, last step
  std::vector<at::Tensor> params;      ///< CPU copies after the last optimizer step
};

/// Builds `kind` on the CPU from seed 0, moves it to `device`, trains
/// `steps` AdamW steps on fixed random data.
RunResult train(ModelKind kind, c10::Device device, int steps, const Wrap& wrap = {}, const OnParams& on_params = {});

/// Trains `params` `steps` AdamW steps (lr 1e-2) on the loss `forward`
/// returns, the forward pass run by `wrap` when given; `after_step` (when
/// given) runs after each optimizer step with the step's index.
RunResult train_params(const std::vector<at::Tensor>& params, const Forward& forward, int steps, const Wrap& wrap = {},
                       const OnParams& on_params = {}, const std::function<void(int)>& after_step = {});

/// A custom torch::autograd::Function saves a device tensor x and a CPU
/// tensor c on purpose; backward reports where c came back.
struct CustomFunctionResult {
  at::Tensor grad;  ///< gradient of x, on the CPU
  c10::Device cpu_saved_came_back_on{c10::DeviceType::CPU};
};
CustomFunctionResult custom_function_saving_cpu(c10::Device device, const Wrap& wrap = {});

#if OFFLOAD_HAS_SIM
/// What run_readme_snippet() measured: the loss after the snippet's steps,
/// after the same steps without it, and the snippet's manager's stats.
struct ReadmeRun {
  float with_snippet = 0;
  float without = 0;
  offload::Stats stats;
};
/// Runs the README's usage snippet on the sim device (2 steps of a tiny
/// GPT) and the same steps without it.
ReadmeRun run_readme_snippet();

/// Waits for everything queued on `device` (on sim: on every sim device;
/// elsewhere also lets the caching allocator return what it still held for
/// a side stream's use, and its cached blocks).
void synchronize(c10::Device device);
/// Bytes in use on `device` now, and at most since reset_peak(device):
/// sim's allocator (offload::sim::device_memory), or the device type's
/// caching allocator's active bytes (c10::getDeviceAllocator): a block freed
/// while a recorded stream still uses it counts until that stream passes
/// the free, the figure a device-memory target steers by.
std::int64_t device_bytes(c10::Device device);
std::int64_t peak_bytes(c10::Device device);
void reset_peak(c10::Device device);

/// Device bytes in use on `device` once LibTorch's autograd thread for its
/// index has let go of the last backward's buffers. backward() returns
/// when the graph task completes, before that thread ends its loop
/// iteration and drops its reference to the GraphTask (which can still hold
/// tensors, e.g. autograd::grad's results held by its future), so a count
/// read at once can include them. This runs a backward of zero-element
/// tensors on `device` (no offloading, 0 bytes) through the same thread
/// first: when it completes, the thread has finished every earlier
/// iteration. Covers that device's thread only. Calls synchronize(device).
std::int64_t settled_device_bytes(c10::Device device = c10::Device(c10::DeviceType::PrivateUse1, 0));

/// One training step's results: the most bytes allocated on its device
/// over forward and backward, and over forward alone (to the Scope's end);
/// its loss; the parameters' gradients (on the CPU).
struct Step {
  std::int64_t peak = 0;
  std::int64_t forward_peak = 0;
  float loss = 0;
  std::vector<at::Tensor> grads;
};
/// Clears the gradients of `params`, then (`device` synchronized and its
/// peak reset) computes `loss()` inside a Scope of `manager` (none: no
/// Scope) and runs its backward; what it measured.
Step train_step(const std::vector<at::Tensor>& params, c10::Device device, const Forward& loss,
                const offload::AnyManager* manager);
/// Whether two steps' losses and gradients are bitwise equal.
bool same(const Step& a, const Step& b);
#endif

/// A Wrap that runs the forward pass inside an offload::Scope of `manager`
/// (a copy: managers share their state).
template <class M>
Wrap with_scope(const M& manager) {
  return [manager](const Forward& forward) {
    offload::Scope scope(manager);
    return forward();
  };
}

/// The gradient of `loss_of(w)` with respect to the leaf `w`, computed
/// twice: without offloading (`plain`), then with the forward pass run by
/// `wrap` and backward after it returns (`wrapped`, also left in w.grad()).
struct GradPair {
  at::Tensor plain, wrapped;
};
GradPair grads_plain_and_wrapped(const at::Tensor& w, const std::function<at::Tensor(const at::Tensor&)>& loss_of,
                                 const Wrap& wrap);

/// True when losses, gradients and parameters are bitwise equal; else
/// false with the first difference in `why`.
bool bitwise_equal(const RunResult& a, const RunResult& b, std::string* why);

/// The test device policy: treats CPU tensors as "device" tensors, so every
/// manager path (pack, alias, unpack) runs without an accelerator.
struct HostAsDevice {
  static constexpr c10::DeviceType device_type = c10::DeviceType::CPU;
  static constexpr std::string_view name = "host-as-device";
  static constexpr bool has_streams = false;
  static constexpr bool has_events = false;
  static bool available() { return true; }
  static c10::Stream current_stream(c10::DeviceIndex) {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU));
  }
  static c10::Stream side_stream(c10::DeviceIndex index) { return current_stream(index); }
  static void record_stream(const at::Tensor&, c10::Stream) {}
  static std::int64_t memory_allocated(c10::DeviceIndex) { return -1; }
  static void empty_cache() {}
};

}  // namespace harness
