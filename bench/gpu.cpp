// SPDX-License-Identifier: MIT
// offload-bench gpu: on an NVIDIA GPU, the step time of the demo GPT
// without offloading, with sync::Blocking and with sync::Streamed, and the
// D2H / H2D GB/s of the policy's copies (PinnedHost buffer, side stream,
// event) against a plain pinned copy_.

#include <cstring>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <offload/config.hpp>

#include "bench.hpp"

#if OFFLOAD_HAS_CUDA
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <torch/cuda.h>

#include <offload/offload.hpp>

#include "../cli/stats_json.hpp"
#include "gpt_trainer.hpp"
#include "mode_columns.hpp"
#endif

namespace bench {

#if OFFLOAD_HAS_CUDA
namespace {

const c10::Device kCuda(c10::DeviceType::CUDA, 0);

/// Waits for everything queued on GPU 0.
void cuda_sync() { torch::cuda::synchronize(0); }

std::vector<Column> step_columns() {
  return {
      mode_column(),
      median_column("step", "ms", "step_ms", 1),
      iqr_column("IQR", "ms", "step_ms", 1),
      fixed_column("vs none", "", "ratio_vs_none", 3, "x"),
      mib_column("peak", "peak_bytes"),
      mib_column("offloaded", "bytes_offloaded", "MiB/step"),
      fixed_column("loss", "", "loss", 6),
  };
}

/// The run without offloading, which the other modes' rows are measured
/// against (it runs first).
struct Baseline {
  double ms = 0;
  float loss = 0;
};

/// `steps` timed steps of the GPT of `s` under `mode` after 2 warm-up steps: its row.
Json step_row(const Shapes& s, Mode mode, const offload::Options& options, int steps, Baseline& none) {
  auto* allocator = c10::getDeviceAllocator(c10::DeviceType::CUDA);
  const auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  Trainer trainer(s, kCuda, make_source<offload::device::Cuda>(mode, options));
  trainer.step();
  trainer.step();
  cuda_sync();
  std::vector<double> ms;
  float loss = 0;
  allocator->resetPeakStats(0);
  for (int i = 0; i < steps; ++i) {
    if (trainer.source) trainer.source->reset_stats();
    ms.push_back(time_ns([&] {
                   loss = trainer.step();
                   cuda_sync();
                 }) /
                 1e6);
  }
  const auto peak = allocator->getDeviceStats(0).allocated_bytes[agg].peak;
  const auto st = trainer.source ? trainer.source->stats() : offload::Stats{};
  const auto sm = summarize(ms);
  if (mode == Mode::none) none = {sm.median, loss};
  return Json::object({{"mode", Json(mode_key(mode))},
                       {"step_ms", summary_json(sm)},
                       {"ratio_vs_none", Json(sm.median / none.ms)},
                       {"peak_bytes", Json(peak)},
                       {"bytes_offloaded", Json(st.bytes_offloaded)},
                       {"prefetches", Json(st.prefetches)},
                       {"stash_reuses", Json(st.stash_reuses)},
                       {"loss", Json(static_cast<double>(loss))},
                       {"loss_bitwise_equal_to_none", Json(std::memcmp(&loss, &none.loss, sizeof loss) == 0)},
                       {"stats", offload_json::stats(st)}});
}

std::vector<Column> copy_columns() {
  const auto ratio_column = [](std::string policy, std::string plain) {
    return Column{"ratio", "", [policy, plain](const Json& row) {
                    return fixed(number(row, policy) / number(row, plain), 2) + "x";
                  }};
  };
  return {
      {"size", "", [](const Json& row) { return size_label(integer(row, "bytes")); }},
      fixed_column("D2H pinned copy_", "", "d2h_pinned_copy_gb_per_s", 2),
      fixed_column("D2H PinnedHost side stream", "", "d2h_policy_gb_per_s", 2),
      ratio_column("d2h_policy_gb_per_s", "d2h_pinned_copy_gb_per_s"),
      fixed_column("H2D pinned copy_", "", "h2d_pinned_copy_gb_per_s", 2),
      fixed_column("H2D PinnedHost side stream", "", "h2d_policy_gb_per_s", 2),
      ratio_column("h2d_policy_gb_per_s", "h2d_pinned_copy_gb_per_s"),
  };
}

/// The copies of `n` bytes: the policy's path (PinnedHost buffer, `side`
/// stream, event) vs a plain pinned copy_ on the current stream, same bytes.
Json copy_row(std::int64_t n, const offload::Options& options, const c10::Stream& side) {
  auto dev = at::empty({n}, at::TensorOptions().dtype(at::kByte).device(kCuda)).fill_(1);
  auto plain = at::empty({n}, at::TensorOptions().dtype(at::kByte).pinned_memory(true)).fill_(2);
  auto policy = offload::storage::PinnedHost{}.allocate({n, kCuda, options.pin_memory});
  policy.bytes.fill_(3);
  // GB/s: the median of 10 copies after 2 warm-up copies.
  const auto measure = [&](const std::function<void()>& f) {
    std::vector<double> t;
    for (int r = 0; r < 12; ++r) {
      const double ns = time_ns(f);
      if (r >= 2) t.push_back(ns);
    }
    return static_cast<double>(n) / summarize(t).median;
  };
  const auto on_side = [&](bool d2h) {
    c10::Event done(c10::DeviceType::CUDA);
    c10::Event ready(c10::DeviceType::CUDA);
    ready.record(offload::device::Cuda::current_stream(0));
    ready.block(side);
    {
      const c10::StreamGuard guard(side);
      if (d2h)
        policy.bytes.copy_(dev, true);
      else
        dev.copy_(policy.bytes, true);
      done.record(side);
    }
    done.synchronize();
  };
  const double d2h_plain = measure([&] {
    plain.copy_(dev, true);
    cuda_sync();
  });
  const double d2h_policy = measure([&] { on_side(true); });
  const double h2d_plain = measure([&] {
    dev.copy_(plain, true);
    cuda_sync();
  });
  const double h2d_policy = measure([&] { on_side(false); });
  return Json::object({{"bytes", Json(n)},
                       {"d2h_pinned_copy_gb_per_s", Json(d2h_plain)},
                       {"d2h_policy_gb_per_s", Json(d2h_policy)},
                       {"h2d_pinned_copy_gb_per_s", Json(h2d_plain)},
                       {"h2d_policy_gb_per_s", Json(h2d_policy)},
                       {"policy_pinned", Json(policy.pinned)}});
}

}  // namespace
#endif

int run_gpu(const Args& args) {
#if OFFLOAD_HAS_CUDA
  if (!offload::device::Cuda::available()) {
    std::cerr << "offload-bench gpu: no CUDA device (this build has device::Cuda, but LibTorch sees no GPU)\n";
    return 3;
  }
  const Shapes s =
      shapes_from(args, Shapes{.batch = 8, .seq = 512, .width = 1024, .heads = 16, .vocab = 96, .layers = 12});
  const int steps = static_cast<int>(args.get_int("steps", args.quick ? 3 : 10));
  const offload::Options options = options_from(args);

  std::cout << "## GPU: " << args.get("gpu-name", "?") << "\n\nModel " << s.describe() << ", AdamW, median of " << steps
            << " steps after 2 warm-up steps.\n\n";
  std::vector<Json> rows;
  Baseline none;
  for (const Mode mode : {Mode::none, Mode::blocking, Mode::streamed})
    rows.push_back(step_row(s, mode, options, steps, none));
  print_rows(step_columns(), rows);

  std::cout << "\nCopy GB/s (1 GB = 1e9 bytes), median of repeated copies:\n\n";
  std::vector<Json> copy_rows;
  const auto side = offload::device::Cuda::side_stream(0);
  for (std::int64_t n = 1 << 20; n <= (std::int64_t{1} << 30); n *= 4) copy_rows.push_back(copy_row(n, options, side));
  print_rows(copy_columns(), copy_rows);
  auto fields = header(args, torch_version());
  fields.push_back({"gpu", Json(args.get("gpu-name", "?"))});
  fields.push_back({"date", Json(args.get("date", ""))});
  fields.push_back({"shapes", Json(s.describe())});
  fields.push_back({"steps", Json(rows)});
  fields.push_back({"copies", Json(copy_rows)});
  write_result(args, args.get("file", "gpu.json"), fields);
  return 0;
#else
  std::cerr << "offload-bench gpu: no CUDA device support in this build (OFFLOAD_HAS_CUDA is 0: LibTorch "
               "without CUDA, or configured with -Dcuda=disabled)\n";
  (void)args;
  return 3;
#endif
}

}  // namespace bench
