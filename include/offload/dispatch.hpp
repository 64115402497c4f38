// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The runtime dispatcher: offload::make_manager<Storage, Sync, FallbackSync>
/// (options, devices) asks LibTorch which accelerator this process has and
/// returns an AnyManager wrapping the Manager<Device, Storage, Sync> for
/// it, chosen from a Boost.Hana tuple of device policies. Names no concrete
/// policy: the built-in list and the defaults (PinnedHost, Blocking) are in
/// <offload/builtin.hpp>. Hana stays at this edge: AnyManager and Manager
/// never show a hana type. docs/dispatch.md explains the choice.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/hana/all_of.hpp>
#include <boost/hana/core/is_a.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include <ATen/DeviceAccelerator.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <offload/any_manager.hpp>
#include <offload/concepts.hpp>
#include <offload/detail/checks.hpp>
#include <offload/detail/null_manager.hpp>
#include <offload/manager.hpp>
#include <offload/options.hpp>
#include <offload/scope.hpp>
#include <offload/stats.hpp>

namespace offload {

/// What make_manager does when it finds no device policy to use.
enum class Fallback {
  /// Throw c10::Error (the default; nothing silent).
  error,
  /// Return a pass-through manager (make_pass_through_manager) that
  /// offloads nothing and says so in describe() and stats().
  pass_through,
};

/// The accelerator LibTorch reports for this process.
struct DetectedAccelerator {
  /// The device type, or nullopt when no accelerator with a device is
  /// present.
  std::optional<c10::DeviceType> type;
  /// Lower-case name: the PrivateUse1 backend's registered name ("npu",
  /// "sim", ...) or the device type's name ("cuda", "xpu"); may be set
  /// when `type` is not (a backend LibTorch was built for but whose device
  /// count is 0).
  std::string name;
  /// Why `type` is nullopt; empty otherwise.
  std::string reason;
};

/// Asks LibTorch which accelerator is present: at::getAccelerator(false),
/// c10::get_privateuse1_backend() for PrivateUse1, and the device guard's
/// device count (a CUDA-enabled LibTorch reports CUDA even on a machine
/// without a GPU). Thread-safe. Throws c10::Error only when LibTorch itself
/// does (e.g. two accelerators that exclude each other).
inline DetectedAccelerator detect_accelerator() {
  DetectedAccelerator out;
  const auto type = at::getAccelerator(/*checked=*/false);
  if (!type) {
    out.reason = "LibTorch reports no accelerator (at::getAccelerator)";
    return out;
  }
  out.name = *type == c10::DeviceType::PrivateUse1 ? c10::get_privateuse1_backend(/*lower_case=*/true)
                                                   : c10::DeviceTypeName(*type, /*lower_case=*/true);
  const c10::DeviceIndex count =
      c10::impl::hasDeviceGuardImpl(*type) ? c10::impl::getDeviceGuardImpl(*type)->deviceCount() : 0;
  if (count <= 0) {
    out.reason = "LibTorch supports '" + out.name + "' but sees no " + out.name + " device";
    return out;
  }
  out.type = type;
  return out;
}

namespace detail {

/// Whether this program can use device policy P: P::linked() when P
/// satisfies requirement::linked (a policy whose backend is an optional
/// library, like device::Sim), else true.
template <class P>
bool linked() {
  if constexpr (requirement::linked<P>) {
    return P::linked();
  } else {
    return true;
  }
}

/// Names of the policies in a device list, in order; with `only_linked`,
/// only those this program can use (see linked()).
template <class Devices>
std::vector<std::string> device_names(Devices devices, bool only_linked = false) {
  std::vector<std::string> names;
  boost::hana::for_each(devices, [&](auto t) {
    using P = typename decltype(t)::type;
    if (!only_linked || linked<P>()) names.emplace_back(P::name);
  });
  return names;
}

/// What the linked policies of a list say about making a device of theirs
/// when none is present (P::when_absent, e.g. "offload::sim::install() makes
/// a sim device"), joined with "; ".
template <class Devices>
std::string absent_hints(Devices devices) {
  std::string out;
  boost::hana::for_each(devices, [&](auto t) {
    using P = typename decltype(t)::type;
    if constexpr (requirement::when_absent<P>) {
      if (linked<P>()) out += (out.empty() ? "" : "; ") + std::string(P::when_absent);
    }
  });
  return out;
}

inline std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

/// One entry of a device list: instantiating it checks the entry (the
/// compiler names P in the instantiation note under the message).
template <class P>
struct DeviceListEntry {
  static constexpr bool ok = check_device_policy<P>() && check_device_options<P>();
};

template <class Devices>
constexpr bool check_device_list() {
  static_assert(boost::hana::all_of(Devices{}, [](auto t) { return boost::hana::is_a<boost::hana::type_tag>(t); }),
                "offload::make_manager: the device list must be a hana tuple of hana::type_c<Policy> "
                "(e.g. boost::hana::prepend(offload::builtin_devices, boost::hana::type_c<MyDevice>))");
  static_assert(decltype(boost::hana::length(Devices{}))::value > 0,
                "offload::make_manager: the device list is empty; start from offload::builtin_devices");
  return boost::hana::unpack(Devices{},
                             [](auto... t) { return (DeviceListEntry<typename decltype(t)::type>::ok && ...); });
}

/// Whether P says, at run time, that its backend has streams and events:
/// P::runtime_has_events() when P satisfies requirement::runtime_has_events,
/// else its compile-time facts.
template <class P>
bool runtime_has_events() {
  if constexpr (requirement::runtime_has_events<P>) {
    return P::runtime_has_events();
  } else {
    return P::has_streams && P::has_events;
  }
}

/// Forwards every ManagerInterface member to the chosen manager; adds what the
/// dispatcher decided to describe() and, after a fallback to blocking
/// copies, counts every copy in Stats::blocking_fallbacks. (A member added
/// to ManagerInterface must be forwarded here too.)
class DispatchedManager final : public ManagerInterface {
 public:
  DispatchedManager(std::shared_ptr<ManagerInterface> inner, std::string note, bool blocking_fallback)
      : inner_(std::move(inner)), note_(std::move(note)), blocking_fallback_(blocking_fallback) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override { return inner_->make_hooks(); }
  std::unique_ptr<torch::autograd::SavedVariableHooks> pack_passing(const at::Tensor& tensor, PassReason why) override {
    return inner_->pack_passing(tensor, why);
  }
  std::string describe() const override { return inner_->describe() + " [" + note_ + "]"; }
  Stats stats() const override {
    auto s = inner_->stats();
    if (blocking_fallback_) s.blocking_fallbacks += s.storages_offloaded + s.tensors_reloaded;
    return s;
  }
  void reset_stats() override { inner_->reset_stats(); }
  void exclude(at::TensorList tensors) override { inner_->exclude(tensors); }
  const Options& options() const noexcept override { return inner_->options(); }
  ScopeMark on_scope_enter() noexcept override { return inner_->on_scope_enter(); }
  void on_scope_exit(const ScopeMark& opened, bool in_order) noexcept override {
    inner_->on_scope_exit(opened, in_order);
  }
  std::shared_ptr<BlockPlanner> block_planner() override { return inner_->block_planner(); }

 private:
  std::shared_ptr<ManagerInterface> inner_;
  std::string note_;
  bool blocking_fallback_;
};

/// Saved tensors stay where they are: make_hooks() counts each and returns
/// no hooks, so autograd saves it exactly as without any scope.
class PassThroughManager final : public ManagerInterface {
 public:
  PassThroughManager(const Options& options, std::string why) : options_(options), why_(std::move(why)) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    seen_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  std::unique_ptr<torch::autograd::SavedVariableHooks> pack_passing(const at::Tensor& tensor, PassReason why) override {
    seen_.fetch_add(1, std::memory_order_relaxed);
    return ManagerInterface::pack_passing(tensor, why);
  }
  std::string describe() const override { return "PassThrough<offloads nothing: " + why_ + ">"; }
  Stats stats() const override {
    Stats s;
    s.tensors_seen = seen_.load(std::memory_order_relaxed);
    s.passed_other_device = s.tensors_seen;  // no device is offloaded: every tensor passes through
    return s;
  }
  void reset_stats() override { seen_.store(0, std::memory_order_relaxed); }
  void exclude(at::TensorList /*tensors*/) override {}
  const Options& options() const noexcept override { return options_; }

 private:
  Options options_;
  std::string why_;
  std::atomic<std::int64_t> seen_{0};
};

template <class Device, class Storage, class Sync>
AnyManager wrap(const Options& options, std::string note, bool blocking_fallback) {
  AnyManager manager = Manager<Device, Storage, Sync>(options);
  if (note.empty()) return manager;
  return any_manager_of(std::make_shared<DispatchedManager>(interface_of(manager), std::move(note), blocking_fallback));
}

/// Builds the manager for the device policy the dispatcher chose: Sync, or
/// FallbackSync where Sync needs events Device does not have.
template <class Device, class Storage, class Sync, class FallbackSync>
AnyManager build(const Options& options, const DetectedAccelerator& detected) {
  std::string note;
  if (Device::name != detected.name) {
    note = (Device::device_type == c10::DeviceType::PrivateUse1 ? "PrivateUse1 backend '" : "accelerator '") +
           detected.name + "'";
  }
  auto fallback_note = [&note](std::string why) {
    return note + (note.empty() ? "" : "; ") + std::string(Sync::name) + " needs events: " + why + ", so copies are " +
           std::string(FallbackSync::name);
  };
  if constexpr (!check_sync_members<Sync, Device>()) {
    return any_manager_of(nullptr);  // not reached: the check stopped the build
  } else if constexpr (composable<Device, Storage, Sync>) {
    if constexpr (Sync::needs_events) {
      if (!runtime_has_events<Device>()) {
        return wrap<Device, Storage, FallbackSync>(
            options, fallback_note(std::string(Device::name) + " has no streams/events at run time"), true);
      }
    }
    return wrap<Device, Storage, Sync>(options, std::move(note), false);
  } else if constexpr (check_policies<Device, Storage, FallbackSync>()) {
    // Sync needs events; this policy has none at compile time.
    return wrap<Device, Storage, FallbackSync>(
        options, fallback_note(std::string(Device::name) + " has no streams/events"), true);
  } else {
    return any_manager_of(nullptr);  // not reached: the check stopped the build
  }
}

}  // namespace detail

/// The sync policy the dispatcher uses for Device when Sync is asked for:
/// Sync when the three compose, FallbackSync when Sync needs events the
/// device policy does not have at compile time. (At run time a policy
/// whose runtime_has_events() is false also gets FallbackSync.)
template <class Device, class Storage, class Sync, class FallbackSync>
using dispatched_sync_t = std::conditional_t<composable<Device, Storage, Sync>, Sync, FallbackSync>;

/// The names of the device policies in `devices`, in the order the
/// dispatcher tries them, e.g. {"cuda", "xpu", "npu", "neuron", "sim",
/// "generic"}. Thread-safe.
template <class Devices>
std::vector<std::string> device_policy_names(Devices devices) {
  [[maybe_unused]] constexpr bool checked = detail::check_device_list<Devices>();  // reports its own failure
  return detail::device_names(devices);
}

/// A manager that offloads nothing, for code that must run anywhere: every
/// saved tensor stays where autograd put it (no hooks are installed for
/// it), stats() counts each one as passed through (passed_other_device)
/// and describe() reads "PassThrough<offloads nothing: WHY>".
/// Validates `options` (c10::ValueError naming the field) first.
/// Thread-safe.
inline AnyManager make_pass_through_manager(const Options& options = {}, std::string why = "pass-through requested") {
  options.validate();
  return any_manager_of(std::make_shared<detail::PassThroughManager>(options, std::move(why)));
}

/// make_manager_unhooked (below) for an accelerator the caller detected
/// already (`detected`, from detect_accelerator()), for callers that look
/// at it first (the Python binding words its own error when none was
/// detected): nothing is detected twice. Validates `options` first.
/// Thread-safe.
template <class Storage, class Sync, class FallbackSync, class Devices>
AnyManager make_manager_unhooked(const Options& options, Devices devices, const DetectedAccelerator& detected,
                                 Fallback fallback = Fallback::error) {
  options.validate();
  const auto have = [&] {
    return "; this program has: " + detail::join(detail::device_names(devices, /*only_linked=*/true)) + ". ";
  };
  if (!detected.type) {
    std::string why = "no accelerator was detected (" + detected.reason + ")";
    if (fallback == Fallback::pass_through) return make_pass_through_manager(options, std::move(why));
    const auto hints = detail::absent_hints(devices);
    C10_THROW_ERROR(Error, "offload::make_manager: " + why + have() + (hints.empty() ? "" : hints + ". ") +
                               "Pass offload::Fallback::pass_through to run without offloading");
  }
  std::optional<AnyManager> chosen;
  boost::hana::for_each(devices, [&](auto t) {
    using P = typename decltype(t)::type;
    if (chosen || P::device_type != *detected.type || !P::available()) return;
    chosen.emplace(detail::build<P, Storage, Sync, FallbackSync>(options, detected));
  });
  if (chosen) return *std::move(chosen);
  std::string why = "no device policy for '" + detected.name + "'";
  if (fallback == Fallback::pass_through) return make_pass_through_manager(options, std::move(why));
  C10_THROW_ERROR(Error, "offload::make_manager: " + why + have() +
                             "Add one with boost::hana::prepend(offload::builtin_devices, "
                             "boost::hana::type_c<YourPolicy>) (docs/dispatch.md), or pass "
                             "offload::Fallback::pass_through to run without offloading");
}

/// make_manager's work without install_hooks(), for hosts whose own
/// autograd engine asks the manager for hooks (Python's
/// saved_tensors_hooks, where install_hooks() refuses): the same choice and
/// errors as make_manager. Thread-safe.
template <class Storage, class Sync, class FallbackSync, class Devices>
AnyManager make_manager_unhooked(const Options& options, Devices devices, Fallback fallback = Fallback::error) {
  options.validate();  // before anything is detected
  return make_manager_unhooked<Storage, Sync, FallbackSync>(options, devices, detect_accelerator(), fallback);
}

/// Whether make_manager_named() made a manager, and if not why.
enum class NamedDevice {
  found,        ///< a manager was made
  unknown,      ///< no policy of the list has that name, nor the registered PrivateUse1 backend
  unavailable,  ///< the policy of that name is not available() in this process
};

/// What make_manager_named() returns: the manager (outcome
/// NamedDevice::found) or why there is none (`manager` empty).
struct NamedManager {
  std::optional<AnyManager> manager;
  NamedDevice outcome = NamedDevice::unknown;
};

/// The manager for the device named `device`, without install_hooks() (see
/// make_manager_unhooked): when `device` is the name of the registered
/// PrivateUse1 backend, the policy the dispatcher picks for that backend
/// (device::Sim for "sim" once offload::sim::install() ran, the generic
/// policy for an unnamed backend); otherwise the policy of `devices` whose
/// name it is (e.g. "cuda"), built for its device type. Sync falls back to
/// FallbackSync as make_manager's does. The result holds no manager and
/// says why when there is no such policy or it is not available here.
/// Validates `options` first. Thread-safe.
template <class Storage, class Sync, class FallbackSync, class Devices>
NamedManager make_manager_named(std::string_view device, const Options& options, Devices devices) {
  options.validate();
  NamedManager out;
  auto& chosen = out.manager;
  auto& outcome = out.outcome;
  const bool backend =
      c10::is_privateuse1_backend_registered() && c10::get_privateuse1_backend(/*lower_case=*/true) == device;
  boost::hana::for_each(devices, [&](auto t) {
    using P = typename decltype(t)::type;
    if (chosen || (!backend && outcome == NamedDevice::unavailable)) return;  // a backend's: try its next policy
    const bool named = backend ? P::device_type == c10::DeviceType::PrivateUse1 : P::name == device;
    if (!named) return;
    if (!P::available()) {
      outcome = NamedDevice::unavailable;
      return;
    }
    outcome = NamedDevice::found;
    chosen.emplace(detail::build<P, Storage, Sync, FallbackSync>(
        options, DetectedAccelerator{P::device_type, std::string(device), {}}));
  });
  return out;
}

/// Detects the accelerator (detect_accelerator()) and returns a manager
/// for it: the first policy P in `devices` with P::device_type equal to
/// the detected type and P::available() true, as
/// Manager<P, Storage, Sync>, or Manager<P, Storage, FallbackSync> when
/// Sync needs events and P has none (at compile time, or at run time per
/// P::runtime_has_events()); then describe() says so and
/// Stats::blocking_fallbacks counts the copies made that way. describe()
/// also names the backend when the policy's name differs from it
/// (device::Generic for PrivateUse1 backend 'acme'). Never picks a policy
/// of another device type: there is no fallback to CUDA.
///
/// <offload/builtin.hpp> adds the usual form,
/// make_manager<Storage = storage::PinnedHost, Sync = sync::Blocking>(options,
/// devices = builtin_devices, fallback), with sync::Blocking as FallbackSync.
///
/// - options: validated first (c10::ValueError naming the field, value and
///   accepted range); nothing is detected or built before.
/// - devices: a hana tuple of hana::type_c<Policy>; each must satisfy
///   offload::device_policy (one static_assert naming the missing member).
/// - fallback: with Fallback::error (default), throws c10::Error when no
///   accelerator is detected ("no accelerator was detected ...; this
///   program has: cuda, xpu, ...", listing the policies whose backend this
///   program links, and how to make a device where one can, e.g.
///   "offload::sim::install() makes a sim device") or when none of
///   `devices` matches it ("no device policy for 'xla'; this program has:
///   ..."); with Fallback::pass_through, returns make_pass_through_manager()
///   with that reason instead.
///
/// Also calls install_hooks() (so the autograd engine that serves Scopes is
/// the default one before the manager's first backward pass; it throws
/// c10::Error in a process that loaded libtorch_python).
///
/// Thread-safe (the detection and the runtime probes are).
template <class Storage, class Sync, class FallbackSync, class Devices>
AnyManager make_manager(const Options& options, Devices devices, Fallback fallback = Fallback::error) {
  // Each check reports its own failure (one static_assert naming the member).
  constexpr bool checked = detail::check_device_list<Devices>() && detail::check_storage_policy<Storage>() &&
                           detail::check_storage_default<Storage>();
  if constexpr (!checked) {
    return any_manager_of(nullptr);  // not reached: the build stopped
  } else {
    options.validate();
    install_hooks();
    return make_manager_unhooked<Storage, Sync, FallbackSync>(options, devices, fallback);
  }
}

}  // namespace offload
