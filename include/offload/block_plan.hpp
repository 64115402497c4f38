// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The automatic plan (docs/guide.md, "Keep, offload or recompute"): for
/// blocks marked with CheckpointOptions::planned, a manager with a
/// device-memory target chooses each step whether a block is kept (its
/// saved tensors stay on the device), offloaded (they go through the
/// manager) or recomputed (checkpointed, its inputs through the manager),
/// at the least predicted step time with the step's peak under the target.
/// plan_blocks() is the choice, plain C++ over measured costs; BlockPlanner
/// is the state a manager keeps across steps (what was measured, the
/// choices of the step running). Neither needs LibTorch.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <offload/stats.hpp>

namespace offload {

/// What the plan does with one marked block in one step.
enum class BlockChoice : std::uint8_t {
  keep,       ///< run as is; its saved tensors stay on the device (no manager sees them)
  offload,    ///< run as is inside the manager's scope; its saved tensors are offloaded (or kept by the target plan)
  recompute,  ///< checkpointed: only its inputs are saved (through the manager); run again in backward
  recompute_input_kept,  ///< checkpointed, its inputs kept on the device (no manager sees them); run again in backward
};

/// Writes "keep", "offload", "recompute" or "recompute (input kept)".
std::ostream& operator<<(std::ostream& os, BlockChoice choice);

/// What one block costs, measured on the run (a step that recomputed it).
struct BlockCost {
  std::int64_t forward_ns = 0;      ///< its forward on the device, nanoseconds (device events)
  std::int64_t saved_bytes = 0;     ///< storage bytes it saves for backward on the device, parameters excluded
  std::int64_t saved_storages = 0;  ///< how many distinct storages those are (each a copy when offloaded)
  std::int64_t input_bytes = 0;     ///< storage bytes of its inputs on the device (what recomputing saves)
  /// The most device bytes allocated at once from its recomputation's
  /// beginning in the measuring step's backward (every block recomputed,
  /// inputs offloaded) to the next block's (or the step's end): the
  /// device's running peak there, exact where that stretch raised it, else
  /// an upper bound. -1: not measured (then the step's peak stands for
  /// every block's).
  std::int64_t backward_peak = -1;
  /// Its recomputation in that backward, nanoseconds, or <= 0: not measured.
  /// Where measured, the model takes the lesser of it and forward_ns for
  /// the block's forward time: both run the same computation once, and
  /// each can be slowed alone (the first forward of a run pays for a cold
  /// allocator and first calls; a recomputation shares the host with the
  /// copies backward starts).
  std::int64_t recompute_ns = -1;
  /// The largest of the storages it saves, bytes (what sizes a prefetch
  /// window: LinkCost), or -1: not measured (then the block's saved bytes
  /// count as one storage).
  std::int64_t largest_storage = -1;
};

/// The link between the device and host memory, measured on the run.
struct LinkCost {
  double bytes_per_ns = 0;      ///< achieved bandwidth, bytes per nanosecond (= GB/s); > 0
  std::int64_t latency_ns = 0;  ///< fixed time per copy, nanoseconds
  bool overlaps = true;  ///< copies run beside compute (sync::Streamed); false: the compute stream waits for them
  /// With overlapping copies, what backward brings back ahead of need
  /// (Options::prefetch_bytes and prefetch_depth): prefetch_bytes where
  /// > 0, else prefetch_depth x the largest offloaded storage; both 0: none.
  std::int64_t prefetch_depth = 0;
  std::int64_t prefetch_bytes = 0;
  /// With overlapping copies, how many offloaded storages may be copying
  /// in forward before compute waits for the oldest (sync::Streamed's
  /// Options::max_fwd_stash); 0: no limit.
  std::int64_t forward_stash = 0;
};

/// What the manager offloads outside every marked block (the embedding's
/// and the output head's saved tensors), by where in the step: entry k is
/// what was saved after block k - 1 ended and before block k began (k = 0:
/// before the first block; k = n: after the last), measured on the run.
/// Empty: nothing outside blocks.
struct OutsideCost {
  std::vector<std::int64_t> bytes;     ///< storage bytes offloaded there
  std::vector<std::int64_t> storages;  ///< how many copies those are (same size as bytes)
  /// The device's running peak (bytes, on the footing of the step's base
  /// peak) when backward's first recomputation began in the measuring step,
  /// where what ran after the last block (an output head's forward and
  /// backward) raised it above where it stood when the last block's forward
  /// ended; -1: it did not, or not measured. Every kept block's saved
  /// tensors are held there.
  std::int64_t after_blocks_peak = -1;
  /// Every entry's bytes.
  std::int64_t total() const noexcept {
    std::int64_t sum = 0;
    for (auto b : bytes) sum += b;
    return sum;
  }
};

/// The result of plan_blocks(): a choice per block and what the model
/// predicts for them.
struct BlockPlanResult {
  std::vector<BlockChoice> choices;
  bool outside_kept = false;    ///< the tensors saved outside blocks stay on the device (OutsideCost)
  std::int64_t extra_ns = 0;    ///< predicted time over keeping every block (recomputation + link time not hidden)
  std::int64_t peak_bytes = 0;  ///< predicted peak device bytes
  bool fits = true;             ///< false: no choice meets the limit; every block is recomputed
};

/// Chooses keep, offload or recompute per block. The model:
/// - Recomputing every block (inputs offloaded) peaks at `base_peak`
///   bytes, and at `forward_peak` by the end of forward (-1: not known,
///   taken as base_peak); both measured.
/// - Backward: where every block's backward_peak is known (on the footing
///   of base_peak: what was allocated since the measuring step is added),
///   block i's backward peaks at its backward_peak plus the saved bytes
///   of the kept blocks before it (their backward is still to run) and,
///   with overlapping copies, what the prefetch window brings back ahead
///   of need: at most the bytes offloaded before it (blocks and inputs),
///   at least the largest storage among them (the measuring step's
///   stretch held its window of what it offloaded before the block,
///   nearest first: taken out); a kept or offloaded block holds its own
///   tensors there as the measured step held them recomputed. Otherwise
///   kept blocks add their saved bytes to base_peak, less the last kept
///   block's.
/// - Forward: kept blocks add their saved bytes to forward_peak, less the
///   last kept block's (the measured forward peak was reached while a
///   block ran, holding at least what it saves); overlapping copies add
///   what they hold on the device until they end (the largest offloaded
///   block's saved bytes, or what the link cannot have moved by the end of
///   forward if that is more).
/// - Recomputing costs the block's forward again (the lesser of
///   forward_ns and recompute_ns where measured, as for every use of a
///   block's forward time). A block
///   recomputed with its input kept holds input_bytes on the device from
///   its forward to its backward (added to the forward peak and to the
///   backward of the blocks after it) and moves nothing. Offloaded bytes cost
///   latency x storages + bytes / bandwidth each way (a recomputed block's
///   input likewise). Overlapping copies are a pipeline per direction: in
///   forward an offloaded block's copies are counted from halfway through
///   its forward (its storages are made as it runs), a recomputed block's
///   input from the block's beginning; what is still copying when forward
///   ends is exposed. Where more storages are
///   copying than LinkCost::forward_stash (one queue across forward), the
///   compute stream waits for the oldest copy in flight: a block ends no
///   earlier than when the link, counted from the block's beginning (the
///   earliest its copies can start), has copied all but the newest
///   forward_stash storages of what was queued. This wait errs low (a
///   block's storages are made through it, not all at its beginning, and
///   the wait is placed at its end); it only adds time, so a tighter stash
///   is never predicted faster. In backward (a block's backward taken as
///   twice its forward, plus the forward when recomputed, in reverse
///   order) as sync::Streamed prefetches: nothing comes back before an
///   offloaded storage is unpacked, so the first one backward needs comes
///   back on demand; a block's (or an outside piece's) copies start once
///   what is left to consume of the offloaded one before it fits in the
///   prefetch window, one after another; a block starts when its first
///   storage is back and ends no earlier than its last. The window is the
///   options' (under a target the headroom can widen it at run time, which
///   is not counted: errs high); without one (prefetch_depth and
///   prefetch_bytes 0) every copy back is on demand.
///   Copies that do not overlap are exposed whole, both ways.
/// - The candidates are the block orders the field uses, for every split:
///   offload the first o, recompute the next r, keep the rest; and
///   recompute the first r, offload the next o, keep the rest (earlier
///   blocks' tensors are needed last in backward, so they are the ones to
///   move or rebuild); each with the recomputed blocks' inputs offloaded,
///   and with them kept.
/// - What is saved outside blocks (`outside`; measured offloaded, like
///   the recomputed blocks' inputs) is offloaded or kept as a whole. Kept,
///   it adds its bytes to the forward peak and, to block i's backward, the
///   bytes saved before block i (what comes after the last block is freed
///   when backward begins); offloaded, its copies join the pipelines where
///   it was saved (what follows the last block is the first needed back).
///   Where what ran after the last block raised the measuring step's peak
///   (OutsideCost::after_blocks_peak), that stretch holds every kept
///   block's tensors, every kept input, everything kept outside blocks and
///   the copies still in flight as forward ends on top of it (erring high
///   where the measuring step held some of the same bytes there).
/// The choice is the candidate with the least predicted extra time whose
/// predicted peak is at most `limit` bytes (ties, extra times within 1 ns
/// of each other: fewer bytes moved, then fewer recomputed), each with what is saved outside blocks offloaded and
/// kept. O(n^2) in the number of blocks.
/// Errors: none; no candidate fits: every block is recomputed, fits = false.
BlockPlanResult plan_blocks(const std::vector<BlockCost>& blocks, const LinkCost& link, std::int64_t base_peak,
                            std::int64_t limit, std::int64_t forward_peak = -1, const OutsideCost& outside = {});

/// What a manager with a device-memory target keeps for its planned blocks
/// across steps. The first step (and the step after the blocks' input
/// sizes change) is a measuring step: every block is recomputed, with its
/// inputs offloaded, which fits wherever anything does; each block's
/// forward time, saved bytes and input bytes are measured, the link by
/// timing copies of a block's input, in backward each block's
/// recomputation time and peak (recomputing(), recomputed()), and what the
/// manager offloads outside blocks (saved_outside()). The step after a measuring step is
/// planned from it (plan_blocks), with the target and the peak the
/// measuring step needed (begin_step()); a later step whose first block
/// finds more allocated than the measuring step's first block did, beyond
/// what the plan counted as allocated since (optimizer state made after
/// the measuring step ended: a scope without planned blocks opened between
/// backward and the optimizer's step ends it early), by more than 1 % of
/// the target, re-plans at once with the difference added (given back where the
/// second planned step in a row finds it gone: one alone may be a
/// micro-step of gradient accumulation before its gradients exist); a later step
/// that needed more than the model predicted, and more than the target,
/// re-plans with the difference added (within 2 % of the target: what
/// the per-tensor plan inside offloaded blocks kept past it, which that
/// plan corrects itself; nothing changes). Choices stay until
/// then, so the per-tensor plan of Options::device_target_bytes learns
/// each configuration once. Where the model finds nothing that fits, but
/// offloading every block might (the model takes an offloaded block's
/// stretch of backward as its recomputation's, which holds all its saved
/// tensors at once; brought back as backward unpacks them, they need
/// less, by down to all but its largest storage), the step after tries
/// it: every block offloaded, its peak measured. Where that met the target
/// it stays the plan (and the per-tensor plan inside the blocks answers
/// for later steps' peaks); else the plan warns and keeps whichever needed
/// less: every block offloaded or every block recomputed. Where that step
/// did not raise the device's running peak (statistics not reset since a
/// higher one), its own peak is unknown but not above that earlier one:
/// every block stays offloaded, without a warning unless the per-tensor
/// plan's model of it is over the target. With every block offloaded,
/// three steps in a row more than 2 % over the target (by their peak, or
/// the per-tensor plan's model where they raised none) warn that the
/// target is not met; every block stays offloaded.
///
/// Thread-safety: every member may be called from any thread (one mutex).
class BlockPlanner {
 public:
  /// One block's turn in the running step.
  struct Turn {
    std::int32_t index = 0;                       ///< the block's position in the step (call order)
    BlockChoice choice = BlockChoice::recompute;  ///< what to do with it
    bool measure = false;                         ///< this step measures: report with measured()
    bool probe_link = false;                      ///< also time the link with this block's input (link_measured())
    /// The plan kept this block (its saved tensors, or its inputs), but
    /// what the device holds now plus what the plan keeps from here on and
    /// what the blocks from here allocate while they run would cross the
    /// target (the guard, next_block()): `choice` is
    /// offload (or recompute, its inputs offloaded) instead.
    bool guarded = false;
  };

  /// `target`: Options::device_target_bytes (> 0); `overlaps`: the sync
  /// policy copies beside compute; `peak`: the most bytes the device with
  /// the given index has had allocated at once so far (-1: not reported),
  /// read by recomputing(); empty: not read. `prefetch_depth`,
  /// `prefetch_bytes`, `forward_stash`: the options' prefetch window and
  /// forward stash of an overlapping sync policy (LinkCost). `allocated`:
  /// the bytes the device with the given index has allocated now (-1: not
  /// reported), read by next_block() for the guard; empty: no guard.
  /// `relieve`: ends the sync policy's forward copies in flight (the
  /// compute stream waits for them and their device storages are
  /// released), called by the guard before it offloads a block; empty:
  /// none. Called without this planner's lock held; an exception from it
  /// counts as nothing relieved.
  BlockPlanner(std::int64_t target, bool overlaps, std::function<std::int64_t(int)> peak = {},
               std::int64_t prefetch_depth = 0, std::int64_t prefetch_bytes = 0, std::int64_t forward_stash = 0,
               std::function<std::int64_t(int)> allocated = {}, std::function<void()> relieve = {})
      : target_(target),
        overlaps_(overlaps),
        peak_(std::move(peak)),
        allocated_(std::move(allocated)),
        relieve_(std::move(relieve)),
        link_{0,
              0,
              overlaps,
              overlaps ? prefetch_depth : 0,
              overlaps ? prefetch_bytes : 0,
              overlaps ? forward_stash : 0} {}

  /// A step begins (the manager's outermost scope opened); a begin with no
  /// planned block run since the last one is not a step (nothing changes,
  /// returns false). `needed`: the most
  /// device bytes the step before had allocated at once (its own peak, or
  /// where the device's peak does not show it, the per-tensor plan's
  /// model of it with every eligible saved tensor offloaded), or -1.
  /// `allocated`: the device's allocated bytes now, or -1. `peak`: the
  /// device's running peak now (what recomputing() reads), or -1: where it
  /// is above `allocated`, the device reached it before this step (an
  /// earlier run, a larger evaluation pass), so a measuring step's
  /// stretch in backward whose running peak never rises above it was not
  /// measured and counts as such (BlockCost::backward_peak -1; reset the
  /// device's peak statistics before training for every stretch
  /// measured). `needed_is_peak`: `needed` is the step's own peak (false:
  /// the per-tensor plan's model; the step did not raise the device's
  /// running peak). Returns true when this step's choices differ from what
  /// the step before ran (the guard's changes included: what the
  /// per-tensor plan recorded no longer applies).
  bool begin_step(std::int64_t needed, std::int64_t allocated = -1, std::int64_t peak = -1, bool needed_is_peak = true);

  /// A marked block is about to run with `input_bytes` of inputs on the
  /// device with index `device_index` (-1: none on a device): its choice
  /// in this step. A block the plan did not expect (a
  /// block beyond those planned, or larger inputs than measured; smaller
  /// ones follow the plan) is recomputed with every later block of the
  /// step, and the next step measures. The guard: where the plan keeps
  /// this block (or its inputs) and the device's allocated bytes now, plus
  /// what the plan keeps from this block on (kept blocks' saved bytes,
  /// kept inputs, what is saved outside blocks after it where kept) and
  /// what each block allocates while it runs (the most its forward
  /// allocated above where it began in the measuring step, where the
  /// device's peak showed it; a block whose forward did not raise the
  /// peak counts as the largest measured) exceed the target, the copies in flight are ended first (`relieve`;
  /// their storages were still counted), and where that is not enough
  /// the block is offloaded instead (recomputed
  /// with its inputs offloaded where its inputs were to be kept):
  /// Turn::guarded, Stats::blocks_guarded. What the plan's model did not
  /// see (copies lagging behind compute still holding their storages,
  /// the per-tensor plan keeping more inside offloaded blocks, data-
  /// dependent sizes) thus meets the target in forward. Each call is
  /// paired with block_done() when the block returns (or throws).
  Turn next_block(std::int64_t input_bytes, int device_index = -1);

  /// The block begun by the matching next_block() returned or threw: what
  /// is saved from now until the next block begins is outside blocks.
  void block_done();

  /// Whether no marked block is running: a tensor saved now is saved
  /// outside blocks (saved_outside(), keeps_outside()). One count for the
  /// manager: a step's planned blocks run on one thread at a time.
  bool outside_block() const;

  /// The manager offloaded a storage of `bytes`: counted where it was
  /// saved outside blocks in a measuring step (OutsideCost), else ignored.
  void saved_outside(std::int64_t bytes);

  /// Whether this step keeps what is saved outside blocks on the device
  /// (the plan chose so: BlockPlanResult::outside_kept); false in a
  /// measuring step, which offloads it.
  bool keeps_outside() const;

  /// The forward pass of this step ended (the first backward pass inside
  /// its scope, or its scope closed) with the device's peak `forward_peak`
  /// bytes above what was allocated when the step began, or -1 where that
  /// peak is not the step's own (an earlier one was higher) or not known.
  void end_forward(std::int64_t forward_peak);

  /// Replaces the guard's `relieve` callback (empty: none); the manager
  /// that gave it clears it when destroyed.
  void set_relieve(std::function<void()> relieve);

  /// What the plan was made from and chose, one line per block, for logs.
  std::string summary() const;

  /// What block `index` cost, measured in this (measuring) step, called
  /// as its forward returns: the device's running peak then, where it rose
  /// within the block, less what was allocated as it began, is what the
  /// block allocates while it runs, for the guard (next_block()).
  void measured(std::int32_t index, const BlockCost& cost);

  /// Block `index`'s recomputation begins in this (measuring) step's
  /// backward, on the device with index `device_index`: that device's
  /// running peak now closes the stretch of the block whose recomputation
  /// began before in this step (BlockCost::backward_peak); the last
  /// stretch closes at the next begin_step() with the step's peak.
  void recomputing(std::int32_t index, int device_index);

  /// Block `index`'s recomputation in this (measuring) step's backward
  /// took `ns` nanoseconds (BlockCost::recompute_ns).
  void recomputed(std::int32_t index, std::int64_t ns);

  /// A timed copy of `bytes` device bytes to pinned host memory took
  /// `ns`, and one of `small_bytes` took `small_ns` (the bandwidth and
  /// latency follow from the two).
  void link_measured(std::int64_t bytes, std::int64_t ns, std::int64_t small_bytes, std::int64_t small_ns);

  /// The warning to give, once (a target below what recomputing every
  /// block reaches, and offloading every block where tried; or, every
  /// block offloaded, three steps in a row over the target), else empty;
  /// cleared by the call.
  std::string take_warning();

  /// Whether planned blocks ran under this planner (in any step).
  bool has_blocks() const;

  /// Adds the plan's fields to a Stats snapshot (blocks_*, plan_*).
  void add_stats(Stats& stats) const;

 private:
  using Clock = std::chrono::steady_clock;
  // `remeasure_if_unfit`: a planned step's feedback; where nothing fits
  // with its correction, measure again (measure_next_) instead of warning.
  void plan_locked(bool remeasure_if_unfit = false);
  // The guard's sum (next_block()): the most the plan adds to what the
  // device holds as block `index` begins (`input`: its input bytes, held
  // already), until forward ends. What it keeps from there on, and while
  // each block runs, what that block allocates above where it began, as
  // measured in the measuring step's forward (rises_), with its input
  // for a later block (the output of the block before it); at least what
  // it keeps. A block not measured counts as the largest measured (none:
  // as what it keeps). (What the model counted on top, such as copies in
  // flight, is not added: a margin beyond what the blocks were seen to
  // allocate made the guard offload blocks the model had rightly kept.)
  std::int64_t held_from(std::size_t index, std::int64_t input) const;
  // The device's running peak for the measuring step's rises (-1: not
  // reported, or reading it threw). Called without the lock.
  std::int64_t read_peak(int device_index) const noexcept;

  mutable std::mutex mutex_;
  std::int64_t target_;
  bool overlaps_;
  std::function<std::int64_t(int)> peak_;
  std::function<std::int64_t(int)> allocated_;
  std::function<void()> relieve_;
  bool unfit_remeasured_ = false;         // the last planned step's feedback left nothing fitting and measured again
  bool trial_ = false;                    // this step offloads every block to measure what that needs
  std::int64_t offload_all_peak_ = -1;    // ... which it needed (less correction_ then); -1: not tried since measuring
  bool offload_all_measured_ = true;      // ... its own peak; false: the per-tensor plan's model, or -1 not known
  bool rebased_ = false;                  // base_ns_ was taken from a planned step since the measuring step
  bool measuring_ = true;                 // this step recomputes and measures every block
  bool measure_next_ = false;             // a block was unexpected: the next step measures
  bool planned_ = false;                  // choices_ come from a plan
  bool diverged_ = false;                 // this planned step met a block it did not plan: the rest recompute
  bool probed_ = false;                   // this measuring step timed the link
  std::int64_t probe_ns_ = 0;             // ... which took this long
  std::int32_t next_index_ = 0;           // blocks begun in this step
  std::vector<BlockCost> costs_;          // per block, from the measuring step
  std::vector<bool> have_cost_;           // costs_[i] was measured
  std::vector<BlockChoice> choices_;      // per block, this step
  std::vector<BlockChoice> ran_choices_;  // per block, as run in this step
  OutsideCost outside_;                   // from the measuring step
  bool outside_kept_ = false;             // the plan keeps what is saved outside blocks
  bool ran_outside_kept_ = false;         // ... and this step does
  std::int32_t open_blocks_ = 0;          // blocks begun and not done
  LinkCost link_{};
  bool have_link_ = false;
  std::int64_t base_peak_ = -1;              // what the measuring step needed
  std::int64_t forward_peak_ = -1;           // ... by the end of its forward (-1: not known)
  std::int64_t step_forward_peak_ = -1;      // end_forward() of this step
  std::int64_t correction_ = 0;              // what planned steps needed beyond the model
  std::int64_t growth_ = 0;                  // allocated since the measuring step began (optimizer state)
  std::int64_t first_block_allocated_ = -1;  // the measuring step: allocated when its first block began
  // The measuring step: per block, the most it allocated in forward above
  // what the device held as it began (the running peak rose within it),
  // else -1; and, for the block running, that allocated figure and the
  // running peak as it began.
  std::vector<std::int64_t> rises_;
  std::int64_t open_allocated_ = -1;
  std::int64_t open_peak_ = -1;
  std::int64_t late_growth_ = 0;  // allocated at a later step's first block beyond that and growth_ (in correction_)
  std::int64_t late_gone_ = 0;    // the step before's first block: how much of late_growth_ was no longer allocated
  std::int32_t over_all_offloaded_ = 0;  // steps in a row over the target with every block offloaded, as tried
  std::int64_t measure_allocated_ = -1;  // allocated when the measuring step began
  std::int32_t last_recomputed_ = -1;    // the block whose recomputation began last in this step
  int device_index_ = -1;                // the device of the step's blocks (next_block())
  std::int64_t blocks_peak_ = -1;        // a measuring step: the device's peak when the last block's forward ended
  std::int64_t before_peak_ = -1;        // a measuring step: the device's peak from before it, where above allocated
  std::int64_t predicted_peak_ = 0;
  std::int64_t extra_ns_ = 0;     // the plan's predicted extra time
  std::int64_t base_ns_ = -1;     // measured step time less the model's extra time of that step
  std::int64_t measured_ns_ = 0;  // the step before's wall time
  Clock::time_point step_start_{};
  bool started_ = false;
  bool warned_ = false;
  std::string warning_;
  std::int64_t counts_[4] = {0, 0, 0, 0};  // by BlockChoice, the step before (or this one while none ended)
  std::int64_t guarded_ = 0;               // blocks the guard offloaded in this step
  std::int64_t guarded_before_ = 0;        // ... in the step before
};

}  // namespace offload
