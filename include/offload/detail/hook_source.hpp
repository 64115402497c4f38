// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The names the core uses for offload::ManagerInterface and
/// offload::ScopeMark (<offload/manager_interface.hpp>), and a hook source
/// that is not a manager.

#include <string>

#include <offload/manager_interface.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>

namespace offload::detail {

using HookSource = ManagerInterface;
using ScopeMark = offload::ScopeMark;

/// A hook source that is not a manager (a checkpointed block, a manager
/// whose policies failed their checks): the manager's parts of the
/// interface answer "nothing" (no statistics, nothing excluded, default
/// options). Subclasses give make_hooks().
class NullSource : public HookSource {
 public:
  std::string describe() const override { return {}; }
  Stats stats() const override { return {}; }
  void reset_stats() override {}
  void exclude(at::TensorList /*tensors*/) override {}
  const Options& options() const noexcept override { return options_; }

 private:
  Options options_;
};

}  // namespace offload::detail
