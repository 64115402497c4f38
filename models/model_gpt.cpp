// SPDX-License-Identifier: MIT
// --model gpt: the GPT-style character LM of gpt.hpp (the model the tests
// and benchmarks use too) as a registered CharModel.

#include "char_model.hpp"
#include "gpt.hpp"
#include "registry.hpp"

namespace models {
namespace {

class Gpt final : public CharModel {
 public:
  explicit Gpt(const ModelShape& s)
      : model_(register_module("gpt", gpt::Model(gpt::Config{.vocab = s.vocab,
                                                             .layers = s.layers,
                                                             .width = s.width,
                                                             .heads = s.heads,
                                                             .seq = s.seq,
                                                             .checkpoint = s.checkpoint,
                                                             .planned = s.planned}))) {}

  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets) override {
    return model_->loss(tokens, targets);
  }

 private:
  gpt::Model model_;
};

[[maybe_unused]] const bool registered = register_model({
    .name = "gpt",
    .title = "GPT character LM",
    .help = "token and position embeddings, --layers pre-norm transformer blocks, LM head",
    .default_layers = 4,
    .uses_heads = true,
    .make = [](const ModelShape& s) -> std::shared_ptr<CharModel> { return std::make_shared<Gpt>(s); },
});

}  // namespace
}  // namespace models
