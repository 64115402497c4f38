// SPDX-License-Identifier: MIT
// Stats printing: every field of offload::stat_fields, in order.

#include <ostream>

#include <offload/stats.hpp>

namespace offload {

std::ostream& operator<<(std::ostream& os, const Stats& s) {
  const char* sep = "";
  for (const auto& field : stat_fields) {
    os << sep << field.name << '=' << s.*field.member;
    sep = " ";
  }
  return os;
}

}  // namespace offload
