// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// detail::Entry: the manager's record of one offloaded storage, and the
/// byte geometry (Piece) of what it holds. Sync policies see an entry only
/// through offload::Transfer.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>

#include <offload/entry.hpp>

namespace offload::detail {

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

/// A tensor of `dtype` on `device` (the device of `storage`) viewing
/// `storage` with the given storage offset (in elements), sizes and strides
/// (no copy). Built directly, as at::empty builds its result (the dispatch
/// keys of the device, autograd's keys unless in inference mode), without
/// an operator call (`at::empty({0})` and `set_`, `as_strided`, `view`):
/// several run for every offloaded saved tensor at pack and at unpack.
/// Not an autograd view: it has a version counter of its own.
inline at::Tensor view_of(const c10::Storage& storage, c10::Device device, c10::ScalarType dtype,
                          std::int64_t storage_offset, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  TORCH_CHECK(storage.device() == device, "offload: a view on ", device, " of a storage on ", storage.device());
  // The bounds check as_strided and view make (set_ would grow the storage
  // instead): never a view past the end of the storage, e.g. of one freed
  // in place by resize_(0).
  const auto needed = at::detail::computeStorageNbytes(sizes, strides, c10::elementSize(dtype),
                                                       static_cast<std::size_t>(storage_offset));
  TORCH_CHECK(needed <= storage.nbytes(), "offload: a view reading ", needed, " bytes of a storage of ",
              storage.nbytes(), " bytes (was the storage freed in place?)");
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      c10::Storage(storage), c10::DispatchKeySet(c10::computeDispatchKey(dtype, c10::kStrided, device)),
      c10::scalarTypeToTypeMeta(dtype));
  impl->set_sizes_and_strides(sizes, strides, storage_offset);
  return at::Tensor(std::move(impl));
}

/// `piece` of the storage viewed by `storage_bytes`, a 1-D uint8 tensor that
/// starts at byte 0 of that storage (or of a buffer laid out like it).
inline at::Tensor piece_of(const at::Tensor& storage_bytes, const Piece& piece) {
  return view_of(storage_bytes.storage(), storage_bytes.device(), at::kByte,
                 storage_bytes.storage_offset() + piece.offset, piece.sizes, piece.strides);
}

/// The host copy of `piece` (a contiguous CPU uint8 tensor of piece.nbytes()
/// elements) shaped like the piece, for copy_ to and from piece_of().
inline at::Tensor piece_of(const HostBuffer& host, const Piece& piece) {
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(host.bytes.scalar_type() == at::kByte && host.bytes.is_contiguous());
  const auto& bytes = host.bytes;
  if (piece.dense())
    return view_of(bytes.storage(), bytes.device(), at::kByte, bytes.storage_offset(), piece.sizes, {1});
  // Contiguous strides for a strided piece (rare). Not c10::contiguous_strides:
  // its DimVector(n, 1) trips g++ 12's -Wmaybe-uninitialized here (-Werror).
  std::vector<std::int64_t> strides(piece.sizes.size(), 1);
  for (auto d = strides.size() - 1; d-- > 0;) strides[d] = strides[d + 1] * piece.sizes[d + 1];
  return view_of(bytes.storage(), bytes.device(), at::kByte, bytes.storage_offset(), piece.sizes, strides);
}

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
  std::int64_t nbytes = 0;                   ///< bytes of `host`: piece.nbytes()
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
};

/// Every piece of `entry` with its host buffer, in order: f(piece, host).
template <class E, class F>
void for_each_piece(E& entry, F&& f) {
  f(entry.piece, entry.host);
  for (auto& x : entry.extra) f(x.piece, x.host);
}

}  // namespace offload::detail
