// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The three policy axes of offload::Manager as C++20 concepts.
/// docs/policies/*.md states each concept's laws and lists the models.

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

namespace offload {

namespace detail {
template <bool B>
using constant_bool = std::bool_constant<B>;
}  // namespace detail

/// A device policy names one accelerator type and supplies its stream,
/// event and memory primitives as static members (it holds no state).
template <class P>
concept device_policy = requires(c10::DeviceIndex index, c10::Stream stream, const at::Tensor& t) {
  { P::device_type } -> std::convertible_to<c10::DeviceType>;
  { P::name } -> std::convertible_to<std::string_view>;
  typename detail::constant_bool<P::has_streams>;
  typename detail::constant_bool<P::has_events>;
  typename detail::constant_bool<P::has_pinned_host>;
  typename detail::constant_bool<P::has_memory_stats>;
  { P::available() } -> std::same_as<bool>;
  { P::current_stream(index) } -> std::same_as<c10::Stream>;
  { P::side_stream(index) } -> std::same_as<c10::Stream>;
  { P::record_stream(t, stream) } -> std::same_as<void>;
  { P::memory_allocated(index) } -> std::same_as<std::int64_t>;
  { P::empty_cache() } -> std::same_as<void>;
};

/// A storage policy allocates the host buffers offloaded tensors live in.
template <class P>
concept storage_policy =
    std::default_initializable<P> &&
    requires(P& p, std::int64_t nbytes, c10::DeviceType type, const Options& options) {
      { P::name } -> std::convertible_to<std::string_view>;
      typename detail::constant_bool<P::prefers_pinned>;
      { p.allocate(nbytes, type, options) } -> std::same_as<HostBuffer>;
    };

/// A sync policy decides when copies run and who waits for what. It is a
/// tag with a per-manager State template instantiated for a device and a
/// storage policy.
template <class P, class Device, class Storage>
concept sync_policy_for =
    device_policy<Device> && storage_policy<Storage> &&
    requires { { P::name } -> std::convertible_to<std::string_view>; } &&
    requires { typename detail::constant_bool<P::needs_events>; } &&
    requires(typename P::template State<Device, Storage>& state, const std::shared_ptr<Entry>& entry,
             const at::Tensor& device_bytes, const Options& options, Storage& storage) {
      typename P::template State<Device, Storage>;
      requires std::constructible_from<typename P::template State<Device, Storage>, const Options&,
                                       Storage&>;
      { state.offload(entry, device_bytes) } -> std::same_as<void>;
      { state.reload(entry) } -> std::same_as<at::Tensor>;
      { state.on_unpack(entry) } -> std::same_as<void>;
      { state.release(*entry) } -> std::same_as<void>;
    };

/// Device, storage and sync policies that can be composed into a Manager:
/// each satisfies its concept and the sync policy's needs are met (e.g. a
/// sync policy that needs events gets a device policy that has them).
template <class Device, class Storage, class Sync>
concept composable = sync_policy_for<Sync, Device, Storage> &&
                     (!Sync::needs_events || (Device::has_events && Device::has_streams));

}  // namespace offload
