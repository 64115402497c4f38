// SPDX-License-Identifier: MIT
// --model lstm: a character LM of an embedding, a --layers torch::nn::LSTM
// (hidden size --width) and a linear LM head.

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/rnn.h>

#include "char_model.hpp"
#include "registry.hpp"

namespace models {
namespace {

class Lstm final : public CharModel {
 public:
  explicit Lstm(const ModelShape& s)
      : embed_(register_module("embed", torch::nn::Embedding(s.vocab, s.width))),
        lstm_(register_module(
            "lstm", torch::nn::LSTM(torch::nn::LSTMOptions(s.width, s.width).num_layers(s.layers).batch_first(true)))),
        head_(register_module("head", torch::nn::Linear(s.width, s.vocab))) {}

  /// tokens, targets: [batch, seq]; the LSTM starts from a zero state each step.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets) override {
    const auto hidden = std::get<0>(lstm_->forward(embed_(tokens)));  // [batch, seq, width]
    const auto logits = head_(hidden);                                // [batch, seq, vocab]
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  }

 private:
  torch::nn::Embedding embed_;
  torch::nn::LSTM lstm_;
  torch::nn::Linear head_;
};

[[maybe_unused]] const bool registered = register_model({
    .name = "lstm",
    .title = "LSTM character LM",
    .help = "embedding, a --layers torch::nn::LSTM of hidden size --width, LM head",
    .default_layers = 2,
    .uses_heads = false,
    .make = [](const ModelShape& s) -> std::shared_ptr<CharModel> { return std::make_shared<Lstm>(s); },
    .no_checkpoint = "--model lstm is one torch::nn::LSTM module whose layers run in one fused call, so there is "
                     "no block to recompute on its own; use --model gpt",
});

}  // namespace
}  // namespace models
