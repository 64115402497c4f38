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

#include <offload/detail/hook_source.hpp>
#include <offload/detail/module_tensors.hpp>
#include <offload/manager.hpp>
#include <offload/manager_interface.hpp>

namespace offload {

class AnyManager;

namespace detail {
/// Wraps a hook source (the dispatcher's wrappers, the pass-through
/// manager, benchmarks' own sources). Throws c10::Error when null.
AnyManager make_any_manager(std::shared_ptr<HookSource> source);
/// The hook source behind a manager (for Scope's implementation).
const std::shared_ptr<HookSource>& source_of(const AnyManager& manager) noexcept;
}  // namespace detail

/// Type-erased handle to any Manager<Device, Storage, Sync> (or to the
/// pass-through manager). Cheap to copy; copies share the manager.
///
/// Thread-safety: as Manager: all members are thread-safe.
class AnyManager {
 public:
  /// Wraps a typed manager (shares its state).
  template <class Device, class Storage, class Sync>
  AnyManager(const Manager<Device, Storage, Sync>& manager)  // NOLINT(google-explicit-constructor)
      : source_(manager.core_) {}

  /// See Manager::stats().
  Stats stats() const { return source_->stats(); }
  /// See Manager::reset_stats().
  void reset_stats() { source_->reset_stats(); }
  /// See Manager::options().
  const Options& options() const noexcept { return source_->options(); }
  /// See Manager::exclude().
  void exclude(at::TensorList tensors) { source_->exclude(tensors); }
  /// See Manager::exclude() (a module's parameters and buffers).
  template <detail::module_or_holder M>
  void exclude(const M& module) {
    exclude(detail::module_tensors(module));
  }
  /// Which policies were chosen, e.g. "Manager<sim, pinned_host, streamed>",
  /// plus what the dispatcher decided ("... [PrivateUse1 backend 'acme']").
  std::string describe() const { return source_->describe(); }
  /// See Manager::make_hooks(); null for the pass-through manager (autograd
  /// then saves the tensor as usual).
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() const { return source_->make_hooks(); }

 private:
  explicit AnyManager(std::shared_ptr<detail::HookSource> source) : source_(std::move(source)) {
    TORCH_CHECK(source_ != nullptr, "offload::AnyManager: source must not be null");
  }
  friend AnyManager detail::make_any_manager(std::shared_ptr<detail::HookSource> source);
  friend const std::shared_ptr<detail::HookSource>& detail::source_of(const AnyManager& manager) noexcept;

  std::shared_ptr<detail::HookSource> source_;
};

inline AnyManager detail::make_any_manager(std::shared_ptr<HookSource> source) { return AnyManager(std::move(source)); }

/// An AnyManager over `manager`, an extension's own ManagerInterface (e.g.
/// hooks that only keep the tensor, for measuring the engine's own cost),
/// usable with Scope. Throws c10::Error when null.
inline AnyManager any_manager_of(std::shared_ptr<ManagerInterface> manager) {
  return detail::make_any_manager(std::move(manager));
}

/// The ManagerInterface behind `manager`: for a binding that installs the
/// hooks itself and opens and closes its own scopes (on_scope_enter,
/// on_scope_exit). Never null.
inline const std::shared_ptr<ManagerInterface>& interface_of(const AnyManager& manager) noexcept {
  return detail::source_of(manager);
}

inline const std::shared_ptr<detail::HookSource>& detail::source_of(const AnyManager& manager) noexcept {
  return manager.source_;
}

}  // namespace offload
