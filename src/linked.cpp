// SPDX-License-Identifier: MIT
// Which optional libraries (liboffload_sim) this process loaded.

#include <algorithm>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <offload/detail/linked.hpp>

namespace offload {

namespace detail {
namespace {
std::mutex g_linked_mutex;
std::vector<std::string>& linked_names() {
  static auto* names = new std::vector<std::string>();  // never destroyed: read during static init too
  return *names;
}
}  // namespace

void note_linked(std::string_view library) {
  const std::lock_guard lock(g_linked_mutex);
  auto& names = linked_names();
  if (std::find(names.begin(), names.end(), library) == names.end()) names.emplace_back(library);
}

bool is_linked(std::string_view library) noexcept {
  const std::lock_guard lock(g_linked_mutex);
  const auto& names = linked_names();
  return std::find(names.begin(), names.end(), library) != names.end();
}
}  // namespace detail

}  // namespace offload
