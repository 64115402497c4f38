// SPDX-License-Identifier: MIT
// offload-bench: the benchmarks that train the demo model (models/gpt.hpp):
// peak device memory against the analytical floor, copy/compute overlap on
// sim, and the GPU run. The one translation unit with <torch/torch.h>.

#include "bench.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>

#include <c10/core/CachingDeviceAllocator.h>
#include <torch/torch.h>

#include <offload/config.hpp>
#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../models/gpt.hpp"

namespace bench {

namespace {

const c10::Device kSim(c10::DeviceType::PrivateUse1, 0);

enum class Mode { none, blocking, streamed };

std::string mode_name(Mode m) {
  switch (m) {
    case Mode::none:
      return "none";
    case Mode::blocking:
      return "Blocking";
    case Mode::streamed:
      return "Streamed";
  }
  return "?";
}
/// The JSON key of a mode: its name in lower case.
std::string mode_key(Mode m) {
  auto key = mode_name(m);
  key[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(key[0])));
  return key;
}

/// The mode a row's "mode" key names, as the tables print it.
std::string mode_name_of(const Json& row) {
  const auto key = row.at("mode").get<std::string>();
  for (const Mode m : {Mode::none, Mode::blocking, Mode::streamed})
    if (mode_key(m) == key) return mode_name(m);
  return key;
}

/// The "mode" column: mode_name_of().
Column mode_column() { return {"mode", "", mode_name_of}; }

/// The "loss" column: the row's loss, "(=)" when bitwise equal to the run
/// without offloading, "(DIFFERS)" otherwise.
Column loss_column() {
  return {"loss", "", [](const Json& row) {
            return fixed(number(row, "loss"), 6) +
                   (row.at("loss_bitwise_equal_to_none").get<bool>() ? " (=)" : " (DIFFERS)");
          }};
}

/// The "fwd/bwd/opt peak MiB" column: the peaks of the step's three phases.
Column phase_peaks_column() {
  return {"fwd/bwd/opt peak", "MiB", [](const Json& row) {
            return mib(integer(row, "peak_forward_bytes")) + " / " + mib(integer(row, "peak_backward_bytes")) + " / " +
                   mib(integer(row, "peak_optimizer_bytes"));
          }};
}

/// `column`, with "" in the rows of `mode` none.
Column unless_none(Column column) {
  auto cell = std::move(column.cell);
  column.cell = [cell](const Json& row) { return row.at("mode") == "none" ? std::string() : cell(row); };
  return column;
}

template <class Device>
std::optional<offload::AnyManager> make_source(Mode mode, const offload::Options& options) {
  using offload::storage::PinnedHost;
  switch (mode) {
    case Mode::none:
      return std::nullopt;
    case Mode::blocking:
      return offload::Manager<Device, PinnedHost, offload::sync::Blocking>(options);
    case Mode::streamed:
      return offload::Manager<Device, PinnedHost, offload::sync::Streamed>(options);
  }
  return std::nullopt;
}

/// Shapes of one benchmark model, from the command line.
struct Shapes {
  std::int64_t batch, seq, width, heads, vocab, layers;
  bool checkpoint = false;  ///< each block through offload::checkpoint
  gpt::Config config() const {
    return gpt::Config{
        .vocab = vocab, .layers = layers, .width = width, .heads = heads, .seq = seq, .checkpoint = checkpoint};
  }
  std::string describe() const {
    return "B=" + std::to_string(batch) + " T=" + std::to_string(seq) + " W=" + std::to_string(width) +
           " H=" + std::to_string(heads) + " V=" + std::to_string(vocab) +
           (layers > 0 ? " L=" + std::to_string(layers) : std::string());
  }
};

/// The shape the memory, checkpoint and overlap benchmarks share: seq 128,
/// width 256, 8 heads, vocabulary 96 (saved tensors of 1-4 MiB).
Shapes wide_shape(std::int64_t batch, std::int64_t layers) {
  return Shapes{.batch = batch, .seq = 128, .width = 256, .heads = 8, .vocab = 96, .layers = layers};
}

Shapes shapes_from(const Args& args, Shapes d) {
  return Shapes{args.get_int("batch", d.batch), args.get_int("seq", d.seq),     args.get_int("width", d.width),
                args.get_int("heads", d.heads), args.get_int("vocab", d.vocab), args.get_int("layers", d.layers)};
}

/// One model, its AdamW and its manager; step() is one training step with
/// the forward and backward inside the manager's Scope (README usage).
struct Trainer {
  Trainer(const Shapes& s, c10::Device device, std::optional<offload::AnyManager> src)
      : model((torch::manual_seed(0), gpt::Model(s.config()))), source(std::move(src)) {
    model->to(device);
    optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-3));
    auto data = torch::randint(s.vocab, {s.batch, s.seq + 1}, torch::kLong);
    x = data.narrow(1, 0, s.seq).to(device);
    y = data.narrow(1, 1, s.seq).to(device);
    if (source) source->exclude(model->parameters());
  }

  /// Phase hooks: called after the forward, after the backward.
  float step(const std::function<void()>& after_forward = {}, const std::function<void()>& after_backward = {}) {
    optimizer->zero_grad(/*set_to_none=*/!keep_grads);
    torch::Tensor loss;
    {
      std::optional<offload::Scope> scope;
      if (source) scope.emplace(*source);
      loss = model->loss(x, y);
      if (after_forward) after_forward();
      loss.backward();
    }
    if (after_backward) after_backward();
    optimizer->step();
    return loss.item<float>();
  }

  std::int64_t parameters() const {
    std::int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    return n;
  }

  gpt::Model model;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  torch::Tensor x, y;
  std::optional<offload::AnyManager> source;
  /// Zero the gradients in place instead of releasing them: the model's
  /// fixed memory (16P) is then allocated for the whole step.
  bool keep_grads = false;
};

// ---------------------------------------------------------------- the analytical model
//
// fp32 everywhere (4 bytes). P parameters; B batch, T seq, W width, H heads,
// V vocab, L blocks. What one block saves for backward (models/gpt.hpp):
//   ln1: x, mean, rstd            BTW + 2BT
//   qkv: ln1(x)                   BTW
//   q @ k^T (bmm of copies)       2 BTW
//   masked_fill: mask             T^2 bytes (bool)
//   softmax: its result           BHT^2   (att @ v reuses it: same storage)
//   att @ v: v copy               BTW
//   proj: y                       BTW
//   ln2: h, mean, rstd            BTW + 2BT
//   fc: ln2(h)                    BTW
//   gelu: fc(...)                 4 BTW
//   out: gelu(...)                4 BTW
//   => A_blk = 4 (16 BTW + BHT^2 + 4 BT) + T^2 bytes.
// Outside the blocks: token ids 8BT, positions 8T, ln_f 4(BTW + 2BT), head
// input 4 BTW, log_softmax 4 BTV, targets 8BT.
struct Analysis {
  std::int64_t params = 0;       // P
  std::int64_t state = 0;        // 16 P: weights, grads, AdamW exp_avg and exp_avg_sq
  std::int64_t act_block = 0;    // A_blk
  std::int64_t act_top = 0;      // outside the blocks
  std::int64_t activations = 0;  // L A_blk + A_top
  std::int64_t working = 0;      // W_blk
  std::int64_t largest = 0;      // s_max, the largest saved storage
  std::int64_t window = 0;       // Streamed: max_fwd_stash s_max + the prefetch window
};

// Options from the command line (--min-offload-bytes, --max-fwd-stash,
// --prefetch-depth, --prefetch-bytes); the library defaults otherwise.
offload::Options options_from(const Args& args) {
  const offload::Options d;
  return {.min_offload_bytes = args.get_int("min-offload-bytes", d.min_offload_bytes),
          .max_fwd_stash = args.get_int("max-fwd-stash", d.max_fwd_stash),
          .prefetch_depth = args.get_int("prefetch-depth", d.prefetch_depth),
          .prefetch_bytes = args.get_int("prefetch-bytes", d.prefetch_bytes)};
}

std::string describe(const offload::Options& o) {
  return "min_offload_bytes=" + std::to_string(o.min_offload_bytes) +
         ", max_fwd_stash=" + std::to_string(o.max_fwd_stash) + ", prefetch_depth=" + std::to_string(o.prefetch_depth) +
         ", prefetch_bytes=" + std::to_string(o.prefetch_bytes);
}

Json options_json(const offload::Options& o) {
  return Json::object({{"min_offload_bytes", Json(o.min_offload_bytes)},
                       {"max_fwd_stash", Json(o.max_fwd_stash)},
                       {"prefetch_depth", Json(o.prefetch_depth)},
                       {"prefetch_bytes", Json(o.prefetch_bytes)}});
}

Analysis analyse(const Shapes& s, const offload::Options& o) {
  const auto B = s.batch, T = s.seq, W = s.width, H = s.heads, V = s.vocab, L = s.layers;
  Analysis a;
  a.params = V * W + T * W + L * (12 * W * W + 13 * W) + 2 * W + W * V + V;
  a.state = 16 * a.params;
  a.act_block = 4 * (16 * B * T * W + B * H * T * T + 4 * B * T) + T * T;
  a.act_top = 8 * B * T + 8 * T + 4 * (2 * B * T * W + 2 * B * T + B * T * V) + 8 * B * T;
  a.activations = L * a.act_block + a.act_top;
  // The largest step of one block's backward: GELU backward (its saved input
  // 4BTW, the gradient arriving 4BTW and leaving 4BTW) or softmax backward
  // (result, gradient in and out: 3BHT^2), plus the residual-stream gradient
  // BTW that the block carries.
  a.working = 4 * (std::max(12 * B * T * W, 3 * B * H * T * T) + B * T * W);
  a.largest = 4 * std::max(4 * B * T * W, B * H * T * T);
  // The prefetch window: prefetch_bytes of buffers (at least one storage),
  // or prefetch_depth times the largest storage when prefetch_bytes is 0
  // (the logits, 4BTV, are left out: they come back first, and V is small).
  const auto prefetch = o.prefetch_bytes > 0 ? std::max(o.prefetch_bytes, a.largest) : o.prefetch_depth * a.largest;
  a.window = o.max_fwd_stash * a.largest + prefetch;
  return a;
}

std::int64_t floor_bytes(const Analysis& a, Mode m) {
  return a.state + a.working + (m == Mode::streamed ? a.window : 0);
}

/// One measured training step on sim:0 after a warm-up step (AdamW state
/// exists), with its peak device bytes per phase and the manager's counters
/// of that step.
struct MeasuredStep {
  std::int64_t fwd = 0, bwd = 0, opt = 0, before = 0;
  float loss = 0;
  double ns = 0;
  offload::Stats stats;
  std::int64_t peak() const { return std::max({fwd, bwd, opt}); }
};

MeasuredStep measure_step(Trainer& trainer) {
  trainer.step();  // warm-up: creates grads and AdamW state
  offload::sim::synchronize(0);
  if (trainer.source) trainer.source->reset_stats();
  MeasuredStep m;
  offload::sim::reset_peak(0);
  m.before = offload::sim::device_memory(0).current_bytes;
  m.ns = time_ns([&] {
    m.loss = trainer.step(
        [&] {
          m.fwd = offload::sim::device_memory(0).peak_bytes;
          offload::sim::reset_peak(0);
        },
        [&] {
          offload::sim::synchronize(0);
          m.bwd = offload::sim::device_memory(0).peak_bytes;
          offload::sim::reset_peak(0);
        });
    offload::sim::synchronize(0);
  });
  m.opt = offload::sim::device_memory(0).peak_bytes;
  if (trainer.source) m.stats = trainer.source->stats();
  return m;
}

}  // namespace

// ================================================================ memory

int run_memory(const Args& args) {
  const Shapes base = shapes_from(args, wide_shape(args.quick ? 4 : 8, 0));
  const offload::Options options = options_from(args);
  std::vector<std::int64_t> layer_counts = {4, 8, 16};
  if (args.has("layers")) layer_counts = {args.get_int("layers", 16)};
  free_link();  // peaks do not depend on the link

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

  const std::vector<Column> columns = {
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
  std::vector<Json> rows;
  bool target_met = true;
  for (const auto layers : layer_counts) {
    Shapes s = base;
    s.layers = layers;
    const Analysis a = analyse(s, options);
    std::int64_t peak_none = 0;
    float loss_none = 0;
    for (const Mode mode : {Mode::none, Mode::blocking, Mode::streamed}) {
      Trainer trainer(s, kSim, make_source<offload::device::Sim>(mode, options));
      TORCH_CHECK(trainer.parameters() == a.params, "offload-bench memory: analytical P=", a.params,
                  " but the model has ", trainer.parameters(), " parameters");
      const auto m = measure_step(trainer);
      const auto fwd = m.fwd, bwd = m.bwd, opt = m.opt, before = m.before, peak = m.peak();
      const float loss = m.loss;
      const double ns = m.ns;
      const offload::Stats& st = m.stats;
      if (mode == Mode::none) {
        peak_none = peak;
        loss_none = loss;
      }
      const auto fl = floor_bytes(a, mode);
      const double activation_bytes = static_cast<double>(peak_none - a.state);
      const double removed = mode == Mode::none ? 0.0 : static_cast<double>(peak_none - peak) / activation_bytes;
      const double ratio = static_cast<double>(peak) / static_cast<double>(fl);
      if (layers == 16 && mode != Mode::none && (removed < 0.9 || ratio > 1.2)) target_met = false;
      rows.push_back(Json::object({
          {"layers", Json(layers)},
          {"mode", Json(mode_key(mode))},
          {"peak_bytes", Json(peak)},
          {"peak_forward_bytes", Json(fwd)},
          {"peak_backward_bytes", Json(bwd)},
          {"peak_optimizer_bytes", Json(opt)},
          {"bytes_at_step_start", Json(before)},
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
          {"step_seconds", Json(ns / 1e9)},
          {"loss", Json(static_cast<double>(loss))},
          {"loss_bitwise_equal_to_none", Json(std::memcmp(&loss, &loss_none, sizeof loss) == 0)},
          {"stats", offload_json::stats(st)},
      }));
    }
    std::cout << "L=" << layers << ": P=" << a.params << " (16P = " << mib(a.state) << " MiB), analytical "
              << "activations L*A_blk + A_top = " << mib(a.activations) << " MiB (A_blk = " << mib(a.act_block)
              << " MiB), W_blk = " << mib(a.working) << " MiB, Streamed window = " << mib(a.window) << " MiB\n";
  }
  std::cout << "\n";
  print_rows(columns, rows);
  std::cout << "\nTarget (L=16, Blocking and Streamed): >= 90 % of activation bytes removed and peak <= 1.2x floor: "
            << (target_met ? "met" : "MISSED") << "\n";
  auto fields = header(args, torch_version());
  fields.push_back({"shapes", Json(base.describe())});
  fields.push_back({"options", options_json(options)});
  fields.push_back(
      {"floor_formula", Json("16P + 4*(max(12BTW, 3BHT^2) + BTW) [+ max_fwd_stash * s_max + max(prefetch_bytes, "
                             "s_max) (prefetch_depth * s_max if prefetch_bytes = 0), s_max = 4*max(4BTW, BHT^2), "
                             "for Streamed]")});
  fields.push_back({"target", Json("L=16: activation_fraction_removed >= 0.9 and peak_over_floor <= 1.2")});
  fields.push_back({"target_met", Json(target_met)});
  fields.push_back({"rows", Json(rows)});
  write_result(args, "memory.json", fields);
  return 0;
}

// ================================================================ checkpoint

int run_checkpoint(const Args& args) {
  const Shapes base = shapes_from(args, wide_shape(args.quick ? 4 : 8, 0));
  const offload::Options options = options_from(args);
  std::vector<std::int64_t> layer_counts = {4, 8, 16};
  if (args.has("layers")) layer_counts = {args.get_int("layers", 16)};
  free_link();  // memory and bytes moved, not the link's time
  const auto B = base.batch, T = base.seq, W = base.width, V = base.vocab;
  // s_in = 4BTW: a block input (the residual stream), what checkpoint +
  // offload moves. W_out = 4 (5 BTW + 4 W^2): the first node of a block's
  // backward (the MLP's output projection) with everything the block saved
  // still held: the block's output gradient, its input gradient, its weight
  // gradient.
  const std::int64_t s_in = 4 * B * T * W;
  const std::int64_t w_out = 4 * (5 * B * T * W + 4 * W * W);
  // Checkpoint + offload's prefetch window: the largest storage it offloads
  // is a block input or the head's log-softmax (4BTV).
  const std::int64_t s_ck = std::max(s_in, 4 * B * T * V);
  const std::int64_t window_ck =
      options.prefetch_bytes > 0 ? std::max(options.prefetch_bytes, s_ck) : options.prefetch_depth * s_ck;

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
            << "  checkpoint + offload A_blk + W_out + prefetch window of block inputs (" << mib(window_ck)
            << " MiB): independent of L\n"
            << "moved/step: bytes offloaded + bytes brought back in the measured step.\n\n";

  // A row that offloads nothing shows "-" for what it moved.
  const auto if_offloads = [](Column column) {
    auto cell = std::move(column.cell);
    column.cell = [cell](const Json& row) { return row.at("offloads").get<bool>() ? cell(row) : std::string("-"); };
    return column;
  };
  const std::vector<Column> columns = {
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
  std::vector<Json> rows;
  for (const auto layers : layer_counts) {
    Shapes s = base;
    s.layers = layers;
    const Analysis a = analyse(s, options);
    const std::int64_t prefetch = a.window - options.max_fwd_stash * a.largest;
    std::int64_t above_none = 0;
    float loss_none = 0;
    struct Case {
      const char* name;
      Mode mode;
      bool checkpoint;
      std::int64_t analytical;  // above fixed
    };
    const Case cases[] = {
        {"none", Mode::none, false, layers * a.act_block + w_out},
        {"offload", Mode::streamed, false,
         std::max(options.max_fwd_stash * a.largest + s_in, a.largest + prefetch + w_out)},
        {"checkpoint", Mode::none, true, (layers - 1) * s_in + a.act_block + w_out},
        {"checkpoint + offload", Mode::streamed, true, a.act_block + w_out + window_ck},
    };
    for (const auto& c : cases) {
      s.checkpoint = c.checkpoint;
      Trainer trainer(s, kSim, make_source<offload::device::Sim>(c.mode, options));
      trainer.keep_grads = true;
      const auto m = measure_step(trainer);
      const auto fwd = m.fwd, bwd = m.bwd, opt = m.opt, peak = m.peak(), fixed_bytes = m.before;
      const auto above = peak - fixed_bytes;
      const float loss = m.loss;
      const double ns = m.ns;
      const offload::Stats& st = m.stats;
      if (c.mode == Mode::none && !c.checkpoint) {
        above_none = above;
        loss_none = loss;
      }
      const bool same = std::memcmp(&loss, &loss_none, sizeof loss) == 0;
      const auto moved = st.bytes_offloaded + st.bytes_reloaded;
      const auto ratio = [](std::int64_t x, std::int64_t y) { return static_cast<double>(x) / static_cast<double>(y); };
      rows.push_back(Json::object({
          {"layers", Json(layers)},
          {"mode", Json(c.name)},
          {"offloads", Json(c.mode != Mode::none)},
          {"peak_bytes", Json(peak)},
          {"peak_forward_bytes", Json(fwd)},
          {"peak_backward_bytes", Json(bwd)},
          {"peak_optimizer_bytes", Json(opt)},
          {"fixed_bytes", Json(fixed_bytes)},
          {"state_bytes_16P", Json(a.state)},
          {"above_fixed_bytes", Json(above)},
          {"analytical_above_fixed_bytes", Json(c.analytical)},
          {"above_over_analytical", Json(ratio(above, c.analytical))},
          {"above_over_none", Json(ratio(above, above_none))},
          {"bytes_moved_per_step", Json(moved)},
          {"bytes_offloaded", Json(st.bytes_offloaded)},
          {"tensors_offloaded", Json(st.tensors_offloaded)},
          {"block_input_bytes_per_step", Json(layers * s_in)},
          {"step_seconds", Json(ns / 1e9)},
          {"loss", Json(static_cast<double>(loss))},
          {"loss_bitwise_equal_to_none", Json(same)},
          {"stats", offload_json::stats(st)},
      }));
    }
    std::cout << "L=" << layers << ": 16P = " << mib(a.state) << " MiB, A_blk = " << mib(a.act_block)
              << " MiB, W_out = " << mib(w_out) << " MiB, L s_in = " << mib(layers * s_in) << " MiB\n";
  }
  std::cout << "\n";
  print_rows(columns, rows);
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

// ================================================================ overlap

int run_overlap(const Args& args) {
  // The memory benchmark's shape at 4 layers (width 256, as the peers
  // benchmark's GPT). The smaller shape of earlier runs (--seq 64 --width
  // 128 --heads 4 --layers 8) saves 2 KiB-1 MiB tensors, a copy every ~0.2
  // ms of sim's compute, where the host's cost of waking sim's stream worker
  // per queued copy (an interrupt between cores, 10-20 us on a virtual
  // machine; a device launch wakes no thread) is several % of the step.
  const Shapes s = shapes_from(args, wide_shape(8, 4));
  const std::int64_t latency = args.get_int("latency-us", offload::sim::Config{}.copy_latency_us);
  const int rounds = static_cast<int>(args.get_int("rounds", args.quick ? 3 : 15));
  const auto threads = static_cast<int>(args.get_int("threads", 1));
  at::set_num_threads(threads);  // compute on one core, sim's stream workers on the other
  // The library defaults (no tuning) unless flags say otherwise.
  const offload::Options options = options_from(args);
  const std::vector<Mode> modes = {Mode::none, Mode::blocking, Mode::streamed};
  // R = (bytes moved per step / bandwidth) / forward compute time; R = 0 is
  // a free link (no latency, the largest bandwidth): sim's and the
  // library's machinery alone.
  const std::vector<double> ratios = {0.0, 0.25, 0.5, 1.0, 2.0};
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (const Mode m : modes)
    trainers.push_back(std::make_unique<Trainer>(s, kSim, make_source<offload::device::Sim>(m, options)));
  std::vector<std::vector<float>> history(modes.size());  // every loss of each mode's trainer, in order
  const auto step = [&](std::size_t i, const std::function<void()>& after_forward = {}) {
    history[i].push_back(trainers[i]->step(after_forward));
    offload::sim::synchronize(0);
  };

  // Calibration on a free link: the forward compute time (none), and the
  // bytes and copies Streamed moves per step.
  free_link();
  for (std::size_t i = 0; i < modes.size(); ++i) step(i);
  std::vector<double> forward_ms;
  for (int k = 0; k < 5; ++k) {
    const auto t0 = Clock::now();
    step(0, [&] { forward_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count()); });
  }
  auto& streamed = *trainers[2]->source;
  streamed.reset_stats();
  step(2);
  const auto moved = streamed.stats();
  const std::int64_t bytes = moved.bytes_offloaded + moved.bytes_reloaded;
  const std::int64_t copies = moved.storages_offloaded + moved.tensors_reloaded;
  const double t_forward = summarize(forward_ms).median;
  // 1 GB/s moves one byte per nanosecond.
  const auto bandwidth = [&](double r) {
    return r == 0 ? offload::sim::kMaxCopyBandwidthGbps
                  : std::min(offload::sim::kMaxCopyBandwidthGbps, static_cast<double>(bytes) / (r * t_forward * 1e6));
  };
  const auto link_ms = [&](double r) {
    return r == 0 ? 0.0 : static_cast<double>(copies * latency) / 1e3 + static_cast<double>(bytes) / bandwidth(r) / 1e6;
  };

  // Cells: none once, then (Blocking, Streamed) at every R. Every cell once
  // per round, in an order rotated each round, so that drift in the
  // machine's load hits every cell alike.
  struct Cell {
    std::size_t mode;
    double r;
  };
  std::vector<Cell> cells = {{0, 0.0}};
  for (const double r : ratios)
    for (std::size_t i = 1; i < modes.size(); ++i) cells.push_back({i, r});
  std::vector<std::vector<double>> times(cells.size());
  std::vector<std::vector<double>> cpu_times(cells.size());  // process CPU time: less inflated by other load
  std::vector<offload::Stats> stats(cells.size());
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t k = 0; k < cells.size(); ++k) {
      const std::size_t c = (k + static_cast<std::size_t>(round) * 3) % cells.size();
      const auto& cell = cells[c];
      if (cell.r == 0) {
        free_link();
      } else {
        offload::sim::set_copy_latency_us(latency);
        offload::sim::set_copy_bandwidth_gbps(bandwidth(cell.r));
      }
      auto& t = *trainers[cell.mode];
      if (t.source) t.source->reset_stats();
      double wall_ns = 0;
      cpu_times[c].push_back(cpu_ns([&] { wall_ns = time_ns([&] { step(cell.mode); }); }) / 1e6);
      times[c].push_back(wall_ns / 1e6);
      if (t.source) stats[c] = t.source->stats();
    }
  }
  offload::sim::set_copy_latency_us(offload::sim::Config{}.copy_latency_us);
  offload::sim::set_copy_bandwidth_gbps(offload::sim::Config{}.copy_bandwidth_gbps);

  std::vector<Summary> sum, cpu_sum;
  for (auto& v : times) sum.push_back(summarize(v));
  for (auto& v : cpu_times) cpu_sum.push_back(summarize(v));
  const auto median = [&](Mode m, double r) {
    for (std::size_t c = 0; c < cells.size(); ++c)
      if (modes[cells[c].mode] == m && (m == Mode::none || cells[c].r == r)) return sum[c].median;
    return 0.0;
  };
  const double t_none = median(Mode::none, 0);
  const auto hidden = [&](double r) {
    return (median(Mode::blocking, r) - median(Mode::streamed, r)) / (median(Mode::blocking, r) - t_none);
  };
  const double machinery = median(Mode::streamed, 0) / t_none - 1;
  const auto cpu_median = [&](Mode m, double r) {
    for (std::size_t c = 0; c < cells.size(); ++c)
      if (modes[cells[c].mode] == m && (m == Mode::none || cells[c].r == r)) return cpu_sum[c].median;
    return 0.0;
  };
  const double machinery_cpu = cpu_median(Mode::streamed, 0) / cpu_median(Mode::none, 0) - 1;
  const bool fit_low = median(Mode::streamed, 0.25) <= 1.05 * t_none && median(Mode::streamed, 0.5) <= 1.05 * t_none;
  const bool fit_one = hidden(1.0) >= 0.9;
  const bool fit_machinery = machinery <= 0.03;

  std::cout << "## Copy/compute overlap on sim by regime R = (bytes moved per step / bandwidth) / forward time\n\n"
            << "Model " << s.describe() << ", AdamW, " << threads << " intra-op thread (sim's stream workers "
            << "get the other core). Forward compute time (none, free link, median of 5) " << fixed(t_forward, 1)
            << " ms; Streamed moves " << mib(bytes) << " MiB in " << copies << " copies per step (D2H + H2D). "
            << "Link: latency " << latency << " us per copy, bandwidth chosen per R; R = 0 is a free link "
            << "(latency 0, " << offload::sim::kMaxCopyBandwidthGbps << " GB/s): the machinery alone. "
            << "Every copy, blocking or not, costs latency + bytes / bandwidth on its stream. Step time in ms: "
            << "median of " << rounds << " rounds (each runs every cell once, in a rotated order) after one "
            << "warm-up step per mode. Options: " << describe(options) << ".\n\n";
  const std::vector<Column> columns = {
      mode_column(),
      fixed_column("R", "", "R", 2),
      fixed_column("GB/s", "", "bandwidth_gbps", 3),
      fixed_column("link", "ms/step", "link_ms_per_step", 1),
      median_column("step", "ms", "step_ms", 1),
      iqr_column("IQR", "ms", "step_ms", 1),
      fixed_column("vs none", "", "ratio_vs_none", 3, "x"),
      median_column("CPU", "ms", "cpu_ms", 1),
      {"copies/step", "",
       [](const Json& row) {
         return has(row, "d2h_copies") ? std::to_string(integer(row, "d2h_copies") + integer(row, "h2d_copies"))
                                       : std::string();
       }},
      {"hidden", "",
       [](const Json& row) {
         return has(row, "fraction_hidden") ? fixed(100 * number(row, "fraction_hidden"), 1) + " %" : std::string();
       }},
  };
  std::vector<Json> rows;
  for (std::size_t c = 0; c < cells.size(); ++c) {
    const auto& cell = cells[c];
    const Mode m = modes[cell.mode];
    const bool link = m != Mode::none;
    Json row = Json::object({{"mode", Json(mode_key(m))},
                             {"step_ms", summary_json(sum[c])},
                             {"cpu_ms", summary_json(cpu_sum[c])},
                             {"ratio_vs_none", Json(sum[c].median / t_none)},
                             {"step_ms_each_round", Json(times[c])}});
    if (link) {
      row["R"] = cell.r;
      row["bandwidth_gbps"] = bandwidth(cell.r);
      row["latency_us"] = cell.r == 0 ? 0 : latency;
      row["link_ms_per_step"] = link_ms(cell.r);
      row["d2h_copies"] = stats[c].storages_offloaded;
      row["h2d_copies"] = stats[c].tensors_reloaded;
      row["bytes_moved"] = stats[c].bytes_offloaded + stats[c].bytes_reloaded;
      if (m == Mode::streamed && cell.r > 0) row["fraction_hidden"] = hidden(cell.r);
      row["stats"] = offload_json::stats(stats[c]);
    }
    rows.push_back(row);
  }
  print_rows(columns, rows);
  // Each trainer steps from the same seed on the same batch, so the k-th
  // loss of every mode must be bitwise the same.
  bool same_loss = true;
  for (const auto& h : history) {
    const auto n = std::min(h.size(), history[0].size());
    same_loss = same_loss && std::memcmp(h.data(), history[0].data(), n * sizeof(float)) == 0;
  }
  const auto verdict = [](bool ok) { return ok ? "met" : "MISSED"; };
  std::cout << "\nhidden = (t_blocking - t_streamed) / (t_blocking - t_none) at the same R.\n"
            << "Targets with the library defaults: Streamed <= 1.05x none at R = 0.25 and 0.5 ("
            << fixed(median(Mode::streamed, 0.25) / t_none, 3) << "x, "
            << fixed(median(Mode::streamed, 0.5) / t_none, 3) << "x: " << verdict(fit_low)
            << "); >= 90 % hidden at R = 1 (" << fixed(100 * hidden(1.0), 1) << " %: " << verdict(fit_one)
            << "); Streamed's machinery at R = 0 <= 3 % of the step (" << fixed(100 * machinery, 1)
            << " %: " << verdict(fit_machinery)
            << "; in process CPU time, every thread: " << fixed(100 * machinery_cpu, 1) << " %).\n"
            << "Losses of every step bitwise equal across modes: " << (same_loss ? "yes" : "NO") << "\n";
  auto fields = header(args, torch_version());
  fields.push_back({"shapes", Json(s.describe())});
  fields.push_back({"latency_us", Json(latency)});
  fields.push_back({"rounds", Json(rounds)});
  fields.push_back({"intra_op_threads", Json(threads)});
  fields.push_back({"options", options_json(options)});
  fields.push_back({"forward_ms", Json(t_forward)});
  fields.push_back({"bytes_moved_per_step", Json(bytes)});
  fields.push_back({"copies_per_step", Json(copies)});
  fields.push_back({"streamed_machinery_fraction_at_R0", Json(machinery)});
  fields.push_back({"streamed_machinery_cpu_fraction_at_R0", Json(machinery_cpu)});
  fields.push_back({"fraction_hidden_at_R1", Json(hidden(1.0))});
  fields.push_back({"targets", Json("streamed/none <= 1.05 at R = 0.25, 0.5; fraction_hidden >= 0.9 at R = 1; "
                                    "streamed machinery <= 0.03 at R = 0")});
  fields.push_back(
      {"targets_met",
       Json::object({{"low_R", Json(fit_low)}, {"R1_hidden", Json(fit_one)}, {"machinery", Json(fit_machinery)}})});
  fields.push_back({"losses_equal", Json(same_loss)});
  fields.push_back({"rows", Json(rows)});
  write_result(args, "overlap.json", fields);
  return 0;
}

// ================================================================ gpu

int run_gpu(const Args& args) {
#if OFFLOAD_HAS_CUDA
  if (!offload::device::Cuda::available()) {
    std::cerr << "offload-bench gpu: no CUDA device (this build has device::Cuda, but LibTorch sees no GPU)\n";
    return 3;
  }
  const c10::Device cuda(c10::DeviceType::CUDA, 0);
  const Shapes s =
      shapes_from(args, Shapes{.batch = 8, .seq = 512, .width = 1024, .heads = 16, .vocab = 96, .layers = 12});
  const int steps = static_cast<int>(args.get_int("steps", args.quick ? 3 : 10));
  const offload::Options options = options_from(args);
  auto* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
  const auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  auto sync = [] { torch::cuda::synchronize(0); };

  std::cout << "## GPU: " << args.get("gpu-name", "?") << "\n\nModel " << s.describe() << ", AdamW, median of " << steps
            << " steps after 2 warm-up steps.\n\n";
  const std::vector<Column> columns = {
      mode_column(),
      median_column("step", "ms", "step_ms", 1),
      iqr_column("IQR", "ms", "step_ms", 1),
      fixed_column("vs none", "", "ratio_vs_none", 3, "x"),
      mib_column("peak", "peak_bytes"),
      mib_column("offloaded", "bytes_offloaded", "MiB/step"),
      fixed_column("loss", "", "loss", 6),
  };
  std::vector<Json> rows;
  double t_none = 0;
  float loss_none = 0;
  for (const Mode mode : {Mode::none, Mode::blocking, Mode::streamed}) {
    Trainer trainer(s, cuda, make_source<offload::device::Cuda>(mode, options));
    trainer.step();
    trainer.step();
    sync();
    std::vector<double> ms;
    float loss = 0;
    allocator->resetPeakStats(0);
    for (int i = 0; i < steps; ++i) {
      if (trainer.source) trainer.source->reset_stats();
      ms.push_back(time_ns([&] {
                     loss = trainer.step();
                     sync();
                   }) /
                   1e6);
    }
    const auto peak = allocator->getDeviceStats(0).allocated_bytes[agg].peak;
    const auto st = trainer.source ? trainer.source->stats() : offload::Stats{};
    const auto sm = summarize(ms);
    if (mode == Mode::none) {
      t_none = sm.median;
      loss_none = loss;
    }
    rows.push_back(Json::object({{"mode", Json(mode_key(mode))},
                                 {"step_ms", summary_json(sm)},
                                 {"ratio_vs_none", Json(sm.median / t_none)},
                                 {"peak_bytes", Json(peak)},
                                 {"bytes_offloaded", Json(st.bytes_offloaded)},
                                 {"prefetches", Json(st.prefetches)},
                                 {"stash_reuses", Json(st.stash_reuses)},
                                 {"loss", Json(static_cast<double>(loss))},
                                 {"loss_bitwise_equal_to_none", Json(std::memcmp(&loss, &loss_none, sizeof loss) == 0)},
                                 {"stats", offload_json::stats(st)}}));
  }
  print_rows(columns, rows);

  // Copies: the policy's path (PinnedHost buffer, side stream, event) vs a
  // plain pinned copy_ on the current stream, same bytes.
  std::cout << "\nCopy GB/s (1 GB = 1e9 bytes), median of repeated copies:\n\n";
  const auto ratio_column = [](std::string policy, std::string plain) {
    return Column{"ratio", "", [policy, plain](const Json& row) {
                    return fixed(number(row, policy) / number(row, plain), 2) + "x";
                  }};
  };
  const std::vector<Column> copy_columns = {
      {"size", "", [](const Json& row) { return size_label(integer(row, "bytes")); }},
      fixed_column("D2H pinned copy_", "", "d2h_pinned_copy_gb_per_s", 2),
      fixed_column("D2H PinnedHost side stream", "", "d2h_policy_gb_per_s", 2),
      ratio_column("d2h_policy_gb_per_s", "d2h_pinned_copy_gb_per_s"),
      fixed_column("H2D pinned copy_", "", "h2d_pinned_copy_gb_per_s", 2),
      fixed_column("H2D PinnedHost side stream", "", "h2d_policy_gb_per_s", 2),
      ratio_column("h2d_policy_gb_per_s", "h2d_pinned_copy_gb_per_s"),
  };
  std::vector<Json> copy_rows;
  const auto side = offload::device::Cuda::side_stream(0);
  for (std::int64_t n = 1 << 20; n <= (std::int64_t{1} << 30); n *= 4) {
    auto dev = torch::empty({n}, torch::TensorOptions().dtype(torch::kByte).device(cuda)).fill_(1);
    auto plain = torch::empty({n}, torch::TensorOptions().dtype(torch::kByte).pinned_memory(true)).fill_(2);
    auto policy = offload::storage::PinnedHost{}.allocate({n, cuda, options.pin_memory});
    policy.bytes.fill_(3);
    auto measure = [&](const std::function<void()>& f) {
      std::vector<double> t;
      for (int r = 0; r < 12; ++r) {
        const double ns = time_ns(f);
        if (r >= 2) t.push_back(ns);
      }
      return static_cast<double>(n) / summarize(t).median;
    };
    auto on_side = [&](bool d2h) {
      c10::Event done(c10::DeviceType::CUDA);
      c10::Event ready(c10::DeviceType::CUDA);
      ready.record(offload::device::Cuda::current_stream(0));
      ready.block(side);
      {
        const c10::StreamGuard guard(side);
        if (d2h)
          policy.bytes.copy_(dev, true);
        else
          dev.copy_(policy.bytes, true);
        done.record(side);
      }
      done.synchronize();
    };
    const double d2h_plain = measure([&] {
      plain.copy_(dev, true);
      sync();
    });
    const double d2h_policy = measure([&] { on_side(true); });
    const double h2d_plain = measure([&] {
      dev.copy_(plain, true);
      sync();
    });
    const double h2d_policy = measure([&] { on_side(false); });
    copy_rows.push_back(Json::object({{"bytes", Json(n)},
                                      {"d2h_pinned_copy_gb_per_s", Json(d2h_plain)},
                                      {"d2h_policy_gb_per_s", Json(d2h_policy)},
                                      {"h2d_pinned_copy_gb_per_s", Json(h2d_plain)},
                                      {"h2d_policy_gb_per_s", Json(h2d_policy)},
                                      {"policy_pinned", Json(policy.pinned)}}));
  }
  print_rows(copy_columns, copy_rows);
  auto fields = header(args, torch_version());
  fields.push_back({"gpu", Json(args.get("gpu-name", "?"))});
  fields.push_back({"date", Json(args.get("date", ""))});
  fields.push_back({"shapes", Json(s.describe())});
  fields.push_back({"steps", Json(rows)});
  fields.push_back({"copies", Json(copy_rows)});
  write_result(args, args.get("file", "gpu.json"), fields);
  return 0;
#else
  std::cerr << "offload-bench gpu: no CUDA device support in this build (OFFLOAD_HAS_CUDA is 0: LibTorch "
               "without CUDA, or configured with -Dcuda=disabled)\n";
  (void)args;
  return 3;
#endif
}

}  // namespace bench
