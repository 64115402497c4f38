// SPDX-License-Identifier: MIT
// What bench.hpp declares for every benchmark: the LibTorch version and
// sim's free link.

#include "bench.hpp"

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

#include <offload/sim.hpp>

namespace bench {

std::string torch_version() { return TORCH_VERSION; }

void free_link() {
  offload::sim::set_copy_latency_us(0);
  offload::sim::set_copy_bandwidth_gbps(offload::sim::kMaxCopyBandwidthGbps);
}

}  // namespace bench
