// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Compile-time checks behind offload::Manager and offload::make_manager:
/// the requirements of <offload/concepts.hpp> (offload::requirement) tested
/// one by one, so a policy that fails gets exactly one static_assert,
/// naming its concept and the first missing member, and the checks after
/// it are not run. The requirements themselves are written only there.

#include <concepts>

#include <offload/concepts.hpp>

namespace offload::detail {

template <class...>
inline constexpr bool always_false = false;

/// True when D satisfies device_policy; otherwise one static_assert naming
/// the first missing member.
template <class D>
constexpr bool check_device_policy() {
  namespace r = requirement;
  if constexpr (!r::device_type<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy does not satisfy offload::device_policy: it needs "
                  "`static constexpr c10::DeviceType device_type` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!r::name<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy does not satisfy offload::device_policy: it needs "
                  "`static constexpr std::string_view name` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!r::has_streams<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy does not satisfy offload::device_policy: it needs "
                  "`static constexpr bool has_streams` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!r::has_events<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy does not satisfy offload::device_policy: it needs "
                  "`static constexpr bool has_events` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!r::available<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy does not satisfy offload::device_policy: it needs "
                  "`static bool available()` (docs/policies/device_policy.md)");
    return false;
  } else {
    static_assert(device_policy<D>, "offload: detail::check_device_policy is out of step with device_policy");
    return true;
  }
}

/// True when each optional member the manager or the dispatcher reads that
/// D declares (linked, when_absent, runtime_has_events, numa_node, capturing,
/// h2d_stream) has the
/// shape of its requirement; otherwise one static_assert naming it. (A
/// member read only when present must not be skipped for having the wrong
/// type.)
template <class D>
constexpr bool check_device_options() {
  namespace r = requirement;
  if constexpr (requires { &D::linked; } && !r::linked<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy's optional `linked` must be `static bool linked()` "
                  "(docs/policies/device_policy.md)");
    return false;
  } else if constexpr (requires { &D::when_absent; } && !r::when_absent<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy's optional `when_absent` must be `static constexpr "
                  "std::string_view when_absent` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (requires { &D::runtime_has_events; } && !r::runtime_has_events<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy's optional `runtime_has_events` must be `static bool "
                  "runtime_has_events()` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (requires { &D::numa_node; } && !r::numa_node<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy's optional `numa_node` must be `static int "
                  "numa_node(c10::DeviceIndex) noexcept` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (requires { &D::capturing; } && !r::capturing<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy's optional `capturing` must be `static bool "
                  "capturing(c10::DeviceIndex) noexcept` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (requires { &D::h2d_stream; } && !r::h2d_stream<D>) {
    static_assert(always_false<D>,
                  "offload: the Device policy's optional `h2d_stream` must be `static c10::Stream "
                  "h2d_stream(c10::DeviceIndex)` (docs/policies/device_policy.md)");
    return false;
  } else {
    return true;
  }
}

/// True when S satisfies storage_policy; otherwise one static_assert naming
/// the first missing member.
template <class S>
constexpr bool check_storage_policy() {
  namespace r = requirement;
  if constexpr (!r::name<S>) {
    static_assert(always_false<S>,
                  "offload: the Storage policy does not satisfy offload::storage_policy: it needs "
                  "`static constexpr std::string_view name` (docs/policies/storage_policy.md)");
    return false;
  } else if constexpr (!r::prefers_pinned<S>) {
    static_assert(always_false<S>,
                  "offload: the Storage policy does not satisfy offload::storage_policy: it needs "
                  "`static constexpr bool prefers_pinned` (docs/policies/storage_policy.md)");
    return false;
  } else if constexpr (!r::allocate<S>) {
    static_assert(always_false<S>,
                  "offload: the Storage policy does not satisfy offload::storage_policy: it needs "
                  "`offload::HostBuffer allocate(const offload::HostRequest&)` (docs/policies/storage_policy.md)");
    return false;
  } else {
    static_assert(storage_policy<S>, "offload: detail::check_storage_policy is out of step with storage_policy");
    return true;
  }
}

/// True when S is default-constructible, as Manager(options) and
/// make_manager need (Manager(options, storage) does not); otherwise one
/// static_assert.
template <class S>
constexpr bool check_storage_default() {
  if constexpr (!std::default_initializable<S>) {
    static_assert(always_false<S>,
                  "offload::make_manager: the Storage policy is not default-constructible; make_manager "
                  "constructs it with S{} (construct offload::Manager<Device, Storage, Sync>(options, storage) "
                  "to pass an instance)");
    return false;
  } else {
    return true;
  }
}

/// The second half of check_sync_steps, in the same order: the callbacks
/// about a storage's life (suspend, resume, release and its noexcept) and
/// add_stats; one static_assert naming the first missing one.
template <class St>
constexpr bool check_sync_storage_steps() {
  namespace r = requirement;
  if constexpr (!r::suspend<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_with_steps: its "
                  "State<Device> declares observes_steps and needs `void suspend(const "
                  "offload::Transfer<EntryState>&)` (called before the manager grows a storage; resume() "
                  "follows) (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::resume<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_with_steps: its "
                  "State<Device> declares observes_steps and needs `void resume(const "
                  "offload::Transfer<EntryState>&, const at::Tensor&)` (called after the manager grew a "
                  "storage) (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::add_stats<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_with_steps: its "
                  "State<Device> declares observes_steps and needs `void add_stats(offload::Stats&) const` "
                  "(may add nothing) (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::release<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_with_steps: its "
                  "State<Device> declares observes_steps and needs `void release(const "
                  "offload::Transfer<EntryState>&) noexcept` (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::release_noexcept<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_with_steps: it needs "
                  "`release` to be declared noexcept: it runs when autograd frees a saved tensor "
                  "(docs/policies/sync_policy.md)");
    return false;
  } else {
    return true;
  }
}

/// True when the state St satisfies the step callbacks it declared
/// (sync_state_with_steps); otherwise one static_assert naming the first
/// missing callback.
template <class St>
constexpr bool check_sync_steps() {
  namespace r = requirement;
  if constexpr (!r::end_forward<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_with_steps: its "
                  "State<Device> declares observes_steps and needs `void end_forward()` (called when a "
                  "Scope closes; may do nothing) (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::end_backward<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_with_steps: its "
                  "State<Device> declares observes_steps and needs `void end_backward()` (called when a "
                  "backward pass ends; may do nothing) (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::on_unpack<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_with_steps: its "
                  "State<Device> declares observes_steps and needs `void on_unpack(const "
                  "offload::Transfer<EntryState>&)` (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::on_shared<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_with_steps: its "
                  "State<Device> declares observes_steps and needs `void on_shared(const "
                  "offload::Transfer<EntryState>&, const at::Tensor&)` (called when an unpack is served by "
                  "bytes an earlier unpack brought back; order that consumer after the copy) "
                  "(docs/policies/sync_policy.md)");
    return false;
  } else {
    return check_sync_storage_steps<St>();
  }
}

/// True when the state St has the members a device-memory target reads,
/// as it declared (sync_state_for_target); otherwise one static_assert
/// naming the first missing one.
template <class St>
constexpr bool check_sync_target() {
  namespace r = requirement;
  if constexpr (!r::prefetched_bytes<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_for_target: its "
                  "State<Device> declares serves_target and needs `std::int64_t prefetched_bytes() const "
                  "noexcept` (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::holds_device_bytes<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_for_target: its "
                  "State<Device> declares serves_target and needs `bool holds_device_bytes(const "
                  "offload::Transfer<EntryState>&) const noexcept` (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::set_headroom<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_state_for_target: its "
                  "State<Device> declares serves_target and needs `void set_headroom(std::int64_t) noexcept` "
                  "(docs/policies/sync_policy.md)");
    return false;
  } else {
    return true;
  }
}

/// True when the state St declares serves_target and has its members, or
/// has none of them; otherwise one static_assert.
template <class St>
constexpr bool check_sync_target_declared() {
  namespace r = requirement;
  if constexpr (r::declares_target<St>) {
    return check_sync_target<St>();
  } else if constexpr (r::any_target<St>) {
    static_assert(always_false<St>,
                  "offload: the Sync policy does not satisfy offload::sync_policy_for: its "
                  "State<Device> has a member a device-memory target reads (prefetched_bytes, "
                  "holds_device_bytes or set_headroom) but does not declare `static constexpr bool "
                  "serves_target = true`, so it would never be read (docs/policies/sync_policy.md)");
    return false;
  } else {
    return true;
  }
}

/// True when P satisfies sync_policy_for<P, D> (D already checked);
/// otherwise one static_assert naming the first missing member.
template <class P, class D>
constexpr bool check_sync_members() {
  namespace r = requirement;
  if constexpr (!r::name<P>) {
    static_assert(always_false<P>,
                  "offload: the Sync policy does not satisfy offload::sync_policy_for: it needs "
                  "`static constexpr std::string_view name` (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::needs_events<P>) {
    static_assert(always_false<P>,
                  "offload: the Sync policy does not satisfy offload::sync_policy_for: it needs "
                  "`static constexpr bool needs_events` (docs/policies/sync_policy.md)");
    return false;
  } else if constexpr (!r::state_template<P, D>) {
    static_assert(always_false<P>,
                  "offload: the Sync policy does not satisfy offload::sync_policy_for: it needs "
                  "a member class template `State<Device>` (docs/policies/sync_policy.md)");
    return false;
  } else {
    using St = typename P::template State<D>;
    if constexpr (!r::entry_state<St>) {
      static_assert(always_false<P>,
                    "offload: the Sync policy does not satisfy offload::sync_policy_for: its "
                    "State<Device> needs a default-constructible `EntryState` type, the per-entry "
                    "state (`struct EntryState {};` when there is none) (docs/policies/sync_policy.md)");
      return false;
    } else if constexpr (!r::from_options<St>) {
      static_assert(always_false<P>,
                    "offload: the Sync policy does not satisfy offload::sync_policy_for: its "
                    "State<Device> needs a constructor `State(const offload::Options&)` "
                    "(docs/policies/sync_policy.md)");
      return false;
    } else if constexpr (!r::offloads<St>) {
      static_assert(always_false<P>,
                    "offload: the Sync policy does not satisfy offload::sync_policy_for: its "
                    "State<Device> needs `void offload(const offload::Transfer<EntryState>&, const "
                    "at::Tensor&)` (docs/policies/sync_policy.md)");
      return false;
    } else if constexpr (!r::reloads<St>) {
      static_assert(always_false<P>,
                    "offload: the Sync policy does not satisfy offload::sync_policy_for: its "
                    "State<Device> needs `offload::Reloaded reload(const offload::Transfer<EntryState>&)` "
                    "(docs/policies/sync_policy.md)");
      return false;
    } else if constexpr (!check_sync_target_declared<St>()) {
      return false;
    } else if constexpr (r::declares_steps<St>) {
      if constexpr (!check_sync_steps<St>()) {
        return false;
      } else {
        static_assert(sync_policy_for<P, D>, "offload: detail::check_sync_members is out of step with sync_policy_for");
        return true;
      }
    } else if constexpr (r::any_step<St>) {
      static_assert(always_false<P>,
                    "offload: the Sync policy does not satisfy offload::sync_policy_for: its "
                    "State<Device> has a step callback (end_forward, end_backward, on_unpack, on_shared, "
                    "suspend, resume, add_stats or release) but does not declare `static constexpr bool "
                    "observes_steps = true`, so it would never be called (docs/policies/sync_policy.md)");
      return false;
    } else {
      static_assert(sync_policy_for<P, D>, "offload: detail::check_sync_members is out of step with sync_policy_for");
      return true;
    }
  }
}

/// True when a sync policy that needs events (Y::needs_events) gets a
/// stream_device_policy D; otherwise one static_assert saying what D lacks.
template <class D, class Y>
constexpr bool check_events_for() {
  namespace r = requirement;
  if constexpr (!Y::needs_events) {
    return true;
  } else if constexpr (!r::claims_streams_and_events<D>) {
    static_assert(always_false<D>,
                  "offload: the Sync policy needs streams and events (needs_events) and the "
                  "Device policy has none (has_streams && has_events is false); use "
                  "sync::Blocking, or another sync policy without needs_events, for this device");
    return false;
  } else if constexpr (!r::current_stream<D>) {
    static_assert(always_false<D>,
                  "offload: the Sync policy needs streams and events and the Device policy is no "
                  "offload::stream_device_policy: it needs `static c10::Stream "
                  "current_stream(c10::DeviceIndex)` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!r::side_stream<D>) {
    static_assert(always_false<D>,
                  "offload: the Sync policy needs streams and events and the Device policy is no "
                  "offload::stream_device_policy: it needs `static c10::Stream "
                  "side_stream(c10::DeviceIndex)` (docs/policies/device_policy.md)");
    return false;
  } else if constexpr (!r::record_stream<D>) {
    static_assert(always_false<D>,
                  "offload: the Sync policy needs streams and events and the Device policy is no "
                  "offload::stream_device_policy: it needs `static void record_stream(const "
                  "at::Tensor&, c10::Stream)` (docs/policies/device_policy.md)");
    return false;
  } else {
    static_assert(stream_device_policy<D>,
                  "offload: detail::check_events_for is out of step with stream_device_policy");
    return true;
  }
}

/// All checks of Manager<D, S, Y>, in order; stops at the first failure, so
/// the compiler reports one error.
template <class D, class S, class Y>
constexpr bool check_policies() {
  if constexpr (!check_device_policy<D>()) {
    return false;
  } else if constexpr (!check_device_options<D>()) {
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
