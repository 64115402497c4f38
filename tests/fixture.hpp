// SPDX-License-Identifier: MIT
#pragma once
// The shared fixture of the runtime suites: the device the parametrised
// suites run on (OFFLOAD_TEST_DEVICE: `sim`, the default, or `cuda`), the
// manager types of each device this build has, the decorators that skip a
// case on the other device (a trait of the device policy) or off sim, and sim's substrate (sim installed once per
// process, a copy latency and poisoning of freed memory for one test, restored after).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <offload/config.hpp>
#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "doctest.hpp"

namespace fixture {

/// sim:0 and sim:1 (the suites that run on sim only).
inline const c10::Device sim0(c10::DeviceType::PrivateUse1, 0);
inline const c10::Device sim1(c10::DeviceType::PrivateUse1, 1);

/// The device of the parametrised suites (parity, views, zoo, Streamed).
enum class Target { sim, cuda };

/// OFFLOAD_TEST_DEVICE, read once: unset or empty is `sim`. Thread-safe.
Target target();
/// "sim" or "cuda".
std::string_view target_name();
/// Empty when the suites can run on target(); else one line naming
/// OFFLOAD_TEST_DEVICE, its value and what is wrong (an unknown value, with
/// the accepted ones; `cuda` in a build without device::Cuda or with no
/// CUDA device visible). main() prints it and runs nothing.
std::string target_error();
/// Prepares the target before any test runs: on sim, installs the sim
/// backend and turns its stream-order checking on
/// (offload::sim::set_check_streams; OFFLOAD_SIM_CHECK_STREAMS=0 leaves it
/// off, to compare); on CUDA, deterministic kernels (bitwise comparisons need them:
/// embedding backward uses atomics otherwise, cuBLAS a fixed workspace),
/// and sim is not installed: a PrivateUse1 backend registered in a process
/// becomes LibTorch's accelerator (at::getAccelerator()), and autograd
/// then finds no stream for CUDA nodes (the engine's `opt_ready_stream &&
/// opt_parent_stream` assertion at the first CUDA backward).
void prepare_target();
/// The suites that run on CUDA (doctest source-file filters): the
/// device-parametrised ones and the cuda suite. The others use sim, which
/// a CUDA run does not install; main() runs only these there.
inline constexpr const char* kCudaSuites =
    "*test_parity.cpp,*test_streamed.cpp,*test_views.cpp,*test_zoo.cpp,*test_cuda.cpp";

/// Device index 0 of target(), and a second device: sim:1, or the last
/// visible CUDA device (cuda:0 on a machine with one GPU).
c10::Device device0();
c10::Device device1();

/// A case (or the one instantiation of a templated case) that uses sim
/// (its knobs, its copy latency, poisoning of freed memory, its capacity or
/// its host allocator's counts) is skipped on another target; `reason` says
/// why, and main() lists the skipped ones with it.
///   TEST_CASE("..." * fixture::sim_only("copy latency widens the race")) {...}
struct sim_only {
  const char* reason;
  void fill(doctest::detail::TestCase& test) const;
};
/// The target a device policy's cases run on: a trait specialised for
/// each device policy the suites know (a manager type over another one
/// does not compile in FIXTURE_CASE_TEMPLATE).
template <class Device>
struct target_of;
template <>
struct target_of<offload::device::Sim> : std::integral_constant<Target, Target::sim> {};
#if OFFLOAD_HAS_CUDA
template <>
struct target_of<offload::device::Cuda> : std::integral_constant<Target, Target::cuda> {};
#endif

/// The decorator FIXTURE_CASE_TEMPLATE gives the instantiation for manager
/// type `M`: skipped where M's device policy runs on another target than
/// target() (target_of).
template <class M>
struct on_target_of {
  void fill(doctest::detail::TestCase& test) const {
    if (target_of<typename M::device_policy_type>::value != target()) test.m_skip = true;
  }
};

/// The sim-only cases skipped in this run: "name (reason)".
std::vector<std::string> skipped_sim_only();

/// The copy latency and poisoning of sim (nothing on another target, where
/// sim is not installed: prepare_target()): installs the sim backend (once
/// per process) and, while it lives, makes every copy between host and sim
/// cost `latency_us` microseconds on its stream (plus bytes over sim's
/// bandwidth) and (with `poison`) fills freed device memory with NaN, so a
/// missing wait or an early free shows up as wrong numbers (and, with the
/// stream-order checking prepare_target() turned on, as an error naming the
/// operator and both streams). Restores the knobs after.
struct Substrate {
  explicit Substrate(std::int64_t latency_us, bool poison = true) {
    if (target() != Target::sim) return;
    offload::sim::install();
    restore.emplace();
    offload::sim::set_copy_latency_us(latency_us);
    offload::sim::set_poison_freed(poison);
  }
  std::optional<offload::sim::ScopedKnobs> restore;
};

/// The substrate of the suites that race copies on purpose: 1 ms per copy
/// unless given, freed memory poisoned.
struct SlowPoisonedSim : Substrate {
  explicit SlowPoisonedSim(std::int64_t latency_us = 1000) : Substrate(latency_us) {}
};

/// The manager of `Device` with `Storage` and `Sync`.
template <class Device, class Storage, class Sync>
using Manager = offload::Manager<Device, Storage, Sync>;

/// The minimal complete sync policy: copy to the host, copy back, nothing
/// else (no step callback). It must pass every parity case.
struct CopyOnly {
  static constexpr std::string_view name = "copy_only";
  static constexpr bool needs_events = false;
  template <offload::device_policy Device>
  struct State {
    struct EntryState {};
    explicit State(const offload::Options& /*options*/) {}
    void offload(const offload::Transfer<EntryState>& t, const at::Tensor& device_bytes) {
      t.copy_to_host(device_bytes, /*non_blocking=*/false);
    }
    offload::Reloaded reload(const offload::Transfer<EntryState>& t) {
      auto bytes = t.empty_device_bytes();
      t.copy_to_device(bytes, /*non_blocking=*/false);
      return {bytes, /*copied=*/true};
    }
  };
};

/// The copy delay of the parity cases on sim (microseconds).
constexpr std::int64_t kParityDelayUs = 200;

}  // namespace fixture

/// A templated case over manager types, as doctest's TEST_CASE_TEMPLATE
/// (`dec`: the name and decorators; `T`: the type parameter's name; then
/// the types), each instantiation registered with the decorator
/// fixture::on_target_of<type>: skipped unless its device policy runs on
/// target().
///   FIXTURE_CASE_TEMPLATE("parity: ...", M, FIXTURE_PARITY_TYPES) { M manager; ... }
#define FIXTURE_CASE_TEMPLATE(dec, T, ...) \
  FIXTURE_CASE_TEMPLATE_IMPL(dec, T, DOCTEST_ANONYMOUS(FIXTURE_CASE_), __VA_ARGS__)
#define FIXTURE_CASE_TEMPLATE_IMPL(dec, T, id, ...)                                                            \
  template <typename T>                                                                                        \
  static void id();                                                                                            \
  namespace {                                                                                                  \
  template <typename T>                                                                                        \
  void DOCTEST_CAT(id, _REGISTER)(int index) {                                                                 \
    doctest::detail::regTest(doctest::detail::TestCase(id<T>, __FILE__, __LINE__,                              \
                                                       doctest_detail_test_suite_ns::getCurrentTestSuite(),    \
                                                       doctest::toString<T>(), int(__LINE__) * 1000 + index) * \
                             dec * fixture::on_target_of<T>());                                                \
  }                                                                                                            \
  /* each type in order; function templates of this file (internal linkage: no other file's is used) */        \
  template <typename... Ts>                                                                                    \
  int DOCTEST_CAT(id, _REGISTER_ALL)() {                                                                       \
    int index = 0;                                                                                             \
    (DOCTEST_CAT(id, _REGISTER) < Ts > (index++), ...);                                                        \
    return 0;                                                                                                  \
  }                                                                                                            \
  [[maybe_unused]] const int DOCTEST_CAT(id, _REGISTERED) = DOCTEST_CAT(id, _REGISTER_ALL)<__VA_ARGS__>();     \
  }                                                                                                            \
  template <typename T>                                                                                        \
  static void id()

/// The manager types of the parametrised suites, over every device this
/// build has (device::Cuda only with OFFLOAD_HAS_CUDA), for
/// FIXTURE_CASE_TEMPLATE("...", M, FIXTURE_TYPES(Storage, Sync)).
#if OFFLOAD_HAS_CUDA
#define FIXTURE_TYPES(Storage, Sync)                                       \
  fixture::Manager<offload::device::Sim, offload::storage::Storage, Sync>, \
      fixture::Manager<offload::device::Cuda, offload::storage::Storage, Sync>
#else
#define FIXTURE_TYPES(Storage, Sync) fixture::Manager<offload::device::Sim, offload::storage::Storage, Sync>
#endif

/// Every manager type of the parity cases: the three storages under
/// Blocking and Streamed, and pinned storage under CopyOnly.
#define FIXTURE_PARITY_TYPES                                                                                    \
  FIXTURE_TYPES(PinnedHost, offload::sync::Blocking), FIXTURE_TYPES(PageableHost, offload::sync::Blocking),     \
      FIXTURE_TYPES(PinnedHost, offload::sync::Streamed), FIXTURE_TYPES(PageableHost, offload::sync::Streamed), \
      FIXTURE_TYPES(PinnedPool, offload::sync::Blocking), FIXTURE_TYPES(PinnedPool, offload::sync::Streamed),   \
      FIXTURE_TYPES(PinnedHost, fixture::CopyOnly)
