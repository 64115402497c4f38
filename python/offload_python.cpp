// SPDX-License-Identifier: MIT
// torch_offload._C: the managers for Python training loops. Python's
// torch.autograd.graph.saved_tensors_hooks calls pack/unpack below; each
// pack asks the manager for a fresh SavedVariableHooks object (the same
// object the C++ engine hook would hand autograd), runs its pack in C++ and
// returns it to Python as an opaque handle; unpack hands it back. The only
// LibTorch-heavy translation unit of the Python package.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/core/impl/PyObjectSlot.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/csrc/utils/pybind.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>
#endif

#include <offload/block_plan.hpp>
#include <offload/offload.hpp>

#include "errors.hpp"

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------- hooks

// pack and unpack are what Python's autograd calls once per saved tensor, so
// they are C-level callables, not pybind11 functions: a PackHook object is
// called through the vectorcall protocol and unpack is a METH_O function
// (one argument, no tuple, no keyword parsing, no pybind11 dispatch).

/// What pack returns to Python for one saved tensor (opaque): the manager's
/// hooks object after its pack ran, or (no_offload, pass-through managers)
/// offload::make_plain_hooks(), which keeps the tensor itself and checks its
/// version at unpack as autograd would. (A tensor subclass offloaded through
/// its inner tensors is a Python object of torch_offload._manager instead,
/// with an unpack() method.)
struct Packed {
  PyObject ob_base;
  torch::autograd::SavedVariableHooks* hooks;
  bool on_cpu;  // a CPU tensor: never offloaded, so neither hook can wait for a copy
};

/// pack for one manager (or, without one, no_offload's plain pack). Holds a
/// reference to the Python object that owns the manager, and to the Python
/// function that packs a tensor subclass (see pack_call).
struct PackHook {
  PyObject ob_base;
  vectorcallfunc vectorcall;
  offload::AnyManager* manager;  // null: plain hooks
  PyObject* owner;
  PyObject* subclass_pack;  // null with plain hooks
};

// Static types, filled in by ready_hook_types().
PyTypeObject packed_type{};
PyTypeObject pack_hook_type{};

/// torch_offload.OffloadWarning (a UserWarning): every warning the library
/// raises on the Python path.
PyObject* offload_warning = nullptr;
/// torch.nn.Parameter, set when torch_offload._manager is imported.
PyObject* parameter_type = nullptr;

/// The stacklevel that makes a warning name the user's line: the innermost
/// Python frame outside the torch_offload and torch packages (a pack hook
/// runs under torch's own frames: `Tensor.__torch_function__`, a module's
/// forward), else the innermost outside torch_offload; 1 when the current
/// frame is already one of those. GIL held.
int user_stacklevel() {
  int level = 1;
  int outside_ours = 0;                      // the first frame outside torch_offload, where one was met
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  while (frame != nullptr) {
#if PY_VERSION_HEX >= 0x030B0000
    PyObject* globals = PyFrame_GetGlobals(frame);  // new
#else
    PyObject* globals = frame->f_globals;  // Python 3.9, 3.10: the struct is public
    Py_XINCREF(globals);
#endif
    PyObject* name = globals != nullptr ? PyDict_GetItemString(globals, "__name__") : nullptr;  // borrowed
    const char* text = name != nullptr && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : nullptr;
    if (text == nullptr) PyErr_Clear();
    const std::string_view module = text != nullptr ? text : "";
    Py_XDECREF(globals);
    const auto in = [&](std::string_view package) {
      return module == package || (module.starts_with(package) && module[package.size()] == '.');
    };
    if (!in("torch_offload")) {
      if (outside_ours == 0) outside_ours = level;
      if (!in("torch")) break;
    }
    ++level;
    PyFrameObject* back = PyFrame_GetBack(frame);  // new
    Py_DECREF(frame);
    frame = back;
  }
  if (frame == nullptr) return outside_ours > 0 ? outside_ours : 1;
  Py_DECREF(frame);
  return level;
}

/// Collects the c10 warnings (TORCH_WARN) raised on this thread while it
/// lives, in place of the thread's handler; raise() turns each into an
/// OffloadWarning once the GIL is held.
class Warnings final : public c10::WarningHandler {
 public:
  Warnings() : guard_(this) {}
  void process(const c10::Warning& warning) override { messages_.push_back(warning.msg()); }
  /// Raises the collected warnings as Python warnings (the GIL held): false,
  /// with the Python error set, when a filter turned one into an error.
  bool raise() {
    for (const auto& message : std::exchange(messages_, {})) {
      if (PyErr_WarnEx(offload_warning, message.c_str(), user_stacklevel()) < 0) return false;
    }
    return true;
  }

 private:
  c10::WarningUtils::WarningHandlerGuard guard_;
  std::vector<std::string> messages_;
};

/// Runs `body` with the GIL released (`release_gil`: it may wait for copies),
/// else with it held (a CPU tensor's hooks: nothing to wait for, and the two
/// GIL hand-overs cost more than the hook). Warnings it raises become
/// OffloadWarnings and a C++ exception becomes the Python error (errors.hpp)
/// once the GIL is back; the result is then false. Holding the GIL while the
/// manager takes its lock is what Packed's destructor already does.
template <class Body>
bool run_hook(Body&& body, bool release_gil) {
  std::exception_ptr error;
  Warnings warnings;
  PyThreadState* state = release_gil ? PyEval_SaveThread() : nullptr;
  try {
    body();
  } catch (...) {
    error = std::current_exception();
  }
  if (release_gil) PyEval_RestoreThread(state);
  if (!warnings.raise()) return false;
  if (!error) return true;
  offload::python::set_error(error);
  return false;
}

/// Runs `f()` (GIL held) and raises the warnings it gave as OffloadWarnings
/// (pybind11 turns a warning made an error into the Python exception).
template <class F>
auto with_warnings(F&& f) {
  Warnings warnings;
  auto raise = [&] {
    if (!warnings.raise()) throw py::error_already_set();
  };
  if constexpr (std::is_void_v<decltype(f())>) {
    f();
    raise();
  } else {
    auto result = f();
    raise();
    return result;
  }
}

/// Whether `object` is a parameter: an nn.Parameter (also a subclass one,
/// or a tensor subclass marked as one, as `nn.Parameter(dtensor)` makes).
bool is_parameter_object(PyObject* object) {
  if (Py_TYPE(object) == reinterpret_cast<PyTypeObject*>(parameter_type)) return true;
  if (reinterpret_cast<PyObject*>(Py_TYPE(object)) == THPVariableClass || parameter_type == nullptr) return false;
  const int is = PyObject_IsInstance(object, parameter_type);
  if (is < 0) PyErr_Clear();
  return is == 1;
}

/// Whether the plain tensor `t` is a view of a parameter: its base has a
/// Python object that is a parameter (`weight.t()`, which Linear saves), or
/// `t` is what `to_local()` gave for a DTensor parameter that requires grad,
/// or a view of it (`F.linear` saves `weight.to_local().t()`): a view of the
/// DTensor's local tensor (a leaf that does not require grad, with no link
/// back to its DTensor) whose history leads, through nodes of one input
/// each (the views), to DTensor's `_ToTorchTensor` Function over a leaf that
/// requires grad. (A frozen DTensor parameter's `to_local()` has no
/// history: `Manager.exclude` names it, docs/distributed.md.) GIL held.
bool is_view_of_parameter(const at::Tensor& t) {
  if (!t.is_view()) return false;
  const at::TensorBase& base = t._base();
  PyObject* object = base.unsafeGetTensorImpl()->pyobj_slot()->load_pyobj();
  if (object != nullptr && is_parameter_object(object)) return true;
  if (base.requires_grad() || !base.is_leaf()) return false;
  const torch::autograd::Node* fn = t.grad_fn().get();
  for (int depth = 0; depth < 8 && fn != nullptr && fn->num_inputs() == 1 && fn->next_edges().size() == 1; ++depth) {
    const torch::autograd::Node* next = fn->next_edge(0).function.get();
    if (dynamic_cast<const torch::autograd::AccumulateGrad*>(next) != nullptr) {
      return fn->name() == "_ToTorchTensorBackward";
    }
    fn = next;
  }
  return false;
}

/// Runs `pack()` (which returns hooks whose pack ran on `tensor`) with the
/// GIL released unless `tensor` is a CPU tensor (run_hook), and returns a new
/// Packed holding those hooks, or null with the Python error set.
template <class Pack>
PyObject* packed_by(const at::Tensor& tensor, Pack&& pack) {
  std::unique_ptr<torch::autograd::SavedVariableHooks> hooks;
  const bool on_cpu = tensor.is_cpu();
  if (!run_hook([&] { hooks = pack(); }, /*release_gil=*/!on_cpu)) return nullptr;
  auto* out = PyObject_New(Packed, &packed_type);
  if (!out) return nullptr;
  out->hooks = hooks.release();
  out->on_cpu = on_cpu;
  return reinterpret_cast<PyObject*>(out);
}

/// Packs `tensor` as one that stays where it is, counted by `manager` under
/// `why` (GIL held).
PyObject* pack_passing(offload::AnyManager& manager, const at::Tensor& tensor, offload::PassReason why) {
  return packed_by(tensor, [&] { return offload::interface_of(manager)->pack_passing(tensor, why); });
}

/// autograd's pack hook. A plain tensor (the fast path, all in C++) is a
/// parameter when it or its base is an nn.Parameter, and the manager decides
/// the rest; a tensor of any other Python type (a parameter subclass, a
/// tensor subclass such as DTensor) goes to the manager's Python
/// subclass_pack (torch_offload._manager), which offloads a traceable
/// wrapper subclass through its inner tensors (packing each with this hook).
PyObject* pack_call(PyObject* self, PyObject* const* args, std::size_t nargsf, PyObject* kwnames) {
  const auto nargs = PyVectorcall_NARGS(nargsf);
  if (nargs != 1 || (kwnames && PyTuple_GET_SIZE(kwnames) != 0)) {
    PyErr_Format(PyExc_TypeError, "pack() takes exactly one tensor argument (%zd given)",
                 nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0));
    return nullptr;
  }
  if (!THPVariable_Check(args[0])) {
    PyErr_Format(PyExc_TypeError, "pack(): expected a torch.Tensor, got %s", Py_TYPE(args[0])->tp_name);
    return nullptr;
  }
  auto* hook = reinterpret_cast<PackHook*>(self);
  offload::AnyManager* manager = hook->manager;
  const at::Tensor& tensor = THPVariable_Unpack(args[0]);
  if (manager) {
    const bool plain = reinterpret_cast<PyObject*>(Py_TYPE(args[0])) == THPVariableClass;
    if (!plain && !(Py_TYPE(args[0]) == reinterpret_cast<PyTypeObject*>(parameter_type))) {
      if (!hook->subclass_pack) return pack_passing(*manager, tensor, offload::PassReason::subclass);
      return PyObject_CallFunctionObjArgs(hook->subclass_pack, self, args[0], nullptr);
    }
    if (!plain || is_view_of_parameter(tensor)) return pack_passing(*manager, tensor, offload::PassReason::parameter);
  }
  return packed_by(tensor, [&] {
    auto hooks = manager ? manager->make_hooks() : nullptr;
    if (!hooks) hooks = offload::make_plain_hooks();
    hooks->call_pack_hook(tensor);
    return hooks;
  });
}

/// autograd's unpack hook: a Packed, or a Python handle with unpack().
PyObject* unpack_call(PyObject* /*module*/, PyObject* handle) {
  if (Py_TYPE(handle) != &packed_type) {
    PyObject* method = PyObject_GetAttrString(handle, "unpack");
    if (!method) {
      PyErr_Format(PyExc_TypeError, "unpack(): expected what pack returned, got %s", Py_TYPE(handle)->tp_name);
      return nullptr;
    }
    PyObject* out = PyObject_CallNoArgs(method);
    Py_DECREF(method);
    return out;
  }
  const auto* packed = reinterpret_cast<Packed*>(handle);
  auto* hooks = packed->hooks;
  at::Tensor tensor;
  if (!run_hook([&] { tensor = hooks->call_unpack_hook(); }, /*release_gil=*/!packed->on_cpu)) return nullptr;
  return THPVariable_Wrap(std::move(tensor));
}

PyMethodDef unpack_def = {"unpack", unpack_call, METH_O,
                          "unpack(handle) -> Tensor: the saved tensor back (autograd's unpack hook)."};

void packed_dealloc(PyObject* self) {
  delete reinterpret_cast<Packed*>(self)->hooks;
  PyObject_Free(self);
}

void pack_hook_dealloc(PyObject* self) {
  Py_XDECREF(reinterpret_cast<PackHook*>(self)->owner);
  Py_XDECREF(reinterpret_cast<PackHook*>(self)->subclass_pack);
  PyObject_Free(self);
}

/// A new pack callable for `manager`, kept alive by `owner`, with
/// `subclass_pack(pack, tensor)` for tensors of other Python types than
/// torch.Tensor and nn.Parameter (null, None and None: plain hooks).
py::object make_pack_hook(offload::AnyManager* manager, py::handle owner, py::handle subclass_pack) {
  auto* hook = PyObject_New(PackHook, &pack_hook_type);
  if (!hook) throw py::error_already_set();
  hook->vectorcall = pack_call;
  hook->manager = manager;
  hook->owner = owner.inc_ref().ptr();
  hook->subclass_pack = subclass_pack.is_none() ? nullptr : subclass_pack.inc_ref().ptr();
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(hook));
}

void ready_hook_types(py::module_& m) {
  for (auto* type : {&packed_type, &pack_hook_type}) Py_SET_REFCNT(reinterpret_cast<PyObject*>(type), 1);  // static
  packed_type.tp_name = "torch_offload._C.Packed";
  pack_hook_type.tp_name = "torch_offload._C.PackHook";
  packed_type.tp_basicsize = sizeof(Packed);
  packed_type.tp_flags = Py_TPFLAGS_DEFAULT;
  packed_type.tp_doc = "One saved tensor held by torch_offload (opaque).";
  packed_type.tp_dealloc = packed_dealloc;
  pack_hook_type.tp_basicsize = sizeof(PackHook);
  pack_hook_type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  pack_hook_type.tp_doc = "pack(tensor) -> Packed: autograd's pack hook for one manager.";
  pack_hook_type.tp_dealloc = pack_hook_dealloc;
  pack_hook_type.tp_vectorcall_offset = offsetof(PackHook, vectorcall);
  pack_hook_type.tp_call = PyVectorcall_Call;
  if (PyType_Ready(&packed_type) < 0 || PyType_Ready(&pack_hook_type) < 0) throw py::error_already_set();
  m.attr("Packed") = py::handle(reinterpret_cast<PyObject*>(&packed_type));
  m.attr("PackHook") = py::handle(reinterpret_cast<PyObject*>(&pack_hook_type));
  m.attr("unpack") =
      py::reinterpret_steal<py::object>(PyCFunction_NewEx(&unpack_def, nullptr, m.attr("__name__").ptr()));
  m.attr("plain_pack") = make_pack_hook(nullptr, py::none(), py::none());
}

// ---------------------------------------------------------------- choosing

// "'a', 'b', 'c'": the names of a policy list, for error messages.
template <class Policies>
std::string quoted_names(Policies policies) {
  std::string out;
  for (const auto& name : offload::policy_names(policies)) out += (out.empty() ? "'" : ", '") + name + "'";
  return out;
}

std::string accepted_devices() {
  std::string out = "'auto'";
  for (const auto& name : offload::compiled_device_policies()) {
    if (name != "generic") out += ", '" + name + "'";
  }
  return out + " or the name of a registered PrivateUse1 backend";
}

template <class Storage, class Sync>
offload::AnyManager build_for(const std::string& device, const offload::Options& options, offload::Fallback fallback) {
  if (device == "auto") {
    const auto detected = offload::detect_accelerator();
    if (!detected.type) {
      const std::string why = "no accelerator was detected (" + detected.reason + ")";
      if (fallback == offload::Fallback::pass_through) return offload::make_pass_through_manager(options, why);
      TORCH_CHECK(false, "torch_offload.Manager: device='auto': ", why,
                  "; pass device='sim' after torch_offload.sim.install(), or fallback='pass_through' to run "
                  "without offloading");
    }
    return offload::make_manager_unhooked<Storage, Sync, offload::sync::Blocking>(options, offload::builtin_devices,
                                                                                  detected, fallback);
  }
  // "generic" is the policy for a PrivateUse1 backend of another name, not a device name.
  auto named = device == "generic" ? offload::NamedManager{}
                                   : offload::make_manager_named<Storage, Sync, offload::sync::Blocking>(
                                         device, options, offload::builtin_devices);
  if (named.manager) return *std::move(named.manager);
  TORCH_CHECK_VALUE(named.outcome != offload::NamedDevice::unknown, "torch_offload.Manager: device must be one of ",
                    accepted_devices(), ", got '", device, "'");
  std::string why = "device '" + device + "' is not available in this process" +
                    (device == "sim" ? " (call torch_offload.sim.install() first)" : "");
  if (fallback == offload::Fallback::pass_through) return offload::make_pass_through_manager(options, why);
  TORCH_CHECK(false, "torch_offload.Manager: ", why, "; pass fallback='pass_through' to run without offloading");
}

offload::AnyManager make(const std::string& device, const std::string& storage, const std::string& sync,
                         const offload::Options& options, const std::string& fallback) {
  // Every argument is checked before anything is detected or built.
  options.validate();
  const auto named = [](auto policies, const std::string& name) {
    return offload::visit_policy_named(policies, name, [](auto) {});
  };
  TORCH_CHECK_VALUE(named(offload::builtin_storages, storage), "torch_offload.Manager: storage must be one of ",
                    quoted_names(offload::builtin_storages), ", got '", storage, "'");
  TORCH_CHECK_VALUE(named(offload::builtin_syncs, sync), "torch_offload.Manager: sync must be one of ",
                    quoted_names(offload::builtin_syncs), ", got '", sync, "'");
  TORCH_CHECK_VALUE(fallback == "error" || fallback == "pass_through",
                    "torch_offload.Manager: fallback must be one of 'error', 'pass_through', got '", fallback, "'");
  const auto fb = fallback == "error" ? offload::Fallback::error : offload::Fallback::pass_through;
  std::optional<offload::AnyManager> out;
  offload::visit_policy_named(offload::builtin_storages, storage, [&](auto storage_type) {
    offload::visit_policy_named(offload::builtin_syncs, sync, [&](auto sync_type) {
      using Storage = typename decltype(storage_type)::type;
      using Sync = typename decltype(sync_type)::type;
      out.emplace(build_for<Storage, Sync>(device, options, fb));
    });
  });
  return *std::move(out);
}

// ---------------------------------------------------------------- stats

/// Every Stats counter by name, in declaration order (offload::stat_fields).
std::vector<std::pair<std::string_view, std::int64_t>> stat_values(const offload::Stats& s) {
  std::vector<std::pair<std::string_view, std::int64_t>> out;
  out.reserve(offload::stat_fields.size());
  for (const auto& field : offload::stat_fields) out.emplace_back(field.name, s.*field.member);
  return out;
}

using ManagerClass = py::class_<offload::AnyManager>;

// The manager: construction, its hooks, its scopes, stats and options.
void bind_manager(ManagerClass& cls) {
  cls
      // options: every key of offload::option_fields (an int each); the
      // Python Manager passes them all.
      .def(
          py::init([](const std::string& device, const std::string& storage, const std::string& sync,
                      const std::map<std::string, std::int64_t>& values, bool pin_memory, const std::string& fallback) {
            offload::Options options;
            for (const auto& [key, value] : values) {
              const auto field = std::find_if(offload::option_fields.begin(), offload::option_fields.end(),
                                              [&](const auto& f) { return f.name == key; });
              TORCH_CHECK_VALUE(field != offload::option_fields.end(), "torch_offload.Manager: unknown option '", key,
                                "'");
              options.*field->member = value;
            }
            options.pin_memory = pin_memory;
            return with_warnings([&] { return make(device, storage, sync, options, fallback); });
          }),
          py::arg("device"), py::arg("storage"), py::arg("sync"), py::arg("options"), py::arg("pin_memory"),
          py::arg("fallback"))
      // The pack hook of this manager (a PackHook: keeps the manager alive);
      // subclass_pack(pack, tensor) packs tensors of other Python types.
      .def(
          "pack_hook",
          [](py::object self, py::object subclass_pack) {
            return make_pack_hook(&self.cast<offload::AnyManager&>(), self, subclass_pack);
          },
          py::arg("subclass_pack"))
      // Packs a tensor that stays where it is, counted under `why`
      // ("parameter", "subclass" or "excluded"): a Packed.
      .def(
          "pack_passing",
          [](offload::AnyManager& self, const at::Tensor& tensor, const std::string& why) {
            const auto reason = why == "parameter"  ? offload::PassReason::parameter
                                : why == "subclass" ? offload::PassReason::subclass
                                                    : offload::PassReason::excluded;
            TORCH_CHECK_VALUE(why == "parameter" || why == "subclass" || why == "excluded",
                              "pack_passing: why must be one of 'parameter', 'subclass', 'excluded', got '", why, "'");
            PyObject* out = pack_passing(self, tensor, reason);
            if (!out) throw py::error_already_set();
            return py::reinterpret_steal<py::object>(out);
          },
          py::arg("tensor"), py::arg("why"))
      // What the manager had seen when a `with` opened (for its warnings at exit).
      .def("on_scope_enter",
           [](offload::AnyManager& self) {
             return with_warnings([&] { return offload::interface_of(self)->on_scope_enter(); });
           })
      // Streamed settles its forward stash here: it may wait for copies (the
      // GIL is released meanwhile).
      .def(
          "on_scope_exit",
          [](offload::AnyManager& self, const offload::ScopeMark& opened, bool in_order) {
            with_warnings([&] {
              const py::gil_scoped_release released;
              offload::interface_of(self)->on_scope_exit(opened, in_order);
            });
          },
          py::arg("opened"), py::arg("in_order"))
      .def("stats", [](const offload::AnyManager& self) { return stat_values(self.stats()); })
      .def("reset_stats", &offload::AnyManager::reset_stats)
      .def("exclude", [](offload::AnyManager& self, const std::vector<at::Tensor>& tensors) { self.exclude(tensors); })
      .def("describe", &offload::AnyManager::describe)
      .def("options", [](const offload::AnyManager& self) {
        const auto& o = self.options();
        py::dict out;
        for (const auto& field : offload::option_fields) out[py::str(field.name)] = o.*field.member;
        out["pin_memory"] = o.pin_memory;
        return out;
      });
}

// The automatic plan's calls (torch_offload.PlannedCheckpoint), on the manager.
void bind_plan(ManagerClass& cls) {
  cls
      // The automatic plan (torch_offload.PlannedCheckpoint): the next
      // block's turn, (index, choice, measure, probe_link), or None when the
      // manager has no target.
      .def(
          "plan_block",
          [](offload::AnyManager& self, std::int64_t input_bytes, int device_index) -> py::object {
            const auto planner = offload::interface_of(self)->block_planner();
            if (!planner) return py::none();
            offload::BlockPlanner::Turn turn;
            {
              // The guard may end the copies in flight (the manager's lock).
              const py::gil_scoped_release released;
              turn = planner->next_block(input_bytes, device_index);
            }
            const char* choice = turn.choice == offload::BlockChoice::keep                   ? "keep"
                                 : turn.choice == offload::BlockChoice::offload              ? "offload"
                                 : turn.choice == offload::BlockChoice::recompute_input_kept ? "recompute_input_kept"
                                                                                             : "recompute";
            return py::make_tuple(turn.index, choice, turn.measure, turn.probe_link);
          },
          py::arg("input_bytes"), py::arg("device_index") = -1)
      // The block begun by the last plan_block returned (or raised).
      .def("plan_block_done",
           [](offload::AnyManager& self) {
             if (const auto planner = offload::interface_of(self)->block_planner()) planner->block_done();
           })
      .def(
          "plan_measured",
          [](offload::AnyManager& self, std::int32_t index, std::int64_t forward_ns, std::int64_t saved_bytes,
             std::int64_t saved_storages, std::int64_t input_bytes, std::int64_t largest_storage) {
            if (const auto planner = offload::interface_of(self)->block_planner()) {
              offload::BlockCost cost{forward_ns, saved_bytes, saved_storages, input_bytes};
              cost.largest_storage = largest_storage;
              planner->measured(index, cost);
            }
          },
          py::arg("index"), py::arg("forward_ns"), py::arg("saved_bytes"), py::arg("saved_storages"),
          py::arg("input_bytes"), py::arg("largest_storage") = -1)
      .def(
          "plan_recomputing",
          [](offload::AnyManager& self, std::int32_t index, int device_index) {
            if (const auto planner = offload::interface_of(self)->block_planner()) {
              planner->recomputing(index, device_index);
            }
          },
          py::arg("index"), py::arg("device_index"))
      .def(
          "plan_recomputed",
          [](offload::AnyManager& self, std::int32_t index, std::int64_t ns) {
            if (const auto planner = offload::interface_of(self)->block_planner()) planner->recomputed(index, ns);
          },
          py::arg("index"), py::arg("ns"))
      .def(
          "plan_link",
          [](offload::AnyManager& self, std::int64_t bytes, std::int64_t ns, std::int64_t small_bytes,
             std::int64_t small_ns) {
            if (const auto planner = offload::interface_of(self)->block_planner()) {
              planner->link_measured(bytes, ns, small_bytes, small_ns);
            }
          },
          py::arg("bytes"), py::arg("ns"), py::arg("small_bytes"), py::arg("small_ns"))
      .def("plan_summary", [](offload::AnyManager& self) {
        const auto planner = offload::interface_of(self)->block_planner();
        return planner ? planner->summary() : std::string();
      });
}

// The tables the Python package reads: options, stats, compiled devices.
void bind_tables(py::module_& m) {
  m.def("option_fields", [] {
    std::vector<std::tuple<std::string_view, std::int64_t, std::int64_t, std::string_view>>
        out;  // (name, lo, hi, unit)
    for (const auto& field : offload::option_fields)
      out.emplace_back(field.name, field.range.lo, field.range.hi, field.unit);
    return out;
  });
  m.def("stat_fields", [] {
    std::vector<std::pair<std::string_view, std::string_view>> out;  // (name, what it counts)
    for (const auto& field : offload::stat_fields) out.emplace_back(field.name, field.doc);
    return out;
  });
  m.def("passed_through_fields", [] {
    // The fields Stats::passed_through() adds up, found by asking it.
    std::vector<std::string_view> out;
    for (const auto& field : offload::stat_fields) {
      offload::Stats one;
      one.*field.member = 1;
      if (one.passed_through() == 1) out.push_back(field.name);
    }
    return out;
  });
  m.def("user_stacklevel", &user_stacklevel,
        "The warnings.warn stacklevel, from the calling frame, that names the user's line: the innermost frame "
        "outside the torch_offload and torch packages (else outside torch_offload).");
  m.def("compiled_device_policies", [] { return offload::compiled_device_policies(); });
}

// storage::PinnedPool's statistics and trim, by device name.
void bind_pool(py::module_& m) {
  m.def("pool_stats", [](const std::string& device) {
    const auto s = offload::storage::PinnedPool::stats(c10::Device(device));
    py::dict out;
    out["reserved_bytes"] = s.reserved_bytes;
    out["peak_reserved_bytes"] = s.peak_reserved_bytes;
    out["in_use_bytes"] = s.in_use_bytes;
    out["peak_in_use_bytes"] = s.peak_in_use_bytes;
    out["slabs"] = s.slabs;
    out["slab_allocations"] = s.slab_allocations;
    out["pageable_fallbacks"] = s.pageable_fallbacks;
    out["numa_node"] = s.numa_node;
    return out;
  });
  m.def("pool_trim", [](const std::string& device) { offload::storage::PinnedPool::trim(c10::Device(device)); });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_offload's C++ core (use the torch_offload package, not this module)";
  offload::python::register_error_translator();

  ready_hook_types(m);
  offload_warning = PyErr_NewExceptionWithDoc(
      "torch_offload.OffloadWarning",
      "A warning torch_offload raises (a UserWarning): filter it with warnings.filterwarnings(..., "
      "category=torch_offload.OffloadWarning).",
      PyExc_UserWarning, nullptr);
  if (!offload_warning) throw py::error_already_set();
  m.attr("OffloadWarning") = py::handle(offload_warning);
  // torch.nn.Parameter: the pack hook's parameters by identity.
  parameter_type = py::object(py::module_::import("torch.nn").attr("Parameter")).release().ptr();

  py::class_<offload::ScopeMark>(m, "_ScopeMark");
  ManagerClass manager(m, "Manager");
  bind_manager(manager);
  bind_plan(manager);
  bind_tables(m);
  bind_pool(m);
}
