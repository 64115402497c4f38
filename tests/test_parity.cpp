// SPDX-License-Identifier: MIT
// The parity suite: every manager type on the test device (OFFLOAD_TEST_DEVICE,
// sim by default: there with copy delay and poisoning on) must give bitwise
// the losses and gradients of the run without offloading, for each class of
// saved tensor that broke the Python tools. Fault injection (on sim) proves
// the suite can fail. The parity cases of saved views: test_views.cpp.

#include "doctest.hpp"

#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <offload/numa.hpp>
#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "faults.hpp"
#include "fixture.hpp"
#include "harness.hpp"

namespace {

using fixture::kParityDelayUs;

template <class M>
bool is_streamed() {
  return std::is_same_v<typename M::sync_policy_type, offload::sync::Streamed>;
}

at::Tensor on(const at::Tensor& t, c10::Device d) { return t.to(d); }

}  // namespace

FIXTURE_CASE_TEMPLATE("parity: MLP, transformer block, GPT on the test device, 3 AdamW steps", M,
                      FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  const int repeats = is_streamed<M>() ? 20 : 3;
  for (auto kind : {harness::ModelKind::mlp, harness::ModelKind::block, harness::ModelKind::gpt}) {
    CAPTURE(harness::name(kind));
    const auto plain = harness::train(kind, fixture::device0(), 3);
    for (int r = 0; r < repeats; ++r) {
      M manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 2, .prefetch_depth = 2});
      const auto offloaded = harness::train(kind, fixture::device0(), 3, harness::with_scope(manager),
                                            [&](const std::vector<at::Tensor>& p) { manager.exclude(p); });
      std::string why;
      REQUIRE_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), "repeat ", r, ": ", why);
      CHECK(manager.stats().storages_offloaded > 0);
      CHECK(manager.stats().tensors_reloaded + manager.stats().stash_reuses > 0);
    }
  }
}

FIXTURE_CASE_TEMPLATE("parity: tensors on a second device (sim:1; on CUDA the last one) come back on it", M,
                      FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  const auto plain = harness::train(harness::ModelKind::block, fixture::device1(), 2);
  M manager(offload::Options{.min_offload_bytes = 0});
  const auto offloaded = harness::train(harness::ModelKind::block, fixture::device1(), 2, harness::with_scope(manager));
  std::string why;
  CHECK_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), why);
  CHECK(manager.stats().storages_offloaded > 0);
  // a saved view unpacked in backward reports its device
  auto x = on(at::randn({32, 32}), fixture::device1()).requires_grad_();
  at::Tensor loss;
  {
    offload::Scope scope(manager);
    loss = (x * 2).exp().sum();
  }
  loss.backward();
  CHECK(x.grad().device() == fixture::device1());
}

FIXTURE_CASE_TEMPLATE("parity: a CPU tensor saved by a custom Function stays on the CPU", M, FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  const auto plain = harness::custom_function_saving_cpu(fixture::device0());
  M manager(offload::Options{.min_offload_bytes = 0});
  const auto offloaded = harness::custom_function_saving_cpu(fixture::device0(), harness::with_scope(manager));
  CHECK(offloaded.cpu_saved_came_back_on == c10::Device(c10::kCPU));
  CHECK(at::equal(plain.grad, offloaded.grad));
  CHECK(manager.stats().passed_other_device >= 1);
  CHECK(manager.stats().storages_offloaded >= 1);
}

FIXTURE_CASE_TEMPLATE("parity: parameters are never offloaded", M, FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  M manager(offload::Options{.min_offload_bytes = 0});
  harness::train(harness::ModelKind::mlp, fixture::device0(), 1, harness::with_scope(manager));
  const auto stats = manager.stats();
  CHECK(stats.passed_leaf >= 1);  // fc2's weight.t(), saved for fc2's input gradient (fc1's input needs none)
  CHECK(stats.storages_offloaded >= 1);
}

FIXTURE_CASE_TEMPLATE("parity: a branch whose saved tensors are never unpacked releases everything", M,
                      FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  M manager(offload::Options{.min_offload_bytes = 0});
  auto w1 = on(at::randn({64, 64}), fixture::device0()).requires_grad_();
  auto w2 = on(at::randn({64, 64}), fixture::device0()).requires_grad_();
  const auto device_before = harness::settled_device_bytes(fixture::device0());
  for (int step = 0; step < 3; ++step) {
    offload::Scope scope(manager);
    auto used = (w1 * 2).exp().sum();
    auto unused = (w2 * 3).sin().sum();  // in the graph, never reached by backward
    auto grads = torch::autograd::grad({used + unused}, {w1});
    CHECK(at::equal(grads[0].to(at::kCPU), ((w1 * 2).exp() * 2).to(at::kCPU)));
  }
  harness::synchronize(fixture::device0());
  CHECK(manager.stats().host_bytes_in_use == 0);
  CHECK(manager.stats().storages_offloaded >= 6);  // both branches were offloaded each step
  CHECK(harness::settled_device_bytes(fixture::device0()) == device_before);
}

FIXTURE_CASE_TEMPLATE("parity: retain_graph with two backward passes", M, FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  auto run = [&](const harness::Wrap& wrap) {
    auto w = on(at::randn({32, 32}), fixture::device0()).requires_grad_();
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

FIXTURE_CASE_TEMPLATE("parity: double backward (create_graph)", M, FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  auto run = [&](const harness::Wrap& wrap) {
    auto w = on(at::randn({32, 32}), fixture::device0()).requires_grad_();
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

FIXTURE_CASE_TEMPLATE("parity: an in-place change to a saved tensor gives autograd's error", M, FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  // The in-place change races with the copy that offloads the saved tensor
  // (the user error this case is about): sim's stream-order checker would
  // report that write-after-read before autograd's error could.
  if (fixture::target() == fixture::Target::sim) offload::sim::set_check_streams(false);
  M manager(offload::Options{.min_offload_bytes = 0});
  auto w = on(at::randn({16, 16}), fixture::device0()).requires_grad_();
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

FIXTURE_CASE_TEMPLATE("device memory drops by exactly the bytes reported as offloaded", M, FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  auto x = on(at::randn({128, 256}), fixture::device0());
  auto w = on(at::randn({256, 256}), fixture::device0()).requires_grad_();
  auto forward = [&] { return x.mm(w).tanh().mm(w).sigmoid().sum(); };
  const auto base = harness::settled_device_bytes(fixture::device0());
  at::Tensor plain_loss = forward();
  harness::synchronize(fixture::device0());
  const auto held_plain = harness::device_bytes(fixture::device0()) - base;
  plain_loss = at::Tensor();

  M manager(offload::Options{.min_offload_bytes = 0});
  manager.exclude({x});  // the user holds the input: offloading it would free nothing
  at::Tensor loss;
  {
    offload::Scope scope(manager);
    loss = forward();
  }
  harness::synchronize(fixture::device0());
  const auto held_offloaded = harness::device_bytes(fixture::device0()) - base;
  const auto stats = manager.stats();
  CHECK(stats.bytes_offloaded > 0);
  CHECK(held_plain - held_offloaded == stats.bytes_offloaded);
  loss.backward();
}

FIXTURE_CASE_TEMPLATE("fault injection: a skipped wait or an early free breaks parity" *
                          fixture::sim_only{"sim's copy latency and poisoning of freed memory make a fault visible"},
                      M, FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(/*latency_us=*/20000);
  const auto plain = harness::train(harness::ModelKind::mlp, fixture::sim0, 2);
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
      broken = harness::train(harness::ModelKind::mlp, fixture::sim0, 2, harness::with_scope(manager));
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

TEST_CASE("README usage snippet compiles, runs on sim and matches the run without it" *
          fixture::sim_only{"the README's snippet trains on sim"}) {
  const fixture::Substrate substrate(kParityDelayUs);
  const auto run = harness::run_readme_snippet();
  CHECK(std::memcmp(&run.with_snippet, &run.without, sizeof(float)) == 0);
  CHECK(run.stats.storages_offloaded > 0);
  CHECK(run.stats.tensors_reloaded + run.stats.stash_reuses > 0);
}

// storage::PinnedPool beyond the parity cases (which run it under Blocking
// and Streamed): its pieces, its slabs from step to step, what it holds
// after the graph is gone, and one pool shared by two managers on two
// threads.
namespace {

using PoolManager = fixture::Manager<offload::device::Sim, offload::storage::PinnedPool, offload::sync::Streamed>;

// Two layers on sim, leaves built from `seed` on the calling thread; the
// forward draws no random numbers (safe on two threads at once).
struct TwoLayers {
  at::Tensor x, w1, w2;
  explicit TwoLayers(int seed) {
    const auto generator = at::detail::createCPUGenerator(seed);
    x = at::randn({64, 96}, generator).to(fixture::sim0);
    w1 = (at::randn({96, 160}, generator) * 0.1).to(fixture::sim0).requires_grad_();
    w2 = (at::randn({160, 96}, generator) * 0.1).to(fixture::sim0).requires_grad_();
  }
  harness::RunResult train(int steps, const harness::Wrap& wrap = {}) const {
    const std::vector<at::Tensor> params{w1.detach().clone().requires_grad_(), w2.detach().clone().requires_grad_()};
    const auto forward = [this, &params] { return x.mm(params[0]).tanh().mm(params[1]).sigmoid().square().sum(); };
    return harness::train_params(params, forward, steps, wrap);
  }
};

}  // namespace

TEST_CASE("pinned pool: exact pieces, no fresh slab after the first step, nothing held once the graph is gone" *
          fixture::sim_only("the pool of sim:0 and sim's pinned allocator")) {
  const fixture::Substrate substrate(kParityDelayUs);
  const TwoLayers model(1);
  offload::storage::PinnedPool::trim(fixture::sim0);
  const auto before = offload::storage::PinnedPool::stats(fixture::sim0);
  PoolManager manager(offload::Options{.min_offload_bytes = 0});
  std::vector<std::int64_t> slabs_after_step;
  const auto at_step = [&](const harness::Forward& forward) {
    at::Tensor loss;
    {
      offload::Scope scope(manager);
      loss = forward();
    }
    // Every piece is its saved view's bytes rounded up to 64: what the
    // manager holds on the host, within 64 bytes per piece.
    const auto stats = manager.stats();
    const auto pool = offload::storage::PinnedPool::stats(fixture::sim0);
    CHECK(stats.host_bytes_in_use > 0);
    CHECK(pool.in_use_bytes - before.in_use_bytes >= stats.host_bytes_in_use);
    CHECK(pool.in_use_bytes - before.in_use_bytes <= stats.host_bytes_in_use + 64 * stats.storages_offloaded);
    slabs_after_step.push_back(pool.slab_allocations);
    return loss;
  };
  const auto pooled = model.train(3, at_step);
  std::string why;
  CHECK_MESSAGE(harness::bitwise_equal(model.train(3), pooled, &why), why);
  REQUIRE(slabs_after_step.size() == 3);
  CHECK(slabs_after_step[0] > before.slab_allocations);  // the first step pinned what it needed
  CHECK(slabs_after_step[1] == slabs_after_step[0]);     // later steps pinned nothing new
  CHECK(slabs_after_step[2] == slabs_after_step[0]);
  CHECK(manager.stats().host_bytes_in_use == 0);
  CHECK(offload::storage::PinnedPool::stats(fixture::sim0).in_use_bytes == before.in_use_bytes);
  // trim() returns what no buffer uses.
  offload::storage::PinnedPool::trim(fixture::sim0);
  CHECK(offload::storage::PinnedPool::stats(fixture::sim0).reserved_bytes == 0);
}

TEST_CASE("pinned pool: two managers on two threads share one pool, each bitwise" *
          fixture::sim_only("the pool of sim:0")) {
  const fixture::Substrate substrate(kParityDelayUs);
  const TwoLayers a(2), b(3);
  const auto plain_a = a.train(3);
  const auto plain_b = b.train(3);
  PoolManager first(offload::Options{.min_offload_bytes = 0});
  PoolManager second(offload::Options{.min_offload_bytes = 0});
  harness::RunResult got_a, got_b;
  std::thread ta([&] { got_a = a.train(3, harness::with_scope(first)); });
  std::thread tb([&] { got_b = b.train(3, harness::with_scope(second)); });
  ta.join();
  tb.join();
  std::string why;
  CHECK_MESSAGE(harness::bitwise_equal(plain_a, got_a, &why), why);
  CHECK_MESSAGE(harness::bitwise_equal(plain_b, got_b, &why), why);
  CHECK(first.stats().storages_offloaded > 0);
  CHECK(second.stats().storages_offloaded > 0);
  CHECK(first.stats().host_bytes_in_use == 0);
  CHECK(second.stats().host_bytes_in_use == 0);
  CHECK(offload::storage::PinnedPool::stats(fixture::sim0).in_use_bytes == 0);
}

namespace {
// sim, attached (as this device policy says) to host NUMA node 0, which
// every host has.
struct SimOnNode0 : offload::device::Sim {
  static int numa_node(c10::DeviceIndex) noexcept { return 0; }
};
static_assert(offload::requirement::numa_node<SimOnNode0>);
}  // namespace

TEST_CASE("pinned pool: slabs are pinned on the host NUMA node the device policy names, bitwise" *
          fixture::sim_only("the pool of sim:0 and sim's pinned allocator")) {
  const fixture::Substrate substrate(kParityDelayUs);
  const TwoLayers model(4);
  offload::storage::PinnedPool::trim(fixture::sim0);
  const bool placing = offload::numa::placement_available();
  INFO("libnuma: ", OFFLOAD_HAS_NUMA, ", placement available: ", placing, ", nodes: ", offload::numa::node_count());
  {
    offload::Manager<SimOnNode0, offload::storage::PinnedPool, offload::sync::Streamed> manager(
        offload::Options{.min_offload_bytes = 0});
    const auto pooled = model.train(2, harness::with_scope(manager));
    std::string why;
    CHECK_MESSAGE(harness::bitwise_equal(model.train(2), pooled, &why), why);
    CHECK(manager.stats().storages_offloaded > 0);
    const auto pool = offload::storage::PinnedPool::stats(fixture::sim0);
    CHECK(pool.slab_allocations > 0);
    // The manager passed the policy's node in HostRequest::numa_node, and
    // the pool pinned its slabs there when it can place memory at all.
    CHECK(pool.numa_node == (placing ? 0 : -1));
  }
  // Every page of a fresh slab is on node 0 (the pages are touched first).
  offload::storage::PinnedPool::trim(fixture::sim0);
  offload::storage::PinnedPool pool;
  const std::int64_t bytes = std::int64_t{1} << 20;
  auto buffer = pool.allocate(offload::HostRequest{bytes, fixture::sim0, true, 0});
  REQUIRE(buffer.pinned);
  buffer.bytes.fill_(1);
  const auto* data = static_cast<const char*>(buffer.bytes.data_ptr());
  for (std::int64_t offset = 0; offset < bytes; offset += 4096) {
    CHECK(offload::numa::node_of(data + offset) == (placing ? 0 : -1));
  }
  // Unknown nodes and malformed PCI addresses say "unknown".
  CHECK(offload::numa::pci_node("ffff:ff:1f.7") == -1);
  CHECK(offload::numa::pci_node("../../devices") == -1);
  CHECK(offload::numa::pci_node("") == -1);
  const offload::numa::PreferredNode nowhere(-1);
  CHECK_FALSE(nowhere.active());
  const offload::numa::PreferredNode past_last(offload::numa::node_count());
  CHECK_FALSE(past_last.active());
}

TEST_CASE("pinned pool: bad PoolOptions name the knob, the value and the range (docs/bad-input.md)") {
  using offload::storage::PinnedPool;
  using offload::storage::PoolOptions;
  CHECK_THROWS_WITH_AS(
      PinnedPool(PoolOptions{.min_slab_bytes = 1024}),
      doctest::Contains("offload::storage::PoolOptions: min_slab_bytes must be in [65536, 1099511627776], got 1024"),
      c10::ValueError);
  CHECK_THROWS_WITH_AS(PinnedPool(PoolOptions{.growth = 0.0}),
                       doctest::Contains("offload::storage::PoolOptions: growth must be in (0, 1], got 0"),
                       c10::ValueError);
  CHECK_THROWS_WITH_AS(PinnedPool(PoolOptions{.growth = 1.5}),
                       doctest::Contains("offload::storage::PoolOptions: growth must be in (0, 1], got 1.5"),
                       c10::ValueError);
  CHECK_THROWS_WITH_AS(PinnedPool(PoolOptions{.limit_bytes = 4096}),
                       doctest::Contains("offload::storage::PoolOptions: limit_bytes must be 0 (no limit) or in "
                                         "[min_slab_bytes = 4194304, 1125899906842624], got 4096"),
                       c10::ValueError);
}
