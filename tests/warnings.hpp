// SPDX-License-Identifier: MIT
#pragma once
// CollectWarnings: the warnings c10 raises on this thread, for the tests
// that check what the library warns about.

#include <string>
#include <vector>

#include <c10/util/Exception.h>

namespace harness {

/// Collects the warnings c10 raises on this thread while alive.
struct CollectWarnings final : c10::WarningHandler {
  CollectWarnings() : guard_(this) {}
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
  std::vector<std::string> messages;

 private:
  c10::WarningUtils::WarningHandlerGuard guard_;
};

}  // namespace harness
