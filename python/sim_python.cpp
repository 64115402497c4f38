// SPDX-License-Identifier: MIT
// torch_offload._sim: offload::sim (the simulated PrivateUse1 accelerator)
// for Python processes: pybind11, <offload/sim.hpp>, the device guard for
// current device and stream, and autograd (the exit drain).

#include <cstdint>
#include <exception>
#include <string>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/ones.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/autograd.h>

#include <offload/sim.hpp>

#include "errors.hpp"

namespace py = pybind11;

namespace offload::python {
void bind_sim_collectives(py::module_& m);  // sim_collectives_python.cpp
}  // namespace offload::python

namespace {

constexpr auto kSim = c10::DeviceType::PrivateUse1;

py::dict memory_dict(const offload::sim::MemoryStats& s) {
  py::dict out;
  out["current_bytes"] = s.current_bytes;
  out["peak_bytes"] = s.peak_bytes;
  out["allocations"] = s.allocations;
  out["frees"] = s.frees;
  out["reserved_bytes"] = s.reserved_bytes;
  out["peak_reserved_bytes"] = s.peak_reserved_bytes;
  out["system_allocations"] = s.system_allocations;
  return out;
}

const c10::impl::DeviceGuardImplInterface& guard() {
  TORCH_CHECK(offload::sim::installed(), "torch_offload.sim is not installed; call torch_offload.sim.install() first");
  return *c10::impl::getDeviceGuardImpl(kSim);
}

// Before the interpreter finalizes. LibTorch's autograd thread of a device
// (here: each sim device) can still hold the graph task of the last backward
// pass when that pass has returned to Python; its thread-local state holds
// Python objects (the saved-tensor hooks of save_on_cpu, of a Manager).
// Released once the interpreter is finalizing, they need the GIL, which the
// thread then cannot take: Python ends the thread inside a destructor, and
// the C++ runtime aborts the process ("terminate called without an active
// exception"). A backward pass on each device, of tensors without a Python
// object and with no hooks, is queued behind that release (a device's
// ready queue is FIFO) and leaves nothing that needs the GIL. Called without
// the GIL; a process where autograd cannot run (a fork child of a process
// whose autograd threads had started) skips it.
void release_autograd_threads() {
  const int devices = static_cast<int>(guard().deviceCount());
  const at::AutoGradMode grad_on(true);
  for (int d = 0; d < devices; ++d) {
    try {
      const auto x = at::ones({1}, at::TensorOptions().device(c10::Device(kSim, static_cast<c10::DeviceIndex>(d))))
                         .requires_grad_();
      (void)torch::autograd::grad({x.mul(2).sum()}, {x});
    } catch (const std::exception&) {  // nothing left to release
    }
  }
}

}  // namespace

PYBIND11_MODULE(_sim, m) {
  m.doc() = "offload::sim for Python (use torch_offload.sim, not this module)";
  offload::python::register_error_translator();
  offload::python::bind_sim_collectives(m);

  m.def(
      "install",
      [](const std::string& name, int num_devices, std::int64_t capacity_bytes, std::int64_t copy_latency_us,
         double copy_bandwidth_gbps, bool poison_freed, bool host_power_of_two, std::int64_t pinned_alloc_us,
         bool check_streams) {
        offload::sim::install(offload::sim::Config{.backend_name = name,
                                                   .num_devices = num_devices,
                                                   .capacity_bytes = capacity_bytes,
                                                   .copy_latency_us = copy_latency_us,
                                                   .copy_bandwidth_gbps = copy_bandwidth_gbps,
                                                   .poison_freed = poison_freed,
                                                   .host_power_of_two = host_power_of_two,
                                                   .pinned_alloc_us = pinned_alloc_us,
                                                   .check_streams = check_streams});
      },
      py::arg("name"), py::arg("num_devices"), py::arg("capacity_bytes"), py::arg("copy_latency_us"),
      py::arg("copy_bandwidth_gbps"), py::arg("poison_freed"), py::arg("host_power_of_two"), py::arg("pinned_alloc_us"),
      py::arg("check_streams"));
  m.attr("device_type") = static_cast<int>(kSim);  // what torch.Stream(device_type=...) takes
  m.def("installed", &offload::sim::installed);
  m.def("config", [] {
    const auto c = offload::sim::config();
    py::dict out;
    out["name"] = c.backend_name;
    out["num_devices"] = c.num_devices;
    out["capacity_bytes"] = c.capacity_bytes;
    out["copy_latency_us"] = c.copy_latency_us;
    out["copy_bandwidth_gbps"] = c.copy_bandwidth_gbps;
    out["poison_freed"] = c.poison_freed;
    out["host_power_of_two"] = c.host_power_of_two;
    out["pinned_alloc_us"] = c.pinned_alloc_us;
    out["check_streams"] = c.check_streams;
    return out;
  });
  m.def("set_copy_latency_us", &offload::sim::set_copy_latency_us);
  m.def("set_copy_bandwidth_gbps", &offload::sim::set_copy_bandwidth_gbps);
  m.attr("max_copy_latency_us") = offload::sim::kMaxCopyLatencyUs;
  m.attr("max_copy_bandwidth_gbps") = offload::sim::kMaxCopyBandwidthGbps;
  m.def("set_poison_freed", &offload::sim::set_poison_freed);
  m.def("set_capacity_bytes", &offload::sim::set_capacity_bytes);
  m.def("set_host_power_of_two", &offload::sim::set_host_power_of_two);
  m.def("set_pinned_alloc_us", &offload::sim::set_pinned_alloc_us);
  m.def("set_check_streams", &offload::sim::set_check_streams);
  m.attr("max_pinned_alloc_us") = offload::sim::kMaxPinnedAllocUs;
  m.def("device_memory",
        [](int index) { return memory_dict(offload::sim::device_memory(static_cast<c10::DeviceIndex>(index))); });
  m.def("reset_peak", [](int index) { offload::sim::reset_peak(static_cast<c10::DeviceIndex>(index)); });
  m.def("host_memory", [] { return memory_dict(offload::sim::host_memory()); });
  m.def("reset_host_peak", &offload::sim::reset_host_peak);
  m.def("empty_cache", &offload::sim::empty_cache, py::call_guard<py::gil_scoped_release>());
  m.def(
      "synchronize", [](int index) { offload::sim::synchronize(static_cast<c10::DeviceIndex>(index)); },
      py::call_guard<py::gil_scoped_release>());
  m.def("release_autograd_threads", &release_autograd_threads, py::call_guard<py::gil_scoped_release>());
  m.def(
      "drain_for_exit",
      [] {
        if (!offload::sim::installed()) return;
        release_autograd_threads();
        offload::sim::drain_for_exit();
      },
      py::call_guard<py::gil_scoped_release>());
  m.def("current_device", [] { return static_cast<int>(guard().getDevice().index()); });
  m.def("set_device", [](int index) { guard().setDevice(c10::Device(kSim, static_cast<c10::DeviceIndex>(index))); });
  // Streams cross as (stream_id, device_index): torch.Stream is built and
  // read on the Python side.
  m.def("current_stream_id",
        [](int index) { return guard().getStream(c10::Device(kSim, static_cast<c10::DeviceIndex>(index))).id(); });
  m.def("exchange_stream", [](std::int64_t id, int index) {
    const c10::Stream stream(c10::Stream::UNSAFE, c10::Device(kSim, static_cast<c10::DeviceIndex>(index)), id);
    return guard().exchangeStream(stream).id();
  });
}
