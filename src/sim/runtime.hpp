// SPDX-License-Identifier: MIT
#pragma once

// Internal interface between the sim runtime (streams.cpp, runtime.cpp,
// the allocators, guard.cpp, privateuse1_hooks.cpp, install.cpp) and the sim kernels
// (kernels.cpp, cells.cpp). Not installed.

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstddef>
#include <cstdint>
#include <functional>

namespace torch {
class Library;
}

namespace offload::sim::detail {

inline constexpr int kMaxDevices = 16;
/// Stream 0 is the default stream; 1..kPoolStreams form the pool.
inline constexpr int kPoolStreams = 8;
inline constexpr int kStreamsPerDevice = 1 + kPoolStreams;

/// Throws c10::Error unless installed and 0 <= index < num_devices.
void check_device(c10::DeviceIndex index);

/// Id of the calling thread's current stream on device `index`.
c10::StreamId current_stream_id(c10::DeviceIndex index);

/// Queues `task` on stream `id` of device `index`; it runs on that stream's
/// worker thread after everything queued before it.
void enqueue(c10::DeviceIndex index, c10::StreamId id, std::function<void()> task);

/// Waits until the calling thread's current stream on device `index` has
/// run everything queued on it so far ("drain"); rethrows a task's error.
void drain_current(c10::DeviceIndex index);

/// Link time of a copy of `bytes` between the CPU and a sim device issued
/// now: copy_latency_us + bytes / copy_bandwidth_gbps, in nanoseconds.
std::int64_t link_time_ns(std::size_t bytes);

/// Steady-clock time in nanoseconds (the clock wait_until_ns() reads).
std::int64_t steady_now_ns();

/// In a stream's task (on its worker, or on a thread waiting for the
/// stream that runs the task): the end of the link time of a copy of
/// `link_ns` that starts now, or when the link of this stream is free
/// (the end of the previous copy's link time) if that is later. A queued
/// copy does its host memcpy after that end, before the next task starts:
/// copies queued back to back take link time + memcpy each (bench/README.md,
/// "Changes outside bench/ that would help").
std::int64_t link_slot_end_ns(std::int64_t link_ns);

/// Returns at `deadline_ns` (steady_now_ns() time) or just after: sleeps,
/// then spins the last tens of microseconds for precision.
void wait_until_ns(std::int64_t deadline_ns);

/// Registers the native kernels and the boxed fallback (kernels.cpp).
void register_kernels();

/// Registers the fused LSTM and GRU cells, forward and backward (cells.cpp).
void register_cell_kernels(torch::Library& aten);

}  // namespace offload::sim::detail
