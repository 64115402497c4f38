// SPDX-License-Identifier: MIT
#pragma once
// The automatic plan's cost model (src/plan/cost_model.cpp): what one
// given choice per block costs, predicted from the measured blocks: the
// extra step time (recomputation and link time not hidden) and the
// device's peak. Used by the search (src/plan/search.cpp) and the
// controller (src/plan/controller.cpp). Plain C++, no state.

#include <offload/block_plan.hpp>

#include <cstdint>
#include <vector>

namespace offload::plan {

// What the model predicts for one choice per block.
struct Prediction {
  double extra_ns = 0;  // recomputation + link time not hidden
  double moved = 0;     // link time of every copy, ns (the tie-breaker)
  std::int64_t recomputed = 0;
  std::int64_t peak = 0;
};

// The prediction for `choices` (one per block of `blocks`), from the
// measuring step's peak `base_peak` and forward peak `forward_peak` (-1:
// not measured). `outside`: what is saved outside blocks; `outside_kept`:
// it stays on the device (else it is offloaded, as measured). `in_flight`:
// count what overlapping copies hold in forward (false: none, for a bound
// under the peak).
Prediction predict(const std::vector<BlockCost>& blocks, const LinkCost& link, std::int64_t base_peak,
                   std::int64_t forward_peak, const std::vector<BlockChoice>& choices, const OutsideCost& outside,
                   bool outside_kept, bool in_flight = true);

// Every block offloaded, as predict() has it; with `floor`, a bound under
// what that needs (cost_model.cpp says how).
Prediction offload_all(std::vector<BlockCost> blocks, const LinkCost& link, std::int64_t base_peak,
                       std::int64_t forward_peak, const OutsideCost& outside, bool floor);

// The predicted extra time of recomputing every block (search.cpp).
std::int64_t recompute_all_extra_ns(const std::vector<BlockCost>& blocks, const LinkCost& link,
                                    const OutsideCost& outside);

}  // namespace offload::plan
