// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// sync::Streamed: copies on a side stream ordered by events, a forward
/// stash window, backward prefetch in reverse pack order, and release of
/// every buffer only after the streams that use it are done with it.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <offload/concepts.hpp>
#include <offload/entry.hpp>
#include <offload/manager.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>
#include <offload/testing.hpp>

namespace offload::sync {

/// Asynchronous copies on a side stream (DESIGN.md section 2).
///
/// Forward, per offloaded storage: an event recorded on the current
/// compute stream is waited for by the side stream, the device-to-host copy
/// runs there, and an event marks its end. The device bytes stay alive in
/// the forward stash until then; at most Options::max_fwd_stash entries are
/// stashed, the oldest released by making the compute stream wait on its
/// event (the host never blocks for that). Closing the Scope (or the end of
/// a backward pass) releases the whole stash the same way.
///
/// Backward: a tensor still stashed is reused, not copied back. Each unpack
/// starts host-to-device copies of the next offloaded storages in reverse
/// pack order (the order backward needs them) on the side stream, into
/// buffers allocated on the compute stream; the compute stream waits only
/// on the event of the tensor it needs now. The window ahead is
/// Options::prefetch_bytes device bytes (at least one storage), or, when
/// that is 0, Options::prefetch_depth storages; prefetched buffers not yet
/// consumed never exceed it. At the end
/// of a backward pass (Engine::queue_callback) unconsumed prefetches are
/// dropped, so retain_graph keeps only host copies.
///
/// Release: device buffers are dropped only after the compute stream was
/// made to wait for the copies that read or write them (or, when consumed
/// on another stream, after the allocator was told with record_stream); a
/// host buffer is freed only after its last copy's event completed (the
/// host waits then, only if the copy is still running).
///
/// Where the device turns out at run time to have no working events, every
/// copy is blocking and counted in Stats::blocking_fallbacks.
///
/// Thread-safety: State is called under the manager's lock.
struct Streamed {
  static constexpr std::string_view name = "streamed";
  static constexpr bool needs_events = true;

  template <device_policy Device, storage_policy Storage>
  class State {
   public:
    State(const Options& options, Storage& storage) : options_(options), storage_(&storage) {}

    void offload(const std::shared_ptr<Entry>& entry, const at::Tensor& device_bytes) {
      entry->host = storage_->allocate(entry->nbytes, Device::device_type, options_);
      const auto index = entry->device.index();
      if (!events_work(index)) {
        ++blocking_fallbacks_;
        piece_of(entry->host, entry->piece).copy_(piece_of(device_bytes, entry->piece), /*non_blocking=*/false);
        return;
      }
      const c10::Stream compute = Device::current_stream(index);
      const c10::Stream side = side_stream(index);
      c10::Event produced(Device::device_type);
      produced.record(compute);
      produced.block(side);
      {
        const c10::StreamGuard on_side(side);
        piece_of(entry->host, entry->piece).copy_(piece_of(device_bytes, entry->piece), /*non_blocking=*/true);
      }
      entry->d2h.emplace(Device::device_type);
      entry->d2h->record(side);
      order_[entry->seq] = entry;
      if (testing::take_fault(testing::Fault::free_early)) return;  // deliberate bug: no stash
      entry->stash = device_bytes;
      entry->home_stream = compute;
      stash_.push_back(entry);
      while (static_cast<std::int64_t>(stash_.size()) > options_.max_fwd_stash) {
        auto oldest = stash_.front().lock();
        stash_.pop_front();
        if (oldest) drop_stash(*oldest);
      }
    }

    at::Tensor reload(const std::shared_ptr<Entry>& entry) {
      const auto index = entry->device.index();
      if (!events_work(index)) {
        ++blocking_fallbacks_;
        auto bytes = empty_bytes(*entry);
        piece_of(bytes, entry->piece).copy_(piece_of(entry->host, entry->piece), /*non_blocking=*/false);
        return bytes;
      }
      const c10::Stream compute = Device::current_stream(index);
      if (entry->stash.defined()) {
        // Still stashed: the device bytes never left. Their stream must not
        // reuse them before the D2H copy that reads them is done.
        entry->d2h->block(*entry->home_stream);
        if (*entry->home_stream != compute) Device::record_stream(entry->stash, compute);
        entry->home_stream.reset();
        std::erase_if(stash_, [&](const std::weak_ptr<Entry>& w) { return w.lock() == entry; });
        return std::move(entry->stash);
      }
      // Not prefetched: bring it back now. The side stream runs this copy
      // after the D2H copy that filled the host buffer (same stream).
      if (!entry->prefetched.defined()) prefetch(*entry, compute);
      --outstanding_;
      outstanding_bytes_ -= entry->device_nbytes;
      at::Tensor bytes = std::move(entry->prefetched);
      if (!testing::take_fault(testing::Fault::skip_wait)) entry->h2d->block(compute);
      if (*entry->home_stream != compute) Device::record_stream(bytes, compute);
      entry->home_stream.reset();
      return bytes;
    }

    void on_unpack(const std::shared_ptr<Entry>& entry) {
      const auto index = entry->device.index();
      const bool by_bytes = options_.prefetch_bytes > 0;
      if ((!by_bytes && options_.prefetch_depth == 0) || !events_work(index)) return;
      const c10::Stream compute = Device::current_stream(index);
      // The window: the next storages backward needs, up to prefetch_bytes
      // of device buffers (at least one), or prefetch_depth storages.
      std::int64_t considered = 0;
      std::int64_t window_bytes = 0;
      for (auto it = std::make_reverse_iterator(order_.lower_bound(entry->seq)); it != order_.rend(); ++it) {
        auto next = it->second.lock();
        if (!next || next->device != entry->device) continue;
        if (by_bytes) {
          window_bytes += next->device_nbytes;
          if (considered > 0 && window_bytes > options_.prefetch_bytes) break;
        } else if (considered >= options_.prefetch_depth || outstanding_ >= options_.prefetch_depth) {
          break;
        }
        ++considered;
        if (next->stash.defined() || next->prefetched.defined()) continue;
        if (next->reloaded && !next->reloaded->expired()) continue;
        if (by_bytes && outstanding_ > 0 && outstanding_bytes_ + next->device_nbytes > options_.prefetch_bytes) break;
        prefetch(*next, compute);
      }
    }

    /// Called when a backward pass that unpacked through this manager ends:
    /// drops prefetches nobody consumed and the forward stash.
    void end_backward() {
      for (auto& [seq, weak] : order_) {
        if (auto entry = weak.lock(); entry && entry->prefetched.defined()) drop_prefetch(*entry);
      }
      settle();
    }

    /// Called at scope exit: releases the whole forward stash.
    void settle() {
      while (!stash_.empty()) {
        auto e = stash_.front().lock();
        stash_.pop_front();
        if (e) drop_stash(*e);
      }
    }

    void release(Entry& entry) noexcept {
      try {
        order_.erase(entry.seq);
        if (entry.stash.defined()) drop_stash(entry);
        if (entry.prefetched.defined()) drop_prefetch(entry);
        // The host buffer may be read or written by a copy still in flight.
        if (entry.d2h) entry.d2h->synchronize();
        if (entry.h2d) entry.h2d->synchronize();
      } catch (...) {
        // A failing device here must not turn a destructor into terminate();
        // the buffers are released regardless, as autograd drops the graph.
      }
    }

    /// Called by the manager after it grew an entry it had let go with
    /// release() (a later saved view needed bytes the entry lacked): tracks
    /// it again, so that backward prefetches it.
    void resume(const std::shared_ptr<Entry>& entry) { order_[entry->seq] = entry; }

    /// Adds this policy's counters to a Stats snapshot.
    void add_stats(Stats& stats) const noexcept {
      stats.blocking_fallbacks += blocking_fallbacks_;
      stats.prefetches += prefetches_;
      stats.prefetch_peak = std::max(stats.prefetch_peak, prefetch_peak_);
    }

   private:
    at::Tensor empty_bytes(const Entry& entry) const {
      const c10::DeviceGuard guard(entry.device);
      return at::empty({entry.device_nbytes}, at::TensorOptions().dtype(at::kByte).device(entry.device));
    }

    c10::Stream side_stream(c10::DeviceIndex index) {
      auto found = side_.find(index);
      if (found == side_.end()) found = side_.emplace(index, Device::side_stream(index)).first;
      return found->second;
    }

    // Whether events work on this device at run time (probed once).
    bool events_work(c10::DeviceIndex index) {
      auto found = events_ok_.find(index);
      if (found != events_ok_.end()) return found->second;
      bool ok = true;
      try {
        c10::Event probe(Device::device_type);
        probe.record(Device::current_stream(index));
        (void)side_stream(index);
      } catch (const c10::Error&) {
        ok = false;
      }
      events_ok_.emplace(index, ok);
      return ok;
    }

    // The stream the bytes were produced on waits for the copy that reads
    // them; only then may its allocator hand them out again.
    void drop_stash(Entry& entry) {
      if (!entry.stash.defined()) return;
      entry.d2h->block(*entry.home_stream);
      entry.stash = at::Tensor();
      entry.home_stream.reset();
    }

    // An unconsumed prefetch: the stream the buffer was allocated on must
    // not reuse it before the copy has written it.
    void drop_prefetch(Entry& entry) {
      entry.h2d->block(*entry.home_stream);
      entry.prefetched = at::Tensor();
      entry.home_stream.reset();
      --outstanding_;
      outstanding_bytes_ -= entry.device_nbytes;
    }

    // H2D copy of `entry` on the side stream into a buffer allocated on
    // the compute stream (its consumer).
    void prefetch(Entry& entry, c10::Stream compute) {
      const auto index = entry.device.index();
      at::Tensor bytes;
      {
        const c10::StreamGuard on_compute(compute);
        bytes = empty_bytes(entry);
      }
      const c10::Stream side = side_stream(index);
      c10::Event allocated(Device::device_type);
      allocated.record(compute);
      allocated.block(side);  // the block may have been in use on the compute stream
      {
        const c10::StreamGuard on_side(side);
        piece_of(bytes, entry.piece).copy_(piece_of(entry.host, entry.piece), /*non_blocking=*/true);
      }
      entry.h2d.emplace(Device::device_type);
      entry.h2d->record(side);
      entry.prefetched = std::move(bytes);
      entry.home_stream = compute;
      ++outstanding_;
      outstanding_bytes_ += entry.device_nbytes;
      ++prefetches_;
      prefetch_peak_ = std::max(prefetch_peak_, outstanding_);
    }

    Options options_;
    Storage* storage_;
    std::map<c10::DeviceIndex, c10::Stream> side_;
    std::map<c10::DeviceIndex, bool> events_ok_;
    std::map<std::uint64_t, std::weak_ptr<Entry>> order_;  // offloaded entries by pack order
    std::deque<std::weak_ptr<Entry>> stash_;               // forward stash, oldest first
    std::int64_t outstanding_ = 0;                         // prefetched, not yet consumed
    std::int64_t outstanding_bytes_ = 0;                   // their device bytes
    std::int64_t blocking_fallbacks_ = 0;
    std::int64_t prefetches_ = 0;
    std::int64_t prefetch_peak_ = 0;
  };
};

}  // namespace offload::sync
