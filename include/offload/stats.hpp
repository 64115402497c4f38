// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::Stats: what a manager did, as counters.

#include <array>
#include <cstdint>
#include <iosfwd>
#include <string_view>

namespace offload {

/// A snapshot of one manager's counters since it was made (or since
/// reset_stats()). All byte counts are bytes of the underlying storages.
///
/// Thread-safety: a snapshot is a plain value; taking one is thread-safe.
struct Stats {
  std::int64_t tensors_seen = 0;        ///< saved tensors given to the pack hook
  std::int64_t tensors_offloaded = 0;   ///< saved tensors served from host memory (views of one storage each count)
  std::int64_t storages_offloaded = 0;  ///< distinct storages copied to the host
  std::int64_t tensors_aliased = 0;     ///< saved tensors that reused another view's host copy
  std::int64_t passed_other_device = 0; ///< not on the manager's device type (e.g. CPU tensors)
  std::int64_t passed_small = 0;        ///< storage under Options::min_offload_bytes
  std::int64_t passed_excluded = 0;     ///< registered with Manager::exclude (parameters, buffers)
  std::int64_t passed_leaf = 0;         ///< leaf tensors that require grad (parameters)
  std::int64_t passed_layout = 0;       ///< sparse, quantized, nested or other non-strided tensors
  std::int64_t passed_budget = 0;       ///< would have exceeded Options::host_budget_bytes
  std::int64_t bytes_offloaded = 0;     ///< bytes copied device -> host
  std::int64_t bytes_reloaded = 0;      ///< bytes copied host -> device
  std::int64_t tensors_reloaded = 0;    ///< host -> device copies made
  std::int64_t reloads_shared = 0;      ///< unpacks served by a storage already brought back
  std::int64_t host_bytes_in_use = 0;   ///< host bytes this manager holds now
  std::int64_t host_bytes_peak = 0;     ///< most host bytes held at once
  std::int64_t blocking_fallbacks = 0;  ///< copies made blocking because the runtime lacked streams/events
  std::int64_t pinned_fallbacks = 0;    ///< pinned allocations that failed and used pageable memory
  std::int64_t stash_reuses = 0;        ///< unpacks served from the forward stash (no copy back)
  std::int64_t prefetches = 0;          ///< host -> device copies started ahead of (or on) demand by Streamed
  std::int64_t prefetch_peak = 0;       ///< most prefetched buffers outstanding at once (tensors; with prefetch_bytes 0: <= Options::prefetch_depth, +1 on demand)

  /// Saved tensors that stayed on their device or host, all reasons.
  std::int64_t passed_through() const noexcept {
    return passed_other_device + passed_small + passed_excluded + passed_leaf + passed_layout +
           passed_budget;
  }
};

/// One counter of Stats: its name (as operator<< and the JSON writers spell
/// it), the member holding it, and what it counts.
struct StatField {
  std::string_view name;
  std::int64_t Stats::* member;
  std::string_view doc;
};

/// Every counter of Stats, in declaration order: the one list that printing
/// and JSON output walk, so a new counter is added here and nowhere else.
inline constexpr std::array<StatField, 21> stat_fields{{
    {"tensors_seen", &Stats::tensors_seen, "saved tensors given to the pack hook"},
    {"tensors_offloaded", &Stats::tensors_offloaded, "saved tensors served from host memory (views of one storage each count)"},
    {"storages_offloaded", &Stats::storages_offloaded, "distinct storages copied to the host"},
    {"tensors_aliased", &Stats::tensors_aliased, "saved tensors that reused another view's host copy"},
    {"passed_other_device", &Stats::passed_other_device, "not on the manager's device type (e.g. CPU tensors)"},
    {"passed_small", &Stats::passed_small, "storage under Options::min_offload_bytes"},
    {"passed_excluded", &Stats::passed_excluded, "registered with Manager::exclude (parameters, buffers)"},
    {"passed_leaf", &Stats::passed_leaf, "leaf tensors that require grad (parameters)"},
    {"passed_layout", &Stats::passed_layout, "sparse, quantized, nested or other non-strided tensors"},
    {"passed_budget", &Stats::passed_budget, "would have exceeded Options::host_budget_bytes"},
    {"bytes_offloaded", &Stats::bytes_offloaded, "bytes copied device -> host"},
    {"bytes_reloaded", &Stats::bytes_reloaded, "bytes copied host -> device"},
    {"tensors_reloaded", &Stats::tensors_reloaded, "host -> device copies made"},
    {"reloads_shared", &Stats::reloads_shared, "unpacks served by a storage already brought back"},
    {"host_bytes_in_use", &Stats::host_bytes_in_use, "host bytes this manager holds now"},
    {"host_bytes_peak", &Stats::host_bytes_peak, "most host bytes held at once"},
    {"blocking_fallbacks", &Stats::blocking_fallbacks, "copies made blocking because the runtime lacked streams/events"},
    {"pinned_fallbacks", &Stats::pinned_fallbacks, "pinned allocations that failed and used pageable memory"},
    {"stash_reuses", &Stats::stash_reuses, "unpacks served from the forward stash (no copy back)"},
    {"prefetches", &Stats::prefetches, "host -> device copies started ahead of (or on) demand by Streamed"},
    {"prefetch_peak", &Stats::prefetch_peak, "most prefetched buffers outstanding at once (<= Options::prefetch_depth, +1 on demand)"},
}};

/// Writes the counters as one line of `name=value` pairs.
std::ostream& operator<<(std::ostream& os, const Stats& stats);

}  // namespace offload
