// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Which optional torch-offload libraries this program has loaded, so that
/// messages list only what the program can use (liboffload_sim notes
/// itself as "sim" when it is loaded).

#include <string_view>

namespace offload::detail {

/// Records that the library `library` is loaded. Thread-safe; may run
/// during static initialization.
void note_linked(std::string_view library);

/// Whether note_linked(library) ran in this process. Thread-safe.
bool is_linked(std::string_view library) noexcept;

}  // namespace offload::detail
