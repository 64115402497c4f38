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
/// Options::prefetch_depth times the device bytes of the largest offloaded
/// storage backward has not needed yet (or Options::prefetch_bytes when
/// that is set),
/// filled with as many storages as fit and at least one, so small saved
/// tensors do not take a slot like a large one; prefetched buffers not yet
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
      std::int64_t counted_bytes = -1;  ///< device bytes counted among those still to come back; -1: not counted
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
      // The stash below holds a reference, which does not stop the memory
      // being freed in place (`untyped_storage().resize_(0)`): the allocator
      // must not reuse it before the side stream's copy has read it.
      Device::record_stream(device_bytes, side);
      auto& mine = entry->sync;
      mine.d2h.emplace(Device::device_type);
      mine.d2h->record(side);
      track(entry);
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
      uncount(*entry);  // needed now: no longer sizes the window ahead
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
      const std::int64_t window = window_bytes();
      if (window == 0 || !events_work(index)) return;
      const c10::Stream compute = Device::current_stream(index);
      // The next storages backward needs, in reverse pack order, while they
      // fit in the window (the first one always does).
      std::int64_t ahead = 0;
      bool first = true;
      for (auto it = std::make_reverse_iterator(order_.lower_bound(entry->seq)); it != order_.rend(); ++it) {
        auto next = it->second.lock();
        if (!next || next->device != entry->device) continue;
        ahead += next->device_nbytes;
        if (!first && ahead > window) break;
        first = false;
        if (next->sync.stash.defined() || next->sync.prefetched.defined()) continue;
        if (next->reloaded && !next->reloaded->expired()) continue;
        if (outstanding_bytes_ > 0 && outstanding_bytes_ + next->device_nbytes > window) break;
        prefetch(*next, compute);
      }
    }

    /// Called when a backward pass that unpacked through this manager ends:
    /// drops prefetches nobody consumed and the forward stash.
    void end_backward() {
      for (auto& [seq, weak] : order_) {
        auto entry = weak.lock();
        if (!entry) continue;
        if (entry->sync.prefetched.defined()) drop_prefetch(*entry);
        count(*entry);  // a later backward (retain_graph) needs it again
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
        uncount(entry);
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
    void resume(const std::shared_ptr<Entry>& entry) { track(entry); }

    /// Adds this policy's counters to a Stats snapshot.
    void add_stats(Stats& stats) const {
      stats.blocking_fallbacks += blocking_fallbacks_;
      stats.stash_reuses += stash_reuses_;
      stats.prefetches += prefetches_;
      stats.prefetch_peak = std::max(stats.prefetch_peak, prefetch_peak_);
    }

   private:
    // The prefetch window in device bytes: Options::prefetch_bytes, or
    // prefetch_depth times the largest offloaded storage backward has not
    // needed yet (the window shrinks once the large ones, e.g. the logits,
    // came back).
    std::int64_t window_bytes() const {
      if (options_.prefetch_bytes > 0) return options_.prefetch_bytes;
      if (sizes_.empty()) return 0;
      return options_.prefetch_depth * sizes_.rbegin()->first;
    }

    at::Tensor empty_bytes(const Entry& entry) const {
      const c10::DeviceGuard guard(entry.device);
      return at::empty({entry.device_nbytes}, at::TensorOptions().dtype(at::kByte).device(entry.device));
    }

    c10::Stream side_stream(c10::DeviceIndex index) {
      auto found = side_.find(index);
      if (found == side_.end()) found = side_.emplace(index, Device::side_stream(index)).first;
      return found->second;
    }

    void track(const std::shared_ptr<Entry>& entry) {
      order_[entry->seq] = entry;
      uncount(*entry);
      count(*entry);
    }

    // sizes_ counts the device bytes of the tracked entries backward has
    // not needed yet: the window is sized by the largest of them.
    void count(Entry& entry) {
      if (entry.sync.counted_bytes >= 0) return;
      ++sizes_[entry.device_nbytes];
      entry.sync.counted_bytes = entry.device_nbytes;
    }

    void uncount(Entry& entry) noexcept {
      auto& bytes = entry.sync.counted_bytes;
      if (bytes < 0) return;
      if (auto found = sizes_.find(bytes); found != sizes_.end() && --found->second == 0) sizes_.erase(found);
      bytes = -1;
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
    std::map<std::int64_t, std::int64_t> sizes_;           // device bytes -> entries not needed yet that have them
    std::int64_t blocking_fallbacks_ = 0;
    std::int64_t stash_reuses_ = 0;
    std::int64_t prefetches_ = 0;
    std::int64_t prefetch_peak_ = 0;
  };
};

}  // namespace offload::sync
