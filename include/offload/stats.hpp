// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// offload::Stats: what a manager did, as counters; offload::stat_fields:
/// the list of those counters with their names and meanings (the one list
/// printing, JSON writers and bindings are generated from).

#include <array>
#include <cstdint>
#include <iosfwd>
#include <string_view>

namespace offload {

/// A snapshot of one manager's counters since it was made (or since
/// reset_stats()). Byte counts are bytes of the underlying storages, but
/// host_bytes_reserved*: bytes the host allocator set aside for them, and
/// bytes_kept: each kept tensor's own bytes (numel x element size).
/// What each field counts: offload::stat_fields (same order).
///
/// Thread-safety: a snapshot is a plain value; taking one is thread-safe.
struct Stats {
  std::int64_t tensors_seen = 0;
  std::int64_t tensors_offloaded = 0;
  std::int64_t storages_offloaded = 0;
  std::int64_t tensors_aliased = 0;
  std::int64_t passed_other_device = 0;
  std::int64_t passed_small = 0;
  std::int64_t passed_excluded = 0;
  std::int64_t passed_leaf = 0;
  std::int64_t passed_layout = 0;
  std::int64_t passed_subclass = 0;
  std::int64_t passed_budget = 0;
  std::int64_t passed_target = 0;
  std::int64_t passed_capture = 0;
  std::int64_t bytes_offloaded = 0;
  std::int64_t bytes_reloaded = 0;
  std::int64_t bytes_kept = 0;
  std::int64_t tensors_reloaded = 0;
  std::int64_t reloads_shared = 0;
  std::int64_t host_bytes_in_use = 0;
  std::int64_t host_bytes_peak = 0;
  std::int64_t host_bytes_reserved = 0;
  std::int64_t host_bytes_reserved_peak = 0;
  std::int64_t blocking_fallbacks = 0;
  std::int64_t pinned_fallbacks = 0;
  std::int64_t stash_reuses = 0;
  std::int64_t prefetches = 0;
  std::int64_t prefetch_peak = 0;
  std::int64_t host_waits = 0;
  std::int64_t target_kept_bytes = 0;
  std::int64_t target_guard_offloads = 0;
  std::int64_t target_planned_offload_bytes = 0;
  std::int64_t target_min_offload_bytes = 0;
  std::int64_t target_steps_planned = 0;
  std::int64_t blocks_kept = 0;
  std::int64_t blocks_offloaded = 0;
  std::int64_t blocks_recomputed = 0;
  std::int64_t blocks_guarded = 0;
  std::int64_t plan_predicted_step_us = 0;
  std::int64_t plan_measured_step_us = 0;

  /// Saved tensors that stayed on their device or host, all reasons.
  std::int64_t passed_through() const noexcept {
    return passed_other_device + passed_small + passed_excluded + passed_leaf + passed_layout + passed_subclass +
           passed_budget + passed_target + passed_capture;
  }
};

/// One field of Stats: its name (as printed and in JSON), the member, and
/// what it counts (one line, for help texts and generated docs).
struct StatField {
  std::string_view name;
  std::int64_t Stats::* member;
  std::string_view doc;
};

/// Every field of Stats, in declaration order. Iterate it instead of naming
/// fields: `for (const auto& f : offload::stat_fields) out[f.name] = stats.*f.member;`
inline constexpr std::array stat_fields{
    StatField{"tensors_seen", &Stats::tensors_seen, "saved tensors given to the pack hook"},
    StatField{"tensors_offloaded", &Stats::tensors_offloaded,
              "saved tensors served from host memory (views of one storage each count)"},
    StatField{"storages_offloaded", &Stats::storages_offloaded, "distinct storages copied to the host"},
    StatField{"tensors_aliased", &Stats::tensors_aliased, "saved tensors that reused another view's host copy"},
    StatField{"passed_other_device", &Stats::passed_other_device,
              "not on the manager's device type (e.g. CPU tensors), or undefined"},
    StatField{"passed_small", &Stats::passed_small, "storage under Options::min_offload_bytes"},
    StatField{"passed_excluded", &Stats::passed_excluded,
              "shares storage with a tensor registered with exclude() (buffers, caches), or of an excluded type"},
    StatField{"passed_leaf", &Stats::passed_leaf,
              "parameters: leaves that require grad and views of them; from Python also nn.Parameter objects "
              "(trainable or frozen, FSDP2's unsharded and DTensor parameters) and views of them"},
    StatField{"passed_layout", &Stats::passed_layout, "sparse, quantized, nested or other non-strided tensors"},
    StatField{"passed_subclass", &Stats::passed_subclass,
              "tensors without storage of their own that the manager cannot see into: a tensor subclass without "
              "__tensor_flatten__ (Python), a wrapper, functional or batched tensor (C++); also a jagged nested "
              "tensor's offsets, which its ragged size is tied to (Python)"},
    StatField{"passed_budget", &Stats::passed_budget, "would have exceeded Options::host_budget_bytes"},
    StatField{"passed_target", &Stats::passed_target,
              "kept on the device by the Options::device_target_bytes plan (eligible, not needed off it)"},
    StatField{"passed_capture", &Stats::passed_capture,
              "saved while the device's current stream was capturing a graph (CUDA graphs): a captured graph "
              "cannot hold the manager's copies, event waits and host allocations"},
    StatField{"bytes_offloaded", &Stats::bytes_offloaded, "bytes copied device -> host"},
    StatField{"bytes_reloaded", &Stats::bytes_reloaded, "bytes copied host -> device"},
    StatField{"bytes_kept", &Stats::bytes_kept,
              "bytes of the strided saved tensors that stayed on the manager's device type, all reasons (each "
              "tensor's own bytes, numel x element size: views of one storage count each)"},
    StatField{"tensors_reloaded", &Stats::tensors_reloaded, "host -> device copies made"},
    StatField{"reloads_shared", &Stats::reloads_shared, "unpacks served by a storage already brought back"},
    StatField{"host_bytes_in_use", &Stats::host_bytes_in_use, "host bytes this manager holds now"},
    StatField{"host_bytes_peak", &Stats::host_bytes_peak, "most host bytes held at once"},
    StatField{"host_bytes_reserved", &Stats::host_bytes_reserved,
              "host bytes set aside for what this manager holds now: the allocator's block of each buffer (a power "
              "of two with CUDA's pinned allocator, the 64-byte carved size with PinnedPool); what "
              "Options::host_budget_bytes limits"},
    StatField{"host_bytes_reserved_peak", &Stats::host_bytes_reserved_peak, "most host bytes reserved at once"},
    StatField{"blocking_fallbacks", &Stats::blocking_fallbacks,
              "copies made blocking because the runtime lacked streams/events"},
    StatField{"pinned_fallbacks", &Stats::pinned_fallbacks, "pinned allocations that failed and used pageable memory"},
    StatField{"stash_reuses", &Stats::stash_reuses, "unpacks served from the forward stash (no copy back)"},
    StatField{"prefetches", &Stats::prefetches,
              "host -> device copies started ahead of (or on) demand by sync::Streamed"},
    StatField{"prefetch_peak", &Stats::prefetch_peak,
              "most prefetched buffers outstanding at once (tensors; their bytes stay within the prefetch window, +1 "
              "on demand)"},
    StatField{"host_waits", &Stats::host_waits,
              "times the host waited for a copy on the device to end (sync::Streamed: a released storage whose "
              "copies still ran only when keeping its host buffers failed, and at the manager's destruction; "
              "never in backward)"},
    StatField{"target_kept_bytes", &Stats::target_kept_bytes,
              "storage bytes of the saved tensors the device-memory plan kept on the device"},
    StatField{"target_guard_offloads", &Stats::target_guard_offloads,
              "saved tensors the plan kept that the target's guard offloaded"},
    StatField{"target_planned_offload_bytes", &Stats::target_planned_offload_bytes,
              "storage bytes the last step's plan offloads (eligible ones it does not keep)"},
    StatField{"target_min_offload_bytes", &Stats::target_min_offload_bytes,
              "fewest eligible bytes whose offloading meets the target, from the step the last plan was made from"},
    StatField{"target_steps_planned", &Stats::target_steps_planned,
              "steps planned from the step before (the first step offloads every eligible tensor)"},
    StatField{"blocks_kept", &Stats::blocks_kept,
              "planned blocks (CheckpointOptions::planned) the automatic plan ran with their saved tensors kept on "
              "the device, in the step running (or the last one)"},
    StatField{"blocks_offloaded", &Stats::blocks_offloaded,
              "planned blocks run with their saved tensors offloaded through the manager, in that step"},
    StatField{"blocks_recomputed", &Stats::blocks_recomputed,
              "planned blocks checkpointed (recomputed in backward; inputs through the manager, or kept on the "
              "device), in that "
              "step"},
    StatField{"blocks_guarded", &Stats::blocks_guarded,
              "planned blocks the plan kept (or whose inputs it kept) that its forward guard offloaded instead "
              "(counted in blocks_offloaded or blocks_recomputed), as what the device held plus what the plan kept "
              "from there would have crossed the target, in that step"},
    StatField{"plan_predicted_step_us", &Stats::plan_predicted_step_us,
              "the step time the automatic plan predicts for its choices, microseconds (0 before a plan)"},
    StatField{"plan_measured_step_us", &Stats::plan_measured_step_us,
              "the last step's wall time, from its scope opening to the next one's, microseconds (planned blocks "
              "only)"},
};
static_assert(sizeof(Stats) == stat_fields.size() * sizeof(std::int64_t),
              "offload::stat_fields must list every field of offload::Stats");

/// Writes the counters as one line of `name=value` pairs, in the order of
/// stat_fields.
std::ostream& operator<<(std::ostream& os, const Stats& stats);

}  // namespace offload
