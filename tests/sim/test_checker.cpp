// SPDX-License-Identifier: MIT
//
// Tests of sim's stream-order checker (Config::check_streams): each canary
// must be reported, and its twin with the right synchronisation must not.

#include "sim_tests.hpp"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include <doctest/doctest.h>

#include <cstdlib>
#include <optional>
#include <string>

using namespace sim_tests;

namespace {

// Checking on, poisoning off (its quarantine would keep a freed block from
// being handed out again at once), the caches empty (so that the block a
// test frees is the one handed out next), knobs restored after.
struct Checked {
  explicit Checked() {
    (void)sim_device();
    knobs.emplace();
    sim::synchronize(0);
    sim::set_check_streams(false);  // a clean slate for each case
    sim::set_check_streams(true);
    sim::set_poison_freed(false);
    sim::empty_cache();
  }
  // The canaries leave unordered accesses behind: the next case starts
  // from a clean slate (turning checking on again clears it).
  ~Checked() {
    try {
      sim::synchronize(0);
    } catch (...) {
    }
    sim::set_check_streams(false);
  }
  Checked(const Checked&) = delete;
  Checked& operator=(const Checked&) = delete;
  std::optional<sim::ScopedKnobs> knobs;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

torch::TensorOptions on_sim() { return torch::TensorOptions().device(sim_device()); }

// A host-to-device copy of `host` on `side`, read on the current stream;
// with `wait`, the current stream first waits for an event recorded after
// the copy.
std::string reload_then_read(const c10::Stream& side, bool wait) {
  const auto host = torch::arange(32, torch::kFloat).reshape({4, 8}).pin_memory();
  at::Tensor dev;
  c10::Event copied(kSim);
  {
    const c10::StreamGuard guard(side);
    dev = host.to(sim_device(), /*non_blocking=*/true);
    copied.record(side);
  }
  if (wait) copied.block(current_stream());
  return error_of([&] {
    const auto doubled = dev * 2;
    CHECK(bitwise_equal(doubled, host * 2));
  });
}

}  // namespace

TEST_CASE("sim checker: a reloaded tensor read on another stream without a wait is reported") {
  const Checked checked;
  const auto side = pool_stream();
  const auto msg = reload_then_read(side, /*wait=*/false);
  CAPTURE(msg);
  CHECK(contains(msg, "offload::sim stream check: aten::mul on sim:0 stream 0 reads a storage"));
  CHECK(contains(msg, "[4, 8]"));
  CHECK(contains(msg, "aten::copy_ (non_blocking) wrote on sim:0 stream " + std::to_string(side.id())));
  CHECK(contains(msg, "read-after-write"));
}

TEST_CASE("sim checker: a reloaded tensor read after an event wait is not reported") {
  const Checked checked;
  CHECK(reload_then_read(pool_stream(), /*wait=*/true) == "<no exception>");
}

namespace {

// A storage allocated on the current stream, read on `side` (ordered after
// its fill), then freed; the next storage of its size is allocated and
// written on `next`. `record` tells the allocator about `side`
// (record_stream); `wait` makes `next` wait for `side` first.
std::string use_free_reuse(const c10::Stream& side, const c10::Stream& next, bool record, bool wait) {
  auto a = torch::ones({3, 1000}, on_sim());
  const void* block = a.data_ptr();
  c10::Event filled(kSim);
  filled.record(current_stream());
  filled.block(side);
  at::Tensor b;
  {
    const c10::StreamGuard guard(side);
    b = a * 2;
  }
  c10::Event used(kSim);
  used.record(side);
  if (record) a.record_stream(side);
  a.reset();
  const c10::StreamGuard guard(next);
  if (wait) used.block(next);
  auto c = torch::empty({3, 1000}, on_sim());
  REQUIRE(c.data_ptr() == block);  // the freed block, handed out again
  return error_of([&] { c.fill_(3); });
}

}  // namespace

TEST_CASE("sim checker: a storage used on a second stream without record_stream, then freed and reused") {
  const Checked checked;
  const auto side = pool_stream();
  const auto msg = use_free_reuse(side, current_stream(), /*record=*/false, /*wait=*/false);
  CAPTURE(msg);
  CHECK(contains(msg, "aten::fill_ on sim:0 stream 0 writes a storage (tensor of shape [3, 1000]"));
  CHECK(contains(msg, "aten::mul read on sim:0 stream " + std::to_string(side.id())));
  CHECK(contains(msg, "a storage used on a second stream without record_stream, then freed and reused"));
}

TEST_CASE("sim checker: a storage recorded on its second stream, then freed and reused, is not reported") {
  const Checked checked;
  CHECK(use_free_reuse(pool_stream(), current_stream(), /*record=*/true, /*wait=*/false) == "<no exception>");
}

TEST_CASE("sim checker: a block reused across streams after a free") {
  const Checked checked;
  const auto side = pool_stream();
  const auto next = pool_stream();
  REQUIRE(side != next);
  const auto msg = use_free_reuse(side, next, /*record=*/false, /*wait=*/false);
  CAPTURE(msg);
  CHECK(contains(msg, "aten::fill_ on sim:0 stream " + std::to_string(next.id()) + " writes"));
  CHECK(contains(msg, "a block reused across streams after a free"));
}

TEST_CASE("sim checker: a block reused on a stream that waited for its last user is not reported") {
  const Checked checked;
  const auto side = pool_stream();
  const auto next = pool_stream();
  CHECK(use_free_reuse(side, next, /*record=*/false, /*wait=*/true) == "<no exception>");
}

namespace {

// A buffer carved from a pinned block (as a pinned pool carves them) is
// read by a host-to-device copy on `side`, and a new buffer at the same
// address (the first one is kept, so that the new one's storage cannot take
// its place in memory) is written by a device-to-host copy on the current stream;
// with `sync`, the host first synchronizes an event recorded after the
// first copy.
std::string pinned_reuse(bool sync) {
  auto slab = torch::empty({4096}, torch::TensorOptions().dtype(torch::kByte).pinned_memory(true));
  const auto floats = torch::TensorOptions().dtype(torch::kFloat);
  auto first = torch::from_blob(slab.data_ptr(), {256}, [](void*) {}, floats);
  first.copy_(torch::arange(256, torch::kFloat));
  const auto side = pool_stream();
  at::Tensor dev;
  c10::Event copied(kSim);
  {
    const c10::StreamGuard guard(side);
    dev = first.to(sim_device(), /*non_blocking=*/true);
    copied.record(side);
  }
  if (sync) copied.synchronize();
  const auto other = torch::full({256}, 7.0F, on_sim());
  auto second = torch::from_blob(slab.data_ptr(), {256}, [](void*) {}, floats);
  auto msg = error_of([&] { second.copy_(other, /*non_blocking=*/true); });
  sim::synchronize(0);
  return msg;
}

}  // namespace

TEST_CASE("sim checker: a pinned buffer reused before its copy ended") {
  const Checked checked;
  const auto msg = pinned_reuse(/*sync=*/false);
  CAPTURE(msg);
  CHECK(contains(msg, "aten::copy_ (non_blocking) on sim:0 stream 0 writes a pinned host buffer"));
  CHECK(contains(msg, "a pinned buffer reused before its copy ended"));
}

TEST_CASE("sim checker: a pinned buffer reused after its copy was synchronized is not reported") {
  const Checked checked;
  CHECK(pinned_reuse(/*sync=*/true) == "<no exception>");
}

TEST_CASE("sim checker: a pinned buffer written while a copy on another stream reads it") {
  const Checked checked;
  const auto host = torch::arange(64, torch::kFloat).pin_memory();
  const auto side = pool_stream();
  at::Tensor dev;
  {
    const c10::StreamGuard guard(side);
    dev = host.to(sim_device(), /*non_blocking=*/true);
  }
  const auto other = torch::zeros({64}, on_sim());
  const auto msg = error_of([&] { host.copy_(other, /*non_blocking=*/true); });
  CAPTURE(msg);
  CHECK(contains(msg, "writes a pinned host buffer (tensor of shape [64], float)"));
  CHECK(contains(msg, "write-after-read"));
  // Synchronized by the host first: nothing to report.
  sim::synchronize(0);
  {
    const c10::StreamGuard guard(side);
    dev = host.to(sim_device(), /*non_blocking=*/true);
  }
  sim::synchronize(0);
  CHECK(error_of([&] { host.copy_(other, /*non_blocking=*/true); }) == "<no exception>");
}

TEST_CASE("sim checker: a stream synchronize orders later work on every stream") {
  const Checked checked;
  const auto side = pool_stream();
  const auto a = torch::ones({16}, on_sim());
  c10::Event filled(kSim);
  filled.record(current_stream());
  filled.block(side);
  at::Tensor b;
  {
    const c10::StreamGuard guard(side);
    b = a + 1;
  }
  // Written on the default stream while the side stream's read is unordered.
  CHECK(contains(error_of([&] { a.add_(1); }), "write-after-read"));
  filled.record(current_stream());
  filled.block(side);
  {
    const c10::StreamGuard guard(side);
    b = a + 1;
  }
  side.synchronize();
  CHECK(error_of([&] { a.add_(1); }) == "<no exception>");
}

TEST_CASE("sim checker: the knob, its Config field and ScopedKnobs") {
  (void)sim_device();
  const bool was = sim::config().check_streams;
  {
    const sim::ScopedKnobs knobs;
    sim::set_check_streams(!was);
    CHECK(sim::config().check_streams == !was);
  }
  CHECK(sim::config().check_streams == was);
}

TEST_CASE("sim checker: OFFLOAD_SIM_CHECK_STREAMS other than 0 or 1 is an error at install") {
  (void)sim_device();
  const char* before = std::getenv("OFFLOAD_SIM_CHECK_STREAMS");
  const std::optional<std::string> saved = before == nullptr ? std::nullopt : std::optional<std::string>(before);
  setenv("OFFLOAD_SIM_CHECK_STREAMS", "yes", 1);
  const auto msg = error_of([] { sim::install(); });
  if (saved) {
    setenv("OFFLOAD_SIM_CHECK_STREAMS", saved->c_str(), 1);
  } else {
    unsetenv("OFFLOAD_SIM_CHECK_STREAMS");
  }
  CAPTURE(msg);
  CHECK(contains(msg, "OFFLOAD_SIM_CHECK_STREAMS must be 0 (off) or 1 (stream-order checking on), got 'yes'"));
  setenv("OFFLOAD_SIM_CHECK_STREAMS", "1", 1);
  CHECK_NOTHROW(sim::install());  // a valid value: an installed sim stays as it is
  if (saved) {
    setenv("OFFLOAD_SIM_CHECK_STREAMS", saved->c_str(), 1);
  } else {
    unsetenv("OFFLOAD_SIM_CHECK_STREAMS");
  }
}
