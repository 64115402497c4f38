// SPDX-License-Identifier: MIT
// offload::checkpoint: bitwise parity with the block run without
// checkpoint and without offloading (dropout on, nested, several outputs,
// an input without grad, torch::autograd::grad), only block inputs reach
// the manager, state the block writes (BatchNorm) left as without
// checkpoint, and the errors of a block that recomputes differently.

#include "doctest.hpp"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <offload/checkpoint.hpp>
#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "fixture.hpp"
#include "harness.hpp"

namespace {

// Why every case of this suite runs on sim only (OFFLOAD_TEST_DEVICE=cuda
// skips and lists them instead of counting a sim run as a CUDA pass).
constexpr const char* kSuiteOnSim = "checkpoint + offload on sim's managers, with sim's copy latency and poisoning";

using fixture::sim0;
constexpr int kLayers = 4;
constexpr int kSteps = 3;

using fixture::SlowPoisonedSim;

// A residual MLP stack with dropout, parameters as leaf tensors on sim:
// block i is x + dropout(gelu(x W1_i)) W2_i.
struct Stack {
  std::vector<at::Tensor> w1, w2;
  at::Tensor x;
  Stack() {
    at::manual_seed(0);
    for (int i = 0; i < kLayers; ++i) {
      w1.push_back((at::randn({64, 128}) * 0.1).to(sim0).requires_grad_());
      w2.push_back((at::randn({128, 64}) * 0.1).to(sim0).requires_grad_());
    }
    x = at::randn({32, 64}).to(sim0);
  }
  std::vector<at::Tensor> params() const {
    auto out = w1;
    out.insert(out.end(), w2.begin(), w2.end());
    return out;
  }
  at::Tensor block(int i, const at::Tensor& h) const {
    return h + at::dropout(at::gelu(h.matmul(w1[i])), 0.2, /*train=*/true).matmul(w2[i]);
  }
  // plain: no checkpoint; nested: blocks in checkpointed pairs of checkpointed blocks.
  enum class Mode { plain, flat, nested };
  at::Tensor loss(Mode mode, const offload::CheckpointOptions& options = {}) const {
    // Blocks are kept until backward: they capture by value.
    const auto one = [this, mode, options](int i, const at::Tensor& in) {
      if (mode == Mode::plain) return block(i, in);
      return offload::checkpoint([this, i](const at::Tensor& t) { return block(i, t); }, in, options);
    };
    at::Tensor h = x;
    for (int i = 0; i < kLayers; i += 2) {
      if (mode == Mode::nested) {
        h = offload::checkpoint([one, i](const at::Tensor& t) { return one(i + 1, one(i, t)); }, h, options);
      } else {
        h = one(i + 1, one(i, h));
      }
    }
    return h.sum();
  }
};

harness::RunResult run(Stack::Mode mode, const harness::Wrap& wrap = {},
                       const offload::CheckpointOptions& options = {}) {
  const Stack stack;  // seeds the generator: every run draws the same masks
  return harness::train_params(stack.params(), [&] { return stack.loss(mode, options); }, kSteps, wrap);
}

template <class Sync>
using SimManager = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, Sync>;

// Linear, BatchNorm1d (in training mode its forward updates the running
// statistics), ReLU.
struct NormBlockImpl : torch::nn::Module {
  torch::nn::Linear linear{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
  NormBlockImpl()
      : linear(register_module("linear", torch::nn::Linear(32, 32))),
        norm(register_module("norm", torch::nn::BatchNorm1d(32))) {}
  at::Tensor forward(const at::Tensor& x) { return at::relu(norm(linear(x))); }
};
TORCH_MODULE(NormBlock);

enum class NormRun { plain, checkpoint_forward, checkpoint_without_state, planned };

// What a training program would print: each step's loss (three BatchNorm
// blocks, SGD), then, in eval mode, the output for the training input and
// every buffer (the running statistics).
// NormRun::planned: under the automatic plan of a manager whose target
// leaves room for everything, the first step recomputes every block (it
// measures), the later ones keep them.
std::vector<at::Tensor> train_then_evaluate(NormRun how, offload::Stats* planned_stats = nullptr) {
  at::manual_seed(0);
  offload::AnyManager manager =
      SimManager<offload::sync::Blocking>(offload::Options{.device_target_bytes = std::int64_t{1} << 30});
  std::vector<NormBlock> blocks(3);
  for (auto& b : blocks) b->to(sim0);
  const auto x = at::randn({16, 32}).to(sim0);
  const auto forward = [&] {
    at::Tensor h = x;
    for (auto& b : blocks) {
      if (how == NormRun::plain) {
        h = b->forward(h);
      } else if (how == NormRun::checkpoint_forward) {
        h = offload::checkpoint_forward(b, h);
      } else if (how == NormRun::planned) {
        h = offload::checkpoint_forward(b, h, {.name = "norm", .planned = true});
      } else {
        h = offload::checkpoint([b](const at::Tensor& t) mutable { return b->forward(t); }, h);
      }
    }
    return h;
  };
  std::vector<at::Tensor> printed;
  for (int step = 0; step < kSteps; ++step) {
    std::optional<offload::Scope> scope;
    if (how == NormRun::planned) scope.emplace(manager);
    const auto loss = forward().square().mean();
    scope.reset();
    loss.backward();
    if (planned_stats != nullptr) {
      const auto stats = manager.stats();
      planned_stats->blocks_recomputed += stats.blocks_recomputed;
      planned_stats->blocks_kept += stats.blocks_kept;
    }
    const torch::autograd::AutoGradMode no_grad(false);
    for (auto& b : blocks) {
      for (auto& p : b->parameters()) {
        p.sub_(p.grad() * 0.1);
        p.mutable_grad().zero_();
      }
    }
    printed.push_back(loss.detach().cpu());
  }
  for (auto& b : blocks) b->eval();
  const torch::autograd::AutoGradMode no_grad(false);
  printed.push_back(forward().cpu());
  for (auto& b : blocks) {
    for (const auto& buffer : b->buffers()) printed.push_back(buffer.cpu());
  }
  return printed;
}

bool same_bytes(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].contiguous();
    const auto y = b[i].contiguous();
    if (x.sizes() != y.sizes() || x.scalar_type() != y.scalar_type() ||
        std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE_TEMPLATE("checkpoint: bitwise parity with no checkpoint and no offload, dropout on" *
                       fixture::sim_only{kSuiteOnSim},
                   Sync, offload::sync::Blocking, offload::sync::Streamed) {
  const SlowPoisonedSim sim;
  const auto plain = run(Stack::Mode::plain);
  for (auto mode : {Stack::Mode::flat, Stack::Mode::nested}) {
    CAPTURE(static_cast<int>(mode));
    std::string why;
    // checkpoint alone
    CHECK_MESSAGE(harness::bitwise_equal(plain, run(mode), &why), why);
    // checkpoint + offload: only the block inputs (the stack's input and
    // each pair's output, or each block's) reach the manager, and all are
    // offloaded: the stack's input is the model input (a leaf that does not
    // require grad: an activation, not a parameter).
    SimManager<Sync> manager(offload::Options{.min_offload_bytes = 0});
    CHECK_MESSAGE(harness::bitwise_equal(plain, run(mode, harness::with_scope(manager)), &why), why);
    const auto stats = manager.stats();
    const int inputs = mode == Stack::Mode::flat ? kLayers : kLayers / 2;
    CHECK(stats.tensors_seen == kSteps * inputs);
    CHECK(stats.passed_through() == 0);
    CHECK(stats.tensors_offloaded == kSteps * inputs);
    CHECK(stats.bytes_offloaded == kSteps * inputs * 32 * 64 * 4);
    CHECK(stats.tensors_reloaded + stats.stash_reuses == kSteps * inputs);
  }
}

TEST_CASE("checkpoint: without the generator state restored, dropout differs (the parity test can fail)" *
          fixture::sim_only{kSuiteOnSim}) {
  const SlowPoisonedSim sim;
  const auto plain = run(Stack::Mode::plain);
  std::string why;
  CHECK_FALSE(
      harness::bitwise_equal(plain, run(Stack::Mode::flat, {}, {.name = "block", .preserve_rng_state = false}), &why));
  // and early stop off changes nothing but the work done
  CHECK_MESSAGE(
      harness::bitwise_equal(
          plain, run(Stack::Mode::flat, {}, {.name = "block", .preserve_rng_state = true, .early_stop = false}), &why),
      why);
}

TEST_CASE("checkpoint: BatchNorm's running statistics are not updated again by the recomputation, also when planned" *
          fixture::sim_only{kSuiteOnSim}) {
  const SlowPoisonedSim sim;
  const auto plain = train_then_evaluate(NormRun::plain);
  // checkpoint_forward() hands the module's buffers over as state: every
  // loss, the evaluation afterwards and every buffer are the plain run's.
  CHECK(same_bytes(plain, train_then_evaluate(NormRun::checkpoint_forward)));
  // The same blocks without state: the recomputation updates the running
  // statistics a second time, and evaluation differs (the check above can
  // fail).
  CHECK_FALSE(same_bytes(plain, train_then_evaluate(NormRun::checkpoint_without_state)));
  // Under the automatic plan: recomputed in the first step, kept after.
  offload::Stats planned;
  CHECK(same_bytes(plain, train_then_evaluate(NormRun::planned, &planned)));
  CHECK(planned.blocks_recomputed == 3);
  CHECK(planned.blocks_kept == 3 * (kSteps - 1));
}

TEST_CASE("checkpoint: the recomputation under the forward's autocast leaves no cast cached for the next step") {
  // CPU autocast to bfloat16, as a C++ training loop enables it around its
  // forward (nesting counted, the cast cache cleared at the outermost
  // end). Autocast caches the casts of leaf weights while enabled; the
  // recomputation in backward runs under the forward's autocast state, so
  // the casts it makes must be cleared at its end as at the forward's: a
  // cast left cached would be the next step's, though the optimizer has
  // changed the weight in place since.
  const auto train = [](bool checkpointed) {
    at::manual_seed(0);
    const auto w1 = (at::randn({16, 32}) * 0.3).requires_grad_();
    const auto w2 = (at::randn({32, 16}) * 0.3).requires_grad_();
    const auto x = at::randn({8, 16}).requires_grad_();
    const offload::Block block = [&](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{at::matmul(at::relu(at::matmul(in[0], w1)), w2)};
    };
    std::vector<at::Tensor> printed;
    for (int step = 0; step < 3; ++step) {
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::increment_nesting();
      const auto y = checkpointed ? offload::checkpoint(block, {x}, {.name = "block"})[0] : block({x})[0];
      const auto loss = y.to(at::kFloat).pow(2).mean();
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      at::autocast::set_autocast_enabled(at::kCPU, false);
      const auto grads = torch::autograd::grad({loss}, {w1, w2});
      printed.push_back(loss.detach());
      printed.push_back(grads[0]);
      printed.push_back(grads[1]);
      const at::NoGradGuard no_grad;
      w1.sub_(grads[0] * 4);
      w2.sub_(grads[1] * 4);
    }
    return printed;
  };
  const auto plain = train(false);
  const auto checkpointed = train(true);
  REQUIRE(plain.size() == checkpointed.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(at::equal(plain[i], checkpointed[i]));
  }
}

TEST_CASE("checkpoint: several outputs, an input without grad, torch::autograd::grad, retain_graph" *
          fixture::sim_only{kSuiteOnSim}) {
  const SlowPoisonedSim sim;
  at::manual_seed(1);
  const auto x = at::randn({16, 32}).to(sim0).requires_grad_();
  const auto y = at::randn({16, 32}).to(sim0).requires_grad_();
  const auto c = at::randn({16, 32}).to(sim0);  // no grad
  const auto fn = [](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
    const auto& [a, b, k] = std::tie(in[0], in[1], in[2]);
    return {a * b.sin(), (a * k).tanh(), k * 2};
  };
  const auto loss_of = [](const std::vector<at::Tensor>& out) { return out[0].pow(2).sum() + out[1].exp().sum(); };
  const auto plain = torch::autograd::grad({loss_of(fn({x * 1, y * 1, c}))}, {x, y});

  SimManager<offload::sync::Streamed> manager(offload::Options{.min_offload_bytes = 0});
  std::vector<at::Tensor> out;
  {
    const offload::Scope scope(manager);
    out = offload::checkpoint(fn, {x * 1, y * 1, c}, {.name = "three"});
  }
  CHECK(out.size() == 3);
  CHECK_FALSE(out[2].requires_grad());
  const auto loss = loss_of(out);
  for (int pass = 0; pass < 2; ++pass) {  // a second backward pass recomputes again
    CAPTURE(pass);
    const auto got = torch::autograd::grad({loss}, {x, y}, {}, /*retain_graph=*/pass == 0);
    CHECK(at::equal(got[0].cpu(), plain[0].cpu()));
    CHECK(at::equal(got[1].cpu(), plain[1].cpu()));
  }
  // the three inputs went through the manager, nothing the block saved did;
  // c, a leaf that does not require grad (an input, not a parameter), is
  // offloaded too
  CHECK(manager.stats().tensors_seen == 3);
  CHECK(manager.stats().passed_through() == 0);
  CHECK(manager.stats().tensors_offloaded == 3);
}

TEST_CASE("checkpoint: a module-like handle's forward, grad mode off, an empty block" *
          fixture::sim_only{kSuiteOnSim}) {
  const SlowPoisonedSim sim;
  struct Doubler {
    at::Tensor forward(const at::Tensor& t) const { return (t * 2).sin(); }
  };
  const auto handle = std::make_shared<Doubler>();
  const auto x = at::randn({8, 8}).to(sim0).requires_grad_();
  offload::checkpoint_forward(handle, x).sum().backward();
  const auto got = x.grad().cpu();
  x.mutable_grad() = at::Tensor();
  handle->forward(x).sum().backward();
  CHECK(at::equal(got, x.grad().cpu()));
  {
    const torch::autograd::AutoGradMode no_grad(false);
    CHECK_FALSE(offload::checkpoint_forward(handle, x).requires_grad());
  }
  CHECK_THROWS_WITH_AS(offload::checkpoint(offload::Block{}, {x}),
                       doctest::Contains("offload::checkpoint: block must be a callable, got an empty function"),
                       c10::ValueError);
}

namespace {
// A custom Function whose forward makes an autograd node (grad mode on)
// before its output is saved. Notes every output it makes.
struct ExpMakingANode : torch::autograd::Function<ExpMakingANode> {
  static std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>>& outputs() {
    static std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> made;
    return made;
  }
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    auto out = x.exp();
    {
      const torch::autograd::AutoGradMode on(true);
      (void)(x.detach().requires_grad_() * 2);
    }
    ctx->save_for_backward({out});
    outputs().emplace_back(out.getIntrusivePtr());
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {grads[0] * ctx->get_saved_variables()[0]};
  }
};
}  // namespace

TEST_CASE("checkpoint: the recomputed graph is freed after backward, whatever its nodes save" *
          fixture::sim_only{kSuiteOnSim}) {
  // The recomputation holds what it saves as data only: a saved output taken
  // for an input would make its node own itself, and every step's
  // recomputed graph would leak. An in-place _foreach_ op makes every
  // element's node before saving any result: the saved output a manager
  // takes for an input (docs/internals.md). The last sin: the early stop
  // throws from a LibTorch operator's pack hook.
  const SlowPoisonedSim sim;
  const auto x = at::randn({8, 8}).to(sim0).requires_grad_();
  static std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> made;
  const auto block = [](const at::Tensor& t) {
    std::vector<at::Tensor> xs{t * 1, t * 2};
    at::_foreach_exp_(xs);
    made.emplace_back(xs[0].getIntrusivePtr());
    return (xs[0] + xs[1]).sin();
  };
  block(x * 1).sum().backward();
  const auto plain = x.grad().cpu();
  x.mutable_grad() = at::Tensor();
  made.clear();
  offload::checkpoint(block, x * 1).sum().backward();
  CHECK(at::equal(x.grad().cpu(), plain));
  REQUIRE(made.size() == 2);  // the forward's and the recomputation's
  CHECK(made[0].expired());
  CHECK(made[1].expired());

  // A C++ Function saving last: the early stop would throw inside it, and
  // LibTorch keeps its to-save list (its output); freed without the early
  // stop (the workaround docs/checkpoint.md gives).
  const auto last = [](const at::Tensor& t) { return ExpMakingANode::apply(t.sin()); };
  x.mutable_grad() = at::Tensor();
  ExpMakingANode::outputs().clear();
  offload::checkpoint(last, x * 1, {.name = "last", .preserve_rng_state = true, .early_stop = false}).sum().backward();
  REQUIRE(ExpMakingANode::outputs().size() == 2);
  CHECK(ExpMakingANode::outputs()[0].expired());
  CHECK(ExpMakingANode::outputs()[1].expired());
}

// docs/bad-input.md, "offload::checkpoint": each row's message.
TEST_CASE("checkpoint: bad input (docs/bad-input.md)" * fixture::sim_only{kSuiteOnSim}) {
  const SlowPoisonedSim sim;
  const auto x = at::randn({4, 8}).to(sim0).requires_grad_();

  SUBCASE("a block that returns no tensor: returned as is, as torch.utils.checkpoint does") {
    const auto out = offload::checkpoint([](const std::vector<at::Tensor>&) { return std::vector<at::Tensor>{}; }, {x});
    CHECK(out.empty());
  }
  SUBCASE("an output that does not require grad while an input does: autograd's own error at backward") {
    const auto out = offload::checkpoint([](const at::Tensor& t) { return t.detach() * 2; }, x);
    CHECK_FALSE(out.requires_grad());
    CHECK_THROWS_WITH_AS(out.sum().backward(),
                         doctest::Contains("element 0 of tensors does not require grad and does not have a grad_fn"),
                         c10::Error);
  }
  SUBCASE("a recomputation that saves fewer tensors") {
    bool first = true;
    auto out = offload::checkpoint(
        [&first](const at::Tensor& t) {
          auto h = t.sin();
          if (std::exchange(first, false)) h = h.sin();
          return h;
        },
        x, {.name = "flaky"});
    CHECK_THROWS_WITH_AS(out.sum().backward(),
                         doctest::Contains("offload::checkpoint: block 'flaky': the recomputation saved 1 tensors, "
                                           "the forward 2; the block must run the same operations each time"),
                         c10::Error);
  }
  SUBCASE("state that requires grad (a parameter): c10::ValueError at forward, naming the entry") {
    const auto weight = at::ones({8}).to(sim0).requires_grad_();
    offload::CheckpointOptions options{.name = "stateful"};
    options.state = {at::Tensor(), weight};
    CHECK_THROWS_WITH_AS(offload::checkpoint([](const at::Tensor& t) { return t.sin(); }, x, options),
                         doctest::Contains("offload::checkpoint: block 'stateful': CheckpointOptions::state[1] "
                                           "requires grad"),
                         c10::ValueError);
  }
  SUBCASE("a recomputation that saves a tensor of other sizes") {
    bool first = true;
    auto out = offload::checkpoint(
        [&first](const at::Tensor& t) {
          const auto h = std::exchange(first, false) ? t : t.narrow(1, 0, 7);
          return h.sin().sum();
        },
        x, {.name = "shapes"});
    CHECK_THROWS_WITH_AS(out.backward(),
                         doctest::Contains("offload::checkpoint: block 'shapes': saved tensor 0 is [4, 7] Float on "
                                           "sim:0 in the recomputation but was [4, 8] Float on sim:0 in the forward; "
                                           "the block must run the same operations each time"),
                         c10::Error);
  }
}
