// SPDX-License-Identifier: MIT
// offload-bench sim, its last section: what sim's stream-order checking
// (offload::sim::Config::check_streams) costs a training step. The demo GPT
// (width 128, 2 blocks, 8 sequences of 64 tokens) offloaded with Streamed
// and PinnedHost, the same trainer stepped with checking off and on in
// turn, so that a loaded machine slows both alike.

#include "bench.hpp"

#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include <torch/nn/module.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../models/char_model.hpp"
#include "../models/registry.hpp"
#include "sim_training.hpp"

namespace bench {

Json checked_step_section(const Args& args) {
  const int pairs = args.quick ? 3 : 10;
  const c10::Device sim(c10::DeviceType::PrivateUse1, 0);
  torch::manual_seed(0);
  const models::ModelShape shape{.vocab = 64, .layers = 2, .width = 128, .heads = 4, .seq = 64};
  std::shared_ptr<models::CharModel> model = models::model_kind("gpt").make(shape);
  model->to(sim);
  const auto data = torch::randint(shape.vocab, {8, shape.seq + 1}, torch::kLong);
  const auto x = data.narrow(1, 0, shape.seq).to(sim);
  const auto y = data.narrow(1, 1, shape.seq).to(sim);
  std::optional<offload::AnyManager> manager(
      offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Streamed>(
          offload::Options{}));
  const bool was = offload::sim::config().check_streams;
  std::vector<double> off, on;
  {
    SimTrainer trainer(model->parameters(), [&] { return model->loss(x, y); }, manager);
    for (int i = 0; i < 2 * (pairs + 1); ++i) {
      offload::sim::synchronize(0);
      offload::sim::set_check_streams(i % 2 == 1);
      const double seconds = trainer.step().seconds;
      if (i >= 2) (i % 2 == 1 ? on : off).push_back(seconds * 1e3);
    }
  }
  offload::sim::synchronize(0);
  offload::sim::set_check_streams(was);
  const auto s_off = summarize(off);
  const auto s_on = summarize(on);
  std::cout << "\n## A training step with stream-order checking off and on\n\n"
            << "The demo GPT (width 128, 2 blocks, batch 8 x 64 tokens), Streamed + PinnedHost, default link; " << pairs
            << " steps each, alternating (after one of each to warm up). Median ms per step: off "
            << fixed(s_off.median, 2) << ", on " << fixed(s_on.median, 2) << ", on / off "
            << fixed(s_on.median / s_off.median, 3) << "x. No target: shown to size CI.\n";
  return Json::object({{"model", Json("gpt width 128, 2 blocks, batch 8 x 64")},
                       {"off_ms", summary_json(s_off)},
                       {"on_ms", summary_json(s_on)},
                       {"on_over_off", Json(s_on.median / s_off.median)}});
}

}  // namespace bench
