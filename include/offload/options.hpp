// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::Options: every tunable of a manager, with defaults and units.

#include <cstdint>

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
inline constexpr Range prefetch_depth{0, 1024};                      ///< offloaded storages
inline constexpr Range host_budget_bytes{0, std::int64_t{1} << 50};  ///< bytes; 0 = unlimited
inline constexpr Range prefetch_bytes{0, std::int64_t{1} << 50};    ///< bytes; 0 = count tensors (prefetch_depth)
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

  /// sync::Streamed: how many saved tensors may be in flight to the host at
  /// once in forward (each keeps its device memory until its copy is done).
  /// Accepted: ranges::max_fwd_stash, [1, 1024]. Default 5 tensors.
  std::int64_t max_fwd_stash = 5;

  /// sync::Streamed: how many offloaded tensors backward brings back ahead
  /// of the one it needs now. 0 reloads on demand only.
  /// Accepted: ranges::prefetch_depth, [0, 1024]. Default 2 tensors. Used
  /// only when prefetch_bytes is 0.
  std::int64_t prefetch_depth = 2;

  /// sync::Streamed: how many bytes backward keeps in flight ahead of need
  /// (device buffers of offloaded tensors brought back, not yet used),
  /// whatever the tensor count, so that small saved tensors (LayerNorm's
  /// mean and rstd) do not take a slot like a large activation. At least
  /// one tensor is brought back ahead even if it alone exceeds the window.
  /// 0 = count tensors with prefetch_depth instead.
  /// Accepted: ranges::prefetch_bytes, [0, 2^50].
  /// Default 0 (count tensors). A window hides more copy time (16 MiB:
  /// 87.4 % against about 70 % with prefetch_depth 2 on bench/README.md's
  /// overlap benchmark) but raises the backward peak by up to its size: on
  /// the demo model (4 layers, about 20 MiB offloaded per step) 16 MiB
  /// raised the offloaded peak from 0.38x to 0.64x of the run without
  /// offloading, and a model whose activations fit in the window is brought
  /// back whole at the start of backward (no memory saved). Set it to a
  /// small fraction of one step's offloaded bytes.
  std::int64_t prefetch_bytes = 0;

  /// Whether storage::PinnedHost may use page-locked host memory. When false
  /// it allocates pageable memory (same results, slower copies).
  /// Default true.
  bool pin_memory = true;

  /// Upper bound on host bytes held by this manager; a tensor that would
  /// exceed it stays on the device. 0 = unlimited.
  /// Accepted: ranges::host_budget_bytes, [0, 2^50]. Default 0.
  std::int64_t host_budget_bytes = 0;

  /// Throws c10::ValueError naming the first field out of range, its value
  /// and the accepted range, e.g.
  /// "offload::Options: max_fwd_stash must be in [1, 1024], got 0".
  /// Changes nothing.
  void validate() const;
};

}  // namespace offload
