// SPDX-License-Identifier: MIT
//
// The sim's streams: one worker thread and FIFO queue each (SimStream,
// declared in internal.hpp), and the clock their copies' link times run on.

#include "internal.hpp"

#include <c10/util/Exception.h>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

namespace offload::sim::detail {

std::atomic<bool> g_exiting{false};

namespace {

// How long wait_until_ns() spins before its deadline rather than sleep: a
// sleeping thread wakes up to a timer slack (50 us by default on Linux)
// late. Stream workers ask for a slack of 1 ns and spin less.
thread_local std::int64_t t_spin_ns = 60'000;

// Whether this thread is running a stream's task (a worker, a waiter that
// runs one, or run_here), and which stream's.
thread_local bool t_in_task = false;
thread_local SimStream* t_running = nullptr;

// How long a waiter spins for the task another thread runs before it sleeps.
constexpr std::int64_t kWaitSpinNs = 50'000;

// Runs `task` on this thread as a task of `stream` (t_in_task and t_running
// set meanwhile), then destroys it, so that its captures die before its
// position counts as reached. Returns what it threw.
std::exception_ptr run_as_task_of(SimStream* stream, std::function<void()>& task) {
  const bool outer = !std::exchange(t_in_task, true);
  SimStream* const previous = std::exchange(t_running, stream);
  std::exception_ptr error;
  try {
    task();
  } catch (...) {
    error = std::current_exception();
  }
  task = nullptr;
  t_running = previous;
  if (outer) {
    t_in_task = false;
  }
  return error;
}

}  // namespace

std::uint64_t SimStream::enqueue(std::function<void()> task) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (g_exiting.load()) {  // read under the lock drain_for_exit() synchronizes with
    lock.unlock();
    return run_here(std::move(task));
  }
  if (!started_) {
    std::thread([this] { run(); }).detach();
    started_ = true;
  }
  queue_.push_back(std::move(task));
  ++enqueued_;
  work_cv_.notify_one();
  return enqueued_;
}

std::uint64_t SimStream::mark(std::function<void()> on_reached) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (completed_ >= enqueued_) {
    on_reached();
    return enqueued_;
  }
  lock.unlock();
  return enqueue(std::move(on_reached));
}

std::optional<std::uint64_t> SimStream::pending_position() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (completed_ >= enqueued_) {
    return std::nullopt;
  }
  return enqueued_;
}

bool SimStream::reached(std::uint64_t position) { return completed_.load(std::memory_order_acquire) >= position; }

bool SimStream::idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ >= enqueued_;
}

void SimStream::wait(std::uint64_t position) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, position);
}

void SimStream::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_locked(lock, enqueued_);
  if (error_) {
    auto error = std::exchange(error_, nullptr);
    lock.unlock();
    std::rethrow_exception(error);
  }
}

std::int64_t SimStream::link_slot_end(std::int64_t link_ns) {
  link_free_ns_ = std::max(now_ns(), link_free_ns_) + link_ns;
  return link_free_ns_;
}

void SimStream::run_next(std::unique_lock<std::mutex>& lock) {
  std::function<void()> task = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  lock.unlock();
  const auto error = run_as_task_of(this, task);
  lock.lock();
  if (error && !error_) {
    error_ = error;
  }
  running_ = false;
  completed_.fetch_add(1, std::memory_order_release);
  done_cv_.notify_all();
  if (!queue_.empty()) {
    work_cv_.notify_one();
  }
}

void SimStream::wait_locked(std::unique_lock<std::mutex>& lock, std::uint64_t position) {
  while (completed_ < position) {
    if (!running_ && !queue_.empty()) {
      run_next(lock);  // nobody runs the next task: run it here rather than wake the worker
      continue;
    }
    // Another thread runs the next task: spin a while (a short task ends
    // sooner than a sleeping thread is woken), then sleep until it ends.
    lock.unlock();
    const auto until = now_ns() + kWaitSpinNs;
    while (completed_.load(std::memory_order_acquire) < position && now_ns() < until) {
      std::this_thread::yield();
    }
    lock.lock();
    done_cv_.wait(lock, [&] { return completed_ >= position || (!running_ && !queue_.empty()); });
  }
}

// At exit: waits for the tasks queued before, runs `task` on this thread
// (at once when queued by a running task, whose own wait would never end).
std::uint64_t SimStream::run_here(std::function<void()> task) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!t_in_task) {
    wait_locked(lock, enqueued_);
  }
  const auto position = ++enqueued_;
  lock.unlock();
  (void)run_as_task_of(this, task);  // an error: nobody is left to report it to
  lock.lock();
  ++completed_;
  lock.unlock();
  done_cv_.notify_all();
  return position;
}

void SimStream::run() {
  t_in_task = true;
#ifdef __linux__
  if (prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL) == 0) {
    t_spin_ns = 15'000;
  }
  // Named for debuggers and profilers ("sim-stream", at most 15 characters).
  prctl(PR_SET_NAME, "sim-stream", 0UL, 0UL, 0UL);
#endif
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return !queue_.empty() && !running_; });
    run_next(lock);
  }
}

void wait_until_ns(std::int64_t deadline_ns) {
  // Sleeping is only as precise as the scheduler's wake-up: sleep to just
  // before the deadline, spin the rest.
  for (;;) {
    const auto left = deadline_ns - now_ns();
    if (left <= 0) {
      return;
    }
    if (left > t_spin_ns) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(left - t_spin_ns));
    }
  }
}

std::int64_t steady_now_ns() { return now_ns(); }

std::int64_t link_slot_end_ns(std::int64_t link_ns) {
  TORCH_INTERNAL_ASSERT(t_running != nullptr, "offload::sim: a link slot outside a stream's task");
  return t_running->link_slot_end(link_ns);
}

}  // namespace offload::sim::detail
