// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The composition root: the device policies this build ships, in the
/// order the dispatcher tries them (offload::builtin_devices), and
/// offload::make_manager with its usual defaults (storage::PinnedHost,
/// sync::Blocking, builtin_devices, sync::Blocking as the fallback where a
/// backend has no events). The core (<offload/dispatch.hpp>) names none of
/// these.

#include <string>
#include <type_traits>
#include <vector>

#include <boost/hana/append.hpp>   // for users: extend the list
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
#include <offload/sync/blocking.hpp>
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
