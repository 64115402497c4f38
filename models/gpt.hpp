// SPDX-License-Identifier: MIT
#pragma once
// A GPT-style character language model in LibTorch C++: token and position
// embeddings, pre-norm transformer blocks (causal self-attention, GELU MLP),
// a final LayerNorm and an LM head. Shared by the demo, the tests and the
// benchmarks.

#include <cmath>
#include <cstdint>
#include <limits>

#include <torch/torch.h>

#include <offload/checkpoint.hpp>

namespace gpt {

/// Shapes of the model. Every field must be >= 1 and width % heads == 0.
struct Config {
  std::int64_t vocab = 96;            ///< distinct tokens
  std::int64_t layers = 4;            ///< transformer blocks
  std::int64_t width = 128;           ///< embedding width (d_model)
  std::int64_t heads = 4;             ///< attention heads; width % heads == 0
  std::int64_t seq = 64;              ///< context length in tokens
  double dropout = 0.0;               ///< dropout probability in [0, 1)
  bool checkpoint = false;            ///< run each block through offload::checkpoint (saves only its input)
  std::int64_t checkpoint_first = 0;  ///< also checkpoint blocks [0, checkpoint_first) (the rest run as is)
  /// Every block through offload::checkpoint with CheckpointOptions::planned: the scope's manager (with a
  /// device-memory target) keeps, offloads or recomputes it.
  bool planned = false;
};

struct BlockImpl : torch::nn::Module {
  BlockImpl(const Config& c)
      : heads(c.heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        qkv(register_module("qkv", torch::nn::Linear(c.width, 3 * c.width))),
        proj(register_module("proj", torch::nn::Linear(c.width, c.width))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        fc(register_module("fc", torch::nn::Linear(c.width, 4 * c.width))),
        out(register_module("out", torch::nn::Linear(4 * c.width, c.width))),
        drop(register_module("drop", torch::nn::Dropout(c.dropout))) {}

  /// x: [batch, time, width] -> [batch, time, width]
  torch::Tensor forward(const torch::Tensor& x) {
    const auto b = x.size(0), t = x.size(1), w = x.size(2), hd = w / heads;
    auto parts = qkv(ln1(x)).split(w, 2);
    auto q = parts[0].view({b, t, heads, hd}).transpose(1, 2);
    auto k = parts[1].view({b, t, heads, hd}).transpose(1, 2);
    auto v = parts[2].view({b, t, heads, hd}).transpose(1, 2);
    auto att = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
    auto mask = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    // -inf, not a large negative number: representable in fp16 and bf16 too;
    // softmax gives the masked positions exactly 0 either way.
    att = drop(torch::softmax(att.masked_fill(mask, -std::numeric_limits<double>::infinity()), -1));
    auto y = att.matmul(v).transpose(1, 2).contiguous().view({b, t, w});
    auto h = x + drop(proj(y));
    return h + drop(out(torch::gelu(fc(ln2(h)))));
  }

  std::int64_t heads;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc, out;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

struct ModelImpl : torch::nn::Module {
  explicit ModelImpl(const Config& c)
      : config(c),
        tok(register_module("tok", torch::nn::Embedding(c.vocab, c.width))),
        pos(register_module("pos", torch::nn::Embedding(c.seq, c.width))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.width})))),
        head(register_module("head", torch::nn::Linear(c.width, c.vocab))) {
    for (std::int64_t i = 0; i < c.layers; ++i) blocks->push_back(Block(c));
  }

  /// idx: [batch, time] int64 tokens -> logits [batch, time, vocab]
  torch::Tensor forward(const torch::Tensor& idx) {
    const auto t = idx.size(1);
    auto positions = torch::arange(t, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
    auto x = tok(idx) + pos(positions);
    for (std::size_t i = 0; i < blocks->size(); ++i) {
      auto block = blocks->ptr<BlockImpl>(i);
      const auto index = static_cast<std::int64_t>(i);
      const bool checkpointed = config.checkpoint || config.planned || index < config.checkpoint_first;
      x = checkpointed
              ? offload::checkpoint_forward(block, x, {.name = "block " + std::to_string(i), .planned = config.planned})
              : block->forward(x);
    }
    return head(ln(x));
  }

  /// Mean cross-entropy of predicting targets [batch, time] from idx.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets) {
    auto logits = forward(idx);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  }

  Config config;
  torch::nn::Embedding tok, pos;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
};
TORCH_MODULE(Model);

}  // namespace gpt
