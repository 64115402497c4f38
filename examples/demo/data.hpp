// SPDX-License-Identifier: MIT
#pragma once
// offload-demo's training text: --data FILE, or the license texts the OS ships.

#include <cstdint>
#include <string>
#include <vector>

#include "flags.hpp"

namespace demo {

/// The training text as token ids (one per byte) and where it came from.
struct Corpus {
  std::vector<std::string> files;
  std::int64_t bytes = 0;
  std::vector<unsigned char> vocab;  ///< the distinct bytes, sorted; token id = index
  std::vector<std::int64_t> ids;     ///< one token id per byte of the text
};

/// Reads --data, or every regular file of default_data_dir in sorted order
/// (symbolic links such as GPL -> GPL-3 are skipped: they would repeat a
/// text). Throws UsageError when there is no usable text (fewer than
/// --seq + 1 bytes).
Corpus load_corpus(const Args& args);

}  // namespace demo
