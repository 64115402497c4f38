// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// detail::Piece: the bytes of a storage that saved views read, as a strided
/// uint8 geometry, and the byte geometry around it: which bytes a saved
/// tensor reads (piece_for), how far a piece reaches (piece_end), and
/// tensors viewing a piece of a device storage or of its host copy
/// (view_of, piece_of), built without an operator call.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>

#include <offload/buffers.hpp>

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

/// Bytes of storage `piece` spans: one past its last byte.
inline std::int64_t piece_end(const Piece& piece) {
  std::int64_t end = piece.offset;
  for (std::size_t i = 0; i < piece.sizes.size(); ++i) {
    if (piece.sizes[i] == 0) return piece.offset;
    end += (piece.sizes[i] - 1) * piece.strides[i];
  }
  return end + 1;
}

/// The bytes of its storage that `t` reads, as a piece: its byte range when
/// the range holds no more bytes than its elements (contiguous, transposed
/// tensors) or its elements overlap (expanded tensors), else its elements
/// alone (a narrow of the last dimension, a column, every other row), seen
/// as bytes.
inline Piece piece_for(const at::Tensor& t) {
  const std::int64_t item = static_cast<std::int64_t>(t.element_size());
  const std::int64_t lo = t.storage_offset() * item;
  Piece piece;
  if (t.numel() == 0) {  // no bytes, wherever it starts (even past the end of its storage)
    piece.sizes = {0};
    piece.strides = {1};
    return piece;
  }
  piece.offset = lo;
  std::int64_t last = 0;
  for (std::int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const std::int64_t span = (last + 1) * item;
  // Elements alone only when no two share a byte (a reload writes them):
  // sorted by stride, each dimension must step over the ones below it.
  c10::SmallVector<std::pair<std::int64_t, std::int64_t>, 6> dims;  // (stride, size), size > 1
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  }
  std::sort(dims.begin(), dims.end());
  bool overlapping = false;
  std::int64_t reach = 1;  // elements spanned by the dimensions below
  for (const auto& [stride, size] : dims) {
    overlapping = overlapping || stride < reach;
    reach = stride * (size - 1) + reach;
  }
  if (overlapping || t.numel() * item >= span) {
    piece.sizes = {span};
    piece.strides = {1};
    return piece;
  }
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    piece.sizes.push_back(t.size(d));
    piece.strides.push_back(t.stride(d) * item);
  }
  piece.sizes.push_back(item);
  piece.strides.push_back(1);
  return piece;
}

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

}  // namespace offload::detail
