// SPDX-License-Identifier: MIT
// The autograd engine subclass that gives LibTorch's C++ API saved-tensor
// hooks, and the thread-local stack of open scopes. (The core's other
// translation units: options.cpp, stats.cpp, autograd.cpp, linked.cpp.)

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>

#include <offload/any_manager.hpp>
#include <offload/manager_interface.hpp>
#include <offload/scope.hpp>

namespace offload {

// ---------------------------------------------------------------- scopes
namespace detail {
struct ScopeFrame {
  std::shared_ptr<ManagerInterface> manager;  // null: NoOffload
  ScopeMark mark;                             // what the manager had seen when the scope opened
  std::atomic<bool> open{true};
};
}  // namespace detail

namespace {

// Open scopes of this thread, innermost last. Frames are shared so a scope
// closed from another thread is only marked closed and pruned here.
thread_local std::vector<std::shared_ptr<detail::ScopeFrame>> t_frames;

// The manager of the innermost open scope of this thread; null under
// NoOffload or outside any scope.
ManagerInterface* innermost_manager() {
  while (!t_frames.empty() && !t_frames.back()->open.load(std::memory_order_acquire)) t_frames.pop_back();
  return t_frames.empty() ? nullptr : t_frames.back()->manager.get();
}

}  // namespace

std::shared_ptr<ManagerInterface> detail::current_manager() {
  (void)innermost_manager();  // prunes closed frames
  return t_frames.empty() ? nullptr : t_frames.back()->manager;
}

namespace {

struct OffloadEngine final : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    ManagerInterface* manager = innermost_manager();
    return manager != nullptr ? manager->make_hooks() : nullptr;
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

Scope::Scope(const AnyManager& manager) { open(interface_of(manager)); }

Scope::Scope(NoManager /*unused*/) { open(nullptr); }

void Scope::open(std::shared_ptr<ManagerInterface> manager) {
  install_hooks();
  frame_ = std::make_shared<detail::ScopeFrame>();
  owner_ = std::this_thread::get_id();
  if (manager) frame_->mark = manager->on_scope_enter();
  frame_->manager = std::move(manager);
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
  if (frame_->manager) {
    frame_->manager->on_scope_exit(frame_->mark, in_order);
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
