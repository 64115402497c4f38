// SPDX-License-Identifier: MIT
// The runtime dispatcher (offload::make_manager) against the sim backend
// installed under different PrivateUse1 names. The name is fixed once per
// process, so tests/dispatch/meson.build runs this executable once per name:
//   OFFLOAD_DISPATCH_BACKEND=sim|npu|neuron|acme, test suite dispatch-installed
//   OFFLOAD_DISPATCH_BACKEND=none,               test suite dispatch-none
// main.cpp installs the backend before any test (unset: "sim"). A case of
// the other suite reports itself skipped, so a run without filters passes.

#include "../doctest.hpp"

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <offload/dispatch.hpp>
#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../harness.hpp"

#if __has_include(<offload/sync/streamed.hpp>)
#include <offload/sync/streamed.hpp>
#define OFFLOAD_TEST_HAS_STREAMED 1
#else
#define OFFLOAD_TEST_HAS_STREAMED 0
#endif

namespace hana = boost::hana;

// The example of docs/dispatch.md ("Adding your own device policy"),
// extracted at build time: AcmeDevice, my_devices, make_acme_aware_manager().
#include "dispatch_snippet.inc"

namespace {

/// A sync policy that needs events (the role sync::Streamed plays), built on
/// Blocking's State so runs stay bit-identical.
struct NeedsEvents {
  static constexpr std::string_view name = "needs_events";
  static constexpr bool needs_events = true;
  template <offload::device_policy Device>
  class State : public offload::sync::Blocking::State<Device> {
   public:
    using offload::sync::Blocking::State<Device>::State;
  };
};

/// Any PrivateUse1 backend, but its runtime answers "no streams/events".
struct NoRuntimeEvents : offload::device::Generic {
  static constexpr std::string_view name = "no_runtime_events";
  static bool runtime_has_events() { return false; }
};

/// device::Sim as a program sees it that does not link liboffload_sim.
struct UnlinkedSim : offload::device::Sim {
  static constexpr std::string_view name = "unlinked_sim";
  static bool linked() { return false; }
};

/// Any PrivateUse1 backend, without events at compile time.
struct NoEvents : offload::device::Generic {
  static constexpr std::string_view name = "no_events";
  static constexpr bool has_streams = false;
  static constexpr bool has_events = false;
};

static_assert(std::is_same_v<
              offload::dispatched_sync_t<NoEvents, offload::storage::PinnedHost, NeedsEvents, offload::sync::Blocking>,
              offload::sync::Blocking>);
static_assert(std::is_same_v<offload::dispatched_sync_t<offload::device::Generic, offload::storage::PinnedHost,
                                                        NeedsEvents, offload::sync::Blocking>,
                             NeedsEvents>);

const c10::Device kDevice(c10::DeviceType::PrivateUse1, 0);

std::string backend() {
  const char* name = std::getenv("OFFLOAD_DISPATCH_BACKEND");
  return name != nullptr && *name != '\0' ? name : "sim";
}

/// True when this process installed a backend (main.cpp did); else the
/// case reports itself skipped.
bool backend_installed() {
  if (backend() != "none") return true;
  MESSAGE("skipped: needs OFFLOAD_DISPATCH_BACKEND=sim|npu|neuron|<other name>");
  return false;
}

/// True when this process installed nothing; else the case reports itself
/// skipped.
bool nothing_installed() {
  if (backend() == "none") return true;
  MESSAGE("skipped: needs OFFLOAD_DISPATCH_BACKEND=none");
  return false;
}

/// The built-in policy the dispatcher must pick for backend().
std::string expected_policy() {
  const auto name = backend();
  if (name == "sim" || name == "npu" || name == "neuron") return name;
  return "generic";
}

std::string expected_builtin_list() {
  std::string list = OFFLOAD_HAS_CUDA ? "cuda, " : "";
  return list + "xpu, npu, neuron, sim, generic";
}

harness::OnParams excluding(offload::AnyManager manager) {
  return [manager](const std::vector<at::Tensor>& params) mutable { manager.exclude(params); };
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

/// Trains `kind` on `device` without and with `manager`; checks bitwise
/// equality and returns the manager's stats of the offloaded run.
offload::Stats train_both(harness::ModelKind kind, c10::Device device, offload::AnyManager manager) {
  const auto plain = harness::train(kind, device, 3);
  const auto offloaded = harness::train(kind, device, 3, harness::with_scope(manager), excluding(manager));
  std::string why;
  CHECK_MESSAGE(harness::bitwise_equal(plain, offloaded, &why), why);
  return manager.stats();
}

}  // namespace

// ======================================================================
// Nothing installed (OFFLOAD_DISPATCH_BACKEND=none).

TEST_SUITE("dispatch-none") {
  TEST_CASE("dispatch: no accelerator is a clear error that lists this program's policies") {
    if (!nothing_installed()) return;
    const auto detected = offload::detect_accelerator();
    if (detected.type) {
      MESSAGE("skipped: this machine has an accelerator ('" << detected.name << "')");
      return;
    }
    // This program links liboffload_sim: sim is listed, with how to make one.
    REQUIRE(offload::device::Sim::linked());
    const auto message = error_of([] { (void)offload::make_manager(); });
    CAPTURE(message);
    CHECK(message.find("offload::make_manager: no accelerator was detected (" + detected.reason + ")") == 0);
    CHECK(message.find("; this program has: " + expected_builtin_list() +
                       ". offload::sim::install() makes a sim device. Pass offload::Fallback::pass_through to run "
                       "without offloading") != std::string::npos);
    // A program without liboffload_sim: its policy is not listed, nor the hint.
    const auto unlinked = hana::tuple_t<offload::device::Xpu, UnlinkedSim, offload::device::Generic>;
    const auto without_sim = error_of([&] { (void)offload::make_manager({}, unlinked); });
    CAPTURE(without_sim);
    CHECK(without_sim.find("; this program has: xpu, generic. Pass offload::Fallback::pass_through to run without "
                           "offloading") != std::string::npos);
    CHECK(without_sim.find("sim") == std::string::npos);
    // The message lists exactly what compiled_device_policies() reports.
    std::string names;
    for (const auto& n : offload::compiled_device_policies()) names += (names.empty() ? "" : ", ") + n;
    CHECK(names == expected_builtin_list());
  }

  TEST_CASE("dispatch: the opt-in pass-through manager offloads nothing and says so") {
    if (!nothing_installed()) return;
    const auto detected = offload::detect_accelerator();
    std::vector<offload::AnyManager> managers{offload::make_pass_through_manager()};
    if (!detected.type) {
      managers.push_back(offload::make_manager<offload::storage::PinnedHost, offload::sync::Blocking>(
          {}, offload::Fallback::pass_through));
      CHECK(managers.back().describe() ==
            "PassThrough<offloads nothing: no accelerator was detected (" + detected.reason + ")>");
    }
    CHECK(managers.front().describe() == "PassThrough<offloads nothing: pass-through requested>");
    for (auto& manager : managers) {
      CAPTURE(manager.describe());
      const auto stats = train_both(harness::ModelKind::block, c10::Device(c10::kCPU), manager);
      CHECK(stats.tensors_seen > 0);
      CHECK(stats.passed_through() == stats.tensors_seen);
      CHECK(stats.tensors_offloaded == 0);
      CHECK(stats.bytes_offloaded == 0);
      CHECK(stats.host_bytes_peak == 0);
      manager.reset_stats();
      CHECK(manager.stats().tensors_seen == 0);
    }
    CHECK_THROWS_AS(offload::make_pass_through_manager(offload::Options{.prefetch_depth = -1}), c10::ValueError);
  }

}  // TEST_SUITE

// ======================================================================
// The sim backend installed as OFFLOAD_DISPATCH_BACKEND.

TEST_SUITE("dispatch-installed") {
  TEST_CASE("dispatch: picks the device policy for the backend's name") {
    if (!backend_installed()) return;
    const auto name = backend();
    const auto detected = offload::detect_accelerator();
    REQUIRE(detected.type == c10::DeviceType::PrivateUse1);
    CHECK(detected.name == name);
    CHECK(detected.reason.empty());

    CHECK(offload::device::Sim::available() == (name == "sim"));
    CHECK(offload::device::Npu::available() == (name == "npu"));
    CHECK(offload::device::Neuron::available() == (name == "neuron"));
    CHECK(offload::device::Generic::available());
    CHECK_FALSE(offload::device::Xpu::available());

    const auto manager = offload::make_manager<offload::storage::PinnedHost, offload::sync::Blocking>();
    const std::string expected = "Manager<" + expected_policy() + ", pinned_host, blocking>";
    if (expected_policy() == "generic") {
      CHECK(manager.describe() == expected + " [PrivateUse1 backend '" + name + "']");
    } else {
      CHECK(manager.describe() == expected);
    }
    const auto pageable = offload::make_manager<offload::storage::PageableHost>();
    CHECK(pageable.describe().find("Manager<" + expected_policy() + ", pageable_host, blocking>") == 0);
    // An accelerator detected already is not detected again: the one given decides.
    using offload::storage::PinnedHost, offload::sync::Blocking;
    const auto given =
        offload::make_manager_unhooked<PinnedHost, Blocking, Blocking>({}, offload::builtin_devices, detected);
    CHECK(given.describe() == manager.describe());
    const auto none = offload::make_manager_unhooked<PinnedHost, Blocking, Blocking>(
        {}, offload::builtin_devices,
        offload::DetectedAccelerator{.type = std::nullopt, .name = {}, .reason = "none given"},
        offload::Fallback::pass_through);
    CHECK(none.describe() == "PassThrough<offloads nothing: no accelerator was detected (none given)>");
  }

  TEST_CASE("dispatch: a model trains bit-identically through the dispatched manager (copy delay, poison)") {
    if (!backend_installed()) return;
    const offload::sim::ScopedKnobs knobs;
    offload::sim::set_copy_latency_us(200);
    offload::sim::set_poison_freed(true);
    const auto manager = offload::make_manager<offload::storage::PinnedHost, offload::sync::Blocking>();
    const auto stats = train_both(harness::ModelKind::block, kDevice, manager);
    CAPTURE(stats);
    CHECK(stats.tensors_offloaded > 0);
    CHECK(stats.storages_offloaded > 0);
    CHECK(stats.bytes_offloaded > 0);
    CHECK(stats.tensors_reloaded > 0);
    CHECK(stats.bytes_reloaded > 0);
    CHECK(stats.passed_other_device == 0);
    CHECK(stats.blocking_fallbacks == 0);
    CHECK(stats.pinned_fallbacks == 0);  // the sim backend's hooks give pinned host memory
  }

  TEST_CASE("dispatch: the runtime probe finds the sim backend's streams and events") {
    if (!backend_installed()) return;
    const auto support = offload::device::probe_runtime(c10::DeviceType::PrivateUse1);
    CHECK(support.streams_and_events);
    CHECK(support.reason.empty());
    CHECK(offload::device::Generic::runtime_has_events());
    CHECK(offload::device::Npu::runtime_has_events());  // the probe is per device type, not per name
    // No XPU backend in this LibTorch: the probe says no, without throwing.
    const auto xpu = offload::device::probe_runtime(c10::DeviceType::XPU);
    CHECK_FALSE(xpu.streams_and_events);
    CHECK_FALSE(xpu.reason.empty());

    // A sync policy that needs events keeps them when the backend has them.
    const auto manager = offload::make_manager<offload::storage::PinnedHost, NeedsEvents>();
    CHECK(manager.describe().find("Manager<" + expected_policy() + ", pinned_host, needs_events>") == 0);
    const auto stats = train_both(harness::ModelKind::mlp, kDevice, manager);
    CHECK(stats.tensors_offloaded > 0);
    CHECK(stats.blocking_fallbacks == 0);
  }

#if OFFLOAD_TEST_HAS_STREAMED
  TEST_CASE("dispatch: sync::Streamed through the dispatcher: kept with events, blocking without") {
    if (!backend_installed()) return;
    const offload::sim::ScopedKnobs knobs;
    offload::sim::set_copy_latency_us(200);
    offload::sim::set_poison_freed(true);
    const auto manager = offload::make_manager<offload::storage::PinnedHost, offload::sync::Streamed>();
    CHECK(manager.describe().find("Manager<" + expected_policy() + ", pinned_host, streamed>") == 0);
    const auto stats = train_both(harness::ModelKind::block, kDevice, manager);
    CAPTURE(stats);
    CHECK(stats.tensors_offloaded > 0);
    CHECK(stats.tensors_reloaded + stats.reloads_shared > 0);
    CHECK(stats.blocking_fallbacks == 0);

    const auto devices = hana::prepend(offload::builtin_devices, hana::type_c<NoRuntimeEvents>);
    const auto fallback = offload::make_manager<offload::storage::PinnedHost, offload::sync::Streamed>({}, devices);
    CHECK(fallback.describe() == "Manager<no_runtime_events, pinned_host, blocking> [PrivateUse1 backend '" +
                                     backend() +
                                     "'; streamed needs events: no_runtime_events has no "
                                     "streams/events at run time, so copies are blocking]");
    const auto blocking = train_both(harness::ModelKind::mlp, kDevice, fallback);
    CHECK(blocking.storages_offloaded > 0);
    CHECK(blocking.blocking_fallbacks == blocking.storages_offloaded + blocking.tensors_reloaded);
  }
#endif

  TEST_CASE("dispatch: a backend without streams/events at run time gets blocking copies, counted") {
    if (!backend_installed()) return;
    const offload::sim::ScopedKnobs knobs;
    offload::sim::set_copy_latency_us(200);
    offload::sim::set_poison_freed(true);
    const auto devices = hana::prepend(offload::builtin_devices, hana::type_c<NoRuntimeEvents>);
    const auto manager = offload::make_manager<offload::storage::PinnedHost, NeedsEvents>({}, devices);
    CHECK(manager.describe() == "Manager<no_runtime_events, pinned_host, blocking> [PrivateUse1 backend '" + backend() +
                                    "'; needs_events needs events: no_runtime_events has no "
                                    "streams/events at run time, so copies are blocking]");
    const auto stats = train_both(harness::ModelKind::mlp, kDevice, manager);
    CHECK(stats.storages_offloaded > 0);
    CHECK(stats.tensors_reloaded > 0);
    CHECK(stats.blocking_fallbacks == stats.storages_offloaded + stats.tensors_reloaded);

    // Asking for blocking copies in the first place is no fallback.
    const auto blocking = offload::make_manager<offload::storage::PinnedHost, offload::sync::Blocking>({}, devices);
    CHECK(blocking.describe() ==
          "Manager<no_runtime_events, pinned_host, blocking> [PrivateUse1 backend '" + backend() + "']");
  }

  TEST_CASE("dispatch: a device policy without events at compile time gets sync::Blocking") {
    if (!backend_installed()) return;
    const auto devices = hana::make_tuple(hana::type_c<NoEvents>);
    const auto manager = offload::make_manager<offload::storage::PageableHost, NeedsEvents>({}, devices);
    CHECK(manager.describe() == "Manager<no_events, pageable_host, blocking> [PrivateUse1 backend '" + backend() +
                                    "'; needs_events needs events: no_events has no streams/events, so copies "
                                    "are blocking]");
    const auto stats = train_both(harness::ModelKind::mlp, kDevice, manager);
    CHECK(stats.tensors_offloaded > 0);
    CHECK(stats.blocking_fallbacks == stats.storages_offloaded + stats.tensors_reloaded);
  }

  TEST_CASE("dispatch: a user-added device policy is picked through the extension point") {
    if (!backend_installed()) return;
    const auto names = offload::compiled_device_policies(my_devices);
    REQUIRE(names.size() == offload::compiled_device_policies().size() + 1);
    CHECK(names.front() == "acme");
    CHECK(names.back() == "generic");

    const auto manager = make_acme_aware_manager();
    if (backend() == "acme") {
      CHECK(manager.describe() == "Manager<acme, pinned_host, blocking>");
      const auto stats = train_both(harness::ModelKind::mlp, kDevice, manager);
      CHECK(stats.tensors_offloaded > 0);
    } else {  // not this process's backend: the built-in choice stands
      CHECK(manager.describe().find("Manager<" + expected_policy() + ", pinned_host, blocking>") == 0);
    }
    // Appended, it comes after device::Generic, which takes every PrivateUse1 backend first.
    const auto late = offload::make_manager({}, hana::append(offload::builtin_devices, hana::type_c<AcmeDevice>));
    CHECK(late.describe().find("Manager<" + expected_policy() + ", pinned_host, blocking>") == 0);
  }

  TEST_CASE("dispatch: an accelerator no policy matches is an error naming it, or pass-through on request") {
    if (!backend_installed()) return;
    const auto only_xpu = hana::tuple_t<offload::device::Xpu, offload::device::Sim>;
    if (backend() == "sim") {
      CHECK(offload::make_manager({}, only_xpu).describe() == "Manager<sim, pinned_host, blocking>");
    }
    const auto only_cpu_less = hana::tuple_t<offload::device::Xpu>;
    const auto message = error_of([&] { (void)offload::make_manager({}, only_cpu_less); });
    CHECK(message.find("offload::make_manager: no device policy for '" + backend() + "'; this program has: xpu. ") ==
          0);
    const auto manager = offload::make_manager({}, only_cpu_less, offload::Fallback::pass_through);
    CHECK(manager.describe() == "PassThrough<offloads nothing: no device policy for '" + backend() + "'>");
    const auto stats = train_both(harness::ModelKind::mlp, kDevice, manager);
    CHECK(stats.tensors_seen > 0);
    CHECK(stats.passed_through() == stats.tensors_seen);
  }

  TEST_CASE("dispatch: options are validated before anything is detected or built") {
    if (!backend_installed()) return;
    const auto message = error_of([] { (void)offload::make_manager(offload::Options{.max_fwd_stash = 0}); });
    CHECK(message == "offload::Options: max_fwd_stash must be in [1, 1024], got 0");
    CHECK_THROWS_AS(offload::make_manager(offload::Options{.min_offload_bytes = -1}), c10::ValueError);
  }

}  // TEST_SUITE
