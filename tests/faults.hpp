// SPDX-License-Identifier: MIT
#pragma once
// Fault injection for tests of the library and of the `sim` substrate:
// faults::Faulty<Sync>, a sync policy that behaves as Sync until a fault is
// armed, then breaks one synchronisation rule on purpose, so a test can
// prove that the substrate turns that bug into wrong numbers. The shipped
// policies know nothing of it; tests instantiate
// offload::Manager<Device, Storage, faults::Faulty<Sync>>.

#include <atomic>
#include <memory>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <offload/buffers.hpp>
#include <offload/concepts.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>
#include <offload/transfer.hpp>

namespace faults {

/// The synchronisation mistakes Faulty can make on purpose.
enum class Fault {
  none,
  /// Skip one wait: a host-to-device copy in backward is issued on a side
  /// stream and the compute stream does not wait for it.
  skip_wait,
  /// Free one buffer early: the device memory a device-to-host copy in
  /// forward reads is released before that copy has run.
  free_early,
};

namespace detail {
inline std::atomic<int> armed_kind{0};
inline std::atomic<int> armed_count{0};
inline std::atomic<int> fired{0};
}  // namespace detail

/// Arms `fault` for the next `count` copies that can exhibit it (count >= 1).
/// Thread-safe. Throws c10::ValueError for count < 1.
inline void arm(Fault fault, int count = 1) {
  TORCH_CHECK_VALUE(count >= 1, "faults::arm: count must be >= 1, got ", count);
  detail::armed_count.store(0);
  detail::armed_kind.store(static_cast<int>(fault));
  detail::armed_count.store(fault == Fault::none ? 0 : count);
}

/// Disarms every fault. Thread-safe.
inline void disarm() noexcept {
  detail::armed_count.store(0);
  detail::armed_kind.store(0);
}

/// Consumes one armed `fault`; true when the caller must exhibit it.
/// Thread-safe; lock-free when nothing is armed.
inline bool take(Fault fault) noexcept {
  if (detail::armed_count.load(std::memory_order_relaxed) == 0) return false;
  if (detail::armed_kind.load() != static_cast<int>(fault)) return false;
  int n = detail::armed_count.load();
  while (n > 0) {
    if (detail::armed_count.compare_exchange_weak(n, n - 1)) {
      detail::fired.fetch_add(1);
      return true;
    }
  }
  return false;
}

/// How many armed faults have fired since the process started.
inline int fired() noexcept { return detail::fired.load(); }

/// Sync, with the faults above where they are armed. Only for a device
/// with streams (there is no other stream to misuse otherwise).
template <class Sync>
struct Faulty {
  static constexpr std::string_view name = Sync::name;
  static constexpr bool needs_events = Sync::needs_events;

  template <offload::device_policy Device>
  class State {
    using Base = typename Sync::template State<Device>;
    static constexpr bool base_steps = offload::requirement::declares_steps<Base>;
    static constexpr bool base_target = offload::requirement::declares_target<Base>;

   public:
    using EntryState = typename Base::EntryState;
    using Transfer = offload::Transfer<EntryState>;
    /// Faulty observes steps when Sync does, and forwards them.
    static constexpr bool observes_steps = base_steps;
    /// Faulty serves a device-memory target when Sync does, and forwards it.
    static constexpr bool serves_target = base_target;
    /// Whether Sync keeps a forward stash (sync::Streamed does).
    static constexpr bool has_stash = requires(EntryState& s) { s.stash; };

    explicit State(const offload::Options& options) : base_(options) {}

    void offload(const Transfer& t, const at::Tensor& device_bytes) {
      if constexpr (offload::stream_device_policy<Device>) {
        if (take(Fault::free_early)) {
          // The copy is queued on the side stream with nothing keeping its
          // source: no stash, and the allocator is not told the side stream
          // uses it (record_stream), so the caller dropping device_bytes
          // frees the memory before the copy has run.
          const c10::StreamGuard side(Device::side_stream(t.device().index()));
          t.copy_to_host(device_bytes, /*non_blocking=*/true);
          return;
        }
      }
      base_.offload(t, device_bytes);
    }

    offload::Reloaded reload(const Transfer& t) {
      if constexpr (offload::stream_device_policy<Device>) {
        bool stashed = false;
        if constexpr (has_stash) stashed = t.state().stash.defined();
        if (!stashed && take(Fault::skip_wait)) {
          auto bytes = t.empty_device_bytes();
          const c10::StreamGuard side(Device::side_stream(t.device().index()));
          t.copy_to_device(bytes, /*non_blocking=*/true);
          return {std::move(bytes), true};  // the compute stream does not wait for this copy
        }
      }
      return base_.reload(t);
    }

    void on_unpack(const Transfer& t)
      requires base_steps
    {
      base_.on_unpack(t);
    }
    void on_shared(const Transfer& t, const at::Tensor& device_bytes)
      requires base_steps
    {
      base_.on_shared(t, device_bytes);
    }
    void end_forward()
      requires base_steps
    {
      base_.end_forward();
    }
    void end_backward()
      requires base_steps
    {
      base_.end_backward();
    }
    void suspend(const Transfer& t)
      requires base_steps
    {
      base_.suspend(t);
    }
    void resume(const Transfer& t, const at::Tensor& device_bytes)
      requires base_steps
    {
      base_.resume(t, device_bytes);
    }
    void add_stats(offload::Stats& stats) const
      requires base_steps
    {
      base_.add_stats(stats);
    }
    void release(const Transfer& t) noexcept
      requires base_steps
    {
      base_.release(t);
    }
    std::int64_t prefetched_bytes() const noexcept
      requires base_target
    {
      return base_.prefetched_bytes();
    }
    bool holds_device_bytes(const Transfer& t) const noexcept
      requires base_target
    {
      return base_.holds_device_bytes(t);
    }
    void set_headroom(std::int64_t bytes) noexcept
      requires base_target
    {
      base_.set_headroom(bytes);
    }

   private:
    Base base_;
  };
};

}  // namespace faults
