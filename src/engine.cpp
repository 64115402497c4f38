// SPDX-License-Identifier: MIT
// The autograd engine subclass that gives LibTorch's C++ API saved-tensor
// hooks, the thread-local stack of open scopes, Options validation and
// the fault-injection switch. The only translation unit of the core.

#include <algorithm>
#include <atomic>
#include <mutex>
#include <ostream>
#include <sstream>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>

#include <offload/manager.hpp>
#include <offload/options.hpp>
#include <offload/scope.hpp>
#include <offload/stats.hpp>
#include <offload/testing.hpp>

namespace offload {

// ---------------------------------------------------------------- Options
namespace {
void check_range(const char* field, std::int64_t value, Range range) {
  TORCH_CHECK_VALUE(value >= range.lo && value <= range.hi, "offload::Options: ", field, " must be in [", range.lo,
                    ", ", range.hi, "], got ", value);
}
}  // namespace

void Options::validate() const {
  check_range("min_offload_bytes", min_offload_bytes, ranges::min_offload_bytes);
  check_range("max_fwd_stash", max_fwd_stash, ranges::max_fwd_stash);
  check_range("prefetch_depth", prefetch_depth, ranges::prefetch_depth);
  check_range("prefetch_bytes", prefetch_bytes, ranges::prefetch_bytes);
  check_range("host_budget_bytes", host_budget_bytes, ranges::host_budget_bytes);
}

std::ostream& operator<<(std::ostream& os, const Stats& s) {
  const char* separator = "";
  for (const auto& field : stat_fields) {
    os << separator << field.name << '=' << s.*field.member;
    separator = " ";
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

// ---------------------------------------------------------------- scopes
struct Scope::Frame {
  std::shared_ptr<detail::HookSource> source;  // null: NoOffload
  std::atomic<bool> open{true};
};

namespace {

// Open scopes of this thread, innermost last. Frames are shared so a scope
// closed from another thread is only marked closed and pruned here.
thread_local std::vector<std::shared_ptr<Scope::Frame>> t_frames;

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

Scope::Scope(std::shared_ptr<detail::HookSource> source)
    : frame_(std::make_shared<Frame>()), owner_(std::this_thread::get_id()) {
  install_hooks();
  frame_->source = std::move(source);
  t_frames.push_back(frame_);
}

void Scope::close() {
  if (!frame_) return;
  TORCH_CHECK(std::this_thread::get_id() == owner_,
              "offload::Scope::close: a Scope must be closed on the thread that opened it "
              "(scopes are thread-bound: saved tensors of other threads never see it)");
  frame_->open.store(false, std::memory_order_release);
  std::erase(t_frames, frame_);
  if (frame_->source) frame_->source->on_scope_exit();
  frame_.reset();
}

Scope::~Scope() {
  if (!frame_) return;
  if (std::this_thread::get_id() != owner_) {
    TORCH_WARN("offload::Scope destroyed on a thread other than the one that opened it; it is "
               "closed now, but scopes are thread-bound: close each on its own thread");
    frame_->open.store(false, std::memory_order_release);
    return;
  }
  close();
}

NoOffload::NoOffload() : scope_(std::shared_ptr<detail::HookSource>{}) {}
NoOffload::~NoOffload() = default;

// ---------------------------------------------------------------- faults
namespace testing {
namespace {
std::atomic<int> g_armed_kind{0};
std::atomic<int> g_armed_count{0};
std::atomic<int> g_fired{0};
}  // namespace

void arm_fault(Fault fault, int count) {
  TORCH_CHECK_VALUE(count >= 1, "offload::testing::arm_fault: count must be >= 1, got ", count);
  g_armed_count.store(0);
  g_armed_kind.store(static_cast<int>(fault));
  g_armed_count.store(fault == Fault::none ? 0 : count);
}

void disarm_faults() noexcept {
  g_armed_count.store(0);
  g_armed_kind.store(0);
}

bool take_fault(Fault fault) noexcept {
  if (g_armed_count.load(std::memory_order_relaxed) == 0) return false;
  if (g_armed_kind.load() != static_cast<int>(fault)) return false;
  int n = g_armed_count.load();
  while (n > 0) {
    if (g_armed_count.compare_exchange_weak(n, n - 1)) {
      g_fired.fetch_add(1);
      return true;
    }
  }
  return false;
}

int faults_fired() noexcept { return g_fired.load(); }

}  // namespace testing
}  // namespace offload
