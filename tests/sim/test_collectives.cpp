// SPDX-License-Identifier: MIT
//
// Tests of the sim collective backend (<offload/sim_collectives.hpp>) from
// C++: two ranks as two threads of this process on one c10d::HashStore
// (the 2-process suites are tests/python/test_distributed.py and the
// demo's `--ranks 2` check).

#include <offload/sim.hpp>
#include <offload/sim_collectives.hpp>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int world = 2;
const c10::Device sim0{c10::DeviceType::PrivateUse1, 0};

/// Runs body(rank, backend) on `world` threads that share one store;
/// rethrows the first failure. Returns the store.
c10::intrusive_ptr<c10d::HashStore> on_two_ranks(const std::function<void(int, c10d::Backend&)>& body) {
  offload::sim::install();
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto backend = offload::sim::make_collective_backend(store, rank, world, std::chrono::seconds(30));
        body(rank, *backend);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return store;
}

/// The message of the E that f() throws (without the backtrace), or "nothing thrown".
template <class E, class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what_without_backtrace();
  }
  return "nothing thrown";
}

at::Tensor ranked(int rank) { return (at::arange(6, at::kFloat) + 10 * rank).to(sim0); }

}  // namespace

TEST_CASE("sim collectives: all-reduce, gather, scatter and broadcast give every rank the same bits") {
  const auto store = on_two_ranks([](int rank, c10d::Backend& backend) {
    for (const auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::AVG, c10d::ReduceOp::MIN, c10d::ReduceOp::MAX}) {
      std::vector<at::Tensor> t{ranked(rank)};
      auto work = backend.allreduce(t, c10d::AllreduceOptions{.reduceOp = op});
      CHECK(work->wait());
      const auto a = ranked(0).cpu(), b = ranked(1).cpu();
      const auto want = op == c10d::ReduceOp::SUM   ? a + b
                        : op == c10d::ReduceOp::AVG ? (a + b) / 2
                        : op == c10d::ReduceOp::MIN ? at::minimum(a, b)
                                                    : at::maximum(a, b);
      CHECK(at::equal(t[0].cpu(), want));
      // The future holds the outputs (what DDP's reducer reads).
      CHECK(at::equal(work->getFuture()->value().toTensorList().get(0).cpu(), want));
    }
    auto in = ranked(rank);
    auto gathered = at::empty({world * 6}, in.options());
    backend._allgather_base(gathered, in)->wait();
    CHECK(at::equal(gathered.cpu(), at::cat({ranked(0), ranked(1)}).cpu()));

    auto part = at::empty({3}, in.options());
    backend._reduce_scatter_base(part, in, c10d::ReduceScatterOptions{})->wait();
    CHECK(at::equal(part.cpu(), (ranked(0) + ranked(1)).cpu().narrow(0, 3 * rank, 3)));

    std::vector<at::Tensor> b{ranked(rank)};
    backend.broadcast(b, c10d::BroadcastOptions{.rootRank = 1})->wait();
    CHECK(at::equal(b[0].cpu(), ranked(1).cpu()));
    backend.barrier()->wait();
  });
  CHECK(store->getNumKeys() == 0);  // every collective deleted its keys
}

TEST_CASE("sim collectives: other operations throw NotImplementedError naming them and the backend") {
  on_two_ranks([](int /*rank*/, c10d::Backend& backend) {
    std::vector<at::Tensor> t{at::ones({4}, at::TensorOptions().device(sim0))};
    CHECK(thrown<c10::NotImplementedError>([&] { backend.reduce(t); }) ==
          "offload::sim collectives: reduce is not supported by the offload_sim backend");
    CHECK(thrown<c10::NotImplementedError>(
              [&] { backend.allreduce(t, c10d::AllreduceOptions{.reduceOp = c10d::ReduceOp::PRODUCT}); }) ==
          "offload::sim collectives: allreduce with ReduceOp.PRODUCT is not supported by the offload_sim backend");
    CHECK(backend.getBackendName() == "offload_sim");
  });
}

TEST_CASE("sim collectives: the backend's arguments are checked") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  CHECK(thrown<c10::ValueError>([&] { offload::sim::make_collective_backend(store, 2, 2, std::chrono::seconds(1)); }) ==
        "offload::sim::make_collective_backend: rank must be in [0, 2), got 2");
  CHECK(thrown<c10::ValueError>([&] { offload::sim::make_collective_backend(store, 0, 0, std::chrono::seconds(1)); }) ==
        "offload::sim::make_collective_backend: size must be >= 1, got 0");
}
