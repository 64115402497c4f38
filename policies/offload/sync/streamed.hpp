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
#include <offload/options.hpp>
#include <offload/stats.hpp>

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
/// Needs a stream_device_policy (offload::composable checks it).
///
/// Thread-safety: State is called under the manager's lock.
struct Streamed {
  static constexpr std::string_view name = "streamed";
  static constexpr bool needs_events = true;

  template <device_policy Device>
  class State {
   public:
    /// What Streamed keeps per offloaded storage.
    struct EntryState {
      at::Tensor stash;               ///< device bytes kept alive until the D2H copy is done
      std::optional<c10::Event> d2h;  ///< completes when the D2H copy is done
      at::Tensor prefetched;          ///< device bytes being brought back ahead of need
      std::optional<c10::Event> h2d;  ///< completes when the last host-to-device copy is done
      /// The compute stream the device bytes in `stash` or `prefetched`
      /// belong to (produced on, or allocated on): the stream that must wait
      /// before they are released.
      std::optional<c10::Stream> home_stream;
    };
    using Entry = offload::Entry<EntryState>;

    explicit State(const Options& options) : options_(options) {}

    void offload(const std::shared_ptr<Entry>& entry, const at::Tensor& device_bytes) {
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
      auto& mine = entry->sync;
      mine.d2h.emplace(Device::device_type);
      mine.d2h->record(side);
      order_[entry->seq] = entry;
      mine.stash = device_bytes;
      mine.home_stream = compute;
      stash_.push_back(entry);
      while (static_cast<std::int64_t>(stash_.size()) > options_.max_fwd_stash) {
        auto oldest = stash_.front().lock();
        stash_.pop_front();
        if (oldest) drop_stash(*oldest);
      }
    }

    Reloaded reload(const std::shared_ptr<Entry>& entry) {
      const auto index = entry->device.index();
      if (!events_work(index)) {
        ++blocking_fallbacks_;
        auto bytes = empty_bytes(*entry);
        piece_of(bytes, entry->piece).copy_(piece_of(entry->host, entry->piece), /*non_blocking=*/false);
        return {std::move(bytes), true};
      }
      const c10::Stream compute = Device::current_stream(index);
      auto& mine = entry->sync;
      if (mine.stash.defined()) {
        // Still stashed: the device bytes never left. Their stream must not
        // reuse them before the D2H copy that reads them is done.
        mine.d2h->block(*mine.home_stream);
        if (*mine.home_stream != compute) Device::record_stream(mine.stash, compute);
        mine.home_stream.reset();
        std::erase_if(stash_, [&](const std::weak_ptr<Entry>& w) { return w.lock() == entry; });
        ++stash_reuses_;
        return {std::move(mine.stash), false};
      }
      // Not prefetched: bring it back now. The side stream runs this copy
      // after the D2H copy that filled the host buffer (same stream).
      if (!mine.prefetched.defined()) prefetch(*entry, compute);
      --outstanding_;
      outstanding_bytes_ -= entry->device_nbytes;
      at::Tensor bytes = std::move(mine.prefetched);
      mine.h2d->block(compute);
      if (*mine.home_stream != compute) Device::record_stream(bytes, compute);
      mine.home_stream.reset();
      return {std::move(bytes), true};
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
        if (next->sync.stash.defined() || next->sync.prefetched.defined()) continue;
        if (next->reloaded && !next->reloaded->expired()) continue;
        if (by_bytes && outstanding_ > 0 && outstanding_bytes_ + next->device_nbytes > options_.prefetch_bytes) break;
        prefetch(*next, compute);
      }
    }

    /// Called when a backward pass that unpacked through this manager ends:
    /// drops prefetches nobody consumed and the forward stash.
    void end_backward() {
      for (auto& [seq, weak] : order_) {
        if (auto entry = weak.lock(); entry && entry->sync.prefetched.defined()) drop_prefetch(*entry);
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
        if (entry.sync.stash.defined()) drop_stash(entry);
        if (entry.sync.prefetched.defined()) drop_prefetch(entry);
        // The host buffer may be read or written by a copy still in flight.
        if (entry.sync.d2h) entry.sync.d2h->synchronize();
        if (entry.sync.h2d) entry.sync.h2d->synchronize();
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
    void add_stats(Stats& stats) const {
      stats.blocking_fallbacks += blocking_fallbacks_;
      stats.stash_reuses += stash_reuses_;
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
      auto& mine = entry.sync;
      if (!mine.stash.defined()) return;
      mine.d2h->block(*mine.home_stream);
      mine.stash = at::Tensor();
      mine.home_stream.reset();
    }

    // An unconsumed prefetch: the stream the buffer was allocated on must
    // not reuse it before the copy has written it.
    void drop_prefetch(Entry& entry) {
      auto& mine = entry.sync;
      mine.h2d->block(*mine.home_stream);
      mine.prefetched = at::Tensor();
      mine.home_stream.reset();
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
      entry.sync.h2d.emplace(Device::device_type);
      entry.sync.h2d->record(side);
      entry.sync.prefetched = std::move(bytes);
      entry.sync.home_stream = compute;
      ++outstanding_;
      outstanding_bytes_ += entry.device_nbytes;
      ++prefetches_;
      prefetch_peak_ = std::max(prefetch_peak_, outstanding_);
    }

    Options options_;
    std::map<c10::DeviceIndex, c10::Stream> side_;
    std::map<c10::DeviceIndex, bool> events_ok_;
    std::map<std::uint64_t, std::weak_ptr<Entry>> order_;  // offloaded entries by pack order
    std::deque<std::weak_ptr<Entry>> stash_;               // forward stash, oldest first
    std::int64_t outstanding_ = 0;                         // prefetched, not yet consumed
    std::int64_t outstanding_bytes_ = 0;                   // their device bytes
    std::int64_t blocking_fallbacks_ = 0;
    std::int64_t stash_reuses_ = 0;
    std::int64_t prefetches_ = 0;
    std::int64_t prefetch_peak_ = 0;
  };
};

}  // namespace offload::sync
