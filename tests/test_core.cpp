// SPDX-License-Identifier: MIT
// Core suite on the CPU: options, scopes, pack rules and gradient parity
// through the real offload path (HostAsDevice treats CPU tensors as
// device tensors, so each is copied out and back).

#include "doctest.hpp"

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <offload/offload.hpp>

#include "harness.hpp"
#include "warnings.hpp"

namespace {

using HostManager = offload::Manager<harness::HostAsDevice, offload::storage::PageableHost, offload::sync::Blocking>;

std::string error_of(const offload::Options& options) {
  try {
    options.validate();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace

TEST_CASE("Options: defaults are valid and documented values") {
  offload::Options options;
  CHECK(options.min_offload_bytes == 1024);
  CHECK(options.max_fwd_stash == 5);
  CHECK(options.prefetch_depth == 2);
  CHECK(options.prefetch_bytes == 0);
  CHECK(options.pin_memory);
  CHECK(options.host_budget_bytes == 0);
  CHECK(options.device_target_bytes == 0);
  CHECK_NOTHROW(options.validate());
}

TEST_CASE("Options: every out-of-range field names itself, its value and the range") {
  struct Row {
    offload::Options options;
    std::string message;
  };
  const std::int64_t huge = (std::int64_t{1} << 50) + 1;
  const Row rows[] = {
      {{.min_offload_bytes = -1}, "offload::Options: min_offload_bytes must be in [0, 1125899906842624], got -1"},
      {{.min_offload_bytes = huge},
       "offload::Options: min_offload_bytes must be in [0, 1125899906842624], got 1125899906842625"},
      {{.max_fwd_stash = 0}, "offload::Options: max_fwd_stash must be in [1, 1024], got 0"},
      {{.max_fwd_stash = 1025}, "offload::Options: max_fwd_stash must be in [1, 1024], got 1025"},
      {{.prefetch_depth = -1}, "offload::Options: prefetch_depth must be in [0, 1024], got -1"},
      {{.prefetch_depth = 1025}, "offload::Options: prefetch_depth must be in [0, 1024], got 1025"},
      {{.prefetch_bytes = -1}, "offload::Options: prefetch_bytes must be in [0, 1125899906842624], got -1"},
      {{.prefetch_bytes = huge},
       "offload::Options: prefetch_bytes must be in [0, 1125899906842624], got 1125899906842625"},
      {{.host_budget_bytes = -5}, "offload::Options: host_budget_bytes must be in [0, 1125899906842624], got -5"},
      {{.device_target_bytes = -1}, "offload::Options: device_target_bytes must be in [0, 1125899906842624], got -1"},
      {{.device_target_bytes = huge},
       "offload::Options: device_target_bytes must be in [0, 1125899906842624], got 1125899906842625"},
  };
  for (const auto& row : rows) {
    CAPTURE(row.message);
    CHECK(error_of(row.options) == row.message);
  }
}

TEST_CASE("Manager: bad options throw c10::ValueError before anything is made") {
  CHECK_THROWS_AS(HostManager(offload::Options{.max_fwd_stash = 0}), c10::ValueError);
}

TEST_CASE("Scope: pack runs for every saved tensor inside a scope and never outside") {
  HostManager manager(offload::Options{.min_offload_bytes = 0});
  auto a = at::randn({8, 8}).requires_grad_();
  auto b = at::randn({8, 8}).requires_grad_();
  {
    auto loss = (a * b).sum();  // mul saves a and b; outside any scope
    loss.backward();
  }
  CHECK(manager.stats().tensors_seen == 0);
  {
    offload::Scope scope(manager);
    auto c = a * 2;             // c is not a leaf
    auto loss = (c * b).sum();  // saves c and b
    loss.backward();
  }
  const auto stats = manager.stats();
  CHECK(stats.tensors_seen == 2);
  CHECK(stats.passed_leaf == 1);        // b: a leaf that requires grad
  CHECK(stats.tensors_offloaded == 1);  // c
  CHECK(stats.tensors_reloaded == 1);
  CHECK(stats.bytes_offloaded == 8 * 8 * 4);
}

TEST_CASE("NoOffload: an opt-out region inside a scope, nested scopes: innermost wins") {
  HostManager outer(offload::Options{.min_offload_bytes = 0});
  HostManager inner(offload::Options{.min_offload_bytes = 0});
  auto a = at::randn({4, 4}).requires_grad_();
  offload::Scope scope(outer);
  {
    offload::NoOffload off;
    auto loss = (a * 2).exp().sum();
    loss.backward();
  }
  CHECK(outer.stats().tensors_seen == 0);
  {
    offload::Scope nested(inner);
    auto loss = (a * 2).exp().sum();
    loss.backward();
  }
  CHECK(outer.stats().tensors_seen == 0);
  CHECK(inner.stats().tensors_seen >= 1);
  auto loss = (a * 2).exp().sum();
  loss.backward();
  CHECK(outer.stats().tensors_seen >= 1);
}

TEST_CASE("Scope: backward after the scope closed and after the manager is gone") {
  auto a = at::randn({16, 16}).requires_grad_();
  // The manager lives only for the forward pass: backward runs after the
  // Scope closed and the manager was destroyed.
  const auto grads = harness::grads_plain_and_wrapped(
      a, [](const at::Tensor& t) { return (t * 3).sin().sum(); },
      [](const harness::Forward& forward) {
        HostManager manager(offload::Options{.min_offload_bytes = 0});
        offload::Scope scope(manager);
        auto loss = forward();
        CHECK(manager.stats().tensors_offloaded == 1);
        return loss;
      });
  CHECK(at::equal(grads.wrapped, grads.plain));
}

TEST_CASE("Scope: close() on another thread is an error, the owner can close it") {
  HostManager manager;
  offload::Scope scope(manager);
  std::string message;
  std::thread([&] {
    try {
      scope.close();
    } catch (const c10::Error& e) {
      message = e.what_without_backtrace();
    }
  }).join();
  CHECK(message.find("must be closed on the thread that opened it") != std::string::npos);
  CHECK_NOTHROW(scope.close());
}

TEST_CASE("Pack rules: other device types, small tensors, excluded storages pass through untouched") {
  using SimManager = offload::Manager<offload::device::Sim, offload::storage::PageableHost, offload::sync::Blocking>;
  SimManager sim_manager(offload::Options{.min_offload_bytes = 0});
  auto a = at::randn({64}).requires_grad_();
  at::Tensor saved_cpu;
  {
    offload::Scope scope(sim_manager);
    auto h = a * 1;
    auto loss = (h * h).sum();
    loss.backward();
  }
  CHECK(sim_manager.stats().passed_other_device == 2);
  CHECK(sim_manager.stats().tensors_offloaded == 0);

  HostManager small(offload::Options{.min_offload_bytes = 1 << 20});
  {
    offload::Scope scope(small);
    auto h = a * 1;
    (h * h).sum().backward();
  }
  CHECK(small.stats().passed_small == 2);

  HostManager excluding(offload::Options{.min_offload_bytes = 0});
  // A buffer the model registers that is not a parameter (an integer one:
  // a floating-point leaf would pass as a parameter before exclusion).
  auto buffer = at::randint(1, 4, {64});
  excluding.exclude({buffer});
  {
    offload::Scope scope(excluding);
    auto h = a * 1;
    (h * buffer).exp().sum().backward();  // mul saves buffer; exp saves its result
  }
  CHECK(excluding.stats().passed_excluded == 1);
  CHECK(excluding.stats().tensors_offloaded == 1);
}

TEST_CASE("Parity on the CPU path: MLP, transformer block and GPT, 3 AdamW steps, bitwise") {
  for (auto kind : {harness::ModelKind::mlp, harness::ModelKind::block, harness::ModelKind::gpt}) {
    CAPTURE(harness::name(kind));
    const auto plain = harness::train(kind, c10::Device(c10::kCPU), 3);
    HostManager manager(offload::Options{.min_offload_bytes = 0});
    const auto offloaded = harness::train(kind, c10::Device(c10::kCPU), 3, harness::with_scope(manager),
                                          [&](const std::vector<at::Tensor>& p) { manager.exclude(p); });
    std::string why;
    CHECK_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), why);
    CHECK(manager.stats().tensors_offloaded > 0);
    CHECK(manager.stats().passed_excluded + manager.stats().passed_leaf > 0);
  }
}

TEST_CASE("Parity harness can fail: a perturbed run is reported") {
  const auto plain = harness::train(harness::ModelKind::mlp, c10::Device(c10::kCPU), 2);
  auto perturbed = plain;
  perturbed.params[0] = perturbed.params[0].clone();
  perturbed.params[0].view(-1)[0].add_(1e-6);
  std::string why;
  CHECK_FALSE(harness::bitwise_equal(plain, perturbed, &why));
  CHECK(why.find("parameter 0") != std::string::npos);
}

namespace {
using harness::CollectWarnings;

std::string range_message(std::string_view field, offload::Range range, std::int64_t got) {
  return "offload::Options: " + std::string(field) + " must be in [" + std::to_string(range.lo) + ", " +
         std::to_string(range.hi) + "], got " + std::to_string(got);
}
}  // namespace

TEST_CASE("Options: offload::ranges are what validate() accepts, at both ends") {
  // Every integer field, through the one list validate() and the Python
  // binding read.
  for (const auto& f : offload::option_fields) {
    CAPTURE(f.name);
    for (auto ok : {f.range.lo, f.range.hi}) {
      offload::Options options;
      options.*f.member = ok;
      CHECK(error_of(options).empty());
    }
    for (auto bad : {f.range.lo - 1, f.range.hi + 1}) {
      offload::Options options;
      options.*f.member = bad;
      CHECK(error_of(options) == range_message(f.name, f.range, bad));
    }
  }
  // The documented numbers (docs/bad-input.md, the guide) are these ranges.
  CHECK(offload::ranges::min_offload_bytes.hi == std::int64_t{1} << 50);
  CHECK(offload::ranges::max_fwd_stash.hi == 1024);
}

TEST_CASE("Stats: operator<< prints every field of stat_fields, in order") {
  offload::Stats stats;
  std::int64_t value = 1;
  for (const auto& f : offload::stat_fields) stats.*f.member = value++;
  std::ostringstream out;
  out << stats;
  std::string expected;
  value = 1;
  for (const auto& f : offload::stat_fields) {
    if (!expected.empty()) expected += ' ';
    expected.append(f.name).append("=").append(std::to_string(value++));
  }
  CHECK(out.str() == expected);
}

TEST_CASE("Manager and AnyManager: describe() names the policies, the same on both") {
  HostManager manager(offload::Options{.min_offload_bytes = 0});
  CHECK(manager.describe() == "Manager<host-as-device, pageable_host, blocking>");
  const offload::AnyManager any = manager;
  CHECK(any.describe() == manager.describe());
  // make_hooks() hands out hooks bound to the manager (what a Scope does).
  auto a = at::randn({8, 8}).requires_grad_() * 1;  // an activation: not a leaf
  auto hooks = manager.make_hooks();
  REQUIRE(hooks != nullptr);
  {
    const c10::NoGradGuard no_grad;
    hooks->call_pack_hook(a);
  }
  CHECK(manager.stats().tensors_offloaded == 1);
  CHECK(at::equal(hooks->call_unpack_hook(), a));
}

TEST_CASE("Scope: one warning per manager when nothing saved was on its device type") {
  using SimManager = offload::Manager<offload::device::Sim, offload::storage::PageableHost, offload::sync::Blocking>;
  const auto off_device = [](const SimManager& manager) {
    auto a = at::randn({64}).requires_grad_();  // on the CPU: the model is not on the device
    offload::Scope scope(manager);
    auto loss = (a.exp() * a).sum();
    loss.backward();
  };
  CollectWarnings warnings;
  SimManager first;
  off_device(first);
  REQUIRE(warnings.messages.size() == 1);
  CHECK(warnings.messages[0].find("none was on a sim device") != std::string::npos);
  CHECK(warnings.messages[0].find("is the model (and its input) on the device?") != std::string::npos);
  off_device(first);  // once per manager
  CHECK(warnings.messages.size() == 1);
  SimManager second;
  off_device(second);
  CHECK(warnings.messages.size() == 2);
  // Its twin: tensors on the manager's device type, or none saved at all, warn nothing.
  HostManager host(offload::Options{.min_offload_bytes = 0});
  {
    auto a = at::randn({64}).requires_grad_();
    offload::Scope scope(host);
    (a.exp() * a).sum().backward();
  }
  {
    offload::Scope empty(SimManager{});
  }
  CHECK(warnings.messages.size() == 2);
}

TEST_CASE("Scope: one warning per manager for scopes closed out of order") {
  HostManager a;
  HostManager b;
  CollectWarnings warnings;
  auto outer = std::make_unique<offload::Scope>(a);
  auto inner = std::make_unique<offload::Scope>(b);
  outer.reset();  // closed before the scope opened after it
  inner.reset();
  REQUIRE(warnings.messages.size() == 1);
  CHECK(warnings.messages[0].find("close scopes innermost first") != std::string::npos);
  CHECK(warnings.messages[0].find(a.describe()) != std::string::npos);
  outer = std::make_unique<offload::Scope>(a);
  inner = std::make_unique<offload::Scope>(b);
  outer.reset();  // the same mistake with the same manager: said once
  inner.reset();
  CHECK(warnings.messages.size() == 1);
  {  // in order: no warning
    offload::Scope first(b);
    offload::Scope second(a);
  }
  CHECK(warnings.messages.size() == 1);
}

TEST_CASE("builtin_storages, builtin_syncs: the one list of the names programs pick policies by") {
  CHECK(offload::policy_names(offload::builtin_storages) ==
        std::vector<std::string>{"pinned_host", "pageable_host", "pinned_pool"});
  CHECK(offload::policy_names(offload::builtin_syncs) == std::vector<std::string>{"blocking", "streamed"});
  std::string seen;
  CHECK(offload::visit_policy_named(offload::builtin_storages, "pinned_pool",
                                    [&](auto t) { seen = decltype(t)::type::name; }));
  CHECK(seen == "pinned_pool");
  int calls = 0;
  CHECK_FALSE(offload::visit_policy_named(offload::builtin_syncs, "async", [&](auto) { ++calls; }));
  CHECK(calls == 0);
}
