// SPDX-License-Identifier: MIT
// Compile-time tests: every shipped policy satisfies its concept, and each
// near-miss (one member or one token away from a model) does not, for
// every concept of <offload/concepts.hpp>. Built as a library: compiling
// it is the test.

#include <offload/offload.hpp>

#include "models.hpp"

namespace {

using namespace offload;

// ---- models satisfy their concepts
static_assert(device_policy<device::Sim>);
static_assert(stream_device_policy<device::Sim>);
static_assert(memory_stats_device_policy<device::Sim>);
#if OFFLOAD_HAS_CUDA
static_assert(device_policy<device::Cuda>);
static_assert(stream_device_policy<device::Cuda>);
static_assert(memory_stats_device_policy<device::Cuda>);
static_assert(composable<device::Cuda, storage::PinnedHost, sync::Blocking>);
static_assert(composable<device::Cuda, storage::PinnedHost, sync::Streamed>);
#endif
static_assert(storage_policy<storage::PinnedHost>);
static_assert(storage_policy<storage::PageableHost>);
static_assert(sync_policy_for<sync::Blocking, device::Sim>);
static_assert(sync_policy_for<sync::Streamed, device::Sim>);
static_assert(sync_state<sync::Blocking::State<device::Sim>>);
static_assert(sync_state<sync::Streamed::State<device::Sim>>);
static_assert(composable<device::Sim, storage::PageableHost, sync::Blocking>);
static_assert(composable<device::Sim, storage::PinnedHost, sync::Streamed>);

// ---- device_policy: the five members, and a near-miss without available()
struct DeviceTwin {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "twin";
  static constexpr bool has_streams = false;
  static constexpr bool has_events = false;
  static bool available() { return false; }
};
struct DeviceNoAvailable {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "near-miss";
  static constexpr bool has_streams = false;
  static constexpr bool has_events = false;
};
static_assert(device_policy<DeviceTwin>);
static_assert(!device_policy<DeviceNoAvailable>);

// a capability that is not a constant expression is a near-miss too
struct DeviceRuntimeFlag : DeviceTwin {
  static inline bool has_events = false;
};
static_assert(!device_policy<DeviceRuntimeFlag>);

// ---- stream_device_policy: the claim plus three stream members
struct StreamTwin : DeviceTwin {
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
  static c10::Stream current_stream(c10::DeviceIndex);
  static c10::Stream side_stream(c10::DeviceIndex);
  static void record_stream(const at::Tensor&, c10::Stream);
};
struct StreamNoRecord : DeviceTwin {
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
  static c10::Stream current_stream(c10::DeviceIndex);
  static c10::Stream side_stream(c10::DeviceIndex);
};
struct StreamNotClaimed : StreamTwin {  // every member, but no events claimed
  static constexpr bool has_events = false;
};
static_assert(stream_device_policy<StreamTwin>);
static_assert(!stream_device_policy<StreamNoRecord>);
static_assert(!stream_device_policy<StreamNotClaimed>);
static_assert(!stream_device_policy<DeviceTwin>);

// ---- memory_stats_device_policy: what a device-memory target and the tests read
struct MemoryTwin : DeviceTwin {
  static std::int64_t memory_allocated(c10::DeviceIndex);
  static void empty_cache();
};
struct MemoryNoEmptyCache : DeviceTwin {
  static std::int64_t memory_allocated(c10::DeviceIndex);
};
static_assert(memory_stats_device_policy<MemoryTwin>);
static_assert(!memory_stats_device_policy<MemoryNoEmptyCache>);
static_assert(!memory_stats_device_policy<DeviceTwin>);

// ---- storage: allocate returning the wrong type, and its twin
struct StorageTwin {
  static constexpr std::string_view name = "twin";
  static constexpr bool prefers_pinned = false;
  HostBuffer allocate(const HostRequest&);
};
struct StorageReturnsTensor {
  static constexpr std::string_view name = "near-miss";
  static constexpr bool prefers_pinned = false;
  at::Tensor allocate(const HostRequest&);
};
struct StorageNoDefault : StorageTwin {
  explicit StorageNoDefault(int);
};
static_assert(storage_policy<StorageTwin>);
static_assert(!storage_policy<StorageReturnsTensor>);
static_assert(storage_policy<StorageNoDefault>);  // Manager(options, storage) takes an instance

// ---- sync: the minimal model, the twin with every step callback, and
// near-misses one member or one token away (tests/static/models.hpp)
using static_tests::MinimalSync;
using static_tests::Miss;
using SyncTwin = static_tests::SyncModel<Miss::none>;
static_assert(sync_policy_for<MinimalSync, DeviceTwin>);
static_assert(sync_state<MinimalSync::State<DeviceTwin>>);
static_assert(!sync_state_with_steps<MinimalSync::State<DeviceTwin>>);
static_assert(sync_policy_for<SyncTwin, DeviceTwin>);
static_assert(sync_state_with_steps<SyncTwin::State<DeviceTwin>>);
static_assert(!sync_policy_for<static_tests::SyncModel<Miss::release>, DeviceTwin>);
static_assert(!sync_policy_for<static_tests::SyncModel<Miss::release_noexcept>, DeviceTwin>);
static_assert(!sync_policy_for<static_tests::SyncModel<Miss::end_forward>, DeviceTwin>);  // misspelt: not skipped
static_assert(!sync_policy_for<static_tests::SyncModel<Miss::resume>, DeviceTwin>);
static_assert(!sync_policy_for<static_tests::SyncModel<Miss::reload_tensor>, DeviceTwin>);
static_assert(!sync_policy_for<static_tests::SyncModel<Miss::entry_state>, DeviceTwin>);
static_assert(!sync_policy_for<static_tests::SyncModel<Miss::undeclared>, DeviceTwin>);  // callbacks never called
static_assert(!sync_policy_for<SyncTwin, DeviceNoAvailable>);  // the device must be a device policy
static_assert(sync_state_with_steps<sync::Streamed::State<device::Sim>>);
static_assert(!sync_state_with_steps<sync::Blocking::State<device::Sim>>);

// ---- sync_state_for_target: declared and complete; declared without one
// member; the members without the declaration (never read: an error)
template <bool Declared, bool Headroom>
struct TargetState : MinimalSync::State<DeviceTwin> {
  using MinimalSync::State<DeviceTwin>::State;
  static constexpr bool serves_target = Declared;
  std::int64_t prefetched_bytes() const noexcept;
  bool holds_device_bytes(const Transfer<EntryState>&) const noexcept;
  void set_headroom(std::int64_t) noexcept
    requires Headroom;
};
static_assert(sync_state_for_target<TargetState<true, true>>);
static_assert(!sync_state<TargetState<true, false>>);  // declared, set_headroom missing
static_assert(!sync_state<TargetState<false, true>>);  // members without the declaration
static_assert(!sync_state_for_target<MinimalSync::State<DeviceTwin>>);
static_assert(sync_state_for_target<sync::Streamed::State<device::Sim>>);
static_assert(!sync_state_for_target<sync::Blocking::State<device::Sim>>);

// ---- composition: a sync policy that needs events with an event-less device
using SyncNeedsEvents = static_tests::SyncModel<Miss::none, /*NeedsEvents=*/true>;
static_assert(composable<DeviceTwin, StorageTwin, SyncTwin>);
static_assert(!composable<DeviceTwin, StorageTwin, SyncNeedsEvents>);
static_assert(!composable<StreamNoRecord, StorageTwin, SyncNeedsEvents>);
static_assert(composable<StreamTwin, StorageTwin, SyncNeedsEvents>);
static_assert(composable<device::Sim, StorageTwin, SyncNeedsEvents>);
static_assert(!composable<DeviceTwin, StorageReturnsTensor, SyncTwin>);

// ---- the checks behind Manager's static_assert agree with the concepts
static_assert(detail::check_policies<DeviceTwin, StorageTwin, SyncTwin>());
static_assert(detail::check_policies<DeviceTwin, StorageNoDefault, MinimalSync>());
static_assert(detail::check_policies<StreamTwin, StorageTwin, SyncNeedsEvents>());
static_assert(detail::check_policies<device::Sim, storage::PinnedHost, sync::Streamed>());

// ---- Manager and AnyManager offer the same members
template <class M>
concept manager_members = requires(M& m, const M& cm, at::TensorList tensors) {
  { cm.stats() } -> std::same_as<Stats>;
  { m.reset_stats() } -> std::same_as<void>;
  { cm.options() } -> std::same_as<const Options&>;
  { m.exclude(tensors) } -> std::same_as<void>;
  { cm.describe() } -> std::same_as<std::string>;
  { cm.make_hooks() } -> std::same_as<std::unique_ptr<torch::autograd::SavedVariableHooks>>;
};
static_assert(manager_members<Manager<device::Sim, storage::PinnedHost, sync::Blocking>>);
static_assert(manager_members<AnyManager>);
static_assert(std::is_convertible_v<Manager<device::Sim, storage::PinnedHost, sync::Blocking>, AnyManager>);
static_assert(!std::is_constructible_v<AnyManager, std::shared_ptr<ManagerInterface>>);  // no detail:: in the API

}  // namespace
