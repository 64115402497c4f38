// SPDX-License-Identifier: MIT
// Options::validate: every field of offload::option_fields against its range.

#include <cstdint>
#include <string_view>

#include <c10/util/Exception.h>

#include <offload/options.hpp>

namespace offload {

namespace {
void check_range(std::string_view field, std::int64_t value, Range range) {
  TORCH_CHECK_VALUE(range.contains(value), "offload::Options: ", field, " must be in [", range.lo, ", ", range.hi,
                    "], got ", value);
}
}  // namespace

void Options::validate() const {
  for (const auto& field : option_fields) check_range(field.name, this->*field.member, field.range);
}

}  // namespace offload
