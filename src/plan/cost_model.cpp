// SPDX-License-Identifier: MIT
// The automatic plan's cost model: predict() for one given choice per
// block, and offload_all(). The derivation of each term is beside it.

#include "cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace offload::plan {
namespace {

// A block's forward time: the lesser of its first forward and its
// measured recomputation where there is one (two runs of the same
// computation; either may be slowed alone: a cold allocator, the host
// shared with copies).
double forward_ns_of(const BlockCost& b) {
  const bool recomputation = b.recompute_ns > 0 && (b.forward_ns <= 0 || b.recompute_ns < b.forward_ns);
  return static_cast<double>(recomputation ? b.recompute_ns : b.forward_ns);
}

// The link time of one block's copies in one direction.
double copy_ns(const LinkCost& link, std::int64_t bytes, std::int64_t copies) {
  return link.bytes_per_ns > 0 && bytes > 0
             ? static_cast<double>(copies * link.latency_ns) + static_cast<double>(bytes) / link.bytes_per_ns
             : 0.0;
}

// The bytes block b offloads under its choice: its saved tensors
// (offload), its input (recompute), else none.
std::int64_t moved_bytes(const BlockCost& b, BlockChoice choice) {
  if (choice == BlockChoice::offload) return b.saved_bytes;
  if (choice == BlockChoice::recompute) return b.input_bytes;
  return 0;  // kept, or recomputed with its input kept
}

// The largest storage among them (a block whose storages were not
// measured counts as one).
std::int64_t largest_moved_storage(const BlockCost& b, BlockChoice choice) {
  if (choice == BlockChoice::offload) return b.largest_storage > 0 ? b.largest_storage : b.saved_bytes;
  return moved_bytes(b, choice);
}

// How many copies block b's choice makes each way (its storages when
// offloaded, else its input's one).
std::int64_t moved_storages(const BlockCost& b, BlockChoice choice) {
  return choice == BlockChoice::offload ? std::max<std::int64_t>(1, b.saved_storages) : 1;
}

// What block i moves each way under its choice.
double moved_ns(const LinkCost& link, const BlockCost& b, BlockChoice choice) {
  return copy_ns(link, moved_bytes(b, choice), moved_storages(b, choice));
}

bool is_recomputed(BlockChoice choice) {
  return choice == BlockChoice::recompute || choice == BlockChoice::recompute_input_kept;
}

// The link time of what is saved outside blocks at gap k (before block
// k), when it is offloaded.
double outside_ns(const LinkCost& link, const OutsideCost* outside, std::size_t k) {
  if (outside == nullptr || k >= outside->bytes.size()) return 0.0;
  return copy_ns(link, outside->bytes[k], std::max<std::int64_t>(1, outside->storages[k]));
}

// The prefetch window of overlapping copies whose largest offloaded
// storage is `largest` bytes (0 without overlapping copies).
std::int64_t prefetch_window(const LinkCost& link, std::int64_t largest) {
  if (!link.overlaps) return 0;
  return link.prefetch_bytes > 0 ? link.prefetch_bytes : link.prefetch_depth * largest;
}

// Forward's copies with overlapping copies: the time they add to forward
// (`stalled`: waits for the stash, and what is still copying when forward
// ends, which delays backward) and the largest storage they move.
struct ForwardCopies {
  double stalled = 0;
  std::int64_t largest = 0;
};

// Forward: copies run one after another, each as soon as the link is
// free after it is made: an offloaded block's storages are made through
// its forward, taken as made, on average, halfway through it (its copies
// counted from there); a recomputed block's input is saved as the block
// begins; what is saved outside blocks, where it was saved. (Counted from
// a block's end, the copies that run beside its own forward
// were taken as exposed: at R = 1 that took offloading a block for
// dearer than recomputing it, where it ran faster.) Where more storages are copying
// than the forward stash holds, sync::Streamed's compute waits for the
// oldest copy in flight (one queue across forward): a block ends no
// earlier than when the link, counted from the block's beginning (the
// earliest its copies can start; a second clock, `copied`), has copied all
// but the newest stash's worth of what was queued. That wait errs low: a
// block makes its storages through its forward, not all at its beginning,
// and Streamed waits at each one, not at the block's end. The wait only
// adds time; where the link runs still counts from where the copies are
// made, so a tighter stash is never predicted faster.
ForwardCopies forward_copies(const std::vector<BlockCost>& blocks, const LinkCost& link,
                             const std::vector<BlockChoice>& choices, const OutsideCost* outside) {
  struct Queued {
    double storages = 0;
    double each_ns = 0;  // a block's copies taken as alike
  };
  std::vector<Queued> queued;  // every copy made so far, in order
  const auto stash = static_cast<double>(link.forward_stash);
  ForwardCopies out;
  double now = 0, link_free = 0, copied = 0;
  // Queues `c` ns of copies in `storages` made from `at` on (the link
  // runs them from `from` on), and waits where the stash is full at `now`.
  const auto copy = [&](double c, std::int64_t storages, double at, double from) {
    copied = std::max(copied, at) + c;
    link_free = std::max(link_free, from) + c;
    const auto count = static_cast<double>(std::max<std::int64_t>(1, storages));
    queued.push_back({count, c / count});
    if (stash <= 0) return;
    double newest = 0, left = stash;  // the link time of the newest stash's worth
    for (auto it = queued.rbegin(); it != queued.rend() && left > 0; ++it) {
      const double take = std::min(left, it->storages);
      newest += take * it->each_ns;
      left -= take;
    }
    if (const double held = copied - newest; left <= 0 && held > now) {
      out.stalled += held - now;
      now = held;
    }
  };
  if (const auto o = outside_ns(link, outside, 0); o > 0) copy(o, outside->storages[0], now, now);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    const double begin = now;
    now += forward_ns_of(b);
    if (const auto c = moved_ns(link, b, choices[i]); c > 0) {
      const double from = choices[i] == BlockChoice::offload ? begin + forward_ns_of(b) / 2 : begin;
      copy(c, moved_storages(b, choices[i]), begin, from);
    }
    if (const auto o = outside_ns(link, outside, i + 1); o > 0) copy(o, outside->storages[i + 1], now, now);
    out.largest = std::max(out.largest, largest_moved_storage(b, choices[i]));
  }
  out.stalled += std::max(0.0, link_free - now);
  return out;
}

// The step's time beyond its compute that the copies cost, with
// overlapping copies: each direction is a pipeline, forward as
// forward_copies() counts it. Backward (each block's backward taken as twice its
// forward, plus the forward again when it is recomputed; blocks in
// reverse order, what was saved after a block needed before it) much as
// sync::Streamed runs it: nothing comes back before backward unpacks an
// offloaded storage, so the first one it needs comes back on demand; each
// unpack brings back what follows within the prefetch window, so the next
// block's (or outside piece's) copies start once what is left to consume
// of the one before fits in the window; a block starts when its first
// storage is back and ends no earlier than its last. The window is the
// options' (under a target the headroom can widen it at run time: this
// errs high). Without a window every copy is on demand, exposed whole. `outside`: null where it is kept.
double exposed_overlapping(const std::vector<BlockCost>& blocks, const LinkCost& link,
                           const std::vector<BlockChoice>& choices, const OutsideCost* outside) {
  const auto n = blocks.size();
  const auto forward = forward_copies(blocks, link, choices, outside);
  double stalled = forward.stalled;
  const auto window = static_cast<double>(prefetch_window(link, forward.largest));
  double now = 0;
  double link_free = 0;
  std::optional<double> prefetch_from;  // when the next copies may start; none: nothing unpacked yet (on demand)
  // One piece of what backward needs in turn: `copies` ns of link time in
  // `storages` copies of `bytes` in all, consumed over `compute` ns.
  const auto consume = [&](double copies, std::int64_t storages, std::int64_t bytes, double compute) {
    if (copies <= 0) {
      now += compute;
      return;
    }
    if (window <= 0) {
      stalled += copies;
      now += copies + compute;
      return;
    }
    const double start = std::max(link_free, prefetch_from.value_or(now));
    link_free = start + copies;
    const double begin = std::max(now, start + copies / static_cast<double>(std::max<std::int64_t>(1, storages)));
    stalled += begin - now;
    now = begin;
    const auto b = static_cast<double>(bytes);
    prefetch_from = now + (b > window ? compute * (1.0 - window / b) : 0.0);
    now += compute;
    if (link_free > now) {
      stalled += link_free - now;
      now = link_free;
    }
  };
  const auto consume_outside = [&](std::size_t k) {
    if (outside != nullptr && k < outside->bytes.size())
      consume(outside_ns(link, outside, k), outside->storages[k], outside->bytes[k], 0.0);
  };
  consume_outside(n);
  for (std::size_t i = n; i-- > 0;) {
    const auto& b = blocks[i];
    const auto f = forward_ns_of(b);
    consume(moved_ns(link, b, choices[i]), moved_storages(b, choices[i]), moved_bytes(b, choices[i]),
            2 * f + (is_recomputed(choices[i]) ? f : 0.0));
    consume_outside(i);
  }
  return stalled;
}

// What a prefetch window of `window` bytes holds of `units` (nearest
// first, whole ones while they fit; the nearest one even where it does
// not, as sync::Streamed brings one storage back ahead whatever its size).
std::int64_t window_holds(const std::vector<std::int64_t>& units, std::int64_t window) {
  if (window <= 0) return 0;
  std::int64_t held = 0;
  for (auto it = units.rbegin(); it != units.rend(); ++it) {
    if (*it <= 0) continue;
    if (held > 0 && held + *it > window) break;
    held += *it;
  }
  return held;
}

// The backward peak from each block's measured stretch (backward_peak,
// BlockCost), or -1 where one was not measured: block i's plus the kept
// blocks before it (their backward is still to run) and, with overlapping
// copies, what the prefetch window brings back ahead of need (at most the
// bytes offloaded before it, at least the largest storage offloaded
// before it) instead of what the measuring step's window held (what was
// offloaded before block i, nearest first: inputs and what was saved
// outside blocks; the window sized by the largest input before it);
// `outside`: what is saved outside blocks, `outside_kept`: it is kept.
std::int64_t backward_peak(const std::vector<BlockCost>& blocks, const LinkCost& link,
                           const std::vector<BlockChoice>& choices, const OutsideCost& outside, bool outside_kept) {
  std::int64_t largest_moved = 0;  // this plan's largest offloaded storage
  for (std::size_t i = 0; i < blocks.size(); ++i)
    largest_moved = std::max(largest_moved, largest_moved_storage(blocks[i], choices[i]));
  const auto window = prefetch_window(link, largest_moved);
  const auto outside_at = [&outside](std::size_t k) { return k < outside.bytes.size() ? outside.bytes[k] : 0; };
  std::int64_t peak = 0;
  std::int64_t kept_before = 0;
  std::int64_t moved_before = 0;          // this plan's offloaded bytes (blocks and inputs)
  std::int64_t largest_moved_before = 0;  // ... its largest storage
  std::int64_t largest_input_before = 0;
  std::vector<std::int64_t> measured_before;  // what the measuring step offloaded, in order
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    if (b.backward_peak < 0) return -1;
    measured_before.push_back(outside_at(i));
    if (outside_kept) kept_before += outside_at(i);
    const auto ahead_measured = window_holds(measured_before, prefetch_window(link, largest_input_before));
    const auto ahead =
        window > 0 && moved_before > 0 ? std::max(std::min(window, moved_before), largest_moved_before) : 0;
    peak = std::max(peak, b.backward_peak - ahead_measured + kept_before + ahead);
    measured_before.push_back(b.input_bytes);
    largest_input_before = std::max(largest_input_before, b.input_bytes);
    if (choices[i] == BlockChoice::keep) kept_before += b.saved_bytes;
    if (choices[i] == BlockChoice::recompute_input_kept) kept_before += b.input_bytes;
    moved_before += moved_bytes(b, choices[i]);
    largest_moved_before = std::max(largest_moved_before, largest_moved_storage(b, choices[i]));
  }
  return peak;
}

}  // namespace

// `outside`: what is saved outside blocks; `outside_kept`: it stays on
// the device (else it is offloaded, as measured). `in_flight`: count what
// overlapping copies hold in forward (false: none, for a bound under the
// peak).
Prediction predict(const std::vector<BlockCost>& blocks, const LinkCost& link, std::int64_t base_peak,
                   std::int64_t forward_peak, const std::vector<BlockChoice>& choices, const OutsideCost& outside,
                   bool outside_kept, bool in_flight) {
  double forward = 0;         // F: every block's forward
  double before_offload = 0;  // forward time before the first offloaded block starts
  bool offloading = false;
  double link_ns = 0;
  std::int64_t kept = 0;
  std::int64_t last_kept = 0;  // the saved bytes of the last kept block
  std::int64_t offloaded = 0;
  std::int64_t largest_offloaded = 0;
  std::int64_t kept_inputs = 0;  // of blocks recomputed with their input kept
  Prediction out;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    const auto f = forward_ns_of(b);
    link_ns += moved_ns(link, b, choices[i]);
    switch (choices[i]) {
      case BlockChoice::keep:
        kept += b.saved_bytes;
        last_kept = b.saved_bytes;
        break;
      case BlockChoice::offload:
        offloading = true;
        offloaded += b.saved_bytes;
        largest_offloaded = std::max(largest_offloaded, b.saved_bytes);
        break;
      case BlockChoice::recompute_input_kept:
        kept_inputs += b.input_bytes;
        [[fallthrough]];
      case BlockChoice::recompute:
        out.extra_ns += f;
        ++out.recomputed;
        break;
    }
    if (!offloading) before_offload += f;
    forward += f;
  }
  // Overlapping copies hold what they have not moved yet on the device:
  // at least one block's saved tensors (its copies run while the next
  // block computes), and what the link could not move during forward.
  std::int64_t behind = 0;
  if (in_flight && link.overlaps && offloaded > 0 && link.bytes_per_ns > 0) {
    const double moved_in_forward = link.bytes_per_ns * (forward - before_offload);
    behind = std::max(largest_offloaded,
                      static_cast<std::int64_t>(std::max(0.0, static_cast<double>(offloaded) - moved_in_forward)));
  }
  const auto* offloaded_outside = outside_kept ? nullptr : &outside;
  for (std::size_t k = 0; k < outside.bytes.size(); ++k) link_ns += outside_ns(link, offloaded_outside, k);
  out.extra_ns += link.overlaps ? exposed_overlapping(blocks, link, choices, offloaded_outside) : 2 * link_ns;
  out.moved = link_ns;
  // Kept blocks' tensors add to the forward peak, less the last kept
  // block's: the measured peak was reached while a block ran, holding its
  // temporaries (at least what it saves). Overlapping copies add what they
  // hold in forward. Backward: from each block's measured stretch where
  // known, else as forward, from the step's peak (at the last kept
  // block's backward the measured step held its recomputed tensors).
  // What is saved outside blocks and kept counts at the end of forward;
  // in backward, before each block where measured, else all of it.
  const auto outside_bytes = outside_kept ? outside.total() : 0;
  const auto at_forward_end =
      (forward_peak >= 0 ? forward_peak : base_peak) + kept - last_kept + kept_inputs + behind + outside_bytes;
  const auto measured = backward_peak(blocks, link, choices, outside, outside_kept);
  const auto in_backward = measured >= 0 ? measured : base_peak + kept - last_kept + kept_inputs + outside_bytes;
  out.peak = std::max(at_forward_end, in_backward);
  if (outside.after_blocks_peak >= 0) {
    // What ran after the last block raised the measuring step's peak: it
    // holds every kept block's tensors and kept input, what is saved
    // outside blocks where kept (all of it: where the head peaked in its
    // forward, its own tensors were being offloaded in the measuring step)
    // and the copies still in flight as forward ends. This errs high where
    // the measuring step held some of the same bytes there (an input back
    // ahead of need, the head's tensors back in its backward).
    out.peak = std::max(out.peak, outside.after_blocks_peak + kept + kept_inputs + outside_bytes + behind);
  }
  return out;
}

// Every block offloaded, as predict() has it; with `floor`, each block's
// measured stretch of backward holds, of its own saved tensors, only its
// largest storage, and overlapping copies hold nothing at forward's peak:
// a bound under what offloading every block needs (its recomputation held
// all its tensors at once; offloaded, they come back as backward unpacks
// them, at least the largest at once; copies may all have ended by the
// time forward peaks), to tell whether trying it is worthwhile.
Prediction offload_all(std::vector<BlockCost> blocks, const LinkCost& link, std::int64_t base_peak,
                       std::int64_t forward_peak, const OutsideCost& outside, bool floor) {
  if (floor) {
    for (auto& b : blocks) {
      const auto largest = b.largest_storage > 0 ? b.largest_storage : b.saved_bytes;
      if (b.backward_peak >= 0) b.backward_peak -= std::max<std::int64_t>(0, b.saved_bytes - largest);
    }
  }
  const std::vector<BlockChoice> choices(blocks.size(), BlockChoice::offload);
  return predict(blocks, link, base_peak, forward_peak, choices, outside, false, /*in_flight=*/!floor);
}

}  // namespace offload::plan
