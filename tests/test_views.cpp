// SPDX-License-Identifier: MIT
// Saved views: offsets, transposes, expands, several views of one storage,
// narrow views that move only their bytes, later views that reach outside
// what was copied, and the geometry of what comes back. First on the CPU
// path (HostAsDevice, in every build), then every parity manager type on
// the test device (OFFLOAD_TEST_DEVICE, sim by default; tests/fixture.hpp).

#include "doctest.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <offload/offload.hpp>

#if OFFLOAD_HAS_SIM
#include "fixture.hpp"
#endif
#include "harness.hpp"

namespace {

using HostManager = offload::Manager<harness::HostAsDevice, offload::storage::PageableHost, offload::sync::Blocking>;

}  // namespace

TEST_CASE("views: offset, transpose, expand and several views of one storage come back exact") {
  HostManager manager(offload::Options{.min_offload_bytes = 0});
  auto w = at::randn({6, 8}).requires_grad_();
  auto run = [&](bool offload) {
    if (w.grad().defined()) w.grad().zero_();
    std::optional<offload::Scope> scope;
    if (offload) scope.emplace(manager);
    auto base = w * 1.5;                                            // one storage, saved through several views
    auto sliced = base.narrow(0, 2, 3);                             // storage offset 16
    auto transposed = base.t();                                     // strides swapped
    auto expanded = base.select(0, 1).unsqueeze(0).expand({4, 8});  // stride 0
    auto loss = (sliced * sliced).sum() + (transposed.exp() * transposed).sum() + (expanded * expanded).sum();
    scope.reset();
    loss.backward();
    return std::make_pair(loss.detach().clone(), w.grad().clone());
  };
  auto [plain_loss, plain_grad] = run(false);
  auto [off_loss, off_grad] = run(true);
  CHECK(at::equal(plain_loss, off_loss));
  CHECK(at::equal(plain_grad, off_grad));
  const auto stats = manager.stats();
  CHECK(stats.tensors_aliased >= 2);  // the views share one host copy
  CHECK(stats.storages_offloaded < stats.tensors_offloaded);
}

TEST_CASE("views: an in-place change to a saved tensor gives the same error as without offloading") {
  HostManager manager(offload::Options{.min_offload_bytes = 0});
  auto w = at::randn({8, 8}).requires_grad_();
  auto attempt = [&](bool offload) -> std::string {
    std::optional<offload::Scope> scope;
    if (offload) scope.emplace(manager);
    auto h = w * 2;
    auto y = h.exp();  // exp saves its result
    y.add_(1);
    scope.reset();
    try {
      y.sum().backward();
    } catch (const c10::Error& e) {
      std::string what = e.what_without_backtrace();
      return what;
    }
    return "no error";
  };
  const auto plain = attempt(false);
  CHECK(plain.find("modified by an inplace operation") != std::string::npos);
  CHECK(attempt(true) == plain);
}

TEST_CASE("views: only the bytes a saved view reads are copied; a narrow of the last dimension") {
  // h is a 512 x 512 float non-leaf (1 MiB); v = h.narrow(1, 0, 8) reads
  // 8 floats of each row: 16,384 bytes. Only those travel and stay on the host.
  HostManager manager(offload::Options{.min_offload_bytes = 0});
  auto w = at::randn({512, 512}).requires_grad_();
  auto run = [&](bool offload, std::int64_t start) {
    w.mutable_grad() = at::Tensor();
    std::optional<offload::Scope> scope;
    if (offload) scope.emplace(manager);
    auto h = w * 2.0;
    auto v = h.narrow(1, start, 8);
    auto loss = v.pow(2).sum();
    scope.reset();
    loss.backward();
    return std::make_pair(loss.detach().clone(), w.grad().clone());
  };
  for (std::int64_t start : {0, 3, 504}) {
    CAPTURE(start);
    manager.reset_stats();
    const auto [plain_loss, plain_grad] = run(false, start);
    const auto [off_loss, off_grad] = run(true, start);
    CHECK(at::equal(plain_loss, off_loss));
    CHECK(at::equal(plain_grad, off_grad));
    const auto stats = manager.stats();
    CHECK(stats.storages_offloaded == 1);
    CHECK(stats.bytes_offloaded == 16384);
    CHECK(stats.host_bytes_peak == 16384);
    CHECK(stats.bytes_reloaded == 16384);
    CHECK(stats.host_bytes_in_use == 0);
  }
}

TEST_CASE("views: a later view of the same storage reaching outside what was copied copies what is missing") {
  // h: 64 rows of 1 KiB. Saved in turn: rows 0-3, rows 2-5 (2 KiB missing),
  // 8 floats of every row (strided: 2 KiB), rows 8-9 as complex64, rows 0-5
  // again (covered). Each comes back with its own dtype, sizes, strides and
  // storage offset, from one device buffer per backward pass.
  HostManager manager(offload::Options{.min_offload_bytes = 32768});
  auto w = at::randn({64, 256}).requires_grad_();
  std::vector<at::Tensor> unpacked_geometry;
  auto run = [&](bool offload) {
    w.mutable_grad() = at::Tensor();
    std::optional<offload::Scope> scope;
    if (offload) scope.emplace(manager);
    auto h = w * 2.0;
    auto a = h.narrow(0, 0, 4);
    auto b = h.narrow(0, 2, 4);
    auto c = h.narrow(1, 0, 8);
    auto hc = at::view_as_complex(h.narrow(0, 8, 2).view({2, 128, 2}));
    auto d = h.narrow(0, 0, 6);
    auto loss = a.pow(2).sum() + b.pow(3).sum() + c.pow(2).sum() + at::real(hc * hc).sum() + d.pow(2).sum();
    scope.reset();
    loss.backward();
    return std::make_pair(loss.detach().clone(), w.grad().clone());
  };
  const auto [plain_loss, plain_grad] = run(false);
  const auto [off_loss, off_grad] = run(true);
  CHECK(at::equal(plain_loss, off_loss));
  CHECK(at::equal(plain_grad, off_grad));
  const auto stats = manager.stats();
  CHECK(stats.storages_offloaded == 1);
  CHECK(stats.tensors_aliased == stats.tensors_offloaded - 1);
  // 4096 (rows 0-3) + 2048 (rows 4-5) + 2048 (the column block) + 2048 (rows 8-9)
  CHECK(stats.bytes_offloaded == 4096 + 2048 + 2048 + 2048);
  CHECK(stats.host_bytes_peak == stats.bytes_offloaded);
  CHECK(stats.tensors_reloaded == 1);  // one device buffer for every view
  CHECK(stats.reloads_shared == stats.tensors_offloaded - 1);
  CHECK(stats.bytes_reloaded == stats.bytes_offloaded);
  CHECK(stats.host_bytes_in_use == 0);
}

TEST_CASE("views: unpacked views keep their dtype, sizes, strides and storage offset") {
  // The hooks object directly: pack under no-grad as the engine does, unpack,
  // compare geometry and bytes; then a later view that reaches outside.
  HostManager manager(offload::Options{.min_offload_bytes = 0});
  const auto h = at::randn({32, 64}).requires_grad_() * 1;  // an activation: not a leaf
  const std::vector<at::Tensor> views = {h.narrow(1, 5, 8),
                                         h.narrow(0, 3, 2),
                                         h.t(),
                                         at::view_as_complex(h.narrow(0, 4, 1).view({32, 2})),
                                         h.select(1, 7).unsqueeze(0).expand({3, 32}),
                                         h.narrow(0, 1, 0)};
  std::vector<std::unique_ptr<torch::autograd::SavedVariableHooks>> hooks;
  {
    const c10::NoGradGuard no_grad;
    for (const auto& v : views) {
      hooks.push_back(manager.make_hooks());
      hooks.back()->call_pack_hook(v);
    }
  }
  for (std::size_t i = 0; i < views.size(); ++i) {
    CAPTURE(i);
    const auto back = hooks[i]->call_unpack_hook();
    CHECK((back.scalar_type() == views[i].scalar_type()));
    CHECK((back.sizes() == views[i].sizes()));
    CHECK((back.strides() == views[i].strides()));
    CHECK(back.storage_offset() == views[i].storage_offset());
    CHECK(at::equal(back, views[i]));
  }
  CHECK(manager.stats().storages_offloaded == 1);

  // An empty view is the first saved view of its storage, at a storage
  // offset past the storage's last byte (a slice after the last row, then a
  // narrow of its columns): nothing to copy, and it comes back as it was.
  const auto g = at::randn({16, 16}).requires_grad_() * 1;
  const auto empty = g.narrow(0, 16, 0).narrow(1, 1, 8);  // storage offset 257 of 256 elements
  REQUIRE(empty.storage_offset() * 4 > static_cast<std::int64_t>(g.storage().nbytes()));
  auto empty_hooks = manager.make_hooks();
  {
    const c10::NoGradGuard no_grad;
    empty_hooks->call_pack_hook(empty);
  }
  const auto back = empty_hooks->call_unpack_hook();
  CHECK((back.sizes() == empty.sizes()));
  CHECK((back.strides() == empty.strides()));
  CHECK(back.storage_offset() == empty.storage_offset());
  CHECK(manager.stats().storages_offloaded == 2);
}

#if OFFLOAD_HAS_SIM

namespace {

using fixture::kParityDelayUs;

at::Tensor on(const at::Tensor& t, c10::Device d) { return t.to(d); }

}  // namespace

FIXTURE_CASE_TEMPLATE("views: on the test device, offset, transposed, permuted, expanded, several views of one storage",
                      M, FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  auto w = on(at::randn({6, 8, 4}), fixture::device0()).requires_grad_();
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

FIXTURE_CASE_TEMPLATE(
    "views: on the test device, a saved narrow view moves only its bytes; later views copy what is missing", M,
    FIXTURE_PARITY_TYPES) {
  const fixture::Substrate substrate(kParityDelayUs);
  auto w = on(at::randn({512, 512}), fixture::device0()).requires_grad_();
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

#endif  // OFFLOAD_HAS_SIM
