// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::Transfer: what a sync policy sees of one offloaded storage (its
/// device, pack order, sizes, the policy's own per-entry state) and the two
/// copies it decides the timing of. The pieces a storage is held in (a
/// saved view's bytes, and the pieces later views added) stay hidden.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>

#include <offload/detail/entry.hpp>

namespace offload {

template <class EntryState>
class TransferRef;
template <class EntryState>
class Transfer;

namespace detail {
/// The manager's handle on `entry` for one sync policy call: does not own
/// it (the manager holds it for the call, or is destroying it).
template <class EntryState>
Transfer<EntryState> transfer_of(Entry<EntryState>& entry) noexcept;
}  // namespace detail

/// A handle to one offloaded storage, handed to a sync policy by the
/// manager. Cheap to copy. A handle given to a policy call is valid during
/// that call; to refer to the storage later, keep a TransferRef (ref()),
/// which does not keep it alive.
///
/// `EntryState` is the policy's `State<Device>::EntryState`: what it keeps
/// per storage (state()); the manager default-constructs it and never reads
/// it.
///
/// Thread-safety: used under the manager's lock (every policy call is).
template <class EntryState>
class Transfer {
 public:
  /// An empty handle (refers to no storage).
  Transfer() = default;

  /// Whether the handle refers to a storage (TransferRef::lock() of a
  /// released one gives an empty handle).
  explicit operator bool() const noexcept { return entry_ != nullptr; }
  /// Same storage.
  friend bool operator==(const Transfer& a, const Transfer& b) noexcept { return a.entry_ == b.entry_; }

  /// The device (type and index) the storage lives on.
  c10::Device device() const noexcept { return entry_->device; }
  /// Pack order within the manager (0, 1, 2, ...): backward needs storages
  /// in reverse order.
  std::uint64_t seq() const noexcept { return entry_->seq; }
  /// Bytes of the device buffer a reload gives back: storage bytes
  /// [0, device_nbytes()), enough for every saved view of it.
  std::int64_t device_nbytes() const noexcept { return entry_->device_nbytes; }
  /// Bytes held on the host, over every piece.
  std::int64_t host_nbytes() const noexcept { return entry_->host_nbytes(); }
  /// The policy's own per-storage state.
  EntryState& state() const noexcept { return entry_->sync; }
  /// Whether the bytes of the last reload are still in use on the device
  /// (another saved view of the storage holds them): bringing the storage
  /// back again is not needed.
  bool on_device() const noexcept { return entry_->reloaded && !entry_->reloaded->expired(); }

  /// A new, uninitialised 1-D uint8 device buffer of device_nbytes() on
  /// device(), from the allocator of the current stream: what copy_to_device
  /// fills. Throws c10::Error when the device is out of memory.
  at::Tensor empty_device_bytes() const {
    const c10::DeviceGuard guard(entry_->device);
    return at::empty({entry_->device_nbytes}, at::TensorOptions().dtype(at::kByte).device(entry_->device));
  }

  /// Copies the bytes of the storage the host does not hold yet (after
  /// the first offload: every saved view's bytes; after a later view grew
  /// the storage: only what it added) from `device_bytes`, a 1-D uint8 view
  /// of the storage from byte 0, into host buffers, on the current stream.
  /// With `non_blocking`, the copy is queued; the caller keeps
  /// `device_bytes` alive and orders its release after the copy.
  void copy_to_host(const at::Tensor& device_bytes, bool non_blocking) const {
    std::size_t i = 0;
    detail::for_each_piece(*entry_, [&](const detail::Piece& p, const HostBuffer& host) {
      if (i++ >= entry_->pieces_on_host)
        detail::piece_of(host, p).copy_(detail::piece_of(device_bytes, p), non_blocking);
    });
    entry_->pieces_on_host = i;
  }

  /// Copies every byte held on the host into `device_bytes` (a buffer of
  /// device_nbytes() laid out like the storage, e.g. from
  /// empty_device_bytes()), on the current stream. With `non_blocking`, the
  /// copy is queued; the caller orders every use of `device_bytes`, and the
  /// end of the host buffers' life, after it.
  void copy_to_device(const at::Tensor& device_bytes, bool non_blocking) const {
    detail::for_each_piece(*entry_, [&](const detail::Piece& p, const HostBuffer& host) {
      detail::piece_of(device_bytes, p).copy_(detail::piece_of(host, p), non_blocking);
    });
  }

  /// The host buffers of the pieces whose allocator would hand their memory
  /// out again as soon as their last reference goes (not
  /// HostBuffer::stream_ordered: storage::PinnedPool's), as 1-D CPU uint8
  /// tensors sharing that memory. A policy whose copies may still read or
  /// write them when the storage is released keeps these until the copies
  /// end.
  std::vector<at::Tensor> unordered_host_bytes() const {
    std::vector<at::Tensor> out;
    detail::for_each_piece(*entry_, [&](const detail::Piece&, const HostBuffer& host) {
      if (!host.stream_ordered) out.push_back(host.bytes);
    });
    return out;
  }

  /// A reference to this storage that does not keep it alive.
  TransferRef<EntryState> ref() const noexcept;

 private:
  using Entry = detail::Entry<EntryState>;
  friend class TransferRef<EntryState>;
  friend Transfer detail::transfer_of<EntryState>(Entry& entry) noexcept;
  // Owning (TransferRef::lock()), or not: the manager's (transfer_of).
  explicit Transfer(std::shared_ptr<Entry> entry) noexcept : entry_(std::move(entry)) {}
  std::shared_ptr<Entry> entry_;
};

template <class EntryState>
Transfer<EntryState> detail::transfer_of(Entry<EntryState>& entry) noexcept {
  return Transfer<EntryState>(std::shared_ptr<Entry<EntryState>>(std::shared_ptr<Entry<EntryState>>(), &entry));
}

/// A weak reference to an offloaded storage, for a sync policy that keeps
/// track of storages between calls (a stash, a prefetch order). Does not
/// keep the storage alive: the manager calls the policy's release() before
/// one is destroyed.
template <class EntryState>
class TransferRef {
 public:
  TransferRef() = default;
  /// The storage, kept alive by the returned handle, or an empty handle
  /// once it is being destroyed.
  Transfer<EntryState> lock() const noexcept { return Transfer<EntryState>(entry_.lock()); }
  /// Whether the storage is gone (or being destroyed).
  bool expired() const noexcept { return entry_.expired(); }

 private:
  friend class Transfer<EntryState>;
  explicit TransferRef(std::weak_ptr<detail::Entry<EntryState>> entry) noexcept : entry_(std::move(entry)) {}
  std::weak_ptr<detail::Entry<EntryState>> entry_;
};

template <class EntryState>
TransferRef<EntryState> Transfer<EntryState>::ref() const noexcept {
  return TransferRef<EntryState>(entry_ ? entry_->weak_from_this() : std::weak_ptr<Entry>());
}

}  // namespace offload
