// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// detail::Planner: the device-memory target (Options::device_target_bytes).
/// Records what one step saved and the allocated device memory around it,
/// and plans which saved tensors the next step keeps on the device. Plain
/// C++ (no LibTorch); the manager calls it under its lock.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <offload/stats.hpp>

namespace offload::detail {

/// Which step and which of its saved tensors a pack was (handed back at
/// unpack); index -1 when the planner is off or the tensor is not planned.
struct PlanTicket {
  std::uint32_t step = 0;
  std::int32_t index = -1;
};

/// What the planner decided for one pack: its ticket (handed back at
/// unpack) and whether the tensor is offloaded (false: kept on the device).
struct PackDecision {
  PlanTicket ticket;
  bool offload = true;
};

/// Plans a step from the one before (docs/guide.md, "A device-memory
/// target"). The model of a step: saved tensor i (pack order) has storage
/// bytes b_i and is eligible or not; at each recorded point the allocated
/// memory was measured with the recorded decisions. Keeping a different
/// set of tensors changes the memory at a point by the bytes of the kept
/// tensors it counts: every one for points in forward and at scope exit,
/// those saved before the one being unpacked for a point in backward
/// (later ones were used and released). A storage the model holds anyway
/// (seen allocated while offloaded: still_allocated(); what was learned
/// for a tensor carries to the steps that keep it) stays allocated at the
/// forward points up to then whatever the plan does. Points in backward
/// leave out what was prefetched, and the plan sets the options' prefetch
/// window aside there instead. A reserve stands for what an
/// operation allocates between points (the gradient of an activation):
/// measured as the step's peak above its highest point, and as what an
/// interval that raised the peak allocated above its ends (observe()),
/// where the device reports its peak. The prefetch headroom at an unpack
/// also leaves what followed that unpack in the recorded step
/// (headroom()). The plan keeps tensors from the latest back while every
/// point stays under target - reserve, and offloads the rest (the
/// earliest: backward needs them last).
///
/// Allocated memory -1 (a device policy without memory statistics): the
/// target counts only the saved bytes the manager keeps on the device.
///
/// Thread-safety: none; the caller serialises every call.
class Planner {
 public:
  /// `target`: Options::device_target_bytes; `prefetch_depth` and
  /// `prefetch_bytes`: the options' prefetch window of a sync policy that
  /// brings tensors back ahead of need in backward (0, 0 for one that does
  /// not).
  explicit Planner(std::int64_t target, std::int64_t prefetch_depth = 0, std::int64_t prefetch_bytes = 0)
      : target_(target), prefetch_depth_(prefetch_depth), prefetch_bytes_(prefetch_bytes) {}

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
  std::string begin_step(std::int64_t peak, std::int64_t allocated) {
    std::string warning;
    if (!current_.saved.empty()) {
      const bool known = allocated >= 0 && current_.start_allocated >= 0;
      warning = plan_from(current_, known ? std::max<std::int64_t>(0, allocated - current_.start_allocated) : 0);
    }
    current_ = Record{};
    current_.start_peak = peak;
    current_.start_allocated = allocated;
    seen_peak_ = peak;
    seen_allocated_ = allocated;
    kept_now_ = 0;
    growth_ = 1.0;
    ++step_;
    return warning;
  }

  /// The device's allocated bytes and its peak now (-1: not reported),
  /// called at every point the manager records and after each prefetch.
  /// Where the peak rose since the call before, what was allocated then
  /// above both ends (the larger of the two allocated figures) is what an
  /// operation allocated between them: the step's reserve is at least the
  /// most any such interval shows (an interval whose peak stays under an
  /// earlier one shows nothing).
  void observe(std::int64_t allocated, std::int64_t peak) noexcept {
    if (!active() || allocated < 0 || peak < 0) return;
    if (seen_peak_ >= 0 && seen_allocated_ >= 0 && peak > seen_peak_) {
      current_.excess = std::max(current_.excess, peak - std::max(seen_allocated_, allocated));
    }
    seen_peak_ = std::max(seen_peak_, peak);
    seen_allocated_ = allocated;
  }

  /// A pack of saved tensor with `bytes` of storage; `eligible`: it would
  /// be offloaded without a target; `allocated`: the device's allocated
  /// bytes now (the tensor included), or -1.
  PackDecision at_pack(std::int64_t bytes, bool eligible, std::int64_t allocated) {
    const auto index = static_cast<std::int32_t>(current_.saved.size());
    bool offload = eligible;
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
    const auto point = static_cast<std::int32_t>(allocated >= 0 ? current_.points.size() : -1);
    current_.saved.push_back({bytes, eligible, kept, point, eligible && !kept ? point : -1});
    if (kept) {
      kept_now_ += bytes;
      kept_bytes_ += bytes;
    }
    if (allocated >= 0) {
      current_.points.push_back({-1, allocated, kept_now_, 0, 0});
      current_.measured = true;
    }
    return {{step_, index}, offload};
  }

  /// Offloaded saved tensor `ticket`'s device storage was still allocated
  /// at the point recorded last (the model holds it for later use, or the
  /// caller does): keeping it on the device would have cost nothing there.
  void still_allocated(const PlanTicket& ticket) noexcept {
    if (ticket.index < 0 || ticket.step != step_ || current_.points.empty()) return;
    if (static_cast<std::size_t>(ticket.index) >= current_.saved.size()) return;
    auto& saved = current_.saved[ticket.index];
    if (saved.allocated_until >= 0) saved.allocated_until = static_cast<std::int32_t>(current_.points.size() - 1);
  }

  /// Of the allocated bytes at the point recorded last, `bytes` were
  /// offloaded storages that only the sync policy still held, for their
  /// copies to the host (a forward stash whose copies lag behind compute:
  /// a loaded host, a slow link). The point counts them as freed, as they
  /// are once those copies end: otherwise a step whose copies lagged would
  /// count them twice in the plan (allocated there, and again as kept).
  /// Only the step's highest point, which the reserve is measured from,
  /// still counts them. The manager relieves a step whose copies lag
  /// (forward backpressure), so the plan need not.
  void in_flight(std::int64_t bytes) noexcept {
    if (!active() || bytes <= 0 || current_.points.empty()) return;
    auto& p = current_.points.back();
    const auto freed = std::min(bytes, p.allocated - p.kept);
    if (freed <= 0) return;
    p.allocated -= freed;
    p.in_flight += freed;
  }

  /// The forward pass of the step ended (its Scope closed).
  void end_forward(std::int64_t allocated) {
    current_.points.push_back({-1, allocated >= 0 ? allocated : kept_now_, kept_now_, 0, 0});
  }

  /// Saved tensor `ticket` was unpacked; `allocated`: the device's
  /// allocated bytes with it on the device, or -1; `ahead`: of them, the
  /// buffers brought back ahead of need and not used yet.
  void at_unpack(const PlanTicket& ticket, std::int64_t allocated, std::int64_t ahead) {
    if (ticket.index < 0 || ticket.step != step_ || allocated < 0) return;
    if (static_cast<std::size_t>(ticket.index) >= current_.saved.size()) return;
    std::int64_t kept_before = 0;  // kept tensors saved before this one
    for (std::int32_t i = 0; i < ticket.index; ++i) {
      if (current_.saved[i].kept) kept_before += current_.saved[i].bytes;
    }
    current_.points.push_back({ticket.index, allocated - ahead, kept_before, ahead, 0});
  }

  /// A backward pass through the step's saved tensors ended; `peak` as for
  /// begin_step(). A peak that rose during the step is the step's own.
  void end_backward(std::int64_t peak) noexcept { current_.end_peak = std::max(current_.end_peak, peak); }

  /// Bytes backward may bring back ahead of need at the unpack of saved
  /// tensor `ticket`, given `allocated` bytes now: the target less a margin
  /// less `allocated`. The margin is what the recorded step showed could
  /// follow that unpack: its peak less what was allocated there (an upper
  /// bound on what the operations after it allocated), and at least twice
  /// the reserve (the buffers a prefetch fills are used and freed in stream
  /// order, so the operation after it may still see the last ones). 0 when
  /// the recorded step has no such point or no peak, `allocated` is
  /// unknown (-1), or before the first plan.
  std::int64_t headroom(const PlanTicket& ticket, std::int64_t allocated) const noexcept {
    if (!active() || allocated < 0 || !planned_ || ticket.step != step_ || ticket.index < 0) return 0;
    const auto index = static_cast<std::size_t>(ticket.index);
    if (index >= margin_.size() || margin_[index] < 0) return 0;
    const auto margin = std::max(2 * scaled(reserve_), scaled(margin_[index]));
    return std::max<std::int64_t>(0, target_ - margin - allocated);
  }

  /// Whether `allocated` device bytes (-1: unknown) leave less than the
  /// reserve under the target: what an operation allocates next could
  /// cross it (also in a step that offloads everything, the first or one
  /// after forget()).
  bool over(std::int64_t allocated) const noexcept {
    return active() && allocated >= 0 && allocated + scaled(reserve_) > target_;
  }

  /// The most device bytes the step the last plan was made from needed
  /// with every eligible saved tensor offloaded (its highest point less
  /// what was kept, plus the reserve); -1 before a plan or without memory
  /// statistics. The automatic plan's base (BlockPlanner::begin_step).
  std::int64_t least_peak() const noexcept { return least_peak_; }

  /// The device's peak during the step the last plan was made from (plus
  /// what was allocated since it began), where that step raised the
  /// device's peak (so it is the step's own); else -1.
  std::int64_t recorded_peak() const noexcept { return recorded_peak_; }

  /// Drops the plan and the recorded step: this step offloads every
  /// eligible tensor, as the first does, and is recorded afresh (the
  /// automatic plan changed which blocks save what, so the order of saved
  /// tensors the plan was made for no longer holds). What was learned of
  /// the reserve stays until this step measures its own (where it raises
  /// the device's peak): it was learned from what the old configuration
  /// allocated between observations (a recomputed block's whole forward),
  /// which the new one may not do.
  void forget() noexcept {
    relearn_ = true;
    plan_.clear();
    plan_bytes_.clear();
    keep_after_.clear();
    margin_.clear();
    learned_span_.clear();
    planned_ = false;
  }

  /// Adds the planner's counters to a Stats snapshot.
  void add_stats(Stats& stats) const noexcept {
    stats.target_kept_bytes += kept_bytes_;
    stats.target_guard_offloads += guard_offloads_;
    stats.target_planned_offload_bytes += planned_offload_;
    stats.target_min_offload_bytes += min_offload_;
    stats.target_steps_planned += steps_planned_;
  }
  /// Zeroes the counters; what is recorded and planned stays as it is.
  void reset_stats() noexcept { kept_bytes_ = guard_offloads_ = steps_planned_ = 0; }

 private:
  struct Saved {
    std::int64_t bytes;
    bool eligible;
    bool kept;
    std::int32_t point;            // the point recorded at its pack, or -1
    std::int32_t allocated_until;  // offloaded: the last point at which its storage was still allocated; else -1
  };
  // A measurement: `prefix` -1 counts every kept tensor (forward, scope
  // exit), else those saved before index `prefix` (backward); `kept` is
  // what the recorded decisions kept among them then.
  struct Point {
    std::int32_t prefix;
    std::int64_t allocated;  // less `ahead`
    std::int64_t kept;
    std::int64_t ahead;      // buffers brought back ahead of need (backward)
    std::int64_t in_flight;  // offloaded storages held only for their copies (in_flight()), not in `allocated`
    // What the device had allocated at the point.
    std::int64_t measured() const noexcept { return allocated + ahead + in_flight; }
  };
  struct Record {
    std::vector<Saved> saved;
    std::vector<Point> points;
    bool measured = false;              // the device reported allocated memory
    std::int64_t start_peak = -1;       // the device's peak when the step began
    std::int64_t start_allocated = -1;  // ... its allocated bytes then
    std::int64_t end_peak = -1;         // ... when its backward ended
    std::int64_t excess = 0;            // the most an interval between observations allocated above its ends
    // The device's peak rose during the step: end_peak is the step's own.
    bool raised_peak() const noexcept { return measured && start_peak >= 0 && end_peak > start_peak; }
  };

  std::int64_t scaled(std::int64_t bytes) const noexcept {
    return static_cast<std::int64_t>(static_cast<double>(bytes) * growth_);
  }

  static constexpr auto kNone = std::numeric_limits<std::int64_t>::max();

  // What the recorded points allow with nothing kept: the most any point
  // needs with every eligible tensor offloaded, what the kept tensors may
  // total at the forward points, and each backward point's memory.
  struct Bases {
    std::int64_t needs = 0;
    std::int64_t room_forward = kNone;
    std::vector<std::int64_t> backward;
  };
  // One plan: the bytes it offloads, its largest offloaded storage, and the
  // fewest eligible bytes whose offloading meets the target.
  struct Outcome {
    std::int64_t offloaded = 0;
    std::int64_t largest_offloaded = 0;
    std::int64_t least = 0;
  };

  // The window the options give: prefetch_bytes, or prefetch_depth times
  // the largest offloaded storage.
  std::int64_t window_for(std::int64_t largest_offloaded) const noexcept {
    return prefetch_bytes_ > 0 ? prefetch_bytes_ : prefetch_depth_ * largest_offloaded;
  }

  // `grown`: bytes allocated at this step's start beyond the recorded
  // step's start, added to every recorded point. Returns the warning to
  // give, if any.
  std::string plan_from(const Record& r, std::int64_t grown) {
    std::int64_t eligible = 0;
    std::int64_t largest = 0;
    for (const auto& s : r.saved) {
      if (s.eligible) {
        largest = std::max(largest, s.bytes);
        eligible += s.bytes;
      }
    }
    learn_reserve(r, largest);
    learn_margins(r);
    const auto n = r.saved.size();
    const Bases bases = bases_of(r, grown, largest);
    plan_bytes_.resize(n);
    for (std::size_t i = 0; i < n; ++i) plan_bytes_[i] = r.saved[i].eligible ? r.saved[i].bytes : 0;
    keep_after_.assign(n + 1, 0);
    ++steps_planned_;
    planned_ = true;
    least_peak_ = r.measured ? bases.needs + reserve_ : -1;
    recorded_peak_ = r.raised_peak() ? r.end_peak + grown : -1;
    if (bases.needs > target_ - reserve_) return offload_everything(eligible, bases.needs, recorded_peak_);
    // Planned first with the window of the largest eligible storage; again
    // with that of the largest the first plan offloads, kept if it
    // offloads nothing larger.
    auto outcome = keep_latest(r, bases, window_for(largest));
    if (window_for(outcome.largest_offloaded) < window_for(largest)) {
      const auto first_plan = plan_;
      const auto again = keep_latest(r, bases, window_for(outcome.largest_offloaded));
      if (again.largest_offloaded <= outcome.largest_offloaded) {
        outcome = {again.offloaded, outcome.largest_offloaded, again.least};
      } else {
        plan_ = first_plan;
      }
    }
    for (std::size_t i = n; i-- > 0;)
      keep_after_[i] = keep_after_[i + 1] + (i + 1 < n && plan_[i + 1] ? r.saved[i + 1].bytes : 0);
    planned_offload_ = outcome.offloaded;
    min_offload_ = std::clamp<std::int64_t>(outcome.least, 0, eligible);
    return {};
  }

  // The reserve: what the step allocated above its highest point, when
  // the device's peak shows it (the peak rose during the step, so it is the
  // step's), the most an interval between observations allocated above
  // its ends, and at least the largest eligible storage (the gradient of
  // the largest activation), replacing what was learned before the last
  // forget(); else what was learned before; at first the
  // largest eligible storage. Without measurements only kept bytes count.
  void learn_reserve(const Record& r, std::int64_t largest) {
    std::int64_t highest = 0;
    for (const auto& p : r.points) highest = std::max(highest, p.measured());
    if (!r.measured) {
      reserve_ = 0;
    } else if (r.raised_peak()) {
      reserve_ =
          std::max<std::int64_t>({learned_ && !relearn_ ? reserve_ : 0, r.end_peak - highest, r.excess, largest});
      learned_ = true;
      relearn_ = false;
    } else if (!learned_) {
      reserve_ = largest;
    }
  }

  // Per saved tensor unpacked in the recorded step: its peak less what
  // was allocated at that unpack (prefetched buffers included), the most
  // the operations after it can have allocated above it; -1 where unknown.
  // A step whose peak did not rise (an earlier step's is higher) shows no
  // peak of its own: the margins learned before stay where the steps
  // saved alike, else none is known.
  void learn_margins(const Record& r) {
    if (!r.raised_peak()) {
      if (margin_.size() != r.saved.size()) margin_.assign(r.saved.size(), -1);
      return;
    }
    margin_.assign(r.saved.size(), -1);
    for (const auto& p : r.points) {
      if (p.prefix < 0 || static_cast<std::size_t>(p.prefix) >= margin_.size()) continue;
      auto& margin = margin_[static_cast<std::size_t>(p.prefix)];
      margin = std::max(margin, std::max<std::int64_t>(0, r.end_peak - p.measured()));
    }
  }

  // The bytes the model holds anyway at each forward point (differences:
  // entry f changes the sum from the f-th forward point on). Every kept
  // tensor counts at every forward point, but a storage the model holds
  // anyway (seen allocated while offloaded, from its pack to
  // allocated_until; for one kept in this record, the last record that
  // offloaded it) is allocated at those points whatever the plan does: it
  // belongs to the memory with nothing kept there. Updates learned_span_.
  std::vector<std::int64_t> held_anyway(const Record& r, const std::vector<std::int32_t>& forward) {
    const auto ordinal = [&forward](std::int32_t k) {
      return static_cast<std::size_t>(std::upper_bound(forward.begin(), forward.end(), k) - forward.begin());
    };
    const auto n = r.saved.size();
    learned_span_.resize(n, {0, -1});
    std::vector<std::int64_t> held_from(forward.size() + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& s = r.saved[i];
      if (!s.eligible || s.point < 0) continue;
      auto& learned = learned_span_[i];
      if (!s.kept) learned = {s.bytes, s.allocated_until - s.point};
      if (!s.kept || learned.first != s.bytes || learned.second < 0) continue;
      held_from[ordinal(s.point - 1)] += s.bytes;
      held_from[ordinal(s.point + learned.second)] -= s.bytes;
    }
    return held_from;
  }

  // Each recorded point's memory with nothing kept (`grown` added), and
  // what that leaves under the target less the reserve.
  Bases bases_of(const Record& r, std::int64_t grown, std::int64_t largest) {
    std::vector<std::int32_t> forward;  // indices of the forward points in r.points
    for (std::size_t k = 0; k < r.points.size(); ++k) {
      if (r.points[k].prefix < 0) forward.push_back(static_cast<std::int32_t>(k));
    }
    const auto held_from = held_anyway(r, forward);
    const std::int64_t limit = target_ - reserve_;
    Bases out;
    out.backward.resize(r.points.size() - forward.size());
    std::int64_t held_here = 0;
    for (std::size_t f = 0, b = 0, k = 0; k < r.points.size(); ++k) {
      const auto& p = r.points[k];
      std::int64_t base = p.allocated + grown - p.kept;
      if (p.prefix < 0) {
        held_here += held_from[f++];
        base += held_here;
        out.room_forward = std::min(out.room_forward, limit - base);
      } else {
        out.backward[b++] = base;
        base += window_for(largest);
      }
      out.needs = std::max(out.needs, base);
    }
    return out;
  }

  // The target cannot be met by the model: every eligible tensor is
  // offloaded; the warning the first time, with the figure compared and the
  // step's measured peak (`peak`: with what was allocated since it began,
  // as recorded_peak(); -1: not measured). A step whose own measured peak
  // stayed under the target met it whatever the model says: no warning
  // then (the model's reserve errs high).
  std::string offload_everything(std::int64_t eligible, std::int64_t needs, std::int64_t peak) {
    plan_.assign(plan_bytes_.size(), false);
    planned_offload_ = eligible;
    min_offload_ = eligible;
    if (warned_ || (peak >= 0 && peak <= target_)) return {};
    warned_ = true;
    return "offload::Options: device_target_bytes " + std::to_string(target_) +
           " cannot be met: with every eligible saved tensor offloaded the last step needs " +
           std::to_string(needs + reserve_) + " bytes of device memory by the plan's model (" +
           std::to_string(reserve_) + " of them reserved for what one operation allocates), and its measured peak " +
           (peak >= 0 ? "was " + std::to_string(peak) + " bytes"
                      : std::string("is unknown (the step did not raise the device's peak: reset the peak statistics "
                                    "before each step)")) +
           "; offloading every eligible tensor (warned once per manager)";
  }

  // Sets plan_: from the latest back, keeps a tensor while every point
  // counting it has room, given a prefetch window of `window` bytes in
  // backward.
  Outcome keep_latest(const Record& r, const Bases& bases, std::int64_t window) {
    const auto n = r.saved.size();
    const std::int64_t limit = target_ - reserve_;
    std::vector<std::int64_t> eligible_before(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i)
      eligible_before[i + 1] = eligible_before[i] + (r.saved[i].eligible ? r.saved[i].bytes : 0);
    // slack[q]: what the kept tensors counted at points with prefix q may
    // total (q = n: every tensor, the forward points).
    std::vector<std::int64_t> slack(n + 1, kNone);
    slack[n] = bases.room_forward;
    Outcome out;
    out.least = eligible_before[n] - bases.room_forward;
    for (std::size_t b = 0, k = 0; k < r.points.size(); ++k) {
      const auto& p = r.points[k];
      if (p.prefix < 0) continue;
      const std::int64_t base = bases.backward[b++] + window;
      out.least = std::max(out.least, base + eligible_before[p.prefix] - limit);
      slack[p.prefix] = std::min(slack[p.prefix], limit - base);
    }
    plan_.assign(n, false);
    std::int64_t room = kNone;
    for (std::size_t i = n; i-- > 0;) {
      room = std::min(room, slack[i + 1]);
      const auto& s = r.saved[i];
      if (!s.eligible) continue;
      if (s.bytes > room) {
        out.offloaded += s.bytes;
        out.largest_offloaded = std::max(out.largest_offloaded, s.bytes);
        continue;
      }
      plan_[i] = true;
      room -= s.bytes;
    }
    return out;
  }

  std::int64_t target_;
  std::int64_t prefetch_depth_;
  std::int64_t prefetch_bytes_;
  std::uint32_t step_ = 0;
  Record current_;
  std::vector<bool> plan_;                // per saved tensor of this step: keep it
  std::vector<std::int64_t> plan_bytes_;  // per saved tensor of the recorded step: its bytes (0: not eligible)
  std::vector<std::int64_t> keep_after_;  // bytes the plan keeps after index i
  std::vector<std::int64_t> margin_;      // per saved tensor: learn_margins()
  // per saved tensor: its bytes and how many points after its pack its
  // storage stayed allocated when last offloaded (-1: not known)
  std::vector<std::pair<std::int64_t, std::int32_t>> learned_span_;
  double growth_ = 1.0;  // the most a tensor of this step grew against the recorded one
  std::int64_t reserve_ = 0;
  std::int64_t kept_now_ = 0;  // bytes kept in this step so far
  bool warned_ = false;
  bool learned_ = false;              // reserve_ was measured
  bool relearn_ = false;              // forget() since: the next measured reserve replaces it
  bool planned_ = false;              // a plan was made (the prefetch headroom applies)
  std::int64_t seen_peak_ = -1;       // observe(): the device's peak at the last observation
  std::int64_t seen_allocated_ = -1;  // ... and its allocated bytes then
  std::int64_t kept_bytes_ = 0;
  std::int64_t guard_offloads_ = 0;
  std::int64_t planned_offload_ = 0;
  std::int64_t min_offload_ = 0;
  std::int64_t steps_planned_ = 0;
  std::int64_t least_peak_ = -1;
  std::int64_t recorded_peak_ = -1;
};

}  // namespace offload::detail
