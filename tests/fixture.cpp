// SPDX-License-Identifier: MIT
#include "fixture.hpp"

#include <cstdlib>
#include <mutex>
#include <string_view>

#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace fixture {

namespace {

struct Choice {
  Target target = Target::sim;
  std::string error;
};

const Choice& choice() {
  static const Choice parsed = [] {
    Choice c;
    const char* value = std::getenv("OFFLOAD_TEST_DEVICE");
    const std::string given = value == nullptr ? "" : value;
    if (given.empty() || given == "sim") return c;
    if (given != "cuda") {
      c.error = "OFFLOAD_TEST_DEVICE='" + given + "' is not a test device (accepted: sim, the default, or cuda)";
      return c;
    }
    c.target = Target::cuda;
    if (!OFFLOAD_HAS_CUDA) {
      c.error =
          "OFFLOAD_TEST_DEVICE=cuda: this build has no device::Cuda (configure with -Dcuda=enabled and a CUDA "
          "LibTorch)";
    }
    return c;
  }();
  return parsed;
}

bool cuda_visible() {
#if OFFLOAD_HAS_CUDA
  try {
    return offload::device::Cuda::available();
  } catch (const std::exception&) {
    return false;
  }
#else
  return false;
#endif
}

std::mutex skipped_mutex;
std::vector<std::string>& skipped() {
  static std::vector<std::string> names;
  return names;
}

}  // namespace

Target target() { return choice().target; }

std::string_view target_name() { return target() == Target::sim ? "sim" : "cuda"; }

std::string target_error() {
  if (!choice().error.empty()) return choice().error;
  if (target() == Target::cuda && !cuda_visible()) {
    return "OFFLOAD_TEST_DEVICE=cuda: no CUDA device is visible (run the suites on sim: unset OFFLOAD_TEST_DEVICE)";
  }
  return {};
}

void prepare_target() {
  if (target() != Target::cuda) {
    offload::sim::install();
    // Every suite runs with sim's stream order checked: a missing wait or
    // record_stream throws from the operator that shows it. The cases that
    // race on purpose turn it off for themselves (ScopedKnobs restores it).
    // OFFLOAD_SIM_CHECK_STREAMS=0 (install() read it) leaves it off.
    const char* env = std::getenv("OFFLOAD_SIM_CHECK_STREAMS");
    if (env == nullptr || std::string_view(env) != "0") offload::sim::set_check_streams(true);
    return;
  }
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 0);
  // warn_only: an operation without a deterministic kernel warns, and the
  // bitwise comparison of the case that ran it decides.
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

c10::Device device0() { return target() == Target::sim ? sim0 : c10::Device(c10::DeviceType::CUDA, 0); }

c10::Device device1() {
  if (target() == Target::sim) return sim1;
  const auto count = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->deviceCount();
  return {c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(count - 1)};
}

void sim_only::fill(doctest::detail::TestCase& test) const {
  test.m_description = reason;
  if (target() == Target::sim) return;
  test.m_skip = true;
  const std::lock_guard lock(skipped_mutex);
  skipped().push_back(std::string(test.m_name) + " (" + reason + ")");
}

std::vector<std::string> skipped_sim_only() {
  const std::lock_guard lock(skipped_mutex);
  return skipped();
}

}  // namespace fixture
