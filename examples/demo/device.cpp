// SPDX-License-Identifier: MIT

#include "device.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/config.hpp>
#include <offload/dispatch.hpp>
#include <offload/sim.hpp>

#if OFFLOAD_HAS_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace demo {

DeviceChoice choose_device(const Args& args) {
  DeviceChoice out;
  std::string name = args.device;
  std::int64_t index = 0;
  if (const auto colon = name.find(':'); colon != std::string::npos) {
    const std::string text = name.substr(colon + 1);
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), index);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
      throw UsageError("--device: expected an integer in [0, 63] after ':', got '" + text + "'");
    }
    if (index < 0 || index > 63)
      throw UsageError("--device: " + text + " is out of range; accepted: [0, 63] after ':'");
    name.resize(colon);
  }
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
  std::optional<offload::DetectedAccelerator> detected;
  if (name != "sim") {
    try {
      detected = offload::detect_accelerator();
    } catch (const c10::Error& e) {
      throw UsageError("--device " + args.device +
                       ": LibTorch could not detect the accelerator: " + e.what_without_backtrace());
    }
  }
  if (name == "auto" && detected && detected->type) {
    name = detected->name;
  } else if (name == "auto") {
    name = "sim";
    out.why = "no accelerator detected (" + detected->reason + "), using the simulated device";
  }
  if (name == "sim") {
    if (index >= offload::sim::Config{}.num_devices) {
      throw UsageError("--device " + args.device + ": sim has devices 0.." +
                       std::to_string(offload::sim::Config{}.num_devices - 1));
    }
    try {
      offload::sim::install();
    } catch (const c10::Error& e) {
      throw UsageError("--device " + args.device + ": cannot install the sim backend: " + e.what_without_backtrace());
    }
    out.device = c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index));
    out.sim = true;
    out.label = "sim:" + std::to_string(index);
    if (out.why.empty()) out.why = "requested with --device";
    try {  // the dispatcher serves sim only when LibTorch reports it as the accelerator
      const auto now = offload::detect_accelerator();
      out.dispatched = now.type && *now.type == c10::DeviceType::PrivateUse1 && now.name == "sim";
    } catch (const c10::Error&) {
      out.dispatched = false;  // e.g. another accelerator excludes PrivateUse1: use device::Sim directly
    }
    return out;
  }
  if (!detected || !detected->type || detected->name != name) {
    std::string have = "auto, sim";
    if (detected && detected->type) have += ", " + detected->name;
    throw UsageError("--device " + args.device + ": not available; accepted here: " + have + " (" +
                     (detected && detected->type ? "the detected accelerator is " + detected->name
                                                 : (detected ? detected->reason : std::string("not detected"))) +
                     ")");
  }
  const auto count = c10::impl::getDeviceGuardImpl(*detected->type)->deviceCount();
  if (index >= count) {
    throw UsageError("--device " + args.device + ": index out of range; this machine has " + name + ":0.." +
                     std::to_string(count - 1));
  }
  out.device = c10::Device(*detected->type, static_cast<c10::DeviceIndex>(index));
  out.label = name + ":" + std::to_string(index);
  out.dispatched = true;
  if (out.why.empty()) out.why = args.device == "auto" ? "the detected accelerator" : "requested with --device";
  return out;
}

// ------------------------------------------------------------------ memory

namespace {
c10::CachingDeviceAllocator::Stat allocated(c10::DeviceAllocator* a, c10::DeviceIndex index) {
  return a->getDeviceStats(index).allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}
}  // namespace

c10::DeviceAllocator* DeviceMemory::allocator() const {
  return dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(d_.device.type()));
}

std::int64_t DeviceMemory::current() const {
  if (d_.sim) return offload::sim::device_memory(d_.device.index()).current_bytes;
  if (auto* a = allocator()) return allocated(a, d_.device.index()).current;
  return -1;
}

std::int64_t DeviceMemory::peak() const {
  if (d_.sim) return offload::sim::device_memory(d_.device.index()).peak_bytes;
  if (auto* a = allocator()) return allocated(a, d_.device.index()).peak;
  return -1;
}

void DeviceMemory::reset_peak() const {
  if (d_.sim) {
    offload::sim::synchronize(d_.device.index());
    offload::sim::reset_peak(d_.device.index());
  } else if (auto* a = allocator()) {
    c10::impl::getDeviceGuardImpl(d_.device.type())->synchronizeDevice(d_.device.index());
    a->emptyCache();
    a->resetPeakStats(d_.device.index());
  }
}

std::int64_t DeviceMemory::total() const {
  if (auto* a = allocator()) return static_cast<std::int64_t>(a->getMemoryInfo(d_.device.index()).second);
  return -1;
}

void apply_link(const Args& args, const DeviceChoice& d) {
  if (!args.link_gbps) return;
  if (!d.sim) throw UsageError("--link-gbps: sets the simulated link of sim, not of " + d.label);
  offload::sim::set_copy_bandwidth_gbps(*args.link_gbps);
}

void apply_cap(const Args& args, const DeviceChoice& d, const DeviceMemory& memory) {
  if (args.device_memory_cap == 0) return;
  if (d.sim) {
    offload::sim::set_capacity_bytes(args.device_memory_cap);
    return;
  }
#if OFFLOAD_HAS_CUDA
  if (d.device.is_cuda()) {
    const auto total = memory.total();
    if (total <= 0 || args.device_memory_cap > total) {
      throw UsageError("--device-memory-cap: " + std::to_string(args.device_memory_cap) +
                       " is out of range; this device has " + std::to_string(total) + " bytes");
    }
    c10::cuda::CUDACachingAllocator::setMemoryFraction(
        static_cast<double>(args.device_memory_cap) / static_cast<double>(total), d.device.index());
    return;
  }
#endif
  (void)memory;
  throw UsageError("--device-memory-cap: supported on sim and cuda only, not on " + d.label);
}

void remove_cap(const Args& args, const DeviceChoice& d) {
  if (args.device_memory_cap > 0 && d.sim) offload::sim::set_capacity_bytes(0);
}

// ------------------------------------------------------------------ trace

void MemoryTrace::start() {
  stop();
  samples_.clear();
  start_bytes_ = memory_.current();
  if (d_.sim) {
    offload::sim::set_trace(true);
    t0_ = Clock::now();
    return;
  }
  t0_ = Clock::now();
  running_ = true;
  poller_ = std::thread([this] {
    while (running_.load()) {
      const Sample s{ms_since_start(), memory_.current()};
      {
        const std::lock_guard lock(mutex_);
        samples_.push_back(s);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
}

std::vector<Sample> MemoryTrace::stop() {
  std::vector<Sample> out;
  if (d_.sim) {
    if (!offload::sim::installed()) return out;
    offload::sim::synchronize(d_.device.index());
    auto points = offload::sim::take_trace();
    offload::sim::set_trace(false);
    if (start_bytes_ < 0) return out;  // not started
    out.push_back({0.0, start_bytes_});
    for (const auto& p : points) out.push_back({static_cast<double>(p.t_us) / 1000.0, p.bytes});
    start_bytes_ = -1;
    return out;
  }
  if (poller_.joinable()) {
    running_ = false;
    poller_.join();
  }
  const std::lock_guard lock(mutex_);
  out.swap(samples_);
  return out;
}

}  // namespace demo
