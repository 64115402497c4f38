// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::Options: every tunable of a manager, with defaults and units.

#include <array>
#include <cstdint>
#include <string_view>

namespace offload {

/// A closed range [lo, hi] of accepted values of one Options field.
struct Range {
  std::int64_t lo;
  std::int64_t hi;
  /// Whether lo <= value <= hi.
  constexpr bool contains(std::int64_t value) const noexcept { return value >= lo && value <= hi; }
};

/// The accepted range of each integer field of Options: the one place these
/// numbers are written. Options::validate(), the demo's flags and the docs
/// tests read them from here.
namespace ranges {
inline constexpr Range min_offload_bytes{0, std::int64_t{1} << 50};  ///< bytes
inline constexpr Range max_fwd_stash{1, 1024};                       ///< offloaded storages
inline constexpr Range prefetch_depth{0, 1024};                      ///< largest offloaded storages
inline constexpr Range host_budget_bytes{0, std::int64_t{1} << 50};  ///< bytes; 0 = unlimited
inline constexpr Range prefetch_bytes{0, std::int64_t{1} << 50};  ///< bytes; 0 = prefetch_depth x the largest storage
inline constexpr Range device_target_bytes{0, std::int64_t{1} << 50};  ///< bytes; 0 = off (offload every eligible)
}  // namespace ranges

/// Settings of one offload manager. Plain data: copy freely. A manager
/// validates its copy once, in its constructor, before it changes any state.
///
/// Thread-safety: a const Options may be read from any thread.
struct Options {
  /// Saved tensors whose underlying storage is smaller than this many bytes
  /// stay where they are (bookkeeping costs more than the copy saves).
  /// Accepted: ranges::min_offload_bytes, [0, 2^50]. Default 1024 bytes.
  std::int64_t min_offload_bytes = 1024;

  /// sync::Streamed: the forward stash. The last this many offloaded
  /// storages keep their device memory after their copy to the host
  /// started, whether or not it has finished (when a new one comes the
  /// oldest is let go, and the compute stream waits for its copy before
  /// reusing the memory); one still stashed when backward needs it is
  /// reused without a copy back.
  /// Accepted: ranges::max_fwd_stash, [1, 1024]. Default 5 storages.
  std::int64_t max_fwd_stash = 5;

  /// sync::Streamed: how far ahead of need backward brings offloaded
  /// tensors back, in units of the largest offloaded storage: when
  /// prefetch_bytes is 0 the prefetch window is prefetch_depth times the
  /// device bytes of the largest offloaded storage backward has not needed
  /// yet (the same bound on device memory as prefetch_depth large tensors;
  /// it shrinks once the largest, e.g. the logits, came back), and any
  /// number of smaller tensors (LayerNorm's mean and rstd) fill it, so they
  /// do not take a slot each. 0 reloads on demand only.
  /// Accepted: ranges::prefetch_depth, [0, 1024]. Default 2.
  std::int64_t prefetch_depth = 2;

  /// sync::Streamed: a fixed prefetch window in bytes instead: backward
  /// keeps up to this many device bytes of offloaded tensors brought back
  /// ahead of need (not yet used), whatever the tensor count. At least one
  /// tensor is brought back ahead even if it alone exceeds the window.
  /// 0 = the window follows prefetch_depth (above).
  /// Accepted: ranges::prefetch_bytes, [0, 2^50]. Default 0.
  /// A fixed window larger than a few of the model's largest saved tensors
  /// raises the backward peak by up to its size for little more overlap: on
  /// the demo model (4 layers, about 20 MiB offloaded per step) 16 MiB
  /// raised the offloaded peak from 0.38x to 0.64x of the run without
  /// offloading, and a model whose activations fit in the window is brought
  /// back whole at the start of backward (no memory saved).
  std::int64_t prefetch_bytes = 0;

  /// Whether storage::PinnedHost may use page-locked host memory. When false
  /// it allocates pageable memory (same results, slower copies).
  /// Default true.
  bool pin_memory = true;

  /// Upper bound on the host bytes reserved for what this manager holds
  /// (Stats::host_bytes_reserved: each buffer counted at the block its
  /// allocator sets aside, e.g. a power of two for CUDA's pinned
  /// allocator); a tensor that would exceed it stays on the device. Checked
  /// before allocating (the storage policy's reserved_for(), else the
  /// bytes) and again with the buffer's HostBuffer::reserved.
  /// 0 = unlimited.
  /// Accepted: ranges::host_budget_bytes, [0, 2^50]. Default 0.
  std::int64_t host_budget_bytes = 0;

  /// A device-memory target: the peak of allocated device memory (what the
  /// device allocator reports, e.g. torch.cuda.memory_allocated) a step
  /// should stay under, in bytes. 0 = off: every eligible saved tensor is
  /// offloaded. Otherwise each Scope of the manager is one step: the manager
  /// records what the step saved (pack order, storage bytes, eligibility)
  /// and the allocated memory at each pack, at scope exit and at each
  /// unpack, and plans the next step to offload the fewest bytes that keep
  /// it under the target, offloading the tensors saved earliest and keeping
  /// the latest. The first step offloads every eligible tensor. A guard
  /// offloads a tensor the plan keeps when allocated memory plus what the
  /// plan still keeps would exceed the target. sync::Streamed's prefetch
  /// window grows to the headroom under the target. A target that cannot be
  /// met warns once and offloads everything. A device policy without memory
  /// statistics counts only the saved bytes the manager keeps on the device
  /// (docs/guide.md, "A device-memory target").
  /// Accepted: ranges::device_target_bytes, [0, 2^50]. Default 0.
  std::int64_t device_target_bytes = 0;

  /// Throws c10::ValueError naming the first field out of range, its value
  /// and the accepted range, e.g.
  /// "offload::Options: max_fwd_stash must be in [1, 1024], got 0".
  /// Changes nothing.
  void validate() const;
};

/// One integer field of Options: its name (as in C++, the demo's and the
/// Python package's keyword), the member, its accepted range and its unit.
struct OptionField {
  std::string_view name;
  std::int64_t Options::* member;
  Range range;
  std::string_view unit;
};

/// Every integer field of Options, in declaration order (pin_memory, the
/// one bool, is not listed). validate() checks these in this order, and the
/// Python binding reads its keywords and options() from here.
inline constexpr std::array option_fields{
    OptionField{"min_offload_bytes", &Options::min_offload_bytes, ranges::min_offload_bytes, "bytes"},
    OptionField{"max_fwd_stash", &Options::max_fwd_stash, ranges::max_fwd_stash, "offloaded storages"},
    OptionField{"prefetch_depth", &Options::prefetch_depth, ranges::prefetch_depth, "largest offloaded storages"},
    OptionField{"prefetch_bytes", &Options::prefetch_bytes, ranges::prefetch_bytes, "bytes"},
    OptionField{"host_budget_bytes", &Options::host_budget_bytes, ranges::host_budget_bytes, "bytes"},
    OptionField{"device_target_bytes", &Options::device_target_bytes, ranges::device_target_bytes, "bytes"},
};
static_assert(sizeof(Options) == (option_fields.size() + 1) * sizeof(std::int64_t),
              "offload::option_fields must list every integer field of offload::Options");

}  // namespace offload
