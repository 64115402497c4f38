// SPDX-License-Identifier: MIT
// torch_offload._sim: the creator torch.distributed calls for the sim
// collective backend (torch_offload.sim.install() registers it). A separate
// translation unit, because the c10d and torch pybind headers are heavy.

#include <chrono>

#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <offload/sim_collectives.hpp>

namespace py = pybind11;

namespace offload::python {

/// Adds make_collective_backend(store, rank, size, timeout) to `m`: the
/// creator of torch.distributed.Backend.register_backend (non-extended API);
/// it returns a torch._C._distributed_c10d.Backend.
void bind_sim_collectives(py::module_& m) {
  m.attr("collective_backend_name") = offload::sim::collective_backend_name;
  m.def(
      "make_collective_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         const std::chrono::duration<double>& timeout) {
        return offload::sim::make_collective_backend(store, rank, size,
                                                     std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"));
}

}  // namespace offload::python
