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
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <offload/buffers.hpp>
#include <offload/concepts.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>
#include <offload/transfer.hpp>

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
/// pack order (the order backward needs them) on the device policy's
/// h2d_stream where it has one (else the side stream), each after the
/// device-to-host copy that filled its host buffer, into
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
/// released storage's host buffers, unless their allocator orders their
/// reuse itself (HostBuffer::stream_ordered), are kept until its last
/// copy's event completed, queried at later calls, so the host never waits for a copy in
/// forward or backward (Stats::host_waits counts the waits that remain: at
/// the manager's destruction, for copies still running then). A storage
/// read back on another stream than its first consumer's (a storage saved
/// through views on two streams) is waited for and recorded there too
/// (on_shared).
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
    /// Streamed uses every step callback.
    static constexpr bool observes_steps = true;
    /// It holds device memory (the forward stash, the prefetch window)
    /// and tells a device-memory target about it.
    static constexpr bool serves_target = true;

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
      /// After a reload: the stream the device bytes it gave back belong to
      /// (allocated on, or produced on for a stash reuse), so that a later
      /// consumer of the same bytes (on_shared) on another stream is
      /// recorded with the allocator.
      std::optional<c10::Stream> reloaded_stream;
      std::int64_t counted_bytes = -1;  ///< device bytes counted among those still to come back; -1: not counted
    };
    using Transfer = offload::Transfer<EntryState>;
    using Ref = TransferRef<EntryState>;

    explicit State(const Options& options) : options_(options) {}
    // Host buffers still used by a copy in flight are kept until it ends:
    // the host waits for them here, at the manager's destruction, at most.
    ~State() {
      for (auto& r : retired_) wait_for(r);
    }
    State(const State&) = delete;
    State& operator=(const State&) = delete;

    void offload(const Transfer& t, const at::Tensor& device_bytes) {
      reap();
      const auto index = t.device().index();
      if (!events_work(index)) {
        ++blocking_fallbacks_;
        t.copy_to_host(device_bytes, /*non_blocking=*/false);
        return;
      }
      const c10::Stream compute = Device::current_stream(index);
      const c10::Stream side = side_stream(index);
      c10::Event produced(Device::device_type);
      produced.record(compute);
      produced.block(side);
      {
        const c10::StreamGuard on_side(side);
        t.copy_to_host(device_bytes, /*non_blocking=*/true);
      }
      // The stash below holds a reference, which does not stop the memory
      // being freed in place (`untyped_storage().resize_(0)`): the allocator
      // must not reuse it before the side stream's copy has read it.
      Device::record_stream(device_bytes, side);
      auto& mine = t.state();
      mine.d2h.emplace(Device::device_type);
      mine.d2h->record(side);
      track(t);
      mine.stash = device_bytes;
      mine.home_stream = compute;
      stash_.push_back(t.ref());
      while (static_cast<std::int64_t>(stash_.size()) > options_.max_fwd_stash) {
        auto oldest = stash_.front().lock();
        stash_.pop_front();
        if (oldest) drop_stash(oldest);
      }
    }

    Reloaded reload(const Transfer& t) {
      reap();
      uncount(t);  // needed now: it does not size the window ahead
      const auto index = t.device().index();
      if (!events_work(index)) {
        ++blocking_fallbacks_;
        auto bytes = t.empty_device_bytes();
        t.copy_to_device(bytes, /*non_blocking=*/false);
        return {std::move(bytes), true};
      }
      const c10::Stream compute = Device::current_stream(index);
      auto& mine = t.state();
      if (mine.stash.defined()) {
        // Still stashed: the device bytes never left. Their stream must not
        // reuse them before the D2H copy that reads them is done.
        mine.d2h->block(*mine.home_stream);
        if (*mine.home_stream != compute) Device::record_stream(mine.stash, compute);
        mine.reloaded_stream = std::exchange(mine.home_stream, std::nullopt);
        std::erase_if(stash_, [&](const Ref& w) { return w.lock() == t; });
        ++stash_reuses_;
        return {std::move(mine.stash), false};
      }
      // Not prefetched: bring it back now, ordered after the D2H copy that
      // filled the host buffer.
      if (!mine.prefetched.defined()) prefetch(t, compute);
      --outstanding_;
      outstanding_bytes_ -= t.device_nbytes();
      at::Tensor bytes = std::move(mine.prefetched);
      mine.h2d->block(compute);
      if (*mine.home_stream != compute) Device::record_stream(bytes, compute);
      mine.reloaded_stream = std::exchange(mine.home_stream, std::nullopt);
      return {std::move(bytes), true};
    }

    /// Another unpack served by the bytes the last reload gave back (a
    /// storage saved through several views): this consumer, on the current
    /// stream, may run on another stream than the first one (the forward
    /// saved the views on different streams). It waits for the copy that
    /// filled them, and the allocator is told of its stream, as for the
    /// first consumer.
    void on_shared(const Transfer& t, const at::Tensor& device_bytes) {
      auto& mine = t.state();
      if (!mine.reloaded_stream) return;  // a blocking reload: nothing in flight
      const c10::Stream compute = Device::current_stream(t.device().index());
      if (mine.h2d) mine.h2d->block(compute);
      if (*mine.reloaded_stream != compute) Device::record_stream(device_bytes, compute);
    }

    /// Called after every unpack: prefetches what backward needs next.
    void on_unpack(const Transfer& t) {
      const auto index = t.device().index();
      const std::int64_t window = window_bytes();
      if (window == 0 || !events_work(index)) return;
      const c10::Stream compute = Device::current_stream(index);
      // The next storages backward needs, in reverse pack order, while they
      // fit in the window (the first one always does).
      std::int64_t ahead = 0;
      bool first = true;
      for (auto it = std::make_reverse_iterator(order_.lower_bound(t.seq())); it != order_.rend(); ++it) {
        auto next = it->second.lock();
        if (!next || next.device() != t.device()) continue;
        ahead += next.device_nbytes();
        if (!first && ahead > window) break;
        first = false;
        if (next.state().stash.defined() || next.state().prefetched.defined()) continue;
        if (next.on_device()) continue;
        if (outstanding_bytes_ > 0 && outstanding_bytes_ + next.device_nbytes() > window) break;
        prefetch(next, compute);
      }
    }

    /// Called when a backward pass that unpacked through this manager ends:
    /// drops prefetches nobody consumed and the forward stash.
    void end_backward() {
      window_floor_ = 0;
      for (auto& [seq, ref] : order_) {
        auto t = ref.lock();
        if (!t) continue;
        if (t.state().prefetched.defined()) drop_prefetch(t);
        count(t);  // a later backward (retain_graph) needs it again
      }
      end_forward();
    }

    /// Called at scope exit: releases the whole forward stash.
    void end_forward() {
      while (!stash_.empty()) {
        auto t = stash_.front().lock();
        stash_.pop_front();
        if (t) drop_stash(t);
      }
    }

    /// The storage is being destroyed (autograd dropped its last saved
    /// tensor): forgets it. Its host buffers, where a copy may still read
    /// or write them, are kept until that copy's event completes (queried
    /// at later calls; the host does not wait).
    void release(const Transfer& t) noexcept {
      forget(t);
      retire(t);
    }

    /// The manager is about to grow the storage (a later saved view needs
    /// bytes it lacks): lets go of its stash and prefetch; its host
    /// buffers stay the entry's. resume() follows.
    void suspend(const Transfer& t) { forget(t); }

    /// After the manager grew the storage: copies what was added (blocking,
    /// on the current stream) and tracks it again, so that backward
    /// prefetches it.
    void resume(const Transfer& t, const at::Tensor& device_bytes) {
      t.copy_to_host(device_bytes, /*non_blocking=*/false);
      track(t);
    }

    /// Device bytes brought back ahead of need and not yet used.
    std::int64_t prefetched_bytes() const noexcept { return outstanding_bytes_; }

    /// Whether this policy holds a reference to `t`'s device storage (the
    /// forward stash, until its device-to-host copy is done).
    bool holds_device_bytes(const Transfer& t) const noexcept { return t.state().stash.defined(); }

    /// Device memory free for prefetching now (the manager passes the
    /// headroom under Options::device_target_bytes): until the next call
    /// the window is at least what is prefetched now plus `bytes`, else the
    /// one the options give. Reset at the end of a backward pass.
    void set_headroom(std::int64_t bytes) noexcept { window_floor_ = outstanding_bytes_ + bytes; }

    /// Adds this policy's counters to a Stats snapshot.
    void add_stats(Stats& stats) const {
      stats.blocking_fallbacks += blocking_fallbacks_;
      stats.stash_reuses += stash_reuses_;
      stats.prefetches += prefetches_;
      stats.prefetch_peak = std::max(stats.prefetch_peak, prefetch_peak_);
      stats.host_waits += host_waits_;
    }

   private:
    // The host buffers of a released storage and the events of the copies
    // that last read or wrote them.
    struct Retired {
      std::vector<at::Tensor> host;
      std::optional<c10::Event> d2h;
      std::optional<c10::Event> h2d;
    };

    // Keeps `t`'s host buffers while a copy may still use them (its events
    // are moved along). Where that fails (no memory for the record), waits
    // for the copies instead (Stats::host_waits).
    void retire(const Transfer& t) noexcept {
      auto& mine = t.state();
      Retired r{{}, std::move(mine.d2h), std::move(mine.h2d)};
      mine.d2h.reset();
      mine.h2d.reset();
      try {
        r.host = t.unordered_host_bytes();
        // Their allocator keeps them for the copies (no event is queried
        // then), or the copies ended.
        if (r.host.empty() || done(r)) return;
        retired_.push_back(std::move(r));
      } catch (...) {
        wait_for(r);
      }
    }

    // Whether the copies of `r` ended (a device whose query fails: treated
    // as ended only by wait_for).
    static bool done(const Retired& r) noexcept {
      try {
        return (!r.d2h || r.d2h->query()) && (!r.h2d || r.h2d->query());
      } catch (...) {
        return false;
      }
    }

    // Waits on the host for the copies of `r` (a failing device must not
    // turn a destructor into terminate(): its buffers are released anyway).
    void wait_for(Retired& r) noexcept {
      for (auto* event : {&r.d2h, &r.h2d}) {
        if (!*event) continue;
        try {
          if (!(*event)->query()) {
            ++host_waits_;
            (*event)->synchronize();
          }
        } catch (...) {
        }
      }
    }

    // Releases the host buffers of retired storages whose copies ended,
    // oldest first (they end in about the order they were queued).
    void reap() noexcept {
      while (!retired_.empty() && done(retired_.front())) retired_.pop_front();
    }

    // Drops what the policy holds for `t` on the device: its stash and its
    // prefetch, each after the stream it belongs to was made to wait for
    // the copy that uses it.
    void forget(const Transfer& t) noexcept {
      auto& mine = t.state();
      try {
        order_.erase(t.seq());
        uncount(t);
        if (mine.stash.defined()) drop_stash(t);
        if (mine.prefetched.defined()) drop_prefetch(t);
        mine.reloaded_stream.reset();
      } catch (...) {
      }
    }

    // The prefetch window in device bytes: Options::prefetch_bytes, or
    // prefetch_depth times the largest offloaded storage backward has not
    // needed yet (the window shrinks once the large ones, e.g. the logits,
    // came back); at least the floor the manager set.
    std::int64_t window_bytes() const noexcept {
      if (options_.prefetch_bytes == 0 && sizes_.empty()) return 0;
      return std::max(options_window_bytes(), window_floor_);
    }
    std::int64_t options_window_bytes() const noexcept {
      if (options_.prefetch_bytes > 0) return options_.prefetch_bytes;
      if (sizes_.empty()) return 0;
      return options_.prefetch_depth * sizes_.rbegin()->first;
    }

    // The stream of device-to-host copies.
    c10::Stream side_stream(c10::DeviceIndex index) {
      auto found = side_.find(index);
      if (found == side_.end()) found = side_.emplace(index, Device::side_stream(index)).first;
      return found->second;
    }
    // The stream of host-to-device copies: the device policy's h2d_stream
    // where it has one, else the side stream.
    c10::Stream h2d_stream(c10::DeviceIndex index) {
      auto found = h2d_.find(index);
      if (found == h2d_.end()) {
        if constexpr (requirement::h2d_stream<Device>) {
          found = h2d_.emplace(index, Device::h2d_stream(index)).first;
        } else {
          found = h2d_.emplace(index, side_stream(index)).first;
        }
      }
      return found->second;
    }

    void track(const Transfer& t) {
      order_[t.seq()] = t.ref();
      uncount(t);
      count(t);
    }

    // sizes_ counts the device bytes of the tracked storages backward has
    // not needed yet: the window is sized by the largest of them.
    void count(const Transfer& t) {
      if (t.state().counted_bytes >= 0) return;
      ++sizes_[t.device_nbytes()];
      t.state().counted_bytes = t.device_nbytes();
    }

    void uncount(const Transfer& t) noexcept {
      auto& bytes = t.state().counted_bytes;
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
        (void)h2d_stream(index);
      } catch (const c10::Error&) {
        ok = false;
      }
      events_ok_.emplace(index, ok);
      return ok;
    }

    // The stream the bytes were produced on waits for the copy that reads
    // them; only then may its allocator hand them out again.
    void drop_stash(const Transfer& t) {
      auto& mine = t.state();
      if (!mine.stash.defined()) return;
      mine.d2h->block(*mine.home_stream);
      mine.stash = at::Tensor();
      mine.home_stream.reset();
    }

    // An unconsumed prefetch: the stream the buffer was allocated on must
    // not reuse it before the copy has written it.
    void drop_prefetch(const Transfer& t) {
      auto& mine = t.state();
      mine.h2d->block(*mine.home_stream);
      mine.prefetched = at::Tensor();
      mine.home_stream.reset();
      --outstanding_;
      outstanding_bytes_ -= t.device_nbytes();
    }

    // H2D copy of `t` on the host-to-device stream into a buffer allocated on the
    // compute stream (its consumer).
    void prefetch(const Transfer& t, c10::Stream compute) {
      const auto index = t.device().index();
      at::Tensor bytes;
      {
        const c10::StreamGuard on_compute(compute);
        bytes = t.empty_device_bytes();
      }
      const c10::Stream side = h2d_stream(index);
      auto& mine = t.state();
      c10::Event allocated(Device::device_type);
      allocated.record(compute);
      allocated.block(side);  // the block may have been in use on the compute stream
      // The copy that filled the host buffer ran on the device-to-host
      // stream (a no-op when that is this one: FIFO order).
      if (mine.d2h) mine.d2h->block(side);
      {
        const c10::StreamGuard on_side(side);
        t.copy_to_device(bytes, /*non_blocking=*/true);
      }
      mine.h2d.emplace(Device::device_type);
      mine.h2d->record(side);
      mine.prefetched = std::move(bytes);
      mine.home_stream = compute;
      ++outstanding_;
      outstanding_bytes_ += t.device_nbytes();
      ++prefetches_;
      prefetch_peak_ = std::max(prefetch_peak_, outstanding_);
    }

    Options options_;
    std::map<c10::DeviceIndex, c10::Stream> side_;  // device-to-host copies
    std::map<c10::DeviceIndex, c10::Stream> h2d_;  // host-to-device copies (side_'s where the device has no h2d_stream)
    std::map<c10::DeviceIndex, bool> events_ok_;
    std::map<std::uint64_t, Ref> order_;          // offloaded storages by pack order
    std::deque<Ref> stash_;                       // forward stash, oldest first
    std::int64_t outstanding_ = 0;                // prefetched, not yet consumed
    std::int64_t outstanding_bytes_ = 0;          // their device bytes
    std::int64_t window_floor_ = 0;               // set_headroom()
    std::map<std::int64_t, std::int64_t> sizes_;  // device bytes -> entries not needed yet that have them
    std::int64_t blocking_fallbacks_ = 0;
    std::int64_t stash_reuses_ = 0;
    std::int64_t prefetches_ = 0;
    std::int64_t prefetch_peak_ = 0;
    std::int64_t host_waits_ = 0;
    std::deque<Retired> retired_;  // host buffers of released storages whose copies may still run
  };
};

}  // namespace offload::sync
