// SPDX-License-Identifier: MIT
// The parity suite: every manager type on the `sim` device, with copy delay
// and poisoning on, must give bitwise the losses and gradients of the run
// without offloading, for each class of saved tensor that broke the Python
// tools. Fault injection proves the suite can fail.

#include "doctest.hpp"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "faults.hpp"
#include "fixture.hpp"
#include "harness.hpp"

namespace {

using SimPinnedBlocking = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Blocking>;
using SimPageableBlocking =
    offload::Manager<offload::device::Sim, offload::storage::PageableHost, offload::sync::Blocking>;
using SimPinnedStreamed = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Streamed>;
using SimPageableStreamed =
    offload::Manager<offload::device::Sim, offload::storage::PageableHost, offload::sync::Streamed>;

/// The minimal complete sync policy: copy to the host, copy back, nothing
/// else (no step callback). It must pass every parity case.
struct CopyOnly {
  static constexpr std::string_view name = "copy_only";
  static constexpr bool needs_events = false;
  template <offload::device_policy Device>
  struct State {
    struct EntryState {};
    explicit State(const offload::Options& /*options*/) {}
    void offload(const offload::Transfer<EntryState>& t, const at::Tensor& device_bytes) {
      t.copy_to_host(device_bytes, /*non_blocking=*/false);
    }
    offload::Reloaded reload(const offload::Transfer<EntryState>& t) {
      auto bytes = t.empty_device_bytes();
      t.copy_to_device(bytes, /*non_blocking=*/false);
      return {bytes, /*copied=*/true};
    }
  };
};
using SimPinnedCopyOnly = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, CopyOnly>;

using fixture::sim0;
using fixture::sim1;
/// The copy delay of the parity cases (microseconds).
constexpr std::int64_t kDelayUs = 200;

template <class M>
bool is_streamed() {
  return std::is_same_v<typename M::sync_policy_type, offload::sync::Streamed>;
}

at::Tensor on(const at::Tensor& t, c10::Device d) { return t.to(d); }

}  // namespace

#define PARITY_TYPES SimPinnedBlocking, SimPageableBlocking, SimPinnedStreamed, SimPageableStreamed, SimPinnedCopyOnly

TEST_CASE_TEMPLATE("parity: MLP, transformer block, GPT on sim:0, 3 AdamW steps", M, PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  const int repeats = is_streamed<M>() ? 20 : 3;
  for (auto kind : {harness::ModelKind::mlp, harness::ModelKind::block, harness::ModelKind::gpt}) {
    CAPTURE(harness::name(kind));
    const auto plain = harness::train(kind, sim0, 3);
    for (int r = 0; r < repeats; ++r) {
      M manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 2, .prefetch_depth = 2});
      const auto offloaded = harness::train(kind, sim0, 3, harness::with_scope(manager),
                                            [&](const std::vector<at::Tensor>& p) { manager.exclude(p); });
      std::string why;
      REQUIRE_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), "repeat ", r, ": ", why);
      CHECK(manager.stats().storages_offloaded > 0);
      CHECK(manager.stats().tensors_reloaded + manager.stats().stash_reuses > 0);
    }
  }
}

TEST_CASE_TEMPLATE("parity: tensors on sim:1 come back on sim:1", M, PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  const auto plain = harness::train(harness::ModelKind::block, sim1, 2);
  M manager(offload::Options{.min_offload_bytes = 0});
  const auto offloaded = harness::train(harness::ModelKind::block, sim1, 2, harness::with_scope(manager));
  std::string why;
  CHECK_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), why);
  CHECK(manager.stats().storages_offloaded > 0);
  // a saved view unpacked in backward reports its device
  auto x = on(at::randn({32, 32}), sim1).requires_grad_();
  at::Tensor loss;
  {
    offload::Scope scope(manager);
    loss = (x * 2).exp().sum();
  }
  loss.backward();
  CHECK(x.grad().device() == sim1);
}

TEST_CASE_TEMPLATE("parity: views with offset, transposed, permuted, expanded, several views of one storage", M,
                   PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  auto w = on(at::randn({6, 8, 4}), sim0).requires_grad_();
  M manager(offload::Options{.min_offload_bytes = 0});
  auto run = [&](bool offload) {
    w.mutable_grad() = at::Tensor();
    std::optional<offload::Scope> scope;
    if (offload) scope.emplace(manager);
    auto base = w * 1.5;
    auto sliced = base.narrow(0, 2, 3);      // storage offset
    auto transposed = base.transpose(0, 2);  // swapped strides
    auto permuted = base.permute({1, 2, 0});
    auto expanded = base.select(0, 1).unsqueeze(0).expand({5, 8, 4});  // stride 0
    auto loss = (sliced * sliced).sum() + (transposed.exp() * transposed).sum() + (permuted.sin() * permuted).sum() +
                (expanded * expanded).sum();
    scope.reset();
    loss.backward();
    return std::make_pair(loss.to(at::kCPU), w.grad().to(at::kCPU));
  };
  auto [plain_loss, plain_grad] = run(false);
  for (int r = 0; r < 5; ++r) {
    auto [off_loss, off_grad] = run(true);
    CHECK(at::equal(plain_loss, off_loss));
    CHECK(at::equal(plain_grad, off_grad));
  }
  const auto stats = manager.stats();
  CHECK(stats.tensors_aliased > 0);
  // each storage comes back once per backward pass, however many views of it were saved
  CHECK(stats.reloads_shared > 0);
  CHECK(stats.tensors_reloaded + stats.stash_reuses <= stats.storages_offloaded);
}

TEST_CASE_TEMPLATE("parity: a saved narrow view moves only its bytes; later views copy what is missing", M,
                   PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  auto w = on(at::randn({512, 512}), sim0).requires_grad_();
  SUBCASE("the narrow case: 16,384 of 1,048,576 bytes") {
    M manager;  // library defaults
    auto run = [&](bool offload) {
      w.mutable_grad() = at::Tensor();
      std::optional<offload::Scope> scope;
      if (offload) scope.emplace(manager);
      auto h = w * 2.0;
      auto v = h.narrow(1, 0, 8);
      auto loss = v.pow(2).sum();
      scope.reset();
      loss.backward();
      return std::make_pair(loss.to(at::kCPU), w.grad().to(at::kCPU));
    };
    auto [plain_loss, plain_grad] = run(false);
    auto [off_loss, off_grad] = run(true);
    CHECK(at::equal(plain_loss, off_loss));
    CHECK(at::equal(plain_grad, off_grad));
    const auto stats = manager.stats();
    CHECK(stats.bytes_offloaded == 16384);
    CHECK(stats.host_bytes_peak == 16384);
    CHECK(stats.host_bytes_in_use == 0);
  }
  SUBCASE("views of one storage reaching outside the first one's bytes") {
    M manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 1, .prefetch_depth = 1});
    auto run = [&](bool offload) {
      w.mutable_grad() = at::Tensor();
      std::optional<offload::Scope> scope;
      if (offload) scope.emplace(manager);
      auto h = w * 2.0;
      auto a = h.narrow(0, 100, 4);    // rows 100-103
      auto t1 = a.sin();               // another offloaded storage in between
      auto b = h.narrow(0, 98, 8);     // reaches out on both sides
      auto c = h.narrow(1, 500, 8);    // strided: 8 floats of every row
      auto d = h.t().narrow(0, 3, 2);  // two columns, transposed
      auto loss = (a * t1).sum() + b.pow(3).sum() + c.pow(2).sum() + d.exp().sum() + (d * d).sum();
      scope.reset();
      loss.backward();
      return std::make_pair(loss.to(at::kCPU), w.grad().to(at::kCPU));
    };
    auto [plain_loss, plain_grad] = run(false);
    for (int r = 0; r < 3; ++r) {
      auto [off_loss, off_grad] = run(true);
      CHECK(at::equal(plain_loss, off_loss));
      CHECK(at::equal(plain_grad, off_grad));
    }
    const auto stats = manager.stats();
    CHECK(stats.tensors_aliased > 0);
    CHECK(stats.host_bytes_in_use == 0);
  }
}

TEST_CASE_TEMPLATE("parity: a CPU tensor saved by a custom Function stays on the CPU", M, PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  const auto plain = harness::custom_function_saving_cpu(sim0);
  M manager(offload::Options{.min_offload_bytes = 0});
  const auto offloaded = harness::custom_function_saving_cpu(sim0, harness::with_scope(manager));
  CHECK(offloaded.cpu_saved_came_back_on == c10::Device(c10::kCPU));
  CHECK(at::equal(plain.grad, offloaded.grad));
  CHECK(manager.stats().passed_other_device >= 1);
  CHECK(manager.stats().storages_offloaded >= 1);
}

TEST_CASE_TEMPLATE("parity: parameters are never offloaded", M, PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  M manager(offload::Options{.min_offload_bytes = 0});
  harness::train(harness::ModelKind::mlp, sim0, 1, harness::with_scope(manager));
  const auto stats = manager.stats();
  CHECK(stats.passed_leaf >= 1);  // fc2's weight.t(), saved for fc2's input gradient (fc1's input needs none)
  CHECK(stats.storages_offloaded >= 1);
}

TEST_CASE_TEMPLATE("parity: a branch whose saved tensors are never unpacked releases everything", M, PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  M manager(offload::Options{.min_offload_bytes = 0});
  auto w1 = on(at::randn({64, 64}), sim0).requires_grad_();
  auto w2 = on(at::randn({64, 64}), sim0).requires_grad_();
  const auto device_before = harness::settled_device_bytes();
  for (int step = 0; step < 3; ++step) {
    offload::Scope scope(manager);
    auto used = (w1 * 2).exp().sum();
    auto unused = (w2 * 3).sin().sum();  // in the graph, never reached by backward
    auto grads = torch::autograd::grad({used + unused}, {w1});
    CHECK(at::equal(grads[0].to(at::kCPU), ((w1 * 2).exp() * 2).to(at::kCPU)));
  }
  offload::sim::synchronize();
  CHECK(manager.stats().host_bytes_in_use == 0);
  CHECK(manager.stats().storages_offloaded >= 6);  // both branches were offloaded each step
  CHECK(harness::settled_device_bytes() == device_before);
}

TEST_CASE_TEMPLATE("parity: retain_graph with two backward passes", M, PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  auto run = [&](const harness::Wrap& wrap) {
    auto w = on(at::randn({32, 32}), sim0).requires_grad_();
    harness::Forward forward = [&] { return (w * 1.5).exp().tanh().sum(); };
    auto loss = wrap ? wrap(forward) : forward();
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
    return w.grad().to(at::kCPU);
  };
  at::manual_seed(3);
  const auto plain = run({});
  M manager(offload::Options{.min_offload_bytes = 0});
  at::manual_seed(3);
  const auto offloaded = run(harness::with_scope(manager));
  CHECK(at::equal(plain, offloaded));
  CHECK(manager.stats().tensors_reloaded + manager.stats().stash_reuses >= 2);
}

TEST_CASE_TEMPLATE("parity: double backward (create_graph)", M, PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  auto run = [&](const harness::Wrap& wrap) {
    auto w = on(at::randn({32, 32}), sim0).requires_grad_();
    harness::Forward forward = [&] { return (w * 1.5).exp().tanh().sum(); };
    auto loss = wrap ? wrap(forward) : forward();
    auto g = torch::autograd::grad({loss}, {w}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    g.pow(2).sum().backward();
    return w.grad().to(at::kCPU);
  };
  at::manual_seed(4);
  const auto plain = run({});
  M manager(offload::Options{.min_offload_bytes = 0});
  at::manual_seed(4);
  const auto offloaded = run(harness::with_scope(manager));
  CHECK(at::equal(plain, offloaded));
  CHECK(manager.stats().storages_offloaded > 0);
  CHECK(manager.stats().tensors_reloaded + manager.stats().stash_reuses > 0);
}

TEST_CASE_TEMPLATE("parity: an in-place change to a saved tensor gives autograd's error", M, PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  M manager(offload::Options{.min_offload_bytes = 0});
  auto w = on(at::randn({16, 16}), sim0).requires_grad_();
  auto attempt = [&](bool offload) -> std::string {
    std::optional<offload::Scope> scope;
    if (offload) scope.emplace(manager);
    auto y = (w * 2).exp();
    y.add_(1);
    scope.reset();
    try {
      y.sum().backward();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "no error";
  };
  const auto plain = attempt(false);
  CHECK(plain.find("modified by an inplace operation") != std::string::npos);
  CHECK(attempt(true) == plain);
}

TEST_CASE_TEMPLATE("device memory drops by exactly the bytes reported as offloaded", M, PARITY_TYPES) {
  const fixture::Substrate substrate(kDelayUs);
  auto x = on(at::randn({128, 256}), sim0);
  auto w = on(at::randn({256, 256}), sim0).requires_grad_();
  auto forward = [&] { return x.mm(w).tanh().mm(w).sigmoid().sum(); };
  const auto base = harness::settled_device_bytes();
  at::Tensor plain_loss = forward();
  offload::sim::synchronize();
  const auto held_plain = offload::sim::device_memory(0).current_bytes - base;
  plain_loss = at::Tensor();

  M manager(offload::Options{.min_offload_bytes = 0});
  manager.exclude({x});  // the user holds the input: offloading it would free nothing
  at::Tensor loss;
  {
    offload::Scope scope(manager);
    loss = forward();
  }
  offload::sim::synchronize();
  const auto held_offloaded = offload::sim::device_memory(0).current_bytes - base;
  const auto stats = manager.stats();
  CHECK(stats.bytes_offloaded > 0);
  CHECK(held_plain - held_offloaded == stats.bytes_offloaded);
  loss.backward();
}

TEST_CASE_TEMPLATE("fault injection: a skipped wait or an early free breaks parity", M, PARITY_TYPES) {
  const fixture::Substrate substrate(/*latency_us=*/20000);
  const auto plain = harness::train(harness::ModelKind::mlp, sim0, 2);
  // One subcase per fault, so each can be run alone (-sc=...; the TSan canaries do).
  // The same policies, with faults::Faulty around the sync policy.
  using Faulty = offload::Manager<typename M::device_policy_type, typename M::storage_policy_type,
                                  faults::Faulty<typename M::sync_policy_type>>;
  auto check = [&](faults::Fault fault) {
    Faulty manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 1, .prefetch_depth = 1});
    const int fired_before = faults::fired();
    faults::arm(fault, 1000);
    harness::RunResult broken;
    bool threw = false;
    try {
      broken = harness::train(harness::ModelKind::mlp, sim0, 2, harness::with_scope(manager));
    } catch (const std::exception&) {
      threw = true;
    }
    faults::disarm();
    offload::sim::synchronize();
    CHECK(faults::fired() > fired_before);
    std::string why;
    CHECK((threw || !harness::bitwise_equal(plain, broken, &why)));
  };
  SUBCASE("skipped wait") { check(faults::Fault::skip_wait); }
  SUBCASE("early free") { check(faults::Fault::free_early); }
}

TEST_CASE("README usage snippet compiles, runs on sim and matches the run without it") {
  const fixture::Substrate substrate(kDelayUs);
  const auto run = harness::run_readme_snippet();
  CHECK(std::memcmp(&run.with_snippet, &run.without, sizeof(float)) == 0);
  CHECK(run.stats.storages_offloaded > 0);
  CHECK(run.stats.tensors_reloaded + run.stats.stash_reuses > 0);
}
