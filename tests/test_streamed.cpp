// SPDX-License-Identifier: MIT
// sync::Streamed beyond parity: the forward stash window bounds device
// memory, backward prefetch is bounded, stashed tensors are reused, a
// non-default compute stream is honoured, and memory freed in place under
// a copy is not reused before the copy has read it. The windows and the
// in-place free are measured under sim's copy latency (and poisoning): they
// run on sim only; stash reuse and the compute stream run on the test
// device (OFFLOAD_TEST_DEVICE, sim by default).

#include "doctest.hpp"

#include <algorithm>
#include <optional>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/native/Resize.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "fixture.hpp"
#include "harness.hpp"

namespace {

using Streamed = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, offload::sync::Streamed>;
#define STREAMED_TYPES FIXTURE_TYPES(PinnedHost, offload::sync::Streamed)
using fixture::sim0;
constexpr std::int64_t kSide = 256;
constexpr std::int64_t kAct = kSide * kSide * 4;  // bytes of one activation

struct Chain {
  explicit Chain(c10::Device device = sim0) : x(at::randn({kSide, kSide}).to(device).requires_grad_()) {}
  at::Tensor x;
  // 16 tanh layers: each saves its 256 KiB output
  at::Tensor forward() const {
    auto h = x * 1;
    for (int i = 0; i < 16; ++i) h = h.tanh();
    return h.sum();
  }
};

using fixture::SlowPoisonedSim;

// x's gradient (on the CPU) of the loss `forward` computes, its saved
// tensors routed through `manager` (nullptr: none); backward after the
// Scope closed.
template <class F>
at::Tensor grad_through(const at::Tensor& x, const Streamed* manager, F&& forward) {
  std::optional<offload::Scope> scope;
  if (manager != nullptr) scope.emplace(*manager);
  auto loss = forward();
  scope.reset();
  x.mutable_grad() = at::Tensor();
  loss.backward();
  return x.grad().to(at::kCPU);
}

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

TEST_CASE("Streamed: forward memory stays within the stash window; backward prefetch is bounded" *
          fixture::sim_only{"the bounds hold with copies kept in flight by sim's copy latency"}) {
  const SlowPoisonedSim sim;
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
      // live: the activation being computed, its input, the stash, and up
      // to as many blocks again that the stash let go of: the allocator
      // reuses one only once the side stream has run the copies queued
      // before it was freed (record_stream, as on CUDA), which lag behind.
      CHECK(off.forward <= (2 * stash + 3) * kAct);
      const auto stats = manager.stats();
      CHECK(stats.prefetch_peak <= std::max<std::int64_t>(depth, 1));
      // backward: the node's own inputs and outputs, the gradient chain, and the prefetched ones
      CHECK(off.backward <= (depth + 1 + 4) * kAct);
    }
  }
}

TEST_CASE("Streamed: memory freed in place under a device-to-host copy is not reused before the copy read it" *
          fixture::sim_only{"the free must come before the copy (sim's copy latency) and read as poison"}) {
  // A saved view of b, whose owner frees b's memory in place right after
  // forward (`untyped_storage().resize_(0)`, as FSDP2 does to its unsharded
  // parameters), while the delayed copy has not run, and fills it again
  // before backward. Freed memory is poisoned: a copy that read it after
  // the free brings back the poison.
  const SlowPoisonedSim sim;
  offload::sim::set_copy_latency_us(100'000);  // the free comes first even on a loaded machine
  const auto x = at::randn({kSide, kSide}).to(sim0).requires_grad_();
  const auto run = [&](const Streamed* manager) {
    return grad_through(x, manager, [&] {
      auto b = x * 2;                 // an activation (not a leaf)
      auto loss = b.t().sin().sum();  // sin saves its input, a view of b
      const auto storage = b.storage();
      const auto nbytes = storage.nbytes();
      const auto keep = b.detach().clone();
      at::native::resize_bytes_nocuda(storage, 0);  // what untyped_storage().resize_(0) calls
      at::native::resize_bytes_nocuda(storage, static_cast<std::int64_t>(nbytes));
      // Refilled through a tensor of its own, so b's version is unchanged
      // (FSDP2 refills under _unsafe_preserve_version_counter).
      at::empty({0}, b.options()).set_(storage, 0, b.sizes(), b.strides()).copy_(keep);
      return loss;
    });
  };
  const auto plain = run(nullptr);
  Streamed manager(offload::Options{.min_offload_bytes = 0});
  const auto off = run(&manager);
  CHECK(manager.stats().storages_offloaded == 1);
  CHECK(at::equal(off, plain));
}

TEST_CASE("Streamed: the prefetch window counts bytes, not tensors, when prefetch_bytes is set" *
          fixture::sim_only{"the window fills while sim's copy latency keeps copies in flight"}) {
  const SlowPoisonedSim sim;
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

TEST_CASE("Streamed: with prefetch_bytes 0 small saved tensors do not take a prefetch slot each" *
          fixture::sim_only{"the window fills while sim's copy latency keeps copies in flight"}) {
  const SlowPoisonedSim sim;
  // 8 layers, each saving its 256 KiB output and four 4 KiB tensors (the
  // shape of LayerNorm's saved mean and rstd next to a large activation)
  const auto x = at::randn({kSide, kSide}).to(sim0).requires_grad_();
  const auto run = [&](const Streamed* manager) {
    return grad_through(x, manager, [&] {
      auto h = x * 1;
      auto loss = at::zeros({}, x.options());
      for (int i = 0; i < 8; ++i) {
        h = h.tanh();
        for (int j = 0; j < 4; ++j) loss = loss + h.narrow(0, j, 4).tanh().sum();
      }
      return loss + h.sum();
    });
  };
  const auto plain = run(nullptr);
  for (std::int64_t depth : {1, 2}) {
    CAPTURE(depth);
    Streamed manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 1, .prefetch_depth = depth});
    CHECK(at::equal(run(&manager), plain));
    const auto stats = manager.stats();
    CHECK(stats.tensors_offloaded == 8 * 5);
    // Counting tensors, depth slots would hold at most depth tensors; the
    // window of depth x 256 KiB also holds the small ones between them.
    CHECK(stats.prefetch_peak >= depth + 3);  // counting tensors: <= depth (+1 on demand)
    CHECK(stats.prefetch_peak <= depth * 5 + 1);
  }
}

TEST_CASE("Streamed: the window shrinks once the largest saved tensor came back" *
          fixture::sim_only{"the window fills while sim's copy latency keeps copies in flight"}) {
  const SlowPoisonedSim sim;
  // 8 chained 256 KiB activations, then one 4 MiB tensor saved last (as
  // the logits are) and so needed first in backward.
  Chain chain;
  const auto run = [&](const Streamed* manager) {
    return grad_through(chain.x, manager, [&] {
      auto h = chain.x * 1;
      for (int i = 0; i < 8; ++i) h = h.tanh();
      return h.repeat({4, 4}).tanh().sum();
    });
  };
  const auto plain = run(nullptr);
  Streamed manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 1, .prefetch_depth = 1});
  CHECK(at::equal(run(&manager), plain));
  const auto stats = manager.stats();
  CHECK(stats.tensors_offloaded == 9);
  // A window sized by the 4 MiB tensor for the whole backward would bring
  // all eight 256 KiB ones back at once; sized by what is still to come,
  // one is ahead (+1 on demand).
  CHECK(stats.prefetch_peak <= 2);
}

FIXTURE_CASE_TEMPLATE("Streamed: a tensor still in the forward stash is reused, not copied back", M, STREAMED_TYPES) {
  const fixture::Substrate substrate(/*latency_us=*/100, /*poison=*/false);
  Chain chain(fixture::device0());
  M manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 4, .prefetch_depth = 2});
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

FIXTURE_CASE_TEMPLATE("Streamed: correct under a non-default current compute stream", M, STREAMED_TYPES) {
  const fixture::Substrate substrate(/*latency_us=*/300);
  const auto device = fixture::device0();
  const auto plain = harness::train(harness::ModelKind::block, device, 2);
  const auto* guard = c10::impl::getDeviceGuardImpl(device.type());
  const c10::StreamGuard on_pool(guard->getStreamFromGlobalPool(device));
  for (int r = 0; r < 5; ++r) {
    M manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 2});
    const auto offloaded = harness::train(harness::ModelKind::block, device, 2, [&](const harness::Forward& f) {
      offload::Scope scope(manager);
      return f();
    });
    std::string why;
    CHECK_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), why);
    CHECK(manager.stats().storages_offloaded > 0);
    CHECK(manager.stats().tensors_reloaded + manager.stats().stash_reuses > 0);
  }
}

namespace {

// device::Sim that notes each stream the allocator is told about
// (record_stream), to see which consumers of a reloaded buffer were.
struct RecordingSim : offload::device::Sim {
  static std::vector<c10::Stream>& recorded() {
    static std::vector<c10::Stream> streams;
    return streams;
  }
  static void record_stream(const at::Tensor& t, c10::Stream stream) {
    recorded().push_back(stream);
    offload::device::Sim::record_stream(t, stream);
  }
};

}  // namespace

TEST_CASE("Streamed: a storage saved from two streams is waited for and recorded on both in backward" *
          fixture::sim_only{"a device policy over sim notes the streams the allocator is told of"}) {
  // h is saved twice, through two views, by ops forward ran on two streams
  // (sin on s1 saves h, cos on s2 saves h.t()): it is reloaded once and
  // both consumers read the buffer, each on its node's forward stream.
  const SlowPoisonedSim sim;
  const auto* guard = c10::impl::getDeviceGuardImpl(sim0.type());
  const c10::Stream s1 = guard->getStreamFromGlobalPool(sim0);
  const c10::Stream s2 = guard->getStreamFromGlobalPool(sim0);
  REQUIRE(s1 != s2);
  const auto x = at::randn({kSide, kSide}).to(sim0).requires_grad_();
  const auto join = [&](c10::Stream from, c10::Stream to) {
    c10::Event ready(sim0.type());
    ready.record(from);
    ready.block(to);
  };
  using Recording = offload::Manager<RecordingSim, offload::storage::PinnedHost, offload::sync::Streamed>;
  const auto run = [&](const Recording* manager) {
    std::optional<offload::Scope> scope;
    if (manager != nullptr) scope.emplace(*manager);
    const c10::Stream home = guard->getStream(sim0);
    auto h = x * 2;  // an activation
    join(home, s1);
    join(home, s2);
    at::Tensor a;
    at::Tensor b;
    {
      const c10::StreamGuard on_s1(s1);
      a = h.sin().sum();
    }
    {
      const c10::StreamGuard on_s2(s2);
      b = h.t().cos().sum();
    }
    join(s1, home);
    join(s2, home);
    auto loss = a + b;
    scope.reset();
    x.mutable_grad() = at::Tensor();
    RecordingSim::recorded().clear();
    loss.backward();
    offload::sim::synchronize();
    return x.grad().to(at::kCPU);
  };
  const auto plain = run(nullptr);
  Recording manager(offload::Options{.min_offload_bytes = 1024, .max_fwd_stash = 1, .prefetch_depth = 0});
  const auto grad = run(&manager);
  CHECK(at::equal(grad, plain));
  const auto stats = manager.stats();
  CHECK(stats.storages_offloaded == 1);
  CHECK(stats.tensors_reloaded == 1);
  CHECK(stats.reloads_shared == 1);
  // Brought back on demand for the first consumer, on its stream; the
  // second consumer's stream is the other one, and the allocator must be
  // told of it.
  const auto on = [&](c10::Stream s) {
    return std::count(RecordingSim::recorded().begin(), RecordingSim::recorded().end(), s);
  };
  CHECK(on(s1) + on(s2) == 1);
}

namespace {

// device::Sim that notes the side stream Streamed asked for last.
struct SideNotingSim : offload::device::Sim {
  static std::optional<c10::Stream>& side() {
    static std::optional<c10::Stream> stream;
    return stream;
  }
  static c10::Stream side_stream(c10::DeviceIndex index) {
    side() = offload::device::Sim::side_stream(index);
    return *side();
  }
};

}  // namespace

TEST_CASE_TEMPLATE("Streamed: releasing storages whose copies still run never makes the host wait" *
                       fixture::sim_only{"sim's copy latency keeps the copies running when the graph is dropped"},
                   Storage, offload::storage::PinnedHost, offload::storage::PinnedPool) {
  // 16 copies of 50 ms queue on the side stream at the end of forward;
  // dropping the graph releases every storage while they run. The host
  // goes on at once (a wait there would stall autograd's device thread and,
  // from Python, the GIL), and a pooled host buffer is not handed out again
  // before its copy ended.
  const SlowPoisonedSim sim(50'000);
  Chain chain;
  offload::storage::PinnedPool::trim(sim0);
  const auto pool_before = offload::storage::PinnedPool::stats(sim0).in_use_bytes;
  {
    offload::Manager<SideNotingSim, Storage, offload::sync::Streamed> manager(
        offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 16});
    at::Tensor loss;
    {
      offload::Scope scope(manager);
      loss = chain.forward();
    }
    REQUIRE(manager.stats().storages_offloaded == 16);
    loss = at::Tensor();  // the graph and every saved tensor go
    CHECK(manager.stats().host_bytes_in_use == 0);
    REQUIRE(SideNotingSim::side());
    const auto* guard = c10::impl::getDeviceGuardImpl(sim0.type());
    CHECK_FALSE(guard->queryStream(*SideNotingSim::side()));  // the copies still run: nobody waited
    CHECK(manager.stats().host_waits == 0);
    if constexpr (std::is_same_v<Storage, offload::storage::PinnedPool>) {
      // still carved out for the copies that use them
      CHECK(offload::storage::PinnedPool::stats(sim0).in_use_bytes > pool_before);
    }
    offload::sim::synchronize();
    // A later step releases what ended, and its backward waits for nothing.
    for (int step = 0; step < 2; ++step) {
      offload::Scope scope(manager);
      chain.x.mutable_grad() = at::Tensor();
      chain.forward().backward();
    }
    CHECK(manager.stats().host_waits == 0);
    CHECK(manager.stats().tensors_reloaded + manager.stats().stash_reuses > 0);
  }
  CHECK(offload::storage::PinnedPool::stats(sim0).in_use_bytes == pool_before);
}

TEST_CASE_TEMPLATE("capture: tensors saved under a graph capture stay, counted; one needed under capture raises" *
                       fixture::sim_only{"sim's simulated capture (offload::sim::set_capturing)"},
                   Sync, offload::sync::Blocking, offload::sync::Streamed) {
  const SlowPoisonedSim sim;
  const auto* guard = c10::impl::getDeviceGuardImpl(sim0.type());
  const c10::Stream stream = guard->getStream(sim0);  // this thread's current stream of sim:0
  const auto x = at::randn({kSide, kSide}).to(sim0).requires_grad_();
  const auto f = [&] { return (x * 2).tanh().sin().sum(); };
  offload::Manager<offload::device::Sim, offload::storage::PinnedHost, Sync> manager(
      offload::Options{.min_offload_bytes = 0});
  const auto plain = grad_through(x, static_cast<const Streamed*>(nullptr), f);
  // Forward while the stream captures: every saved tensor stays, nothing
  // the capture cannot hold (event waits, host allocations, side-stream
  // copies) is queued, and backward after the capture is the plain one.
  at::Tensor loss;
  offload::sim::set_capturing(stream, true);
  {
    offload::Scope scope(manager);
    loss = f();
  }
  offload::sim::set_capturing(stream, false);
  auto stats = manager.stats();
  CHECK(stats.passed_capture == 2);  // tanh's output and sin's input (the same tensor), counted per saved tensor
  CHECK(stats.storages_offloaded == 0);
  x.mutable_grad() = at::Tensor();
  loss.backward();
  CHECK(at::equal(x.grad().to(at::kCPU), plain));
  // Offloaded before the capture, needed under it (a captured backward): an
  // error naming the library, before anything is copied back.
  {
    offload::Scope scope(manager);
    loss = f();
  }
  REQUIRE(manager.stats().storages_offloaded > 0);
  const auto reloaded = manager.stats().tensors_reloaded;
  offload::sim::set_capturing(stream, true);
  CHECK_THROWS_WITH_AS(loss.backward(), doctest::Contains("captures a graph"), c10::Error);
  offload::sim::set_capturing(stream, false);
  CHECK(manager.stats().tensors_reloaded == reloaded);
  loss = at::Tensor();
  // and the manager goes on as before
  {
    offload::Scope scope(manager);
    loss = f();
  }
  x.mutable_grad() = at::Tensor();
  loss.backward();
  CHECK(at::equal(x.grad().to(at::kCPU), plain));
  CHECK(manager.stats().tensors_reloaded + manager.stats().stash_reuses > reloaded);
}
