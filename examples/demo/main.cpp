// SPDX-License-Identifier: MIT
// offload-demo: the main job. Trains a character language model (--model:
// the GPT of models/gpt.hpp, or an LSTM) with AdamW on a text file, on
// the detected accelerator (or the simulated `sim` device when there is
// none), without and with activation offloading from the same initial
// weights and the same batches, and reports losses (bitwise equal), peak
// device memory, bytes offloaded and brought back, and time per step;
// optionally a JSON summary and a PNG of device memory over one step.
//
// The files, by concern: flags (command line), data (the text), device
// (device, memory, cap, trace), models + model_*.cpp, training, report
// (table, JSON), plot. `offload-demo --help` lists every flag.

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <vector>

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <offload/config.hpp>
#include <offload/options.hpp>
#include <offload/scope.hpp>

#include "data.hpp"
#include "device.hpp"
#include "flags.hpp"
#include "models.hpp"
#include "plot.hpp"
#include "report.hpp"
#include "training.hpp"

namespace demo {
namespace {

int run(const Args& args) {
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  const auto corpus = load_corpus(args);
  const auto device = choose_device(args);
  if (args.plot && device.sim && device.device.index() != 0) {
    throw UsageError("--plot: the sim memory trace records sim:0 only, got --device " + args.device);
  }
  const DeviceMemory memory(device);
  const offload::Options options{.min_offload_bytes = args.min_offload_bytes,
                                 .max_fwd_stash = args.max_fwd_stash,
                                 .prefetch_depth = args.prefetch_depth,
                                 .prefetch_bytes = args.prefetch_bytes};
  try {
    options.validate();
  } catch (const c10::ValueError& e) {
    throw UsageError(e.what_without_backtrace());
  }
  if (args.plot) check_plot_tool();
  apply_cap(args, device, memory);
  if (!device.sim) {
    // Bitwise equal losses need deterministic kernels on real accelerators
    // (cuBLAS reads this variable when it first initialises).
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  // The engine that hands out saved-tensor hooks must be the default one
  // before the first backward pass, also the one without offloading.
  offload::install_hooks();

  const auto& kind = model_kind(args.model);
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
  std::cout << "\n";

  const bool trace = args.plot.has_value();
  std::optional<RunResult> none, off;
  if (args.offload == OffloadMode::none || args.offload == OffloadMode::compare) {
    none = train(args, corpus, device, memory, OffloadMode::none, options, trace, tty);
  }
  if (args.offload != OffloadMode::none) {
    const auto mode = args.offload == OffloadMode::blocking ? OffloadMode::blocking : OffloadMode::streamed;
    off = train(args, corpus, device, memory, mode, options, trace, tty);
    std::cout << "manager: " << off->manager << "\n";
  }

  const RunResult* pn = none ? &*none : nullptr;
  const RunResult* po = off ? &*off : nullptr;
  print_report(args, pn, po);
  if (args.plot) {
    std::vector<const RunResult*> traced;
    for (const auto* r : {pn, po}) {
      if (r && !r->trace.empty()) traced.push_back(r);
    }
    const auto csv = write_plot(*args.plot, args, device, traced);
    std::cout << "plot: " << *args.plot << " (samples: " << csv << ")\n";
  }
  if (args.summary_json) {
    write_summary(*args.summary_json, args, corpus, device, pn, po);
    std::cout << "summary: " << *args.summary_json << "\n";
  }
  remove_cap(args, device);
  return 0;
}

}  // namespace
}  // namespace demo

int main(int argc, char** argv) {
  using demo::program;
  try {
    const auto args = demo::parse_args(argc, argv);
    return args ? demo::run(*args) : 0;
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
