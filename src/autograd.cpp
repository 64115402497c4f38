// SPDX-License-Identifier: MIT
// What the hooks objects need of autograd (<offload/detail/autograd.hpp>):
// its in-place error (same wording), the backward pass running on this
// thread and its end; and make_plain_hooks().

#include <offload/detail/autograd.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <typeinfo>

#include <ATen/SequenceNumber.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <offload/manager_interface.hpp>

namespace offload {

namespace detail {

void throw_modified_inplace(const at::Tensor& unpacked, std::uint32_t current, std::uint32_t saved,
                            const WeakNode& grad_fn, std::int64_t output_nr) {
  // Same wording as autograd's own check (SavedVariable::unpack), so code
  // that handles that error keeps working with offloading.
  std::ostringstream message;
  message << "one of the variables needed for gradient computation has been modified by an inplace "
             "operation: ["
          << unpacked.toString() << " " << unpacked.sizes() << "]";
  if (auto fn = grad_fn.lock()) message << ", which is output " << output_nr << " of " << fn->name() << ",";
  message << " is at version " << current << "; expected version " << saved << " instead.";
  if (!torch::autograd::AnomalyMode::is_enabled()) {
    message << " Hint: enable anomaly detection to find the operation that failed to compute its "
               "gradient, with torch.autograd.set_detect_anomaly(True, check_nan=False).";
  } else {
    message << " Hint: the backtrace further above shows the operation that failed to compute its "
               "gradient. The variable in question was changed in there or anywhere later. Good luck!";
  }
  TORCH_CHECK(false, message.str());
}

namespace {
// Node types known to be TraceableFunctions, by the address of their
// type_info: a dynamic_cast costs about a third of a pass-through, a load
// and a compare almost nothing. A slot only ever holds a type that passed
// the cast, so a racing store leaves another right answer (or a miss).
std::array<std::atomic<const std::type_info*>, 64> traceable_types{};

bool is_traceable_function(const torch::autograd::Node& node) noexcept {
  const std::type_info* type = &typeid(node);
  auto& slot = traceable_types[(reinterpret_cast<std::uintptr_t>(type) >> 4) % traceable_types.size()];
  if (slot.load(std::memory_order_relaxed) == type) return true;
  if (dynamic_cast<const torch::autograd::TraceableFunction*>(&node) == nullptr) return false;
  slot.store(type, std::memory_order_relaxed);
  return true;
}
}  // namespace

bool may_be_saved_output(const at::Tensor& t, const NodeRef& fn) noexcept {
  const auto seq = fn->sequence_nr();
  if (seq + 1 >= at::sequence_number::peek()) return true;  // the newest node
  for (const auto& edge : fn->next_edges()) {
    // AccumulateGrad takes no number (UINT64_MAX): a leaf's, made any time.
    const auto* input = edge.function.get();
    if (input && input->sequence_nr() != UINT64_MAX && input->sequence_nr() > seq) return true;
  }
  const auto* meta = torch::autograd::impl::get_autograd_meta(t);
  if (meta && meta->fw_grad_ && !meta->fw_grad_->empty()) return true;
  // Not the newest: an input, where the saving node cannot be `fn` because
  // nothing makes nodes between it and its saved outputs.
  // - A view op's node saves no output: a view is an input unless a custom
  //   Function returned it or it is a view of one (CreationMeta::
  //   IN_CUSTOM_FUNCTION, set on a Function's view outputs and inherited by
  //   views of them).
  // - One of LibTorch's operators (a TraceableFunction) makes no node in
  //   between, but for an in-place _foreach_ op (one node per element, made
  //   before any is saved: missed, docs/internals.md).
  // - A custom Function's node (Python's PyNode, C++'s CppNode) may: its
  //   forward can call other Functions (each makes a node, grad mode on or
  //   off) or turn grad mode on, so it counts as a possible output.
  if (meta && meta->is_view_) {
    const auto* view = static_cast<const torch::autograd::DifferentiableViewMeta*>(meta);
    if (view->has_bw_view() && view->get_creation_meta() != torch::autograd::CreationMeta::IN_CUSTOM_FUNCTION)
      return false;
  }
  return !is_traceable_function(*fn);
}

int current_backward_id() noexcept { return torch::autograd::get_current_graph_task_id(); }

bool at_backward_end(std::function<void()> callback) {
  if (torch::autograd::get_current_graph_task_id() < 0) return false;
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
  return true;
}

}  // namespace detail

namespace {
// What make_plain_hooks() returns: the saved tensor kept as a manager keeps
// one it passes through.
class PlainHooks final : public torch::autograd::SavedVariableHooks {
 public:
  void call_pack_hook(const at::Tensor& tensor) override { kept_ = detail::KeptTensor(tensor); }
  at::Tensor call_unpack_hook() override { return kept_.unpack(); }

 private:
  detail::KeptTensor kept_;
};
}  // namespace

std::unique_ptr<torch::autograd::SavedVariableHooks> make_plain_hooks() { return std::make_unique<PlainHooks>(); }

}  // namespace offload
