// SPDX-License-Identifier: MIT
// The registry of the character models (registry.hpp).

#include "registry.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace models {
namespace {
std::vector<ModelKind>& registry() {
  static std::vector<ModelKind> kinds;
  return kinds;
}
}  // namespace

const std::vector<ModelKind>& model_kinds() { return registry(); }

const ModelKind& model_kind(std::string_view name) {
  for (const auto& kind : registry()) {
    if (kind.name == name) return kind;
  }
  throw std::out_of_range("no model '" + std::string(name) + "'");
}

bool register_model(const ModelKind& kind) {
  auto& kinds = registry();
  kinds.insert(std::upper_bound(kinds.begin(), kinds.end(), kind,
                                [](const ModelKind& a, const ModelKind& b) { return a.name < b.name; }),
               kind);
  return true;
}

}  // namespace models
