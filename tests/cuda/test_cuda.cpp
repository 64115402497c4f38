// SPDX-License-Identifier: MIT
// The `cuda` suite: parity under both sync policies, device index, and the
// device-memory drop measured with the CUDA caching allocator's statistics.
// Every case reports itself skipped where no CUDA device is visible; run on
// a GPU machine with scripts/gpu-check.

#include "../doctest.hpp"

#include <cstdlib>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/offload.hpp>

#include "../harness.hpp"

namespace {

bool have_gpu() {
  static const bool yes = [] {
    try {
      return offload::device::Cuda::available();
    } catch (const std::exception&) {
      return false;
    }
  }();
  return yes;
}

// Bitwise comparisons need deterministic kernels (embedding backward uses
// atomics otherwise; cuBLAS needs a fixed workspace): strict for the case
// that makes one, and restored after it, so no later suite inherits it.
class Deterministic {
 public:
  Deterministic()
      : was_(at::globalContext().deterministicAlgorithms()),
        warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  }
  ~Deterministic() { at::globalContext().setDeterministicAlgorithms(was_, warn_only_); }
  Deterministic(const Deterministic&) = delete;
  Deterministic& operator=(const Deterministic&) = delete;

 private:
  bool was_;
  bool warn_only_;
};

template <class Sync>
using CudaManager = offload::Manager<offload::device::Cuda, offload::storage::PinnedHost, Sync>;

}  // namespace

TEST_CASE_TEMPLATE("cuda: parity of MLP, block and GPT, 3 AdamW steps" * doctest::skip(!have_gpu()), Sync,
                   offload::sync::Blocking, offload::sync::Streamed) {
  const Deterministic deterministic;
  const c10::Device cuda0(c10::DeviceType::CUDA, 0);
  for (auto kind : {harness::ModelKind::mlp, harness::ModelKind::block, harness::ModelKind::gpt}) {
    CAPTURE(harness::name(kind));
    const auto plain = harness::train(kind, cuda0, 3);
    for (int r = 0; r < 5; ++r) {
      CudaManager<Sync> manager(offload::Options{.min_offload_bytes = 0, .max_fwd_stash = 2});
      const auto off = harness::train(kind, cuda0, 3, harness::with_scope(manager),
                                      [&](const std::vector<at::Tensor>& p) { manager.exclude(p); });
      std::string why;
      REQUIRE_MESSAGE(harness::bitwise_equal(plain, off, &why), why);
      CHECK(manager.stats().storages_offloaded > 0);
    }
  }
}

TEST_CASE_TEMPLATE("cuda: tensors come back on the device index they came from" * doctest::skip(!have_gpu()), Sync,
                   offload::sync::Blocking, offload::sync::Streamed) {
  const auto last =
      static_cast<c10::DeviceIndex>(c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount() - 1);
  const c10::Device device(c10::DeviceType::CUDA, last);
  CudaManager<Sync> manager(offload::Options{.min_offload_bytes = 0});
  auto w = at::randn({64, 64}).to(device).requires_grad_();
  const auto grads = harness::grads_plain_and_wrapped(
      w, [](const at::Tensor& t) { return (t * 2).exp().sum(); }, harness::with_scope(manager));
  CHECK(grads.wrapped.device() == device);
  CHECK(at::equal(grads.wrapped, grads.plain));
  CHECK(manager.stats().storages_offloaded == 1);
}

TEST_CASE_TEMPLATE("cuda: device memory drops by exactly the bytes offloaded" * doctest::skip(!have_gpu()), Sync,
                   offload::sync::Blocking, offload::sync::Streamed) {
  const c10::Device cuda0(c10::DeviceType::CUDA, 0);
  auto x = at::randn({128, 256}).to(cuda0);
  auto w = at::randn({256, 256}).to(cuda0).requires_grad_();
  auto forward = [&] { return x.mm(w).tanh().mm(w).sigmoid().sum(); };
  // Warmed up first: this thread's cuBLAS workspace is allocated once, at
  // its first product, and would count as held otherwise. Each count is
  // read settled: blocks the side stream was recorded on are back.
  (void)forward();
  const auto base = harness::settled_device_bytes(cuda0);
  at::Tensor plain_loss = forward();
  const auto held_plain = harness::settled_device_bytes(cuda0) - base;
  plain_loss = at::Tensor();
  CudaManager<Sync> manager(offload::Options{.min_offload_bytes = 0});
  manager.exclude({x});
  at::Tensor loss;
  {
    offload::Scope scope(manager);
    loss = forward();
  }
  const auto held_offloaded = harness::settled_device_bytes(cuda0) - base;
  CHECK(manager.stats().bytes_offloaded > 0);
  CHECK(held_plain - held_offloaded == manager.stats().bytes_offloaded);
  loss.backward();
}
