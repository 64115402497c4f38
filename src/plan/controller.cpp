// SPDX-License-Identifier: MIT
// The automatic plan's controller: BlockPlanner, what a manager keeps
// across steps (measuring, the plan in force, feedback from each step),
// over the search (plan_blocks) and the cost model (cost_model.hpp).

#include <offload/block_plan.hpp>

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

namespace offload {

using plan::offload_all;
using plan::predict;
using plan::recompute_all_extra_ns;

bool BlockPlanner::begin_step(std::int64_t needed, std::int64_t allocated, std::int64_t peak, bool needed_is_peak) {
  const std::lock_guard lock(mutex_);
  const auto now = Clock::now();
  const auto previous = ran_choices_;
  if (started_ && next_index_ == 0) {
    // No planned block ran since the last begin (an evaluation pass under
    // no_grad, another model under the scope): not a step of the plan.
    step_start_ = now;
    step_forward_peak_ = -1;
    if (measuring_) outside_ = OutsideCost{};
    return false;
  }
  if (started_) {
    measured_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(now - step_start_).count();
    for (auto& c : counts_) c = 0;
    for (auto c : ran_choices_) ++counts_[static_cast<int>(c)];
    guarded_before_ = guarded_;
    const auto ran = static_cast<std::size_t>(next_index_);
    // Steps in a row: reset here, counted again only by a step that ran
    // every block offloaded, as tried, and needed too much (below).
    const auto over_before = std::exchange(over_all_offloaded_, 0);
    if (measuring_) {
      const bool complete = ran > 0 && costs_.size() == ran && !measure_next_ &&
                            std::all_of(have_cost_.begin(), have_cost_.end(), [](bool b) { return b; });
      if (complete) {
        growth_ =
            allocated >= 0 && measure_allocated_ >= 0 ? std::max<std::int64_t>(0, allocated - measure_allocated_) : 0;
        // The block recomputed last closes its stretch with the step's peak.
        if (last_recomputed_ >= 0 && needed >= 0) {
          costs_[static_cast<std::size_t>(last_recomputed_)].backward_peak = needed - growth_;
        }
        base_peak_ = needed;
        forward_peak_ = step_forward_peak_ >= 0 && allocated >= 0 ? step_forward_peak_ + allocated : -1;
        correction_ = 0;
        late_growth_ = 0;
        late_gone_ = 0;
        offload_all_peak_ = -1;
        offload_all_measured_ = true;
        trial_ = false;
        rebased_ = false;
        outside_.bytes.resize(ran + 1, 0);
        outside_.storages.resize(ran + 1, 0);
        base_ns_ =
            std::max<std::int64_t>(0, measured_ns_ - probe_ns_ - recompute_all_extra_ns(costs_, link_, outside_));
        plan_locked();
      } else {
        measure_next_ = true;  // a block was not measured (it threw): measure again
      }
    } else {
      if (ran != choices_.size()) measure_next_ = true;  // fewer blocks than planned
      // The first step after the measuring step that ran its plan as
      // planned: its time less the plan's predicted extra is the base of
      // later predictions (the measuring step may have run cold: a
      // process's first calls, a cold allocator).
      if (!rebased_ && !measure_next_ && !diverged_ && guarded_ == 0 && ran_choices_ == choices_ && base_ns_ >= 0) {
        base_ns_ = std::max<std::int64_t>(0, measured_ns_ - extra_ns_);
        rebased_ = true;
      }
      const bool offloading_all_tried =
          offload_all_peak_ >= 0 && !choices_.empty() &&
          std::all_of(choices_.begin(), choices_.end(), [](BlockChoice c) { return c == BlockChoice::offload; });
      if (trial_) {
        // The step tried every block offloaded (the model found nothing
        // that fits): plan again knowing what that needed. Where the step
        // did not raise the device's running peak, `needed` is the
        // per-tensor plan's model, not a measure.
        trial_ = false;
        if (!measure_next_) {
          offload_all_measured_ = needed_is_peak && needed >= 0;
          offload_all_peak_ = std::max<std::int64_t>(0, needed - correction_);
          plan_locked();
        }
      } else if (offloading_all_tried) {
        // Every block offloaded, as tried: it offloads all a plan of blocks
        // can, and what a step needs beyond the tried one is the per-tensor
        // plan's (what it keeps inside the blocks, with its own feedback).
        // Where three steps in a row still needed more than 2 % over the
        // target (the tried step ran before the optimizer's state existed,
        // under gradient accumulation), the target is not met: warned.
        // A step that raised no peak is judged by the per-tensor plan's
        // model of it (a loop that does not reset the peak statistics
        // raises the running peak once); three, not two, so that the
        // per-tensor plan inside the blocks, which corrects its own
        // overshoots, is not taken for the target being out of reach.
        unfit_remeasured_ = false;
        if (!measure_next_ && needed >= 0 && needed > target_ + target_ / 50) over_all_offloaded_ = over_before + 1;
        if (over_all_offloaded_ >= 3 && !warned_) {
          warned_ = true;
          warning_ = "offload::Options: device_target_bytes " + std::to_string(target_) +
                     " is below what offloading every planned block needs: three steps in a row needed more than "
                     "2 % over it, the last " +
                     std::to_string(needed) + " bytes; every planned block stays offloaded (warned once per manager)";
        }
      } else if (!measure_next_ && needed > target_ + target_ / 50 && needed > predicted_peak_) {
        // (Within 2 % of the target: what the per-tensor plan inside the
        // offloaded blocks kept past it, which it corrects itself; a
        // correction here would change the choices, and that plan would
        // start over each time.)
        // The step needed more than the model predicted: plan again with
        // the difference. Where nothing fits then, the blocks no longer
        // save what was measured (data-dependent sizes, another model
        // under the same manager): this step measures again instead.
        correction_ += needed - predicted_peak_;
        // Once only in a row: where the fresh measurement misses again,
        // the plan warns and recomputes every block (which fits wherever
        // anything does) instead of measuring every other step.
        const bool again = unfit_remeasured_;
        unfit_remeasured_ = false;
        plan_locked(/*remeasure_if_unfit=*/!again);
        if (measure_next_) unfit_remeasured_ = true;
      } else if (!measure_next_) {
        unfit_remeasured_ = false;  // a planned step within the model
      }
    }
  }
  step_forward_peak_ = -1;
  const bool remeasure = measure_next_;
  const bool outside_was_kept = ran_outside_kept_;
  started_ = true;
  step_start_ = now;
  next_index_ = 0;
  probed_ = false;
  probe_ns_ = 0;
  measuring_ = measure_next_ || !planned_;
  if (measuring_) {
    measure_allocated_ = allocated;
    before_peak_ = allocated >= 0 && peak > allocated ? peak : -1;
    outside_ = OutsideCost{};
    blocks_peak_ = -1;
  }
  last_recomputed_ = -1;
  open_blocks_ = 0;
  if (measure_next_) {
    costs_.clear();
    have_cost_.clear();
    rises_.clear();
    measure_next_ = false;
  }
  diverged_ = false;
  ran_choices_.clear();
  guarded_ = 0;
  ran_outside_kept_ = !measuring_ && outside_kept_;
  const auto& now_choices = measuring_ ? std::vector<BlockChoice>(previous.size(), BlockChoice::recompute) : choices_;
  return remeasure || now_choices != previous || ran_outside_kept_ != outside_was_kept;
}

BlockPlanner::Turn BlockPlanner::next_block(std::int64_t input_bytes, int device_index) {
  // Read without the lock, as recomputing() reads the peak.
  const auto read = [&] { return allocated_ && device_index >= 0 ? allocated_(device_index) : std::int64_t{-1}; };
  auto allocated = read();
  std::unique_lock lock(mutex_);
  // A measuring step records where each block's forward begins (measured()).
  std::int64_t peak = -1;
  if (measuring_) {
    lock.unlock();
    peak = read_peak(device_index);
    lock.lock();
  }
  if (device_index >= 0) device_index_ = device_index;
  Turn turn;
  turn.index = next_index_++;
  const auto index = static_cast<std::size_t>(turn.index);
  if (measuring_) {
    turn.measure = true;
    if (index == 0) first_block_allocated_ = allocated;
    if (costs_.size() <= index) {
      costs_.resize(index + 1);
      have_cost_.resize(index + 1, false);
    }
    if (rises_.size() <= index) rises_.resize(index + 1, -1);
    open_allocated_ = allocated;
    open_peak_ = peak;
    turn.probe_link = !probed_ && input_bytes > 0;
    if (turn.probe_link) probed_ = true;
  } else if (diverged_ || index >= choices_.size() || index >= costs_.size() ||
             input_bytes > costs_[index].input_bytes) {
    // Not the blocks the plan was made for (more of them, or larger
    // inputs: smaller ones need less and follow the plan): recompute from
    // here on (it fits wherever anything does) and measure the next step.
    diverged_ = true;
    measure_next_ = true;
  } else {
    if (index == 0 && allocated >= 0 && first_block_allocated_ >= 0 && base_peak_ >= 0) {
      // More allocated than at the measuring step's first block, beyond
      // what the plan counted since (optimizer state made after that step
      // ended early: a scope without planned blocks opened between backward
      // and the optimizer's step; gradient accumulation, whose next
      // micro-step holds the gradients): plan this step again with it,
      // without a warning where nothing fits then (the model counts it on
      // top of what the measured stretches may hold already, such as
      // gradients made in that backward: it errs high).
      const auto late = allocated - first_block_allocated_ - growth_ - late_growth_;
      const auto gone = late < -(target_ / 100) ? std::min(late_growth_, -late) : std::int64_t{0};
      // Where what was added has gone again (a tensor the loop held over
      // one step), the second step in a row to find it gone gives it back
      // (one alone may be a micro-step of gradient accumulation before its
      // gradients are made), so one step's extra does not keep the plan
      // conservative for good.
      const auto give_back = std::min(gone, late_gone_);
      late_gone_ = give_back > 0 ? 0 : gone;
      if (late > target_ / 100 || give_back > 0) {
        const auto change = give_back > 0 ? -give_back : late;
        late_growth_ += change;
        correction_ = std::max<std::int64_t>(0, correction_ + change);
        const bool warned = std::exchange(warned_, true);
        plan_locked();
        warned_ = warned;
      }
    }
    turn.choice = choices_[index];
    const bool keeps = turn.choice == BlockChoice::keep || turn.choice == BlockChoice::recompute_input_kept;
    // What the plan adds from here, less the block's input, which
    // `allocated` holds already (a kept block's first operation saves it, a
    // block recomputed with its input kept keeps just that).
    const auto kept = keeps ? held_from(index, std::min(input_bytes, costs_[index].input_bytes)) : 0;
    if (keeps && allocated >= 0 && allocated + kept > target_ && relieve_) {
      // Copies in flight hold their storages until they end: end them
      // first (a step's planned blocks run on one thread at a time).
      const auto relieve = relieve_;
      lock.unlock();
      try {
        relieve();
        allocated = read();
      } catch (...) {  // a device error ending the copies: nothing relieved; the guard decides on what was read
      }
      lock.lock();
    }
    if (keeps && allocated >= 0 && allocated + kept > target_) {
      turn.choice = turn.choice == BlockChoice::keep ? BlockChoice::offload : BlockChoice::recompute;
      turn.guarded = true;
      ++guarded_;
    }
  }
  ran_choices_.push_back(turn.choice);
  ++open_blocks_;  // last: nothing after it throws, so block_done() pairs with it
  return turn;
}

std::int64_t BlockPlanner::read_peak(int device_index) const noexcept {
  // Read without the lock, as recomputing() reads the peak; a device that
  // cannot say counts as not reported.
  try {
    return peak_ && device_index >= 0 ? peak_(device_index) : std::int64_t{-1};
  } catch (...) {
    return -1;
  }
}

std::int64_t BlockPlanner::held_from(std::size_t index, std::int64_t input) const {
  std::int64_t largest_rise = -1;
  for (const auto r : rises_) largest_rise = std::max(largest_rise, r);
  const auto end = std::min(costs_.size(), choices_.size());
  std::int64_t kept = -input;  // by the blocks from `index` to the one running
  std::int64_t most = std::numeric_limits<std::int64_t>::min();
  for (std::size_t j = index; j < end; ++j) {
    if (j > index && outside_kept_ && j < outside_.bytes.size()) kept += outside_.bytes[j];
    const auto& b = costs_[j];
    const auto keeps = choices_[j] == BlockChoice::keep                   ? b.saved_bytes
                       : choices_[j] == BlockChoice::recompute_input_kept ? b.input_bytes
                                                                          : std::int64_t{0};
    const auto rise = j < rises_.size() && rises_[j] >= 0 ? rises_[j] : largest_rise;
    // A rise counts from where its block began, with its input allocated:
    // `allocated` holds this block's already, a later block's comes as the
    // output of the one before it.
    if (j == index) {
      most = rise >= 0 ? std::max(keeps - input, rise) : keeps - input;
    } else {
      most = std::max(most, kept + (rise >= 0 ? std::max(keeps, b.input_bytes + rise) : keeps));
    }
    kept += keeps;
  }
  if (outside_kept_) {
    for (std::size_t k = std::max(index + 1, end); k < outside_.bytes.size(); ++k) kept += outside_.bytes[k];
  }
  return std::max(most, kept);
}

void BlockPlanner::set_relieve(std::function<void()> relieve) {
  const std::lock_guard lock(mutex_);
  relieve_ = std::move(relieve);
}

void BlockPlanner::block_done() {
  int device = -1;
  {
    const std::lock_guard lock(mutex_);
    if (open_blocks_ > 0) --open_blocks_;
    if (!measuring_ || open_blocks_ > 0 || !peak_ || last_recomputed_ >= 0) return;
    device = device_index_;
  }
  if (device < 0) return;
  // Read without the lock, as recomputing() reads the peak.
  const auto peak = peak_(device);
  const std::lock_guard lock(mutex_);
  // A running peak still at one from before the step is where the head
  // starts from too: a head that raises it is measured all the same.
  if (measuring_ && last_recomputed_ < 0) blocks_peak_ = peak;
}

bool BlockPlanner::outside_block() const {
  const std::lock_guard lock(mutex_);
  return open_blocks_ == 0 && started_;
}

void BlockPlanner::saved_outside(std::int64_t bytes) {
  const std::lock_guard lock(mutex_);
  if (!measuring_ || open_blocks_ > 0 || bytes <= 0) return;
  const auto gap = static_cast<std::size_t>(next_index_);
  if (outside_.bytes.size() <= gap) {
    outside_.bytes.resize(gap + 1, 0);
    outside_.storages.resize(gap + 1, 0);
  }
  outside_.bytes[gap] += bytes;
  ++outside_.storages[gap];
}

bool BlockPlanner::keeps_outside() const {
  const std::lock_guard lock(mutex_);
  return ran_outside_kept_ && open_blocks_ == 0 && !diverged_;
}

void BlockPlanner::end_forward(std::int64_t forward_peak) {
  const std::lock_guard lock(mutex_);
  step_forward_peak_ = forward_peak;
}

void BlockPlanner::measured(std::int32_t index, const BlockCost& cost) {
  std::unique_lock lock(mutex_);
  const auto device = device_index_;
  lock.unlock();
  const auto peak = read_peak(device);
  lock.lock();
  const auto i = static_cast<std::size_t>(index);
  if (!measuring_ || i >= costs_.size()) return;
  costs_[i] = cost;
  have_cost_[i] = true;
  if (i < rises_.size()) rises_[i] = open_allocated_ >= 0 && peak > open_peak_ ? peak - open_allocated_ : -1;
}

void BlockPlanner::recomputing(std::int32_t index, int device_index) {
  const auto peak = peak_ ? peak_(device_index) : -1;
  const std::lock_guard lock(mutex_);
  const auto i = static_cast<std::size_t>(index);
  if (!measuring_ || i >= costs_.size()) return;
  // A running peak that never rose above the one from before the step
  // tells nothing of this stretch: unmeasured.
  if (last_recomputed_ >= 0) {
    costs_[static_cast<std::size_t>(last_recomputed_)].backward_peak =
        before_peak_ >= 0 && peak <= before_peak_ ? -1 : peak;
  } else if (blocks_peak_ >= 0 && peak > blocks_peak_) {
    // Backward's first recomputation: what ran since the last block's
    // forward ended (an output head, the loss) raised the peak.
    outside_.after_blocks_peak = peak;
  }
  last_recomputed_ = index;
}

void BlockPlanner::recomputed(std::int32_t index, std::int64_t ns) {
  const std::lock_guard lock(mutex_);
  const auto i = static_cast<std::size_t>(index);
  if (!measuring_ || i >= costs_.size() || ns < 0) return;
  costs_[i].recompute_ns = ns;
}

void BlockPlanner::link_measured(std::int64_t bytes, std::int64_t ns, std::int64_t small_bytes, std::int64_t small_ns) {
  const std::lock_guard lock(mutex_);
  probe_ns_ += ns + small_ns;
  if (bytes <= 0 || ns <= 0) return;
  LinkCost link = link_;
  link.bytes_per_ns = static_cast<double>(bytes) / static_cast<double>(ns);
  link.latency_ns = 0;
  if (small_bytes > 0 && small_bytes < bytes && small_ns > 0 && ns > small_ns) {
    // Two points on time = latency + bytes / bandwidth.
    link.bytes_per_ns = static_cast<double>(bytes - small_bytes) / static_cast<double>(ns - small_ns);
    link.latency_ns = std::max<std::int64_t>(
        0, small_ns - static_cast<std::int64_t>(static_cast<double>(small_bytes) / link.bytes_per_ns));
  }
  link_ = link;
}

namespace {

// How the link's copies run, for summary().
std::string copies_of(const LinkCost& link) {
  if (!link.overlaps) return "blocking copies";
  const auto window = link.prefetch_bytes > 0   ? std::to_string(link.prefetch_bytes) + " B"
                      : link.prefetch_depth > 0 ? std::to_string(link.prefetch_depth) + " x the largest storage"
                                                : std::string("none (every copy back on demand)");
  const auto stash =
      link.forward_stash > 0 ? std::to_string(link.forward_stash) + " storages" : std::string("no limit");
  return "overlapping copies (prefetch window " + window + ", forward stash " + stash + ")";
}

}  // namespace

std::string BlockPlanner::summary() const {
  const std::lock_guard lock(mutex_);
  std::ostringstream out;
  out << "link " << link_.bytes_per_ns << " GB/s, latency " << link_.latency_ns << " ns, " << copies_of(link_)
      << "; measured peak " << base_peak_ << " B (forward " << forward_peak_ << " B, correction " << correction_
      << " B); predicted peak " << predicted_peak_ << " B, extra " << extra_ns_ << " ns\n";
  out << "outside blocks: " << outside_.total() << " B in";
  for (std::size_t k = 0; k < outside_.bytes.size(); ++k)
    out << (k == 0 ? " " : ", ") << outside_.bytes[k] << " B (" << outside_.storages[k] << ")";
  out << ": " << (outside_kept_ ? "keep" : "offload");
  if (outside_.after_blocks_peak >= 0)
    out << "; after the last block the device peaked at " << outside_.after_blocks_peak << " B";
  out << "\n";
  if (trial_) out << "this step tries every block offloaded (the model found nothing that fits)\n";
  if (offload_all_peak_ >= 0 && offload_all_measured_)
    out << "every block offloaded, tried, needed " << offload_all_peak_ + correction_ << " B\n";
  if (offload_all_peak_ >= 0 && !offload_all_measured_) {
    out << "every block offloaded, tried: its peak not measured (it did not raise the device's running peak); "
           "the per-tensor plan's model of it "
        << offload_all_peak_ + correction_ << " B\n";
  }
  for (std::size_t i = 0; i < costs_.size(); ++i) {
    const auto& c = costs_[i];
    out << "block " << i << ": forward " << c.forward_ns << " ns, saves " << c.saved_bytes << " B in "
        << c.saved_storages << " storages, input " << c.input_bytes << " B, backward peak " << c.backward_peak
        << " B, recomputed in " << c.recompute_ns << " ns, largest storage " << c.largest_storage << " B";
    if (i < choices_.size()) out << ": " << choices_[i];
    out << "\n";
  }
  return out.str();
}

std::string BlockPlanner::take_warning() {
  const std::lock_guard lock(mutex_);
  return std::exchange(warning_, {});
}

bool BlockPlanner::has_blocks() const {
  const std::lock_guard lock(mutex_);
  return !costs_.empty() || !ran_choices_.empty() || !choices_.empty();
}

void BlockPlanner::add_stats(Stats& stats) const {
  const std::lock_guard lock(mutex_);
  std::int64_t running[4] = {0, 0, 0, 0};
  for (auto c : ran_choices_) ++running[static_cast<int>(c)];
  const auto* counts = ran_choices_.empty() ? counts_ : running;
  stats.blocks_kept += counts[static_cast<int>(BlockChoice::keep)];
  stats.blocks_offloaded += counts[static_cast<int>(BlockChoice::offload)];
  stats.blocks_recomputed +=
      counts[static_cast<int>(BlockChoice::recompute)] + counts[static_cast<int>(BlockChoice::recompute_input_kept)];
  stats.blocks_guarded += ran_choices_.empty() ? guarded_before_ : guarded_;
  if (planned_ && base_ns_ >= 0) stats.plan_predicted_step_us += (base_ns_ + extra_ns_) / 1000;
  if (!costs_.empty() || !choices_.empty()) stats.plan_measured_step_us += measured_ns_ / 1000;
}

void BlockPlanner::plan_locked(bool remeasure_if_unfit) {
  if (base_peak_ < 0) {
    // No memory statistics: nothing to plan against; keep recomputing.
    choices_.assign(costs_.size(), BlockChoice::recompute);
    outside_kept_ = false;
    extra_ns_ = recompute_all_extra_ns(costs_, link_, outside_);
    predicted_peak_ = std::numeric_limits<std::int64_t>::max();
    planned_ = true;
    if (!warned_) {
      warned_ = true;
      warning_ =
          "offload: the automatic plan measured no peak in its measuring step: the device reports no "
          "allocated-memory statistics, or nothing saved in that step went through the manager (a planned block's "
          "inputs smaller than Options::min_offload_bytes stay on the device unseen); every planned block is "
          "recomputed (warned once per manager)";
    }
    return;
  }
  trial_ = false;  // set again below where this plan tries every block offloaded
  // The measured stretches, on the footing of base_peak: with what was
  // allocated since (optimizer state) and what planned steps showed.
  auto costs = costs_;
  for (auto& c : costs) {
    if (c.backward_peak >= 0) c.backward_peak += growth_ + correction_;
  }
  auto outside = outside_;
  if (outside.after_blocks_peak >= 0) outside.after_blocks_peak += growth_ + correction_;
  const auto result = plan_blocks(costs, link_, base_peak_ + correction_, target_,
                                  forward_peak_ >= 0 ? forward_peak_ + correction_ : -1, outside);
  if (!result.fits && remeasure_if_unfit && correction_ > 0) {
    measure_next_ = true;
    correction_ = 0;
    return;
  }
  bool offloaded = false;  // every block offloaded: it fits, or it needed less than recomputing every block
  if (!result.fits && link_.bytes_per_ns > 0 && !costs.empty()) {
    // The model errs high for offloaded blocks in backward (each holds its
    // tensors there as its recomputation did): where offloading every
    // block may fit, try it for a step (trial_), then keep it where the
    // step it ran in met the target, or needed less than recomputing
    // every block is predicted to (then with the warning).
    const auto base = base_peak_ + correction_;
    const auto forward = forward_peak_ >= 0 ? forward_peak_ + correction_ : -1;
    const bool tried = offload_all_peak_ >= 0;
    const auto tried_peak = offload_all_peak_ + correction_;
    // Not measured: that step did not raise the device's running peak,
    // which the measuring step had raised (its stretches were measured, or
    // no step would have been tried): it needed no more than that.
    if (tried ? !offload_all_measured_ || tried_peak < result.peak_bytes
              : offload_all(costs, link_, base, forward, outside, /*floor=*/true).peak <= target_) {
      trial_ = !tried;
      offloaded = true;
      choices_.assign(costs_.size(), BlockChoice::offload);
      outside_kept_ = false;
      extra_ns_ = static_cast<std::int64_t>(offload_all(costs, link_, base, forward, outside, false).extra_ns);
      predicted_peak_ = tried ? tried_peak : target_;
      planned_ = true;
      if (trial_ || tried_peak <= target_) return;
    }
  }
  if (!offloaded) {
    choices_ = result.choices;
    outside_kept_ = result.outside_kept;
    extra_ns_ = result.extra_ns;
    predicted_peak_ = result.peak_bytes;
    planned_ = true;
  }
  if (!result.fits && !warned_) {
    warned_ = true;
    warning_ = "offload::Options: device_target_bytes " + std::to_string(target_) +
               " is below what recomputing every planned block with its inputs offloaded needs (" +
               std::to_string(result.peak_bytes) + " bytes, predicted from the measuring step's " +
               std::to_string(base_peak_ + correction_) + "-byte peak" +
               (offload_all_peak_ < 0 ? std::string()
                : offload_all_measured_
                    ? "; offloading every planned block, tried, needed " +
                          std::to_string(offload_all_peak_ + correction_) + " bytes"
                    : "; offloading every planned block, tried, did not raise the device's peak from the measuring "
                      "step, so its own was not measured (reset the device's peak statistics before each step to "
                      "measure it); the per-tensor plan's model of it: " +
                          std::to_string(offload_all_peak_ + correction_) + " bytes") +
               (offloaded ? "); every planned block is offloaded (that needed less)"
                          : "); every planned block is recomputed") +
               (before_peak_ >= 0 ? " (the device had already peaked at " + std::to_string(before_peak_) +
                                        " bytes before that step, so it measured no block's own peak in backward: "
                                        "reset the device's peak statistics before each step)"
                                  : "") +
               " (warned once per manager)";
  }
}

}  // namespace offload
