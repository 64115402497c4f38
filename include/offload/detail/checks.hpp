// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Compile-time checks behind offload::Manager and offload::make_manager:
/// each concept of <offload/concepts.hpp> checked member by member, so a
/// policy that fails gets exactly one static_assert, naming its concept and
/// the first missing member, and the checks after it are not run.

#include <concepts>
#include <string_view>
#include <type_traits>

#include <offload/concepts.hpp>

namespace offload::detail {

template <class...>
inline constexpr bool always_false = false;

/// True when D satisfies device_policy; otherwise one static_assert naming
/// the first missing member.
template <class D>
constexpr bool check_device_policy() {
  if constexpr (!requires {
                  { D::device_type } -> std::convertible_to<c10::DeviceType>;
                }) {
    static_assert(always_false<D>,
                  "offload: the Device policy does not satisfy offload::device_policy: it needs "
                  "`static constexpr c10::DeviceType device_type` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!requires {
                         { D::name } -> std::convertible_to<std::string_view>;
                       }) {
    static_assert(always_false<D>,
                  "offload: the Device policy does not satisfy offload::device_policy: it needs "
                  "`static constexpr std::string_view name` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!requires { typename constant_bool<D::has_streams>; }) {
    static_assert(always_false<D>,
                  "offload: the Device policy does not satisfy offload::device_policy: it needs "
                  "`static constexpr bool has_streams` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!requires { typename constant_bool<D::has_events>; }) {
    static_assert(always_false<D>,
                  "offload: the Device policy does not satisfy offload::device_policy: it needs "
                  "`static constexpr bool has_events` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!requires {
                         { D::available() } -> std::same_as<bool>;
                       }) {
    static_assert(always_false<D>,
                  "offload: the Device policy does not satisfy offload::device_policy: it needs "
                  "`static bool available()` (docs/policies/device_policy.md)");
    return false;
  } else {
    static_assert(device_policy<D>, "offload: detail::check_device_policy is out of step with device_policy");
    return true;
  }
}

/// True when S satisfies storage_policy; otherwise one static_assert naming
/// the first missing member.
template <class S>
constexpr bool check_storage_policy() {
  if constexpr (!std::default_initializable<S>) {
    static_assert(always_false<S>,
                  "offload: the Storage policy does not satisfy offload::storage_policy: it must "
                  "be default-constructible (docs/policies/storage_policy.md)");
    return false;
  } else if constexpr (!requires {
                         { S::name } -> std::convertible_to<std::string_view>;
                       }) {
    static_assert(always_false<S>,
                  "offload: the Storage policy does not satisfy offload::storage_policy: it needs "
                  "`static constexpr std::string_view name` (docs/policies/storage_policy.md)");
    return false;
  } else if constexpr (!requires { typename constant_bool<S::prefers_pinned>; }) {
    static_assert(always_false<S>,
                  "offload: the Storage policy does not satisfy offload::storage_policy: it needs "
                  "`static constexpr bool prefers_pinned` (docs/policies/storage_policy.md)");
    return false;
  } else if constexpr (!requires(S & s, std::int64_t n, c10::DeviceType t, const Options& o) {
                         { s.allocate(n, t, o) } -> std::same_as<HostBuffer>;
                       }) {
    static_assert(always_false<S>,
                  "offload: the Storage policy does not satisfy offload::storage_policy: it needs "
                  "`offload::HostBuffer allocate(std::int64_t nbytes, c10::DeviceType, const "
                  "offload::Options&)` (docs/policies/storage_policy.md)");
    return false;
  } else {
    static_assert(storage_policy<S>, "offload: detail::check_storage_policy is out of step with storage_policy");
    return true;
  }
}

#define OFFLOAD_DETAIL_SYNC_MEMBER(expr, text)                                                        \
  else if constexpr (!requires(St & state, const St& cstate, const std::shared_ptr<Entry<Es>>& entry, \
                               const at::Tensor& bytes, Stats& stats) { expr; }) {                    \
    static_assert(always_false<P>,                                                                    \
                  "offload: the Sync policy does not satisfy offload::sync_policy_for: its "          \
                  "State<Device> needs " text " (docs/policies/sync_policy.md)");                     \
    return false;                                                                                     \
  }

/// True when P satisfies sync_policy_for<P, D> (D already checked);
/// otherwise one static_assert naming the first missing member.
template <class P, class D>
constexpr bool check_sync_members() {
  if constexpr (!requires {
                  { P::name } -> std::convertible_to<std::string_view>;
                }) {
    static_assert(always_false<P>,
                  "offload: the Sync policy does not satisfy offload::sync_policy_for: it needs "
                  "`static constexpr std::string_view name` (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!requires { typename constant_bool<P::needs_events>; }) {
    static_assert(always_false<P>,
                  "offload: the Sync policy does not satisfy offload::sync_policy_for: it needs "
                  "`static constexpr bool needs_events` (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!requires { typename P::template State<D>; }) {
    static_assert(always_false<P>,
                  "offload: the Sync policy does not satisfy offload::sync_policy_for: it needs "
                  "a member class template `State<Device>` (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!requires { typename P::template State<D>::EntryState; }) {
    static_assert(always_false<P>,
                  "offload: the Sync policy does not satisfy offload::sync_policy_for: its "
                  "State<Device> needs a default-constructible `EntryState` type, the per-entry "
                  "state (`struct EntryState {};` when there is none) (docs/policies/sync_policy.md)");
    return false;
  } else {
    using St = typename P::template State<D>;
    using Es = typename St::EntryState;
    if constexpr (!std::default_initializable<Es>) {
      static_assert(always_false<P>,
                    "offload: the Sync policy does not satisfy offload::sync_policy_for: its "
                    "State<Device>::EntryState must be default-constructible "
                    "(docs/policies/sync_policy.md)");
      return false;
    } else if constexpr (!std::constructible_from<St, const Options&>) {
      static_assert(always_false<P>,
                    "offload: the Sync policy does not satisfy offload::sync_policy_for: its "
                    "State<Device> needs a constructor `State(const offload::Options&)` "
                    "(docs/policies/sync_policy.md)");
      return false;
    }
    OFFLOAD_DETAIL_SYNC_MEMBER({ state.offload(entry, bytes) } -> std::same_as<void>,
                               "`void offload(const std::shared_ptr<Entry<EntryState>>&, const at::Tensor&)`")
    OFFLOAD_DETAIL_SYNC_MEMBER({ state.reload(entry) } -> std::same_as<Reloaded>,
                               "`offload::Reloaded reload(const std::shared_ptr<Entry<EntryState>>&)`")
    OFFLOAD_DETAIL_SYNC_MEMBER({ state.on_unpack(entry) } -> std::same_as<void>,
                               "`void on_unpack(const std::shared_ptr<Entry<EntryState>>&)`")
    OFFLOAD_DETAIL_SYNC_MEMBER({ state.settle() } -> std::same_as<void>,
                               "`void settle()` (called when a Scope closes; may do nothing)")
    OFFLOAD_DETAIL_SYNC_MEMBER({ state.end_backward() } -> std::same_as<void>,
                               "`void end_backward()` (called when a backward pass ends; may do nothing)")
    OFFLOAD_DETAIL_SYNC_MEMBER({ state.resume(entry) } -> std::same_as<void>,
                               "`void resume(const std::shared_ptr<Entry<EntryState>>&)` (called when the manager "
                               "grew an entry after release(); may do nothing)")
    OFFLOAD_DETAIL_SYNC_MEMBER({ cstate.add_stats(stats) } -> std::same_as<void>,
                               "`void add_stats(offload::Stats&) const` (may add nothing)")
    OFFLOAD_DETAIL_SYNC_MEMBER({ state.release(*entry) } -> std::same_as<void>,
                               "`void release(Entry<EntryState>&) noexcept`")
    OFFLOAD_DETAIL_SYNC_MEMBER({ state.release(*entry) } noexcept,
                               "`release` to be declared noexcept: it runs when autograd frees a saved tensor")
    else {
      static_assert(sync_policy_for<P, D>, "offload: detail::check_sync_members is out of step with sync_policy_for");
      return true;
    }
  }
}

#undef OFFLOAD_DETAIL_SYNC_MEMBER

/// True when a sync policy that needs events (Y::needs_events) gets a
/// stream_device_policy D; otherwise one static_assert saying what D lacks.
template <class D, class Y>
constexpr bool check_events_for() {
  if constexpr (!Y::needs_events) {
    return true;
  } else if constexpr (!(D::has_streams && D::has_events)) {
    static_assert(always_false<D>,
                  "offload: the Sync policy needs streams and events (needs_events) and the "
                  "Device policy has none (has_streams && has_events is false); use "
                  "sync::Blocking, or another sync policy without needs_events, for this device");
    return false;
  } else if constexpr (!requires(c10::DeviceIndex i) {
                         { D::current_stream(i) } -> std::same_as<c10::Stream>;
                       }) {
    static_assert(always_false<D>,
                  "offload: the Sync policy needs streams and events and the Device policy is no "
                  "offload::stream_device_policy: it needs `static c10::Stream "
                  "current_stream(c10::DeviceIndex)` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!requires(c10::DeviceIndex i) {
                         { D::side_stream(i) } -> std::same_as<c10::Stream>;
                       }) {
    static_assert(always_false<D>,
                  "offload: the Sync policy needs streams and events and the Device policy is no "
                  "offload::stream_device_policy: it needs `static c10::Stream "
                  "side_stream(c10::DeviceIndex)` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!requires(const at::Tensor& t, c10::Stream s) {
                         { D::record_stream(t, s) } -> std::same_as<void>;
                       }) {
    static_assert(always_false<D>,
                  "offload: the Sync policy needs streams and events and the Device policy is no "
                  "offload::stream_device_policy: it needs `static void record_stream(const "
                  "at::Tensor&, c10::Stream)` (docs/policies/device_policy.md)");
    return false;
  } else {
    return true;
  }
}

/// All checks of Manager<D, S, Y>, in order; stops at the first failure, so
/// the compiler reports one error.
template <class D, class S, class Y>
constexpr bool check_policies() {
  if constexpr (!check_device_policy<D>()) {
    return false;
  } else if constexpr (!check_storage_policy<S>()) {
    return false;
  } else if constexpr (!check_sync_members<Y, D>()) {
    return false;
  } else if constexpr (!check_events_for<D, Y>()) {
    return false;
  } else {
    static_assert(composable<D, S, Y>, "offload: detail::check_policies is out of step with composable");
    return true;
  }
}

}  // namespace offload::detail
