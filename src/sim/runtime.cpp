// SPDX-License-Identifier: MIT
//
// The sim runtime's state (set by install()), the stream lookups, and what
// runtime.hpp offers the kernels: the current stream, queueing on it, the
// copies' link time.

#include "checker.hpp"
#include "internal.hpp"

#include <c10/util/Exception.h>

#include <utility>

namespace offload::sim {
namespace detail {

std::atomic<Runtime*> g_runtime{nullptr};

constinit thread_local c10::DeviceIndex t_device = 0;
constinit thread_local std::array<c10::StreamId, kMaxDevices> t_stream{};

Runtime& runtime() {
  auto* rt = g_runtime.load(std::memory_order_acquire);
  TORCH_CHECK(rt != nullptr, "offload::sim is not installed; call offload::sim::install() first");
  return *rt;
}

c10::DeviceIndex resolve(c10::DeviceIndex index) { return index < 0 ? t_device : index; }

SimStream& stream_ref(c10::DeviceIndex index, c10::StreamId id) {
  check_device(index);
  TORCH_CHECK(id >= 0 && id < kStreamsPerDevice, "offload::sim: stream id ", id, " is not a sim stream (ids are 0 to ",
              kStreamsPerDevice - 1, ")");
  return *runtime().streams[static_cast<std::size_t>(index)][static_cast<std::size_t>(id)];
}

SimStream& stream_ref(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kSimType, "offload::sim: ", stream, " is not a ", c10::get_privateuse1_backend(),
              " stream");
  return stream_ref(resolve(stream.device_index()), stream.id());
}

std::string device_name(c10::DeviceIndex index) { return c10::Device(kSimType, index).str(); }

void check_device(c10::DeviceIndex index) {
  auto& rt = runtime();
  TORCH_CHECK(index >= 0 && index < rt.installed.num_devices, "offload::sim: device index ", static_cast<int>(index),
              " is out of range: ", rt.installed.backend_name, " has ", rt.installed.num_devices, " device(s)");
}

c10::StreamId current_stream_id(c10::DeviceIndex index) {
  check_device(index);
  return t_stream[static_cast<std::size_t>(index)];
}

void enqueue(c10::DeviceIndex index, c10::StreamId id, std::function<void()> task) {
  stream_ref(index, id).enqueue(std::move(task));
}

void drain_current(c10::DeviceIndex index) { stream_ref(index, current_stream_id(index)).synchronize(); }

std::int64_t link_time_ns(std::size_t bytes) {
  auto& rt = runtime();
  const auto latency_ns = rt.copy_latency_us.load(std::memory_order_relaxed) * 1000;
  // 1 GB/s moves one byte per nanosecond.
  const double transfer_ns = static_cast<double>(bytes) / rt.copy_bandwidth_gbps.load(std::memory_order_relaxed);
  return latency_ns + static_cast<std::int64_t>(transfer_ns);
}

}  // namespace detail

void synchronize(c10::DeviceIndex index) {
  const auto d = detail::resolve(index);
  detail::check_device(d);
  for (auto& s : detail::runtime().streams[static_cast<std::size_t>(d)]) {
    s->synchronize();
  }
  if (detail::check::on()) detail::check::synchronize_device(d);
}

}  // namespace offload::sim
