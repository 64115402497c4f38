// SPDX-License-Identifier: MIT
#pragma once
// offload::Stats as JSON, for the demo's --summary-json and the benchmarks'
// result files: one object with every counter of offload::stat_fields.

#include <nlohmann/json.hpp>

#include <offload/stats.hpp>

namespace offload_json {

/// {"tensors_seen": N, ...}: every counter of `stats`, in stat_fields order.
inline nlohmann::ordered_json stats(const offload::Stats& stats) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& field : offload::stat_fields) out[std::string(field.name)] = stats.*field.member;
  return out;
}

}  // namespace offload_json
