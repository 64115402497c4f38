// SPDX-License-Identifier: MIT
#pragma once
// offload-demo's device: which one (--device), its memory counters, the
// --device-memory-cap, and a trace of device memory over one step.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/Device.h>

#include "flags.hpp"

namespace c10 {
struct DeviceAllocator;
}

namespace demo {

using Clock = std::chrono::steady_clock;

/// The device the demo trains on.
struct DeviceChoice {
  c10::Device device{c10::DeviceType::CPU};
  std::string label;        ///< e.g. "sim:0", "cuda:0"
  bool sim = false;         ///< the simulated device of offload_sim
  bool dispatched = false;  ///< offload::make_manager's detection picks this device
  std::string why;          ///< how it was chosen
};

/// Resolves --device, installing `sim` when it is chosen. Throws UsageError
/// when the device is not available.
DeviceChoice choose_device(const Args& args);

/// Device memory of the training device: the sim allocator's counters on
/// sim, else the device allocator's statistics (c10::DeviceAllocator, e.g.
/// the CUDA caching allocator); -1 when the backend reports none.
class DeviceMemory {
 public:
  explicit DeviceMemory(DeviceChoice d) : d_(std::move(d)) {}
  /// Bytes in use now.
  std::int64_t current() const;
  /// Most bytes in use at once since reset_peak().
  std::int64_t peak() const;
  /// Waits for the device's queued work and releases, then restarts the peak.
  void reset_peak() const;
  /// Total memory of the device per its allocator, or -1.
  std::int64_t total() const;

 private:
  c10::DeviceAllocator* allocator() const;
  DeviceChoice d_;
};

/// Applies --device-memory-cap (sim: its capacity; CUDA: a memory fraction).
/// Throws UsageError when the device cannot take it.
void apply_cap(const Args& args, const DeviceChoice& d, const DeviceMemory& memory);

/// Applies --link-gbps: sim's host link bandwidth for every copy from now
/// on. Throws UsageError on another device.
void apply_link(const Args& args, const DeviceChoice& d);

/// Removes the cap apply_cap() set.
void remove_cap(const Args& args, const DeviceChoice& d);

/// One sample of device memory: milliseconds since the start of the traced
/// step, bytes in use.
struct Sample {
  double t_ms;
  std::int64_t bytes;
};

/// Records device memory over one training step: the sim trace (every
/// allocation and release) on sim, else a thread that polls the allocator
/// every 100 microseconds.
class MemoryTrace {
 public:
  MemoryTrace(const DeviceChoice& d, const DeviceMemory& memory) : d_(d), memory_(memory) {}
  MemoryTrace(const MemoryTrace&) = delete;
  MemoryTrace& operator=(const MemoryTrace&) = delete;
  ~MemoryTrace() { stop(); }

  void start();
  /// Milliseconds since start().
  double ms_since_start() const { return std::chrono::duration<double, std::milli>(Clock::now() - t0_).count(); }
  /// Stops recording and returns the samples, the first at t = 0.
  std::vector<Sample> stop();

 private:
  DeviceChoice d_;
  const DeviceMemory& memory_;
  Clock::time_point t0_{};
  std::int64_t start_bytes_ = -1;
  std::atomic<bool> running_{false};
  std::thread poller_;
  std::mutex mutex_;
  std::vector<Sample> samples_;
};

}  // namespace demo
