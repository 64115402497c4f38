// SPDX-License-Identifier: MIT
#pragma once
// The character models offload-demo (--model NAME) and offload-bench
// (target, host) train by name. A model is one file, model_NAME.cpp, that
// defines a CharModel (char_model.hpp) and registers its ModelKind; nothing
// else names it. This header needs no LibTorch.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace models {

class CharModel;  // char_model.hpp

/// Shapes of one model. Every integer field is >= 1.
struct ModelShape {
  std::int64_t vocab;       ///< distinct tokens (bytes of the text)
  std::int64_t layers;      ///< transformer blocks or recurrent layers
  std::int64_t width;       ///< embedding and hidden width
  std::int64_t heads;       ///< attention heads (models with uses_heads only)
  std::int64_t seq;         ///< context length in tokens
  bool checkpoint = false;  ///< each block through offload::checkpoint (kinds with an empty no_checkpoint)
  bool planned = false;     ///< each block marked CheckpointOptions::planned (the same kinds)
};

/// One registered model: one --model choice of the demo.
struct ModelKind {
  std::string_view name;        ///< the value of --model
  std::string_view title;       ///< e.g. "GPT character LM": the report's and the plot's first words
  std::string_view help;        ///< one line for --help
  std::int64_t default_layers;  ///< --layers when not given
  bool uses_heads;              ///< reads --heads (and needs width % heads == 0)
  /// The model on the CPU, initialised from LibTorch's current seed.
  std::shared_ptr<CharModel> (*make)(const ModelShape& shape);
  /// Why --checkpoint does not apply to this model; empty when it does.
  std::string_view no_checkpoint = {};
};

/// Every registered model, sorted by name. Filled before main() runs.
const std::vector<ModelKind>& model_kinds();

/// The kind called `name`; throws std::out_of_range when none is.
const ModelKind& model_kind(std::string_view name);

/// Adds `kind` (from a model file's static initializer); returns true.
bool register_model(const ModelKind& kind);

}  // namespace models
