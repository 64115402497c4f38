// SPDX-License-Identifier: MIT
//
// The sim's streams: one worker thread and FIFO queue each (SimStream,
// declared in internal.hpp), and the clock their copies' link times run on.

#include "internal.hpp"

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

// Whether this thread is running a stream's task (a worker, or run_here).
thread_local bool t_in_task = false;

}  // namespace

std::uint64_t SimStream::enqueue(std::function<void()> task) {
  if (g_exiting.load()) {
    return run_here(std::move(task));
  }
  std::lock_guard<std::mutex> lock(mutex_);
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

bool SimStream::reached(std::uint64_t position) {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ >= position;
}

bool SimStream::idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ >= enqueued_;
}

void SimStream::wait(std::uint64_t position) {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [&] { return completed_ >= position; });
}

void SimStream::synchronize() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto target = enqueued_;
  done_cv_.wait(lock, [&] { return completed_ >= target; });
  if (error_) {
    auto error = std::exchange(error_, nullptr);
    lock.unlock();
    std::rethrow_exception(error);
  }
}

// At exit: waits for the tasks queued before, runs `task` on this thread
// (at once when queued by a running task, whose own wait would never end).
std::uint64_t SimStream::run_here(std::function<void()> task) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!t_in_task) {
    done_cv_.wait(lock, [&] { return completed_ >= enqueued_; });
  }
  const auto position = ++enqueued_;
  lock.unlock();
  const bool outer = !std::exchange(t_in_task, true);
  try {
    task();
  } catch (...) {  // nobody is left to report it to
  }
  task = nullptr;
  t_in_task = !outer;
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
#endif
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return !queue_.empty(); });
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      task();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) {
        error_ = std::current_exception();
      }
    }
    task = nullptr;  // captures die before the position counts as reached
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++completed_;
    }
    done_cv_.notify_all();
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
  // Each stream is one worker thread: its link's timeline is thread-local.
  thread_local std::int64_t link_free_ns = 0;
  link_free_ns = std::max(now_ns(), link_free_ns) + link_ns;
  return link_free_ns;
}

}  // namespace offload::sim::detail
