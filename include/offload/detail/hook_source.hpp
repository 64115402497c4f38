// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// detail::HookSource: what every manager implementation gives a Scope and
/// AnyManager (the type-erased interface of Manager<...>'s shared state,
/// the dispatcher's wrappers and the pass-through manager).

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/TensorBody.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <offload/options.hpp>
#include <offload/stats.hpp>

namespace offload::detail {

/// What a manager had seen when a Scope opened (see HookSource::on_scope_enter).
struct ScopeMark {
  std::int64_t saved = 0;      ///< defined saved tensors given to the pack hook
  std::int64_t on_device = 0;  ///< of them, on the manager's device type
};

/// What an active Scope hands the autograd engine: one hooks object per
/// saved tensor. Implemented by every manager core.
class HookSource {
 public:
  virtual ~HookSource() = default;
  /// A fresh hooks object bound to this source (kept alive by it); null
  /// when this source offloads nothing (autograd then saves as usual).
  virtual std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() = 0;
  /// Short description for errors and logs, e.g. "Manager<sim, pinned_host, blocking>".
  virtual std::string describe() const = 0;
  /// The manager operations AnyManager forwards (see Manager for each).
  virtual Stats stats() const = 0;
  virtual void reset_stats() = 0;
  virtual void exclude(at::TensorList tensors) = 0;
  virtual const Options& options() const noexcept = 0;
  /// Called when a Scope using this source opens; the mark is handed back
  /// to on_scope_exit.
  virtual ScopeMark on_scope_enter() noexcept { return {}; }
  /// Called when that Scope closes on its thread (the end of a forward
  /// pass, typically): asynchronous policies settle what they hold on the
  /// device for the forward stash, and the manager warns (once) about
  /// mistakes it can see. `in_order` is false when a scope opened later on
  /// the same thread was still open. Must not throw.
  virtual void on_scope_exit(const ScopeMark& /*opened*/, bool /*in_order*/) noexcept {}
};

}  // namespace offload::detail
