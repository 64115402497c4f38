// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The buffers policies exchange with the manager: a host buffer (what a
/// storage policy allocates) and the device bytes a sync policy's reload
/// gives back.
/// A sync policy sees one offloaded storage through offload::Transfer
/// (<offload/transfer.hpp>).

#include <ATen/core/Tensor.h>

namespace offload {

/// Host memory for one offloaded piece: a 1-D CPU tensor of dtype uint8
/// with exactly `nbytes` elements, and whether it is page-locked.
struct HostBuffer {
  at::Tensor bytes;     ///< CPU, uint8, shape [nbytes], contiguous
  bool pinned = false;  ///< page-locked (eligible for asynchronous copies)
};

/// What a sync policy's reload() gives back: the device bytes (1-D uint8,
/// Transfer::device_nbytes() from byte 0 of the storage) and whether they
/// were copied from the host (false: the policy still had them on the
/// device, e.g. in a forward stash). The manager counts
/// Stats::tensors_reloaded and bytes_reloaded for copies.
struct Reloaded {
  at::Tensor bytes;
  bool copied = true;
};

}  // namespace offload
