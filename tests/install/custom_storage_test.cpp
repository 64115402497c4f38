// SPDX-License-Identifier: MIT
// Meson test `docs_custom_storage`: the example of docs/custom-storage.md
// (CountingHost, CountingManager, make_counting_manager), extracted from the
// markdown at build time, is composed into a Manager at compile time and
// picked at run time by the dispatcher on the sim device; both runs train a
// tiny GPT with copy delays and poisoned frees and must be bitwise equal to
// the run without offloading, and the policy's counters must match the
// manager's Stats. Plain main(): exit status 0 when every check holds.

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>

#include <offload/dispatch.hpp>
#include <offload/offload.hpp>
#include <offload/sim.hpp>
#include <offload/sync/streamed.hpp>

#include "../harness.hpp"

// docs/custom-storage.md, between the snippet markers, without #include lines.
#include "custom_storage_snippet.inc"

// The concept, both ways: the example and a wrapper of the other shipped
// policy satisfy it; a near-miss without `name` does not.
static_assert(offload::storage_policy<CountingHost<>>);
static_assert(offload::storage_policy<CountingHost<offload::storage::PageableHost>>);
static_assert(!CountingHost<offload::storage::PageableHost>::prefers_pinned);
struct NoName {
  static constexpr bool prefers_pinned = false;
  offload::HostBuffer allocate(const offload::HostRequest&);
};
static_assert(!offload::storage_policy<NoName>);

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::cout << (ok ? "  ok    " : "  FAIL  ") << what << "\n";
  if (!ok) ++failures;
}

struct Totals {
  std::int64_t allocations = 0;
  std::int64_t bytes = 0;
};

Totals totals() {
  Totals t;
  for (int k = 0; k < SizeClassCounts::classes; ++k) {
    t.allocations += CountingHost<>::counts().allocations[k].load();
    t.bytes += CountingHost<>::counts().bytes[k].load();
  }
  return t;
}

/// Trains the GPT of the harness 2 steps inside Scopes of `manager`,
/// compares with `baseline` and the counters with the manager's stats.
template <class M>
void run(const char* label, M manager, const harness::RunResult& baseline, const c10::Device& sim) {
  const Totals before = totals();
  const auto result = harness::train(
      harness::ModelKind::gpt, sim, 2,
      [&](const harness::Forward& forward) {
        offload::Scope scope(manager);
        return forward();
      },
      [&](const std::vector<at::Tensor>& params) { manager.exclude(params); });
  const auto stats = manager.stats();
  const Totals after = totals();
  std::cout << label << ": " << stats << "\n";
  std::string why;
  expect(harness::bitwise_equal(baseline, result, &why),
         std::string(label) + ": losses, gradients, parameters bitwise equal to no offloading " + why);
  expect(stats.storages_offloaded > 0 && stats.bytes_offloaded > 0, std::string(label) + ": offloaded something");
  expect(after.bytes - before.bytes == stats.bytes_offloaded,
         std::string(label) + ": CountingHost counted " + std::to_string(after.bytes - before.bytes) +
             " bytes, Stats::bytes_offloaded " + std::to_string(stats.bytes_offloaded));
  expect(after.allocations - before.allocations == stats.storages_offloaded,
         std::string(label) + ": CountingHost counted " + std::to_string(after.allocations - before.allocations) +
             " allocations, Stats::storages_offloaded " + std::to_string(stats.storages_offloaded));
  expect(stats.pinned_fallbacks == 0, std::string(label) + ": every buffer pinned (sim's host allocator)");
}

}  // namespace

int main() {
  // The backend before the first backward pass; then races made visible:
  // delayed queued copies and NaN-poisoned device memory.
  offload::sim::install();
  offload::install_hooks();
  offload::sim::set_copy_latency_us(200);
  offload::sim::set_poison_freed(true);
  const c10::Device sim(c10::DeviceType::PrivateUse1, 0);
  const offload::Options options{.min_offload_bytes = 256, .max_fwd_stash = 2, .prefetch_depth = 2};

  const auto baseline = harness::train(harness::ModelKind::gpt, sim, 2);

  run("compile-time Manager<sim, counting_host, streamed>", CountingManager(options), baseline, sim);

  const offload::AnyManager dispatched = make_counting_manager(options);
  expect(dispatched.describe() == "Manager<sim, counting_host, streamed>",
         "make_counting_manager picked " + dispatched.describe());
  run("dispatched", dispatched, baseline, sim);

  std::cout << "host allocations by size class:\n";
  for (int k = 0; k < SizeClassCounts::classes; ++k) {
    if (const auto n = CountingHost<>::counts().allocations[k].load()) {
      std::cout << "  [" << (std::int64_t{1} << k) << ", " << (std::int64_t{1} << (k + 1)) << ") bytes: " << n
                << " buffers, " << CountingHost<>::counts().bytes[k].load() << " bytes\n";
    }
  }
  std::cout << (failures == 0 ? "docs_custom_storage: OK\n" : "docs_custom_storage: FAILED\n");
  return failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
