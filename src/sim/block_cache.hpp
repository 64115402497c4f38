// SPDX-License-Identifier: MIT
#pragma once

// What the device and the pinned host allocators share (device_allocator.cpp,
// host_allocator.cpp): the rounding of block sizes, the cache of idle blocks,
// and the counters each keeps. Not installed.

#include <offload/sim.hpp>

#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace offload::sim::detail {

// Sizes blocks are rounded up to (and cached under): 512 bytes below 1 MiB,
// 128 KiB above, so that nearby sizes share blocks.
inline std::size_t block_size_for(std::size_t n) {
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
  // quarter larger (`exact`: of `size` bytes only); nullopt if none.
  std::optional<std::pair<void*, std::size_t>> take(std::size_t size, bool exact = false) {
    auto it = idle_.lower_bound(size);
    if (it == idle_.end() || it->first > (exact ? size : size + size / 4)) {
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

inline void free_all(const std::vector<std::pair<void*, std::size_t>>& blocks) {
  for (const auto& block : blocks) {
    c10::free_cpu(block.first);
  }
}

// What an allocator counts, per device (the host allocator keeps one).
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
  std::int64_t pending_counted = 0;  // releases queued behind stream work of blocks that still count as in use
  std::int64_t num_ooms = 0;
  std::int64_t allocated = 0;  // device: dropped at the free (CUDA's allocated bytes); current: active bytes
  std::int64_t peak_allocated = 0;

  void add(std::int64_t bytes) {
    current += bytes;
    peak = std::max(peak, current);
    allocated += bytes;
    peak_allocated = std::max(peak_allocated, allocated);
    ++allocations;
    ++current_blocks;
    peak_blocks = std::max(peak_blocks, current_blocks);
  }
  // Takes back an add() whose allocation then failed.
  void undo_add(std::int64_t bytes) {
    current -= bytes;
    allocated -= bytes;
    --allocations;
    --current_blocks;
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
  MemoryStats stats() const {
    return {current, peak, allocations, frees, reserved, peak_reserved, system_allocs, allocated, peak_allocated};
  }
};

}  // namespace offload::sim::detail
