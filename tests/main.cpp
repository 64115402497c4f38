// SPDX-License-Identifier: MIT
// The one main() of the doctest suites. The sim backend is installed before
// any test runs: LibTorch's autograd engine sizes its per-device worker
// pools at the first backward pass of the process, so a backend registered
// later has no worker queue (the same holds for any real backend). The
// parametrised suites run on the device OFFLOAD_TEST_DEVICE names (sim by
// default; tests/fixture.hpp): a value they cannot run on stops the run
// before any test, with one line saying why. On CUDA sim is not installed
// (fixture::prepare_target) and only the suites that run there do, unless
// the command line names source files itself.
#define DOCTEST_CONFIG_IMPLEMENT
#include "doctest.hpp"

#include <iostream>
#include <string_view>

#include <offload/config.hpp>
#if OFFLOAD_HAS_SIM
#include <offload/sim.hpp>

#include "fixture.hpp"
#endif

int main(int argc, char** argv) {
#if OFFLOAD_HAS_SIM
  if (const auto error = fixture::target_error(); !error.empty()) {
    std::cerr << "offload_tests: " << error << "\n";
    return 2;
  }
  fixture::prepare_target();
#endif
  doctest::Context context(argc, argv);
#if OFFLOAD_HAS_SIM
  if (fixture::target() == fixture::Target::cuda) {
    bool named = false;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      named = named || arg.starts_with("-sf") || arg.starts_with("--source-file") ||
              arg.starts_with("--dt-source-file") || arg.starts_with("-dt-sf");
    }
    if (!named) {
      context.addFilter("source-file", fixture::kCudaSuites);
      std::cout << "offload_tests: on cuda, the suites " << fixture::kCudaSuites
                << " (the others use sim, which a CUDA run does not install)\n";
    }
  }
#endif
  const int status = context.run();
#if OFFLOAD_HAS_SIM
  if (const auto skipped = fixture::skipped_sim_only(); !skipped.empty() && !context.shouldExit()) {
    std::cout << "offload_tests: on " << fixture::target_name() << ", " << skipped.size()
              << " sim-only cases skipped (run them with OFFLOAD_TEST_DEVICE=sim):\n";
    for (const auto& line : skipped) std::cout << "  " << line << "\n";
  }
#endif
  return status;
}
