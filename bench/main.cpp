// SPDX-License-Identifier: MIT
// offload-bench: main() and the command line (CLI11): one subcommand per
// benchmark, each with only the flags it reads, every integer checked
// against its range. Bad input: one line on stderr naming the flag, exit 2.

#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <offload/options.hpp>
#include <offload/scope.hpp>
#include <offload/sim.hpp>

#include "../cli/flag_checks.hpp"
#include "bench.hpp"

namespace {

/// An integer flag: its name without "--", accepted range and help.
struct IntFlag {
  const char* name;
  offload::Range range;
  const char* help;
};

const std::vector<IntFlag> shape_flags = {
    {"batch", {1, 4096}, "sequences per step"},
    {"seq", {1, 4096}, "context length in tokens"},
    {"width", {1, 8192}, "model width (a multiple of --heads)"},
    {"heads", {1, 256}, "attention heads"},
    {"vocab", {1, 65536}, "vocabulary size"},
    {"layers", {1, 128}, "transformer blocks"},
};
const std::vector<IntFlag> option_flags = {
    {"min-offload-bytes", offload::ranges::min_offload_bytes, "Options::min_offload_bytes"},
    {"max-fwd-stash", offload::ranges::max_fwd_stash, "Options::max_fwd_stash"},
    {"prefetch-depth", offload::ranges::prefetch_depth, "Options::prefetch_depth"},
    {"prefetch-bytes", offload::ranges::prefetch_bytes, "Options::prefetch_bytes"},
};

void add_ints(CLI::App& sub, bench::Args& args, const std::vector<IntFlag>& flags) {
  for (const auto& f : flags) {
    const std::string name = f.name;
    sub.add_option_function<std::int64_t>(
           "--" + name, [&args, name](const std::int64_t& v) { args.integers[name] = v; },
           std::string(f.help) + ", in " + flag_checks::range_text(f.range))
        ->transform(flag_checks::integer_in(f.range))
        ->type_name("N");
  }
}

void add_text(CLI::App& sub, bench::Args& args, const std::string& name, const std::string& help) {
  sub.add_option_function<std::string>(
         "--" + name, [&args, name](const std::string& v) { args.texts[name] = v; }, help)
      ->type_name("TEXT");
}

/// The subcommands, each with only the flags it reads; parsing one sets
/// args.name and the flags given.
void add_benchmarks(CLI::App& app, bench::Args& args) {
  const auto add = [&](const char* name, const char* what) {
    auto* sub = app.add_subcommand(name, what);
    sub->add_flag("--quick", args.quick, "fewer rounds, smaller sizes");
    sub->add_option("--out", args.out, "folder for the JSON file (default bench/results)")->type_name("DIR");
    sub->callback([&args, name] { args.name = name; });
    return sub;
  };
  auto* hook = add("hook", "host ns per saved tensor, C++ hooks vs Python (--python FILE from bench/hook_overhead.py)");
  add_ints(*hook, args, {{"rounds", {1, 1'000'000}, "measured rounds"}});
  add_text(*hook, args, "python", "the JSON file bench/hook_overhead.py wrote");
  auto* memory = add("memory", "peak sim device bytes of the GPT demo model: none / Blocking / Streamed vs the floor");
  add_ints(*memory, args, shape_flags);
  add_ints(*memory, args, option_flags);
  auto* checkpoint =
      add("checkpoint", "peak sim device bytes and bytes moved: none / offload / checkpoint / checkpoint + offload");
  add_ints(*checkpoint, args, shape_flags);
  add_ints(*checkpoint, args, option_flags);
  add("copy", "D2H / H2D GB/s of PinnedHost and PageableHost on sim vs memcpy");
  auto* sim = add("sim",
                  "host ns of sim's event record/query/wait and a queued copy's fixed cost; a training step with "
                  "sim's stream-order checking off and on");
  add_ints(*sim, args, {{"rounds", {1, 100'000}, "measured batches"}});
  auto* overlap =
      add("overlap", "step time none / Blocking / Streamed on sim at R = 0.25, 0.5, 1, 2 (link time / forward)");
  add_ints(*overlap, args, shape_flags);
  add_ints(*overlap, args, option_flags);
  add_ints(*overlap, args,
           {{"latency-us", {0, offload::sim::kMaxCopyLatencyUs}, "sim link latency per copy in microseconds"},
            {"rounds", {1, 1000}, "measured rounds"},
            {"threads", {1, 256}, "intra-op threads"}});
  add("target",
      "a device-memory target on sim: the demo GPT, a CNN, the LSTM at 0.5 / 0.7 / 0.9 of the peak vs everything "
      "and none, Blocking and Streamed");
  auto* plan = add("plan",
                   "the automatic plan vs every fixed strategy (offload all, device target, checkpoint all / first k, "
                   "with and without offloading) on the GPT at width 256 on sim, R = 0.25 / 1 / 3 / 6, three targets");
  add_text(*plan, args, "r", "the values of R to run, comma-separated, each in (0, 100] (default 0.25,1,3,6)");
  add_ints(*plan, args,
           {{"steps", {3, 1000}, "steps per strategy in the survey (default 8; times are the median of steps 3 on)"},
            {"confirm-steps", {3, 1000}, "steps per strategy in the confirming run (default 24; 12 with --quick)"},
            {"threads", {1, 256}, "intra-op threads (default 1)"}});
  add("host",
      "host bytes reserved vs in use, fresh pinned allocations and step time: PinnedHost vs PinnedPool on sim in "
      "CUDA-like mode, Blocking and Streamed");
  auto* gpu = add("gpu", "NVIDIA GPU: step time none vs Streamed, D2H/H2D GB/s vs a pinned copy_");
  add_ints(*gpu, args, shape_flags);
  add_ints(*gpu, args, option_flags);
  add_ints(*gpu, args, {{"steps", {1, 100'000}, "measured steps"}});
  add_text(*gpu, args, "gpu-name", "the GPU's name for the JSON file");
  add_text(*gpu, args, "date", "the date for the JSON file");
  add_text(*gpu, args, "file", "the JSON file's name (default gpu.json)");
}

/// Runs the benchmark args.name names; its exit status.
int run(const bench::Args& args) {
  if (args.name == "gpu") {
    offload::install_hooks();  // before any backward pass; no sim on a GPU run
    return bench::run_gpu(args);
  }
  offload::sim::Config sim;
  if (args.name == "plan") sim.num_devices = bench::kPlanDevices;  // a device per strategy (plan.cpp)
  offload::sim::install(sim);
  offload::install_hooks();
  if (args.name == "hook") return bench::run_hook(args);
  if (args.name == "copy") return bench::run_copy(args);
  if (args.name == "sim") return bench::run_sim(args);
  if (args.name == "memory") return bench::run_memory(args);
  if (args.name == "checkpoint") return bench::run_checkpoint(args);
  if (args.name == "target") return bench::run_target(args);
  if (args.name == "plan") return bench::run_plan(args);
  if (args.name == "host") return bench::run_host(args);
  return bench::run_overlap(args);
}

}  // namespace

int main(int argc, char** argv) {
  bench::Args args;
  CLI::App app(
      "Benchmarks of torch-offload (not tests): each prints a markdown table with ratios against a "
      "baseline measured in the same run and writes its raw numbers to OUT/NAME.json.",
      "offload-bench");
  app.set_help_flag("-h,--help", "show this text (NAME --help: that benchmark's flags)");
  app.require_subcommand(0, 1);  // none: the error below, which names the benchmarks
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_benchmarks(app, args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "offload-bench: " << e.what() << "\n";
    return 2;
  }
  if (args.name.empty()) {
    std::cerr
        << "offload-bench: name a benchmark: hook, memory, checkpoint, copy, sim, overlap, target, plan, host or gpu "
           "(see --help)\n";
    return 2;
  }
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "offload-bench " << args.name << ": " << e.what() << "\n";
    return 1;
  }
}
