// SPDX-License-Identifier: MIT
//
// offload::sim::install(): builds the runtime, registers the backend, its
// guard, allocator, hooks and kernels, and drains every stream at exit.

#include "checker.hpp"
#include "internal.hpp"

#include <offload/capture.hpp>

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>

#include <offload/storage/host.hpp>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace offload::sim {
namespace detail {
namespace {

std::mutex g_install_mutex;

// Config::check_streams as OFFLOAD_SIM_CHECK_STREAMS sets it: 0 or 1, or
// `configured` when the variable is not set.
bool check_streams_from_env(bool configured) {
  const char* value = std::getenv("OFFLOAD_SIM_CHECK_STREAMS");
  if (value == nullptr) return configured;
  const std::string given = value;
  TORCH_CHECK_VALUE(given == "0" || given == "1",
                    "offload::sim::install: OFFLOAD_SIM_CHECK_STREAMS must be 0 (off) or 1 (stream-order checking "
                    "on), got '",
                    given, "'");
  return given == "1";
}

// The autograd engine's per-device ready queues, read through pointers to
// its protected members (a pointer to member may name a base's protected
// member through a derived class): the number of queues once the engine has
// started its device threads (at the process's first backward pass, sized
// by the device guards registered then), nothing before.
struct EngineQueues : torch::autograd::Engine {
  static std::optional<std::size_t> started_with(const torch::autograd::Engine& engine) {
    if (engine.*(&EngineQueues::thread_pool_shared_) == nullptr) return std::nullopt;
    return (engine.*(&EngineQueues::device_ready_queues_)).size();
  }
};

// A backward pass before this library was loaded started the engine
// without sim's guard (which reports the most devices until install):
// sim's devices have no ready queue, and the engine would fail its own
// internal assertion at the first backward pass on sim. Said here, before
// anything changes.
void check_autograd_queues(const Config& config) {
  const auto queues = EngineQueues::started_with(torch::autograd::Engine::get_default_engine());
  TORCH_CHECK(!queues || *queues >= static_cast<std::size_t>(config.num_devices),
              "offload::sim::install: a backward pass ran in this process before sim was loaded, and PyTorch's "
              "autograd engine sized its per-device queues then (",
              *queues, ", for ", config.num_devices,
              " sim devices): no backward pass on sim could run in this process. Install sim before the first "
              "backward pass of the process (from Python: import torch_offload.sim and call install() first; in a "
              "notebook, restart the kernel)");
}

}  // namespace
}  // namespace detail

void install(const Config& config) {
  detail::validate(config);
  std::lock_guard<std::mutex> lock(detail::g_install_mutex);
  const bool check_streams = detail::check_streams_from_env(config.check_streams);
  if (installed()) {
    // Compared with what was installed: the runtime knobs may have moved since.
    const auto& have = detail::runtime().installed;
    TORCH_CHECK(have == config, "offload::sim::install: already installed with a different Config (",
                detail::differences(have, config), ")");
    return;
  }
  TORCH_CHECK(!c10::is_privateuse1_backend_registered() || c10::get_privateuse1_backend() == config.backend_name,
              "offload::sim::install: the PrivateUse1 backend is already registered as '",
              c10::get_privateuse1_backend(), "', cannot register '", config.backend_name, "'");
  detail::check_autograd_queues(config);

  auto* rt = new detail::Runtime();
  rt->installed = config;
  rt->copy_latency_us.store(config.copy_latency_us);
  rt->copy_bandwidth_gbps.store(config.copy_bandwidth_gbps);
  rt->poison.store(config.poison_freed);
  rt->host_power_of_two.store(config.host_power_of_two);
  rt->pinned_alloc_us.store(config.pinned_alloc_us);
  for (int d = 0; d < config.num_devices; ++d) {
    for (int id = 0; id < detail::kStreamsPerDevice; ++id) {
      rt->streams[static_cast<std::size_t>(d)][static_cast<std::size_t>(id)] =
          std::make_unique<detail::SimStream>(static_cast<c10::DeviceIndex>(d), static_cast<c10::StreamId>(id));
    }
  }
  detail::set_device_capacity(config.capacity_bytes);
  detail::check::set_on(check_streams);

  c10::register_privateuse1_backend(config.backend_name);
  // Re-register the guard in case another library overwrote the slot.
  const c10::impl::DeviceGuardImplRegistrar registrar(c10::DeviceType::PrivateUse1, &detail::guard_impl());
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &detail::device_allocator());
  at::RegisterPrivateUse1HooksInterface(&detail::hooks());
  detail::g_runtime.store(rt, std::memory_order_release);
  // After the store: the rule reads the runtime's knobs.
  storage::set_pinned_block_rule(c10::DeviceType::PrivateUse1, &detail::host_block_bytes);
  offload::set_capture_probe(c10::DeviceType::PrivateUse1, &detail::capture_probe);
  detail::register_kernels();
  // Registered here, so it runs before the statics constructed earlier are
  // destroyed (a Python process drains sooner, from Python's atexit).
  std::atexit(&drain_for_exit);
}

bool installed() noexcept { return detail::g_runtime.load(std::memory_order_acquire) != nullptr; }

void drain_for_exit() noexcept {
  auto* rt = detail::g_runtime.load(std::memory_order_acquire);
  if (rt == nullptr) return;
  // Set before each stream's lock is taken: work queued before it is in a
  // queue synchronize() waits for; work queued after sees the flag
  // (SimStream::enqueue reads it under the same lock) and runs on the
  // thread that queues it.
  detail::g_exiting.store(true);
  for (int d = 0; d < rt->installed.num_devices; ++d) {
    for (auto& s : rt->streams[static_cast<std::size_t>(d)]) {
      try {
        s->synchronize();
      } catch (...) {  // errors of queued work have nobody left to report to
      }
    }
  }
}

}  // namespace offload::sim
