// SPDX-License-Identifier: MIT
// sync::Streamed beyond parity: the forward stash window bounds device
// memory, backward prefetch is bounded, stashed tensors are reused, and a
// non-default compute stream is honoured.

#include "doctest.hpp"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "harness.hpp"

namespace {

using Streamed = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Streamed>;
const c10::Device sim0(c10::DeviceType::PrivateUse1, 0);
constexpr std::int64_t kSide = 256;
constexpr std::int64_t kAct = kSide * kSide * 4;  // bytes of one activation

struct Chain {
  at::Tensor x = at::randn({kSide, kSide}).to(sim0).requires_grad_();
  // 16 tanh layers: each saves its 256 KiB output
  at::Tensor forward() const {
    auto h = x * 1;
    for (int i = 0; i < 16; ++i) h = h.tanh();
    return h.sum();
  }
};

struct Peaks {
  std::int64_t forward = 0;
  std::int64_t backward = 0;
  at::Tensor grad;
};

Peaks measure(const Chain& chain, const Streamed* manager) {
  const auto base = harness::settled_device_bytes();
  offload::sim::reset_peak(0);
  std::optional<offload::Scope> scope;
  if (manager != nullptr) scope.emplace(*manager);
  auto loss = chain.forward();
  offload::sim::synchronize();
  Peaks peaks;
  peaks.forward = offload::sim::device_memory(0).peak_bytes - base;
  const auto before_backward = offload::sim::device_memory(0).current_bytes;
  offload::sim::reset_peak(0);
  chain.x.mutable_grad() = at::Tensor();
  loss.backward();
  offload::sim::synchronize();
  peaks.backward = offload::sim::device_memory(0).peak_bytes - before_backward;
  peaks.grad = chain.x.grad().to(at::kCPU);
  return peaks;
}

}  // namespace

TEST_CASE("Streamed: forward memory stays within the stash window; backward prefetch is bounded") {
  offload::sim::install();
  offload::sim::ScopedKnobs restore;
  offload::sim::set_copy_delay_us(1000);
  offload::sim::set_poison_freed(true);
  Chain chain;
  const auto plain = measure(chain, nullptr);
  CHECK(plain.forward >= 16 * kAct);

  for (std::int64_t stash : {1, 2, 4}) {
    for (std::int64_t depth : {0, 1, 3}) {
      CAPTURE(stash);
      CAPTURE(depth);
      Streamed manager(offload::Options{
          .min_offload_bytes = 0, .max_fwd_stash = stash, .prefetch_depth = depth, .prefetch_bytes = 0});
      const auto off = measure(chain, &manager);
      CHECK(at::equal(off.grad, plain.grad));
      // live: the activation being computed, its input, and the stash
      CHECK(off.forward <= (stash + 3) * kAct);
      const auto stats = manager.stats();
      CHECK(stats.prefetch_peak <= std::max<std::int64_t>(depth, 1));
      // backward: the node's own inputs and outputs, the gradient chain, and the prefetched ones
      CHECK(off.backward <= (depth + 1 + 4) * kAct);
    }
  }
}

TEST_CASE("Streamed: the prefetch window counts bytes, not tensors, when prefetch_bytes is set") {
  offload::sim::install();
  offload::sim::ScopedKnobs restore;
  offload::sim::set_copy_delay_us(1000);
  offload::sim::set_poison_freed(true);
  Chain chain;
  const auto plain = measure(chain, nullptr);
  // depth 1 is ignored: the window holds as many 256 KiB activations as fit
  for (std::int64_t fit : {1, 3, 6}) {
    CAPTURE(fit);
    Streamed manager(offload::Options{
        .min_offload_bytes = 0, .max_fwd_stash = 1, .prefetch_depth = 1, .prefetch_bytes = fit * kAct + kAct / 2});
    const auto off = measure(chain, &manager);
    CHECK(at::equal(off.grad, plain.grad));
    const auto stats = manager.stats();
    CHECK(stats.prefetch_peak == fit);
    CHECK(off.backward <= (fit + 1 + 4) * kAct);
  }
  // A window smaller than one activation still brings one back ahead.
  Streamed tiny(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 1, .prefetch_bytes = 1});
  const auto off = measure(chain, &tiny);
  CHECK(at::equal(off.grad, plain.grad));
  CHECK(tiny.stats().prefetch_peak == 1);
}

TEST_CASE("Streamed: a tensor still in the forward stash is reused, not copied back") {
  offload::sim::install();
  offload::sim::ScopedKnobs restore;
  offload::sim::set_copy_delay_us(100);
  Chain chain;
  Streamed manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 4, .prefetch_depth = 2});
  {
    offload::Scope scope(manager);  // open across forward and backward
    auto loss = chain.forward();
    loss.backward();
  }
  const auto stats = manager.stats();
  CHECK(stats.stash_reuses >= 1);
  CHECK(stats.stash_reuses <= 4);
  CHECK(stats.tensors_reloaded + stats.stash_reuses == stats.tensors_offloaded);
}

TEST_CASE("Streamed: correct under a non-default current compute stream") {
  offload::sim::install();
  offload::sim::ScopedKnobs restore;
  offload::sim::set_copy_delay_us(300);
  offload::sim::set_poison_freed(true);
  const auto plain = harness::train(harness::ModelKind::block, sim0, 2);
  const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
  const c10::StreamGuard on_pool(guard->getStreamFromGlobalPool(sim0));
  for (int r = 0; r < 5; ++r) {
    Streamed manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 2});
    const auto offloaded = harness::train(harness::ModelKind::block, sim0, 2, [&](const harness::Forward& f) {
      offload::Scope scope(manager);
      return f();
    });
    std::string why;
    CHECK_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), why);
  }
}
