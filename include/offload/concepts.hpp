// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The three policy axes of offload::Manager as C++20 concepts, and the
/// refinements some users need. docs/policies/*.md states each concept's
/// laws, opens with a minimal complete model and lists the shipped ones.

#include <concepts>
#include <cstdint>
#include <memory>
#include <string_view>
#include <type_traits>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <offload/entry.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>

namespace offload {

namespace detail {
template <bool B>
using constant_bool = std::bool_constant<B>;
}  // namespace detail

/// A device policy names one accelerator type and states what it can do:
/// the members the manager and the dispatcher call, as static members (it
/// holds no state).
template <class P>
concept device_policy = requires {
  { P::device_type } -> std::convertible_to<c10::DeviceType>;
  { P::name } -> std::convertible_to<std::string_view>;
  typename detail::constant_bool<P::has_streams>;
  typename detail::constant_bool<P::has_events>;
  { P::available() } -> std::same_as<bool>;
};

/// A device policy with side streams and events: it claims both
/// (`has_streams && has_events`) and supplies the stream members that
/// asynchronous sync policies (sync::Streamed) call. Events themselves are
/// c10::Event of P::device_type.
template <class P>
concept stream_device_policy = device_policy<P> && P::has_streams && P::has_events &&
    requires(c10::DeviceIndex index, c10::Stream stream, const at::Tensor& t) {
  { P::current_stream(index) } -> std::same_as<c10::Stream>;
  { P::side_stream(index) } -> std::same_as<c10::Stream>;
  { P::record_stream(t, stream) } -> std::same_as<void>;
};

/// A device policy that reports device-memory statistics (used by tests,
/// the demo and the benchmarks, and by a manager with
/// Options::device_target_bytes: memory_allocated(), and memory_peak(index)
/// where the policy has it).
template <class P>
concept memory_stats_device_policy = device_policy<P> && requires(c10::DeviceIndex index) {
  { P::memory_allocated(index) } -> std::same_as<std::int64_t>;
  { P::empty_cache() } -> std::same_as<void>;
};

/// A storage policy allocates the host buffers offloaded tensors live in.
template <class P>
concept storage_policy = std::default_initializable<P> &&
    requires(P& p, std::int64_t nbytes, c10::DeviceType type, const Options& options) {
  { P::name } -> std::convertible_to<std::string_view>;
  typename detail::constant_bool<P::prefers_pinned>;
  { p.allocate(nbytes, type, options) } -> std::same_as<HostBuffer>;
};

/// The per-manager state of a sync policy, instantiated for one device
/// policy: constructed from the manager's Options, it copies one entry's
/// bytes to its host buffer and back, and is told of every step boundary.
/// Every member is required (a no-op where a policy has nothing to do), so
/// a misspelt one fails to compile instead of being skipped.
template <class S>
concept sync_state = std::constructible_from<S, const Options&> && std::default_initializable<typename S::EntryState> &&
    requires(S& state, const S& cstate, const std::shared_ptr<Entry<typename S::EntryState>>& entry,
             const at::Tensor& device_bytes, Stats& stats) {
  { state.offload(entry, device_bytes) } -> std::same_as<void>;
  { state.reload(entry) } -> std::same_as<Reloaded>;
  { state.on_unpack(entry) } -> std::same_as<void>;
  { state.settle() } -> std::same_as<void>;
  { state.end_backward() } -> std::same_as<void>;
  { state.resume(entry) } -> std::same_as<void>;
  { cstate.add_stats(stats) } -> std::same_as<void>;
  { state.release(*entry) }
  noexcept->std::same_as<void>;
};

/// A sync policy decides when copies run and who waits for what. It is a
/// tag naming itself, saying whether it needs streams and events, with a
/// per-manager `State<Device>` satisfying sync_state.
template <class P, class Device>
concept sync_policy_for = device_policy<Device> && requires {
  { P::name } -> std::convertible_to<std::string_view>;
  typename detail::constant_bool<P::needs_events>;
  typename P::template State<Device>;
} && sync_state<typename P::template State<Device>>;

/// Device, storage and sync policies that can be composed into a Manager:
/// each satisfies its concept and the sync policy's needs are met (a sync
/// policy that needs events gets a stream_device_policy).
template <class Device, class Storage, class Sync>
concept composable = storage_policy<Storage> && sync_policy_for<Sync, Device> &&
    (!Sync::needs_events || stream_device_policy<Device>);

}  // namespace offload
