// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// What Manager::exclude(module) takes: a torch::nn::Module (or a holder
/// or pointer of one), named by what it offers, so that the manager's
/// headers need not include LibTorch's module headers.

#include <concepts>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>

namespace offload::detail {

/// A module: its parameters and buffers, with those of every submodule
/// (torch::nn::Module::parameters(true), buffers(true)).
template <class M>
concept module_like = requires(const M& m) {
  { m.parameters(true) } -> std::convertible_to<std::vector<at::Tensor>>;
  { m.buffers(true) } -> std::convertible_to<std::vector<at::Tensor>>;
};

/// A module, or what points to one (a ModuleHolder such as `Linear`, a
/// std::shared_ptr<Module>).
template <class M>
concept module_or_holder =
    module_like<M> || requires(const M& m) { requires module_like<std::remove_cvref_t<decltype(*m)>>; };

/// The parameters (trainable and frozen) and buffers of `module` and its
/// submodules.
template <module_or_holder M>
std::vector<at::Tensor> module_tensors(const M& module) {
  if constexpr (module_like<M>) {
    std::vector<at::Tensor> out = module.parameters(true);
    std::vector<at::Tensor> buffers = module.buffers(true);
    out.insert(out.end(), buffers.begin(), buffers.end());
    return out;
  } else {
    return module_tensors(*module);
  }
}

}  // namespace offload::detail
