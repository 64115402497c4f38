// SPDX-License-Identifier: MIT
// The pack rule from C++ (docs/guide.md, "What is never offloaded"): a
// parameter is a leaf that requires grad (or a view of one) or what
// exclude() names; every other tensor with a storage of its own is an
// activation, also a leaf computed without grad (what a compiled region or
// a custom Function saves), the model input and a frozen layer's weight;
// a tensor without usable storage passes through, counted. On the CPU path
// (HostAsDevice: every CPU tensor is a "device" tensor).

#include "doctest.hpp"

#include <cstring>
#include <optional>

#include <torch/torch.h>

#include <ATen/FunctionalTensorWrapper.h>

#include <offload/offload.hpp>

#include "harness.hpp"

namespace {

using HostManager = offload::Manager<harness::HostAsDevice, offload::storage::PageableHost, offload::sync::Blocking>;

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

// The gradient of `w` for a loss that saves a leaf computed without grad
// (h), a non-leaf (y), the model input (x) and `w` itself.
at::Tensor grad_of_w(const at::Tensor& w, const at::Tensor& x, HostManager* manager) {
  std::optional<offload::Scope> scope;
  if (manager) scope.emplace(*manager);
  at::Tensor h;
  {
    const at::NoGradGuard no_grad;  // as AOTAutograd's compiled forward, or a custom Function's
    h = x.sin();
  }
  auto y = w * h;        // saves h (a leaf that does not require grad)
  auto z = (y * w) * x;  // saves y and w; then x (the model input)
  auto loss = z.sum();
  if (scope) scope->close();
  return torch::autograd::grad({loss}, {w})[0];
}

}  // namespace

TEST_CASE("pack rule: leaves computed without grad and the model input are activations; a parameter stays") {
  const auto w = at::randn({64, 64}).requires_grad_();
  const auto x = at::randn({64, 64});
  const auto plain = grad_of_w(w, x, nullptr);
  HostManager manager(offload::Options{.min_offload_bytes = 0});
  const auto offloaded = grad_of_w(w, x, &manager);
  CHECK(same_bits(plain, offloaded));
  const auto stats = manager.stats();
  CHECK(stats.tensors_seen == 4);
  CHECK(stats.passed_leaf == 1);        // w
  CHECK(stats.tensors_offloaded == 3);  // h, y and x
  CHECK(stats.passed_through() == 1);
  CHECK(stats.bytes_offloaded == 3 * 64 * 64 * 4);
}

TEST_CASE("pack rule: a view of a parameter stays (Linear saves weight.t()), a view of an activation goes") {
  HostManager manager(offload::Options{.min_offload_bytes = 0});
  auto w = at::randn({16, 16}).requires_grad_();
  auto a = at::randn({4, 16}).requires_grad_();
  {
    offload::Scope scope(manager);
    auto h = a * 2;
    auto loss = at::mm(h.t().contiguous().t(), w.t()).sum();  // saves a view of h and w.t()
    loss.backward();
  }
  const auto stats = manager.stats();
  CHECK(stats.passed_leaf == 1);
  CHECK(stats.tensors_offloaded == 1);
}

TEST_CASE("pack rule: exclude(module) keeps a module's parameters, frozen ones too, and its buffers") {
  torch::manual_seed(0);
  torch::nn::Linear frozen(32, 32);
  frozen->weight.requires_grad_(false);
  frozen->bias.requires_grad_(false);
  torch::nn::BatchNorm1d norm(32);
  const auto input = at::randn({8, 32}).requires_grad_();
  auto grad_of_input = [&](HostManager* manager) {
    std::optional<offload::Scope> scope;
    if (manager) scope.emplace(*manager);
    auto loss = norm(frozen(input * 1)).square().sum();  // addmm saves frozen's weight.t(); batch_norm its buffers
    if (scope) scope->close();
    return torch::autograd::grad({loss}, {input})[0];
  };
  const auto plain = grad_of_input(nullptr);

  // Not excluded: the frozen weight looks like any tensor computed without
  // grad, so it is offloaded (nothing is freed; gradients are the same).
  HostManager unexcluded(offload::Options{.min_offload_bytes = 0});
  CHECK(same_bits(plain, grad_of_input(&unexcluded)));
  const auto loose = unexcluded.stats();
  CHECK(loose.passed_excluded == 0);

  HostManager manager(offload::Options{.min_offload_bytes = 0});
  manager.exclude(frozen);  // a ModuleHolder
  manager.exclude(*norm);   // a Module: its parameters (they require grad anyway) and buffers
  offload::AnyManager any = manager;
  any.exclude(norm.ptr());  // a shared_ptr to a module, through AnyManager (already excluded: no change)
  CHECK(same_bits(plain, grad_of_input(&manager)));
  const auto stats = manager.stats();
  CHECK(stats.tensors_seen == loose.tensors_seen);
  CHECK(stats.passed_excluded >= 3);  // frozen.weight.t(), norm's running mean and variance
  CHECK(stats.tensors_offloaded == loose.tensors_offloaded - stats.passed_excluded);
  CHECK(stats.tensors_offloaded > 0);
}

TEST_CASE("pack rule: a tensor without usable storage passes through, counted (a functional tensor)") {
  HostManager manager(offload::Options{.min_offload_bytes = 0});
  const auto inner = at::randn({256});
  const auto functional = at::functionalization::impl::to_functional_tensor(inner);
  REQUIRE(functional.key_set().has(c10::DispatchKey::Functionalize));
  auto hooks = manager.make_hooks();
  {
    const at::NoGradGuard no_grad;
    hooks->call_pack_hook(functional);
  }
  const auto back = hooks->call_unpack_hook();
  CHECK(back.unsafeGetTensorImpl() == functional.unsafeGetTensorImpl());
  const auto stats = manager.stats();
  CHECK(stats.passed_subclass == 1);
  CHECK(stats.tensors_offloaded == 0);
  // The positive control: the tensor it wraps is offloaded.
  auto plain_hooks = manager.make_hooks();
  plain_hooks->call_pack_hook(inner);
  CHECK(manager.stats().tensors_offloaded == 1);
  CHECK(same_bits(plain_hooks->call_unpack_hook(), inner));
}

TEST_CASE("pack rule: pack_passing counts what the caller knows stays, and another device's tensor as such") {
  HostManager manager(offload::Options{.min_offload_bytes = 0});
  auto source = offload::interface_of(manager);
  const auto t = at::randn({64});
  auto parameter = source->pack_passing(t, offload::PassReason::parameter);
  auto subclass = source->pack_passing(t, offload::PassReason::subclass);
  auto excluded = source->pack_passing(t, offload::PassReason::excluded);
  auto undefined = source->pack_passing(at::Tensor(), offload::PassReason::parameter);
  CHECK(parameter->call_unpack_hook().unsafeGetTensorImpl() == t.unsafeGetTensorImpl());
  const auto stats = manager.stats();
  CHECK(stats.tensors_seen == 4);
  CHECK(stats.passed_leaf == 1);
  CHECK(stats.passed_subclass == 1);
  CHECK(stats.passed_excluded == 1);
  CHECK(stats.passed_other_device == 1);
  CHECK(stats.tensors_offloaded == 0);
}
