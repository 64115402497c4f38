// SPDX-License-Identifier: MIT
// The demo GPT trained one step at a time (gpt_trainer.hpp). The one
// offload-bench TU with <torch/torch.h> (models/gpt.hpp).

#include "gpt_trainer.hpp"

#include <algorithm>
#include <cctype>

#include <torch/torch.h>

#include <offload/sim.hpp>

#include "../models/gpt.hpp"

namespace bench {

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

std::string mode_key(Mode m) {
  auto key = mode_name(m);
  key[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(key[0])));
  return key;
}

Shapes wide_shape(std::int64_t batch, std::int64_t layers) {
  return Shapes{.batch = batch, .seq = 128, .width = 256, .heads = 8, .vocab = 96, .layers = layers};
}

Shapes shapes_from(const Args& args, Shapes d) {
  return Shapes{args.get_int("batch", d.batch), args.get_int("seq", d.seq),     args.get_int("width", d.width),
                args.get_int("heads", d.heads), args.get_int("vocab", d.vocab), args.get_int("layers", d.layers)};
}

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

struct Trainer::Model {
  Model(const Shapes& s, c10::Device device)
      : gpt((torch::manual_seed(0), gpt::Model(gpt::Config{.vocab = s.vocab,
                                                           .layers = s.layers,
                                                           .width = s.width,
                                                           .heads = s.heads,
                                                           .seq = s.seq,
                                                           .checkpoint = s.checkpoint}))) {
    gpt->to(device);
    optimizer = std::make_unique<torch::optim::AdamW>(gpt->parameters(), torch::optim::AdamWOptions(1e-3));
    auto data = torch::randint(s.vocab, {s.batch, s.seq + 1}, torch::kLong);
    x = data.narrow(1, 0, s.seq).to(device);
    y = data.narrow(1, 1, s.seq).to(device);
  }

  gpt::Model gpt;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  torch::Tensor x, y;
};

Trainer::Trainer(const Shapes& shapes, c10::Device device, std::optional<offload::AnyManager> src)
    : source(std::move(src)), model_(std::make_unique<Model>(shapes, device)) {
  if (source) source->exclude(model_->gpt->parameters());
}

Trainer::~Trainer() = default;

float Trainer::step(const std::function<void()>& after_forward, const std::function<void()>& after_backward) {
  model_->optimizer->zero_grad(/*set_to_none=*/!keep_grads);
  torch::Tensor loss;
  {
    std::optional<offload::Scope> scope;
    if (source) scope.emplace(*source);
    loss = model_->gpt->loss(model_->x, model_->y);
    if (after_forward) after_forward();
    loss.backward();
  }
  if (after_backward) after_backward();
  model_->optimizer->step();
  return loss.item<float>();
}

std::int64_t Trainer::parameters() const {
  std::int64_t n = 0;
  for (const auto& p : model_->gpt->parameters()) n += p.numel();
  return n;
}

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

}  // namespace bench
