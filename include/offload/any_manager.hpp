// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::AnyManager: a manager whose policies are chosen at run time
/// (what offload::make_manager returns). Usable wherever a Manager is, with
/// the same members.

#include <memory>
#include <string>
#include <utility>

#include <c10/util/Exception.h>

#include <offload/detail/module_tensors.hpp>
#include <offload/fwd.hpp>
#include <offload/manager_interface.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>

namespace offload {

class AnyManager;

/// An AnyManager over `manager`, a ManagerInterface of its own (the
/// dispatcher's wrappers, the pass-through manager, an extension's hooks,
/// e.g. hooks that only keep the tensor, for measuring the engine's own
/// cost), usable with Scope. Throws c10::Error when null.
inline AnyManager any_manager_of(std::shared_ptr<ManagerInterface> manager);

/// The ManagerInterface behind `manager`: for Scope, and for a binding that
/// installs the hooks itself and opens and closes its own scopes
/// (on_scope_enter, on_scope_exit). Never null.
inline const std::shared_ptr<ManagerInterface>& interface_of(const AnyManager& manager) noexcept;

/// Type-erased handle to any Manager<Device, Storage, Sync> (or to the
/// pass-through manager). Cheap to copy; copies share the manager.
///
/// Thread-safety: as Manager: all members are thread-safe.
class AnyManager {
 public:
  /// Wraps a typed manager (shares its state; include <offload/manager.hpp>).
  template <class Device, class Storage, class Sync>
  AnyManager(const Manager<Device, Storage, Sync>& manager)  // NOLINT(google-explicit-constructor)
      : manager_(manager.core_) {}

  /// See Manager::stats().
  Stats stats() const { return manager_->stats(); }
  /// See Manager::reset_stats().
  void reset_stats() { manager_->reset_stats(); }
  /// See Manager::options().
  const Options& options() const noexcept { return manager_->options(); }
  /// See Manager::exclude().
  void exclude(at::TensorList tensors) { manager_->exclude(tensors); }
  /// See Manager::exclude() (a module's parameters and buffers).
  template <detail::module_or_holder M>
  void exclude(const M& module) {
    exclude(detail::module_tensors(module));
  }
  /// Which policies were chosen, e.g. "Manager<sim, pinned_host, streamed>",
  /// plus what the dispatcher decided ("... [PrivateUse1 backend 'acme']").
  std::string describe() const { return manager_->describe(); }
  /// See Manager::make_hooks(); null for the pass-through manager (autograd
  /// then saves the tensor as usual).
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() const { return manager_->make_hooks(); }

 private:
  explicit AnyManager(std::shared_ptr<ManagerInterface> manager) : manager_(std::move(manager)) {
    TORCH_CHECK(manager_ != nullptr, "offload::AnyManager: the manager must not be null");
  }
  friend AnyManager any_manager_of(std::shared_ptr<ManagerInterface> manager);
  friend const std::shared_ptr<ManagerInterface>& interface_of(const AnyManager& manager) noexcept;

  std::shared_ptr<ManagerInterface> manager_;
};

inline AnyManager any_manager_of(std::shared_ptr<ManagerInterface> manager) { return AnyManager(std::move(manager)); }

inline const std::shared_ptr<ManagerInterface>& interface_of(const AnyManager& manager) noexcept {
  return manager.manager_;
}

}  // namespace offload
