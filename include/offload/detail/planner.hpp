// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// detail::Planner: the device-memory target (Options::device_target_bytes).
/// Records what one step saved and the allocated device memory around it,
/// and plans which saved tensors the next step keeps on the device. Plain
/// C++ (no LibTorch); the manager calls it under its lock.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <offload/stats.hpp>

namespace offload::detail {

/// Which step and which of its saved tensors a pack was (handed back at
/// unpack); index -1 when the planner is off or the tensor is not planned.
struct PlanTicket {
  std::uint32_t step = 0;
  std::int32_t index = -1;
};

/// Plans a step from the one before (docs/guide.md, "A device-memory
/// target"). The model of a step: saved tensor i (pack order) has storage
/// bytes b_i and is eligible or not; at each recorded point the allocated
/// memory was measured with the recorded decisions. Keeping a different
/// set of tensors changes the memory at a point by the bytes of the kept
/// tensors it counts: every one for points in forward and at scope exit,
/// those saved before the one being unpacked for a point in backward
/// (later ones were used and released). A reserve stands for what an
/// operation allocates between points (the gradient of an activation):
/// measured as the step's peak above its
/// highest point where the device reports its peak. The plan keeps tensors from the latest
/// back while every point stays under target - reserve, and offloads the
/// rest (the earliest: backward needs them last).
///
/// Allocated memory -1 (a device policy without memory statistics): the
/// target counts only the saved bytes the manager keeps on the device.
///
/// Thread-safety: none; the caller serialises every call.
class Planner {
 public:
  explicit Planner(std::int64_t target) : target_(target) {}

  /// Whether a target is set (else every call is a no-op and packs offload).
  bool active() const noexcept { return target_ > 0; }

  /// A step begins (a Scope opened): the step recorded so far becomes the
  /// one the new plan is made from. `peak`: the most bytes the device has
  /// had allocated at once so far, or -1; `allocated`: the device's
  /// allocated bytes now, or -1. What is allocated now beyond what the
  /// recorded step began with (optimizer state created after the first
  /// step) is added to every recorded point. Returns the warning to give
  /// when the target cannot be met even offloading everything (once per
  /// planner), else an empty string.
  std::string begin_step(std::int64_t peak, std::int64_t allocated = -1) {
    std::string warning;
    if (!current_.saved.empty()) {
      const bool known = allocated >= 0 && current_.start_allocated >= 0;
      warning = plan_from(current_, known ? std::max<std::int64_t>(0, allocated - current_.start_allocated) : 0);
    }
    current_ = Record{};
    current_.start_peak = peak;
    current_.start_allocated = allocated;
    kept_now_ = 0;
    growth_ = 1.0;
    ++step_;
    return warning;
  }

  /// A pack of saved tensor with `bytes` of storage; `eligible`: it would
  /// be offloaded without a target; `allocated`: the device's allocated
  /// bytes now (the tensor included), or -1. Returns the ticket and sets
  /// `offload` (false: keep it on the device).
  PlanTicket at_pack(std::int64_t bytes, bool eligible, std::int64_t allocated, bool& offload) {
    const auto index = static_cast<std::int32_t>(current_.saved.size());
    offload = eligible;
    bool kept = false;
    if (eligible && static_cast<std::size_t>(index) < plan_.size() && plan_bytes_[index] > 0) {
      // A step whose tensors grew (a longer sequence): what it allocates
      // between points and keeps later grows alike.
      growth_ = std::max(growth_, static_cast<double>(bytes) / static_cast<double>(plan_bytes_[index]));
    }
    if (eligible && static_cast<std::size_t>(index) < plan_.size() && plan_[index]) {
      // The guard: what is allocated now plus what the plan still keeps.
      const std::int64_t now = allocated >= 0 ? allocated : kept_now_ + bytes;
      if (now + scaled(keep_after_[index]) > target_ - scaled(reserve_)) {
        ++guard_offloads_;
      } else {
        kept = true;
        offload = false;
      }
    }
    current_.saved.push_back({bytes, eligible, kept});
    if (kept) {
      kept_now_ += bytes;
      kept_bytes_ += bytes;
    }
    if (allocated >= 0) {
      current_.points.push_back({-1, allocated, kept_now_});
      current_.measured = true;
    }
    return {step_, index};
  }

  /// The forward pass of the step ended (its Scope closed).
  void end_forward(std::int64_t allocated) {
    current_.points.push_back({-1, allocated >= 0 ? allocated : kept_now_, kept_now_});
  }

  /// Saved tensor `ticket` was unpacked; `allocated`: the device's
  /// allocated bytes with it on the device, less buffers brought back
  /// ahead of need, or -1.
  void at_unpack(const PlanTicket& ticket, std::int64_t allocated) {
    if (ticket.index < 0 || ticket.step != step_ || allocated < 0) return;
    if (static_cast<std::size_t>(ticket.index) >= current_.saved.size()) return;
    std::int64_t kept_before = 0;  // kept tensors saved before this one
    for (std::int32_t i = 0; i < ticket.index; ++i) {
      if (current_.saved[i].kept) kept_before += current_.saved[i].bytes;
    }
    current_.points.push_back({ticket.index, allocated, kept_before});
  }

  /// A backward pass through the step's saved tensors ended; `peak` as for
  /// begin_step(). A peak that rose during the step is the step's own.
  void end_backward(std::int64_t peak) noexcept { current_.end_peak = std::max(current_.end_peak, peak); }

  /// Bytes backward may bring back ahead of need: the headroom under the
  /// target less twice the reserve, given `allocated` bytes now (0 when
  /// unknown, or before the first plan).
  std::int64_t headroom(std::int64_t allocated) const noexcept {
    if (!active() || allocated < 0 || steps_planned_ == 0) return 0;
    // Twice the reserve: the buffers a prefetch fills are used and freed in
    // stream order, so the operation after it may still see the last ones.
    return std::max<std::int64_t>(0, target_ - 2 * scaled(reserve_) - allocated);
  }

  /// Adds the planner's counters to a Stats snapshot.
  void add_stats(Stats& stats) const noexcept {
    stats.target_kept_bytes += kept_bytes_;
    stats.target_guard_offloads += guard_offloads_;
    stats.target_planned_offload_bytes += planned_offload_;
    stats.target_min_offload_bytes += min_offload_;
    stats.target_steps_planned += steps_planned_;
  }
  /// Zeroes the counters (the record and the plan are kept).
  void reset_stats() noexcept { kept_bytes_ = guard_offloads_ = steps_planned_ = 0; }

 private:
  struct Saved {
    std::int64_t bytes;
    bool eligible;
    bool kept;
  };
  // A measurement: `prefix` -1 counts every kept tensor (forward, scope
  // exit), else those saved before index `prefix` (backward); `kept` is
  // what the recorded decisions kept among them then.
  struct Point {
    std::int32_t prefix;
    std::int64_t allocated;
    std::int64_t kept;
  };
  struct Record {
    std::vector<Saved> saved;
    std::vector<Point> points;
    bool measured = false;              // the device reported allocated memory
    std::int64_t start_peak = -1;       // the device's peak when the step began
    std::int64_t start_allocated = -1;  // ... its allocated bytes then
    std::int64_t end_peak = -1;         // ... when its backward ended
  };

  std::int64_t scaled(std::int64_t bytes) const noexcept {
    return static_cast<std::int64_t>(static_cast<double>(bytes) * growth_);
  }

  // `grown`: bytes allocated at this step's start beyond the recorded
  // step's start, added to every recorded point.
  std::string plan_from(const Record& r, std::int64_t grown) {
    const auto n = r.saved.size();
    std::int64_t eligible = 0;
    std::int64_t largest = 0;
    for (const auto& s : r.saved) {
      if (s.eligible) {
        largest = std::max(largest, s.bytes);
        eligible += s.bytes;
      }
    }
    // The reserve: what the step allocated above its highest point, when
    // the device's peak shows it (the peak rose during the step, so it is
    // the step's), and at least the largest eligible storage (the gradient
    // of the largest activation); else what was learned before; at first
    // the largest eligible storage.
    std::int64_t highest = 0;
    for (const auto& p : r.points) highest = std::max(highest, p.allocated);
    if (!r.measured) {
      reserve_ = 0;  // only kept saved bytes count
    } else if (r.start_peak >= 0 && r.end_peak > r.start_peak) {
      reserve_ = std::max<std::int64_t>({learned_ ? reserve_ : 0, r.end_peak - highest, largest});
      learned_ = true;
    } else if (!learned_) {
      reserve_ = largest;
    }
    // slack[q]: what the kept tensors counted by points with prefix q may
    // total (q = n: every tensor).
    constexpr auto none = std::numeric_limits<std::int64_t>::max();
    std::vector<std::int64_t> slack(n + 1, none);
    std::vector<std::int64_t> eligible_before(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      eligible_before[i + 1] = eligible_before[i] + (r.saved[i].eligible ? r.saved[i].bytes : 0);
    }
    const std::int64_t limit = target_ - reserve_;
    std::int64_t needs = 0;  // the most a point needs with every eligible tensor offloaded
    std::int64_t least = 0;  // the fewest bytes to offload: the largest excess keeping everything
    for (const auto& p : r.points) {
      const std::size_t q = p.prefix < 0 ? n : static_cast<std::size_t>(p.prefix);
      const std::int64_t base = p.allocated + grown - p.kept;  // with nothing kept
      needs = std::max(needs, base);
      least = std::max(least, base + eligible_before[q] - limit);
      slack[q] = std::min(slack[q], limit - base);
    }
    plan_.assign(n, false);
    plan_bytes_.resize(n);
    for (std::size_t i = 0; i < n; ++i) plan_bytes_[i] = r.saved[i].eligible ? r.saved[i].bytes : 0;
    keep_after_.assign(n + 1, 0);
    ++steps_planned_;
    if (needs > limit) {
      planned_offload_ = eligible;
      min_offload_ = eligible;
      if (warned_) return {};
      warned_ = true;
      return "offload::Options: device_target_bytes " + std::to_string(target_) +
             " cannot be met: the last step needed " + std::to_string(needs + reserve_) +
             " bytes of device memory with every eligible saved tensor offloaded (" + std::to_string(reserve_) +
             " of them reserved for what an operation allocates); offloading every eligible tensor (warned once per "
             "manager)";
    }
    // From the latest back: keep a tensor while every point counting it
    // has room (points with prefix q count the tensors before q).
    std::int64_t room = none;
    std::int64_t kept = 0;
    for (std::size_t i = n; i-- > 0;) {
      room = std::min(room, slack[i + 1]);
      if (r.saved[i].eligible && r.saved[i].bytes <= room) {
        plan_[i] = true;
        room -= r.saved[i].bytes;
        kept += r.saved[i].bytes;
      }
    }
    for (std::size_t i = n; i-- > 0;)
      keep_after_[i] = keep_after_[i + 1] + (i + 1 < n && plan_[i + 1] ? r.saved[i + 1].bytes : 0);
    planned_offload_ = eligible - kept;
    min_offload_ = std::clamp<std::int64_t>(least, 0, eligible);
    return {};
  }

  std::int64_t target_;
  std::uint32_t step_ = 0;
  Record current_;
  std::vector<bool> plan_;                // per saved tensor of this step: keep it
  std::vector<std::int64_t> plan_bytes_;  // per saved tensor of the recorded step: its bytes (0: not eligible)
  std::vector<std::int64_t> keep_after_;  // bytes the plan keeps after index i
  double growth_ = 1.0;                   // the most a tensor of this step grew against the recorded one
  std::int64_t reserve_ = 0;
  std::int64_t kept_now_ = 0;  // bytes kept in this step so far
  bool warned_ = false;
  bool learned_ = false;  // reserve_ was measured
  std::int64_t kept_bytes_ = 0;
  std::int64_t guard_offloads_ = 0;
  std::int64_t planned_offload_ = 0;
  std::int64_t min_offload_ = 0;
  std::int64_t steps_planned_ = 0;
};

}  // namespace offload::detail
