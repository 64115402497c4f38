// SPDX-License-Identifier: MIT
// The autograd engine subclass that gives LibTorch's C++ API saved-tensor
// hooks, the thread-local stack of open scopes, Options validation and
// Stats printing. The only translation unit of the core.

#include <algorithm>
#include <atomic>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>

#include <offload/any_manager.hpp>
#include <offload/detail/core.hpp>
#include <offload/detail/hook_source.hpp>
#include <offload/detail/linked.hpp>
#include <offload/manager_interface.hpp>
#include <offload/options.hpp>
#include <offload/scope.hpp>
#include <offload/stats.hpp>

namespace offload {

// ---------------------------------------------------------------- Options
namespace {
void check_range(std::string_view field, std::int64_t value, Range range) {
  TORCH_CHECK_VALUE(range.contains(value), "offload::Options: ", field, " must be in [", range.lo, ", ", range.hi,
                    "], got ", value);
}
}  // namespace

void Options::validate() const {
  for (const auto& field : option_fields) check_range(field.name, this->*field.member, field.range);
}

std::ostream& operator<<(std::ostream& os, const Stats& s) {
  const char* sep = "";
  for (const auto& field : stat_fields) {
    os << sep << field.name << '=' << s.*field.member;
    sep = " ";
  }
  return os;
}

// ---------------------------------------------------------------- versions
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

int current_backward_id() noexcept { return torch::autograd::get_current_graph_task_id(); }

bool at_backward_end(std::function<void()> callback) {
  if (torch::autograd::get_current_graph_task_id() < 0) return false;
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(callback));
  return true;
}

}  // namespace detail

namespace {
// What make_plain_hooks() returns: the tensor itself, its version checked
// at unpack as a manager checks the tensors it passes through.
class PlainHooks final : public torch::autograd::SavedVariableHooks {
 public:
  void call_pack_hook(const at::Tensor& tensor) override {
    tensor_ = tensor;
    if (!tensor.defined()) return;
    version_ = tensor.unsafeGetTensorImpl()->version_counter();
    saved_version_ = version_.enabled() ? version_.current_version() : 0;
    if (auto fn = tensor.grad_fn()) {
      grad_fn_ = fn;
      output_nr_ = tensor.output_nr();
    }
  }
  at::Tensor call_unpack_hook() override {
    if (version_.enabled() && version_.current_version() != saved_version_) {
      detail::throw_modified_inplace(tensor_, version_.current_version(), saved_version_, grad_fn_, output_nr_);
    }
    return tensor_;
  }

 private:
  at::Tensor tensor_;
  c10::VariableVersion version_;  // disabled until a tensor is saved
  std::uint32_t saved_version_ = 0;
  detail::WeakNode grad_fn_;
  std::int64_t output_nr_ = 0;
};
}  // namespace

std::unique_ptr<torch::autograd::SavedVariableHooks> make_plain_hooks() { return std::make_unique<PlainHooks>(); }

// ---------------------------------------------------------------- linked libraries
namespace detail {
namespace {
std::mutex g_linked_mutex;
std::vector<std::string>& linked_names() {
  static auto* names = new std::vector<std::string>();  // never destroyed: read during static init too
  return *names;
}
}  // namespace

void note_linked(std::string_view library) {
  const std::lock_guard lock(g_linked_mutex);
  auto& names = linked_names();
  if (std::find(names.begin(), names.end(), library) == names.end()) names.emplace_back(library);
}

bool is_linked(std::string_view library) noexcept {
  const std::lock_guard lock(g_linked_mutex);
  const auto& names = linked_names();
  return std::find(names.begin(), names.end(), library) != names.end();
}
}  // namespace detail

// ---------------------------------------------------------------- scopes
namespace detail {
struct ScopeFrame {
  std::shared_ptr<HookSource> source;  // null: NoOffload
  ScopeMark mark;                      // what the source had seen when the scope opened
  std::atomic<bool> open{true};
};
}  // namespace detail

namespace {

// Open scopes of this thread, innermost last. Frames are shared so a scope
// closed from another thread is only marked closed and pruned here.
thread_local std::vector<std::shared_ptr<detail::ScopeFrame>> t_frames;

detail::HookSource* innermost_source(bool& found) {
  while (!t_frames.empty() && !t_frames.back()->open.load(std::memory_order_acquire)) t_frames.pop_back();
  found = !t_frames.empty();
  return found ? t_frames.back()->source.get() : nullptr;
}

struct OffloadEngine final : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    bool found = false;
    detail::HookSource* source = innermost_source(found);
    return source != nullptr ? source->make_hooks() : nullptr;
  }

  // LibTorch starts the per-device worker threads once per process (a
  // static once-flag in engine.cpp), for whichever engine runs the first
  // backward pass, and fills only that engine's device ready queues. So
  // this engine shares the base engine's queues and re-entrant thread pool:
  // the workers run the same Engine code for any graph task, and the hooks
  // are taken from the default engine when tensors are saved, not by the
  // worker. Reached through member pointers, the standard way for a
  // derived class to read protected members of another base object.
  void share_workers_of(torch::autograd::Engine& base) {
    base.initialize_device_threads_pool();
    this->*(&OffloadEngine::device_ready_queues_) = base.*(&OffloadEngine::device_ready_queues_);
    this->*(&OffloadEngine::thread_pool_shared_) = base.*(&OffloadEngine::thread_pool_shared_);
  }
};

OffloadEngine& offload_engine() {
  // Never destroyed: Engine must stop() before destruction, and its worker
  // threads may outlive static destructors.
  static auto* engine = new OffloadEngine();
  return *engine;
}

torch::autograd::Engine& offload_engine_stub() { return offload_engine(); }

std::once_flag g_install_once;
std::atomic<bool> g_installed{false};

}  // namespace

void install_hooks() {
  std::call_once(g_install_once, [] {
    auto& current = torch::autograd::Engine::get_default_engine();
    TORCH_CHECK(&current == &torch::autograd::Engine::get_base_engine(),
                "offload::install_hooks: another autograd engine is already the default (PyTorch's "
                "Python bindings install one); torch-offload is for C++ programs that do not load "
                "libtorch_python");
    offload_engine().share_workers_of(current);
    torch::autograd::set_default_engine_stub(&offload_engine_stub);
    g_installed.store(true, std::memory_order_release);
  });
  TORCH_CHECK(g_installed.load(std::memory_order_acquire),
              "offload::install_hooks: installation failed earlier in this process");
}

bool hooks_installed() noexcept { return g_installed.load(std::memory_order_acquire); }

Scope::Scope(const AnyManager& manager) { open(detail::source_of(manager)); }

Scope::Scope(NoManager /*unused*/) { open(nullptr); }

void Scope::open(std::shared_ptr<detail::HookSource> source) {
  install_hooks();
  frame_ = std::make_shared<detail::ScopeFrame>();
  owner_ = std::this_thread::get_id();
  if (source) frame_->mark = source->on_scope_enter();
  frame_->source = std::move(source);
  t_frames.push_back(frame_);
}

void Scope::close() {
  if (!frame_) return;
  TORCH_CHECK(std::this_thread::get_id() == owner_,
              "offload::Scope::close: a Scope must be closed on the thread that opened it "
              "(scopes are thread-bound: saved tensors of other threads never see it)");
  // In order: no scope opened after this one on this thread is still open.
  const auto at = std::find(t_frames.begin(), t_frames.end(), frame_);
  const bool in_order = std::none_of(at == t_frames.end() ? at : at + 1, t_frames.end(),
                                     [](const auto& f) { return f->open.load(std::memory_order_acquire); });
  frame_->open.store(false, std::memory_order_release);
  std::erase(t_frames, frame_);
  if (frame_->source) {
    frame_->source->on_scope_exit(frame_->mark, in_order);
  } else if (!in_order) {
    TORCH_WARN_ONCE(
        "offload::NoOffload was closed while a scope opened after it on the same thread was still "
        "open; close scopes innermost first");
  }
  frame_.reset();
}

Scope::~Scope() {
  if (!frame_) return;
  if (std::this_thread::get_id() != owner_) {
    TORCH_WARN(
        "offload::Scope destroyed on a thread other than the one that opened it; it is "
        "closed now, but scopes are thread-bound: close each on its own thread");
    frame_->open.store(false, std::memory_order_release);
    return;
  }
  close();
}

NoOffload::NoOffload() : scope_(Scope::NoManager{}) {}
NoOffload::~NoOffload() = default;

}  // namespace offload
