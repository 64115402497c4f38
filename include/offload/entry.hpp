// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The records policies exchange with the manager: a host buffer, one
/// offloaded storage (with the sync policy's own per-entry state), and what
/// a reload gives back. Needed by authors of storage and sync policies.

#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>

namespace offload {

/// Host memory for one offloaded storage: a 1-D CPU tensor of dtype uint8
/// with exactly `nbytes` elements, and whether it is page-locked.
struct HostBuffer {
  at::Tensor bytes;     ///< CPU, uint8, shape [nbytes], contiguous
  bool pinned = false;  ///< page-locked (eligible for asynchronous copies)
};

/// The bytes of a storage that saved views cover, as a strided uint8
/// geometry over the storage: byte offset, sizes and strides in bytes. A
/// dense piece is one contiguous byte range (sizes {n}, strides {1}); a
/// strided one is a saved view seen as bytes (its sizes plus a last
/// dimension of its element size), copied element by element.
struct Piece {
  std::int64_t offset = 0;                  ///< first byte, from the start of the storage
  c10::SmallVector<std::int64_t, 6> sizes;  ///< in bytes along the last dimension
  c10::SmallVector<std::int64_t, 6> strides;
  /// Bytes the piece holds (its host copy's size): the product of sizes.
  std::int64_t nbytes() const noexcept {
    std::int64_t n = 1;
    for (auto s : sizes) n *= s;
    return n;
  }
  bool dense() const noexcept { return sizes.size() == 1 && strides.size() == 1 && strides[0] == 1; }
  friend bool operator==(const Piece&, const Piece&) = default;
};

/// `piece` of the storage viewed by `storage_bytes`, a 1-D uint8 tensor that
/// starts at byte 0 of that storage (or of a buffer laid out like it).
inline at::Tensor piece_of(const at::Tensor& storage_bytes, const Piece& piece) {
  return storage_bytes.as_strided(piece.sizes, piece.strides, storage_bytes.storage_offset() + piece.offset);
}

/// The host copy of `piece` (a contiguous CPU uint8 tensor of piece.nbytes()
/// elements) shaped like the piece, for copy_ to and from piece_of().
inline at::Tensor piece_of(const HostBuffer& host, const Piece& piece) { return host.bytes.view(piece.sizes); }

/// One device storage offloaded to the host. Shared (std::shared_ptr) by
/// every saved tensor that views it; destroyed, with its host memory, when
/// the last of them is released by autograd.
///
/// `SyncState` is the sync policy's own per-entry state
/// (`Sync::State<Device>::EntryState`), kept in `sync`: the manager
/// default-constructs it and never reads it.
///
/// Thread-safety: fields are written by the manager under its lock or by
/// the sync policy while it holds the entry; policies must not keep raw
/// pointers past release().
template <class SyncState>
struct Entry {
  // --- set by the manager before the sync policy sees the entry ----------
  c10::Device device{c10::DeviceType::CPU};  ///< where the storage lived (type and index)
  std::int64_t nbytes = 0;                   ///< bytes of `host`: piece.nbytes()
  /// The bytes the sync policy copies (from the first saved view): only
  /// these travel and are held on the host, not the whole storage.
  Piece piece;
  /// Size of the device buffer a reload allocates: storage bytes
  /// [0, device_nbytes), enough for every piece, so that each view comes
  /// back with its own storage offset. Bytes no piece covers are undefined.
  std::int64_t device_nbytes = 0;
  /// Pieces added by later saved views of the same storage and version that
  /// reached outside what was copied; the manager copies them itself
  /// (blocking, on the current stream) and writes them into the device
  /// buffer after the sync policy's reload.
  struct Extra {
    Piece piece;
    HostBuffer host;
  };
  std::vector<Extra> extra;
  std::uint64_t seq = 0;     ///< pack order within the manager (0, 1, 2, ...)
  std::int64_t version = 0;  ///< version counter of the saved tensor at pack
  HostBuffer host;           ///< allocated by the storage policy; filled by the sync policy
  /// The storage that was copied (alias detection); weak, so it does not
  /// keep device memory alive, yet its address cannot be reused while held.
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> source;
  /// The storage brought back by the last reload, while someone still uses
  /// it (a sync policy need not prefetch an entry whose reload is alive).
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> reloaded;
  /// Saved tensors (views) served by this entry, and how many of them the
  /// current backward pass has unpacked. While some are still to come, the
  /// storage brought back is kept (`keep`) so it is copied back only once.
  std::int64_t views = 1;
  std::int64_t unpacked = 0;
  at::Tensor keep;

  // --- the sync policy's --------------------------------------------------
  SyncState sync{};
};

/// What a sync policy's reload() gives back: the device bytes (1-D uint8,
/// Entry::device_nbytes from byte 0 of the storage) and whether they were copied from the host (false:
/// the policy still had them on the device, e.g. in a forward stash).
/// The manager counts Stats::tensors_reloaded and bytes_reloaded for copies.
struct Reloaded {
  at::Tensor bytes;
  bool copied = true;
};

}  // namespace offload
