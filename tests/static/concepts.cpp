// SPDX-License-Identifier: MIT
// Compile-time tests: every shipped policy satisfies its concept, and each
// near-miss (one member away) does not. Built as a library: compiling it
// is the test.

#include <offload/offload.hpp>

namespace {

using namespace offload;

// ---- models satisfy their concepts
static_assert(device_policy<device::Sim>);
static_assert(device_policy<device::Cuda>);
static_assert(storage_policy<storage::PinnedHost>);
static_assert(storage_policy<storage::PageableHost>);
static_assert(sync_policy_for<sync::Blocking, device::Sim, storage::PinnedHost>);
static_assert(composable<device::Cuda, storage::PinnedHost, sync::Blocking>);
static_assert(composable<device::Sim, storage::PageableHost, sync::Blocking>);

// ---- near-misses: a device policy without empty_cache, and its twin
struct DeviceTwin {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "twin";
  static constexpr bool has_streams = false;
  static constexpr bool has_events = false;
  static constexpr bool has_pinned_host = false;
  static constexpr bool has_memory_stats = false;
  static bool available() { return false; }
  static c10::Stream current_stream(c10::DeviceIndex);
  static c10::Stream side_stream(c10::DeviceIndex);
  static void record_stream(const at::Tensor&, c10::Stream);
  static std::int64_t memory_allocated(c10::DeviceIndex);
  static void empty_cache();
};
struct DeviceNoEmptyCache {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "near-miss";
  static constexpr bool has_streams = false;
  static constexpr bool has_events = false;
  static constexpr bool has_pinned_host = false;
  static constexpr bool has_memory_stats = false;
  static bool available() { return false; }
  static c10::Stream current_stream(c10::DeviceIndex);
  static c10::Stream side_stream(c10::DeviceIndex);
  static void record_stream(const at::Tensor&, c10::Stream);
  static std::int64_t memory_allocated(c10::DeviceIndex);
};
static_assert(device_policy<DeviceTwin>);
static_assert(!device_policy<DeviceNoEmptyCache>);

// a capability that is not a constant expression is a near-miss too
struct DeviceRuntimeFlag : DeviceTwin {
  static inline bool has_events = false;
};
static_assert(!device_policy<DeviceRuntimeFlag>);

// ---- storage: allocate returning the wrong type, and its twin
struct StorageTwin {
  static constexpr std::string_view name = "twin";
  static constexpr bool prefers_pinned = false;
  HostBuffer allocate(std::int64_t, c10::DeviceType, const Options&);
};
struct StorageReturnsTensor {
  static constexpr std::string_view name = "near-miss";
  static constexpr bool prefers_pinned = false;
  at::Tensor allocate(std::int64_t, c10::DeviceType, const Options&);
};
static_assert(storage_policy<StorageTwin>);
static_assert(!storage_policy<StorageReturnsTensor>);

// ---- sync: a State without release(), and its twin
struct SyncTwin {
  static constexpr std::string_view name = "twin";
  static constexpr bool needs_events = false;
  template <class D, class S>
  struct State {
    State(const Options&, S&);
    void offload(const std::shared_ptr<Entry>&, const at::Tensor&);
    at::Tensor reload(const std::shared_ptr<Entry>&);
    void on_unpack(const std::shared_ptr<Entry>&);
    void release(Entry&) noexcept;
  };
};
struct SyncNoRelease {
  static constexpr std::string_view name = "near-miss";
  static constexpr bool needs_events = false;
  template <class D, class S>
  struct State {
    State(const Options&, S&);
    void offload(const std::shared_ptr<Entry>&, const at::Tensor&);
    at::Tensor reload(const std::shared_ptr<Entry>&);
    void on_unpack(const std::shared_ptr<Entry>&);
  };
};
static_assert(sync_policy_for<SyncTwin, DeviceTwin, StorageTwin>);
static_assert(!sync_policy_for<SyncNoRelease, DeviceTwin, StorageTwin>);

// ---- composition: a sync policy that needs events with an event-less device
struct SyncNeedsEvents : SyncTwin {
  static constexpr bool needs_events = true;
};
static_assert(composable<DeviceTwin, StorageTwin, SyncTwin>);
static_assert(!composable<DeviceTwin, StorageTwin, SyncNeedsEvents>);
static_assert(composable<device::Sim, StorageTwin, SyncNeedsEvents>);

}  // namespace
