// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// detail::NullManager: a ManagerInterface that is not a manager (a
/// checkpointed block's hooks, a manager whose policies failed their
/// checks).

#include <string>

#include <ATen/core/TensorBody.h>
#include <c10/util/ArrayRef.h>

#include <offload/manager_interface.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>

namespace offload::detail {

/// A ManagerInterface whose manager parts answer "nothing": no statistics,
/// nothing excluded, default options. Subclasses give make_hooks().
class NullManager : public ManagerInterface {
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
