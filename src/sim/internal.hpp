// SPDX-License-Identifier: MIT
#pragma once

// What the files of the sim runtime share: the runtime's state (streams.cpp,
// runtime.cpp), the allocators' narrow interfaces (device_allocator.cpp,
// host_allocator.cpp), the guard and hooks objects (guard.cpp, privateuse1_hooks.cpp) and
// the Config checks (config.cpp), used by install.cpp and one another. The
// kernels see only runtime.hpp and the stream-order checker (checker.hpp).
// Not installed.

#include "runtime.hpp"

#include <offload/sim.hpp>

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/Stream.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace c10 {
struct Allocator;
struct DeviceAllocator;
namespace impl {
struct DeviceGuardImplInterface;
}
}  // namespace c10
namespace at {
struct PrivateUse1HooksInterface;
}

namespace offload::sim::detail {

inline constexpr auto kSimType = c10::DeviceType::PrivateUse1;

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ------------------------------------------------------------------ streams (streams.cpp)

/// Set when the process exits (install.cpp's drain_everything_at_exit): from
/// then on a stream runs a queued task on the calling thread, after the tasks
/// queued before it, so no worker runs while the process tears down statics.
extern std::atomic<bool> g_exiting;

/// One simulated stream: a FIFO of tasks run in order, one at a time, by its
/// worker thread (started on first use) or by a thread waiting for the
/// stream (wait(), synchronize()), which runs the next queued task itself
/// when the worker is not running one: a wait then costs no thread
/// wake-up, as a device's host-side wait costs none beyond the work waited
/// for. Positions count tasks: position p is reached when the first p tasks
/// have run (and their captures have been destroyed).
class SimStream {
 public:
  SimStream(c10::DeviceIndex device, c10::StreamId id) : device_(device), id_(id) {}

  c10::DeviceIndex device() const { return device_; }
  c10::StreamId id() const { return id_; }

  /// Queues `task`; returns the position reached once it has run.
  std::uint64_t enqueue(std::function<void()> task);

  /// Marks the current end of the stream for an event: when nothing is
  /// queued, the mark is reached at once (as recording an event on an idle
  /// device stream is a host call that completes immediately); otherwise a
  /// marker task is queued and `on_reached` runs when the worker reaches it.
  /// Returns the position of the mark.
  std::uint64_t mark(std::function<void()> on_reached);

  /// The position of the last queued task if it has not run yet.
  std::optional<std::uint64_t> pending_position();

  bool reached(std::uint64_t position);
  bool idle();
  void wait(std::uint64_t position);

  /// Waits for everything queued so far; rethrows (once) the first error a
  /// task raised.
  void synchronize();

  /// The end of the link time of a copy of `link_ns` that starts now, or
  /// when this stream's link is free (the end of its previous copy's link
  /// time) if that is later. Called from this stream's running task only.
  std::int64_t link_slot_end(std::int64_t link_ns);

 private:
  std::uint64_t run_here(std::function<void()> task);
  void run();
  // Runs the next queued task on the calling thread: `lock` held on entry
  // and on return, released while the task runs.
  void run_next(std::unique_lock<std::mutex>& lock);
  // Waits until `position` is reached, running queued tasks meanwhile
  // whenever no other thread is running one; `lock` held.
  void wait_locked(std::unique_lock<std::mutex>& lock, std::uint64_t position);

  const c10::DeviceIndex device_;
  const c10::StreamId id_;
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t enqueued_ = 0;
  std::atomic<std::uint64_t> completed_{0};  // written under mutex_; read by spinning waiters
  bool running_ = false;                     // a thread is running one of this stream's tasks
  bool started_ = false;
  std::int64_t link_free_ns_ = 0;  // link_slot_end(): the running task's thread only
  std::exception_ptr error_;
};

// ------------------------------------------------------------------ runtime (runtime.cpp)

struct Runtime {
  Config installed;  // backend_name and num_devices never change
  std::atomic<std::int64_t> copy_latency_us{0};
  std::atomic<double> copy_bandwidth_gbps{1.0};
  std::atomic<bool> poison{false};
  std::atomic<bool> host_power_of_two{false};
  std::atomic<std::int64_t> pinned_alloc_us{0};
  std::array<std::array<std::unique_ptr<SimStream>, kStreamsPerDevice>, kMaxDevices> streams;
  std::array<std::atomic<std::uint32_t>, kMaxDevices> next_pool{};
};

/// Set once by install(). Leaked on purpose: worker threads are detached and
/// may outlive main().
extern std::atomic<Runtime*> g_runtime;

/// The calling thread's current device, and its current stream per device.
extern constinit thread_local c10::DeviceIndex t_device;
extern constinit thread_local std::array<c10::StreamId, kMaxDevices> t_stream;

/// The installed runtime; throws c10::Error before install().
Runtime& runtime();

/// `index`, or the current device for a negative one.
c10::DeviceIndex resolve(c10::DeviceIndex index);

/// The stream `id` of device `index` (or of `stream`); throws c10::Error for a
/// device that is not installed, an id out of range, or a non-sim stream.
SimStream& stream_ref(c10::DeviceIndex index, c10::StreamId id);
SimStream& stream_ref(const c10::Stream& stream);

/// "<backend>:<index>", for messages.
std::string device_name(c10::DeviceIndex index);

// ------------------------------------------------------------------ allocators

/// The counting device allocator with stream-ordered release
/// (device_allocator.cpp); PrivateUse1's allocator once installed.
c10::DeviceAllocator& device_allocator();

/// The sim device of the live device block holding `p`; nullopt if none.
std::optional<c10::DeviceIndex> device_of(const void* p);

/// Per-device capacity in bytes (0 = unlimited).
void set_device_capacity(std::int64_t bytes);
std::int64_t device_capacity();

/// The counting pinned host allocator (host_allocator.cpp).
c10::Allocator& host_allocator();
// The bytes the pinned host allocator sets aside for a request of `n`
// (Config::host_power_of_two); registered with
// offload::storage::set_pinned_block_rule at install.
std::int64_t host_block_bytes(std::int64_t n);

/// Whether `p` lies in a live pinned host block.
bool is_pinned(const void* p);

/// Returns the pinned host allocator's idle blocks to malloc.
void empty_host_cache();

// ------------------------------------------------------------------ guard and hooks

/// The device guard (guard.cpp), registered for PrivateUse1 at load time.
c10::impl::DeviceGuardImplInterface& guard_impl();

// Whether the current sim stream of device `index` captures a graph
// (offload::sim::set_capturing): the probe install() registers with
// offload::set_capture_probe.
bool capture_probe(c10::DeviceIndex index) noexcept;

/// The PrivateUse1 hooks (privateuse1_hooks.cpp).
at::PrivateUse1HooksInterface& hooks();

// ------------------------------------------------------------------ config (config.cpp)

/// Throws c10::ValueError naming the field, the value and the accepted range.
void validate(const Config& c);
void check_latency(std::int64_t us, const char* where);
void check_bandwidth(double gbps, const char* where);
void check_capacity(std::int64_t bytes, const char* where);
void check_pinned_alloc(std::int64_t us, const char* where);

/// "field: installed a, requested b; ..." for each field that differs.
std::string differences(const Config& have, const Config& want);

}  // namespace offload::sim::detail
