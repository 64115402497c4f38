// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The composition root: the device policies this build ships, in the
/// order the dispatcher tries them (offload::builtin_devices), the storage
/// and sync policies it ships (builtin_storages, builtin_syncs: the one
/// list of their names, for programs that pick them by name), and
/// offload::make_manager with its usual defaults (storage::PinnedHost,
/// sync::Blocking, builtin_devices, sync::Blocking as the fallback where a
/// backend has no events). The core (<offload/dispatch.hpp>) names none of
/// these.

#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <boost/hana/append.hpp>  // for users: extend the list
#include <boost/hana/for_each.hpp>
#include <boost/hana/prepend.hpp>  // for users: extend the list
#include <boost/hana/tuple.hpp>
#include <boost/hana/type.hpp>

#include <offload/any_manager.hpp>
#include <offload/concepts.hpp>
#include <offload/config.hpp>
#include <offload/dispatch.hpp>
#include <offload/options.hpp>

#include <offload/device/generic.hpp>
#include <offload/device/neuron.hpp>
#include <offload/device/npu.hpp>
#include <offload/device/sim.hpp>
#include <offload/device/xpu.hpp>
#include <offload/storage/host.hpp>
#include <offload/storage/pool.hpp>
#include <offload/sync/blocking.hpp>
#include <offload/sync/streamed.hpp>
#if OFFLOAD_HAS_CUDA
#include <offload/device/cuda.hpp>
#endif

namespace offload {

/// The device policies compiled into this build, in the order the
/// dispatcher tries them: device::Cuda (only when OFFLOAD_HAS_CUDA),
/// device::Xpu, device::Npu, device::Neuron, device::Sim (only when
/// OFFLOAD_HAS_SIM; used only by programs that link liboffload_sim) and
/// device::Generic last, the catch-all for any PrivateUse1 backend. A
/// hana::tuple of hana::type; extend it with
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

/// The names of the device policies in `devices` (default: this build's),
/// in the order the dispatcher tries them, e.g.
/// {"cuda", "xpu", "npu", "neuron", "sim", "generic"}. Thread-safe.
template <class Devices = std::remove_const_t<decltype(builtin_devices)>>
std::vector<std::string> compiled_device_policies(Devices devices = builtin_devices) {
  return device_policy_names(devices);
}

/// The storage policies shipped, by name: storage::PinnedHost
/// ("pinned_host", the default), storage::PageableHost ("pageable_host"),
/// storage::PinnedPool ("pinned_pool"). A hana::tuple of hana::type.
inline constexpr auto builtin_storages =
    boost::hana::tuple_t<storage::PinnedHost, storage::PageableHost, storage::PinnedPool>;

/// The sync policies shipped, by name: sync::Blocking ("blocking", the
/// default), sync::Streamed ("streamed"). A hana::tuple of hana::type.
inline constexpr auto builtin_syncs = boost::hana::tuple_t<sync::Blocking, sync::Streamed>;

/// The names (`P::name`) of the policies in `policies` (a hana::tuple of
/// hana::type, e.g. builtin_storages), in order. Thread-safe.
template <class Policies>
std::vector<std::string> policy_names(Policies policies) {
  std::vector<std::string> out;
  boost::hana::for_each(policies, [&](auto t) { out.emplace_back(decltype(t)::type::name); });
  return out;
}

/// Calls `f(boost::hana::type_c<P>)` for the policy P of `policies` whose
/// `P::name` is `name` and returns true; returns false, calling nothing,
/// when none is. For programs that take a policy's name from a user (the
/// Python binding, a command line). Thread-safe when `f` is.
template <class Policies, class F>
bool visit_policy_named(Policies policies, std::string_view name, F&& f) {
  bool found = false;
  boost::hana::for_each(policies, [&](auto t) {
    if (!found && decltype(t)::type::name == name) {
      found = true;
      f(t);
    }
  });
  return found;
}

/// make_manager<Storage, Sync, sync::Blocking>(options, devices, fallback):
/// the dispatcher of <offload/dispatch.hpp> with sync::Blocking where a
/// backend has no events.
template <class Storage = storage::PinnedHost, class Sync = sync::Blocking, class Devices>
  requires(!std::is_same_v<Devices, Fallback>)
AnyManager make_manager(const Options& options, Devices devices, Fallback fallback = Fallback::error) {
  return make_manager<Storage, Sync, sync::Blocking>(options, devices, fallback);
}

/// make_manager(options, builtin_devices, fallback).
template <class Storage = storage::PinnedHost, class Sync = sync::Blocking>
AnyManager make_manager(const Options& options = {}, Fallback fallback = Fallback::error) {
  return make_manager<Storage, Sync, sync::Blocking>(options, builtin_devices, fallback);
}

}  // namespace offload
