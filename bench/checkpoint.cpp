// SPDX-License-Identifier: MIT
// offload-bench checkpoint: sim device bytes above the demo GPT's fixed
// memory, and bytes moved per step, at 4, 8 and 16 layers: none / offload
// (Streamed) / checkpoint (each block through offload::checkpoint) /
// checkpoint + offload, against analytical values (gpt_analysis.hpp).

#include <algorithm>
#include <array>
#include <cstring>
#include <iostream>
#include <vector>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../cli/stats_json.hpp"
#include "bench.hpp"
#include "gpt_analysis.hpp"
#include "gpt_trainer.hpp"
#include "mode_columns.hpp"

namespace bench {
namespace {

/// What checkpointing adds to the analysis (gpt_analysis.hpp), in bytes.
struct CheckpointBytes {
  /// s_in = 4BTW: a block input (the residual stream), what checkpoint + offload moves.
  std::int64_t s_in = 0;
  /// W_out = 4 (5 BTW + 4 W^2): the first node of a block's backward (the
  /// MLP's output projection) with everything the block saved still held:
  /// the block's output gradient, its input gradient, its weight gradient.
  std::int64_t w_out = 0;
  /// Checkpoint + offload's prefetch window.
  std::int64_t window_ck = 0;
};

CheckpointBytes checkpoint_bytes(const Shapes& base, const offload::Options& options) {
  const auto B = base.batch, T = base.seq, W = base.width, V = base.vocab;
  CheckpointBytes c;
  c.s_in = 4 * B * T * W;
  c.w_out = 4 * (5 * B * T * W + 4 * W * W);
  // Checkpoint + offload's prefetch window: the largest storage it offloads
  // is a block input or the head's log-softmax (4BTV).
  const std::int64_t s_ck = std::max(c.s_in, 4 * B * T * V);
  c.window_ck = options.prefetch_bytes > 0 ? std::max(options.prefetch_bytes, s_ck) : options.prefetch_depth * s_ck;
  return c;
}

void print_intro(const Shapes& base, const offload::Options& options, const CheckpointBytes& c) {
  std::cout << "## Checkpoint + offload: sim device memory above the model's fixed memory, and bytes moved\n\n"
            << "Model " << base.describe() << " (L = 4, 8, 16), fp32, AdamW; one training step measured after one "
            << "warm-up step. Options: " << describe(options) << ". Manager: Streamed. Checkpoint: each block "
            << "through offload::checkpoint (models/gpt.hpp, Config::checkpoint). Gradients are zeroed in place "
            << "(zero_grad(set_to_none=false)), so the model's fixed memory (weights, grads, AdamW state: 16P) is "
            << "allocated for the whole step; fixed = sim bytes in use at the step's start (16P and the token "
            << "batch), above = peak - fixed: what the activations and their backward add.\n\n"
            << "analytical above fixed (A_blk as in `memory`; s_in = 4BTW, one block input; s_max = 4 max(4BTW, "
            << "BHT^2); W_out = 4 (5 BTW + 4 W^2), the MLP output projection's backward):\n"
            << "  none                 L A_blk + W_out                  (block L-1's backward: every block's "
            << "activations)\n"
            << "  offload              max(max_fwd_stash s_max + s_in, s_max + prefetch window + W_out)   (forward "
            << "stash; or the tensor in use, the prefetch window and the working set)\n"
            << "  checkpoint           (L-1) s_in + A_blk + W_out       (block L-1 recomputed, the other inputs on "
            << "the device)\n"
            << "  checkpoint + offload A_blk + W_out + prefetch window of block inputs (" << mib(c.window_ck)
            << " MiB): independent of L\n"
            << "moved/step: bytes offloaded + bytes brought back in the measured step.\n\n";
}

/// `column`, with "-" in a row that offloads nothing.
Column if_offloads(Column column) {
  auto cell = std::move(column.cell);
  column.cell = [cell](const Json& row) { return row.at("offloads").get<bool>() ? cell(row) : std::string("-"); };
  return column;
}

std::vector<Column> checkpoint_columns() {
  return {
      text_column("L", "layers"),
      text_column("mode", "mode"),
      mib_column("peak", "peak_bytes"),
      mib_column("fixed", "fixed_bytes"),
      mib_column("above fixed", "above_fixed_bytes"),
      mib_column("analytical", "analytical_above_fixed_bytes"),
      fixed_column("above/analytical", "", "above_over_analytical", 3, "x"),
      fixed_column("above vs none", "", "above_over_none", 3, "x"),
      phase_peaks_column(),
      if_offloads(mib_column("moved", "bytes_moved_per_step", "MiB/step")),
      if_offloads(text_column("tensors offloaded", "tensors_offloaded")),
      fixed_column("step", "s", "step_seconds", 2),
      loss_column(),
  };
}

/// One row of the table: how the blocks run, the manager, and the
/// analytical bytes above fixed.
struct Case {
  const char* name;
  Mode mode;
  bool checkpoint;
  std::int64_t analytical;  // above fixed
};

std::array<Case, 4> cases_at(std::int64_t layers, const Analysis& a, const offload::Options& options,
                             const CheckpointBytes& c) {
  const std::int64_t prefetch = a.window - options.max_fwd_stash * a.largest;
  return {{
      {"none", Mode::none, false, layers * a.act_block + c.w_out},
      {"offload", Mode::streamed, false,
       std::max(options.max_fwd_stash * a.largest + c.s_in, a.largest + prefetch + c.w_out)},
      {"checkpoint", Mode::none, true, (layers - 1) * c.s_in + a.act_block + c.w_out},
      {"checkpoint + offload", Mode::streamed, true, a.act_block + c.w_out + c.window_ck},
  }};
}

/// The run without checkpointing or offloading at the same L, which the
/// other rows are measured against (it runs first).
struct Baseline {
  std::int64_t above = 0;
  float loss = 0;
};

/// One measured step of the GPT of `s` as `c` says: its row.
Json case_row(Shapes s, const Case& c, const Analysis& a, const offload::Options& options, std::int64_t s_in,
              Baseline& none) {
  s.checkpoint = c.checkpoint;
  Trainer trainer(s, kSim, make_source<offload::device::Sim>(c.mode, options));
  trainer.keep_grads = true;
  const auto m = measure_step(trainer);
  const auto peak = m.peak(), fixed_bytes = m.before;
  const auto above = peak - fixed_bytes;
  const float loss = m.loss;
  const offload::Stats& st = m.stats;
  if (c.mode == Mode::none && !c.checkpoint) none = {above, loss};
  const bool same = std::memcmp(&loss, &none.loss, sizeof loss) == 0;
  const auto moved = st.bytes_offloaded + st.bytes_reloaded;
  const auto ratio = [](std::int64_t x, std::int64_t y) { return static_cast<double>(x) / static_cast<double>(y); };
  return Json::object({
      {"layers", Json(s.layers)},
      {"mode", Json(c.name)},
      {"offloads", Json(c.mode != Mode::none)},
      {"peak_bytes", Json(peak)},
      {"peak_forward_bytes", Json(m.fwd)},
      {"peak_backward_bytes", Json(m.bwd)},
      {"peak_optimizer_bytes", Json(m.opt)},
      {"fixed_bytes", Json(fixed_bytes)},
      {"state_bytes_16P", Json(a.state)},
      {"above_fixed_bytes", Json(above)},
      {"analytical_above_fixed_bytes", Json(c.analytical)},
      {"above_over_analytical", Json(ratio(above, c.analytical))},
      {"above_over_none", Json(ratio(above, none.above))},
      {"bytes_moved_per_step", Json(moved)},
      {"bytes_offloaded", Json(st.bytes_offloaded)},
      {"tensors_offloaded", Json(st.tensors_offloaded)},
      {"block_input_bytes_per_step", Json(s.layers * s_in)},
      {"step_seconds", Json(m.ns / 1e9)},
      {"loss", Json(static_cast<double>(loss))},
      {"loss_bitwise_equal_to_none", Json(same)},
      {"stats", offload_json::stats(st)},
  });
}

}  // namespace

int run_checkpoint(const Args& args) {
  const Shapes base = shapes_from(args, wide_shape(args.quick ? 4 : 8, 0));
  const offload::Options options = options_from(args);
  std::vector<std::int64_t> layer_counts = {4, 8, 16};
  if (args.has("layers")) layer_counts = {args.get_int("layers", 16)};
  free_link();  // memory and bytes moved, not the link's time
  const CheckpointBytes bytes = checkpoint_bytes(base, options);

  print_intro(base, options, bytes);
  std::vector<Json> rows;
  for (const auto layers : layer_counts) {
    Shapes s = base;
    s.layers = layers;
    const Analysis a = analyse(s, options);
    Baseline none;
    for (const auto& c : cases_at(layers, a, options, bytes))
      rows.push_back(case_row(s, c, a, options, bytes.s_in, none));
    std::cout << "L=" << layers << ": 16P = " << mib(a.state) << " MiB, A_blk = " << mib(a.act_block)
              << " MiB, W_out = " << mib(bytes.w_out) << " MiB, L s_in = " << mib(layers * bytes.s_in) << " MiB\n";
  }
  std::cout << "\n";
  print_rows(checkpoint_columns(), rows);
  auto fields = header(args, torch_version());
  fields.push_back({"shapes", Json(base.describe())});
  fields.push_back({"options", options_json(options)});
  fields.push_back({"grads", Json("zeroed in place (set_to_none=false): fixed memory allocated for the whole step")});
  fields.push_back(
      {"analytical", Json("above fixed: none L A_blk + W_out; offload max(max_fwd_stash s_max + s_in, s_max + prefetch "
                          "window + W_out); checkpoint (L-1) s_in + A_blk + W_out; checkpoint + offload A_blk + W_out "
                          "+ prefetch window of block inputs; s_in = 4BTW, W_out = 4 (5BTW + 4W^2)")});
  fields.push_back({"rows", Json(rows)});
  write_result(args, "checkpoint.json", fields);
  return 0;
}

}  // namespace bench
