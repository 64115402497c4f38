// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::Manager<Device, Storage, Sync>: decides which saved tensors
/// leave the device, keeps their host copies, and brings them back. Names
/// no concrete policy: pick them from <offload/device/...>,
/// <offload/storage/...>, <offload/sync/...> (or <offload/offload.hpp>).

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <offload/concepts.hpp>
#include <offload/detail/checks.hpp>
#include <offload/detail/core.hpp>
#include <offload/detail/module_tensors.hpp>
#include <offload/detail/null_manager.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>

namespace offload {

class AnyManager;

namespace detail {
/// Stands in for Core when the policies failed their checks, so that the
/// one static_assert that names the failing member is the only error.
class InvalidCore final : public NullManager {
 public:
  template <class... A>
  explicit InvalidCore(A&&... /*unused*/) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override { return nullptr; }
};
}  // namespace detail

/// An offload manager: while an offload::Scope holding it is open on a
/// thread, every tensor autograd saves on that thread goes through it.
///
/// - Device: which accelerator's tensors it offloads (offload::device_policy).
/// - Storage: where they live meanwhile (offload::storage_policy).
/// - Sync: when copies run and who waits (offload::sync_policy_for).
///
/// A policy that does not satisfy its concept stops the build with one
/// static_assert naming the concept and the missing member.
///
/// A saved tensor is offloaded when it is on Device's device type, strided,
/// has a storage of its own (not a wrapper, functional or batched tensor),
/// is not a parameter (a leaf that requires grad, or a view of one; frozen
/// parameters: exclude(module)), not registered with exclude(), and its
/// storage has at least Options::min_offload_bytes bytes. Everything else
/// autograd saves is an activation, also what a `torch.compile` region or a
/// custom autograd Function saves (leaves computed with grad mode off). Only the bytes of
/// the storage that saved views read are copied (a narrow of the last
/// dimension moves its elements, not the storage), each byte once per step
/// however many views of it are saved; each view comes back with its own
/// dtype, sizes, strides and storage offset, on the device (type and index)
/// it came from, and views of one storage share one device buffer in
/// backward. Tensors that stay where they are (other device, layout,
/// parameter, small, excluded) are decided without taking the manager's lock.
///
/// The Manager is a cheap handle (shared state); copies share it. Saved
/// tensors keep the state alive, so backward may run after the Manager and
/// the Scope are gone. It converts to offload::AnyManager (same members).
///
/// Thread-safety: all members are thread-safe; packs from forward threads
/// and unpacks from the autograd engine's device threads may interleave.
template <class Device, class Storage, class Sync>
class Manager {
  static constexpr bool valid_ = detail::check_policies<Device, Storage, Sync>();
  using Core = std::conditional_t<valid_, detail::Core<Device, Storage, Sync>, detail::InvalidCore>;

 public:
  using device_policy_type = Device;
  using storage_policy_type = Storage;
  using sync_policy_type = Sync;

  /// Validates `options` (throws c10::ValueError naming the field, its value
  /// and the accepted range) before anything is created.
  explicit Manager(const Options& options = {}, Storage storage = {})
      : core_((options.validate(), std::make_shared<Core>(options, std::move(storage)))) {}

  /// A snapshot of the counters. Thread-safe.
  Stats stats() const { return core_->stats(); }
  /// Zeroes the counters (host bytes in use are kept). Thread-safe.
  void reset_stats() { core_->reset_stats(); }
  /// The validated options.
  const Options& options() const noexcept { return core_->options(); }
  /// Never offload tensors that share storage with any of `tensors` (e.g.
  /// frozen parameters, buffers, caches the model holds); undefined tensors
  /// and those without storage are skipped. Parameters that require grad
  /// (leaves and their views) are never offloaded anyway. Thread-safe.
  void exclude(at::TensorList tensors) { core_->exclude(tensors); }
  /// Never offload the parameters (trainable and frozen) and buffers of
  /// `module` and its submodules: a torch::nn::Module, a ModuleHolder
  /// (`manager.exclude(model)` for `Net model;`) or a shared_ptr to a module.
  /// Parameters and buffers registered later are not covered. Thread-safe.
  template <detail::module_or_holder M>
  void exclude(const M& module) {
    exclude(detail::module_tensors(module));
  }
  /// Which policies this manager uses, e.g. "Manager<sim, pinned_host, streamed>".
  std::string describe() const { return core_->describe(); }
  /// A fresh saved-tensor hooks object bound to this manager: what a Scope
  /// hands autograd for each saved tensor, for code that installs hooks
  /// itself (e.g. a binding to Python's saved_tensors_hooks). The hooks
  /// keep the manager's state alive. Thread-safe.
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() const { return core_->make_hooks(); }

 private:
  friend class AnyManager;
  std::shared_ptr<Core> core_;
};

}  // namespace offload
