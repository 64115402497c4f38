// SPDX-License-Identifier: MIT
//
// Tests of the simulated accelerator (offload::sim). Every test installs the
// default Config (the process shares one installation) and restores the
// runtime knobs it changes with offload::sim::ScopedKnobs.

#include <offload/sim.hpp>

#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/torch.h>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace sim = offload::sim;
constexpr auto kSim = c10::DeviceType::PrivateUse1;

c10::Device sim_device(c10::DeviceIndex index = 0) {
  sim::install();
  return {kSim, index};
}

c10::Stream current_stream(c10::DeviceIndex index = 0) { return at::accelerator::getCurrentStream(index); }

c10::Stream pool_stream(c10::DeviceIndex index = 0) {
  return c10::impl::getDeviceGuardImpl(kSim)->getStreamFromGlobalPool({kSim, index});
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && torch::equal(a.cpu(), b.cpu());
}

// --------------------------------------------------------------- model pieces

// What one run of a piece produced: outputs, and leaves whose grads count.
struct PieceRun {
  std::vector<torch::Tensor> outputs;
  std::vector<torch::Tensor> leaves;
};
using Piece = std::function<PieceRun(const c10::Device&)>;

// Runs `piece` on the CPU and on sim:0 (same seeds), back-propagates a fixed
// upstream gradient through every floating output, and checks outputs and
// leaf gradients are bitwise equal and that sim results stayed on sim:0.
void check_piece(const char* name, const Piece& piece) {
  INFO("piece: " << std::string(name));
  const auto run = [&](const c10::Device& device) {
    torch::manual_seed(1234);
    auto r = piece(device);
    torch::Tensor total;
    for (const auto& out : r.outputs) {
      CHECK(out.device() == device);
      if (out.requires_grad()) {
        const auto upstream = torch::linspace(-1.0, 1.0, out.numel()).view(out.sizes()).to(device);
        const auto term = (out * upstream).sum();
        total = total.defined() ? total + term : term;
      }
    }
    if (total.defined()) {
      total.backward();
    }
    std::vector<torch::Tensor> values;
    for (const auto& out : r.outputs) {
      values.push_back(out.detach().cpu());
    }
    for (const auto& leaf : r.leaves) {
      REQUIRE(leaf.grad().defined());
      CHECK(leaf.grad().device() == device);
      values.push_back(leaf.grad().cpu());
    }
    return values;
  };
  const auto expected = run(torch::kCPU);
  const auto actual = run(sim_device(0));
  REQUIRE(expected.size() == actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("value " << i);
    CHECK(bitwise_equal(expected[i], actual[i]));
  }
}

torch::Tensor leaf(torch::Tensor cpu, const c10::Device& device) {
  return cpu.to(device).detach().requires_grad_(true);
}

// A tiny GPT-like model built from every piece above.
struct TinyImpl : torch::nn::Module {
  TinyImpl()
      : emb(register_module("emb", torch::nn::Embedding(11, 8))),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})))),
        fc(register_module("fc", torch::nn::Linear(8, 11))) {}

  torch::Tensor forward(const torch::Tensor& idx) {
    auto x = emb(idx);  // [B, T, 8]
    auto att = torch::bmm(x, x.transpose(1, 2)) / std::sqrt(8.0);
    att = torch::softmax(att, -1);
    x = x + torch::matmul(att, x);
    x = torch::gelu(ln(x));
    x = torch::dropout(x, 0.2, is_training());
    return fc(x);
  }

  torch::nn::Embedding emb;
  torch::nn::LayerNorm ln;
  torch::nn::Linear fc;
};
TORCH_MODULE(Tiny);

}  // namespace

TEST_CASE("sim: install validates, is idempotent and names what differs") {
  sim::install();
  CHECK(sim::installed());
  CHECK(sim::config() == sim::Config{});
  CHECK_NOTHROW(sim::install(sim::Config{}));

  const auto bad = [](auto&& mutate) {
    sim::Config c;
    mutate(c);
    try {
      sim::install(c);
    } catch (const c10::ValueError& e) {
      return std::string(e.what());
    } catch (const std::exception& e) {
      return std::string("wrong exception type: ") + e.what();
    }
    return std::string("<no exception>");
  };
  auto msg = bad([](sim::Config& c) { c.num_devices = 0; });
  CHECK(msg.find("num_devices must be in [1, 16], got 0") != std::string::npos);
  msg = bad([](sim::Config& c) { c.num_devices = 17; });
  CHECK(msg.find("num_devices must be in [1, 16], got 17") != std::string::npos);
  msg = bad([](sim::Config& c) { c.copy_delay_us = -1; });
  CHECK(msg.find("copy_delay_us must be in [0, 10000000], got -1") != std::string::npos);
  msg = bad([](sim::Config& c) { c.copy_delay_us = 10'000'001; });
  CHECK(msg.find("copy_delay_us") != std::string::npos);
  msg = bad([](sim::Config& c) { c.capacity_bytes = -5; });
  CHECK(msg.find("capacity_bytes must be >= 0 (0 = unlimited), got -5") != std::string::npos);
  msg = bad([](sim::Config& c) { c.backend_name = "cuda"; });
  CHECK(msg.find("backend_name") != std::string::npos);
  CHECK(msg.find("'cuda'") != std::string::npos);
  msg = bad([](sim::Config& c) { c.backend_name = "Sim"; });
  CHECK(msg.find("'Sim'") != std::string::npos);

  sim::Config other;
  other.num_devices = 3;
  other.backend_name = "npu";  // a valid name: fails only because it differs
  msg = error_of([&] { sim::install(other); });
  CHECK(msg.find("backend_name: installed 'sim', requested 'npu'") != std::string::npos);
  CHECK(msg.find("num_devices: installed 2, requested 3") != std::string::npos);

  CHECK_THROWS_AS(sim::set_copy_delay_us(-1), c10::ValueError);
  CHECK_THROWS_AS(sim::set_capacity_bytes(-1), c10::ValueError);
  CHECK_THROWS_AS((void)sim::device_memory(2), c10::Error);
  CHECK(sim::config() == sim::Config{});  // nothing changed by the failures

  {
    sim::ScopedKnobs knobs;
    sim::set_copy_delay_us(7);
    sim::set_poison_freed(true);
    sim::set_capacity_bytes(1 << 20);
    CHECK(sim::config().copy_delay_us == 7);
    CHECK(sim::config().poison_freed);
    CHECK_NOTHROW(sim::install());  // knobs moved; the installed Config did not
    CHECK(sim::config().capacity_bytes == (1 << 20));
  }
  CHECK(sim::config() == sim::Config{});
}

TEST_CASE("sim: accelerator, backend name, devices and guard") {
  const auto dev = sim_device();
  CHECK(c10::get_privateuse1_backend() == "sim");
  REQUIRE(at::getAccelerator().has_value());
  CHECK(*at::getAccelerator() == kSim);
  CHECK(at::accelerator::deviceCount() == 2);
  CHECK(c10::Device("sim:1") == c10::Device(kSim, 1));
  CHECK(dev.str() == "sim:0");

  {
    const c10::DeviceGuard guard(c10::Device(kSim, 1));
    CHECK(at::accelerator::getDeviceIndex() == 1);
    const auto t = torch::empty({3}, torch::TensorOptions().device(kSim));  // current device
    CHECK(t.device() == c10::Device(kSim, 1));
  }
  CHECK(at::accelerator::getDeviceIndex() == 0);
  CHECK_THROWS_AS(at::accelerator::setDeviceIndex(2), c10::Error);

  // Streams: default is id 0, pool streams differ, current is per thread.
  CHECK(current_stream(0).id() == 0);
  const auto side = pool_stream(0);
  CHECK(side.id() != 0);
  CHECK(side.device() == dev);
  {
    const c10::StreamGuard guard(side);
    CHECK(current_stream(0) == side);
    CHECK(current_stream(1).id() == 0);  // per device
    c10::StreamId seen = -1;
    std::thread([&] { seen = current_stream(0).id(); }).join();
    CHECK(seen == 0);  // per thread
  }
  CHECK(current_stream(0).id() == 0);
  CHECK(side.query());
  side.synchronize();
  at::accelerator::synchronizeDevice(0);

  // The device allocator is reachable through the generic c10 interface.
  auto* allocator = c10::getDeviceAllocator(kSim);
  REQUIRE(allocator != nullptr);
  CHECK(allocator->initialized());
}

TEST_CASE("sim: model pieces match the CPU bit for bit, forward and backward") {
  check_piece("linear", [](const c10::Device& d) {
    torch::nn::Linear lin(8, 5);
    lin->to(d);
    const auto x = leaf(torch::randn({3, 8}), d);
    return PieceRun{{lin(x)}, {x, lin->weight, lin->bias}};
  });
  check_piece("embedding", [](const c10::Device& d) {
    torch::nn::Embedding emb(10, 6);
    emb->to(d);
    const auto idx = torch::tensor({{1, 2, 2}, {9, 0, 1}}, torch::kLong).to(d);
    return PieceRun{{emb(idx)}, {emb->weight}};
  });
  check_piece("layer_norm", [](const c10::Device& d) {
    torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({6}));
    ln->to(d);
    const auto x = leaf(torch::randn({4, 6}) * 3 + 1, d);
    return PieceRun{{ln(x)}, {x, ln->weight, ln->bias}};
  });
  check_piece("gelu, softmax, log_softmax", [](const c10::Device& d) {
    const auto x = leaf(torch::randn({5, 7}), d);
    return PieceRun{{torch::gelu(x), torch::softmax(x, 1), torch::log_softmax(x, 0)}, {x}};
  });
  check_piece("dropout (training)", [](const c10::Device& d) {
    const auto x = leaf(torch::randn({64}), d);
    torch::manual_seed(99);
    return PieceRun{{torch::dropout(x, 0.3, true)}, {x}};
  });
  check_piece("cross_entropy", [](const c10::Device& d) {
    const auto logits = leaf(torch::randn({6, 11}), d);
    const auto target = torch::tensor({0, 3, 10, 3, 7, 1}, torch::kLong).to(d);
    return PieceRun{{torch::nn::functional::cross_entropy(logits, target)}, {logits}};
  });
  check_piece("matmul, bmm", [](const c10::Device& d) {
    const auto a = leaf(torch::randn({2, 3, 4}), d);
    const auto b = leaf(torch::randn({2, 4, 5}), d);
    const auto m = leaf(torch::randn({4, 2}), d);
    return PieceRun{{torch::bmm(a, b), torch::matmul(a, m)}, {a, b, m}};
  });
  check_piece("views, slices, transposes, expand", [](const c10::Device& d) {
    const auto x = leaf(torch::randn({4, 6}), d);
    const auto y = x.t().slice(0, 1, 5).narrow(1, 1, 2);  // [4, 2], offset and strides
    const auto z = x.select(0, 2).unsqueeze(0).expand({3, 6});  // stride 0
    const auto w = x.view({2, 12}).permute({1, 0}).reshape({6, 4});
    const auto parts = x.chunk(2, 1);
    return PieceRun{{y * 2, z + 1, w.contiguous(), parts[1] * parts[0]}, {x}};
  });
}

TEST_CASE("sim: AdamW steps on a tiny model match the CPU bit for bit") {
  const auto train = [](const c10::Device& d) {
    torch::manual_seed(7);
    Tiny model;
    model->to(d);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    const auto idx = torch::tensor({{1, 2, 3, 4}, {5, 6, 7, 8}}, torch::kLong).to(d);
    const auto target = torch::tensor({{2, 3, 4, 5}, {6, 7, 8, 9}}, torch::kLong).to(d);
    std::vector<torch::Tensor> out;
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      const auto logits = model->forward(idx);
      const auto loss = torch::nn::functional::cross_entropy(logits.view({-1, 11}), target.view({-1}));
      loss.backward();
      opt.step();
      CHECK(loss.device() == d);
      out.push_back(loss.detach().cpu());
    }
    for (const auto& p : model->parameters()) {
      CHECK(p.device() == d);
      out.push_back(p.detach().cpu());
    }
    return out;
  };
  const auto expected = train(torch::kCPU);
  const auto actual = train(sim_device(0));
  REQUIRE(expected.size() == actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("value " << i);
    CHECK(bitwise_equal(expected[i], actual[i]));
  }
}

TEST_CASE("sim: views alias their base") {
  const auto d = sim_device();
  const auto base = torch::zeros({4, 6}, torch::TensorOptions().device(d));
  const auto expect = torch::zeros({4, 6});
  const auto same = [&] { return bitwise_equal(base, expect); };

  base.t().select(0, 1).add_(1);  // column 1
  expect.t().select(0, 1).add_(1);
  CHECK(same());
  base.slice(1, 2, 4).narrow(0, 1, 2).fill_(5);
  expect.slice(1, 2, 4).narrow(0, 1, 2).fill_(5);
  CHECK(same());
  base.view({24}).slice(0, 20).mul_(0).add_(3);
  expect.view({24}).slice(0, 20).mul_(0).add_(3);
  CHECK(same());
  base.permute({1, 0}).unsqueeze(0).squeeze(0)[5].sub_(2);
  expect.permute({1, 0}).unsqueeze(0).squeeze(0)[5].sub_(2);
  CHECK(same());
  base.split(2, 0)[1].add_(10);
  expect.split(2, 0)[1].add_(10);
  CHECK(same());
  base.chunk(3, 1)[2].detach().add_(100);
  expect.chunk(3, 1)[2].detach().add_(100);
  CHECK(same());
  base.diagonal().alias().add_(0.5);
  expect.diagonal().alias().add_(0.5);
  CHECK(same());
  base.as_strided({2, 2}, {6, 1}, 7).mul_(-1);
  expect.as_strided({2, 2}, {6, 1}, 7).mul_(-1);
  CHECK(same());
  base.reshape({2, 12}).unbind(0)[1].add_(1000);
  expect.reshape({2, 12}).unbind(0)[1].add_(1000);
  CHECK(same());

  // Views that only have per-backend kernels (unfold, view_as_real).
  base.view({24}).unfold(0, 4, 4).select(1, 3).add_(0.25);
  expect.view({24}).unfold(0, 4, 4).select(1, 3).add_(0.25);
  CHECK(same());
  CHECK(bitwise_equal(base.repeat({2, 1}), expect.repeat({2, 1})));
  const auto complex = torch::zeros({3}, torch::TensorOptions().dtype(torch::kComplexFloat).device(d));
  torch::view_as_real(complex).select(1, 1).fill_(2);
  CHECK(bitwise_equal(torch::imag(complex).contiguous(), torch::full({3}, 2.0f)));

  const auto e = base[0].unsqueeze(0).expand({5, 6});
  CHECK(e.stride(0) == 0);
  CHECK(e.is_alias_of(base));
  const auto s = base.slice(0, 1);
  CHECK(s.storage_offset() == 6);
  CHECK(s.is_alias_of(base));

  // set_ onto another tensor's storage, with an offset and strides.
  auto alias = torch::empty({0}, torch::TensorOptions().device(d));
  alias.set_(base.storage(), 2, {3, 2}, {6, 1});
  alias.fill_(-7);
  expect.as_strided({3, 2}, {6, 1}, 2).fill_(-7);
  CHECK(same());
  CHECK(alias.is_alias_of(base));

  // resize_ keeps the old bytes and stays on the device.
  auto grow = torch::arange(4, torch::TensorOptions().dtype(torch::kFloat).device(d));
  grow.resize_({8});
  CHECK(grow.device() == d);
  CHECK(bitwise_equal(grow.slice(0, 0, 4), torch::arange(4, torch::kFloat)));
  CHECK(grow[2].item<float>() == 2.0f);
}

TEST_CASE("sim: tensors on sim:1 stay on sim:1") {
  const auto d1 = sim_device(1);
  const auto base1 = sim::device_memory(1);
  const auto cpu = torch::randn({5, 5});
  {
    const auto t = cpu.to(d1);
    CHECK(t.device() == d1);
    const auto r = torch::matmul(t, t) + 1;
    CHECK(r.device() == d1);
    CHECK(bitwise_equal(r, torch::matmul(cpu, cpu) + 1));
    CHECK(sim::device_memory(1).current_bytes > base1.current_bytes);
    const auto t0 = t.to(sim_device(0));
    CHECK(t0.device() == sim_device(0));
    CHECK(bitwise_equal(t0, cpu));
    const auto back = t0.to(d1, /*non_blocking=*/true);
    CHECK(back.device() == d1);
    CHECK(bitwise_equal(back, cpu));
    const auto msg = error_of([&] { (void)(t + t0); });
    CHECK(msg.find("Expected all tensors to be on the same device") != std::string::npos);
  }
  CHECK(sim::device_memory(1).current_bytes == base1.current_bytes);

  // A CPU tensor with dimensions next to a sim tensor is an error, as on CUDA;
  // a 0-dim CPU tensor is a scalar and allowed.
  const auto t = torch::ones({3}, torch::TensorOptions().device(d1));
  CHECK(error_of([&] { (void)(t + torch::ones({3})); }).find("same device") != std::string::npos);
  CHECK(bitwise_equal(t + torch::tensor(2.0f), torch::full({3}, 3.0f)));
}

TEST_CASE("sim: a non_blocking copy is queued on the current stream") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  const auto src = torch::arange(1000, torch::kFloat);
  const auto dev = src.to(d);
  sim::set_copy_delay_us(150'000);

  // Device to host: the host sees the destination unchanged right after the
  // call, and correct once the stream (here: an event on it) has completed.
  auto host = torch::zeros({1000}).pin_memory();
  const auto t0 = std::chrono::steady_clock::now();
  host.copy_(dev, /*non_blocking=*/true);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(100));
  CHECK(bitwise_equal(host, torch::zeros({1000})));
  c10::Event done(kSim);
  done.record(current_stream());
  CHECK_FALSE(done.query());
  CHECK_FALSE(current_stream().query());
  done.synchronize();
  CHECK(done.query());
  CHECK(bitwise_equal(host, src));

  // Host to device, then a read on another stream does not wait for it (a
  // race, visible as stale data); a read on the copy's stream does.
  const auto dst = torch::zeros({1000}, torch::TensorOptions().device(d));
  const auto pinned = (src * 2).pin_memory();
  dst.copy_(pinned, /*non_blocking=*/true);
  {
    const c10::StreamGuard guard(pool_stream());
    CHECK(bitwise_equal(dst, torch::zeros({1000})));
  }
  CHECK(bitwise_equal(dst, src * 2));  // drains the current stream first

  // A blocking copy waits for what the stream has queued before it.
  host.copy_(dev * 3, /*non_blocking=*/true);
  const auto blocking = dev.cpu();
  CHECK(bitwise_equal(blocking, src));
  current_stream().synchronize();
  CHECK(bitwise_equal(host, src * 3));
}

TEST_CASE("sim: a stream blocked on an event waits for that recording") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  const auto src = torch::arange(256, torch::kFloat).pin_memory();
  const auto side = pool_stream();
  const auto main = current_stream();

  SUBCASE("without block: the main stream races ahead (negative control)") {
    const auto dst = torch::zeros({256}, torch::TensorOptions().device(d));
    sim::set_copy_delay_us(100'000);
    {
      const c10::StreamGuard guard(side);
      dst.copy_(src, /*non_blocking=*/true);
    }
    CHECK(bitwise_equal(dst, torch::zeros({256})));
    side.synchronize();
  }
  SUBCASE("with block: the main stream waits") {
    const auto dst = torch::zeros({256}, torch::TensorOptions().device(d));
    sim::set_copy_delay_us(100'000);
    c10::Event copied(kSim);
    {
      const c10::StreamGuard guard(side);
      dst.copy_(src, /*non_blocking=*/true);
      copied.record(side);
    }
    copied.block(main);
    CHECK_FALSE(main.query());
    CHECK(bitwise_equal(dst, src));
  }
  SUBCASE("a later re-record does not change what an earlier block waits for") {
    const auto dst = torch::zeros({256}, torch::TensorOptions().device(d));
    c10::Event ev(kSim);
    sim::set_copy_delay_us(20'000);
    {
      const c10::StreamGuard guard(side);
      dst.copy_(src, /*non_blocking=*/true);
      ev.record(side);
    }
    ev.block(main);
    sim::set_copy_delay_us(800'000);
    const auto host = torch::zeros({256}).pin_memory();
    {
      const c10::StreamGuard guard(side);
      host.copy_(dst, /*non_blocking=*/true);  // 0.8 s
      ev.record(side);
    }
    const auto t0 = std::chrono::steady_clock::now();
    main.synchronize();
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500));
    CHECK_FALSE(ev.query());
    ev.synchronize();
    CHECK(bitwise_equal(host, src));
  }
  SUBCASE("an event never recorded is complete") {
    c10::Event ev(kSim);
    CHECK(ev.query());
    ev.block(main);
    ev.synchronize();
  }
  SUBCASE("elapsed time between two recordings") {
    c10::Event a(kSim, c10::EventFlag::BACKEND_DEFAULT);  // "enable_timing"
    c10::Event b(kSim, c10::EventFlag::BACKEND_DEFAULT);
    a.record(main);
    sim::set_copy_delay_us(30'000);
    const auto host = torch::zeros({4}).pin_memory();
    host.copy_(torch::ones({4}, torch::TensorOptions().device(d)), /*non_blocking=*/true);
    b.record(main);
    b.synchronize();
    CHECK(a.elapsedTime(b) >= 25.0);  // milliseconds
  }
}

TEST_CASE("sim: poison makes a prematurely freed block read as NaN") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  sim::set_poison_freed(true);
  sim::set_copy_delay_us(100'000);
  const auto side = pool_stream();

  SUBCASE("freed while a copy on another stream still reads it") {
    auto dev = torch::ones({4096}, torch::TensorOptions().device(d));
    const auto host = torch::zeros({4096}).pin_memory();
    {
      const c10::StreamGuard guard(side);
      host.copy_(dev, /*non_blocking=*/true);
    }
    dev.reset();  // allocation stream idle: released (and poisoned) now
    side.synchronize();
    CHECK(torch::isnan(host).all().item<bool>());
  }
  SUBCASE("record_stream defers the release: correct values (control)") {
    auto dev = torch::ones({4096}, torch::TensorOptions().device(d));
    const auto host = torch::zeros({4096}).pin_memory();
    {
      const c10::StreamGuard guard(side);
      host.copy_(dev, /*non_blocking=*/true);
    }
    dev.record_stream(side);
    dev.reset();
    side.synchronize();
    CHECK(bitwise_equal(host, torch::ones({4096})));
  }
  SUBCASE("reading a fresh block before the copy into it lands") {
    const auto fresh = torch::empty({64}, torch::TensorOptions().device(d));
    CHECK(torch::isnan(fresh).all().item<bool>());
  }
}

TEST_CASE("sim: device memory is counted, capped and released in stream order") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  const auto base = sim::device_memory(0);
  const std::int64_t mib = 1 << 20;

  SUBCASE("counters return to baseline and the generic stats agree") {
    {
      const auto a = torch::empty({mib / 4}, torch::TensorOptions().device(d));  // 1 MiB
      const auto now = sim::device_memory(0);
      CHECK(now.current_bytes == base.current_bytes + mib);
      CHECK(now.allocations == base.allocations + 1);
      const auto stats = c10::getDeviceAllocator(kSim)->getDeviceStats(0);
      constexpr auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
      CHECK(stats.allocated_bytes[agg].current == now.current_bytes);
      CHECK(stats.allocated_bytes[agg].peak == now.peak_bytes);
      const auto [free_bytes, total] = c10::getDeviceAllocator(kSim)->getMemoryInfo(0);
      CHECK(free_bytes < total);
    }
    const auto after = sim::device_memory(0);
    CHECK(after.current_bytes == base.current_bytes);
    CHECK(after.frees == base.frees + 1);
    CHECK(after.peak_bytes >= base.current_bytes + mib);
    sim::reset_peak(0);
    CHECK(sim::device_memory(0).peak_bytes == base.current_bytes);
  }
  SUBCASE("above capacity: OutOfMemoryError, counters unchanged") {
    sim::set_capacity_bytes(base.current_bytes + mib);
    auto a = torch::empty({mib / 4}, torch::TensorOptions().device(d));
    const auto full = sim::device_memory(0);
    std::string msg;
    try {
      (void)torch::empty({1}, torch::TensorOptions().device(d));
    } catch (const c10::OutOfMemoryError& e) {
      msg = e.what();
    }
    CHECK(msg.find("out of memory on sim:0: tried to allocate 4 bytes") != std::string::npos);
    CHECK(msg.find("capacity " + std::to_string(base.current_bytes + mib)) != std::string::npos);
    const auto after = sim::device_memory(0);
    CHECK(after.current_bytes == full.current_bytes);
    CHECK(after.allocations == full.allocations);
    a.reset();
    CHECK_NOTHROW((void)torch::empty({mib / 4}, torch::TensorOptions().device(d)));
    CHECK(sim::device_memory(0).current_bytes == base.current_bytes);
  }
  SUBCASE("a block allocated on a busy stream is released when the stream gets there") {
    sim::set_copy_delay_us(100'000);
    const auto side = pool_stream();
    const auto host = torch::zeros({mib / 4}).pin_memory();
    {
      const c10::StreamGuard guard(side);
      auto a = torch::ones({mib / 4}, torch::TensorOptions().device(d));
      host.copy_(a, /*non_blocking=*/true);
    }  // a freed here; its stream still has the copy queued
    CHECK(sim::device_memory(0).current_bytes == base.current_bytes + mib);
    side.synchronize();
    CHECK(sim::device_memory(0).current_bytes == base.current_bytes);
    CHECK(bitwise_equal(host, torch::ones({mib / 4})));
  }
  SUBCASE("a released block is cached, reused, and returned by empty_cache") {
    sim::set_poison_freed(false);
    sim::empty_cache();
    const auto r0 = sim::device_memory(0).reserved_bytes;
    const void* first = nullptr;
    {
      const auto a = torch::empty({mib / 4}, torch::TensorOptions().device(d));
      first = a.data_ptr();
      CHECK(sim::device_memory(0).reserved_bytes == r0 + mib);
    }
    CHECK(sim::device_memory(0).current_bytes == base.current_bytes);  // in use: back
    CHECK(sim::device_memory(0).reserved_bytes == r0 + mib);           // reserved: cached
    const auto stats = c10::getDeviceAllocator(kSim)->getDeviceStats(0);
    constexpr auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    CHECK(stats.reserved_bytes[agg].current == r0 + mib);
    CHECK(stats.allocated_bytes[agg].current == base.current_bytes);
    {
      // A slightly smaller request fits the cached block (same rounded size).
      const auto b = torch::empty({mib / 4 - 100}, torch::TensorOptions().device(d));
      CHECK(b.data_ptr() == first);
      CHECK(sim::device_memory(0).reserved_bytes == r0 + mib);
      CHECK(sim::device_memory(0).current_bytes == base.current_bytes + mib - 400);
    }
    sim::empty_cache();
    CHECK(sim::device_memory(0).reserved_bytes == r0);
  }
  SUBCASE("a cached block is reused only after the work queued on its stream") {
    sim::set_poison_freed(false);
    sim::set_copy_delay_us(100'000);
    sim::empty_cache();
    const auto side = pool_stream();
    const auto host = torch::zeros({mib / 4}).pin_memory();
    const void* first = nullptr;
    {
      const c10::StreamGuard guard(side);
      auto a = torch::ones({mib / 4}, torch::TensorOptions().device(d));
      first = a.data_ptr();
      host.copy_(a, /*non_blocking=*/true);
    }  // a freed; the copy reading it is still queued on its stream
    {
      const auto b = torch::zeros({mib / 4}, torch::TensorOptions().device(d));
      CHECK(b.data_ptr() != first);
    }
    side.synchronize();
    CHECK(bitwise_equal(host, torch::ones({mib / 4})));
    const auto c1 = torch::empty({mib / 4}, torch::TensorOptions().device(d));
    const auto c2 = torch::empty({mib / 4}, torch::TensorOptions().device(d));
    CHECK((c1.data_ptr() == first || c2.data_ptr() == first));
  }
  SUBCASE("checking mode poisons a cached block when it is handed out again") {
    sim::set_poison_freed(false);
    sim::empty_cache();
    const void* first = nullptr;
    {
      const auto a = torch::ones({mib / 4}, torch::TensorOptions().device(d));
      first = a.data_ptr();
    }  // cached with its ones (no poison on release)
    sim::set_poison_freed(true);
    const auto fresh = torch::empty({mib / 4}, torch::TensorOptions().device(d));
    CHECK(fresh.data_ptr() == first);
    CHECK(torch::isnan(fresh).all().item<bool>());
  }
  SUBCASE("trace of device 0") {
    sim::set_trace(true);
    { const auto a = torch::empty({256}, torch::TensorOptions().device(d)); }
    sim::set_trace(false);
    const auto trace = sim::take_trace();
    REQUIRE(trace.size() == 2);
    CHECK(trace[0].bytes == base.current_bytes + 1024);
    CHECK(trace[1].bytes == base.current_bytes);
    CHECK(trace[1].t_us >= trace[0].t_us);
    CHECK(sim::take_trace().empty());
  }
}

TEST_CASE("sim: pinned host memory is counted") {
  const auto d = sim_device();
  const auto base = sim::host_memory();
  {
    const auto p = torch::ones({1000}).pin_memory();
    CHECK(p.is_pinned());
    CHECK_FALSE(torch::ones({1000}).is_pinned());
    CHECK(sim::host_memory().current_bytes == base.current_bytes + 4000);
    if (!at::globalContext().hasCUDA()) {  // with CUDA present, factories pin with CUDA
      const auto q = torch::empty({10}, torch::TensorOptions().pinned_memory(true));
      CHECK(q.is_pinned());
      CHECK(sim::host_memory().current_bytes == base.current_bytes + 4040);
    }
    const auto dev = p.to(d);
    CHECK(bitwise_equal(dev, torch::ones({1000})));
  }
  CHECK(sim::host_memory().current_bytes == base.current_bytes);
  sim::reset_host_peak();
  CHECK(sim::host_memory().peak_bytes == base.current_bytes);

  // Released pinned blocks are cached and handed out again (poisoned in
  // checking mode); empty_cache returns them.
  sim::ScopedKnobs knobs;
  sim::set_poison_freed(true);
  sim::empty_cache();
  const auto r0 = sim::host_memory().reserved_bytes;
  const void* first = nullptr;
  {
    const auto p = torch::ones({1 << 18}).pin_memory();
    first = p.data_ptr();
  }
  CHECK(sim::host_memory().reserved_bytes == r0 + (1 << 20));
  {
    const auto q = torch::empty({1 << 18}, torch::TensorOptions().pinned_memory(true));
    if (!at::globalContext().hasCUDA()) {
      CHECK(q.data_ptr() == first);
      CHECK(torch::isnan(q).all().item<bool>());
    }
  }
  sim::empty_cache();
  CHECK(sim::host_memory().reserved_bytes == r0);
}

TEST_CASE("sim: threads and streams share the allocator safely") {
  const auto d = sim_device();
  sim::ScopedKnobs knobs;
  sim::set_copy_delay_us(200);
  const auto base = sim::device_memory(0);
  const auto src = torch::arange(4096, torch::kFloat);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      const c10::StreamGuard guard(pool_stream());
      for (int k = 0; k < 20; ++k) {
        const auto dev = (src + i).to(d, /*non_blocking=*/true);
        const auto host = torch::empty({4096}).pin_memory();
        host.copy_(dev * 2, /*non_blocking=*/true);
        current_stream().synchronize();
        if (!torch::equal(host, (src + i) * 2)) {
          ++wrong;
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  CHECK(wrong.load() == 0);
  sim::synchronize(0);
  CHECK(sim::device_memory(0).current_bytes == base.current_bytes);

  // Forward on a side stream, backward through the autograd engine's device
  // thread: the engine's stream/event synchronization goes through the guard.
  const auto cpu_x = torch::randn({16, 16});
  const auto expected_grad = [&] {
    const auto x = cpu_x.clone().requires_grad_(true);
    torch::matmul(x, x).tanh().sum().backward();
    return x.grad();
  }();
  const auto x = cpu_x.to(d).requires_grad_(true);
  {
    const c10::StreamGuard guard(pool_stream());
    torch::matmul(x, x).tanh().sum().backward();
  }
  CHECK(bitwise_equal(x.grad(), expected_grad));
}
