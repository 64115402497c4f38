// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::checkpoint: activation checkpointing for LibTorch. A block run
/// through it keeps only its inputs for backward and is run again in
/// backward to rebuild what its own nodes saved (non-reentrant semantics, as
/// torch.utils.checkpoint(use_reentrant=False)). Inside an open Scope the
/// inputs go through that scope's manager (offloaded, prefetched back ahead
/// of the recomputation); what the recomputation saves stays on the device
/// for the one block. docs/checkpoint.md has the laws and errors.

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace offload {

/// Settings of one checkpointed block. Plain data.
struct CheckpointOptions {
  /// Names the block in errors ("offload::checkpoint: block 'layer3': ...");
  /// empty: "checkpoint".
  std::string name;
  /// Restore, for the recomputation, the state of the default generator of
  /// the CPU and of every device an input is on (dropout then draws the same
  /// mask). false: the recomputation draws fresh numbers (gradients differ
  /// when the block is random).
  bool preserve_rng_state = true;
  /// Stop the recomputation once it saved as many tensors as the forward
  /// did (the rest of the block is not run again).
  bool early_stop = true;
  /// State the block updates in place when it runs (BatchNorm's
  /// running_mean, running_var and num_batches_tracked in training mode,
  /// any buffer a forward writes): the recomputation sees these tensors as
  /// the forward saw them, and afterwards they hold again what they held
  /// before it, so recomputing changes no state (evaluation after training
  /// is bitwise that of the run without checkpoint). Neither write counts
  /// as an in-place change for autograd's check. checkpoint_forward() adds
  /// the module's buffers. Costs one copy of each tensor at forward, kept
  /// until the block's saved tensors are released, and two at the
  /// recomputation. Undefined entries are skipped; an entry that requires
  /// grad (a parameter) is c10::ValueError at forward.
  std::vector<at::Tensor> state = {};
  /// Let the automatic plan decide (docs/guide.md, "Keep, offload or
  /// recompute"): inside the Scope of a manager with
  /// Options::device_target_bytes, each step the manager chooses whether
  /// this block is kept (run as is, its saved tensors left on the device),
  /// offloaded (run as is, its saved tensors through the manager) or
  /// recomputed (checkpointed as described here, inputs through the
  /// manager); mark every block of the model so. Blocks are told apart by
  /// their order in the step (the scope), and a step that measures runs
  /// every one recomputed. Without a scope, under NoOffload or with a
  /// manager without a target, the block just runs (its saved tensors go
  /// where the scope sends any). Every choice gives the same gradients.
  bool planned = false;
};

/// A block: its inputs in, its outputs out. Called once in forward and
/// once per backward pass that needs what it saved; it must run the same
/// operations each time (it may draw random numbers: see
/// CheckpointOptions::preserve_rng_state).
using Block = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// Runs `block(inputs)` so that autograd keeps only `inputs` for its
/// backward, and returns its outputs (any number, any of them not
/// requiring grad; inputs may be undefined or not require grad).
///
/// In the first backward pass (backward() or torch::autograd::grad) that
/// needs a tensor the block saved, the block is run again on the saved
/// inputs, with grad mode on, the generators' states of the forward (see
/// CheckpointOptions) and the autocast state of the forward (enabled, dtype
/// per device type, and the cache flag), under hooks that collect
/// the tensors it saves in order; each is handed out once and released when
/// its node lets go of it. Gradients are bitwise those of the block run
/// without checkpoint. Nested checkpoints recompute the outer block first
/// (its saved tensors include the inner block's inputs). With grad mode off
/// the block is just called.
///
/// Saved tensors: inputs go through the innermost open Scope of this thread
/// (offloaded by its manager; NoOffload or no scope: kept as autograd
/// would); what the block saves never reaches a manager, in forward or in
/// the recomputation.
///
/// `block` is copied and kept until the last tensor it saved was released:
/// what it captures by reference must live as long (capture modules by
/// value: torch::nn module holders are shared handles).
///
/// Errors (c10::Error, thrown in backward, naming the block): the
/// recomputation saved a different number of tensors than the forward, or
/// a tensor with other sizes, dtype or device (a block that is not
/// deterministic in what it runs); a saved tensor unpacked twice in one
/// backward pass; a backward pass started inside the block's recomputation.
/// An output that does not require grad is returned as is (backward from it
/// throws autograd's own error, as with torch.utils.checkpoint).
///
/// Thread-safety: call from any thread; each call is independent. The
/// recomputation runs on the thread of the backward pass that needs it.
std::vector<at::Tensor> checkpoint(Block block, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options = {});

/// One input, one output: checkpoint([fn](ins) { return {fn(ins[0])}; }, {input}).
at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input,
                      const CheckpointOptions& options = {});

/// A module's forward on one input, checkpointed: `module` is a torch::nn
/// module holder (or any copyable handle with `->forward(tensor)`), copied
/// into the block. A module with buffers (`module->buffers()`) has those
/// that do not require grad added to CheckpointOptions::state, so
/// recomputing a BatchNorm leaves its running statistics as the forward
/// left them.
template <class Module>
at::Tensor checkpoint_forward(Module module, const at::Tensor& input, const CheckpointOptions& options = {}) {
  auto with_state = options;
  if constexpr (requires { module->buffers(); }) {
    for (const auto& buffer : module->buffers()) {
      if (buffer.defined() && !buffer.requires_grad()) with_state.state.push_back(buffer);
    }
  }
  return checkpoint([module = std::move(module)](const at::Tensor& x) mutable { return module->forward(x); }, input,
                    with_state);
}

}  // namespace offload
