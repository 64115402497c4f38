// SPDX-License-Identifier: MIT
// The one main() of the doctest suites. The sim backend is installed before
// any test runs: LibTorch's autograd engine sizes its per-device worker
// pools at the first backward pass of the process, so a backend registered
// later has no worker queue (the same holds for any real backend).
#define DOCTEST_CONFIG_IMPLEMENT
#include "doctest.hpp"

#include <offload/config.hpp>
#if OFFLOAD_HAS_SIM
#include <offload/sim.hpp>
#endif

int main(int argc, char** argv) {
#if OFFLOAD_HAS_SIM
  offload::sim::install();
#endif
  doctest::Context context(argc, argv);
  return context.run();
}
