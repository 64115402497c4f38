// SPDX-License-Identifier: MIT
// The automatic plan's search: plan_blocks(), the choice per block with
// the least predicted extra time whose predicted peak fits a limit, over
// the candidates the cost model (cost_model.hpp) prices.

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
namespace plan {

// The predicted extra time of recomputing every block (no choice fits
// under a limit of -1).
std::int64_t recompute_all_extra_ns(const std::vector<BlockCost>& blocks, const LinkCost& link,
                                    const OutsideCost& outside) {
  return plan_blocks(blocks, link, 0, -1, -1, outside).extra_ns;
}

}  // namespace plan

namespace {

using plan::predict;
using plan::Prediction;

// Whether a is the better of two predictions that both fit. Extra times
// within 1 ns are the same time (sums taken in another order: offloading
// one more block whose copies are hidden is not faster by a rounding);
// not transitive, so the winner may drift by a few ns with the order
// candidates are tried in, far below what the model can tell apart.
bool better(const Prediction& a, const Prediction& b) {
  if (std::abs(a.extra_ns - b.extra_ns) >= 1.0) return a.extra_ns < b.extra_ns;
  if (a.moved != b.moved) return a.moved < b.moved;
  return a.recomputed < b.recomputed;
}

// Blocks [0, first) get `a`, [first, first + second) get `b`, the rest keep.
std::vector<BlockChoice> split(std::size_t n, BlockChoice a, std::size_t first, BlockChoice b, std::size_t second) {
  std::vector<BlockChoice> out(n, BlockChoice::keep);
  std::fill_n(out.begin(), first, a);
  std::fill_n(out.begin() + static_cast<std::ptrdiff_t>(first), second, b);
  return out;
}

}  // namespace

std::ostream& operator<<(std::ostream& os, BlockChoice choice) {
  switch (choice) {
    case BlockChoice::keep:
      return os << "keep";
    case BlockChoice::offload:
      return os << "offload";
    case BlockChoice::recompute:
      return os << "recompute";
    case BlockChoice::recompute_input_kept:
      return os << "recompute (input kept)";
  }
  return os << "BlockChoice(" << static_cast<int>(choice) << ')';
}

BlockPlanResult plan_blocks(const std::vector<BlockCost>& blocks, const LinkCost& link, std::int64_t base_peak,
                            std::int64_t limit, std::int64_t forward_peak, const OutsideCost& outside) {
  const auto n = blocks.size();
  BlockPlanResult result;
  result.choices.assign(n, BlockChoice::recompute);
  const auto all = predict(blocks, link, base_peak, forward_peak, result.choices, outside, false);
  result.extra_ns = static_cast<std::int64_t>(all.extra_ns);
  result.peak_bytes = all.peak;
  result.fits = all.peak <= limit;
  bool found = false;
  Prediction best;
  const bool may_offload = link.bytes_per_ns > 0;
  const bool outside_too = outside.total() > 0;
  const auto consider_one = [&](const std::vector<BlockChoice>& choices) {
    for (const bool outside_kept : {false, true}) {
      if (outside_kept && !outside_too) break;
      const auto p = predict(blocks, link, base_peak, forward_peak, choices, outside, outside_kept);
      if (p.peak > limit || (found && !better(p, best))) continue;
      found = true;
      best = p;
      result.choices = choices;
      result.outside_kept = outside_kept;
    }
  };
  // Each candidate with the recomputed blocks' inputs offloaded, and kept.
  const auto consider = [&](std::vector<BlockChoice> choices) {
    auto kept = choices;
    std::replace(kept.begin(), kept.end(), BlockChoice::recompute, BlockChoice::recompute_input_kept);
    consider_one(choices);
    consider_one(kept);
  };
  for (std::size_t first = 0; first <= n; ++first) {
    for (std::size_t second = 0; first + second <= n; ++second) {
      consider(split(n, BlockChoice::recompute, first, BlockChoice::offload, second));
      if (may_offload && first > 0 && second > 0) {
        consider(split(n, BlockChoice::offload, first, BlockChoice::recompute, second));
      }
      if (!may_offload) break;  // second counts offloaded blocks
    }
  }
  if (!found) return result;  // every block recomputed, fits = false
  result.extra_ns = static_cast<std::int64_t>(best.extra_ns);
  result.peak_bytes = best.peak;
  result.fits = true;
  return result;
}

}  // namespace offload
