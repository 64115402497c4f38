// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// detail::Entry: the manager's record of one offloaded storage: its pieces
/// (<offload/detail/piece.hpp>) and their host buffers, and what the manager
/// asks of them (the host bytes they hold, whether they cover a piece, what
/// they lack of one). Sync policies see an entry only through
/// offload::Transfer.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <offload/buffers.hpp>
#include <offload/detail/piece.hpp>

namespace offload::detail {

/// One device storage offloaded to the host. Shared (std::shared_ptr) by
/// every saved tensor that views it; destroyed, with its host memory, when
/// the last of them is released by autograd.
///
/// `SyncState` is the sync policy's own per-entry state
/// (`Sync::State<Device>::EntryState`), kept in `sync`: the manager
/// default-constructs it and never reads it.
///
/// Thread-safety: written under the manager's lock.
template <class SyncState>
struct Entry : std::enable_shared_from_this<Entry<SyncState>> {
  c10::Device device{c10::DeviceType::CPU};  ///< where the storage lived (type and index)
  /// The bytes the first saved view reads: only these travel and are held
  /// on the host, not the whole storage.
  Piece piece;
  /// Size of the device buffer a reload allocates: storage bytes
  /// [0, device_nbytes), enough for every piece, so that each view comes
  /// back with its own storage offset. Bytes no piece covers are undefined.
  std::int64_t device_nbytes = 0;
  /// Pieces added by later saved views of the same storage and version that
  /// reached outside what was copied.
  struct Extra {
    Piece piece;
    HostBuffer host;
  };
  std::vector<Extra> extra;
  /// How many pieces (`piece`, then `extra` in order) hold their bytes on
  /// the host: Transfer::copy_to_host() copies the others.
  std::size_t pieces_on_host = 0;
  std::uint64_t seq = 0;     ///< pack order within the manager (0, 1, 2, ...)
  std::int64_t version = 0;  ///< version counter of the saved tensor at pack
  HostBuffer host;           ///< allocated by the storage policy; filled by Transfer::copy_to_host()
  /// The storage that was copied (alias detection); weak, so it does not
  /// keep device memory alive, yet its address cannot be reused while held.
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> source;
  /// The storage brought back by the last reload, while someone still uses
  /// it (Transfer::on_device()).
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> reloaded;
  /// Saved tensors (views) served by this entry, and how many of them the
  /// current backward pass has unpacked. While some are still to come, the
  /// storage brought back is kept (`keep`) so it is copied back only once.
  std::int64_t views = 1;
  std::int64_t unpacked = 0;
  at::Tensor keep;

  SyncState sync{};  ///< the sync policy's (Transfer::state())

  /// Host bytes the entry holds: its piece and the extra ones (what the
  /// manager counts in Stats::host_bytes_in_use and a reload copies).
  std::int64_t host_nbytes() const noexcept {
    std::int64_t n = piece.nbytes();
    for (const auto& x : extra) n += x.piece.nbytes();
    return n;
  }
  /// Host bytes set aside for the entry's buffers (Stats::host_bytes_reserved).
  std::int64_t host_reserved() const noexcept {
    std::int64_t n = host.reserved_nbytes();
    for (const auto& x : extra) n += x.host.reserved_nbytes();
    return n;
  }
  /// Whether the pieces already hold every byte of `wanted`.
  bool covers(const Piece& wanted) const {
    const auto lo = wanted.offset;
    const auto hi = piece_end(wanted);
    const auto holds = [&](const Piece& p) {
      return p == wanted || (p.dense() && p.offset <= lo && hi <= p.offset + p.sizes[0]);
    };
    return holds(piece) || std::any_of(extra.begin(), extra.end(), [&](const Extra& x) { return holds(x.piece); });
  }
  /// What the pieces lack of `wanted`: the gaps the dense pieces leave in a
  /// dense `wanted`, or a strided `wanted` whole.
  std::vector<Piece> missing(const Piece& wanted) const {
    if (!wanted.dense()) return {wanted};
    std::vector<std::pair<std::int64_t, std::int64_t>> have;
    const auto add = [&](const Piece& p) {
      if (p.dense()) have.emplace_back(p.offset, p.offset + p.sizes[0]);
    };
    add(piece);
    for (const auto& x : extra) add(x.piece);
    std::sort(have.begin(), have.end());
    std::vector<Piece> out;
    std::int64_t at = wanted.offset;
    const std::int64_t end = wanted.offset + wanted.sizes[0];
    const auto gap = [&](std::int64_t lo, std::int64_t hi) {
      if (hi > lo) out.push_back(Piece{lo, {hi - lo}, {1}});
    };
    for (const auto& [lo, hi] : have) {
      if (lo >= end) break;
      gap(at, std::min(lo, end));
      at = std::max(at, hi);
    }
    gap(at, end);
    return out;
  }
};

/// Every piece of `entry` with its host buffer, in order: f(piece, host).
template <class E, class F>
void for_each_piece(E& entry, F&& f) {
  f(entry.piece, entry.host);
  for (auto& x : entry.extra) f(x.piece, x.host);
}

}  // namespace offload::detail
