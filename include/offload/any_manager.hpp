// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::AnyManager: a manager whose policies are chosen at run time
/// (what offload::make_manager returns). Usable wherever a Manager is.

#include <memory>
#include <string>
#include <utility>

#include <offload/manager.hpp>

namespace offload {

/// Type-erased handle to any Manager<Device, Storage, Sync> (or to the
/// pass-through manager). Cheap to copy; copies share the manager.
///
/// Thread-safety: as Manager: all members are thread-safe.
class AnyManager {
 public:
  /// Wraps a typed manager (shares its state).
  template <class Device, class Storage, class Sync>
  AnyManager(const Manager<Device, Storage, Sync>& manager)  // NOLINT(google-explicit-constructor)
      : source_(manager.hook_source()) {}
  /// Wraps a hook source directly (for dispatchers and custom managers).
  /// Throws c10::Error when `source` is null.
  explicit AnyManager(std::shared_ptr<detail::HookSource> source) : source_(std::move(source)) {
    TORCH_CHECK(source_ != nullptr, "offload::AnyManager: source must not be null");
  }

  /// See Manager::stats().
  Stats stats() const { return source_->stats(); }
  /// See Manager::reset_stats().
  void reset_stats() { source_->reset_stats(); }
  /// See Manager::exclude().
  void exclude(at::TensorList tensors) { source_->exclude(tensors); }
  /// See Manager::options().
  const Options& options() const noexcept { return source_->options(); }
  /// Which policies were chosen, e.g. "Manager<sim, pinned_host, streamed>".
  std::string describe() const { return source_->describe(); }
  /// For offload::Scope.
  std::shared_ptr<detail::HookSource> hook_source() const noexcept { return source_; }

 private:
  std::shared_ptr<detail::HookSource> source_;
};

}  // namespace offload
