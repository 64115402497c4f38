// SPDX-License-Identifier: MIT
//
// The sim's pinned host allocator: counting, with a cache of idle blocks and
// poisoning in checking mode; what pin_memory() and pinned host buffers get.

#include "block_cache.hpp"
#include "checker.hpp"
#include "internal.hpp"
#include "runtime.hpp"

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace offload::sim {
namespace detail {
namespace {

void delete_host(void* ctx);

// The size of the block a request of `n` bytes takes (Config::host_power_of_two).
std::size_t host_block_size_for(std::size_t n) {
  return runtime().host_power_of_two.load(std::memory_order_relaxed) ? std::bit_ceil(n) : block_size_for(n);
}

class SimHostAllocator final : public c10::Allocator {
 public:
  // Reuses an idle block of the cache when one fits (no stream ordering is
  // needed: a queued copy keeps its CPU tensor, hence the block, alive); a
  // fresh block costs the caller Config::pinned_alloc_us, outside the lock
  // (as pinning pages costs the thread that asks, not the others).
  c10::DataPtr allocate(std::size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) {
      return {nullptr, nullptr, &delete_host, cpu};
    }
    auto size = host_block_size_for(n);
    std::optional<std::pair<void*, std::size_t>> cached;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cached = cache_.take(size, /*exact=*/true);  // a block of its rounded size, as CUDA's bins
    }
    void* ptr = nullptr;
    if (cached) {
      ptr = cached->first;
      size = cached->second;
    } else {
      if (const auto us = runtime().pinned_alloc_us.load(std::memory_order_relaxed); us > 0) {
        wait_until_ns(steady_now_ns() + us * 1000);
      }
      ptr = c10::alloc_cpu(size);
    }
    if (runtime().poison.load()) {
      std::memset(ptr, 0xFF, size);
    }
    if (check::on()) check::host_block_allocated(ptr);
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

SimHostAllocator& instance() {
  static auto* instance = new SimHostAllocator();
  return *instance;
}

void delete_host(void* ctx) {
  if (ctx != nullptr) {
    instance().free(ctx);
  }
}

}  // namespace

c10::Allocator& host_allocator() { return instance(); }

std::int64_t host_block_bytes(std::int64_t n) {
  return n <= 0 ? 0 : static_cast<std::int64_t>(host_block_size_for(static_cast<std::size_t>(n)));
}

bool is_pinned(const void* p) { return instance().is_pinned(p); }

void empty_host_cache() { instance().empty_cache(); }

}  // namespace detail

MemoryStats host_memory() {
  (void)detail::runtime();
  return detail::instance().stats();
}

void reset_host_peak() { detail::instance().reset_peak(); }

}  // namespace offload::sim
