// SPDX-License-Identifier: MIT
#pragma once
// The interface every character model of the registry (registry.hpp)
// implements.

#include <torch/nn/module.h>

namespace models {

/// A character language model: a torch::nn::Module whose parameters the
/// demo and the benchmarks train with AdamW and whose loss they compute
/// inside the offload scope.
class CharModel : public torch::nn::Module {
 public:
  /// Mean cross-entropy (a scalar) of predicting `targets` from `tokens`;
  /// both [batch, seq] int64 token ids on the model's device.
  virtual torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets) = 0;
};

}  // namespace models
