// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::Scope and offload::NoOffload: RAII regions that route the
/// tensors autograd saves on this thread through a manager, or not.

#include <memory>
#include <thread>

#include <offload/any_manager.hpp>

namespace offload {

namespace detail {
struct ScopeFrame;  // one entry of a thread's stack of open scopes (src/engine.cpp)
/// The manager of the innermost open Scope of this thread; null under
/// NoOffload or outside any scope. Defined in liboffload.
std::shared_ptr<ManagerInterface> current_manager();
}  // namespace detail

/// Installs torch-offload's autograd engine (the one that hands out
/// saved-tensor hooks) as the process's default engine. Idempotent and
/// thread-safe; Scope calls it. Call it early if you like: it must run
/// before the first backward pass to avoid a second engine thread pool.
///
/// Throws c10::Error when another default engine is already installed
/// (PyTorch's Python bindings install theirs): torch-offload is for C++
/// programs that do not load libtorch_python.
void install_hooks();

/// True once install_hooks() has succeeded.
bool hooks_installed() noexcept;

/// While alive, tensors saved for backward on this thread go through the
/// given manager (the innermost open Scope or NoOffload wins). Backward may
/// run after the Scope has closed: saved tensors keep their manager alive.
///
/// Close scopes innermost first, and put the model on the manager's device:
/// the manager warns once (TORCH_WARN) when a scope of it is closed while a
/// later one is still open on the thread, and when tensors were saved in a
/// scope of it but none was on its device type.
///
/// Thread-safety: a Scope belongs to the thread that opened it. Closing it
/// on another thread throws c10::Error from close(); the destructor on
/// another thread reports the error as a warning and still deactivates it.
/// Scopes on different threads are independent.
class Scope {
 public:
  /// Opens a scope for `manager` (a Manager<...> converts to AnyManager).
  /// Throws like install_hooks().
  explicit Scope(const AnyManager& manager);
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  ~Scope();
  /// Closes the scope now. Idempotent. Throws c10::Error when called on a
  /// thread other than the one that opened it (the scope stays open).
  void close();

 private:
  friend class NoOffload;
  struct NoManager {};
  explicit Scope(NoManager);  // NoOffload's: a frame without a manager
  void open(std::shared_ptr<ManagerInterface> manager);

  std::shared_ptr<detail::ScopeFrame> frame_;
  std::thread::id owner_;
};

/// While alive, tensors saved on this thread are not offloaded, even
/// inside an open Scope (like torchtune's NoOpManager). Same thread rules
/// as Scope.
class NoOffload {
 public:
  NoOffload();
  NoOffload(const NoOffload&) = delete;
  NoOffload& operator=(const NoOffload&) = delete;
  ~NoOffload();

 private:
  Scope scope_;
};

}  // namespace offload
