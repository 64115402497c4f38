// SPDX-License-Identifier: MIT
// main() of dispatch_tests. Installs the sim backend under the name in
// OFFLOAD_DISPATCH_BACKEND ("sim" when unset; "none" installs nothing)
// before any test runs, because the PrivateUse1 name is fixed per process
// and LibTorch's autograd engines size their per-device worker pools at
// their first backward pass. Then makes torch-offload's engine the default
// one, so plain and offloaded backward passes share one engine.
#define DOCTEST_CONFIG_IMPLEMENT
#include "../doctest.hpp"

#include <cstdlib>
#include <string>

#include <offload/scope.hpp>
#include <offload/sim.hpp>

int main(int argc, char** argv) {
  const char* env = std::getenv("OFFLOAD_DISPATCH_BACKEND");
  const std::string backend = env != nullptr && *env != '\0' ? env : "sim";
  if (backend != "none") offload::sim::install(offload::sim::Config{.backend_name = backend});
  offload::install_hooks();
  doctest::Context context(argc, argv);
  return context.run();
}
