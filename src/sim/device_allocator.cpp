// SPDX-License-Identifier: MIT
//
// The sim's device allocator: counting, with a capacity, a per-device cache
// of idle blocks, poisoning and quarantine in checking mode, and
// stream-ordered release (a block used by a stream with pending work is
// released behind that work).

#include "block_cache.hpp"
#include "checker.hpp"
#include "internal.hpp"

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace offload::sim {
namespace detail {
namespace {

using c10::DeviceIndex;
using c10::StreamId;

struct Block {
  void* ptr = nullptr;
  std::size_t size = 0;       // bytes of the block (rounded)
  std::size_t requested = 0;  // bytes asked for (what the counters count)
  DeviceIndex device = 0;
  StreamId alloc_stream = 0;
  std::vector<std::pair<DeviceIndex, StreamId>> recorded;  // guarded by the allocator mutex
};

void delete_block(void* ctx);

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
      // giving up: releases already queued behind stream work, of blocks
      // that still count, are waited for.
      if (!fits() && c.pending_counted > 0) {
        released_cv_.wait(lock, [&] { return fits() || c.pending_counted == 0; });
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
        counters_[static_cast<std::size_t>(d)].undo_add(bytes);
        throw;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      counters_[static_cast<std::size_t>(d)].reserve(size);
    }
    if (runtime().poison.load()) {
      std::memset(ptr, 0xFF, size);
    }
    if (check::on()) check::device_block_allocated(ptr, !cached);
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
    fill_bytes(out.active_bytes[agg]);
    fill_bytes(out.requested_bytes[agg]);
    out.allocated_bytes[agg].current = c.allocated;
    out.allocated_bytes[agg].peak = c.peak_allocated;
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
    c.peak_allocated = c.allocated;
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

  // Called by the DataPtr deleter. Like a stream-ordered caching
  // allocator, a block stops counting as in use at its free unless a
  // stream recorded on it (recordStream) has pending work: its own stream
  // runs whatever comes next after the work queued before the free. It is
  // released (poisoned, reusable) only once every stream that used it has
  // run that work: now if none has any, else queued behind it.
  void free_block(Block* block) {
    std::vector<std::pair<DeviceIndex, StreamId>> users;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.erase(reinterpret_cast<std::uintptr_t>(block->ptr));
      users = block->recorded;
      // CUDA's allocated bytes drop at the free, whatever a recorded stream
      // still does with the block (its active bytes are `current`).
      counters_[static_cast<std::size_t>(block->device)].allocated -= static_cast<std::int64_t>(block->requested);
    }
    if (check::on()) check::device_block_freed(block->ptr, block->device, block->alloc_stream, users);
    std::vector<std::pair<SimStream*, std::uint64_t>> pending;
    auto& rt = runtime();
    const auto add_pending = [&](DeviceIndex d, StreamId id) {
      auto* s = rt.streams[static_cast<std::size_t>(d)][static_cast<std::size_t>(id)].get();
      if (auto position = s->pending_position()) pending.emplace_back(s, *position);
    };
    for (const auto& [d, id] : users) add_pending(d, id);
    const bool counted_now = pending.empty();  // no other stream still uses it
    add_pending(block->device, block->alloc_stream);
    if (pending.empty()) {
      release(block, false, false);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& c = counters_[static_cast<std::size_t>(block->device)];
      if (counted_now) {
        c.remove(static_cast<std::int64_t>(block->requested));
        trace_locked(block->device);
      } else {
        ++c.pending_counted;
      }
    }
    if (counted_now) released_cv_.notify_all();  // an allocation waiting for room may fit now
    // The stream queued last (its own, when it has work) runs the release.
    auto* last = pending.back().first;
    pending.pop_back();
    // Every wait targets work queued before this call, so no cycle can form.
    last->enqueue([this, block, counted_now, others = std::move(pending)] {
      for (const auto& [s, position] : others) {
        s->wait(position);
      }
      release(block, true, counted_now);
    });
  }

 private:
  static constexpr std::size_t kQuarantineBytes = std::size_t{64} << 20;
  static constexpr std::size_t kQuarantineBlocks = 1024;

  // Poisons (checking mode) and counts the block, then makes it reusable.
  // In checking mode it first waits in a bounded FIFO quarantine, so that a
  // late read of a released block reads the poison rather than the data of
  // the block's next owner; blocks leaving the quarantine join the cache.
  // `counted`: the counters already dropped it (at its free).
  void release(Block* block, bool queued, bool counted) {
    const bool poison = runtime().poison.load();
    if (poison) {
      std::memset(block->ptr, 0xFF, block->size);
    }
    std::vector<std::pair<void*, std::size_t>> to_free;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto d = static_cast<std::size_t>(block->device);
      auto& c = counters_[d];
      if (!counted) {
        c.remove(static_cast<std::int64_t>(block->requested));
        trace_locked(block->device);
      }
      if (queued && !counted) --c.pending_counted;
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

SimDeviceAllocator& instance() {
  static auto* instance = new SimDeviceAllocator();
  return *instance;
}

void delete_block(void* ctx) {
  if (ctx != nullptr) {
    instance().free_block(static_cast<Block*>(ctx));
  }
}

}  // namespace

c10::DeviceAllocator& device_allocator() { return instance(); }

std::optional<DeviceIndex> device_of(const void* p) { return instance().device_of(p); }

void set_device_capacity(std::int64_t bytes) { instance().set_capacity(bytes); }

std::int64_t device_capacity() { return instance().capacity(); }

}  // namespace detail

MemoryStats device_memory(c10::DeviceIndex index) { return detail::instance().counters(index).stats(); }

void reset_peak(c10::DeviceIndex index) { detail::instance().resetPeakStats(index); }

void empty_cache() {
  (void)detail::runtime();
  detail::instance().emptyCache(c10::MempoolId_t{0, 0});
  detail::empty_host_cache();
}

void set_trace(bool on) { detail::instance().set_trace(on); }

std::vector<TracePoint> take_trace() { return detail::instance().take_trace(); }

}  // namespace offload::sim
