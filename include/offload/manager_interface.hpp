// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::ManagerInterface: the type-erased manager behind AnyManager and
/// Scope, for extensions: a binding that installs saved-tensor hooks itself
/// (Python's saved_tensors_hooks), a benchmark's own hooks, a wrapper that
/// adds to describe(). Implemented by every Manager<Device, Storage, Sync>,
/// the dispatcher's wrappers and the pass-through manager.

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/TensorBody.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <offload/options.hpp>
#include <offload/stats.hpp>

namespace offload {

class BlockPlanner;  // <offload/block_plan.hpp>

/// What a manager had seen when a Scope opened (see
/// ManagerInterface::on_scope_enter); handed back at on_scope_exit.
struct ScopeMark {
  std::int64_t saved = 0;      ///< defined saved tensors given to the pack hook
  std::int64_t on_device = 0;  ///< of them, on the manager's device type
};

/// Why a saved tensor stays where it is, when the code that installs the
/// hooks knows it before the manager looks (ManagerInterface::pack_passing):
/// a binding that recognises parameters by their type (Python's
/// `nn.Parameter`), a tensor subclass it cannot see into, or a type the
/// user excluded. Counted in Stats::passed_leaf, passed_subclass and
/// passed_excluded.
enum class PassReason { parameter, subclass, excluded };

/// Hooks that keep the saved tensor where it is, as autograd keeps one
/// without hooks (a saved input as itself; a saved output as its data
/// without its autograd history, same storage and version counter, so a
/// graph dropped without backward is freed: detail::KeptTensor), and at
/// unpack raise autograd's in-place error (the same message) when it was
/// modified in place since it was saved: for a binding that must hand its
/// engine a hooks object for every saved tensor, also those no manager
/// takes (a pass-through manager's make_hooks() returns null, an opt-out
/// region). Defined in liboffload.
std::unique_ptr<torch::autograd::SavedVariableHooks> make_plain_hooks();

/// What an active Scope hands the autograd engine: one hooks object per
/// saved tensor, and the manager operations AnyManager forwards.
///
/// Thread-safety: every member may be called from any thread.
class ManagerInterface {
 public:
  virtual ~ManagerInterface() = default;
  /// A fresh hooks object bound to this manager (kept alive by it); null
  /// when this manager offloads nothing (autograd then saves as usual).
  virtual std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() = 0;
  /// A fresh hooks object that has packed `tensor` as it is (what
  /// make_plain_hooks() keeps), for a saved tensor the caller knows stays
  /// where it is; a manager counts it under `why` (or, when `tensor` is not
  /// on its device type, as another device's). Thread-safe.
  virtual std::unique_ptr<torch::autograd::SavedVariableHooks> pack_passing(const at::Tensor& tensor,
                                                                            PassReason /*why*/) {
    auto hooks = make_plain_hooks();
    hooks->call_pack_hook(tensor);
    return hooks;
  }
  /// Short description for errors and logs, e.g. "Manager<sim, pinned_host, blocking>".
  virtual std::string describe() const = 0;
  /// The manager operations AnyManager forwards (see Manager for each).
  virtual Stats stats() const = 0;
  virtual void reset_stats() = 0;
  virtual void exclude(at::TensorList tensors) = 0;
  virtual const Options& options() const noexcept = 0;
  /// Called when a scope using this manager opens (a Scope, or a binding's
  /// own `with`); the mark is handed back to on_scope_exit.
  virtual ScopeMark on_scope_enter() noexcept { return {}; }
  /// Called when that scope closes on its thread (the end of a forward
  /// pass, typically): asynchronous policies release what they hold on the
  /// device for the forward stash (sync policies' end_forward), and the
  /// manager warns (once) about mistakes it can see. `in_order` is false
  /// when a scope opened later on the same thread was still open. Must not
  /// throw.
  virtual void on_scope_exit(const ScopeMark& /*opened*/, bool /*in_order*/) noexcept {}
  /// The automatic plan of this manager's planned blocks
  /// (CheckpointOptions::planned): present when the manager has a
  /// device-memory target; null otherwise (planned blocks then run as is
  /// inside its scope, their saved tensors offloaded as any).
  virtual std::shared_ptr<BlockPlanner> block_planner() { return nullptr; }
};

}  // namespace offload
