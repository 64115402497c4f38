// SPDX-License-Identifier: MIT
// offload-demo's flags with CLI11: each flag's range is a validator that
// also writes the flag's help, so the accepted values are stated once.

#include "flags.hpp"

#include <unistd.h>

#include <array>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <system_error>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include <offload/sim.hpp>

#include "../../cli/flag_checks.hpp"
#include "../../models/registry.hpp"

namespace demo {

std::string_view mode_name(OffloadMode mode) {
  switch (mode) {
    case OffloadMode::none:
      return "none";
    case OffloadMode::blocking:
      return "blocking";
    case OffloadMode::streamed:
      return "streamed";
    case OffloadMode::compare:
      return "compare";
  }
  return "?";
}

namespace {

namespace fs = std::filesystem;
using flag_checks::integer_in;
using flag_checks::range_text;

/// The byte-count flags' upper bound: the largest byte count Options takes.
constexpr std::int64_t max_bytes_flag = offload::ranges::min_offload_bytes.hi;

/// The example cap shown in --help: between the peak of the default model
/// with offloading and without it on `sim`, so the run without offloading
/// runs out of device memory and the offloaded one trains.
constexpr std::int64_t example_cap_mib = 36;

/// "[lo, 2^k]" for a range whose upper end is a power of two.
std::string pow2_range_text(offload::Range r) {
  return "[" + std::to_string(r.lo) + ", 2^" + std::to_string(static_cast<int>(std::log2(static_cast<double>(r.hi)))) +
         "]";
}

/// A byte count in `r` with an optional K/M/G (KiB/MiB/GiB) suffix,
/// rewritten as plain bytes.
CLI::Validator bytes_in(offload::Range r) {
  const std::string shown = pow2_range_text(r) + " bytes, optionally with a suffix K, M or G";
  return CLI::Validator(
      [r, shown](std::string& text) -> std::string {
        static constexpr std::array<std::pair<std::string_view, std::int64_t>, 6> suffixes{{{"KiB", 1024},
                                                                                            {"MiB", 1024 * 1024},
                                                                                            {"GiB", 1024 * 1024 * 1024},
                                                                                            {"K", 1024},
                                                                                            {"M", 1024 * 1024},
                                                                                            {"G", 1024 * 1024 * 1024}}};
        std::string_view digits = text;
        std::int64_t scale = 1;
        for (const auto& [suffix, factor] : suffixes) {
          if (digits.size() > suffix.size() && digits.ends_with(suffix)) {
            digits.remove_suffix(suffix.size());
            scale = factor;
            break;
          }
        }
        std::int64_t value = 0;
        const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        if (digits.empty() || ec == std::errc::invalid_argument || ptr != digits.data() + digits.size()) {
          return "expected a byte count in " + shown + ", got '" + text + "'";
        }
        if (ec == std::errc::result_out_of_range || value < r.lo / scale || value > r.hi / scale) {
          return text + " is out of range; accepted: " + shown;
        }
        text = std::to_string(value * scale);
        return {};
      },
      "");
}

/// A number in (0, hi], rewritten in its shortest exact form.
CLI::Validator positive_number_up_to(double hi) {
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, hi).ptr;
  const std::string shown = "(0, " + std::string(buf, end) + "]";
  return CLI::Validator(
      [hi, shown](std::string& text) -> std::string {
        double value = 0;
        const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (text.empty() || ec == std::errc::invalid_argument || ptr != text.data() + text.size()) {
          return "expected a number in " + shown + ", got '" + text + "'";
        }
        if (ec == std::errc::result_out_of_range || !std::isfinite(value) || value <= 0 || value > hi) {
          return text + " is out of range; accepted: " + shown;
        }
        return {};
      },
      "");
}

/// One of `choices`.
CLI::Validator one_of(std::vector<std::string> choices) {
  return CLI::Validator(
      [choices](std::string& text) -> std::string {
        for (const auto& c : choices) {
          if (text == c) return {};
        }
        std::string list;
        for (std::size_t i = 0; i < choices.size(); ++i) {
          list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
        }
        return "expected " + list + ", got '" + text + "'";
      },
      "");
}

/// A non-empty string; `what` is how the error names it.
CLI::Validator non_empty(std::string what) {
  return CLI::Validator(
      [what](std::string& text) -> std::string {
        return text.empty() ? "expected " + what + ", got ''" : std::string();
      },
      "");
}

/// A file the demo may create: not a directory, in a writable directory.
CLI::Validator writable_file() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "expected a file name, got ''";
        const fs::path parent = fs::absolute(fs::path(text)).parent_path();
        std::error_code ec;
        if (!fs::is_directory(parent, ec) || ::access(parent.c_str(), W_OK) != 0) {
          return "cannot write '" + text + "': directory '" + parent.string() + "' does not exist or is not writable";
        }
        if (fs::is_directory(fs::path(text), ec)) return "'" + text + "' is a directory, expected a file name";
        return {};
      },
      "");
}

/// `text` with its words wrapped at `width` columns (kept line breaks stay),
/// for the flag descriptions CLI11 indents but does not wrap.
std::string wrap(const std::string& text, std::size_t width = 72) {
  std::string out, line, word;
  auto flush_word = [&] {
    if (word.empty()) return;
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    word.clear();
  };
  for (const char ch : text + "\n") {
    if (ch == ' ' || ch == '\n') {
      flush_word();
      if (ch == '\n') {
        out += line + "\n";
        line.clear();
      }
    } else {
      word += ch;
    }
  }
  out.pop_back();
  return out;
}

/// Adds the demo's flags to one CLI11 app: each integer and byte-count flag
/// with its range, which its validator checks and its help states.
class Flags {
 public:
  explicit Flags(CLI::App& app) : app_(app) {}

  /// An integer flag in `range`: its help gets ", in RANGE (default D)";
  /// `shown` replaces RANGE, `default_text` D.
  CLI::Option* integer(const std::string& name, std::int64_t& target, offload::Range range, const std::string& help,
                       const std::string& group, const std::string& shown = {}, const std::string& default_text = {}) {
    const std::string d = default_text.empty() ? std::to_string(target) : default_text;
    return app_
        .add_option(name, target, help + ", in " + (shown.empty() ? range_text(range) : shown) + " (default " + d + ")")
        ->transform(integer_in(range, shown))
        ->type_name("N")
        ->group(group);
  }
  /// A byte count in `range`, with K/M/G suffixes, in the Offloading group.
  CLI::Option* bytes(const std::string& name, std::int64_t& target, offload::Range range, const std::string& help,
                     const std::string& more = {}) {
    return app_
        .add_option(name, target,
                    help + ", in " + pow2_range_text(range) + " (default " + std::to_string(target) + ")" + more)
        ->transform(bytes_in(range))
        ->type_name("B")
        ->group("Offloading");
  }
  /// A text flag checked by `check`, shown as `type`.
  template <class T>
  CLI::Option* text(const std::string& name, T& target, const std::string& help, CLI::Validator check,
                    const std::string& type, const std::string& group) {
    return app_.add_option(name, target, help)->transform(std::move(check))->type_name(type)->group(group);
  }

 private:
  CLI::App& app_;
};

/// The flags whose presence parse_args() checks after parsing.
struct Given {
  CLI::Option* layers = nullptr;
  CLI::Option* heads = nullptr;
  CLI::Option* rank = nullptr;
};

void add_model_flags(Flags& flags, Args& a, Given& given) {
  std::vector<std::string> model_names;
  std::string model_help;
  for (const auto& kind : models::model_kinds()) {
    model_names.emplace_back(kind.name);
    model_help += "\n" + std::string(kind.name) + ": " + std::string(kind.help) + " (" +
                  std::to_string(kind.default_layers) + " layers by default)";
  }
  constexpr offload::Range int63{0, std::numeric_limits<std::int64_t>::max()};
  const std::string g = "Model and training (integers unless noted)";
  flags.text("--model", a.model, "the model (default gpt):" + model_help, one_of(model_names), "NAME", g);
  given.layers =
      flags.integer("--layers", a.layers, {1, 64}, "transformer blocks or LSTM layers", g, "", "the model's");
  flags.integer("--width", a.width, {1, 4096}, "model width (gpt: a multiple of --heads)", g);
  given.heads = flags.integer("--heads", a.heads, {1, 256}, "gpt: attention heads", g);
  flags.integer("--seq", a.seq, {1, 4096}, "context length in tokens", g);
  flags.integer("--batch", a.batch, {1, 4096}, "sequences per step", g);
  flags.integer("--steps", a.steps, {1, 1'000'000}, "training steps per run", g);
  flags.text("--lr", a.lr, "AdamW learning rate, a number in (0, 10] (default 0.003)", positive_number_up_to(10), "X",
             g);
  flags.integer("--seed", a.seed, int63, "seed of the weights and the batch order", g, "[0, 2^63-1]");
  flags.text("--data", a.data,
             "UTF-8/ASCII text to train on, at least --seq + 1 bytes (default: every regular file in " +
                 std::string(default_data_dir) + "/, concatenated in sorted order)",
             non_empty("a file name"), "FILE", g);
}

void add_offload_flags(CLI::App& app, Flags& flags, Args& a, std::string& offload) {
  const std::string g = "Offloading";
  flags.text("--offload", offload,
             "none | blocking | streamed | compare (default compare: the same steps without offloading, "
             "then with streamed offloading)",
             one_of({"none", "blocking", "streamed", "compare"}), "MODE", g);
  app.add_flag("--checkpoint", a.checkpoint,
               "also train with each block checkpointed (offload::checkpoint: saves only its input, recomputed "
               "in backward), alone and, unless --offload none, with its inputs offloaded")
      ->group(g);
  flags.text("--device", a.device,
             "auto | sim | sim:N | cuda | cuda:N | the detected accelerator's name (default auto: the "
             "detected accelerator, else the simulated `sim`)",
             non_empty("auto, sim or an accelerator name"), "DEV", g);
  flags.bytes("--device-memory-cap", a.device_memory_cap, {0, max_bytes_flag}, "device memory limit in bytes",
              "; 0 = none; suffixes K, M, G (KiB, MiB, GiB) are accepted. On sim: the device's capacity; on CUDA: a "
              "memory fraction of the device's total memory. Example: --device-memory-cap " +
                  std::to_string(example_cap_mib) +
                  "M with the default model on sim: the run without offloading runs out of device memory, the "
                  "offloaded one trains.");
  flags.text("--link-gbps", a.link_gbps,
             "sim: the host link's bandwidth in GB/s, a number in (0, 10000] (default: sim's, 25); lower it to "
             "see the regimes where copies no longer hide behind compute (R = link time / forward time, "
             "docs/guide.md)",
             positive_number_up_to(offload::sim::kMaxCopyBandwidthGbps), "GBPS", g);
  flags.bytes("--min-offload-bytes", a.min_offload_bytes, offload::ranges::min_offload_bytes,
              "saved tensors smaller than this stay on the device");
  flags.integer("--max-fwd-stash", a.max_fwd_stash, offload::ranges::max_fwd_stash,
                "streamed: device-to-host copies in flight in forward", g);
  flags.integer("--prefetch-depth", a.prefetch_depth, offload::ranges::prefetch_depth,
                "streamed: how far ahead of need backward brings tensors back, in largest saved tensors", g);
  flags.bytes("--prefetch-bytes", a.prefetch_bytes, offload::ranges::prefetch_bytes,
              "streamed: a fixed prefetch window in bytes instead (0: follow --prefetch-depth)");
  flags.bytes("--host-budget", a.host_budget_bytes, offload::ranges::host_budget_bytes,
              "host bytes a manager may reserve (0: no limit); what does not fit stays on the device");
  flags.bytes("--device-target", a.device_target, offload::ranges::device_target_bytes,
              "one more offloaded run, with this device-memory target (Options::device_target_bytes): it offloads "
              "only what keeps each step under it, planned from the step before; 0 = no such run");
  flags.text("--plan", a.plan,
             "auto: one more run under --device-target with every block marked CheckpointOptions::planned (the "
             "automatic plan keeps, offloads or recomputes each block per step; docs/guide.md); off (default): none",
             one_of({"off", "auto"}), "PLAN", g);
}

void add_output_flags(Flags& flags, Args& a) {
  const std::string g = "Output";
  flags.text("--summary-json", a.summary_json, "write the results as JSON", writable_file(), "PATH", g);
  flags.text("--plot", a.plot,
             "write a PNG of device memory over one training step, with and without offloading (and its "
             "samples as PATH with .csv); needs python3 with matplotlib: $OFFLOAD_DEMO_PYTHON, else the "
             "project's .venv, else python3",
             writable_file(), "PATH", g);
  flags.integer("--log-every", a.log_every, {0, 1'000'000},
                "progress line every N steps when stdout is not a terminal (0: about ten per run)", g);
}

void add_parallel_flags(Flags& flags, Args& a, Given& given) {
  const std::string g = "Data parallel";
  flags.integer("--ranks", a.ranks, {1, 8},
                "processes training data-parallel, each on its shard of the text, gradients averaged through c10d "
                "after every backward (sim: the offload_sim backend; cuda: NCCL, one GPU per rank)",
                g);
  given.rank =
      flags.integer("--rank", a.rank, {0, 7}, "this process's rank (set by rank 0 for the ranks it starts)", g);
  flags.text("--rendezvous", a.rendezvous,
             "HOST:PORT of rank 0's store (set by rank 0, which serves it on 127.0.0.1, for the ranks it starts)",
             non_empty("HOST:PORT"), "ADDR", g);
  flags.integer("--rendezvous-timeout", a.rendezvous_timeout, {1, 3600}, "seconds the ranks wait for each other", g);
}

OffloadMode mode_of(const std::string& offload) {
  return offload == "none"       ? OffloadMode::none
         : offload == "blocking" ? OffloadMode::blocking
         : offload == "streamed" ? OffloadMode::streamed
                                 : OffloadMode::compare;
}

/// What no single flag's range can say: combinations, and defaults that
/// depend on the model. Throws UsageError naming the flag.
void check_combinations(Args& a, const Given& given) {
  const auto& kind = models::model_kind(a.model);
  if (given.layers->count() == 0) a.layers = kind.default_layers;
  if (kind.uses_heads && a.width % a.heads != 0) {
    throw UsageError("--width " + std::to_string(a.width) + " must be a multiple of --heads " +
                     std::to_string(a.heads));
  }
  if (a.device_target > 0 && a.offload == OffloadMode::none) {
    throw UsageError("--device-target: --offload none trains no offloaded run to give a target to");
  }
  if (a.rank >= a.ranks) {
    throw UsageError("--rank: " + std::to_string(a.rank) + " must be less than --ranks " + std::to_string(a.ranks));
  }
  if ((given.rank->count() > 0 && a.rank > 0) != a.rendezvous.has_value()) {
    throw UsageError("--rendezvous: given with --rank 1..N-1 only (rank 0 serves the store and starts the others)");
  }
  if (!kind.uses_heads && given.heads->count() > 0) {
    throw UsageError("--heads: --model " + a.model + " has no attention heads");
  }
  if (a.checkpoint && !kind.no_checkpoint.empty()) throw UsageError("--checkpoint: " + std::string(kind.no_checkpoint));
  if (a.plan == "auto" && a.device_target == 0) {
    throw UsageError("--plan auto: the plan needs a device-memory target; give --device-target");
  }
  if (a.plan == "auto" && !kind.no_checkpoint.empty())
    throw UsageError("--plan auto: " + std::string(kind.no_checkpoint));
}

}  // namespace

std::optional<Args> parse_args(int argc, char** argv) {
  CLI::App app(
      "Trains a character language model with AdamW on a text file, without and with activation\n"
      "offloading, from the same initial weights and the same batches, and compares losses (bitwise),\n"
      "peak device memory and time per step. Vocabulary: the distinct bytes of the text; one token per byte.",
      std::string(program));
  app.set_help_flag("-h,--help", "show this text");
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.get_formatter()->column_width(30);
  app.footer(
      "Exit status: 0 trained (also when the run without offloading ran out of device memory),\n"
      "1 error while training, 2 bad input (one line on stderr naming it).");

  Args a;
  Given given;
  std::string offload = "compare";
  Flags flags(app);
  add_model_flags(flags, a, given);
  add_offload_flags(app, flags, a, offload);
  add_output_flags(flags, a);
  add_parallel_flags(flags, a, given);
  for (auto* option : app.get_options()) option->description(wrap(option->get_description()));

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  a.offload = mode_of(offload);
  check_combinations(a, given);
  return a;
}

}  // namespace demo
