// SPDX-License-Identifier: MIT
// Compile-time tests of the device policies and the dispatcher's device
// list: every policy satisfies device_policy, each near-miss (one member
// or one token away) does not, and a sync policy that needs events
// composes only with a device policy that has them. Built as a library:
// compiling it is the test.

#include <type_traits>

#include <boost/hana/back.hpp>
#include <boost/hana/contains.hpp>
#include <boost/hana/equal.hpp>
#include <boost/hana/front.hpp>
#include <boost/hana/integral_constant.hpp>

#include <offload/offload.hpp>

#include "models.hpp"

namespace {

using namespace offload;
namespace hana = boost::hana;

// ---- every shipped device policy is a model
static_assert(device_policy<device::Xpu>);
static_assert(device_policy<device::Npu>);
static_assert(device_policy<device::Neuron>);
static_assert(device_policy<device::Generic>);
static_assert(device_policy<device::Sim>);
#if OFFLOAD_HAS_CUDA
static_assert(device_policy<device::Cuda>);
#endif
static_assert(stream_device_policy<device::Xpu>);
static_assert(stream_device_policy<device::Npu>);
static_assert(stream_device_policy<device::Neuron>);
static_assert(stream_device_policy<device::Generic>);
static_assert(memory_stats_device_policy<device::Xpu>);
static_assert(memory_stats_device_policy<device::Generic>);
static_assert(device::Xpu::device_type == c10::DeviceType::XPU);
static_assert(device::Npu::device_type == c10::DeviceType::PrivateUse1 && device::Npu::backend_name == "npu");
static_assert(device::Neuron::device_type == c10::DeviceType::PrivateUse1 && device::Neuron::backend_name == "neuron");
static_assert(device::Generic::device_type == c10::DeviceType::PrivateUse1);
static_assert(composable<device::Xpu, storage::PinnedHost, sync::Blocking>);
static_assert(composable<device::Npu, storage::PinnedHost, sync::Blocking>);
static_assert(composable<device::Neuron, storage::PageableHost, sync::Blocking>);
static_assert(composable<device::Generic, storage::PageableHost, sync::Blocking>);

// ---- the built-in list: every entry is a device policy, Generic is last
static_assert(hana::all_of(builtin_devices,
                           [](auto t) { return hana::bool_c<device_policy<typename decltype(t)::type>>; }));
static_assert(hana::back(builtin_devices) == hana::type_c<device::Generic>);
static_assert(hana::length(builtin_devices) == hana::size_c<4 + OFFLOAD_HAS_CUDA + OFFLOAD_HAS_SIM>);
#if OFFLOAD_HAS_CUDA
static_assert(hana::front(builtin_devices) == hana::type_c<device::Cuda>);
#else
static_assert(!hana::contains(builtin_devices, hana::type_c<device::Cuda>));
#endif

// ---- near-miss: Generic without runtime capability members is still a
// policy, but a copy missing available() is not
struct GenericTwin : device::GenericOps<c10::DeviceType::PrivateUse1> {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "twin";
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
  static bool available() { return true; }
};
struct GenericNoAvailable : device::GenericOps<c10::DeviceType::PrivateUse1> {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "near-miss";
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
};
static_assert(device_policy<GenericTwin>);
static_assert(!device_policy<GenericNoAvailable>);

// available() returning int instead of bool is a near-miss too
struct GenericIntAvailable : GenericTwin {
  static int available() { return 1; }
};
static_assert(!device_policy<GenericIntAvailable>);

// ---- composition: a sync policy that needs events, with the event-less
// variant of Generic (does not compose) and its twin (composes)
using SyncNeedsEvents = static_tests::SyncModel<static_tests::Miss::none, /*NeedsEvents=*/true>;
struct GenericWithoutEvents : GenericTwin {
  static constexpr bool has_events = false;
};
struct GenericWithoutStreams : GenericTwin {
  static constexpr bool has_streams = false;
};
static_assert(device_policy<GenericWithoutEvents>);
static_assert(!composable<GenericWithoutEvents, storage::PinnedHost, SyncNeedsEvents>);
static_assert(!composable<GenericWithoutStreams, storage::PinnedHost, SyncNeedsEvents>);
static_assert(composable<GenericTwin, storage::PinnedHost, SyncNeedsEvents>);
static_assert(composable<device::Generic, storage::PinnedHost, SyncNeedsEvents>);
static_assert(composable<device::Npu, storage::PinnedHost, SyncNeedsEvents>);
static_assert(composable<device::Neuron, storage::PinnedHost, SyncNeedsEvents>);
static_assert(composable<device::Xpu, storage::PinnedHost, SyncNeedsEvents>);
static_assert(composable<GenericWithoutEvents, storage::PinnedHost, sync::Blocking>);

// ---- what the dispatcher instantiates for each: Blocking where the sync
// policy's needs are not met at compile time, the sync policy otherwise
static_assert(
    std::is_same_v<dispatched_sync_t<GenericWithoutEvents, storage::PinnedHost, SyncNeedsEvents, sync::Blocking>,
                   sync::Blocking>);
static_assert(std::is_same_v<dispatched_sync_t<GenericTwin, storage::PinnedHost, SyncNeedsEvents, sync::Blocking>,
                             SyncNeedsEvents>);
static_assert(std::is_same_v<dispatched_sync_t<device::Generic, storage::PinnedHost, sync::Blocking, sync::Blocking>,
                             sync::Blocking>);

// ---- a user list: prepend takes priority, and the list type-checks
constexpr auto user_devices = hana::prepend(builtin_devices, hana::type_c<GenericTwin>);
static_assert(hana::front(user_devices) == hana::type_c<GenericTwin>);
static_assert(detail::check_device_list<std::remove_const_t<decltype(user_devices)>>());

}  // namespace
