// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The demo GPT (models/gpt.hpp) trained one step at a time, as the memory,
/// checkpoint, overlap and gpu benchmarks do: the modes they compare, the
/// model's shapes and the Options from the command line, the Trainer, and
/// one measured step on sim. gpt_trainer.cpp is the one offload-bench TU
/// with <torch/torch.h>; this header needs only c10 and the library's.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <c10/core/Device.h>

#include <offload/offload.hpp>

#include "bench.hpp"

namespace bench {

/// The simulated accelerator's first device.
inline const c10::Device kSim(c10::DeviceType::PrivateUse1, 0);

// ---------------------------------------------------------------- modes

/// How a run offloads: not at all, or through a Manager with sync::Blocking
/// or sync::Streamed (storage::PinnedHost either way).
enum class Mode { none, blocking, streamed };

/// "none", "Blocking", "Streamed": as the tables print it.
std::string mode_name(Mode m);
/// The JSON key of a mode: its name in lower case.
std::string mode_key(Mode m);

/// The manager of `mode` on `Device` (none for Mode::none).
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

// ---------------------------------------------------------------- the command line

/// Shapes of one benchmark model, from the command line.
struct Shapes {
  std::int64_t batch, seq, width, heads, vocab, layers;
  bool checkpoint = false;  ///< each block through offload::checkpoint
  std::string describe() const {
    return "B=" + std::to_string(batch) + " T=" + std::to_string(seq) + " W=" + std::to_string(width) +
           " H=" + std::to_string(heads) + " V=" + std::to_string(vocab) +
           (layers > 0 ? " L=" + std::to_string(layers) : std::string());
  }
};

/// The shape the memory, checkpoint and overlap benchmarks share: seq 128,
/// width 256, 8 heads, vocabulary 96 (saved tensors of 1-4 MiB).
Shapes wide_shape(std::int64_t batch, std::int64_t layers);

/// `d` with the shape flags given (--batch --seq --width --heads --vocab --layers).
Shapes shapes_from(const Args& args, Shapes d);

/// Options from the command line (--min-offload-bytes, --max-fwd-stash,
/// --prefetch-depth, --prefetch-bytes); the library defaults otherwise.
offload::Options options_from(const Args& args);
/// "min_offload_bytes=..., max_fwd_stash=..., ...": the four fields options_from() reads.
std::string describe(const offload::Options& o);
/// The same four fields as a JSON object.
Json options_json(const offload::Options& o);

// ---------------------------------------------------------------- training

/// One model, its AdamW and its manager; step() is one training step with
/// the forward and backward inside the manager's Scope (README usage).
class Trainer {
 public:
  /// The GPT of `shapes` from seed 0 on `device`, AdamW (lr 1e-3), one batch
  /// of random tokens; the parameters are excluded from `source`.
  Trainer(const Shapes& shapes, c10::Device device, std::optional<offload::AnyManager> source);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// One step; its loss. Phase hooks: called after the forward, after the backward.
  float step(const std::function<void()>& after_forward = {}, const std::function<void()>& after_backward = {});

  /// The model's parameter count (P).
  std::int64_t parameters() const;

  std::optional<offload::AnyManager> source;
  /// Zero the gradients in place instead of releasing them: the model's
  /// fixed memory (16P) is then allocated for the whole step.
  bool keep_grads = false;

 private:
  struct Model;  // the GPT, its optimizer and its batch
  std::unique_ptr<Model> model_;
};

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

MeasuredStep measure_step(Trainer& trainer);

}  // namespace bench
