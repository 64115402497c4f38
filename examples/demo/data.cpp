// SPDX-License-Identifier: MIT

#include "data.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string_view>
#include <system_error>

namespace demo {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path, std::string_view flag) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw UsageError(std::string(flag) + ": '" + path + "' is a directory, expected a text file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(std::string(flag) + ": cannot read '" + path + "': " + std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw UsageError(std::string(flag) + ": error while reading '" + path + "'");
  return text;
}

}  // namespace

Corpus load_corpus(const Args& args) {
  Corpus c;
  std::string text;
  if (args.data) {
    text = read_file(*args.data, "--data");
    c.files.push_back(*args.data);
    if (text.empty()) {
      throw UsageError("--data: '" + *args.data +
                       "' is empty; expected text of at least --seq + 1 = " + std::to_string(args.seq + 1) + " bytes");
    }
  } else {
    std::error_code ec;
    std::vector<fs::path> paths;
    for (const auto& entry : fs::directory_iterator(default_data_dir, ec)) {
      if (entry.is_symlink(ec) || !entry.is_regular_file(ec)) continue;
      paths.push_back(entry.path());
    }
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
      text += read_file(p.string(), "default data");
      c.files.push_back(p.string());
    }
    if (text.empty()) {
      throw UsageError(std::string("no --data given and ") + default_data_dir +
                       "/ has no readable text files; pass --data FILE");
    }
  }
  c.bytes = static_cast<std::int64_t>(text.size());
  if (c.bytes < args.seq + 1) {
    throw UsageError("--data: " + (args.data ? "'" + *args.data + "'" : std::string("the default text")) + " has " +
                     std::to_string(c.bytes) + " bytes; --seq " + std::to_string(args.seq) + " needs at least " +
                     std::to_string(args.seq + 1));
  }
  std::array<std::int64_t, 256> id{};
  std::array<bool, 256> seen{};
  for (const char ch : text) seen[static_cast<unsigned char>(ch)] = true;
  for (std::size_t b = 0; b < seen.size(); ++b) {
    if (!seen[b]) continue;
    id[b] = static_cast<std::int64_t>(c.vocab.size());
    c.vocab.push_back(static_cast<unsigned char>(b));
  }
  c.ids.reserve(text.size());
  for (const char ch : text) c.ids.push_back(id[static_cast<unsigned char>(ch)]);
  return c;
}

}  // namespace demo
