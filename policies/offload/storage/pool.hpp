// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// storage::PinnedPool: offloaded tensors live in host buffers carved at
/// their exact size (rounded up to 64 bytes) from large page-locked slabs,
/// one pool per device shared by every manager of the process, reused from
/// step to step.
///
/// Why: a pinned host allocator that caches per block (PyTorch's
/// CachingHostAllocator, CUDA's and XPU's) rounds every block up to a power
/// of two and pins each new block, which costs milliseconds: a process holds
/// up to about 2x the host memory its offloaded tensors need, and a step
/// that offloads tensors of new sizes pays for pinning. A pool pins a few
/// large slabs and hands out exact pieces of them: after the first step of
/// a steady run, no new slab is pinned, and what the pool holds stays within
/// a small fraction (PoolOptions::growth) of the most bytes in use at once.
/// Where the device policy says which host NUMA node a device is attached
/// to (HostRequest::numa_node; device::Cuda does) and the library was built
/// with libnuma, a slab is pinned on that node, so the copies of a device
/// cross no inter-socket link. docs/policies/storage_policy.md has the
/// contract.

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <offload/buffers.hpp>
#include <offload/numa.hpp>
#include <offload/storage/host.hpp>

namespace offload::storage {

/// The knobs of the pool of one device (PinnedPool). The first manager
/// that uses a device's pool sets them; later ones share that pool as it
/// is. Plain data; validate() checks it.
struct PoolOptions {
  /// The smallest slab the pool pins, in bytes, [64 KiB, 2^40]. Slabs are
  /// powers of two (what a caching pinned allocator would round them to
  /// anyway), at least this, at least the request, and at least `growth`
  /// times what the pool holds already.
  std::int64_t min_slab_bytes = std::int64_t{4} << 20;
  /// How a new slab grows with what the pool holds, (0, 1]: a slab is at
  /// least this fraction of the pool's reserved bytes, so that a pool
  /// growing to R bytes pins O(log R) slabs and holds at most about this
  /// fraction more than it needs.
  double growth = 1.0 / 32;
  /// Most bytes the pool may pin, 0 = no limit, else [min_slab_bytes,
  /// 2^50]. Near it a slab is only as large as the request; a request the
  /// pool cannot fit within it gets pageable memory (HostBuffer::pinned
  /// false, counted in Stats::pinned_fallbacks).
  std::int64_t limit_bytes = 0;

  /// Throws c10::ValueError naming the field, the value and the accepted
  /// range. Changes nothing.
  void validate() const {
    constexpr std::int64_t kMinSlab = std::int64_t{64} << 10;
    constexpr std::int64_t kMaxSlab = std::int64_t{1} << 40;
    constexpr std::int64_t kMaxLimit = std::int64_t{1} << 50;
    TORCH_CHECK_VALUE(min_slab_bytes >= kMinSlab && min_slab_bytes <= kMaxSlab,
                      "offload::storage::PoolOptions: min_slab_bytes must be in [", kMinSlab, ", ", kMaxSlab, "], got ",
                      min_slab_bytes);
    TORCH_CHECK_VALUE(growth > 0.0 && growth <= 1.0, "offload::storage::PoolOptions: growth must be in (0, 1], got ",
                      growth);
    TORCH_CHECK_VALUE(limit_bytes == 0 || (limit_bytes >= min_slab_bytes && limit_bytes <= kMaxLimit),
                      "offload::storage::PoolOptions: limit_bytes must be 0 (no limit) or in [min_slab_bytes = ",
                      min_slab_bytes, ", ", kMaxLimit, "], got ", limit_bytes);
  }
};

/// What one device's pool holds (PinnedPool::stats). Bytes.
struct PoolStats {
  std::int64_t reserved_bytes = 0;       ///< pinned in slabs
  std::int64_t peak_reserved_bytes = 0;  ///< the most pinned at once
  std::int64_t in_use_bytes = 0;         ///< carved out for live buffers (64-byte multiples)
  std::int64_t peak_in_use_bytes = 0;    ///< the most carved out at once
  std::int64_t slabs = 0;                ///< slabs held now
  std::int64_t slab_allocations = 0;     ///< slabs pinned since the pool was made (fresh pinned allocations)
  std::int64_t pageable_fallbacks = 0;   ///< requests served with pageable memory (limit or pinning failed)
  /// The host NUMA node of the first page of the slab pinned last, as the
  /// kernel reports it after the slab was placed on HostRequest::numa_node;
  /// -1 when that slab was not placed: the device policy does not say its
  /// node, the library was built without libnuma, or the kernel (or a
  /// container) allows no NUMA policy.
  int numa_node = -1;
};

namespace detail {

/// The pool of one device: slabs from the device's pinned host allocator,
/// a best-fit free list over all of them, coalescing on release.
/// Thread-safe: every member takes the pool's mutex (a new slab is pinned
/// outside it).
class HostPool : public std::enable_shared_from_this<HostPool> {
 public:
  static constexpr std::int64_t kAlign = 64;

  HostPool(c10::DeviceType type, const PoolOptions& options) : type_(type), options_(options) {}
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  /// A pinned buffer of `nbytes` bytes carved from a slab, or pageable
  /// memory (pinned false) when the limit or pinning forbids. A new slab is
  /// pinned on host NUMA node `numa_node` where it is >= 0 and placement
  /// is available (numa::PreferredNode).
  HostBuffer allocate(std::int64_t nbytes, int numa_node = -1) {
    if (nbytes == 0) return PageableHost{}.allocate(HostRequest{0, c10::Device(type_), false});
    const std::int64_t size = (nbytes + kAlign - 1) / kAlign * kAlign;
    std::unique_lock lock(mutex_);
    auto found = by_size_.lower_bound(size);
    while (found == by_size_.end()) {
      // A new slab, pinned outside the lock (pinning costs milliseconds;
      // other threads carve from the slabs there are meanwhile). Another
      // thread may have grown the pool by then: the slab is kept when the
      // limit still allows it, else given back and the search done again.
      const auto slab_bytes = slab_bytes_for(size);
      std::unique_ptr<Slab> slab;
      if (slab_bytes > 0) {
        lock.unlock();
        slab = pin_slab(slab_bytes, numa_node);
        lock.lock();
      }
      if (!slab) {
        ++stats_.pageable_fallbacks;
        lock.unlock();
        return PageableHost{}.allocate(HostRequest{nbytes, c10::Device(type_), false});
      }
      if (options_.limit_bytes != 0 && stats_.reserved_bytes + slab_bytes > options_.limit_bytes) {
        lock.unlock();
        slab.reset();  // back to the pinned allocator, outside the lock
        lock.lock();
      } else {
        add_slab(std::move(slab));
      }
      found = by_size_.lower_bound(size);
    }
    auto [length, range] = *found;
    Slab* slab = range.slab;
    const std::int64_t offset = range.offset;
    slab->free.erase(offset);
    by_size_.erase(found);
    if (length > size) add_free(slab, offset + size, length - size);
    slab->used += size;
    stats_.in_use_bytes += size;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    lock.unlock();
    auto self = shared_from_this();
    auto bytes = at::from_blob(
        slab->base + offset, {nbytes}, [self, slab, offset, size](void*) { self->give_back(slab, offset, size); },
        at::TensorOptions().dtype(at::kByte));
    return HostBuffer{std::move(bytes), slab->pinned, size};
  }

  /// Returns every slab with nothing carved out of it to the pinned
  /// allocator.
  void trim() {
    std::vector<std::unique_ptr<Slab>> idle;
    {
      const std::lock_guard lock(mutex_);
      for (auto it = slabs_.begin(); it != slabs_.end();) {
        if ((*it)->used != 0) {
          ++it;
          continue;
        }
        for (const auto& [offset, entry] : (*it)->free) by_size_.erase(entry);
        stats_.reserved_bytes -= (*it)->size;
        --stats_.slabs;
        idle.push_back(std::move(*it));
        it = slabs_.erase(it);
      }
    }
  }  // the slabs' memory goes back to the allocator here, outside the lock

  PoolStats stats() const {
    const std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  struct Slab;
  struct Range {
    Slab* slab;
    std::int64_t offset;
  };
  using BySize = std::multimap<std::int64_t, Range>;
  struct Slab {
    c10::DataPtr memory;
    char* base = nullptr;
    std::int64_t size = 0;
    std::int64_t used = 0;
    bool pinned = true;
    int numa_node = -1;                             // the node of its first page once placed, -1 not placed
    std::map<std::int64_t, BySize::iterator> free;  // offset -> its entry in by_size_ (keyed by length)
  };

  void add_free(Slab* slab, std::int64_t offset, std::int64_t length) {
    slab->free.emplace(offset, by_size_.emplace(length, Range{slab, offset}));
  }

  // The bytes of a new slab that fits `size`: a power of two of at least
  // min_slab_bytes and growth x what the pool holds; under a limit, the
  // request's own size when that power of two no longer fits; 0 when the
  // limit forbids. Called under the lock.
  std::int64_t slab_bytes_for(std::int64_t size) const {
    constexpr std::int64_t kMaxSlab = std::int64_t{1} << 50;  // also keeps bit_ceil below 2^63
    if (size > kMaxSlab) return 0;
    const auto wanted = std::min(
        kMaxSlab, std::max({size, options_.min_slab_bytes,
                            static_cast<std::int64_t>(options_.growth * static_cast<double>(stats_.reserved_bytes))}));
    auto slab_bytes = static_cast<std::int64_t>(std::bit_ceil(static_cast<std::uint64_t>(wanted)));
    if (options_.limit_bytes != 0) {
      const auto left = options_.limit_bytes - stats_.reserved_bytes;
      if (size > left) return 0;
      if (slab_bytes > left) slab_bytes = size;
    }
    return slab_bytes;
  }

  // A slab of `slab_bytes` from the device type's pinned allocator, on host
  // NUMA node `numa_node` where placement is available: the thread prefers
  // the node while the allocator pins (and so faults in) the pages, and the
  // slab's range prefers it for pages an allocator leaves to be faulted in
  // later. Null (warned once) when pinning fails. Called without the lock.
  std::unique_ptr<Slab> pin_slab(std::int64_t slab_bytes, int numa_node) const {
    auto slab = std::make_unique<Slab>();
    try {
      const offload::numa::PreferredNode prefer(numa_node);
      slab->memory =
          at::globalContext().getPinnedMemoryAllocator(type_)->allocate(static_cast<std::size_t>(slab_bytes));
      if (prefer.active()) {
        offload::numa::prefer_range(slab->memory.get(), static_cast<std::size_t>(slab_bytes), numa_node);
        slab->numa_node = offload::numa::node_of(slab->memory.get());
      }
    } catch (const c10::Error& e) {
      TORCH_WARN_ONCE("offload::storage::PinnedPool: pinned host memory is not available (", e.what_without_backtrace(),
                      "); using pageable memory (Stats::pinned_fallbacks counts it)");
      return nullptr;
    }
    slab->base = static_cast<char*>(slab->memory.get());
    slab->size = slab_bytes;
    return slab;
  }

  // Adds a pinned slab, all of it free. Called under the lock.
  void add_slab(std::unique_ptr<Slab> slab) {
    slabs_.reserve(slabs_.size() + 1);  // the push_back below cannot throw after add_free
    add_free(slab.get(), 0, slab->size);
    stats_.reserved_bytes += slab->size;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    ++stats_.slabs;
    ++stats_.slab_allocations;
    stats_.numa_node = slab->numa_node;
    slabs_.push_back(std::move(slab));
  }

  // A carved range is free again (the buffer's last reference is gone; the
  // sync policies free a host buffer only after its last copy completed).
  void give_back(Slab* slab, std::int64_t offset, std::int64_t size) noexcept {
    const std::lock_guard lock(mutex_);
    slab->used -= size;
    stats_.in_use_bytes -= size;
    std::int64_t start = offset;
    std::int64_t length = size;
    if (auto next = slab->free.find(offset + size); next != slab->free.end()) {
      length += next->second->first;
      by_size_.erase(next->second);
      slab->free.erase(next);
    }
    if (auto after = slab->free.lower_bound(offset); after != slab->free.begin()) {
      auto before = std::prev(after);
      if (before->first + before->second->first == offset) {
        start = before->first;
        length += before->second->first;
        by_size_.erase(before->second);
        slab->free.erase(before);
      }
    }
    add_free(slab, start, length);
  }

  c10::DeviceType type_;
  PoolOptions options_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Slab>> slabs_;
  BySize by_size_;
  PoolStats stats_;
};

/// The pools of this process, by device (type, index): weak, so that a pool
/// goes (its slabs unpinned) when the last policy and the last buffer using
/// it are gone.
struct PoolRegistry {
  std::mutex mutex;
  std::map<std::pair<int, int>, std::weak_ptr<HostPool>> pools;
  static PoolRegistry& instance() {
    static auto* registry = new PoolRegistry();  // leaked on purpose: usable until the process ends
    return *registry;
  }
  static std::pair<int, int> key(c10::Device device) {
    return {static_cast<int>(device.type()), static_cast<int>(device.index())};
  }
};

/// The pool of `device`: made with `options` at first use, shared
/// afterwards. Thread-safe.
inline std::shared_ptr<HostPool> host_pool(c10::Device device, const PoolOptions& options) {
  auto& registry = PoolRegistry::instance();
  const std::lock_guard lock(registry.mutex);
  auto& slot = registry.pools[PoolRegistry::key(device)];
  auto pool = slot.lock();
  if (!pool) {
    pool = std::make_shared<HostPool>(device.type(), options);
    slot = pool;
  }
  return pool;
}

/// The pool of `device` if one is alive, else null. Thread-safe.
inline std::shared_ptr<HostPool> find_host_pool(c10::Device device) {
  auto& registry = PoolRegistry::instance();
  const std::lock_guard lock(registry.mutex);
  const auto found = registry.pools.find(PoolRegistry::key(device));
  return found == registry.pools.end() ? nullptr : found->second.lock();
}

}  // namespace detail

/// Host buffers carved at their exact size (64-byte multiples) from
/// page-locked slabs of a per-device pool that every PinnedPool of the
/// process shares, so an offloaded tensor costs the host what it holds and
/// steps after the first pin nothing new (see the file comment). The
/// device is the current one of the saved tensor's device type (the
/// manager allocates under a guard of the tensor's device). With
/// HostRequest::pin false (Options::pin_memory): pageable memory, as PageableHost. A slab the
/// allocator cannot pin (a locked-memory limit), or one past
/// PoolOptions::limit_bytes: pageable memory with one warning, counted in
/// Stats::pinned_fallbacks; never an error.
///
/// Copyable; copies share the pools they used. Thread-safe: any number of
/// managers on any threads may allocate from one pool.
class PinnedPool {
 public:
  static constexpr std::string_view name = "pinned_pool";
  static constexpr bool prefers_pinned = true;

  /// The default PoolOptions.
  PinnedPool() = default;
  /// Validates `pool` (c10::ValueError naming the field) before anything.
  explicit PinnedPool(const PoolOptions& pool) : pool_((pool.validate(), pool)) {}

  /// A host buffer of `request.nbytes` bytes for a storage of
  /// `request.device` (its pool; a device without index: the current one of
  /// its type), pinned unless `request.pin` is false or the pool cannot pin;
  /// `reserved` is its carved size (64-byte multiple). A slab pinned for it
  /// goes on host NUMA node `request.numa_node` where that is >= 0 and the
  /// library has libnuma (PoolStats::numa_node says). Thread-safe.
  HostBuffer allocate(const HostRequest& request) {
    if (!request.pin) return PageableHost{}.allocate(request);
    auto device = request.device;
    if (!device.has_index()) device = c10::impl::getDeviceGuardImpl(device.type())->getDevice();
    return pool_of(device)->allocate(request.nbytes, request.numa_node);
  }
  /// The request's size rounded up to 64 bytes: what a buffer of the pool
  /// sets aside (the slabs' free space is PoolStats'). Thread-safe.
  std::int64_t reserved_for(const HostRequest& request) const noexcept {
    if (!request.pin || request.nbytes == 0) return request.nbytes;
    return (request.nbytes + detail::HostPool::kAlign - 1) / detail::HostPool::kAlign * detail::HostPool::kAlign;
  }

  /// What the pool of `device` (type and index) holds now; zeros when it
  /// has none. Thread-safe.
  static PoolStats stats(c10::Device device) {
    const auto pool = detail::find_host_pool(device);
    return pool ? pool->stats() : PoolStats{};
  }

  /// Returns the slabs of `device`'s pool that hold no live buffer to the
  /// pinned allocator (between phases of a program, after the last step).
  /// Buffers in use stay. A pool also returns its slabs when it goes.
  /// Thread-safe.
  static void trim(c10::Device device) {
    if (const auto pool = detail::find_host_pool(device)) pool->trim();
  }

 private:
  std::shared_ptr<detail::HostPool> pool_of(c10::Device device) {
    const std::lock_guard lock(*held_mutex_);
    for (const auto& [d, pool] : *held_) {
      if (d == device) return pool;
    }
    auto pool = detail::host_pool(device, pool_);
    held_->emplace_back(device, pool);
    return pool;
  }
  PoolOptions pool_;
  // The pools this policy (and its copies) used: kept alive while it lives.
  std::shared_ptr<std::mutex> held_mutex_ = std::make_shared<std::mutex>();
  std::shared_ptr<std::vector<std::pair<c10::Device, std::shared_ptr<detail::HostPool>>>> held_ =
      std::make_shared<std::vector<std::pair<c10::Device, std::shared_ptr<detail::HostPool>>>>();
};

}  // namespace offload::storage
