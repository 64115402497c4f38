// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The analytical model of the demo GPT's device memory (models/gpt.hpp),
/// against which the memory and checkpoint benchmarks measure.
///
/// fp32 everywhere (4 bytes). P parameters; B batch, T seq, W width, H heads,
/// V vocab, L blocks. What one block saves for backward:
///   ln1: x, mean, rstd            BTW + 2BT
///   qkv: ln1(x)                   BTW
///   q @ k^T (bmm of copies)       2 BTW
///   masked_fill: mask             T^2 bytes (bool)
///   softmax: its result           BHT^2   (att @ v reuses it: same storage)
///   att @ v: v copy               BTW
///   proj: y                       BTW
///   ln2: h, mean, rstd            BTW + 2BT
///   fc: ln2(h)                    BTW
///   gelu: fc(...)                 4 BTW
///   out: gelu(...)                4 BTW
///   => A_blk = 4 (16 BTW + BHT^2 + 4 BT) + T^2 bytes.
/// Outside the blocks: token ids 8BT, positions 8T, ln_f 4(BTW + 2BT), head
/// input 4 BTW, log_softmax 4 BTV, targets 8BT.

#include <algorithm>
#include <cstdint>

#include <offload/options.hpp>

#include "gpt_trainer.hpp"

namespace bench {

/// The model's bytes, all in bytes but `params`.
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

inline Analysis analyse(const Shapes& s, const offload::Options& o) {
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

/// The least a step under `m` can peak at: 16P + W_blk (+ the window for Streamed).
inline std::int64_t floor_bytes(const Analysis& a, Mode m) {
  return a.state + a.working + (m == Mode::streamed ? a.window : 0);
}

}  // namespace bench
