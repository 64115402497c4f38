// SPDX-License-Identifier: MIT
// offload-bench sim: host ns of sim's own machinery, on a free link: event
// record, query and wait, and the fixed cost of a queued copy. Narrow ATen
// headers only; the last section (a training step with stream-order
// checking off and on) is sim_checked.cpp's.

#include <chrono>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "bench.hpp"

namespace bench {
namespace {

const c10::Device kSim(c10::DeviceType::PrivateUse1, 0);
constexpr int kBatch = 64;  // operations per timed batch

/// One measured operation.
struct Op {
  std::string key, label;
  std::function<void()> setup;             // before a batch, untimed
  std::function<void(int)> run;            // one operation (index in the batch)
  std::function<void()> teardown;          // after a batch, untimed
  bool has_target = true;                  // false: shown beside the targets
  std::function<void()> before_each = {};  // set: runs before each operation, untimed
};

/// What the operations act on: sim's main and side streams, a pinned host
/// and a device tensor of 4 bytes, and a batch of events.
struct Machinery {
  Machinery()
      : guard(c10::impl::getDeviceGuardImpl(kSim.type())),
        main(guard->getStream(kSim)),
        side(offload::device::Sim::side_stream(0)),
        host(at::ones({1}, at::TensorOptions().pinned_memory(true))),
        dev(at::ones({1}, at::TensorOptions().device(kSim))) {}

  /// Holds `stream` busy for the batch: one queued copy with a long link.
  void occupy(const c10::Stream& stream) const {
    offload::sim::set_copy_latency_us(50'000);
    const c10::StreamGuard on(stream);
    host.copy_(dev, /*non_blocking=*/true);
    free_link();
  }
  void fresh_events() {
    events.clear();
    for (int i = 0; i < kBatch; ++i) events.emplace_back(kSim.type());
  }
  void record_all() {
    for (auto& e : events) e.record(side);
  }
  /// Before each of the `after_idle` operations, untimed: the side stream
  /// drains, then the host computes (spins) for 1 ms, as between two saved
  /// tensors of a training step.
  void idle_then_compute() const {
    guard->synchronizeStream(side);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  /// A non_blocking copy of the 4 bytes on the side stream.
  void queue_copy() const {
    const c10::StreamGuard on(side);
    host.copy_(dev, /*non_blocking=*/true);
  }

  const c10::impl::DeviceGuardImplInterface* guard;
  const c10::Stream main, side;
  const at::Tensor host, dev;
  std::vector<c10::Event> events;
};

void sync_all() { offload::sim::synchronize(0); }

std::vector<Op> event_ops(Machinery& m) {
  return {
      {"record_idle", "event record, idle stream", [&] { m.fresh_events(); },
       [&](int i) { m.events[i].record(m.side); }, sync_all},
      {"record_busy", "event record, busy stream (a marker is queued)",
       [&] {
         m.fresh_events();
         m.occupy(m.side);
       },
       [&](int i) { m.events[i].record(m.side); }, [&] { sync_all(); }},
      {"query_done", "event query, completed",
       [&] {
         m.fresh_events();
         m.record_all();
       },
       [&](int i) { (void)m.events[i].query(); }, sync_all},
      {"query_pending", "event query, pending",
       [&] {
         m.fresh_events();
         m.occupy(m.side);
         m.record_all();
       },
       [&](int i) { (void)m.events[i].query(); }, sync_all},
      {"block_done", "stream waits on a completed event (nothing queued)",
       [&] {
         m.fresh_events();
         m.record_all();
       },
       [&](int i) { m.events[i].block(m.main); }, sync_all},
      {"block_pending", "stream waits on a pending event (a wait is queued)",
       [&] {
         m.fresh_events();
         m.occupy(m.side);
         m.record_all();
       },
       [&](int i) { m.events[i].block(m.main); }, sync_all},
  };
}

std::vector<Op> copy_ops(Machinery& m) {
  const auto idle = [&] { m.idle_then_compute(); };
  return {
      {"copy_queued_issue", "non_blocking copy of 4 bytes, host cost of issuing it (free link)", [] {},
       [&](int) { m.queue_copy(); }, sync_all},
      {"copy_queued_run", "non_blocking copy of 4 bytes, issued and run to completion per copy (free link)", [] {},
       [&](int) {
         m.queue_copy();
         m.guard->synchronizeStream(m.side);
       },
       sync_all, false},
      {"copy_queued_stream", "non_blocking copies of 4 bytes queued back to back, then one wait: per copy (free link)",
       [] {},
       [&](int i) {
         m.queue_copy();
         if (i == kBatch - 1) m.guard->synchronizeStream(m.side);
       },
       sync_all},
      {"copy_blocking", "blocking copy of 4 bytes (free link)", [] {}, [&](int) { m.host.copy_(m.dev); }, sync_all},
      {"copy_queued_after_idle",
       "non_blocking copy of 4 bytes issued after the stream was idle for 1 ms of host compute, host cost of issuing "
       "it (free link)",
       [] {}, [&](int) { m.queue_copy(); }, sync_all, false, idle},
      {"copy_blocking_after_idle",
       "blocking copy of 4 bytes after 1 ms of host compute (free link): the host's own cold path, beside the row "
       "above",
       [] {}, [&](int) { m.host.copy_(m.dev); }, sync_all, false, idle},
      {"record_after_idle", "event record, idle stream, after 1 ms of host compute: the host's own cold path",
       [&] { m.fresh_events(); }, [&](int i) { m.events[i].record(m.side); }, sync_all, false, idle},
  };
}

/// ns per operation of `op`: `reps` batches of kBatch after 2 warm-up batches.
Summary time_op(const Op& op, int reps) {
  std::vector<double> per;
  for (int r = 0; r < reps + 2; ++r) {
    op.setup();
    double ns = 0;
    if (op.before_each) {
      for (int i = 0; i < kBatch; ++i) {
        op.before_each();
        ns += time_ns([&] { op.run(i); });
      }
    } else {
      ns = time_ns([&] {
        for (int i = 0; i < kBatch; ++i) op.run(i);
      });
    }
    op.teardown();
    if (r >= 2) per.push_back(ns / kBatch);
  }
  return summarize(per);
}

void print_intro(int reps) {
  std::cout << "## sim's own machinery: host ns per operation\n\n"
            << "Median over " << reps << " batches of " << kBatch << " operations (wall time of the batch / " << kBatch
            << "), free link (latency 0). `busy`/`pending`: the side stream holds a queued copy with "
            << "a 50 ms link while the batch runs. Target: <= 5000 ns each for event record/wait/query and a queued "
            << "copy's fixed cost (issue, and per copy on a stream); the round trip per copy (issue, the worker "
            << "wakes, runs it, the host wakes) is shown beside them.\n\n";
}

std::vector<Column> sim_columns() {
  return {
      text_column("operation", "label"),
      median_column("ns (median)", "", "ns", 0),
      iqr_column("IQR", "ns", "ns", 0),
      {"target", "",
       [](const Json& row) -> std::string {
         if (!row.at("has_target").get<bool>()) return "(no target)";
         return number(row.at("ns"), "median") <= 5000 ? "met" : "MISSED";
       }},
  };
}

}  // namespace

int run_sim(const Args& args) {
  const int reps = static_cast<int>(args.get_int("rounds", args.quick ? 20 : 200));
  free_link();
  Machinery machinery;
  auto ops = event_ops(machinery);
  for (auto& op : copy_ops(machinery)) ops.push_back(std::move(op));

  print_intro(reps);
  std::vector<Json> rows;
  bool all_met = true;
  for (const auto& op : ops) {
    const auto s = time_op(op, reps);
    const bool met = s.median <= 5000;
    if (op.has_target) all_met = all_met && met;
    rows.push_back(Json::object({{"op", Json(op.key)},
                                 {"label", Json(op.label)},
                                 {"ns", summary_json(s)},
                                 {"has_target", Json(op.has_target)}}));
  }
  offload::sim::set_copy_latency_us(offload::sim::Config{}.copy_latency_us);
  offload::sim::set_copy_bandwidth_gbps(offload::sim::Config{}.copy_bandwidth_gbps);
  print_rows(sim_columns(), rows);
  std::cout << "\nTarget (every row with one <= 5 us): " << (all_met ? "met" : "MISSED") << "\n";
  const auto checked_step = checked_step_section(args);
  auto fields = header(args, torch_version());
  fields.push_back({"batch", Json(kBatch)});
  fields.push_back({"target", Json("every op with has_target <= 5000 ns")});
  fields.push_back({"target_met", Json(all_met)});
  fields.push_back({"rows", Json(rows)});
  fields.push_back({"checked_step", checked_step});
  write_result(args, "sim.json", fields);
  return 0;
}

}  // namespace bench
