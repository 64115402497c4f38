// SPDX-License-Identifier: MIT
#pragma once
// The interface every offload-demo model implements (see models.hpp).

#include <torch/nn/module.h>

namespace demo {

/// A character language model: a torch::nn::Module whose parameters the
/// demo trains with AdamW and whose loss it computes inside the offload
/// scope.
class CharModel : public torch::nn::Module {
 public:
  /// Mean cross-entropy (a scalar) of predicting `targets` from `tokens`;
  /// both [batch, seq] int64 token ids on the model's device.
  virtual torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets) = 0;
};

}  // namespace demo
