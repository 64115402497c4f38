// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The three policy axes of offload::Manager as C++20 concepts, and the
/// refinements some users need. docs/policies/*.md states each concept's
/// laws, opens with a minimal complete model and lists the shipped ones.
///
/// Each requirement is one named concept in offload::requirement; the
/// policy concepts are their conjunctions, and the diagnostics behind
/// Manager (detail/checks.hpp) test the same names one by one, so that a
/// policy that fails gets one error naming the first missing member.

#include <concepts>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <offload/buffers.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>
#include <offload/transfer.hpp>

namespace offload {

/// The single requirements the policy concepts are made of.
namespace requirement {

template <bool B>
using constant_bool = std::bool_constant<B>;

// ---- any policy
template <class P>
concept name = requires {
  { P::name } -> std::convertible_to<std::string_view>;
};

// ---- device_policy
template <class P>
concept device_type = requires {
  { P::device_type } -> std::convertible_to<c10::DeviceType>;
};
template <class P>
concept has_streams = requires { typename constant_bool<P::has_streams>; };
template <class P>
concept has_events = requires { typename constant_bool<P::has_events>; };
template <class P>
concept available = requires {
  { P::available() } -> std::same_as<bool>;
};

/// Optional: the host NUMA node nearest device `index` (-1 unknown), cheap
/// enough to call per offloaded tensor; the manager passes it to the
/// storage policy in HostRequest::numa_node.
template <class P>
concept numa_node = requires(c10::DeviceIndex index) {
  { P::numa_node(index) } noexcept -> std::same_as<int>;
};

/// Optional: a stream for host-to-device copies of device `index`, apart
/// from side_stream (which then carries device-to-host copies alone), at
/// high priority: the two directions can use separate copy engines, and
/// backward's copies, which compute waits on, go first. sync::Streamed
/// orders each such copy after the device-to-host copy that filled its host
/// buffer. Without it both directions share side_stream.
template <class P>
concept h2d_stream = requires(c10::DeviceIndex index) {
  { P::h2d_stream(index) } -> std::same_as<c10::Stream>;
};

/// Optional: whether the current stream of device `index` on the calling
/// thread is capturing a graph (CUDA graphs): the manager then offloads
/// nothing (Stats::passed_capture) and refuses to bring an offloaded
/// tensor back (<offload/capture.hpp>).
template <class P>
concept capturing = requires(c10::DeviceIndex index) {
  { P::capturing(index) } noexcept -> std::same_as<bool>;
};

// ---- stream_device_policy
template <class P>
concept claims_streams_and_events = P::has_streams && P::has_events;
template <class P>
concept current_stream = requires(c10::DeviceIndex index) {
  { P::current_stream(index) } -> std::same_as<c10::Stream>;
};
template <class P>
concept side_stream = requires(c10::DeviceIndex index) {
  { P::side_stream(index) } -> std::same_as<c10::Stream>;
};
template <class P>
concept record_stream = requires(const at::Tensor& t, c10::Stream stream) {
  { P::record_stream(t, stream) } -> std::same_as<void>;
};

// ---- memory_stats_device_policy
template <class P>
concept memory_allocated = requires(c10::DeviceIndex index) {
  { P::memory_allocated(index) } -> std::same_as<std::int64_t>;
};
template <class P>
concept empty_cache = requires {
  { P::empty_cache() } -> std::same_as<void>;
};

// ---- the optional members of a device policy the dispatcher reads
template <class P>
concept linked = requires {
  { P::linked() } -> std::same_as<bool>;
};
template <class P>
concept when_absent = requires {
  { P::when_absent } -> std::convertible_to<std::string_view>;
};
template <class P>
concept runtime_has_events = requires {
  { P::runtime_has_events() } -> std::same_as<bool>;
};

// ---- storage_policy
template <class P>
concept prefers_pinned = requires { typename constant_bool<P::prefers_pinned>; };
template <class P>
concept allocate = requires(P& p, const HostRequest& request) {
  { p.allocate(request) } -> std::same_as<HostBuffer>;
};
template <class P>
concept reserved_for = requires(const P& p, const HostRequest& request) {
  { p.reserved_for(request) } -> std::same_as<std::int64_t>;
};

// ---- sync_policy_for: the tag
template <class P>
concept needs_events = requires { typename constant_bool<P::needs_events>; };
template <class P, class Device>
concept state_template = requires { typename P::template State<Device>; };

// ---- sync_state: the per-manager state (S), its two copies
template <class S>
concept entry_state = requires { typename S::EntryState; } && std::default_initializable<typename S::EntryState>;
template <class S>
concept from_options = std::constructible_from<S, const Options&>;
template <class S>
concept offloads = requires(S& state, const Transfer<typename S::EntryState>& t, const at::Tensor& device_bytes) {
  { state.offload(t, device_bytes) } -> std::same_as<void>;
};
template <class S>
concept reloads = requires(S& state, const Transfer<typename S::EntryState>& t) {
  { state.reload(t) } -> std::same_as<Reloaded>;
};

// ---- sync_state_with_steps: the step callbacks a state opts into
template <class S>
concept declares_steps = requires { typename constant_bool<S::observes_steps>; } && S::observes_steps;
template <class S>
concept end_forward = requires(S& state) {
  { state.end_forward() } -> std::same_as<void>;
};
template <class S>
concept end_backward = requires(S& state) {
  { state.end_backward() } -> std::same_as<void>;
};
template <class S>
concept on_unpack = requires(S& state, const Transfer<typename S::EntryState>& t) {
  { state.on_unpack(t) } -> std::same_as<void>;
};
template <class S>
concept on_shared = requires(S& state, const Transfer<typename S::EntryState>& t, const at::Tensor& device_bytes) {
  { state.on_shared(t, device_bytes) } -> std::same_as<void>;
};
template <class S>
concept suspend = requires(S& state, const Transfer<typename S::EntryState>& t) {
  { state.suspend(t) } -> std::same_as<void>;
};
template <class S>
concept resume = requires(S& state, const Transfer<typename S::EntryState>& t, const at::Tensor& device_bytes) {
  { state.resume(t, device_bytes) } -> std::same_as<void>;
};
template <class S>
concept add_stats = requires(const S& state, Stats& stats) {
  { state.add_stats(stats) } -> std::same_as<void>;
};
template <class S>
concept release = requires(S& state, const Transfer<typename S::EntryState>& t) {
  { state.release(t) } -> std::same_as<void>;
};
template <class S>
concept release_noexcept = requires(S& state, const Transfer<typename S::EntryState>& t) {
  { state.release(t) } noexcept;
};
/// A state that has any step callback (so it must declare observes_steps,
/// or the callbacks would never be called).
template <class S>
concept any_step = end_forward<S> || end_backward<S> || on_unpack<S> || on_shared<S> || suspend<S> || resume<S> ||
                   add_stats<S> || release<S>;

// ---- sync_state_for_target: what a device-memory target reads from a state
template <class S>
concept declares_target = requires { typename constant_bool<S::serves_target>; } && S::serves_target;
template <class S>
concept prefetched_bytes = requires(const S& state) {
  { state.prefetched_bytes() } noexcept -> std::same_as<std::int64_t>;
};
template <class S>
concept holds_device_bytes = requires(const S& state, const Transfer<typename S::EntryState>& t) {
  { state.holds_device_bytes(t) } noexcept -> std::same_as<bool>;
};
template <class S>
concept set_headroom = requires(S& state, std::int64_t bytes) {
  { state.set_headroom(bytes) } noexcept -> std::same_as<void>;
};
/// A state that has any member a target reads (so it must declare
/// serves_target, or the target would never read it).
template <class S>
concept any_target = prefetched_bytes<S> || holds_device_bytes<S> || set_headroom<S>;

}  // namespace requirement

/// A device policy names one accelerator type and states what it can do:
/// the members the manager and the dispatcher call, as static members (it
/// holds no state). Optional members (docs/policies/device_policy.md) are
/// checked where they are read: one of the right name and the wrong shape
/// stops the build (detail::check_device_options).
template <class P>
concept device_policy = requirement::device_type<P> && requirement::name<P> && requirement::has_streams<P> &&
                        requirement::has_events<P> && requirement::available<P>;

/// A device policy with side streams and events: it claims both
/// (`has_streams && has_events`) and supplies the stream members that
/// asynchronous sync policies (sync::Streamed) call. Events themselves are
/// c10::Event of P::device_type.
template <class P>
concept stream_device_policy =
    device_policy<P> && requirement::claims_streams_and_events<P> && requirement::current_stream<P> &&
    requirement::side_stream<P> && requirement::record_stream<P>;

/// A device policy that reports device-memory statistics (used by tests,
/// the demo and the benchmarks, and by a manager with
/// Options::device_target_bytes: memory_allocated(), and memory_peak(index)
/// where the policy has it).
template <class P>
concept memory_stats_device_policy =
    device_policy<P> && requirement::memory_allocated<P> && requirement::empty_cache<P>;

/// A storage policy allocates the host buffers offloaded tensors live in:
/// `HostBuffer allocate(const HostRequest&)`, told the bytes, the device
/// and whether pinned memory is wanted, nothing more of the Options.
/// Manager(options, storage) takes an instance; Manager(options) and
/// make_manager default-construct one.
template <class P>
concept storage_policy = requirement::name<P> && requirement::prefers_pinned<P> && requirement::allocate<P>;

/// A storage policy that says, before allocating, how many host bytes a
/// request will set aside (`std::int64_t reserved_for(const HostRequest&)
/// const`): Options::host_budget_bytes is checked against it. Without it
/// the manager assumes the request's size; either way it checks again with
/// the buffer's HostBuffer::reserved.
template <class P>
concept reserving_storage_policy = storage_policy<P> && requirement::reserved_for<P>;

/// The per-manager state of a sync policy, instantiated for one device
/// policy: constructed from the manager's Options, it copies one storage
/// to the host (offload) and back (reload), each through the
/// offload::Transfer handle the manager gives it. A state that declares
/// `observes_steps` is also told of step boundaries: see
/// sync_state_with_steps; a state with a step callback that does not
/// declare it fails (the callback would never be called).
template <class S>
concept sync_state =
    requirement::from_options<S> && requirement::entry_state<S> && requirement::offloads<S> &&
    requirement::reloads<S> &&
    (requirement::declares_steps<S>
         ? (requirement::end_forward<S> && requirement::end_backward<S> && requirement::on_unpack<S> &&
            requirement::on_shared<S> && requirement::suspend<S> && requirement::resume<S> &&
            requirement::add_stats<S> && requirement::release<S> && requirement::release_noexcept<S>)
         : !requirement::any_step<S>) &&
    (requirement::declares_target<S>
         ? (requirement::prefetched_bytes<S> && requirement::holds_device_bytes<S> && requirement::set_headroom<S>)
         : !requirement::any_target<S>);

/// A sync_state that opted into the step callbacks
/// (`static constexpr bool observes_steps = true`): every one of them is
/// then required, so a misspelt one fails to compile instead of being
/// skipped.
template <class S>
concept sync_state_with_steps = sync_state<S> && requirement::declares_steps<S>;

/// A sync_state that holds device memory of offloaded storages (a forward
/// stash, buffers brought back ahead of need) and so tells a
/// device-memory target (Options::device_target_bytes) about it. It
/// declares `static constexpr bool serves_target = true` and then has all
/// three members, each noexcept:
/// - `std::int64_t prefetched_bytes() const`: device bytes brought back
///   ahead of need and not used yet (the plan leaves them out of what it
///   measured in backward);
/// - `bool holds_device_bytes(const Transfer<EntryState>&) const`: whether
///   it still holds a reference to that storage's device memory (the plan
///   then tells the model's own references from the policy's);
/// - `void set_headroom(std::int64_t bytes)`: device memory free for
///   prefetching now under the target.
/// A misspelt member fails to compile instead of being skipped; one
/// defined without the declaration fails too. Without it a target counts
/// nothing prefetched or held by the policy.
template <class S>
concept sync_state_for_target = sync_state<S> && requirement::declares_target<S>;

/// A sync policy decides when copies run and who waits for what. It is a
/// tag naming itself, saying whether it needs streams and events, with a
/// per-manager `State<Device>` satisfying sync_state.
template <class P, class Device>
concept sync_policy_for = device_policy<Device> && requirement::name<P> && requirement::needs_events<P> &&
                          requirement::state_template<P, Device> && sync_state<typename P::template State<Device>>;

/// Device, storage and sync policies that can be composed into a Manager:
/// each satisfies its concept and the sync policy's needs are met (a sync
/// policy that needs events gets a stream_device_policy).
template <class Device, class Storage, class Sync>
concept composable =
    storage_policy<Storage> && sync_policy_for<Sync, Device> && (!Sync::needs_events || stream_device_policy<Device>);

}  // namespace offload
