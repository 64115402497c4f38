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

TEST_CASE("sim collectives: a posted recv does not block; send and recv pair in order per peer and tag") {
  const auto store = on_two_ranks([](int rank, c10d::Backend& backend) {
    const int peer = 1 - rank;
    // Both ranks post their receives before their sends (what
    // batch_isend_irecv does): posting must not wait for the peer.
    std::vector<at::Tensor> first{at::empty({6}, at::TensorOptions().device(sim0))};
    std::vector<at::Tensor> second{at::empty({6}, at::TensorOptions().device(sim0))};
    std::vector<at::Tensor> tagged{at::empty({2, 3}, at::TensorOptions().device(sim0))};
    auto r1 = backend.recv(first, peer, 0);
    auto r2 = backend.recv(second, peer, 0);
    auto r3 = backend.recv(tagged, peer, 7);
    std::vector<at::Tensor> a{ranked(rank)}, b{ranked(rank) * 2}, c{ranked(rank).reshape({2, 3}) * 3};
    backend.send(c, peer, 7)->wait();  // another tag: matched by tag, not by order across tags
    backend.send(a, peer, 0)->wait();
    backend.send(b, peer, 0)->wait();
    CHECK(r3->wait());
    CHECK(r1->wait());
    CHECK(r2->isCompleted());  // its message is there: completing does not block
    CHECK(r2->isSuccess());
    CHECK(r1->sourceRank() == peer);
    CHECK(at::equal(first[0].cpu(), ranked(peer).cpu()));
    CHECK(at::equal(second[0].cpu(), (ranked(peer) * 2).cpu()));
    CHECK(at::equal(tagged[0].cpu(), (ranked(peer).reshape({2, 3}) * 3).cpu()));
    CHECK(at::equal(r1->getFuture()->value().toTensorList().get(0).cpu(), ranked(peer).cpu()));

    // A recv into a leaf that requires grad (a pipeline stage's input
    // buffer) writes it outside autograd, like a device backend.
    std::vector<at::Tensor> leaf{at::zeros({6}, at::TensorOptions().device(sim0)).requires_grad_()};
    const auto version = leaf[0]._version();
    auto r4 = backend.recv(leaf, peer, 0);
    backend.send(a, peer, 0);
    r4->wait();
    CHECK(at::equal(leaf[0].detach().cpu(), ranked(peer).cpu()));
    CHECK(leaf[0]._version() == version);
    backend.barrier()->wait();
  });
  CHECK(store->getNumKeys() == 0);  // each message's key is deleted when received
}

TEST_CASE("sim collectives: gather to a root and scatter from one") {
  const auto store = on_two_ranks([](int rank, c10d::Backend& backend) {
    std::vector<at::Tensor> in{ranked(rank)};
    std::vector<std::vector<at::Tensor>> gathered;
    if (rank == 1) gathered = {{at::empty({6}, in[0].options()), at::empty({6}, in[0].options())}};
    backend.gather(gathered, in, c10d::GatherOptions{.rootRank = 1})->wait();
    if (rank == 1) {
      CHECK(at::equal(gathered[0][0].cpu(), ranked(0).cpu()));
      CHECK(at::equal(gathered[0][1].cpu(), ranked(1).cpu()));
    }
    std::vector<at::Tensor> out{at::empty({6}, in[0].options())};
    std::vector<std::vector<at::Tensor>> pieces;
    if (rank == 0) pieces = {{ranked(5), ranked(6)}};
    backend.scatter(out, pieces, c10d::ScatterOptions{.rootRank = 0})->wait();
    CHECK(at::equal(out[0].cpu(), ranked(5 + rank).cpu()));
    backend.barrier()->wait();
  });
  CHECK(store->getNumKeys() == 0);
}

TEST_CASE("sim collectives: other operations throw NotImplementedError naming them and the backend") {
  on_two_ranks([](int /*rank*/, c10d::Backend& backend) {
    std::vector<at::Tensor> t{at::ones({4}, at::TensorOptions().device(sim0))};
    CHECK(thrown<c10::NotImplementedError>([&] { backend.reduce(t); }) ==
          "offload::sim collectives: reduce is not supported by the offload_sim backend");
    CHECK(thrown<c10::NotImplementedError>(
              [&] { backend.allreduce(t, c10d::AllreduceOptions{.reduceOp = c10d::ReduceOp::PRODUCT}); }) ==
          "offload::sim collectives: allreduce with ReduceOp.PRODUCT is not supported by the offload_sim backend");
    CHECK(thrown<c10::NotImplementedError>([&] { backend.recvAnysource(t, 0); }) ==
          "offload::sim collectives: recvAnysource is not supported by the offload_sim backend");
    CHECK(backend.getBackendName() == "offload_sim");
  });
}

TEST_CASE("sim collectives: the backend's arguments are checked") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  {
    offload::sim::install();
    auto backend = offload::sim::make_collective_backend(store, 0, 2, std::chrono::seconds(1));
    std::vector<at::Tensor> t{at::ones({4}, at::TensorOptions().device(sim0))};
    CHECK(thrown<c10::ValueError>([&] { backend->send(t, 2, 0); }) ==
          "offload::sim collectives: send dstRank must be in [0, 2), got 2");
    CHECK(thrown<c10::ValueError>([&] { backend->recv(t, -1, 0); }) ==
          "offload::sim collectives: recv srcRank must be in [0, 2), got -1");
    std::vector<std::vector<at::Tensor>> none;
    CHECK(thrown<c10::ValueError>([&] { backend->gather(none, t, c10d::GatherOptions{.rootRank = 3}); }) ==
          "offload::sim collectives: gather rootRank must be in [0, 2), got 3");
    CHECK(thrown<c10::ValueError>([&] { backend->gather(none, t, c10d::GatherOptions{.rootRank = 0}); }) ==
          "offload::sim collectives: gather needs on the root 1 output list of 2 tensors, got 0 lists of 0");
    std::vector<std::vector<at::Tensor>> one{{t[0]}};
    CHECK(thrown<c10::ValueError>([&] { backend->scatter(t, one, c10d::ScatterOptions{.rootRank = 0}); }) ==
          "offload::sim collectives: scatter needs on the root 1 input list of 2 tensors, got 1 lists of 1");
    CHECK(store->getNumKeys() == 0);  // refused before anything was exchanged
  }
  CHECK(thrown<c10::ValueError>([&] { offload::sim::make_collective_backend(store, 2, 2, std::chrono::seconds(1)); }) ==
        "offload::sim::make_collective_backend: rank must be in [0, 2), got 2");
  CHECK(thrown<c10::ValueError>([&] { offload::sim::make_collective_backend(store, 0, 0, std::chrono::seconds(1)); }) ==
        "offload::sim::make_collective_backend: size must be >= 1, got 0");
}
