// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// What the hooks objects need of autograd (defined in src/autograd.cpp):
/// the backward pass running on this thread and its end, autograd's
/// in-place error, and detail::KeptTensor, a saved tensor kept where it is
/// with autograd's in-place check (what a manager does with a tensor it
/// passes through, make_plain_hooks() and a checkpoint's recomputation),
/// and is_parameter(), the rule that tells a parameter by the tensor alone.

#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

namespace offload::detail {

/// Whether `t` is (a view of) a parameter as far as the tensor itself can
/// tell: its base (`t`, or `t._base()` for a view such as the `weight.t()`
/// Linear saves) is a leaf that requires grad. Activations never are: an
/// eager op's output has a grad_fn, and what a `torch.compile` region or a
/// custom autograd Function saves was computed with grad mode off (a leaf
/// that does not require grad), as are a frozen layer's output and the
/// model input. Frozen parameters do not require grad either: C++ names
/// them with Manager::exclude(module); the Python binding recognises
/// `nn.Parameter` objects itself (docs/guide.md, "What is never offloaded").
inline bool is_parameter(const at::Tensor& t) {
  const at::TensorBase& base = t.is_view() ? t._base() : static_cast<const at::TensorBase&>(t);
  return base.requires_grad() && base.is_leaf();
}

/// The id of the backward pass running on this thread, or -1 outside one
/// (torch::autograd::get_current_graph_task_id()).
int current_backward_id() noexcept;

/// Inside a backward pass: queues `callback` to run once when that pass
/// ends (Engine::queue_callback) and returns true; outside one, returns
/// false and does nothing.
bool at_backward_end(std::function<void()> callback);

/// The weak form of the autograd node pointer Tensor::grad_fn() returns
/// (std::shared_ptr up to LibTorch 2.12, c10::intrusive_ptr from 2.13).
template <class P>
struct weak_of;
template <class T>
struct weak_of<std::shared_ptr<T>> {
  using type = std::weak_ptr<T>;
};
template <class T>
struct weak_of<c10::intrusive_ptr<T>> {
  using type = c10::weak_intrusive_ptr<T>;
};
using NodeRef = std::remove_cvref_t<decltype(std::declval<const at::TensorBase&>().grad_fn())>;

/// Whether `t`, a saved tensor whose grad_fn is `fn` (not null), may be a
/// saved output: `fn` is the node saving it. False only where `fn` is not
/// the newest autograd node made on this thread (at::sequence_number: each
/// node takes the next number of its thread when made, and the node saving
/// an op's tensors is made before they are saved), none of `fn`'s inputs
/// came from a node made after it (a stale view's grad_fn, made again while
/// an op collects its inputs), `t` has no forward-mode gradient (whose
/// formula makes nodes between an op's node and its saved outputs), and
/// `t` is a view a view op made (not a custom Function's view output) or
/// `fn` one of LibTorch's operators (a TraceableFunction; a custom
/// Function's forward may make nodes). Thread-safe, no lock.
/// docs/internals.md gives the cases and those it misses (in-place
/// `_foreach_` ops).
bool may_be_saved_output(const at::Tensor& t, const NodeRef& fn) noexcept;
using WeakNode = typename weak_of<NodeRef>::type;

/// Throws the c10::Error autograd raises when a saved tensor was modified
/// in place after it was saved (autograd skips that check when hooks are
/// installed, so the hooks make it). `unpacked` is the tensor handed back.
[[noreturn]] void throw_modified_inplace(const at::Tensor& unpacked, std::uint32_t current, std::uint32_t saved,
                                         const WeakNode& grad_fn, std::int64_t output_nr);

/// Autograd's in-place check for one saved tensor: its version at pack,
/// and its node for the error's message.
class VersionCheck {
 public:
  /// Notes the version of `t` (defined). Returns its grad_fn, null
  /// without autograd history (valid while `t` is).
  const NodeRef* note(const at::Tensor& t) {
    const auto& counter = t.unsafeGetTensorImpl()->version_counter();
    enabled_ = counter.enabled();
    saved_ = enabled_ ? counter.current_version() : 0;
    const auto& fn = t.grad_fn();  // a reference: no count taken and dropped
    if (!fn) return nullptr;
    grad_fn_ = fn;
    output_nr_ = t.output_nr();
    return &fn;
  }
  /// Throws autograd's c10::Error when `counter` (the saved tensor's
  /// version counter) moved since note(); `unpacked` is named in it.
  void check(const at::Tensor& unpacked, const c10::VariableVersion& counter) const {
    if (enabled_ && counter.current_version() != saved_) {
      throw_modified_inplace(unpacked, counter.current_version(), saved_, grad_fn_, output_nr_);
    }
  }

 private:
  std::uint32_t saved_ = 0;
  bool enabled_ = false;  // inference tensors have no version counter
  WeakNode grad_fn_;
  std::int64_t output_nr_ = 0;
};

/// A saved tensor kept where it is, as autograd keeps one without hooks,
/// and handed back after autograd's in-place check.
///
/// A saved input is kept as itself, as autograd keeps one without hooks.
/// A saved output (one that may_be_saved_output(), or any tensor kept
/// with `KeptTensor::as_data`) is kept as its
/// tensor_data(): the same storage and version counter without the
/// history, as SavedVariable keeps a saved output itself. An output's
/// history is the node saving it, so holding the tensor itself would make
/// that node own itself, and a graph dropped without backward (an
/// exception mid-forward, a forward without backward) would never be
/// freed. The SavedVariable restores grad_fn and requires_grad at unpack,
/// so only the data is needed. (tensor_data(), not detach(): a shallow copy
/// without an operator call; it is most of what a pass-through costs, so
/// an input, which cannot make that cycle, is spared it.)
class KeptTensor {
 public:
  /// Tag: keep the tensor as its tensor_data() whatever it is (for a graph
  /// that is always dropped, where a missed output would leak every step).
  struct AsData {};
  static constexpr AsData as_data{};

  KeptTensor() = default;
  /// Keeps `t` (possibly undefined).
  explicit KeptTensor(const at::Tensor& t) {
    if (!t.defined()) return;
    const auto* fn = check_.note(t);
    tensor_ = fn && may_be_saved_output(t, *fn) ? t.tensor_data() : t;
  }
  /// Keeps `t` (possibly undefined) as its tensor_data() when it has
  /// autograd history.
  KeptTensor(const at::Tensor& t, AsData) {
    if (t.defined()) tensor_ = check_.note(t) ? t.tensor_data() : t;
  }
  /// The tensor kept; throws autograd's c10::Error when it was modified in
  /// place since it was saved.
  const at::Tensor& unpack() const {
    if (tensor_.defined()) check_.check(tensor_, tensor_.unsafeGetTensorImpl()->version_counter());
    return tensor_;
  }
  /// The tensor kept, without the check.
  const at::Tensor& tensor() const noexcept { return tensor_; }

 private:
  at::Tensor tensor_;
  VersionCheck check_;
};

}  // namespace offload::detail
