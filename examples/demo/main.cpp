// SPDX-License-Identifier: MIT
// offload-demo: the main job. Trains a character language model (--model:
// the GPT of models/gpt.hpp, or an LSTM) with AdamW on a text file, on
// the detected accelerator (or the simulated `sim` device when there is
// none), without and with activation offloading from the same initial
// weights and the same batches (optionally also with each block
// checkpointed, and with a device-memory target), and reports losses
// (bitwise equal), peak device memory, bytes offloaded and brought back,
// and time per step; optionally a JSON summary and a PNG of device memory
// over one step.
//
// The files, by concern: flags (command line), data (the text), device
// (device, memory, cap, trace), training, report (table, JSON), plot; the
// models are models/registry.hpp's. `offload-demo --help` lists every flag.

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <vector>

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <offload/config.hpp>
#include <offload/options.hpp>
#include <offload/scope.hpp>

#include "../../models/registry.hpp"
#include "data.hpp"
#include "device.hpp"
#include "flags.hpp"
#include "parallel.hpp"
#include "plot.hpp"
#include "report.hpp"
#include "training.hpp"

namespace demo {
namespace {

/// With --ranks > 1, rank 0's line that every rank's losses are bitwise
/// equal with and without offloading (each rank compares its own two runs),
/// and whether every rank ended with the same parameters (it must: the
/// gradients are averaged). Every rank calls it; the others get "".
std::string ranks_line(const DataParallel& dp, const std::optional<RunResult>& none,
                       const std::optional<RunResult>& off) {
  const std::string mine = none && off ? (compare(*none, *off).bitwise_equal ? "yes" : "no") : "n/a";
  const auto verdicts = dp.gather("bitwise", mine);
  const auto hashes = dp.gather("parameters", std::to_string((off ? *off : *none).parameters_hash));
  if (dp.rank() != 0) return {};
  std::string differ, missing;
  for (std::size_t r = 0; r < verdicts.size(); ++r) {
    if (verdicts[r] == "no") differ += " " + std::to_string(r);
    if (verdicts[r] == "n/a") missing += " " + std::to_string(r);
  }
  const bool same = std::all_of(hashes.begin(), hashes.end(), [&](const auto& h) { return h == hashes[0]; });
  std::string line = "data parallel (" + std::to_string(dp.size()) + " ranks, gradients averaged through c10d, " +
                     dp.backend() + "): ";
  if (!missing.empty()) {
    line += "one run per rank, nothing to compare";
  } else if (differ.empty()) {
    line += "losses bitwise equal with and without offloading on every rank";
  } else {
    line += "losses NOT bitwise equal with and without offloading on rank(s)" + differ;
  }
  return line + "; final parameters " + (same ? "identical" : "NOT identical") + " on every rank\n";
}

/// What no flag's own range can check: the corpus against --ranks, --plot
/// against the device. Throws UsageError.
void check_against_data(const Args& args, const Corpus& corpus, const DeviceChoice& device) {
  if (args.ranks > 1 && corpus.bytes / args.ranks < args.seq + 1) {
    throw UsageError("--ranks " + std::to_string(args.ranks) + ": each rank's shard of the text has " +
                     std::to_string(corpus.bytes / args.ranks) +
                     " bytes, fewer than --seq + 1 = " + std::to_string(args.seq + 1));
  }
  if (args.plot && device.sim && device.device.index() != 0) {
    throw UsageError("--plot: the sim memory trace records sim:0 only, got --device " + args.device);
  }
}

/// The managers' Options from the flags, validated (UsageError otherwise).
offload::Options options_of(const Args& args) {
  const offload::Options options{.min_offload_bytes = args.min_offload_bytes,
                                 .max_fwd_stash = args.max_fwd_stash,
                                 .prefetch_depth = args.prefetch_depth,
                                 .prefetch_bytes = args.prefetch_bytes,
                                 .host_budget_bytes = args.host_budget_bytes};
  try {
    options.validate();
  } catch (const c10::ValueError& e) {
    throw UsageError(e.what_without_backtrace());
  }
  return options;
}

/// The memory cap, deterministic kernels on a real accelerator, and the
/// engine that hands out saved-tensor hooks (before the first backward
/// pass, also the one without offloading).
void prepare_device(const Args& args, DeviceChoice& device, const DeviceMemory& memory) {
  if (args.plot) check_plot_tool();
  apply_link(args, device);
  apply_cap(args, device, memory);
  if (!device.sim) {
    // Bitwise equal losses need deterministic kernels on real accelerators
    // (cuBLAS reads this variable when it first initialises).
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  offload::install_hooks();
}

/// The lines that say what is trained on what.
void print_header(const Args& args, const Corpus& corpus, const DeviceChoice& device, const DataParallel* dp) {
  const auto& kind = models::model_kind(args.model);
  std::cout << program << " " << OFFLOAD_VERSION << ": " << kind.title << ", layers " << args.layers << ", width "
            << args.width;
  if (kind.uses_heads) std::cout << ", heads " << args.heads;
  std::cout << ", seq " << args.seq << ", batch " << args.batch << ", " << args.steps << " steps, AdamW lr " << args.lr
            << ", seed " << args.seed << "\n";
  std::cout << "data: " << corpus.bytes << " bytes from " << corpus.files.size() << " file(s):";
  for (const auto& f : corpus.files) std::cout << " " << f;
  std::cout << "\nvocabulary: the " << corpus.vocab.size() << " distinct bytes of the text (one token per byte)\n";
  std::cout << "device: " << device.label << " (" << device.why << ")";
  if (args.device_memory_cap > 0) std::cout << ", memory cap " << mib(args.device_memory_cap);
  if (args.link_gbps) std::cout << ", link " << *args.link_gbps << " GB/s";
  std::cout << "\n";
  if (dp) {
    std::cout << "data parallel: rank " << dp->rank() << " of " << dp->size() << " on its shard of the text, "
              << dp->backend() << " backend\n";
  }
}

/// Every run the flags ask for, in the report's order.
struct Runs {
  std::optional<RunResult> none, off;
  std::vector<RunResult> more;  ///< checkpointed (alone, with offload), then the target's
};

Runs train_all(const Session& session, const offload::Options& options) {
  const Args& args = session.args;
  Runs runs;
  if (args.offload == OffloadMode::none || args.offload == OffloadMode::compare) {
    runs.none = train(session, {OffloadMode::none, options});
  }
  const auto mode = args.offload == OffloadMode::blocking ? OffloadMode::blocking : OffloadMode::streamed;
  if (args.offload != OffloadMode::none) {
    runs.off = train(session, {mode, options});
    std::cout << "manager: " << runs.off->manager << "\n";
  }
  // --checkpoint: the same steps with each block checkpointed, alone and
  // with its inputs offloaded (after the offloaded run, in the table's order;
  // a run that ran out of device memory leaves nothing held for the next).
  if (args.checkpoint) {
    runs.more.push_back(train(session, {OffloadMode::none, options, /*checkpoint=*/true}));
    if (args.offload != OffloadMode::none) runs.more.push_back(train(session, {mode, options, /*checkpoint=*/true}));
  }
  // --device-target: the same offloaded run, offloading only what keeps
  // each step under the target.
  if (args.device_target > 0) {
    auto planned = options;
    planned.device_target_bytes = args.device_target;
    runs.more.push_back(train(session, {mode, planned}));
    // --plan auto: the same target, every block planned.
    if (args.plan == "auto") runs.more.push_back(train(session, {mode, planned, false, /*planned=*/true}));
  }
  return runs;
}

/// The report, the plot and the JSON summary the flags ask for.
void write_outputs(const Args& args, const Corpus& corpus, const DeviceChoice& device, const Runs& runs,
                   const std::string& dp_line) {
  const RunResult* pn = runs.none ? &*runs.none : nullptr;
  const RunResult* po = runs.off ? &*runs.off : nullptr;
  std::vector<const RunResult*> more;
  for (const auto& r : runs.more) more.push_back(&r);
  print_report(args, pn, po, more);
  std::cout << dp_line;
  if (args.plot) {
    std::vector<const RunResult*> traced;
    for (const auto* r : {pn, po}) {
      if (r && !r->trace.empty()) traced.push_back(r);
    }
    for (const auto* r : more) {
      if (!r->trace.empty()) traced.push_back(r);
    }
    const auto csv = write_plot(*args.plot, args, device, traced);
    std::cout << "plot: " << *args.plot << " (samples: " << csv << ")\n";
  }
  if (args.summary_json) {
    write_summary(*args.summary_json, args, corpus, device, pn, po, more);
    std::cout << "summary: " << *args.summary_json << "\n";
  }
}

int run(const Args& args, char** argv) {
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  const auto corpus = load_corpus(args);
  auto device = choose_device(args);
  check_against_data(args, corpus, device);
  const DeviceMemory memory(device);
  const auto options = options_of(args);
  prepare_device(args, device, memory);
  const auto dp = DataParallel::join(args, device, argv);
  const bool lead = !dp || dp->rank() == 0;
  print_header(args, corpus, device, dp.get());

  const Session session{args, corpus, device, memory, args.plot.has_value() && lead, tty, dp.get()};
  const auto runs = train_all(session, options);
  const std::string dp_line = dp ? ranks_line(*dp, runs.none, runs.off) : std::string();
  if (!lead) return 0;
  TORCH_CHECK(!dp || dp->wait_for_ranks(), "a rank that rank 0 started failed (its messages are above)");
  write_outputs(args, corpus, device, runs, dp_line);
  remove_cap(args, device);
  return 0;
}

}  // namespace
}  // namespace demo

int main(int argc, char** argv) {
  using demo::program;
  try {
    const auto args = demo::parse_args(argc, argv);
    return args ? demo::run(*args, argv) : 0;
  } catch (const demo::UsageError& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << program << ": error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << program << ": error: " << e.what() << "\n";
    return 1;
  }
}
