// SPDX-License-Identifier: MIT
// offload-bench memory: peak sim device bytes of the demo GPT (4, 8, 16
// layers) without offloading, with sync::Blocking and with sync::Streamed,
// against the analytical floor (gpt_analysis.hpp).

#include <cstring>
#include <iostream>
#include <vector>

#include <c10/util/Exception.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../cli/stats_json.hpp"
#include "bench.hpp"
#include "gpt_analysis.hpp"
#include "gpt_trainer.hpp"
#include "mode_columns.hpp"

namespace bench {
namespace {

void print_intro(const Shapes& base, const offload::Options& options) {
  std::cout << "## Peak sim device memory of the demo model: none / Blocking / Streamed vs the floor\n\n"
            << "Model " << base.describe() << " (L = 4, 8, 16), fp32, AdamW; one training step measured after one "
            << "warm-up step (AdamW state exists). Options: " << describe(options)
            << " (the library defaults unless given). Parameters are excluded from offloading. Peaks are of the sim "
               "allocator "
            << "(offload::sim::device_memory(0).peak_bytes after reset_peak), per phase of the step.\n\n"
            << "floor = 16P (weights, grads, AdamW exp_avg + exp_avg_sq, 4 bytes each)\n"
            << "      + W_blk = 4 (max(12 BTW, 3 BHT^2) + BTW)   (one block's backward working set)\n"
            << "      + Streamed only: max_fwd_stash * s_max + max(prefetch_bytes, s_max) (prefetch_depth * s_max "
            << "when prefetch_bytes is 0), s_max = 4 max(4 BTW, BHT^2)\n"
            << "activation bytes (measured) = peak_none - 16P; removed = (peak_none - peak) / that.\n"
            << "A_blk (analytical saved bytes per block) = 4 (16 BTW + BHT^2 + 4 BT) + T^2.\n\n";
}

std::vector<Column> memory_columns() {
  return {
      text_column("L", "layers"),
      mode_column(),
      mib_column("peak", "peak_bytes"),
      unless_none(mib_column("floor", "floor_bytes")),
      unless_none(fixed_column("peak/floor", "", "peak_over_floor", 3, "x")),
      unless_none({"peak/(16P+W_blk)", "",
                   [](const Json& row) {
                     return fixed(static_cast<double>(integer(row, "peak_bytes")) /
                                      static_cast<double>(integer(row, "state_bytes_16P") +
                                                          integer(row, "working_set_bytes")),
                                  3) +
                            "x";
                   }}),
      unless_none({"act. removed", "",
                   [](const Json& row) { return fixed(100 * number(row, "activation_fraction_removed"), 1) + " %"; }}),
      phase_peaks_column(),
      unless_none(mib_column("offloaded", "bytes_offloaded", "MiB/step")),
      fixed_column("step", "s", "step_seconds", 2),
      loss_column(),
  };
}

/// The run without offloading at the same L, which the other modes' rows
/// are measured against (it runs first).
struct Baseline {
  std::int64_t peak = 0;
  float loss = 0;
};

/// One measured step of the GPT of `s` under `mode`: its row.
Json mode_row(const Shapes& s, const Analysis& a, Mode mode, const offload::Options& options, Baseline& none) {
  Trainer trainer(s, kSim, make_source<offload::device::Sim>(mode, options));
  TORCH_CHECK(trainer.parameters() == a.params, "offload-bench memory: analytical P=", a.params, " but the model has ",
              trainer.parameters(), " parameters");
  const auto m = measure_step(trainer);
  const auto peak = m.peak();
  const float loss = m.loss;
  const offload::Stats& st = m.stats;
  if (mode == Mode::none) none = {peak, loss};
  const auto fl = floor_bytes(a, mode);
  const double activation_bytes = static_cast<double>(none.peak - a.state);
  const double removed = mode == Mode::none ? 0.0 : static_cast<double>(none.peak - peak) / activation_bytes;
  const double ratio = static_cast<double>(peak) / static_cast<double>(fl);
  return Json::object({
      {"layers", Json(s.layers)},
      {"mode", Json(mode_key(mode))},
      {"peak_bytes", Json(peak)},
      {"peak_forward_bytes", Json(m.fwd)},
      {"peak_backward_bytes", Json(m.bwd)},
      {"peak_optimizer_bytes", Json(m.opt)},
      {"bytes_at_step_start", Json(m.before)},
      {"floor_bytes", Json(fl)},
      {"peak_over_floor", Json(ratio)},
      {"activation_bytes", Json(activation_bytes)},
      {"activation_fraction_removed", Json(removed)},
      {"params", Json(a.params)},
      {"state_bytes_16P", Json(a.state)},
      {"analytical_activation_bytes", Json(a.activations)},
      {"analytical_block_bytes", Json(a.act_block)},
      {"working_set_bytes", Json(a.working)},
      {"window_bytes", Json(mode == Mode::streamed ? a.window : 0)},
      {"bytes_offloaded", Json(st.bytes_offloaded)},
      {"tensors_offloaded", Json(st.tensors_offloaded)},
      {"passed_through", Json(st.passed_through())},
      {"stash_reuses", Json(st.stash_reuses)},
      {"step_seconds", Json(m.ns / 1e9)},
      {"loss", Json(static_cast<double>(loss))},
      {"loss_bitwise_equal_to_none", Json(std::memcmp(&loss, &none.loss, sizeof loss) == 0)},
      {"stats", offload_json::stats(st)},
  });
}

/// The target: at L = 16, Blocking and Streamed remove >= 90 % of the
/// activation bytes and peak <= 1.2x the floor.
bool target_met(const std::vector<Json>& rows) {
  for (const auto& row : rows) {
    if (integer(row, "layers") != 16 || row.at("mode") == "none") continue;
    if (number(row, "activation_fraction_removed") < 0.9 || number(row, "peak_over_floor") > 1.2) return false;
  }
  return true;
}

}  // namespace

int run_memory(const Args& args) {
  const Shapes base = shapes_from(args, wide_shape(args.quick ? 4 : 8, 0));
  const offload::Options options = options_from(args);
  std::vector<std::int64_t> layer_counts = {4, 8, 16};
  if (args.has("layers")) layer_counts = {args.get_int("layers", 16)};
  free_link();  // peaks do not depend on the link

  print_intro(base, options);
  std::vector<Json> rows;
  for (const auto layers : layer_counts) {
    Shapes s = base;
    s.layers = layers;
    const Analysis a = analyse(s, options);
    Baseline none;
    for (const Mode mode : {Mode::none, Mode::blocking, Mode::streamed})
      rows.push_back(mode_row(s, a, mode, options, none));
    std::cout << "L=" << layers << ": P=" << a.params << " (16P = " << mib(a.state) << " MiB), analytical "
              << "activations L*A_blk + A_top = " << mib(a.activations) << " MiB (A_blk = " << mib(a.act_block)
              << " MiB), W_blk = " << mib(a.working) << " MiB, Streamed window = " << mib(a.window) << " MiB\n";
  }
  std::cout << "\n";
  print_rows(memory_columns(), rows);
  const bool met = target_met(rows);
  std::cout << "\nTarget (L=16, Blocking and Streamed): >= 90 % of activation bytes removed and peak <= 1.2x floor: "
            << (met ? "met" : "MISSED") << "\n";
  auto fields = header(args, torch_version());
  fields.push_back({"shapes", Json(base.describe())});
  fields.push_back({"options", options_json(options)});
  fields.push_back(
      {"floor_formula", Json("16P + 4*(max(12BTW, 3BHT^2) + BTW) [+ max_fwd_stash * s_max + max(prefetch_bytes, "
                             "s_max) (prefetch_depth * s_max if prefetch_bytes = 0), s_max = 4*max(4BTW, BHT^2), "
                             "for Streamed]")});
  fields.push_back({"target", Json("L=16: activation_fraction_removed >= 0.9 and peak_over_floor <= 1.2")});
  fields.push_back({"target_met", Json(met)});
  fields.push_back({"rows", Json(rows)});
  write_result(args, "memory.json", fields);
  return 0;
}

}  // namespace bench
