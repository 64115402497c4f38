// SPDX-License-Identifier: MIT
// Reliability: host budget, pinned fallback, lifecycle after exceptions and
// over many steps, concurrent threads, and randomized graphs on `sim` with
// copy delay and poisoning. The randomized suite runs a fixed seed set; set
// OFFLOAD_FUZZ_SEEDS=FIRST:COUNT (scripts/fuzz) to run others.

#include "doctest.hpp"

#include <cstdlib>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "faults.hpp"
#include "fixture.hpp"
#include "harness.hpp"

namespace {

// Why every case of this suite runs on sim only (OFFLOAD_TEST_DEVICE=cuda
// skips and lists them instead of counting a sim run as a CUDA pass).
constexpr const char* kSuiteOnSim = "sim's managers, copy latency, poisoning and host allocator counts";

using Streamed = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Streamed>;
using Blocking = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Blocking>;
using fixture::sim0;
/// The copy delay of the reliability cases (microseconds).
constexpr std::int64_t kDelayUs = 100;

// A two-layer MLP written with ATen only, with its own generator, so
// replicas can be built and trained on any thread deterministically.
struct Mlp {
  at::Tensor w1, w2, x, y;
  explicit Mlp(std::uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    w1 = at::randn({64, 128}, gen).to(sim0).requires_grad_();
    w2 = at::randn({128, 16}, gen).to(sim0).requires_grad_();
    x = at::randn({32, 64}, gen).to(sim0);
    y = at::randn({32, 16}, gen).to(sim0);
  }
  at::Tensor loss() const { return (x.mm(w1).tanh().mm(w2) - y).pow(2).mean(); }
  // `steps` SGD steps; returns the losses and the final weights on the CPU.
  template <class Wrap>
  std::vector<at::Tensor> train(int steps, Wrap&& wrap) {
    std::vector<at::Tensor> out;
    for (int s = 0; s < steps; ++s) {
      at::Tensor l = wrap([&] { return loss(); });
      l.backward();
      out.push_back(l.detach().to(at::kCPU));
      const c10::AutoGradMode no_grad(false);
      w1.sub_(w1.grad() * 0.1);
      w2.sub_(w2.grad() * 0.1);
      w1.mutable_grad() = at::Tensor();
      w2.mutable_grad() = at::Tensor();
    }
    out.push_back(w1.detach().to(at::kCPU));
    out.push_back(w2.detach().to(at::kCPU));
    return out;
  }
};

bool same(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

auto plain = [](auto&& forward) { return forward(); };

}  // namespace

TEST_CASE("host budget: tensors over the budget stay on the device and training is unchanged" *
          fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(kDelayUs);
  const auto expected = Mlp(7).train(3, plain);
  // Offloaded per step: tanh's output, 32x128 floats (16 KiB), and the
  // error, 32x16 (2 KiB); the input x stays (a floating-point leaf, like a
  // parameter). A 12 KiB budget holds the error, not tanh's output.
  Blocking manager(offload::Options{.min_offload_bytes = 0, .host_budget_bytes = 12 * 1024});
  const auto got = Mlp(7).train(3, harness::with_scope(manager));
  CHECK(same(expected, got));
  const auto stats = manager.stats();
  CHECK(stats.passed_budget > 0);
  CHECK(stats.storages_offloaded > 0);
  CHECK(stats.host_bytes_peak <= 12 * 1024);
}

namespace {
// A storage policy without reserved_for() whose buffers set aside twice
// their size.
struct DoublingHost {
  static constexpr std::string_view name = "doubling_host";
  static constexpr bool prefers_pinned = false;
  offload::HostBuffer allocate(const offload::HostRequest& request) const {
    return {at::empty({request.nbytes}, at::kByte), false, 2 * request.nbytes};
  }
};

// One saved storage of 5000 floats (20,000 bytes: exp's output) per
// backward, offloaded by `manager` from sim's device 0; the gradient must
// be the one without offloading.
template <class M>
void offload_one_exp(M& manager) {
  const auto w = at::randn({5000}, at::TensorOptions().device(sim0)).requires_grad_();
  const auto grads = harness::grads_plain_and_wrapped(
      w, [](const at::Tensor& t) { return (t * 2).exp().sum(); }, harness::with_scope(manager));
  CHECK(at::equal(grads.wrapped.cpu(), grads.plain.cpu()));
}
}  // namespace

TEST_CASE("host budget: reserved bytes are counted and limited (a power-of-two pinned allocator, the pool)" *
          fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(kDelayUs);
  offload::sim::set_host_power_of_two(true);  // as CUDA's caching host allocator
  constexpr std::int64_t stored = 5000 * 4;
  SUBCASE("PinnedHost: each buffer counts its power-of-two block") {
    Blocking manager(offload::Options{.min_offload_bytes = 0});
    offload_one_exp(manager);
    const auto stats = manager.stats();
    CHECK(stats.storages_offloaded == 1);
    CHECK(stats.host_bytes_peak == stored);
    CHECK(stats.host_bytes_reserved_peak == 32768);
    CHECK(stats.host_bytes_reserved == 0);  // given back with the graph
    CHECK(stats.host_bytes_in_use == 0);
  }
  SUBCASE("PinnedHost: a budget between the bytes stored and the block keeps the tensor on the device") {
    Blocking manager(offload::Options{.min_offload_bytes = 0, .host_budget_bytes = 24000});
    offload_one_exp(manager);
    const auto stats = manager.stats();
    CHECK(stats.passed_budget == 1);
    CHECK(stats.storages_offloaded == 0);
    CHECK(stats.host_bytes_reserved_peak == 0);
  }
  SUBCASE("PinnedPool: the same budget holds the 64-byte piece") {
    offload::Manager<offload::device::Sim, offload::storage::PinnedPool, offload::sync::Blocking> manager(
        offload::Options{.min_offload_bytes = 0, .host_budget_bytes = 24000});
    offload_one_exp(manager);
    const auto stats = manager.stats();
    CHECK(stats.passed_budget == 0);
    CHECK(stats.storages_offloaded == 1);
    CHECK(stats.host_bytes_reserved_peak == 20032);
    CHECK(stats.host_bytes_reserved == 0);
  }
  SUBCASE("a buffer that sets aside more than its policy said is given back over the budget") {
    // reserved_for() is absent (the request's size, 20,000, is assumed);
    // the buffer sets aside 40,000, over a 30,000 budget.
    offload::Manager<offload::device::Sim, DoublingHost, offload::sync::Blocking> manager(
        offload::Options{.min_offload_bytes = 0, .host_budget_bytes = 30000});
    offload_one_exp(manager);
    const auto stats = manager.stats();
    CHECK(stats.passed_budget == 1);
    CHECK(stats.storages_offloaded == 0);
    CHECK(stats.host_bytes_reserved_peak == 0);
    CHECK(stats.host_bytes_in_use == 0);
    offload::Manager<offload::device::Sim, DoublingHost, offload::sync::Blocking> roomy(
        offload::Options{.min_offload_bytes = 0, .host_budget_bytes = 40000});
    offload_one_exp(roomy);
    CHECK(roomy.stats().storages_offloaded == 1);
    CHECK(roomy.stats().host_bytes_reserved_peak == 40000);
  }
  SUBCASE("PageableHost: reserved is what is stored") {
    offload::Manager<offload::device::Sim, offload::storage::PageableHost, offload::sync::Blocking> manager(
        offload::Options{.min_offload_bytes = 0});
    offload_one_exp(manager);
    CHECK(manager.stats().host_bytes_reserved_peak == stored);
  }
  CHECK(offload::storage::pinned_block_bytes(c10::DeviceType::CUDA, 20000) == 32768);
  CHECK(offload::storage::pinned_block_bytes(c10::DeviceType::PrivateUse1, 20000) == 32768);
  offload::sim::set_host_power_of_two(false);
  CHECK(offload::storage::pinned_block_bytes(c10::DeviceType::PrivateUse1, 20000) == 20480);
}

TEST_CASE("pinned fallback: a failed pinned allocation uses pageable memory, counted" *
          fixture::sim_only{kSuiteOnSim}) {
  // The CPU has no pinned-memory allocator of its own: PinnedHost's request
  // fails and falls back, which is the path a failed cudaHostAlloc takes.
  using HostPinned = offload::Manager<harness::HostAsDevice, offload::storage::PinnedHost, offload::sync::Blocking>;
  HostPinned manager(offload::Options{.min_offload_bytes = 0});
  auto w = at::randn({32, 32}).requires_grad_();
  const auto grads = harness::grads_plain_and_wrapped(
      w, [](const at::Tensor& t) { return (t * 2).exp().sum(); }, harness::with_scope(manager));
  CHECK(at::equal(grads.wrapped, grads.plain));
  CHECK(manager.stats().pinned_fallbacks >= 1);
  CHECK(manager.stats().storages_offloaded >= 1);
}

TEST_CASE("lifecycle: an exception mid-forward leaves nothing held once the graph is dropped" *
          fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(kDelayUs);
  Streamed manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 2});
  Mlp model(3);
  const auto device_before = harness::settled_device_bytes();
  const auto host_before = offload::sim::host_memory().current_bytes;
  for (int attempt = 0; attempt < 3; ++attempt) {
    try {
      offload::Scope scope(manager);
      auto h = model.x.mm(model.w1).tanh();  // saved tensors now held on the host
      auto g = h.exp().sigmoid();
      CHECK(manager.stats().host_bytes_in_use > 0);
      (void)g.mm(model.w1);  // shape mismatch: throws mid-forward
      FAIL("the forward pass should have thrown");
    } catch (const c10::Error&) {
    }
  }
  offload::sim::synchronize();
  CHECK(manager.stats().host_bytes_in_use == 0);
  CHECK(harness::settled_device_bytes() == device_before);
  CHECK(offload::sim::host_memory().current_bytes == host_before);
  // and the next step works, with the result of a run without offloading
  CHECK(same(Mlp(3).train(2, plain), model.train(2, harness::with_scope(manager))));
}

TEST_CASE("lifecycle: a forward dropped without backward releases what stayed on the device, and its graph" *
          fixture::sim_only{kSuiteOnSim}) {
  // tanh, exp and sigmoid save their outputs, sin its input. A saved output
  // the manager does not offload (here: under min_offload_bytes; over the
  // host budget or kept for a device target alike) is held without its
  // autograd history: the tensor itself would hold its own node, which holds
  // the saved tensor. A saved input is held as itself (no such cycle).
  const fixture::Substrate substrate(/*latency_us=*/0);
  Mlp model(3);
  const auto device_before = harness::settled_device_bytes();
  for (const std::int64_t min_offload_bytes : {std::int64_t{1} << 40, std::int64_t{0}}) {
    CAPTURE(min_offload_bytes);
    Streamed manager(offload::Options{.min_offload_bytes = min_offload_bytes});
    std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> h, e;
    {
      const offload::Scope scope(manager);
      auto out = model.x.mm(model.w1).tanh();
      h.emplace(out.getIntrusivePtr());
      auto last = out.sin().exp();
      e.emplace(last.getIntrusivePtr());
      (void)last.sigmoid().sum();
    }
    offload::sim::synchronize();
    CHECK(h->expired());
    CHECK(e->expired());
    CHECK(harness::settled_device_bytes() == device_before);
    const auto stats = manager.stats();
    // The three outputs, sin's input (tanh's output again) and mm's input x
    // (the model input: an activation).
    if (min_offload_bytes == 0) {
      CHECK(stats.tensors_offloaded == 5);
    } else {
      CHECK(stats.passed_small == 5);  // they stayed on the device
    }
  }
}

namespace {
// A custom Function that saves its output, as FlashAttention saves `out`.
struct ExpSavingOutput : torch::autograd::Function<ExpSavingOutput> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    auto out = x.exp();
    ctx->save_for_backward({out});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * ctx->get_saved_variables()[0]};
  }
};
// Calls another custom Function in its forward (grad mode off there, but
// that Function still makes a node), then saves its own output: its node is
// not the newest when the output is saved.
struct ExpAfterAFunction : torch::autograd::Function<ExpAfterAFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    auto out = ExpSavingOutput::apply(x);
    ctx->save_for_backward({out});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return ExpSavingOutput::backward(ctx, std::move(grads));
  }
};
// The same, returning and saving a view it made (a view that a view op's
// node did not make).
struct ExpTAfterAFunction : torch::autograd::Function<ExpTAfterAFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    auto out = ExpSavingOutput::apply(x).t();
    ctx->save_for_backward({out});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {(grads[0] * ctx->get_saved_variables()[0]).t()};
  }
};
}  // namespace

TEST_CASE(
    "lifecycle: a custom Function's saved output, dropped without backward, frees its graph; with backward, "
    "bitwise" *
    fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(/*latency_us=*/0);
  Mlp model(3);
  auto run = [&](offload::AnyManager* manager, bool backward) {
    std::optional<offload::Scope> scope;
    if (manager) scope.emplace(*manager);
    auto out = ExpSavingOutput::apply(model.x.mm(model.w1).sin());
    const c10::weak_intrusive_ptr<c10::TensorImpl> weak(out.getIntrusivePtr());
    auto loss = out.sum();
    scope.reset();
    at::Tensor grad;
    if (backward) grad = torch::autograd::grad({loss}, {model.w1})[0];
    return std::make_pair(weak, grad);
  };
  const auto plain_grad = run(nullptr, true).second;
  for (const std::int64_t min_offload_bytes : {std::int64_t{1} << 40, std::int64_t{0}}) {
    CAPTURE(min_offload_bytes);
    offload::AnyManager manager = Streamed(offload::Options{.min_offload_bytes = min_offload_bytes});
    const auto device_before = harness::settled_device_bytes();
    const auto dropped = run(&manager, false).first;
    offload::sim::synchronize();
    CHECK(dropped.expired());
    CHECK(harness::settled_device_bytes() == device_before);
    CHECK(same({run(&manager, true).second}, {plain_grad}));
    // sin's input, the Function's output and mm's input x, in both runs.
    CHECK((min_offload_bytes == 0 ? manager.stats().tensors_offloaded : manager.stats().passed_small) == 6);
  }
}

TEST_CASE("lifecycle: a saved output whose node is not the newest (a stale view's grad_fn made again) frees its graph" *
          fixture::sim_only{kSuiteOnSim}) {
  // exp's node is made, then collecting its input makes the stale view's
  // grad_fn again: the node saving exp's output is no longer the newest.
  const fixture::Substrate substrate(/*latency_us=*/0);
  Mlp model(3);
  Streamed manager(offload::Options{.min_offload_bytes = std::int64_t{1} << 40});
  const auto device_before = harness::settled_device_bytes();
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> weak;
  {
    const offload::Scope scope(manager);
    auto base = model.x.mm(model.w1);
    auto view = base.narrow(0, 0, 2);
    base.mul_(2);
    auto out = view.exp();
    weak.emplace(out.getIntrusivePtr());
  }
  offload::sim::synchronize();
  CHECK(weak->expired());
  CHECK(harness::settled_device_bytes() == device_before);
  CHECK(manager.stats().passed_small == 2);  // mm's input x, exp's output
}

TEST_CASE("lifecycle: a custom Function calling another in its forward frees its graph, its output a view or not" *
          fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(/*latency_us=*/0);
  Mlp model(3);
  for (const bool view : {false, true}) {
    CAPTURE(view);
    Streamed manager(offload::Options{.min_offload_bytes = std::int64_t{1} << 40});
    const auto device_before = harness::settled_device_bytes();
    std::optional<c10::weak_intrusive_ptr<c10::TensorImpl>> weak;
    {
      const offload::Scope scope(manager);
      const auto h = model.x.mm(model.w1);
      auto out = view ? ExpTAfterAFunction::apply(h) : ExpAfterAFunction::apply(h);
      CHECK(out.is_view() == view);
      weak.emplace(out.getIntrusivePtr());
    }
    offload::sim::synchronize();
    CHECK(weak->expired());
    CHECK(harness::settled_device_bytes() == device_before);
    CHECK(manager.stats().passed_small == 2);  // mm's input x, the Function's output
  }
}

TEST_CASE("lifecycle: 1000 steps keep device and host memory flat" * fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(/*latency_us=*/0);
  Streamed manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 2, .prefetch_depth = 2});
  Mlp model(5);
  std::vector<std::int64_t> device, host, pinned;
  auto step = harness::with_scope(manager);
  for (int s = 0; s < 1000; ++s) {
    model.train(1, step);
    if (s == 9 || s == 999) {
      device.push_back(harness::settled_device_bytes());
      pinned.push_back(offload::sim::host_memory().current_bytes);
      host.push_back(manager.stats().host_bytes_in_use);
    }
  }
  MESSAGE("device bytes after step 10 / 1000: ", device[0], " / ", device[1], "; pinned host bytes: ", pinned[0], " / ",
          pinned[1], "; manager host bytes: ", host[0], " / ", host[1]);
  CHECK(device[1] == device[0]);
  CHECK(pinned[1] == pinned[0]);
  CHECK(host[1] == 0);
  CHECK(manager.stats().storages_offloaded >= 2000);
  CHECK(manager.stats().pinned_fallbacks == 0);  // the sim's pinned host allocator served every buffer
  CHECK(manager.stats().host_bytes_peak > 0);
}

TEST_CASE("threads: two threads with their own scopes train concurrently, bitwise as alone" *
          fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(kDelayUs);
  const auto alone_a = Mlp(11).train(4, plain);
  const auto alone_b = Mlp(12).train(4, plain);
  Streamed shared(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 2});
  Mlp a(11), b(12);
  std::vector<at::Tensor> got_a, got_b;
  std::thread ta([&] { got_a = a.train(4, harness::with_scope(shared)); });
  std::thread tb([&] { got_b = b.train(4, harness::with_scope(shared)); });
  ta.join();
  tb.join();
  CHECK(same(alone_a, got_a));
  CHECK(same(alone_b, got_b));
  CHECK(shared.stats().storages_offloaded >= 2 * 4 * 2);
}

TEST_CASE("threads: a scope opened on one thread does not apply to another" * fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(kDelayUs);
  Blocking manager(offload::Options{.min_offload_bytes = 0});
  offload::Scope scope(manager);
  std::thread([] {
    Mlp other(13);
    other.loss().backward();
  }).join();
  CHECK(manager.stats().tensors_seen == 0);
  // positive control: the same model on the scope's own thread is seen
  Mlp mine(13);
  mine.loss().backward();
  CHECK(manager.stats().tensors_seen > 0);
}

TEST_CASE("threads: a Scope destroyed on another thread is reported and deactivated, not undefined" *
          fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(kDelayUs);
  Blocking manager(offload::Options{.min_offload_bytes = 0});
  auto scope = std::make_unique<offload::Scope>(manager);
  std::thread([&] { scope.reset(); }).join();  // warns; the owner's stack drops the closed frame
  Mlp model(14);
  model.loss().backward();
  CHECK(manager.stats().tensors_seen == 0);
  // positive control: a scope opened anew on this thread is active again
  {
    offload::Scope again(manager);
    model.loss().backward();
  }
  CHECK(manager.stats().tensors_seen > 0);
}

// ------------------------------------------------------------ random graphs
namespace {

// A random graph of view, elementwise and reduction ops over [n, n] tensors
// built from two parameters; loss = sum of a few results. Saved tensors
// include views sharing one storage (transposes, narrows, expands).
at::Tensor random_graph(std::uint32_t seed, const at::Tensor& p, const at::Tensor& q) {
  std::mt19937 rng(seed);
  const std::int64_t n = p.size(0);
  std::vector<at::Tensor> pool{p * 1, q * 1, p.t(), q + p};
  auto pick = [&] { return pool[std::uniform_int_distribution<std::size_t>(0, pool.size() - 1)(rng)]; };
  const int ops = std::uniform_int_distribution<int>(6, 18)(rng);
  for (int i = 0; i < ops; ++i) {
    const auto a = pick();
    const auto b = pick();
    const std::int64_t k = std::uniform_int_distribution<std::int64_t>(1, n - 1)(rng);
    at::Tensor r;
    switch (std::uniform_int_distribution<int>(0, 11)(rng)) {
      case 0:
        r = a.matmul(b) / static_cast<double>(n);
        break;
      case 1:
        r = a.t() * b;
        break;  // saves a view and b
      case 2:
        r = a.tanh();
        break;
      case 3:
        r = a.sigmoid() * a;
        break;  // one storage saved twice
      case 4:
        r = at::cat({a.narrow(0, 0, k) * b.narrow(0, 0, k), b.narrow(0, k, n - k)}, 0);
        break;
      case 5:
        r = a.select(0, k).unsqueeze(0).expand({n, n}) * b;
        break;  // stride-0 view saved
      case 6:
        r = at::layer_norm(a, {n});
        break;
      case 7:
        r = at::softmax(a, 1);
        break;
      case 8:
        r = a.transpose(0, 1).contiguous().exp().clamp_max(10.0);
        break;
      case 9:
        r = a.narrow(1, k, n - k).sin().sum(1, true).expand({n, n}) + b;
        break;
      case 10:
        r = (a * b).permute({1, 0});
        break;
      default:
        r = a.mul(0.5).add(b.pow(2));
        break;
    }
    pool.push_back(r);
  }
  at::Tensor loss = pool.back().sum();
  for (std::size_t i = pool.size() - 3; i < pool.size() - 1; ++i) loss = loss + pool[i].mean();
  return loss;
}

std::vector<at::Tensor> random_graph_grads(std::uint32_t seed,
                                           const std::function<at::Tensor(const std::function<at::Tensor()>&)>& wrap) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto p = at::randn({8, 8}, gen).to(sim0).requires_grad_();
  auto q = at::randn({8, 8}, gen).to(sim0).requires_grad_();
  at::Tensor loss = wrap([&] { return random_graph(seed, p, q); });
  loss.backward();
  auto grad = [](const at::Tensor& t) { return t.grad().defined() ? t.grad().to(at::kCPU) : at::zeros({0}); };
  return {loss.detach().to(at::kCPU), grad(p), grad(q)};
}

std::pair<std::uint32_t, std::uint32_t> seed_range() {
  if (const char* env = std::getenv("OFFLOAD_FUZZ_SEEDS")) {
    std::string s(env);
    const auto colon = s.find(':');
    TORCH_CHECK_VALUE(colon != std::string::npos, "OFFLOAD_FUZZ_SEEDS must be FIRST:COUNT, got '", s, "'");
    return {static_cast<std::uint32_t>(std::stoul(s.substr(0, colon))),
            static_cast<std::uint32_t>(std::stoul(s.substr(colon + 1)))};
  }
  return {1, 40};  // the fixed set CI runs
}

}  // namespace

TEST_CASE("randomized graphs: gradient parity with Streamed and Blocking on sim, delay and poisoning on" *
          fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(/*latency_us=*/50);
  const auto [first, count] = seed_range();
  std::vector<std::uint32_t> failing;
  for (std::uint32_t seed = first; seed < first + count; ++seed) {
    const auto expected = random_graph_grads(seed, plain);
    Streamed streamed(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 2, .prefetch_depth = 2});
    Blocking blocking(offload::Options{.min_offload_bytes = 0});
    const bool ok = same(expected, random_graph_grads(seed, harness::with_scope(streamed))) &&
                    same(expected, random_graph_grads(seed, harness::with_scope(blocking)));
    if (!ok) failing.push_back(seed);
    CHECK(streamed.stats().storages_offloaded > 0);
  }
  std::ostringstream seeds;
  for (auto s : failing) seeds << " " << s;
  MESSAGE("randomized graphs: seeds ", first, "..", first + count - 1,
          " run; failing seeds:", failing.empty() ? std::string(" none") : seeds.str());
  CHECK(failing.empty());
}

TEST_CASE("randomized graphs: the check can fail (an injected early free is caught)" * fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(/*latency_us=*/20000);
  int caught = 0;
  for (std::uint32_t seed = 1; seed <= 3; ++seed) {
    const auto expected = random_graph_grads(seed, plain);
    offload::Manager<offload::device::Sim, offload::storage::PinnedHost, faults::Faulty<offload::sync::Streamed>>
        streamed(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 1});
    faults::arm(faults::Fault::free_early, 1000);
    std::vector<at::Tensor> got;
    try {
      got = random_graph_grads(seed, harness::with_scope(streamed));
    } catch (const std::exception&) {
    }
    faults::disarm();
    offload::sim::synchronize();
    if (!same(expected, got)) ++caught;
  }
  CHECK(caught == 3);
}

namespace {
// A storage policy whose every allocation fails.
struct FailingHost {
  static constexpr std::string_view name = "failing_host";
  static constexpr bool prefers_pinned = false;
  offload::HostBuffer allocate(const offload::HostRequest&) {
    TORCH_CHECK(false, "FailingHost: out of host memory (test)");
  }
};
}  // namespace

TEST_CASE("lifecycle: a storage policy that throws leaves the accounting balanced and nothing held" *
          fixture::sim_only{kSuiteOnSim}) {
  const fixture::Substrate substrate(kDelayUs);
  offload::Manager<offload::device::Sim, FailingHost, offload::sync::Blocking> manager(
      offload::Options{.min_offload_bytes = 0});
  Mlp model(21);
  CHECK_THROWS_WITH_AS(model.train(1, harness::with_scope(manager)),
                       doctest::Contains("FailingHost: out of host memory"), c10::Error);
  CHECK(manager.stats().host_bytes_in_use == 0);
  CHECK(manager.stats().storages_offloaded == 0);
}
