// SPDX-License-Identifier: MIT
// offload-bench copy: D2H / H2D GB/s of the storage policies (PinnedHost,
// PageableHost) on sim, 64 KiB .. 256 MiB, against memcpy of the same
// bytes. Narrow ATen headers only.

#include <algorithm>
#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "bench.hpp"

namespace bench {
namespace {

const c10::Device kSim(c10::DeviceType::PrivateUse1, 0);

/// One path a copy can take: its JSON key, its column, and one copy.
struct CopyPath {
  std::string key;
  std::string label;
  std::function<void()> run;
};

/// The buffers of one size: a sim device buffer, the host buffers the two
/// policies allocated, and plain host memory for memcpy.
struct Buffers {
  Buffers(std::int64_t n, const offload::Options& options)
      : dev(at::empty({n}, at::TensorOptions().dtype(at::kByte).device(kSim))),
        pinned(offload::storage::PinnedHost{}.allocate({n, kSim, options.pin_memory})),
        pageable(offload::storage::PageableHost{}.allocate({n, kSim, options.pin_memory})),
        plain(at::empty({n}, at::TensorOptions().dtype(at::kByte))) {
    dev.fill_(1);
    pinned.bytes.fill_(2);
    pageable.bytes.fill_(3);
    plain.fill_(4);
  }
  at::Tensor dev;
  offload::HostBuffer pinned, pageable;
  at::Tensor plain;
};

/// The paths of one direction (`d2h`: device to host), memcpy first, on
/// the buffers `b` of `n` bytes.
std::vector<CopyPath> copy_paths(bool d2h, std::int64_t n, Buffers& b, const offload::Options& options) {
  auto* dev_ptr = b.dev.data_ptr();
  auto* plain_ptr = b.plain.data_ptr();
  const auto side = offload::device::Sim::side_stream(0);
  std::vector<CopyPath> copies;
  copies.push_back({"memcpy", "memcpy", [=] {
                      if (d2h)
                        std::memcpy(plain_ptr, dev_ptr, static_cast<std::size_t>(n));
                      else
                        std::memcpy(dev_ptr, plain_ptr, static_cast<std::size_t>(n));
                    }});
  auto sync_copy = [&b, d2h](at::Tensor& host) {
    if (d2h)
      host.copy_(b.dev);
    else
      b.dev.copy_(host);
  };
  auto alloc_copy = [&b, d2h, n, options](auto storage) {
    if (d2h) {
      auto host = storage.allocate({n, kSim, options.pin_memory});
      host.bytes.copy_(b.dev);
    } else {
      auto fresh = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(kSim));
      fresh.copy_(std::is_same_v<decltype(storage), offload::storage::PinnedHost> ? b.pinned.bytes : b.pageable.bytes);
    }
  };
  copies.push_back({"pinned_copy", "PinnedHost copy_", [=, &b] { sync_copy(b.pinned.bytes); }});
  copies.push_back(
      {"pinned_alloc_copy", "PinnedHost alloc+copy_", [=] { alloc_copy(offload::storage::PinnedHost{}); }});
  copies.push_back({"pinned_async", "PinnedHost async", [&b, d2h, side] {
                      c10::Event done(kSim.type());
                      {
                        const c10::StreamGuard on_side(side);
                        if (d2h)
                          b.pinned.bytes.copy_(b.dev, /*non_blocking=*/true);
                        else
                          b.dev.copy_(b.pinned.bytes, /*non_blocking=*/true);
                        done.record(side);
                      }
                      done.synchronize();
                    }});
  copies.push_back({"pageable_copy", "PageableHost copy_", [=, &b] { sync_copy(b.pageable.bytes); }});
  copies.push_back(
      {"pageable_alloc_copy", "PageableHost alloc+copy_", [=] { alloc_copy(offload::storage::PageableHost{}); }});
  return copies;
}

/// ns of each path: `reps` rounds of every path once after 2 warm-up rounds.
std::vector<std::vector<double>> time_paths(const std::vector<CopyPath>& copies, int reps) {
  std::vector<std::vector<double>> times(copies.size());
  for (int r = 0; r < reps + 2; ++r) {
    for (std::size_t i = 0; i < copies.size(); ++i) {
      const double t = time_ns(copies[i].run);
      if (r >= 2) times[i].push_back(t);
    }
  }
  return times;
}

/// A line's columns: its size, then one per path (the first, memcpy, in
/// GB/s; the others with their ratio to it).
std::vector<Column> line_columns(const std::vector<CopyPath>& copies) {
  std::vector<Column> columns = {{"size", "", [](const Json& line) { return size_label(integer(line, "bytes")); }}};
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const auto key = copies[i].key;
    const auto path = [key](const Json& line) -> const Json& { return line.at("paths").at(key); };
    if (i == 0)
      columns.push_back(
          {copies[i].label, "GB/s", [path](const Json& line) { return fixed(number(path(line), "gb_per_s"), 2); }});
    else
      columns.push_back({copies[i].label, "", [path](const Json& line) {
                           const auto& row = path(line);
                           return fixed(number(row, "gb_per_s"), 2) + " (" + fixed(number(row, "ratio_vs_memcpy"), 2) +
                                  "x)";
                         }});
  }
  return columns;
}

/// The rows of one size (appended to `rows`), and its line of the table:
/// {"bytes", "paths": {key: row}}. Clears `all_met` when a copy_ row is
/// under 0.8x memcpy at >= 1 MiB.
Json size_line(const std::string& dir, std::int64_t n, const std::vector<CopyPath>& copies,
               const std::vector<std::vector<double>>& times, std::vector<Json>& rows, bool& all_met) {
  Json line = Json::object({{"bytes", Json(n)}, {"paths", Json::object()}});
  double memcpy_gbs = 0;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const auto s = summarize(times[i]);
    const double gbs = static_cast<double>(n) / s.median;
    const double gbs_lo = static_cast<double>(n) / s.q3;
    const double gbs_hi = static_cast<double>(n) / s.q1;
    if (i == 0) memcpy_gbs = gbs;
    const double ratio = gbs / memcpy_gbs;
    const bool target_row = copies[i].key == "pinned_copy" || copies[i].key == "pageable_copy";
    if (target_row && n >= (1 << 20) && ratio < 0.8) all_met = false;
    rows.push_back(Json::object({{"direction", Json(dir)},
                                 {"bytes", Json(n)},
                                 {"path", Json(copies[i].key)},
                                 {"gb_per_s", Json(gbs)},
                                 {"gb_per_s_iqr", Json::array({Json(gbs_lo), Json(gbs_hi)})},
                                 {"ratio_vs_memcpy", Json(ratio)},
                                 {"ns", summary_json(s)}}));
    line["paths"][copies[i].key] = rows.back();
  }
  return line;
}

}  // namespace

int run_copy(const Args& args) {
  const std::int64_t top = args.quick ? (std::int64_t{16} << 20) : (std::int64_t{256} << 20);
  const offload::Options options;
  free_link();  // memcpy and the policies' own cost, not the link's

  std::cout << "## Copy throughput of the storage policies on sim, against memcpy\n\n"
            << "GB/s = bytes / median time (1 GB = 1e9 bytes). `copy_` rows copy into a buffer the policy "
            << "allocated once (the copy itself); `alloc+copy_` rows allocate a fresh buffer per copy, as the "
            << "manager does per offloaded tensor (host buffer for D2H, sim device buffer for H2D); `async` "
            << "is the sync::Streamed path: non_blocking copy on a side stream, then waiting on its event. "
            << "memcpy copies the same bytes between pre-touched buffers. Ratio = policy / memcpy.\n";

  std::vector<Json> rows;
  bool all_met = true;
  for (const bool d2h : {true, false}) {
    const std::string dir = d2h ? "D2H" : "H2D";
    std::vector<Column> columns;
    std::vector<Json> lines;  // one per size
    for (std::int64_t n = 64 << 10; n <= top; n *= 4) {
      Buffers buffers(n, options);
      const auto copies = copy_paths(d2h, n, buffers, options);
      const std::int64_t budget = (args.quick ? std::int64_t{64} : std::int64_t{512}) << 20;
      const int reps = static_cast<int>(std::clamp<std::int64_t>(budget / n, 5, args.quick ? 50 : 200));
      const auto times = time_paths(copies, reps);
      if (columns.empty()) columns = line_columns(copies);
      lines.push_back(size_line(dir, n, copies, times, rows, all_met));
    }
    std::cout << "\n### " << dir << (d2h ? " (sim device -> host buffer)" : " (host buffer -> sim device)") << "\n\n";
    print_rows(columns, lines);
  }
  std::cout << "\nTarget: copy_ rows >= 0.8x memcpy at >= 1 MiB: " << (all_met ? "met" : "MISSED") << "\n";
  auto fields = header(args, torch_version());
  fields.push_back({"target", Json("pinned_copy and pageable_copy >= 0.8 x memcpy for bytes >= 1 MiB")});
  fields.push_back({"target_met", Json(all_met)});
  fields.push_back({"rows", Json(rows)});
  write_result(args, "copy.json", fields);
  return 0;
}

}  // namespace bench
