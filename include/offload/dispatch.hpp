// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The runtime dispatcher: offload::make_manager<Storage, Sync>() asks
/// LibTorch which accelerator this process has and returns an AnyManager
/// wrapping the Manager<Device, Storage, Sync> for it, chosen from a
/// Boost.Hana tuple of device policies (offload::builtin_devices by
/// default; users add their own). Hana stays in this header: AnyManager and
/// Manager never show a hana type. docs/dispatch.md explains the choice.

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
#include <boost/hana/append.hpp>
#include <boost/hana/core/is_a.hpp>
#include <boost/hana/for_each.hpp>
#include <boost/hana/length.hpp>
#include <boost/hana/prepend.hpp>
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>
#include <boost/hana/unpack.hpp>

#include <ATen/DeviceAccelerator.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <offload/any_manager.hpp>
#include <offload/concepts.hpp>
#include <offload/config.hpp>
#include <offload/manager.hpp>
#include <offload/options.hpp>
#include <offload/scope.hpp>
#include <offload/stats.hpp>

#include <offload/device/generic.hpp>
#include <offload/device/neuron.hpp>
#include <offload/device/npu.hpp>
#include <offload/device/sim.hpp>
#include <offload/device/xpu.hpp>
#include <offload/storage/host.hpp>
#include <offload/sync/blocking.hpp>
#if OFFLOAD_HAS_CUDA
#include <offload/device/cuda.hpp>
#endif

namespace offload {

/// The device policies compiled into this build, in the order the
/// dispatcher tries them: device::Cuda (only when OFFLOAD_HAS_CUDA),
/// device::Xpu, device::Npu, device::Neuron, device::Sim (only when
/// OFFLOAD_HAS_SIM) and device::Generic last, the catch-all for any
/// PrivateUse1 backend. A hana::tuple of hana::type; extend it with
/// `boost::hana::prepend(offload::builtin_devices, boost::hana::type_c<Mine>)`
/// (tried first) or `boost::hana::append(...)` (tried last).
inline constexpr auto builtin_devices = boost::hana::tuple_t<
#if OFFLOAD_HAS_CUDA
    device::Cuda,
#endif
    device::Xpu, device::Npu, device::Neuron,
#if OFFLOAD_HAS_SIM
    device::Sim,
#endif
    device::Generic>;

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

/// Names of the policies in a device list, in order.
template <class Devices>
std::vector<std::string> device_names(Devices devices) {
  return boost::hana::unpack(devices, [](auto... t) {
    return std::vector<std::string>{std::string(decltype(t)::type::name)...};
  });
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
  static_assert(device_policy<P>,
                "offload::make_manager: every type in the device list must satisfy "
                "offload::device_policy; P in the instantiation of offload::detail::DeviceListEntry<P> "
                "reported with this error does not (see docs/policies/device_policy.md for the "
                "members it needs)");
  static constexpr bool ok = true;
};

template <class Devices>
constexpr bool check_device_list() {
  static_assert(boost::hana::all_of(Devices{}, [](auto t) { return boost::hana::is_a<boost::hana::type_tag>(t); }),
                "offload::make_manager: the device list must be a hana tuple of hana::type_c<Policy> "
                "(e.g. boost::hana::append(offload::builtin_devices, boost::hana::type_c<MyDevice>))");
  static_assert(decltype(boost::hana::length(Devices{}))::value > 0,
                "offload::make_manager: the device list is empty; start from offload::builtin_devices");
  return boost::hana::unpack(Devices{}, [](auto... t) {
    return (DeviceListEntry<typename decltype(t)::type>::ok && ...);
  });
}

/// Whether P says, at run time, that its backend has streams and events:
/// P::runtime_has_events() when P has it, else its compile-time facts.
template <class P>
bool runtime_has_events() {
  if constexpr (requires { { P::runtime_has_events() } -> std::convertible_to<bool>; }) {
    return P::runtime_has_events();
  } else {
    return P::has_streams && P::has_events;
  }
}

/// Forwards every HookSource member to the chosen manager; adds what the
/// dispatcher decided to describe() and, after a fallback to blocking
/// copies, counts every copy in Stats::blocking_fallbacks. (A member added
/// to HookSource must be forwarded here too.)
class DispatchedSource final : public HookSource {
 public:
  DispatchedSource(std::shared_ptr<HookSource> inner, std::string note, bool blocking_fallback)
      : inner_(std::move(inner)), note_(std::move(note)), blocking_fallback_(blocking_fallback) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override { return inner_->make_hooks(); }
  std::string describe() const override { return inner_->describe() + " [" + note_ + "]"; }
  Stats stats() const override {
    auto s = inner_->stats();
    if (blocking_fallback_) s.blocking_fallbacks += s.storages_offloaded + s.tensors_reloaded;
    return s;
  }
  void reset_stats() override { inner_->reset_stats(); }
  void exclude(at::TensorList tensors) override { inner_->exclude(tensors); }
  const Options& options() const noexcept override { return inner_->options(); }
  void on_scope_exit() noexcept override { inner_->on_scope_exit(); }

 private:
  std::shared_ptr<HookSource> inner_;
  std::string note_;
  bool blocking_fallback_;
};

/// Saved tensors stay where they are: make_hooks() counts each and returns
/// no hooks, so autograd saves it exactly as without any scope.
class PassThroughSource final : public HookSource {
 public:
  PassThroughSource(const Options& options, std::string why) : options_(options), why_(std::move(why)) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    seen_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
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
  Manager<Device, Storage, Sync> manager(options);
  if (note.empty()) return AnyManager(manager);
  return AnyManager(std::make_shared<DispatchedSource>(manager.hook_source(), std::move(note), blocking_fallback));
}

template <class>
inline constexpr bool dependent_false = false;

/// Builds the manager for the device policy the dispatcher chose.
template <class Device, class Storage, class Sync>
AnyManager build(const Options& options, const DetectedAccelerator& detected) {
  std::string note;
  if (Device::name != detected.name) {
    note = (Device::device_type == c10::DeviceType::PrivateUse1 ? "PrivateUse1 backend '" : "accelerator '") +
           detected.name + "'";
  }
  auto fallback_note = [&note](std::string why) {
    return note + (note.empty() ? "" : "; ") + std::string(Sync::name) + " needs events: " + why +
           ", so copies are blocking";
  };
  if constexpr (composable<Device, Storage, Sync>) {
    if constexpr (Sync::needs_events) {
      if (!runtime_has_events<Device>()) {
        return wrap<Device, Storage, sync::Blocking>(
            options, fallback_note(std::string(Device::name) + " has no streams/events at run time"), true);
      }
    }
    return wrap<Device, Storage, Sync>(options, std::move(note), false);
  } else if constexpr (sync_policy_for<Sync, Device, Storage> && composable<Device, Storage, sync::Blocking>) {
    // Sync needs events; this policy has none at compile time.
    return wrap<Device, Storage, sync::Blocking>(
        options, fallback_note(std::string(Device::name) + " has no streams/events"), true);
  } else {
    static_assert(dependent_false<Device>,
                  "offload::make_manager: Sync does not satisfy offload::sync_policy_for with a device "
                  "policy of the list (see docs/policies/sync_policy.md)");
  }
}

}  // namespace detail

/// The sync policy the dispatcher uses for Device when Sync is asked for:
/// Sync when the three compose, sync::Blocking when Sync needs events the
/// device policy does not have at compile time. (At run time a policy
/// whose runtime_has_events() is false also gets sync::Blocking.)
template <class Device, class Storage, class Sync>
using dispatched_sync_t = std::conditional_t<composable<Device, Storage, Sync>, Sync, sync::Blocking>;

/// The names of the device policies in `devices` (default: this build's),
/// in the order the dispatcher tries them, e.g.
/// {"cuda", "xpu", "npu", "neuron", "sim", "generic"}. Thread-safe.
template <class Devices = std::remove_const_t<decltype(builtin_devices)>>
std::vector<std::string> compiled_device_policies(Devices devices = builtin_devices) {
  static_assert(detail::check_device_list<Devices>());
  return detail::device_names(devices);
}

/// A manager that offloads nothing, for code that must run anywhere: every
/// saved tensor stays where autograd put it (no hooks are installed for
/// it), stats() counts each one as passed through (passed_other_device)
/// and describe() reads "PassThrough<offloads nothing: WHY>".
/// Validates `options` (c10::ValueError naming the field) first.
/// Thread-safe.
inline AnyManager make_pass_through_manager(const Options& options = {},
                                            std::string why = "pass-through requested") {
  options.validate();
  return AnyManager(std::make_shared<detail::PassThroughSource>(options, std::move(why)));
}

namespace detail {

/// make_manager without install_hooks(): for hosts whose own autograd
/// engine asks the manager for hooks (Python's saved_tensors_hooks, where
/// install_hooks() refuses). Same checks, choice and errors.
template <class Storage, class Sync, class Devices>
AnyManager dispatch_manager(const Options& options, Devices devices, Fallback fallback) {
  static_assert(check_device_list<Devices>());
  options.validate();
  const auto detected = detect_accelerator();
  if (!detected.type) {
    std::string why = "no accelerator was detected (" + detected.reason + ")";
    if (fallback == Fallback::pass_through) return make_pass_through_manager(options, std::move(why));
    C10_THROW_ERROR(Error, "offload::make_manager: " + why + "; this build has: " +
                               join(device_names(devices)) +
                               ". Pass offload::Fallback::pass_through to run without offloading");
  }
  std::optional<AnyManager> chosen;
  boost::hana::for_each(devices, [&](auto t) {
    using P = typename decltype(t)::type;
    if (chosen || P::device_type != *detected.type || !P::available()) return;
    chosen.emplace(build<P, Storage, Sync>(options, detected));
  });
  if (chosen) return *std::move(chosen);
  std::string why = "no device policy for '" + detected.name + "'";
  if (fallback == Fallback::pass_through) return make_pass_through_manager(options, std::move(why));
  C10_THROW_ERROR(Error, "offload::make_manager: " + why + "; this build has: " +
                             join(device_names(devices)) +
                             ". Add one with boost::hana::prepend(offload::builtin_devices, "
                             "boost::hana::type_c<YourPolicy>) (docs/dispatch.md), or pass "
                             "offload::Fallback::pass_through to run without offloading");
}

}  // namespace detail

/// Detects the accelerator (detect_accelerator()) and returns a manager
/// for it: the first policy P in `devices` with P::device_type equal to
/// the detected type and P::available() true, as
/// Manager<P, Storage, Sync>, or Manager<P, Storage, sync::Blocking> when
/// Sync needs events and P has none (at compile time, or at run time per
/// P::runtime_has_events()); then describe() says so and
/// Stats::blocking_fallbacks counts the blocking copies. describe() also
/// names the backend when the policy's name differs from it (device::Generic
/// for PrivateUse1 backend 'acme'). Never picks a policy of another device
/// type: there is no fallback to CUDA.
///
/// - options: validated first (c10::ValueError naming the field, value and
///   accepted range); nothing is detected or built before.
/// - devices: a hana tuple of hana::type_c<Policy>; each must satisfy
///   offload::device_policy (a static_assert naming the type otherwise).
/// - fallback: with Fallback::error (default), throws c10::Error when no
///   accelerator is detected ("no accelerator was detected ...; this build
///   has: cuda, xpu, ...") or when none of `devices` matches it ("no device
///   policy for 'xla'; this build has: ..."); with Fallback::pass_through,
///   returns make_pass_through_manager() with that reason instead.
///
/// Also calls install_hooks() (so the autograd engine that serves Scopes is
/// the default one before the manager's first backward pass; it throws
/// c10::Error in a process that loaded libtorch_python).
///
/// Thread-safe (the detection and the runtime probes are).
template <storage_policy Storage = storage::PinnedHost, class Sync = sync::Blocking, class Devices>
  requires(!std::is_same_v<Devices, Fallback>)
AnyManager make_manager(const Options& options, Devices devices, Fallback fallback = Fallback::error) {
  static_assert(detail::check_device_list<Devices>());
  options.validate();
  install_hooks();
  return detail::dispatch_manager<Storage, Sync>(options, devices, fallback);
}

/// make_manager(options, builtin_devices, fallback).
template <storage_policy Storage = storage::PinnedHost, class Sync = sync::Blocking>
AnyManager make_manager(const Options& options = {}, Fallback fallback = Fallback::error) {
  return make_manager<Storage, Sync>(options, builtin_devices, fallback);
}

}  // namespace offload
