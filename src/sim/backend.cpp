// SPDX-License-Identifier: MIT
//
// The sim runtime: streams (one worker thread and FIFO queue each), events,
// the counting device allocator with stream-ordered release, the counting
// pinned host allocator, the device guard, the PrivateUse1 hooks, and the
// public offload::sim API. The kernels live in kernels.cpp.

#include "runtime.hpp"

#include <offload/detail/linked.hpp>
#include <offload/sim.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceType.h>
#include <c10/core/Storage.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace offload::sim {
namespace detail {
namespace {

using c10::DeviceIndex;
using c10::StreamId;
constexpr auto kSimType = c10::DeviceType::PrivateUse1;

// How long wait_until_ns() spins before its deadline rather than sleep: a
// sleeping thread wakes up to a timer slack (50 us by default on Linux)
// late. Stream workers ask for a slack of 1 ns and spin less.
thread_local std::int64_t t_spin_ns = 60'000;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ------------------------------------------------------------------ streams

// Set when the process exits (drain_everything_at_exit): from then on a
// stream runs a queued task on the calling thread, after the tasks queued
// before it, so no worker runs while the process tears down statics.
std::atomic<bool> g_exiting{false};
// Whether this thread is running a stream's task (a worker, or run_here).
thread_local bool t_in_task = false;

// One simulated stream: a FIFO of tasks run in order by one worker thread
// (started on first use). Positions count tasks: position p is reached when
// the first p tasks have run (and their captures have been destroyed).
class SimStream {
 public:
  SimStream(DeviceIndex device, StreamId id) : device_(device), id_(id) {}

  DeviceIndex device() const { return device_; }
  StreamId id() const { return id_; }

  // Queues `task`; returns the position reached once it has run.
  std::uint64_t enqueue(std::function<void()> task) {
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

  // Marks the current end of the stream for an event: when nothing is
  // queued, the mark is reached at once (as recording an event on an idle
  // device stream is a host call that completes immediately); otherwise a
  // marker task is queued and `on_reached` runs when the worker reaches it.
  // Returns the position of the mark.
  std::uint64_t mark(std::function<void()> on_reached) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (completed_ >= enqueued_) {
      on_reached();
      return enqueued_;
    }
    lock.unlock();
    return enqueue(std::move(on_reached));
  }

  // The position of the last queued task if it has not run yet.
  std::optional<std::uint64_t> pending_position() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_ >= enqueued_) {
      return std::nullopt;
    }
    return enqueued_;
  }

  bool reached(std::uint64_t position) {
    std::lock_guard<std::mutex> lock(mutex_);
    return completed_ >= position;
  }

  bool idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    return completed_ >= enqueued_;
  }

  void wait(std::uint64_t position) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return completed_ >= position; });
  }

  // Waits for everything queued so far; rethrows (once) the first error a
  // task raised.
  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto target = enqueued_;
    done_cv_.wait(lock, [&] { return completed_ >= target; });
    if (error_) {
      auto error = std::exchange(error_, nullptr);
      lock.unlock();
      std::rethrow_exception(error);
    }
  }

 private:
  // At exit: waits for the tasks queued before, runs `task` on this thread
  // (at once when queued by a running task, whose own wait would never end).
  std::uint64_t run_here(std::function<void()> task) {
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

  void run() {
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

  const DeviceIndex device_;
  const StreamId id_;
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  bool started_ = false;
  std::exception_ptr error_;
};

// One recording of an event: the marker's position on its stream.
struct Recording {
  SimStream* stream = nullptr;
  std::uint64_t position = 0;
  std::atomic<std::int64_t> t_ns{-1};
  bool done() const { return stream->reached(position); }
};

struct SimEvent {
  explicit SimEvent(DeviceIndex d) : device(d) {}
  const DeviceIndex device;
  std::mutex mutex;
  std::shared_ptr<Recording> last;  // null: never recorded

  std::shared_ptr<Recording> recording() {
    std::lock_guard<std::mutex> lock(mutex);
    return last;
  }
};

// ------------------------------------------------------------------ runtime

struct Runtime {
  Config installed;  // backend_name and num_devices never change
  std::atomic<std::int64_t> copy_latency_us{0};
  std::atomic<double> copy_bandwidth_gbps{1.0};
  std::atomic<bool> poison{false};
  std::array<std::array<std::unique_ptr<SimStream>, kStreamsPerDevice>, kMaxDevices> streams;
  std::array<std::atomic<std::uint32_t>, kMaxDevices> next_pool{};
};

// Leaked on purpose: worker threads are detached and may outlive main().
std::atomic<Runtime*> g_runtime{nullptr};
std::mutex g_install_mutex;

thread_local DeviceIndex t_device = 0;
thread_local std::array<StreamId, kMaxDevices> t_stream{};

Runtime& runtime() {
  auto* rt = g_runtime.load(std::memory_order_acquire);
  TORCH_CHECK(rt != nullptr, "offload::sim is not installed; call offload::sim::install() first");
  return *rt;
}

DeviceIndex resolve(DeviceIndex index) { return index < 0 ? t_device : index; }

SimStream& stream_ref(DeviceIndex index, StreamId id) {
  check_device(index);
  TORCH_CHECK(id >= 0 && id < kStreamsPerDevice, "offload::sim: stream id ", id, " is not a sim stream (ids are 0 to ",
              kStreamsPerDevice - 1, ")");
  return *runtime().streams[static_cast<std::size_t>(index)][static_cast<std::size_t>(id)];
}

SimStream& stream_ref(const c10::Stream& stream) {
  TORCH_CHECK(stream.device_type() == kSimType, "offload::sim: ", stream, " is not a ", c10::get_privateuse1_backend(),
              " stream");
  return stream_ref(resolve(stream.device_index()), stream.id());
}

std::string device_name(DeviceIndex index) { return c10::Device(kSimType, index).str(); }

// ------------------------------------------------------------------ block cache

// Sizes blocks are rounded up to (and cached under): 512 bytes below 1 MiB,
// 128 KiB above, so that nearby sizes share blocks.
std::size_t block_size_for(std::size_t n) {
  constexpr std::size_t kSmall = 512;
  constexpr std::size_t kLarge = std::size_t{128} << 10;
  const std::size_t unit = n < (std::size_t{1} << 20) ? kSmall : kLarge;
  return (n + unit - 1) / unit * unit;
}

// Idle blocks kept for reuse, by size: the device and the pinned host
// allocators each keep one per device. Not thread-safe (the owner's mutex
// guards it).
class BlockCache {
 public:
  // Above this many idle bytes the largest idle blocks go back to malloc.
  static constexpr std::size_t kMaxIdleBytes = std::size_t{1} << 30;

  // Best fit among the idle blocks of at least `size` bytes, at most a
  // quarter larger; nullopt if none.
  std::optional<std::pair<void*, std::size_t>> take(std::size_t size) {
    auto it = idle_.lower_bound(size);
    if (it == idle_.end() || it->first > size + size / 4) {
      return std::nullopt;
    }
    std::pair<void*, std::size_t> out{it->second, it->first};
    idle_bytes_ -= it->first;
    idle_.erase(it);
    return out;
  }

  // Keeps a block; returns the blocks to free (the largest first) when the
  // cache holds more than kMaxIdleBytes.
  std::vector<std::pair<void*, std::size_t>> put(void* ptr, std::size_t size) {
    idle_.emplace(size, ptr);
    idle_bytes_ += size;
    std::vector<std::pair<void*, std::size_t>> out;
    while (idle_bytes_ > kMaxIdleBytes) {
      auto last = std::prev(idle_.end());
      out.emplace_back(last->second, last->first);
      idle_bytes_ -= last->first;
      idle_.erase(last);
    }
    return out;
  }

  // Every idle block, removed from the cache.
  std::vector<std::pair<void*, std::size_t>> take_all() {
    std::vector<std::pair<void*, std::size_t>> out;
    for (const auto& [size, ptr] : idle_) {
      out.emplace_back(ptr, size);
    }
    idle_.clear();
    idle_bytes_ = 0;
    return out;
  }

 private:
  std::multimap<std::size_t, void*> idle_;
  std::size_t idle_bytes_ = 0;
};

void free_all(const std::vector<std::pair<void*, std::size_t>>& blocks) {
  for (const auto& block : blocks) {
    c10::free_cpu(block.first);
  }
}

// ------------------------------------------------------------------ device allocator

struct Block {
  void* ptr = nullptr;
  std::size_t size = 0;       // bytes of the block (rounded)
  std::size_t requested = 0;  // bytes asked for (what the counters count)
  DeviceIndex device = 0;
  StreamId alloc_stream = 0;
  std::vector<std::pair<DeviceIndex, StreamId>> recorded;  // guarded by the allocator mutex
};

void delete_block(void* ctx);

struct Counters {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocations = 0;
  std::int64_t frees = 0;
  std::int64_t current_blocks = 0;
  std::int64_t peak_blocks = 0;
  std::int64_t reserved = 0;
  std::int64_t peak_reserved = 0;
  std::int64_t reserved_blocks = 0;
  std::int64_t peak_reserved_blocks = 0;
  std::int64_t system_allocs = 0;
  std::int64_t system_frees = 0;
  std::int64_t pending_releases = 0;
  std::int64_t num_ooms = 0;

  void add(std::int64_t bytes) {
    current += bytes;
    peak = std::max(peak, current);
    ++allocations;
    ++current_blocks;
    peak_blocks = std::max(peak_blocks, current_blocks);
  }
  void remove(std::int64_t bytes) {
    current -= bytes;
    ++frees;
    --current_blocks;
  }
  void reserve(std::size_t bytes) {
    reserved += static_cast<std::int64_t>(bytes);
    peak_reserved = std::max(peak_reserved, reserved);
    ++reserved_blocks;
    peak_reserved_blocks = std::max(peak_reserved_blocks, reserved_blocks);
    ++system_allocs;
  }
  void unreserve(const std::vector<std::pair<void*, std::size_t>>& blocks) {
    for (const auto& block : blocks) {
      reserved -= static_cast<std::int64_t>(block.second);
      --reserved_blocks;
      ++system_frees;
    }
  }
  MemoryStats stats() const { return {current, peak, allocations, frees, reserved, peak_reserved}; }
};

class SimDeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(std::size_t n) override {
    const DeviceIndex d = t_device;
    check_device(d);
    const c10::Device device(kSimType, d);
    if (n == 0) {
      return {nullptr, nullptr, &delete_block, device};
    }
    const auto bytes = static_cast<std::int64_t>(n);
    auto size = block_size_for(n);
    std::optional<std::pair<void*, std::size_t>> cached;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto& c = counters_[static_cast<std::size_t>(d)];
      const auto fits = [&] {
        const auto cap = capacity_.load();
        return cap == 0 || c.current + bytes <= cap;
      };
      // Like a caching allocator that waits for freed blocks' events before
      // giving up: releases already queued behind stream work are waited for.
      if (!fits() && c.pending_releases > 0) {
        released_cv_.wait(lock, [&] { return fits() || c.pending_releases == 0; });
      }
      if (!fits()) {
        ++c.num_ooms;
        const auto cap = capacity_.load();
        TORCH_CHECK_WITH(OutOfMemoryError, false, "offload::sim: out of memory on ", device_name(d),
                         ": tried to allocate ", bytes, " bytes; capacity ", cap, " bytes, ", c.current,
                         " bytes in use, ", std::max<std::int64_t>(cap - c.current, 0), " bytes free");
      }
      c.add(bytes);
      trace_locked(d);
      cached = cache_[static_cast<std::size_t>(d)].take(size);
    }
    void* ptr = nullptr;
    if (cached) {
      ptr = cached->first;
      size = cached->second;
    } else {
      try {
        ptr = c10::alloc_cpu(size);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto& c = counters_[static_cast<std::size_t>(d)];
        c.current -= bytes;
        --c.allocations;
        --c.current_blocks;
        throw;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      counters_[static_cast<std::size_t>(d)].reserve(size);
    }
    if (runtime().poison.load()) {
      std::memset(ptr, 0xFF, size);
    }
    auto* block = new Block{ptr, size, n, d, t_stream[static_cast<std::size_t>(d)], {}};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(reinterpret_cast<std::uintptr_t>(ptr), block);
    }
    return {ptr, block, &delete_block, device};
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  bool initialized() override { return g_runtime.load() != nullptr; }

  // Returns the idle blocks of every device to malloc (blocks in use, in
  // the poison quarantine or waiting for stream work stay).
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    std::vector<std::pair<void*, std::size_t>> to_free;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (std::size_t d = 0; d < kMaxDevices; ++d) {
        auto blocks = cache_[d].take_all();
        counters_[d].unreserve(blocks);
        to_free.insert(to_free.end(), blocks.begin(), blocks.end());
      }
    }
    free_all(to_free);
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (ptr.get_deleter() != &delete_block || ptr.get_context() == nullptr) {
      return;
    }
    TORCH_CHECK(stream.device_type() == kSimType, "offload::sim: recordStream needs a ", c10::get_privateuse1_backend(),
                " stream, got ", stream);
    auto* block = static_cast<Block*>(ptr.get_context());
    const std::pair<DeviceIndex, StreamId> key{resolve(stream.device_index()), stream.id()};
    std::lock_guard<std::mutex> lock(mutex_);
    if (key == std::pair<DeviceIndex, StreamId>{block->device, block->alloc_stream}) {
      return;
    }
    if (std::find(block->recorded.begin(), block->recorded.end(), key) == block->recorded.end()) {
      block->recorded.push_back(key);
    }
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(DeviceIndex index) override {
    const auto c = counters(index);
    c10::CachingDeviceAllocator::DeviceStats out;
    constexpr auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const auto fill_bytes = [&](c10::CachingAllocator::Stat& s) {
      s.current = c.current;
      s.peak = c.peak;
    };
    fill_bytes(out.allocated_bytes[agg]);
    fill_bytes(out.active_bytes[agg]);
    fill_bytes(out.requested_bytes[agg]);
    out.reserved_bytes[agg].current = c.reserved;
    out.reserved_bytes[agg].peak = c.peak_reserved;
    for (auto* s : {&out.allocation[agg], &out.active[agg]}) {
      s->current = c.current_blocks;
      s->peak = c.peak_blocks;
      s->allocated = c.allocations;
      s->freed = c.frees;
    }
    out.segment[agg].current = c.reserved_blocks;
    out.segment[agg].peak = c.peak_reserved_blocks;
    out.segment[agg].allocated = c.system_allocs;
    out.segment[agg].freed = c.system_frees;
    out.num_ooms = c.num_ooms;
    out.num_device_alloc = c.system_allocs;
    out.num_device_free = c.system_frees;
    return out;
  }

  void resetAccumulatedStats(DeviceIndex index) override {
    check_device(index);
    std::lock_guard<std::mutex> lock(mutex_);
    auto& c = counters_[static_cast<std::size_t>(index)];
    c.allocations = 0;
    c.frees = 0;
    c.system_allocs = 0;
    c.system_frees = 0;
    c.num_ooms = 0;
  }

  void resetPeakStats(DeviceIndex index) override {
    check_device(index);
    std::lock_guard<std::mutex> lock(mutex_);
    auto& c = counters_[static_cast<std::size_t>(index)];
    c.peak = c.current;
    c.peak_blocks = c.current_blocks;
    c.peak_reserved = c.reserved;
    c.peak_reserved_blocks = c.reserved_blocks;
  }

  std::pair<std::size_t, std::size_t> getMemoryInfo(DeviceIndex index) override {
    const auto c = counters(index);
    auto total = capacity_.load();
    if (total == 0) {
      total = static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::int64_t>(sysconf(_SC_PAGE_SIZE));
    }
    const auto free_bytes = std::max<std::int64_t>(total - c.current, 0);
    return {static_cast<std::size_t>(free_bytes), static_cast<std::size_t>(total)};
  }

  Counters counters(DeviceIndex index) {
    check_device(index);
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_[static_cast<std::size_t>(index)];
  }

  std::optional<DeviceIndex> device_of(const void* p) {
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.upper_bound(addr);
    if (it == live_.begin()) {
      return std::nullopt;
    }
    --it;
    if (addr < it->first + it->second->requested) {
      return it->second->device;
    }
    return std::nullopt;
  }

  void set_capacity(std::int64_t bytes) { capacity_.store(bytes); }
  std::int64_t capacity() const { return capacity_.load(); }

  void set_trace(bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    trace_on_ = on;
    if (on) {
      trace_.clear();
      trace_t0_ns_ = now_ns();
    }
  }

  std::vector<TracePoint> take_trace() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(trace_, {});
  }

  // Called by the DataPtr deleter: releases now if no stream that used the
  // block has pending work, else queues the release behind that work.
  void free_block(Block* block) {
    std::vector<std::pair<DeviceIndex, StreamId>> users;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.erase(reinterpret_cast<std::uintptr_t>(block->ptr));
      users = block->recorded;
    }
    users.insert(users.begin(), {block->device, block->alloc_stream});
    std::vector<std::pair<SimStream*, std::uint64_t>> pending;
    auto& rt = runtime();
    for (const auto& [d, id] : users) {
      auto* s = rt.streams[static_cast<std::size_t>(d)][static_cast<std::size_t>(id)].get();
      if (auto position = s->pending_position()) {
        pending.emplace_back(s, *position);
      }
    }
    if (pending.empty()) {
      release(block, false);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++counters_[static_cast<std::size_t>(block->device)].pending_releases;
    }
    auto* first = pending.front().first;
    pending.erase(pending.begin());
    // Every wait targets work queued before this call, so no cycle can form.
    first->enqueue([this, block, others = std::move(pending)] {
      for (const auto& [s, position] : others) {
        s->wait(position);
      }
      release(block, true);
    });
  }

 private:
  static constexpr std::size_t kQuarantineBytes = std::size_t{64} << 20;
  static constexpr std::size_t kQuarantineBlocks = 1024;

  // Poisons (checking mode) and counts the block, then makes it reusable.
  // In checking mode it first waits in a bounded FIFO quarantine, so that a
  // late read of a released block reads the poison rather than the data of
  // the block's next owner; blocks leaving the quarantine join the cache.
  void release(Block* block, bool queued) {
    const bool poison = runtime().poison.load();
    if (poison) {
      std::memset(block->ptr, 0xFF, block->size);
    }
    std::vector<std::pair<void*, std::size_t>> to_free;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto d = static_cast<std::size_t>(block->device);
      auto& c = counters_[d];
      c.remove(static_cast<std::int64_t>(block->requested));
      if (queued) {
        --c.pending_releases;
      }
      trace_locked(block->device);
      const auto cache = [&](DeviceIndex device, void* ptr, std::size_t size) {
        auto evicted = cache_[static_cast<std::size_t>(device)].put(ptr, size);
        counters_[static_cast<std::size_t>(device)].unreserve(evicted);
        to_free.insert(to_free.end(), evicted.begin(), evicted.end());
      };
      if (poison) {
        quarantine_.push_back({block->ptr, block->size, block->device});
        quarantine_bytes_ += block->size;
        while (quarantine_bytes_ > kQuarantineBytes || quarantine_.size() > kQuarantineBlocks) {
          const auto old = quarantine_.front();
          quarantine_.pop_front();
          quarantine_bytes_ -= old.size;
          cache(old.device, old.ptr, old.size);
        }
      } else {
        cache(block->device, block->ptr, block->size);
      }
    }
    if (queued) {
      released_cv_.notify_all();
    }
    free_all(to_free);
    delete block;
  }

  void trace_locked(DeviceIndex d) {
    if (trace_on_ && d == 0) {
      trace_.push_back({(now_ns() - trace_t0_ns_) / 1000, counters_[0].current});
    }
  }

  std::mutex mutex_;
  std::condition_variable released_cv_;
  std::array<Counters, kMaxDevices> counters_{};
  std::map<std::uintptr_t, Block*> live_;
  struct Quarantined {
    void* ptr;
    std::size_t size;
    DeviceIndex device;
  };
  std::deque<Quarantined> quarantine_;
  std::array<BlockCache, kMaxDevices> cache_;
  std::size_t quarantine_bytes_ = 0;
  std::atomic<std::int64_t> capacity_{0};
  bool trace_on_ = false;
  std::int64_t trace_t0_ns_ = 0;
  std::vector<TracePoint> trace_;
};

SimDeviceAllocator& device_allocator() {
  static auto* instance = new SimDeviceAllocator();
  return *instance;
}

void delete_block(void* ctx) {
  if (ctx != nullptr) {
    device_allocator().free_block(static_cast<Block*>(ctx));
  }
}

// ------------------------------------------------------------------ host allocator

void delete_host(void* ctx);

class SimHostAllocator final : public c10::Allocator {
 public:
  // Reuses an idle block of the cache when one fits (no stream ordering is
  // needed: a queued copy keeps its CPU tensor, hence the block, alive).
  c10::DataPtr allocate(std::size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) {
      return {nullptr, nullptr, &delete_host, cpu};
    }
    auto size = block_size_for(n);
    std::optional<std::pair<void*, std::size_t>> cached;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cached = cache_.take(size);
    }
    void* ptr = nullptr;
    if (cached) {
      ptr = cached->first;
      size = cached->second;
    } else {
      ptr = c10::alloc_cpu(size);
    }
    if (runtime().poison.load()) {
      std::memset(ptr, 0xFF, size);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (!cached) {
      counters_.reserve(size);
    }
    live_.emplace(reinterpret_cast<std::uintptr_t>(ptr), HostBlock{n, size});
    counters_.add(static_cast<std::int64_t>(n));
    return {ptr, ptr, &delete_host, cpu};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &delete_host; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  void free(void* ptr) {
    std::size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
      TORCH_INTERNAL_ASSERT(it != live_.end(), "offload::sim: unknown pinned block");
      counters_.remove(static_cast<std::int64_t>(it->second.requested));
      size = it->second.size;
      live_.erase(it);
    }
    if (runtime().poison.load()) {
      std::memset(ptr, 0xFF, size);
    }
    std::vector<std::pair<void*, std::size_t>> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      evicted = cache_.put(ptr, size);
      counters_.unreserve(evicted);
    }
    free_all(evicted);
  }

  void empty_cache() {
    std::vector<std::pair<void*, std::size_t>> idle;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      idle = cache_.take_all();
      counters_.unreserve(idle);
    }
    free_all(idle);
  }

  bool is_pinned(const void* p) {
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.upper_bound(addr);
    if (it == live_.begin()) {
      return false;
    }
    --it;
    return addr < it->first + it->second.requested;
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_.stats();
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    counters_.peak = counters_.current;
    counters_.peak_reserved = counters_.reserved;
  }

 private:
  struct HostBlock {
    std::size_t requested;
    std::size_t size;
  };
  std::mutex mutex_;
  std::map<std::uintptr_t, HostBlock> live_;
  BlockCache cache_;
  Counters counters_;
};

SimHostAllocator& host_allocator() {
  static auto* instance = new SimHostAllocator();
  return *instance;
}

void delete_host(void* ctx) {
  if (ctx != nullptr) {
    host_allocator().free(ctx);
  }
}

// ------------------------------------------------------------------ guard

void check_index_loose(DeviceIndex index) {
  auto* rt = g_runtime.load(std::memory_order_acquire);
  const int limit = rt != nullptr ? rt->installed.num_devices : kMaxDevices;
  TORCH_CHECK(index >= 0 && index < limit, "offload::sim: device index ", static_cast<int>(index),
              " is out of range [0, ", limit, ")");
}

struct SimGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kSimType; }

  c10::Device exchangeDevice(c10::Device device) const override {
    const auto old = getDevice();
    setDevice(device);
    return old;
  }

  c10::Device getDevice() const override { return {kSimType, t_device}; }

  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kSimType, "offload::sim: setDevice needs a sim device, got ", device);
    if (device.index() < 0) {
      return;
    }
    // Before install() the autograd engine's device threads may already
    // set their device; any index below kMaxDevices is accepted then.
    check_index_loose(device.index());
    t_device = device.index();
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < kMaxDevices) {
      t_device = device.index();
    }
  }

  c10::Stream getStream(c10::Device device) const override {
    const auto index = resolve(device.index());
    check_device(index);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kSimType, index), t_stream[static_cast<std::size_t>(index)]);
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    const auto index = resolve(device.index());
    check_device(index);
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kSimType, index));
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool /*isHighPriority*/) const override {
    const auto index = resolve(device.index());
    check_device(index);
    const auto n = runtime().next_pool[static_cast<std::size_t>(index)].fetch_add(1);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kSimType, index), static_cast<StreamId>(1 + n % kPoolStreams));
  }

  // The pool is small and fixed (like CUDA's): a "new" stream is the next
  // pool stream.
  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override {
    return getStreamFromGlobalPool(device, false);
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    auto& s = stream_ref(stream);
    auto& slot = t_stream[static_cast<std::size_t>(s.device())];
    const auto old = slot;
    slot = s.id();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kSimType, s.device()), old);
  }

  void* getStreamNativeHandle(const c10::Stream stream) const override { return &stream_ref(stream); }

  void destroyEvent(void* event, const DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<SimEvent*>(event);
  }

  void record(void** event, const c10::Stream& stream, const DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    auto& s = stream_ref(stream);
    TORCH_CHECK(device_index == -1 || device_index == s.device(), "offload::sim: event device index ",
                static_cast<int>(device_index), " does not match the recording stream's device ",
                static_cast<int>(s.device()));
    if (*event == nullptr) {
      *event = new SimEvent(s.device());
    }
    auto* ev = static_cast<SimEvent*>(*event);
    TORCH_CHECK(ev->device == s.device(), "offload::sim: event of ", device_name(ev->device),
                " cannot be recorded on a stream of ", device_name(s.device()));
    auto rec = std::make_shared<Recording>();
    rec->stream = &s;
    rec->position = s.mark([rec] { rec->t_ns.store(now_ns()); });
    std::lock_guard<std::mutex> lock(ev->mutex);
    ev->last = std::move(rec);
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) {
      return;
    }
    auto rec = static_cast<SimEvent*>(event)->recording();
    if (!rec) {
      return;
    }
    auto& s = stream_ref(stream);
    if (rec->stream == &s || rec->done()) {
      return;  // FIFO order already waits for it, or there is nothing left to wait for
    }
    s.enqueue([rec] { rec->stream->wait(rec->position); });
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) {
      return true;
    }
    auto rec = static_cast<SimEvent*>(event)->recording();
    return !rec || rec->done();
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) {
      return;
    }
    if (auto rec = static_cast<SimEvent*>(event)->recording()) {
      rec->stream->wait(rec->position);
    }
  }

  DeviceIndex deviceCount() const noexcept override {
    // Before install() report the maximum so that an autograd engine
    // started earlier has a ready queue for every possible sim device.
    auto* rt = g_runtime.load(std::memory_order_acquire);
    return static_cast<DeviceIndex>(rt != nullptr ? rt->installed.num_devices : kMaxDevices);
  }

  bool queryStream(const c10::Stream& stream) const override { return stream_ref(stream).idle(); }

  void synchronizeStream(const c10::Stream& stream) const override { stream_ref(stream).synchronize(); }

  void synchronizeDevice(const DeviceIndex device_index) const override { offload::sim::synchronize(device_index); }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    device_allocator().recordStream(data_ptr, stream);
  }

  double elapsedTime(void* event1, void* event2, const DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(event1 != nullptr && event2 != nullptr,
                "offload::sim: both events must be recorded before calculating elapsed time");
    auto r1 = static_cast<SimEvent*>(event1)->recording();
    auto r2 = static_cast<SimEvent*>(event2)->recording();
    TORCH_CHECK(r1 && r2, "offload::sim: both events must be recorded before calculating elapsed time");
    TORCH_CHECK(r1->done() && r2->done(),
                "offload::sim: both events must be completed before calculating elapsed time");
    return static_cast<double>(r2->t_ns.load() - r1->t_ns.load()) / 1e6;
  }
};

SimGuardImpl& guard_impl() {
  static auto* instance = new SimGuardImpl();
  return *instance;
}

// Registered at load time (see install()'s documentation for why).
const c10::impl::DeviceGuardImplRegistrar g_guard_registrar(kSimType, &guard_impl());

// So that make_manager's errors say this program has the sim device.
const bool g_noted_linked = (offload::detail::note_linked("sim"), true);

// ------------------------------------------------------------------ hooks

struct SimHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_runtime.load() != nullptr; }
  bool hasPrimaryContext(DeviceIndex /*device_index*/) const override { return true; }
  void init() const override {}
  DeviceIndex deviceCount() const override {
    auto* rt = g_runtime.load();
    return static_cast<DeviceIndex>(rt != nullptr ? rt->installed.num_devices : 0);
  }
  void setCurrentDevice(DeviceIndex device) const override { guard_impl().setDevice({kSimType, device}); }
  DeviceIndex getCurrentDevice() const override { return t_device; }
  DeviceIndex exchangeDevice(DeviceIndex device) const override {
    return guard_impl().exchangeDevice({kSimType, device}).index();
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex device) const override { return exchangeDevice(device); }
  bool isPinnedPtr(const void* data) const override { return host_allocator().is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &host_allocator(); }
  at::Device getDeviceFromPtr(void* data) const override {
    const auto device = device_allocator().device_of(data);
    TORCH_CHECK(device.has_value(), "offload::sim: ", data, " is not in a live sim device block");
    return {kSimType, *device};
  }
  // Kernels run on the CPU through the fallback, with the CPU generator; the
  // sim device shares it so that seeded runs match the CPU bit for bit.
  const at::Generator& getDefaultGenerator(DeviceIndex /*device_index*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(DeviceIndex /*device_index*/ = -1) const override {
    return at::detail::createCPUGenerator();
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, std::size_t newsize) const override {
    TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
    const auto index = storage.device().index();
    check_device(index);
    drain_current(index);
    const auto old_device = std::exchange(t_device, index);
    c10::DataPtr data;
    try {
      data = device_allocator().allocate(newsize);
    } catch (...) {
      t_device = old_device;
      throw;
    }
    t_device = old_device;
    const auto keep = std::min(newsize, storage.nbytes());
    if (keep > 0 && storage.data() != nullptr) {
      std::memcpy(data.get(), storage.data(), keep);
    }
    auto* impl = storage.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(std::move(data));
    impl->set_nbytes(newsize);
  }
};

SimHooks& hooks() {
  static auto* instance = new SimHooks();
  return *instance;
}

// ------------------------------------------------------------------ config

bool valid_backend_name(const std::string& name) {
  static const std::array<const char*, 24> in_tree = {
      "cpu", "cuda", "ipu",    "xpu", "mkldnn", "opengl", "opencl", "ideep",         "hip",   "ve",  "fpga",  "maia",
      "xla", "lazy", "vulkan", "mps", "meta",   "hpu",    "mtia",   "privateuseone", "msnpu", "ort", "metal", "mkl"};
  if (name.empty() || name.size() > 32 || name[0] < 'a' || name[0] > 'z') {
    return false;
  }
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
    if (!ok) {
      return false;
    }
  }
  return std::none_of(in_tree.begin(), in_tree.end(), [&](const char* t) { return name == t; });
}

void check_latency(std::int64_t us, const char* where) {
  TORCH_CHECK_VALUE(us >= 0 && us <= kMaxCopyLatencyUs, where, ": copy_latency_us must be in [0, ", kMaxCopyLatencyUs,
                    "], got ", us);
}

void check_bandwidth(double gbps, const char* where) {
  // Written so that NaN fails too.
  TORCH_CHECK_VALUE(gbps > 0.0 && gbps <= kMaxCopyBandwidthGbps, where, ": copy_bandwidth_gbps must be in (0, ",
                    kMaxCopyBandwidthGbps, "], got ", gbps);
}

void check_capacity(std::int64_t bytes, const char* where) {
  TORCH_CHECK_VALUE(bytes >= 0, where, ": capacity_bytes must be >= 0 (0 = unlimited), got ", bytes);
}

void validate(const Config& c) {
  constexpr const char* where = "offload::sim::Config";
  TORCH_CHECK_VALUE(valid_backend_name(c.backend_name), where,
                    ": backend_name must be 1 to 32 characters from [a-z0-9_], start with a letter "
                    "and not name an in-tree device type, got '",
                    c.backend_name, "'");
  TORCH_CHECK_VALUE(c.num_devices >= 1 && c.num_devices <= kMaxDevices, where, ": num_devices must be in [1, ",
                    kMaxDevices, "], got ", c.num_devices);
  check_capacity(c.capacity_bytes, where);
  check_latency(c.copy_latency_us, where);
  check_bandwidth(c.copy_bandwidth_gbps, where);
}

std::string differences(const Config& have, const Config& want) {
  std::ostringstream out;
  const char* sep = "";
  const auto field = [&](const char* name, const auto& a, const auto& b) {
    if (!(a == b)) {
      out << sep << name << ": installed " << a << ", requested " << b;
      sep = "; ";
    }
  };
  field("backend_name", "'" + have.backend_name + "'", "'" + want.backend_name + "'");
  field("num_devices", have.num_devices, want.num_devices);
  field("capacity_bytes", have.capacity_bytes, want.capacity_bytes);
  field("copy_latency_us", have.copy_latency_us, want.copy_latency_us);
  field("copy_bandwidth_gbps", have.copy_bandwidth_gbps, want.copy_bandwidth_gbps);
  field("poison_freed", have.poison_freed, want.poison_freed);
  return out.str();
}

// Registered by install(), so it runs before the statics constructed
// earlier are destroyed (Python drains sooner: torch_offload.sim registers
// its own drain with Python's atexit). Work queued from here on (e.g. a
// release a static's destructor queues) runs on the thread that queues it,
// so the idle, detached workers touch nothing more and the process exits
// with its own status.
void drain_everything_at_exit() {
  auto* rt = g_runtime.load();
  if (rt == nullptr) {
    return;
  }
  g_exiting.store(true);
  for (int d = 0; d < rt->installed.num_devices; ++d) {
    for (auto& s : rt->streams[static_cast<std::size_t>(d)]) {
      try {
        s->synchronize();
      } catch (...) {  // errors of queued work have nobody left to report to
      }
    }
  }
}

}  // namespace

void check_device(DeviceIndex index) {
  auto& rt = runtime();
  TORCH_CHECK(index >= 0 && index < rt.installed.num_devices, "offload::sim: device index ", static_cast<int>(index),
              " is out of range: ", rt.installed.backend_name, " has ", rt.installed.num_devices, " device(s)");
}

StreamId current_stream_id(DeviceIndex index) {
  check_device(index);
  return t_stream[static_cast<std::size_t>(index)];
}

void enqueue(DeviceIndex index, StreamId id, std::function<void()> task) {
  stream_ref(index, id).enqueue(std::move(task));
}

void drain_current(DeviceIndex index) { stream_ref(index, current_stream_id(index)).synchronize(); }

std::int64_t link_time_ns(std::size_t bytes) {
  auto& rt = runtime();
  const auto latency_ns = rt.copy_latency_us.load(std::memory_order_relaxed) * 1000;
  // 1 GB/s moves one byte per nanosecond.
  const double transfer_ns = static_cast<double>(bytes) / rt.copy_bandwidth_gbps.load(std::memory_order_relaxed);
  return latency_ns + static_cast<std::int64_t>(transfer_ns);
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

}  // namespace detail

// ------------------------------------------------------------------ public API

void install(const Config& config) {
  detail::validate(config);
  std::lock_guard<std::mutex> lock(detail::g_install_mutex);
  if (installed()) {
    // Compared with what was installed: the runtime knobs may have moved since.
    const auto& have = detail::runtime().installed;
    TORCH_CHECK(have == config, "offload::sim::install: already installed with a different Config (",
                detail::differences(have, config), ")");
    return;
  }
  TORCH_CHECK(!c10::is_privateuse1_backend_registered() || c10::get_privateuse1_backend() == config.backend_name,
              "offload::sim::install: the PrivateUse1 backend is already registered as '",
              c10::get_privateuse1_backend(), "', cannot register '", config.backend_name, "'");

  auto* rt = new detail::Runtime();
  rt->installed = config;
  rt->copy_latency_us.store(config.copy_latency_us);
  rt->copy_bandwidth_gbps.store(config.copy_bandwidth_gbps);
  rt->poison.store(config.poison_freed);
  for (int d = 0; d < config.num_devices; ++d) {
    for (int id = 0; id < detail::kStreamsPerDevice; ++id) {
      rt->streams[static_cast<std::size_t>(d)][static_cast<std::size_t>(id)] =
          std::make_unique<detail::SimStream>(static_cast<c10::DeviceIndex>(d), static_cast<c10::StreamId>(id));
    }
  }
  detail::device_allocator().set_capacity(config.capacity_bytes);

  c10::register_privateuse1_backend(config.backend_name);
  // Re-register the guard in case another library overwrote the slot.
  const c10::impl::DeviceGuardImplRegistrar registrar(c10::DeviceType::PrivateUse1, &detail::guard_impl());
  c10::SetAllocator(c10::DeviceType::PrivateUse1, &detail::device_allocator());
  at::RegisterPrivateUse1HooksInterface(&detail::hooks());
  detail::g_runtime.store(rt, std::memory_order_release);
  detail::register_kernels();
  std::atexit(&detail::drain_everything_at_exit);
}

bool installed() noexcept { return detail::g_runtime.load(std::memory_order_acquire) != nullptr; }

Config config() {
  auto& rt = detail::runtime();
  Config out = rt.installed;
  out.copy_latency_us = rt.copy_latency_us.load();
  out.copy_bandwidth_gbps = rt.copy_bandwidth_gbps.load();
  out.poison_freed = rt.poison.load();
  out.capacity_bytes = detail::device_allocator().capacity();
  return out;
}

void set_copy_latency_us(std::int64_t us) {
  detail::check_latency(us, "offload::sim::set_copy_latency_us");
  detail::runtime().copy_latency_us.store(us);
}

void set_copy_bandwidth_gbps(double gbps) {
  detail::check_bandwidth(gbps, "offload::sim::set_copy_bandwidth_gbps");
  detail::runtime().copy_bandwidth_gbps.store(gbps);
}

void set_poison_freed(bool on) { detail::runtime().poison.store(on); }

void set_capacity_bytes(std::int64_t bytes) {
  detail::check_capacity(bytes, "offload::sim::set_capacity_bytes");
  (void)detail::runtime();
  detail::device_allocator().set_capacity(bytes);
}

ScopedKnobs::ScopedKnobs() {
  const auto c = config();
  copy_latency_us_ = c.copy_latency_us;
  copy_bandwidth_gbps_ = c.copy_bandwidth_gbps;
  capacity_bytes_ = c.capacity_bytes;
  poison_freed_ = c.poison_freed;
}

ScopedKnobs::~ScopedKnobs() {
  auto* rt = detail::g_runtime.load();
  rt->copy_latency_us.store(copy_latency_us_);
  rt->copy_bandwidth_gbps.store(copy_bandwidth_gbps_);
  rt->poison.store(poison_freed_);
  detail::device_allocator().set_capacity(capacity_bytes_);
}

MemoryStats device_memory(c10::DeviceIndex index) { return detail::device_allocator().counters(index).stats(); }

void reset_peak(c10::DeviceIndex index) { detail::device_allocator().resetPeakStats(index); }

MemoryStats host_memory() {
  (void)detail::runtime();
  return detail::host_allocator().stats();
}

void reset_host_peak() { detail::host_allocator().reset_peak(); }

void empty_cache() {
  (void)detail::runtime();
  detail::device_allocator().emptyCache(c10::MempoolId_t{0, 0});
  detail::host_allocator().empty_cache();
}

void synchronize(c10::DeviceIndex index) {
  const auto d = detail::resolve(index);
  detail::check_device(d);
  for (auto& s : detail::runtime().streams[static_cast<std::size_t>(d)]) {
    s->synchronize();
  }
}

void set_trace(bool on) { detail::device_allocator().set_trace(on); }

std::vector<TracePoint> take_trace() { return detail::device_allocator().take_trace(); }

}  // namespace offload::sim
